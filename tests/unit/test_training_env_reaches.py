"""The training's variables (--env, the config's [env]) reach what preflight runs on a node: the
fact collector (so the checks judge them) and the probes' torchrun jobs (so the probes measure
what the ranks will get). Real local runs of the CLI, and the probes' environment rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddp_preflight.preflight.model import NodeFacts, Options
from ddp_preflight.preflight.probes import torchjob
from ddp_preflight.rules.training_env import TrainingEnv, parse_env_args

from . import facts_fixtures as ff

REPO = Path(__file__).parents[2]
CLI = [sys.executable, "-m", "ddp_preflight"]


def preflight_json(*args: str, timeout: float = 120) -> dict:
    done = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_a_probe_job_gets_preflights_settings_then_the_training_variables_which_win():
    art = ff.clean()
    nodes = {n["node"]: NodeFacts(n["node"], n["facts"]) for n in art["nodes"]}
    env = TrainingEnv(tuple(parse_env_args(["worker1:GLOO_SOCKET_IFNAME=eth9", "TP_SOCKET_IFNAME=eth0"],
                                           ["master", "worker1"])))
    options = Options(env=env, master_addr=art["master_addr"])

    assert torchjob.preflight_env(nodes["worker1"], options) == {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    assert torchjob.node_env(nodes["worker1"], options) == \
        {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth9", "TP_SOCKET_IFNAME": "eth0"}
    assert torchjob.node_env(nodes["master"], options) == \
        {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0"}


def test_an_env_variable_reaches_the_collectives_probes_ranks():
    # Only the job's environment can carry it: Gloo reads GLOO_DEVICE_TRANSPORT in each rank.
    report = preflight_json("--only", "collectives", "--env", "GLOO_DEVICE_TRANSPORT=nosuch")
    (result,) = report["results"]
    assert result["status"] == "fail"
    assert "RuntimeError: makeDeviceForHostname(): unsupported gloo device" in result["summary"]


def test_device_dtype_judges_the_dtype_given_with_env_on_this_cpu():
    report = preflight_json("--only", "device-dtype", "--env", "NANOCHAT_DTYPE=bfloat16")
    (result,) = report["results"]
    flags = Path("/proc/cpuinfo").read_text().split()
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        assert (result["status"], result["summary"]) == ("pass", "gloo on cpu, dtype bfloat16")
    else:
        assert result["status"] == "warn" and "has no bf16 instructions" in result["summary"]
        assert result["fix"] == "--env NANOCHAT_DTYPE=float32"
        # ... and that fix, given after the first, is what the training then gets: it passes.
        again = preflight_json("--only", "device-dtype", "--env", "NANOCHAT_DTYPE=bfloat16",
                               "--env", "NANOCHAT_DTYPE=float32")
        assert [(r["status"], r["summary"]) for r in again["results"]] == [("pass", "gloo on cpu, dtype float32")]
