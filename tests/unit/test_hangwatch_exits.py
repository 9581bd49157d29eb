"""Why each rank ended, and which end no other explains (hangwatch/exits.py), through the real
Watcher on a driven clock: the agents' exit messages as the lab and CI produced them (each test
says where its exits come from), with what each source adds: the node's word on which other
ranks had closed connections of their own, the rank's own record of how its script ended, a
launcher's stop, the clock readings that put every node on the master's clock."""

from __future__ import annotations

from ddp_preflight.hangwatch.text import summary
from ddp_preflight.hangwatch.tracebacks import Reader
from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.transport import LocalNode

RANKS = {"master": [(100, 0), (101, 1)], "worker1": [(102, 2), (103, 3)]}
TORCHRUN = {"master": 90, "worker1": 91}       # each node's torchrun: its ranks' parent


ADDRESS = {"master": "10.0.0.1", "worker1": "10.0.0.2"}


def _endpoints(pid: int, node: str) -> list[str]:
    """A rank's Gloo endpoints: one port per peer (the lab's full mesh), numbered from its pid."""
    return [f"{ADDRESS[node]}:{40000 + 10 * pid + peer}" for peer in range(4)]


def _closed(first: list[tuple[int, int]]) -> list[list[str]]:
    """TIME_WAIT pairs (closer's endpoint, peer's endpoint) for each (closer, peer) pid pair."""
    where = {pid: node for node, found in RANKS.items() for pid, _ in found}
    rank = {pid: r for found in RANKS.values() for pid, r in found}
    return [[_endpoints(a, where[a])[rank[b]], _endpoints(b, where[b])[rank[a]]] for a, b in first]


def _exits(tmp_path, exits, ahead=None, clocks=True, ranks=RANKS, world=4, master="10.0.0.1:29500", closures=(),
           stopped=None, errors=()):
    """Four ranks (master: 0,1; worker1: 2,3) running under one torchrun per node, then these exits
    as the agents' pidfds saw them: (node, pid, t, wait status, and optionally the message's other
    fields: {"closed": {pid: n}}, {"ending": {...}}). ahead: {node: seconds its clock is ahead of
    the master's} (its stamps carry it); clocks: each node's clock read (a 2 ms round trip) as the
    agent answers it; stopped: when ddp-preflight began stopping every node (this machine's clock);
    errors: (node, rank, output) the launcher read from a rank. The verdicts said."""
    events, now, ahead = [], [0.0], ahead or {}
    watcher = Watcher([WatchTarget(LocalNode(n, "python")) for n in ("master", "worker1")],
                      clock=lambda: now[0], wall=lambda: 1.0 + now[0], on_event=events.append,
                      incident_dir=str(tmp_path))
    for node, found in ranks.items():
        if clocks:
            wall = 1.0 + now[0]
            watcher.receive(node, {"type": "clock", "asked": wall - 0.002, "t": wall - 0.001 + ahead.get(node, 0.0)})
        for pid, rank in found:
            watcher.receive(node, {"type": "rank", "pid": pid, "ppid": TORCHRUN[node], "rank": rank,
                                   "local_rank": rank % 2, "world_size": world, "master": master, "env": {}})
    for node, found in ranks.items():
        watcher.receive(node, {"type": "sample", "t": 1.0 + ahead.get(node, 0.0),
                               "ranks": [{"pid": p, "cpu": 90.0, "endpoints": _endpoints(p, node)} for p, _ in found],
                               "gone": []})
    if stopped is not None:
        watcher.launcher_stopping(None, stopped, "ddp-preflight")
    for node, rank, output in errors:
        reader = Reader()
        [info] = [seen for line in output.splitlines() if (seen := reader.feed(line)) is not None]
        watcher.rank_error(node, rank, info)
    for node, pid, t, code, *more in exits:
        now[0] += 0.1
        watcher.receive(node, {"type": "exit", "pid": pid, "t": t + ahead.get(node, 0.0), "code": code,
                               **(more[0] if more else {})})
    if closures:
        watcher.receive("master", {"type": "sample", "t": 20.0, "ranks": [], "gone": [], "closures": list(closures)})
    for _ in range(20):
        now[0] += 0.25
        watcher.tick()
    return [e.snapshot.diagnosis for e in events if e.kind == "diagnosis"]


