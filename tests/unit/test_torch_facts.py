"""The torch facts read from torch/version.py must equal what `import torch` reports."""

import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.node.facts import torchinfo


def test_cpu_build_facts_without_import_equal_the_imported_ones():
    fast = torchinfo.torch_facts()
    if fast.get("build") != "cpu":
        pytest.fail(f"this machine's torch is a {fast.get('build')} build; the test needs the CPU build")
    full = torchinfo.torch_facts(full=True)
    assert fast["imported"] is False and full["imported"] is True
    for key in ("version", "git_version", "cuda", "hip", "build", "path", "distributed", "backends",
                "cuda_available", "cuda_devices"):
        assert fast[key] == full[key], key


def test_a_python_without_torch_reports_it_missing(tmp_path):
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); "
            "from ddp_preflight.node.facts import torchinfo; print(json.dumps(torchinfo.torch_facts()))")
    done = subprocess.run([sys.executable, "-S", "-c", code, str(Path(__file__).parents[2])],
                          capture_output=True, text=True)   # -S: no site-packages, so no torch
    assert '"missing": true' in done.stdout and "not installed" in done.stdout
