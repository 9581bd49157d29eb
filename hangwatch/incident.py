"""An incident bundle: a folder with incident.json (the snapshot, each node's versions, each
rank's command line and environment) and report.txt (the same, to read). Secrets are redacted
by name and by value (node/redact.py) and the bundle is its user's alone: the folder 0700,
the files 0600."""

from __future__ import annotations

import json
import time
from pathlib import Path

from node.private import FOLDER_MODE, make_folder, write_file
from node.redact import redact_argv, redact_json

from .model import Snapshot
from .render import incident_report


def write(snapshot: Snapshot, details: dict, folder: str = "hangwatch-incidents") -> str:
    kind = snapshot.diagnosis.kind if snapshot.diagnosis else "manual"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(snapshot.time))
    base = make_folder(Path(folder).resolve())
    path = base / f"incident-{stamp}-{kind}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"incident-{stamp}-{kind}-{n}"
    path.mkdir(mode=FOLDER_MODE)
    document = redact(snapshot, details)
    write_file(path / "incident.json", json.dumps(document, indent=2, default=str) + "\n")
    # The report is rendered from what incident.json keeps: nothing in it escaped the redaction.
    write_file(path / "report.txt", incident_report(Snapshot.from_json(document["snapshot"]), document))
    return str(path)


def redact(snapshot: Snapshot, details: dict) -> dict:
    """The bundle's document with the secrets out: every rank's command line (`--token X`) and
    environment, and credentials in any text of the snapshot."""
    ranks = {key: {**rank, "argv": redact_argv(rank.get("argv") or [])}
             for key, rank in (details.get("ranks") or {}).items()}
    return redact_json({"snapshot": snapshot.to_json(), **details, "ranks": ranks})
