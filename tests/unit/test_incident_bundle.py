"""An incident bundle from a recorded deadlock snapshot: its user's alone, and no secret in it
(the ranks' environments and command lines come as the agent sent them)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from ddp_preflight.hangwatch.incident import write
from ddp_preflight.hangwatch.model import Snapshot

SNAPSHOTS = Path(__file__).parent / "artifacts" / "snapshots"
SECRETS = {"HF_TOKEN": "hf_abcdef", "WANDB_API_KEY": "0123abcd", "MY_PASS": "hunter2"}


def details() -> dict:
    """What Watcher.details() gives: each node's hello, each rank's argv and environment."""
    env = {"RANK": "1", "GLOO_SOCKET_IFNAME": "eth0", "DATABASE_URL": "postgres://u:dbpw@db:5432/x", **SECRETS}
    argv = ["/opt/venv/bin/python", "-u", "train.py", "--token", "tok_arg", "--mirror", "https://me:mirrorpw@host/s"]
    return {"nodes": {"master": {"host": "master", "python": "3.11.7", "torch": "2.13.0", "py_spy": "0.4.0"}},
            "ranks": {"master:11351": {"argv": argv, "env": env, "master": "10.213.0.200:29500"}}}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_bundle_is_private_and_keeps_no_secret(tmp_path):
    snapshot = Snapshot.from_json(json.loads((SNAPSHOTS / "deadlock.json").read_text()))
    snapshot.ranks[1].last_line = "pushing to https://me:pushpw@hub/x"
    bundle = Path(write(snapshot, details(), str(tmp_path / "incidents")))
    assert mode(tmp_path / "incidents") == 0o700 and mode(bundle) == 0o700
    assert {p.name: mode(p) for p in bundle.iterdir()} == {"incident.json": 0o600, "report.txt": 0o600}
    document, report = (bundle / "incident.json").read_text(), (bundle / "report.txt").read_text()
    for secret in (*SECRETS.values(), "dbpw", "tok_arg", "mirrorpw", "pushpw"):
        assert secret not in document and secret not in report, secret
    rank = json.loads(document)["ranks"]["master:11351"]
    # By allow-list (issue 23): DATABASE_URL is no name known safe, so its value is hidden whole.
    assert rank["env"]["DATABASE_URL"] == "<redacted>" and rank["env"]["HF_TOKEN"] == "<redacted>"
    assert rank["argv"][3:] == ["--token", "<redacted>", "--mirror", "https://<redacted>@host/s"]
    assert "    GLOO_SOCKET_IFNAME=eth0" in report and "    MY_PASS=<redacted>" in report
    assert "DEADLOCK" in report


def test_a_second_bundle_in_an_existing_folder_is_private_too(tmp_path):
    folder = tmp_path / "incidents"
    folder.mkdir(mode=0o755)
    snapshot = Snapshot.from_json(json.loads((SNAPSHOTS / "deadlock.json").read_text()))
    first, second = (Path(write(snapshot, details(), str(folder))) for _ in range(2))
    assert first != second and mode(first) == mode(second) == 0o700
    assert mode(second / "incident.json") == mode(second / "report.txt") == 0o600