def _said(found):
    [d] = found
    return d.kind, d.culprits, d.candidates, d.reason, d.certainty


def test_the_first_to_end_with_a_stopped_sibling_not_known_to_be_leaving_leaves_both_as_candidates(tmp_path):
    # Seen in CI: rank 3 called sys.exit(3); rank 2 beside it died of the lost peer (SIGABRT) 0.03 s
    # before torchrun stopped rank 3 (SIGTERM) mid-exit, its own code never seen. The exits alone
    # cannot tell that from rank 2 failing and rank 3 being stopped: both are candidates.
    exits = [("worker1", 102, 10.00, 6), ("worker1", 103, 10.03, 15),
             ("master", 100, 10.64, 256), ("master", 101, 10.73, 15)]
    found = _exits(tmp_path, exits)
    assert _said(found) == ("exited", [], [2, 3], "failed", "unsure"), summary(found[0])
    assert summary(found[0]).startswith(
        "rank 2 ended first (rank 2 on worker1 signal 6, SIGABRT); rank 3 on worker1 was stopped by torchrun right "
        "after, before its own end could be seen (it may have been on its way out): one of these went first"), \
        summary(found[0])
    # The agent's word at rank 2's end: rank 3 had closed connections of its own. Read a sample after
    # rank 2's end, that may be rank 3 losing its peer, so it orders nothing: both stay candidates.
    # The mirror, seen in CI: rank 3's sys.exit(3) ended in SIGABRT (its teardown's), rank 2 closed its
    # connections on losing it and was stopped by torchrun. Read as "rank 2 left first" before.
    leaving = [(*exits[0], {"closed": {103: 3}}), *exits[1:]]
    assert _said(_exits(tmp_path, leaving)) == ("exited", [], [2, 3], "failed", "unsure")
    mirror = [("worker1", 103, 10.00, 6, {"closed": {102: 3}}), ("worker1", 102, 10.03, 15),
              ("master", 100, 10.64, 256), ("master", 101, 10.73, 15)]
    found = _exits(tmp_path, mirror)
    assert _said(found) == ("exited", [], [2, 3], "failed", "unsure"), summary(found[0])
    # Had rank 2 ended with a code (a Python teardown after it raised or lost its peer), its own end
    # may have begun before rank 3's: both stay candidates.
    leaving_after_code = [("worker1", 102, 10.00, 256, {"closed": {103: 3}}), *exits[1:]]
    assert _said(_exits(tmp_path, leaving_after_code))[:4] == ("exited", [], [2, 3], "failed")
    # ... or it had not (it still held every connection: a member stopped by torchrun): rank 2 went first.
    member = [(*exits[0], {"closed": {103: 0}}), *exits[1:]]
    found = _exits(tmp_path, member)
    assert _said(found) == ("exited", [2], [], "failed", "likely"), summary(found[0])
    assert summary(found[0]).startswith("rank 2 on worker1 ended first (signal 6, SIGABRT), before any other rank: "
                                       "its own error or a lost peer, which its exit alone cannot tell; then rank 3 "
                                       "(stopped by its launcher, +0.03 s), rank 0 (exit code 1, +0.64 s), rank 1 "
                                       "(stopped by its launcher, +0.73 s)"), summary(found[0])
    # Its own record (the bootstrap's PID.end, written before its teardown): rank 3 left first, by sys.exit(3).
    recorded = [exits[0], ("worker1", 103, 10.03, 15, {"ending": {"how": "exit", "code": 3, "t": 9.40}}), *exits[2:]]
    found = _exits(tmp_path, recorded)
    assert _said(found) == ("exited", [3], [], "exit-code", "certain"), summary(found[0])
    assert summary(found[0]).startswith("rank 3 on worker1 ended with exit code 3; then rank 2 (signal 6, +0.60 s), "
                                       "rank 0 (exit code 1, +1.24 s), rank 1 (stopped by its launcher, +1.33 s)"), \
        summary(found[0])
    assert [e.notes for e in found[0].evidence if e.rank == 3] == [("its process ended with signal 15",)]


