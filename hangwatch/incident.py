"""An incident bundle: a folder with incident.json (the snapshot, each node's versions, each
rank's command line and environment with secrets redacted) and report.txt (the same, to read)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .model import Snapshot
from .render import incident_report


def write(snapshot: Snapshot, details: dict, folder: str = "hangwatch-incidents") -> str:
    kind = snapshot.diagnosis.kind if snapshot.diagnosis else "manual"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(snapshot.time))
    base = Path(folder).resolve()
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"incident-{stamp}-{kind}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"incident-{stamp}-{kind}-{n}"
    path.mkdir()
    document = {"snapshot": snapshot.to_json(), **details}
    (path / "incident.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    (path / "report.txt").write_text(incident_report(snapshot, details))
    os.chmod(path / "incident.json", 0o600)     # it holds environments, even redacted
    return str(path)
