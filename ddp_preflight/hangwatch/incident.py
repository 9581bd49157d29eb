"""An incident bundle: a folder with incident.json (the snapshot, each node's versions, each
rank's command line and environment) and report.txt (the same, to read). Secrets are redacted
by name and by value (node/redact.py) and the bundle is its user's alone: the folder 0700,
the files 0600, made relative to the incident folder's descriptor (node/private.py), which is
held for the rest of the watch: a link planted on the way is refused in one line, and one swapped
in mid-run redirects no later bundle."""

from __future__ import annotations

import json
import time

from ddp_preflight.node.private import hold
from ddp_preflight.node.redact import redact_argv, redact_env, redact_json

from .model import Snapshot
from .render import incident_report, snapshot_json


def write(snapshot: Snapshot, details: dict, folder: str = "hangwatch-incidents") -> str:
    kind = snapshot.diagnosis.kind if snapshot.diagnosis else "manual"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(snapshot.time))
    base = hold(folder)
    name, n = f"incident-{stamp}-{kind}", 1
    while True:
        try:
            bundle = base.new_folder(name)
            break
        except FileExistsError:
            n += 1
            name = f"incident-{stamp}-{kind}-{n}"
    document = redact(snapshot, details)
    with bundle:
        bundle.write_file("incident.json", json.dumps(document, indent=2, default=str) + "\n")
        # The report is rendered from what incident.json keeps: nothing in it escaped the redaction.
        bundle.write_file("report.txt", incident_report(Snapshot.from_json(document["snapshot"]), document))
    return bundle.path


def redact(snapshot: Snapshot, details: dict) -> dict:
    """The bundle's document with the secrets out: every rank's command line (`--token X`,
    `--password -xSECRET`), its environment by allow-list (a value only for a name known safe:
    an agent redacts before it sends, and an older one may not), any value under a secret key,
    and credentials in any text of the snapshot."""
    ranks = {key: {**rank, "argv": redact_argv(rank.get("argv") or []),
                   **({"env": redact_env(rank["env"])} if isinstance(rank.get("env"), dict) else {})}
             for key, rank in (details.get("ranks") or {}).items()}
    return redact_json({"snapshot": snapshot_json(snapshot), **details, "ranks": ranks})