def test_the_rank_that_closed_its_connections_first_left_first_whatever_the_order_of_the_ends(tmp_path):
    # The kernel's word: the side that closes a connection first holds it in TIME_WAIT. Measured on
    # the lab (2x2, rank 3's sys.exit(3)): rank 3 closed first with ranks 0, 1, 2; rank 2 with 0, 1;
    # rank 0 with 1. The same ends as the CI case above, where the exits alone left two candidates.
    exits = [("worker1", 102, 10.00, 6), ("worker1", 103, 10.03, 15),
             ("master", 100, 10.64, 256), ("master", 101, 10.73, 15)]
    closures = _closed([(103, 100), (103, 101), (103, 102), (102, 100), (102, 101), (100, 101)])
    found = _exits(tmp_path, exits, closures=closures)
    assert _said(found) == ("exited", [3], [], "leaving", "certain"), summary(found[0])
    assert summary(found[0]).startswith("rank 3 on worker1 left first: it closed its connections with ranks 0,1,2 before "
                                       "they closed theirs (the kernel's TIME_WAIT on its side); then its process "
                                       "ended (signal 15, SIGTERM)"), summary(found[0])
    # Its own code read too (exit code 3): its own failure, and the kernel's word makes it certain.
    own = [("worker1", 103, 10.00, 768), *[e for e in exits if e[1] != 103]]
    found = _exits(tmp_path, own, closures=closures)
    assert _said(found) == ("exited", [3], [], "exit-code", "certain"), summary(found[0])
    # Measured on the lab (rank 1 raised): rank 1 closed first with every other rank; rank 0 with 2 and 3.
    exits = [("master", 101, 10.00, 256), ("master", 100, 10.06, 15),
             ("worker1", 102, 10.50, 256), ("worker1", 103, 10.57, 15)]
    closures = _closed([(101, 100), (101, 102), (101, 103), (100, 102), (100, 103), (102, 103)])
    found = _exits(tmp_path, exits, closures=closures)
    # Its exit code 1 could be a lost peer's, but it went first: its own failure.
    assert _said(found) == ("exited", [1], [], "failed", "certain"), summary(found[0])
    assert summary(found[0]).startswith("rank 1 on master failed first (exit code 1): it closed its connections with "
                                       "ranks 0,2,3 before they closed theirs"), summary(found[0])
    # A connection reset leaves no TIME_WAIT: with rank 1's connections to rank 0 reset, nobody
    # closed first with every peer, and the kernel's word names nobody; the exits decide as before.
    partial = _closed([(101, 102), (101, 103), (100, 102), (100, 103), (102, 103)])
    found = _exits(tmp_path, exits, closures=partial)
    assert _said(found) == ("exited", [], [0, 1], "failed", "unsure"), summary(found[0])


def test_a_rank_gone_first_with_its_code_unread(tmp_path):
    # Seen in CI: rank 3 called sys.exit(3) and torchrun reaped it before its code was read, then
    # stopped rank 2 beside it; rank 0 died of the lost peer (exit code 1) half a second later.
    found = _exits(tmp_path, [("worker1", 103, 9.48, None), ("worker1", 102, 9.50, 15),
                              ("master", 100, 10.00, 256), ("master", 101, 10.10, 15)])
    assert _said(found) == ("exited", [], [2, 3], "failed", "unsure"), summary(found[0])
    # No rank stopped beside it, its peers died of it later: it is the first, its code unknown.
    found = _exits(tmp_path, [("worker1", 103, 8.80, None), ("master", 100, 10.00, 256),
                              ("worker1", 102, 10.05, 256), ("master", 101, 10.10, 15)])
    assert _said(found) == ("exited", [3], [], "failed", "likely"), summary(found[0])
    assert summary(found[0]).startswith("rank 3 on worker1 ended first (its code unread), before any other rank"), \
        summary(found[0])


