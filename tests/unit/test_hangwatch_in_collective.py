"""Inside a collective is decided by the frame chain, not by a list of function names (issue 35): a
rank whose innermost Python frame is torch's distributed code (torch.distributed, DDP's wrapper in
torch/nn/parallel/distributed.py) and that uses no CPU is blocked in the C++ call of c10d that line
makes, whatever wraps it. Recorded: tests/unit/artifacts/pyspy/ddp (README there)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ddp_preflight.hangwatch.classify import Frame, classify, frames_of
from ddp_preflight.hangwatch.diagnose import diagnose
from ddp_preflight.hangwatch.model import Reason

from .test_hangwatch_classify import _blocked, seen

DDP = Path(__file__).parent / "artifacts" / "pyspy" / "ddp"


def _dump(name: str) -> list[dict]:
    return json.loads((DDP / name).read_text())


def test_a_rank_waiting_in_ddps_forward_buffer_broadcast_is_in_a_collective_not_idle():
    # Before: "idle", and with no loop read "left the loop" (a certain deadlock's culprit) or, its line
    # inside the loop, "idle in loop": a victim named as the culprit (seen at 20 s a step).
    python = classify(_dump("python_ddp_forward.json"), 0.0, "futex_do_wait")
    assert (python.state, python.op, python.reason, python.frame.where) == \
        ("collective", "broadcast", None, "ddp_forward.py:18")
    assert "in DistributedDataParallel._distributed_broadcast_coalesced (torch/nn/parallel/distributed.py:2363)" \
        in python.evidence
    # Its line read as inside the training loop (node/loops.py): still inside the collective.
    frames = [replace(f, in_loop=True) if not f.in_library else f for f in frames_of(_dump("python_ddp_forward.json"))]
    assert classify([], 0.0, frames=frames).state == "collective"
    # With native frames: c10d's Work::wait under it, named by the same chain (was "Work.wait()"), so a
    # rank read with native frames and one read without are in one collective, not two.
    native = classify(_dump("native_ddp_forward.json"), 0.0, "futex_do_wait")
    assert (native.state, native.op, native.frame.where) == ("collective", "broadcast", "ddp_forward.py:18")
    assert "in c10d::Work::wait (native frame)" in native.evidence


def test_the_rank_asleep_while_its_peer_waits_in_ddps_forward_is_the_one_named():
    asleep = _blocked("sleeps_in_loop")
    ranks = {0: classify(_dump("python_ddp_forward.json"), 0.0, "futex_do_wait"),
             1: classify(asleep["dump"], 0.0, asleep["wchan"], waits_in=asleep["waits_in"])}
    found = diagnose(seen(ranks))
    assert (found.kind, tuple(found.culprits), found.reason, found.certainty) == \
        ("held", (1,), Reason.SLEEPS, "likely")


def _chain(*frames: tuple[str, str, int]) -> list[Frame]:
    return [Frame(name, file, line, path=f"/x/site-packages/{file}" if file.startswith("torch/") else f"/w/{file}",
                  in_loop=True if not file.startswith("torch/") else None) for name, file, line in frames]


def test_any_wrapper_of_c10d_in_torchs_distributed_code_is_inside_a_collective():
    # Variants nobody recorded here: an older torch's DDP (the ultralytics paste: pasted/159, _sync_buffers
    # -> _sync_module_buffers), DDP's join check (its all_reduce's work.wait() at distributed.py), and
    # FSDP's unshard (its all_gather under torch/distributed/fsdp/).
    older = _chain(("_sync_module_buffers", "torch/nn/parallel/distributed.py", 1621),
                   ("_sync_buffers", "torch/nn/parallel/distributed.py", 1034),
                   ("forward", "torch/nn/parallel/distributed.py", 1034), ("_do_train", "trainer.py", 317))
    join = _chain(("DistributedDataParallel._check_global_requires_backward_grad_sync",
                   "torch/nn/parallel/distributed.py", 1931), ("DistributedDataParallel._pre_forward",
                                                               "torch/nn/parallel/distributed.py", 1760),
                  ("step", "train.py", 40))
    fsdp = _chain(("_all_gather_flat_param", "torch/distributed/fsdp/_flat_param.py", 1400),
                  ("unshard", "torch/distributed/fsdp/_flat_param.py", 1330), ("forward", "model.py", 12))
    found = [(s.state, s.op, s.frame.where) for s in (classify([], 0.0, frames=f) for f in (older, join, fsdp))]
    assert found == [("collective", "_sync_module_buffers", "trainer.py:317"),
                     ("collective", "DistributedDataParallel._check_global_requires_backward_grad_sync", "train.py:40"),
                     ("collective", "all_gather", "model.py:12")]


def test_torchs_distributed_code_with_cpu_or_outer_frames_of_it_are_not_a_collective_wait():
    # A busy rank in DDP's forward computes; a rank whose innermost frame is its own line (torch's
    # distributed code only further out: elastic's @record wrapper) is where its own line says.
    ddp = _dump("python_ddp_forward.json")
    assert classify(ddp, 80.0).state == "computing"
    outer = _chain(("train", "train.py", 7), ("wrapper", "torch/distributed/elastic/multiprocessing/errors/__init__.py",
                                                355))
    state = classify([], 0.0, frames=outer)
    assert (state.state, state.reason) == ("idle", "idle-in-loop")
