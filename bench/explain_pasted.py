"""`ddp-preflight explain` on the corpus of logs users pasted (tests/unit/artifacts/pasted/): for each
log, explain's library call against the verdict the log supports (index.json's `expected`: kind,
culprits, certainty, cause). Prints the figure: right (all four), partly (the kind or the cause),
wrong, and "no failure found"; with -v, every log that is not right."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PASTED = ROOT / "tests" / "unit" / "artifacts" / "pasted"


def answer(path: Path) -> dict | None:
    """What explain says of one log, in the corpus's fields (None: no failure found)."""
    from ddp_preflight.explain import explain
    e = explain([str(path)])
    finding = getattr(e, "finding", None)
    if finding is not None:
        return finding.to_json()
    d = e.diagnosis
    if d is None:
        return None
    # explain before the catalogue said no corpus kind or cause: its reason, as the nearest id
    return {"kind": d.kind.value, "cause": d.reason.value if d.reason else "unknown",
            "culprits": [c for c in d.culprits if isinstance(c, int)],
            "certainty": {"unsure": "unknown"}.get(d.certainty.value, d.certainty.value)}


def grade(expected: dict, got: dict | None) -> str:
    if expected["kind"] == "no-failure":           # a healthy part of a run: any finding is a false alarm
        return "right" if got is None else "wrong"
    if got is None:
        return "no failure found"
    same = [got.get(k) == expected[k] for k in ("kind", "culprits", "certainty", "cause")]
    if all(same):
        return "right"
    return "partly" if same[0] or same[3] else "wrong"


def main() -> None:
    verbose = "-v" in sys.argv
    counts: dict[str, int] = {}
    for entry in json.loads((PASTED / "index.json").read_text()):
        got = answer(PASTED / entry["file"])
        mark = grade(entry["expected"], got)
        counts[mark] = counts.get(mark, 0) + 1
        if verbose and mark != "right":
            x = entry["expected"]
            print(f"{entry['file'][:44]:44} {mark:8} want {x['kind']} {x['culprits']} {x['certainty']} {x['cause']}"
                  f"\n{'':53} got  " + (f"{got['kind']} {got['culprits']} {got['certainty']} {got['cause']}"
                                        if got else "-"))
    total = sum(counts.values())
    print(f"explain on {total} pasted logs: " + ", ".join(
        f"{counts.get(m, 0)} {m}" for m in ("right", "partly", "wrong", "no failure found")))


if __name__ == "__main__":
    main()