def test_exits_are_ordered_on_the_masters_clock_within_each_nodes_margin(tmp_path):
    # Rank 0 failed first, then its peer on worker1 lost it; worker1's clock is 3 s behind, so its
    # own stamps would put rank 2's death first and name it. Each node's clock is read (2 ms round
    # trip): rank 0's end is 0.10 s before rank 2's, far more than the 1 ms margins.
    exits = [("master", 100, 10.00, 256, {"closed": {101: 0}}), ("master", 101, 11.50, 15),
             ("worker1", 102, 10.10, 6, {"closed": {103: 0}}), ("worker1", 103, 11.60, 15)]
    found = _exits(tmp_path, exits, ahead={"worker1": -3.0})
    assert _said(found) == ("exited", [0], [], "failed", "likely"), summary(found[0])
    assert summary(found[0]).startswith("rank 0 on master ended first (exit code 1), before any other rank")
    assert summary(found[0]).endswith("(the nodes' clocks are 3.0 s apart: exit times are put on the master's clock)")
    # Clocks in step (NTP): the same answer, and nothing said of clocks.
    found = _exits(tmp_path, exits, ahead={"worker1": 0.02})
    assert _said(found)[:3] == ("exited", [0], []) and "clocks" not in summary(found[0]), summary(found[0])
    # Without a reading of the clocks (an older agent), the stamps' gaps put worker1 on the master's
    # clock, to within CLOCK_STEP (0.1 s): two ends 0.10 s apart cannot be ordered.
    found = _exits(tmp_path, exits, ahead={"worker1": -3.0}, clocks=False)
    assert _said(found) == ("exited", [], [0, 2], "failed", "unsure"), summary(found[0])
    assert "closer together than the nodes' clocks can order them (within 0.100 s)" in summary(found[0])


def test_a_clean_exit_before_the_others_failed_is_the_rank_that_left(tmp_path):
    # Seen on the lab (bench/hangwatch_kinds.py, quit): rank 3 left the loop and exited with code 0,
    # its peers died of it, one before its own exit was over. No rank that lost a peer exits cleanly.
    found = _exits(tmp_path, [("master", 100, 10.00, 6), ("worker1", 103, 10.08, 0),
                              ("worker1", 102, 10.10, 256), ("master", 101, 10.20, 15)])
    assert _said(found) == ("exited", [3], [], "left-first", "certain"), summary(found[0])
    assert summary(found[0]).startswith("rank 3 on worker1 left first, while the others still ran (exit code 0)")


def test_an_own_code_or_signal_is_named_whatever_the_order(tmp_path):
    # Rank 3's exit code 3 is its own (no lost peer gives it), though rank 2 died first.
    found = _exits(tmp_path, [("worker1", 102, 10.00, 6), ("worker1", 103, 10.03, 768),
                              ("master", 100, 10.64, 256), ("master", 101, 10.73, 15)])
    assert _said(found) == ("exited", [3], [], "exit-code", "likely"), summary(found[0])
    # A SIGKILL no launcher sent (no rank ended before it on its node), with its node's OOM count risen.
    found = _exits(tmp_path, [("master", 101, 10.00, 9, {"oom": True}), ("master", 100, 10.05, 15),
                              ("worker1", 102, 10.60, 256), ("worker1", 103, 10.70, 15)])
    assert _said(found) == ("exited", [1], [], "oom-killed", "certain"), summary(found[0])
    # An uncaught exception, as the rank recorded it: its type, message and line.
    raised = {"how": "raised", "t": 9.2, "type": "RuntimeError", "message": "bad batch at step 5",
              "frames": [{"file": "/work/train.py", "line": 172, "function": "main"}]}
    found = _exits(tmp_path, [("master", 101, 10.00, 256, {"ending": raised}), ("master", 100, 10.05, 15),
                              ("worker1", 102, 10.60, 256), ("worker1", 103, 10.70, 15)])
    assert _said(found) == ("exited", [1], [], "raised", "certain"), summary(found[0])
    assert summary(found[0]).startswith("rank 1 on master raised RuntimeError: bad batch at step 5 at train.py:172; "
                                       "then rank 0 (stopped by its launcher, +0.85 s)"), summary(found[0])


def test_a_healthy_end_with_a_code_nobody_read_is_no_failure(tmp_path):
    # Seen on the lab (a healthy run's end): three ranks exit 0, torchrun reaps the fourth before
    # its code is read. Nothing says anything failed.
    found = _exits(tmp_path, [("worker1", 102, 10.00, 0), ("worker1", 103, 10.01, 0),
                              ("master", 100, 10.02, None), ("master", 101, 10.03, 0)])
    assert found == []


