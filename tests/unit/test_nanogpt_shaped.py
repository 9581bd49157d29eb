"""nanoGPT's own command, `torchrun ... train.py --device=cpu`, given after `--` (issue 38): the
training command's files are read like --scan without --launch, and a CPU run of code that pins a
CUDA device with no CUDA condition (nanoGPT's train.py:89, `torch.cuda.set_device(device)`)
fails preflight with the lines and the fix. On tests/projects/nanogpt (its README says what)."""

from __future__ import annotations

from pathlib import Path

from ddp_preflight.node.facts.imports import training_imports
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, Options, Status
from ddp_preflight.preflight.probes import collectives
from ddp_preflight.preflight.probes.code_scan import scan

from . import facts_fixtures as ff

NANOGPT = Path(__file__).parents[2] / "tests" / "projects" / "nanogpt"
PIN = {"file": "train.py", "line": 20, "first_line": 19, "call": "torch.cuda.set_device", "guarded": False,
       "column": 4, "text": 'device = f"cuda:{ddp_local_rank}"; torch.cuda.set_device(device)'}


def test_the_pin_and_the_assignment_that_makes_its_device_are_found_unguarded():
    assert scan(str(NANOGPT))["pins"] == [PIN]


def test_a_pin_under_a_cuda_condition_is_guarded(tmp_path):
    (tmp_path / "a.py").write_text("import torch\nif torch.cuda.is_available():\n    torch.cuda.set_device(0)\n"
                                   "if 'cuda' in dev:\n    torch.cuda.set_device(dev)\n")
    assert [p["guarded"] for p in scan(str(tmp_path))["pins"]] == [True, True]


class NoNodes:
    def usable(self) -> list[int]:
        return []


def test_the_training_command_is_scanned_without_launch_and_a_cpu_run_fails_with_the_lines_and_the_fix():
    art = ff.clean()                        # the lab's recorded facts: CPU torch, no CUDA on either node
    # The master's training-imports facts as its facts program finds them for nanoGPT's command.
    ff.facts(art, "master")["imports"] = training_imports({
        "launch_args": ["train.py", "--device=cpu"], "launch_cwd": str(NANOGPT), "code_dir": str(NANOGPT),
        "master_code_dir": str(NANOGPT)})
    ctx = ff.context(art)
    # The probe, as preflight runs it with the command after `--` and no --launch: the master's
    # training-imports facts name the files; nothing could run (no node usable), the scan stands.
    out = collectives.probe(NoNodes(), ctx.nodes, Options())
    assert out["skipped"] == "the master was not reached"
    assert out["scan"]["pins"] == [PIN]
    results = run_checks(Context(ctx.nodes, Options(master_addr=ctx.options.master_addr), {"collectives": out}),
                         [BY_ID["collectives"]])
    failed = [r for r in results if r.status is Status.FAIL]
    assert [(r.node, r.summary, r.fix) for r in failed] == [(
        None, "the training code pins a CUDA device with no CUDA condition around it (train.py:20: "
              "`device = f\"cuda:{ddp_local_rank}\"; torch.cuda.set_device(device)`): on this CPU run it raises on "
              "master, worker1 (no CUDA there) before training starts, on every rank",
        "in train.py, put lines 19-20 (`device = f\"cuda:{ddp_local_rank}\"; torch.cuda.set_device(device)`) under "
        "`if torch.cuda.is_available():`   # a CPU run then keeps the device it was given")]
    # A CUDA run pins as it should: nothing said.
    cuda = run_checks(Context(ctx.nodes, Options(master_addr=ctx.options.master_addr, device="cuda"),
                              {"collectives": out}), [BY_ID["collectives"]])
    assert not [r for r in cuda if "pins a CUDA device" in r.summary]
