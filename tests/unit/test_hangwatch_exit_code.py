"""hangwatch's exit code (cli/hangwatch.py): 1 only when a hang was named, 2 on the watch's own
crash, whatever it named before; replayed on recorded agent messages (artifacts/agent/*.jsonl)
through a real Watcher, whose listener is the kind of code that fails for real (a write to a
closed pipe)."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_preflight.cli.exit import Exit
from ddp_preflight.cli.hangwatch import outcome
from ddp_preflight.hangwatch.events import EventKind
from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.transport import LocalNode

AGENT = Path(__file__).parent / "artifacts" / "agent"


def watched(name, tmp_path, on_event):
    """The recording fed to a real Watcher on a driven clock, its events to `on_event`."""
    lines = (AGENT / f"{name}.jsonl").read_text().splitlines()
    records = sorted((json.loads(line) for line in lines[1:]), key=lambda r: r["at"])
    hello = next(r for r in records if r["msg"].get("type") == "hello")
    now = [0.0]
    watcher = Watcher([WatchTarget(LocalNode("master", "python")), WatchTarget(LocalNode("worker1", "python"))],
                      clock=lambda: now[0], wall=lambda: hello["msg"]["time"] - hello["at"] + now[0],
                      on_event=on_event, incident_dir=str(tmp_path / "incidents"))
    for record in records:
        while now[0] + 0.25 <= record["at"]:
            now[0] += 0.25
            watcher.tick()
        now[0] = record["at"]
        watcher.receive(record["node"], record["msg"])
    return watcher


def test_a_named_hang_is_1_and_a_straggler_is_0(tmp_path):
    events: list = []
    watcher = watched("leave", tmp_path, events.append)
    hangs = [e for e in events if e.hang]
    assert [e.kind for e in hangs] == [EventKind.DIAGNOSIS] and hangs[0].verdict.kind == "deadlock"
    assert watcher.failed is None and outcome(bool(hangs), watcher.failed) == Exit.FOUND == 1
    events.clear()
    watcher = watched("straggle", tmp_path, events.append)
    said = [e for e in events if e.verdict is not None]
    assert said and not [e for e in events if e.hang], [e.text for e in events]     # a straggler: said, no hang
    assert outcome(False, watcher.failed) == Exit.OK == 0


def test_the_watchs_own_crash_is_2_never_1_and_the_watch_goes_on(tmp_path):
    events: list = []

    def closed_pipe(event):
        events.append(event)
        if event.kind is EventKind.DIAGNOSIS:
            raise BrokenPipeError(32, "Broken pipe")       # `hangwatch attach --json | head -1`

    watcher = watched("leave", tmp_path, closed_pipe)
    assert watcher.failed == "BrokenPipeError: [Errno 32] Broken pipe"
    # The watch went on after its listener failed: the bundle was still written and said.
    assert [e.kind for e in events].count(EventKind.INCIDENT) == 1
    assert list((tmp_path / "incidents").iterdir())
    # A hang was named, yet the exit says the watch itself failed.
    assert outcome(True, watcher.failed) == Exit.USAGE == 2
    assert outcome(False, watcher.failed) == Exit.USAGE