def test_a_run_stopped_from_outside_is_no_failure(tmp_path):
    # Ctrl-C on the master's torchrun: its ranks end with SIGINT, worker1's lose their peer after.
    found = _exits(tmp_path, [("master", 100, 10.00, 2), ("master", 101, 10.01, 2),
                              ("worker1", 102, 10.50, 256), ("worker1", 103, 10.60, 15)])
    assert found == []


def test_an_earlier_runs_clean_end_is_not_this_runs_culprit(tmp_path):
    # Two runs under one watcher: the first ends cleanly; the second's rank 0 fails minutes later.
    events, now = [], [0.0]
    watcher = Watcher([WatchTarget(LocalNode("master", "python"))], clock=lambda: now[0], wall=lambda: now[0],
                      on_event=events.append, incident_dir=str(tmp_path))
    for run, base, at in ((1, 100, 10.0), (2, 200, 400.0)):
        for pid, rank in ((base, 0), (base + 1, 1)):
            watcher.receive("master", {"type": "rank", "pid": pid, "ppid": 90 + run, "rank": rank, "world_size": 2,
                                       "master": "127.0.0.1:29500", "env": {}})
        codes = (0, 0) if run == 1 else (256, 15)
        for pid, code, dt in ((base, codes[0], 0.0), (base + 1, codes[1], 0.1)):
            now[0] = at + dt
            watcher.receive("master", {"type": "exit", "pid": pid, "t": at + dt, "code": code,
                                       "closed": {base + 1: 0} if pid == base else {}})
        for _ in range(12):
            now[0] += 0.25
            watcher.tick()
    [said] = [e.snapshot.diagnosis for e in events if e.kind == "diagnosis"]
    assert (said.kind, said.culprits, said.candidates) == ("exited", [0], []), summary(said)
    assert [e.pid for e in said.evidence] == [200, 201]


def test_a_cascade_of_64_ranks_on_8_nodes_names_the_one_that_raised(tmp_path):
    # The shape of the lab's 2x2 cascades, measured (an uncaught exception on one rank, 8 runs):
    # torchrun stops the raising rank's siblings 0.04-0.12 s after its end; on each other node one
    # rank dies of the lost peer (exit code 1, or SIGABRT) 0.4-0.6 s after it and torchrun stops that
    # node's other ranks 0.02-0.1 s later. Here on 8 nodes x 8 ranks, each node's clock off the
    # master's by its own offset (read, as the agents answer, to within a 2 ms round trip).
    nodes = [f"node{i}" for i in range(8)]
    offsets = {node: (i - 3) * 0.7 for i, node in enumerate(nodes)}      # -2.1 s ... +2.8 s
    ranks = {node: [(1000 + 8 * i + local, 8 * i + local) for local in range(8)] for i, node in enumerate(nodes)}
    culprit_node, culprit = "node5", 43
    raised = {"how": "raised", "t": 99.1, "type": "ValueError", "message": "shapes do not match",
              "frames": [{"file": "/work/train.py", "line": 88, "function": "step"}]}
    exits = []
    for i, node in enumerate(nodes):
        pids = [p for p, _ in ranks[node]]
        if node == culprit_node:
            first_pid, first_at, code = 1000 + culprit, 100.0, 256
        else:
            first_pid, first_at, code = pids[i % 8], 100.4 + 0.025 * i, 6 if i % 2 else 256
        others = [p for p in pids if p != first_pid]
        extra = {"closed": {p: 0 for p in others}}
        if node == culprit_node:
            extra["ending"] = raised
        exits.append((node, first_pid, first_at, code, extra))
        exits += [(node, p, first_at + 0.04 + 0.01 * k, 15) for k, p in enumerate(others)]
    exits.sort(key=lambda e: e[2])
    said = _cascade(tmp_path / "recorded", nodes, offsets, ranks, exits)
    assert (said.kind, said.culprits, said.candidates, said.reason, said.certainty) == \
        ("exited", [culprit], [], "raised", "certain"), summary(said)
    assert summary(said).startswith("rank 43 on node5 raised ValueError: shapes do not match at train.py:88; then ")
    # Without its record (an attached run, its output a pipe), its exit code 1 is what a lost peer
    # gives too: it is named as the first to end, ordered on the master's clock, and how sure says so.
    bare = [(n, p, t, c, {k: v for k, v in m[0].items() if k != "ending"} if m else {}) for n, p, t, c, *m in exits]
    said = _cascade(tmp_path / "bare", nodes, offsets, ranks, bare)
    assert (said.kind, said.culprits, said.candidates, said.reason, said.certainty) == \
        ("exited", [culprit], [], "failed", "likely"), summary(said)


