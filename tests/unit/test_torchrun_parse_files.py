"""The facts stage reads torchrun's parser from torch's files, without importing torch: it parses
every command as torchrun itself does (the real torch of this environment), in a fraction of a
second, and a torch whose file is not of that shape is imported as before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMANDS = [["train.py", "--lr", "3"], ["-m", "pkg.train", "--x"], ["--standalone", "train.py"],
            ["--no-python", "echo", "hi"], ["--rdzv-backend", "c10d", "--rdzv_endpoint", "h:1", "train.py"],
            ["--numa-binding", "node", "t.py"], ["--bogus", "t.py"], ["--run-path", "x.py"],
            ["--nproc_per_node=4", "t.py", "--nproc-per-node", "9"], ["--max-restarts"], ["--module"]]


def run(code: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=REPO, env={"PATH": "/usr/bin:/bin", **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_parses_as_torchrun_does_without_importing_torch():
    got = run(f"""
        import json, sys, time
        from ddp_preflight.node.facts import launch
        start = time.perf_counter()
        fast = [launch.torchrun_parse(c, 2, 2) for c in {COMMANDS!r}]
        seconds, imported = time.perf_counter() - start, "torch" in sys.modules
        launch._factory[:] = [launch._imported()]
        real = [launch.torchrun_parse(c, 2, 2) for c in {COMMANDS!r}]
        print(json.dumps({{"fast": fast, "real": real, "imported": imported, "seconds": seconds}}))
        """)
    assert got["imported"] is False
    assert got["fast"] == got["real"]
    assert got["fast"][1] == {"parsed": True, "training_script": "pkg.train", "training_script_args": ["--x"],
                              "module": True, "run_path": False, "no_python": False}
    assert got["fast"][6]["parsed"] is False and "--bogus" in got["fast"][6]["message"]
    assert got["seconds"] < 2.0, got["seconds"]      # torch's import alone takes several here


def fake_torch(root: Path, body: str) -> None:
    folder = root / "torch" / "distributed"
    folder.mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("import sys\nsys.stderr.write('torch imported\\n')\n")
    (folder / "__init__.py").write_text("")
    (folder / "argparse_util.py").write_text("import os\nfrom argparse import Action\n"
                                             "class env(Action):\n    pass\nclass check_env(Action):\n    pass\n")
    (folder / "run.py").write_text("from argparse import ArgumentParser, REMAINDER\n" + textwrap.dedent(body))


def test_a_torch_whose_parser_needs_more_of_torch_is_imported(tmp_path):
    # A name from elsewhere in torch in a default, not in choices: the file alone cannot build it.
    fake_torch(tmp_path, """
        from torch.other import DEFAULT
        def get_args_parser():
            parser = ArgumentParser()
            parser.add_argument("--mode", default=DEFAULT)
            parser.add_argument("training_script", type=str)
            parser.add_argument("training_script_args", nargs=REMAINDER)
            return parser
        """)
    got = run("""
        import json
        from ddp_preflight.node.facts import launch
        print(json.dumps({"files": launch._from_files() is None}))
        """, PYTHONPATH=str(tmp_path))
    assert got == {"files": True}


def test_a_choice_from_elsewhere_in_torch_is_left_out(tmp_path):
    fake_torch(tmp_path, """
        from torch.numa import Modes
        def get_args_parser():
            parser = ArgumentParser()
            parser.add_argument("--mode", choices=[m for m in Modes], default=None)
            parser.add_argument("--module", "-m", action="store_true")
            parser.add_argument("--nnodes")
            parser.add_argument("--nproc-per-node")
            for flag in ("--run-path", "--no-python"):
                parser.add_argument(flag, action="store_true")
            parser.add_argument("training_script", type=str)
            parser.add_argument("training_script_args", nargs=REMAINDER)
            return parser
        """)
    got = run("""
        import json, sys
        from ddp_preflight.node.facts import launch
        parsed = launch.torchrun_parse(["--mode", "any", "-m", "pkg", "a"], 1, 1)
        print(json.dumps({"parsed": parsed, "imported": "torch" in sys.modules}))
        """, PYTHONPATH=str(tmp_path))
    assert got["imported"] is False
    assert got["parsed"] == {"parsed": True, "training_script": "pkg", "training_script_args": ["a"],
                             "module": True, "run_path": False, "no_python": False}