def _cascade(tmp_path, nodes, offsets, ranks, exits):
    """The verdict said on these exits, each node's clock read first."""
    events, now = [], [0.0]
    watcher = Watcher([WatchTarget(LocalNode(n, "python")) for n in nodes], clock=lambda: now[0],
                      wall=lambda: 1.0 + now[0], on_event=events.append, incident_dir=str(tmp_path))
    for node in nodes:
        wall = 1.0 + now[0]
        watcher.receive(node, {"type": "clock", "asked": wall - 0.002, "t": wall - 0.001 + offsets[node]})
        for pid, rank in ranks[node]:
            watcher.receive(node, {"type": "rank", "pid": pid, "ppid": 90, "rank": rank, "local_rank": rank % 8,
                                   "world_size": 64, "master": "10.0.0.1:29500", "env": {}})
    for node, pid, t, code, *more in exits:
        now[0] += 0.01
        watcher.receive(node, {"type": "exit", "pid": pid, "t": t + offsets[node], "code": code,
                               **(more[0] if more else {})})
    for _ in range(20):
        now[0] += 0.25
        watcher.tick()
    [said] = [e.snapshot.diagnosis for e in events if e.kind == "diagnosis"]
    return said


def test_the_rank_its_victims_errors_name_left_first(tmp_path):
    # Gloo's "Connection closed by peer [10.0.0.2:40313]" names the endpoint of the rank that went:
    # rank 3's own (its connection to rank 1). Rank 3's end was not seen (torchrun stopped it mid-exit).
    said = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:{port}"
    lost = {"how": "raised", "t": 10.0, "type": "RuntimeError", "message": said.format(port=40000 + 10 * 103 + 1),
            "frames": [{"file": "/work/train.py", "line": 51, "function": "step"}]}
    exits = [("worker1", 102, 10.00, 6), ("worker1", 103, 10.03, 15),
             ("master", 101, 10.64, 256, {"ending": lost}), ("master", 100, 10.73, 15)]
    found = _exits(tmp_path, exits)
    assert _said(found) == ("exited", [3], [], "leaving", "certain"), summary(found[0])
    assert summary(found[0]).startswith("rank 3 on worker1 left first: its peers' errors name it: rank 1 lost its "
                                       "connection to it; then its process ended (signal 15, SIGTERM)"), \
        summary(found[0])


def test_a_recorded_launch_names_the_rank_that_raised_from_its_output(tmp_path):
    # A real `ddp-preflight --launch` on the lab (tests/unit/artifacts/logs/launch-raise): rank 3
    # raised RuntimeError; its peers' output says they lost it; torchrun and ddp-preflight stopped
    # the rest. What the launcher tells hangwatch: each rank's exit (result.json) and the exception
    # its output shows (read line by line, as the launcher reads them).
    import json
    from pathlib import Path

    from ddp_preflight.hangwatch.tracebacks import Reader
    from ddp_preflight.node.protocol import ExitStatus

    folder = Path(__file__).parent / "artifacts" / "logs" / "launch-raise"
    result = json.loads((folder / "result.json").read_text())
    events, now = [], [0.0]
    watcher = Watcher([WatchTarget(LocalNode(n, "python")) for n in ("master", "worker1")], clock=lambda: now[0],
                      wall=lambda: 1.0 + now[0], on_event=events.append, incident_dir=str(tmp_path))
    for r in result["ranks"]:
        status = ExitStatus(code=r["exit"]) if r["exit"] is not None else ExitStatus(signal=r["signal"])
        watcher.rank_ended(r["node"], r["rank"], r["pid"], status)
    readers: dict[int, Reader] = {}
    for node in ("master", "worker1"):
        for raw in (folder / f"{node}.log").read_text().splitlines():
            if not raw.startswith(f"[{node} r"):
                continue
            rank = int(raw[len(node) + 3:].split("]", 1)[0])
            seen = readers.setdefault(rank, Reader()).feed(raw.split("] ", 1)[1])
            if seen is not None:
                watcher.rank_error(node, rank, seen)
    verdict = watcher.verdict()
    assert verdict is not None
    assert (verdict.kind, verdict.culprits, verdict.candidates, verdict.reason, verdict.certainty) == \
        ("exited", (3,), (), "raised", "certain"), summary(verdict)
    assert summary(verdict).startswith("rank 3 on worker1 raised RuntimeError: bad batch at step 5 at hang_train.py:")
    assert sorted(e.rank for e in verdict.evidence if e.reason == "lost-peer") == [0, 1, 2]


# As a rank on master printed it under load, when ddp-preflight's stop reached worker1 first (CI, Ctrl-C test).
LOST_PEER = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/check/work/main/examples/train_ddp.py", line 88, in main
[rank0]:     dist.all_reduce(grad)
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:40340.
"""
OWN = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/check/work/main/examples/train_ddp.py", line 90, in main
[rank1]:     raise RuntimeError("bad batch at step 5")
[rank1]: RuntimeError: bad batch at step 5
"""


def test_whatever_ends_after_ddp_preflight_began_stopping_every_node_is_that_stop_not_a_failure(tmp_path):
    # CI (Ctrl-C under load): worker1's ranks died of the SIGTERM first; master's lost them (exit
    # code 1, Gloo's "Connection closed by peer") before their own SIGTERM came. The run was stopped.
    exits = [("worker1", 102, 10.05, 15), ("worker1", 103, 10.06, 15),
             ("master", 100, 10.30, 256), ("master", 101, 10.35, 256)]
    lost = [("master", 0, LOST_PEER), ("master", 1, LOST_PEER.replace("rank0", "rank1"))]
    assert _exits(tmp_path, exits, stopped=10.0, errors=lost) == []
    # Every rank's code 1 and no output read yet: the same.
    assert _exits(tmp_path, [(n, p, t, 256) for n, p, t, _ in exits], stopped=10.0) == []
    # A failure of its own after the stop began (a handler of SIGTERM that raises): the stop's too.
    assert _exits(tmp_path, exits, stopped=10.0, errors=[("master", 1, OWN)]) == []
    # The same ends without ddp-preflight's stop: rank 1's own failure, and master's lost peers are
    # not a stop.
    found = _exits(tmp_path, exits, errors=[("master", 1, OWN)])
    assert _said(found) == ("exited", [1], [], "raised", "certain"), summary(found[0])
    # A failure before the stop (the stop's cause: --launch stops every node when a rank fails) is named.
    before = [("worker1", 103, 9.50, 768), ("worker1", 102, 9.55, 15),
              ("master", 100, 10.30, 256), ("master", 101, 10.35, 15)]
    found = _exits(tmp_path, before, stopped=10.0, errors=lost[:1])
    assert _said(found) == ("exited", [3], [], "exit-code", "likely"), summary(found[0])
    # An end within its node's clock margin of the stop is not known to have come after it: worker1's
    # clock 3 s behind and never read (put on the master's by its stamps' gaps, to within 0.1 s),
    # rank 2's code 1 at 10.05 may have come before the stop at 10.0; the SIGTERMs after it are the stop's.
    close = [("worker1", 102, 10.05, 256), ("master", 100, 10.30, 15), ("master", 101, 10.31, 15),
             ("worker1", 103, 10.40, 15)]
    found = _exits(tmp_path, close, stopped=10.0, clocks=False, ahead={"worker1": -3.0})
    assert _said(found) == ("exited", [2], [], "failed", "likely"), summary(found[0])
    # Read within a millisecond (the clock read), it came after the stop: the stop's.
    assert _exits(tmp_path, close, stopped=10.0, ahead={"worker1": -3.0}) == []
