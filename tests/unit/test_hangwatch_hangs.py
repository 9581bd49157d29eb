"""The hang model on real programs (issue 12): a rank that waits in C++ under its own Python frame
is a waiter, never the culprit; a GPU that never finishes; a rank that computes for ever; a rank
that leaves cleanly first. Recorded stacks (tests/unit/artifacts/pyspy/waits, gpu-h100) through
the real Watcher on a driven clock; the agent's messages carry the recorded values."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_preflight.hangwatch import stall
from ddp_preflight.hangwatch.classify import classify
from ddp_preflight.hangwatch.diagnose import diagnose
from ddp_preflight.hangwatch.model import Kind, RankStatus
from ddp_preflight.hangwatch.text import summary
from ddp_preflight.hangwatch.watch import Watcher, WatchTarget
from ddp_preflight.transport import LocalNode

ART = Path(__file__).parent / "artifacts"
WAITS = ART / "pyspy" / "waits"
H100 = ART / "gpu-h100"


def seen(states):
    """The ranks' states as the evidence a verdict reads (a rank numbered below 0 is a pid)."""
    return {r: s.as_evidence("node", 100 + r if r >= 0 else -r, r if r >= 0 else None) for r, s in states.items()}


def dump(path: Path) -> list:
    return json.loads(path.read_text())


# -- one rank -----------------------------------------------------------------------------------

def test_a_wait_in_cxx_under_the_users_own_frame_is_a_wait_with_the_users_line():
    for name, op in (("work", "Work.wait()"), ("future", "Future.wait()"), ("store", "store.get()")):
        state = classify(dump(WAITS / f"native_{name}.json"), 0.0)
        assert state.state is RankStatus.COLLECTIVE and state.op == op, (name, state)
        assert state.frame.file == "waits.py" and state.frame.line in (9, 17, 20)
    # Without native frames the same rank looks idle at its own line: why they are taken in a stall.
    assert classify(dump(WAITS / "python_work.json"), 0.0).state is RankStatus.IDLE


def test_a_rank_blocked_on_its_gpu_is_waiting_on_the_gpu_at_its_line():
    state = classify(dump(H100 / "hung-pyspy-native.json"), 70.0)       # it spins: 50-100 % CPU
    assert state.state is RankStatus.GPU_WAIT and state.op == "cuStreamSynchronize"
    assert state.frame.where == "gpu_hang2.py:20"                        # loss.item()
    assert classify(dump(H100 / "healthy-pyspy-native.json"), 60.0).state is RankStatus.COMPUTING


# -- the ranks together -------------------------------------------------------------------------

def test_the_rank_in_work_wait_is_not_blamed_the_one_that_left_is():
    left = classify(dump(ART / "pyspy" / "deadlock_rank1_left_loop.json"), 0.0)
    waiting = classify(dump(WAITS / "native_work.json"), 0.0)
    found = diagnose(seen({0: waiting, 1: left}))
    assert found.kind is Kind.DEADLOCK and found.culprits == (1,), found
    assert summary(found).endswith("rank 0 waits in Work.wait()")


def test_a_wait_on_an_async_handle_never_makes_a_mismatch():
    all_reduce = classify(dump(ART / "pyspy" / "deadlock_rank0_all_reduce.json"), 0.0)
    work = classify(dump(WAITS / "native_work.json"), 0.0)
    left = classify(dump(ART / "pyspy" / "deadlock_rank1_left_loop.json"), 0.0)
    found = diagnose(seen({0: all_reduce, 1: work, 2: left}))
    assert found.kind is Kind.DEADLOCK and found.culprits == (2,), found


def test_two_ranks_in_two_collectives_name_no_culprit():
    from ddp_preflight.hangwatch.classify import RankState
    found = diagnose(seen({0: RankState("collective", "all_reduce"), 1: RankState("collective", "barrier")}))
    assert found.kind is Kind.MISMATCH and found.culprits == (), found
    assert "cannot be told" in summary(found)


# -- over time, through the watcher -------------------------------------------------------------

class Run:
    """A Watcher fed one node's agent messages on a clock the test drives."""

    def __init__(self, tmp_path, **options):
        self.now, self.events = [0.0], []
        self.watcher = Watcher([WatchTarget(LocalNode("h100", "python"))], clock=lambda: self.now[0],
                               wall=lambda: 1_800_000_000.0 + self.now[0], on_event=self.events.append,
                               incident_dir=str(tmp_path / "incidents"), **options)
        self.asked = 0
        self.watcher.links = {"h100": self}         # what the watcher sends reaches this test
        self.receive({"type": "hello", "pid": 1, "py_spy": "/usr/bin/py-spy"})

    def send(self, command: dict) -> bool:
        if command.get("cmd") == "stacks":
            self.asked += 1
        return True

    def receive(self, message: dict) -> None:
        self.watcher.receive("h100", message)

    def run(self, seconds: float, sample, stacks=None) -> None:
        """`sample(t)` each second; when stacks were asked for, `stacks(t)` answers them."""
        end = self.now[0] + seconds
        while self.now[0] < end:
            self.now[0] = round(self.now[0] + 0.25, 2)
            if self.now[0] % 1 == 0:
                self.receive(sample(self.now[0]))
            if self.asked and stacks is not None:
                self.asked = 0
                self.receive({"type": "stacks", "id": 1, "t": self.now[0], "stacks": stacks(self.now[0])})
            self.watcher.tick()

    def said(self, kind: str) -> list:
        return [e for e in self.events if e.kind == kind]


def test_a_gpu_that_never_finishes_is_named_from_its_progress_not_its_memory_activity(tmp_path):
    # The recorded hang: one rank, its host thread spinning at ~70 % CPU (cpu.txt: 349 ticks in
    # 5 s), the GPU busy (hung-nvsmi.csv: 100 %), the stack in cuStreamSynchronize under loss.item()
    # (hung-pyspy-native.json) in every dump. Its memory activity is given as 1 %, not the recorded
    # 0 %: progress decides (the stack unchanged while it spins), never a level of memory activity.
    run = Run(tmp_path)
    run.receive({"type": "rank", "pid": 789, "rank": 0, "world_size": 1, "env": {}})
    healthy = lambda t: {"type": "sample", "t": t, "ranks": [{"pid": 789, "cpu": 53.0, "gpu": 0}],   # noqa: E731
                         "gpus": [{"index": 0, "util": 2.0, "memory_util": 1.0}]}
    run.run(30, healthy, lambda t: {789: dump(H100 / "healthy-pyspy-native.json")})
    assert not run.said("diagnosis")
    hung_at = run.now[0]
    hung = lambda t: {"type": "sample", "t": t, "ranks": [{"pid": 789, "cpu": 69.8, "gpu": 0}],   # noqa: E731
                      "gpus": [{"index": 0, "util": 100.0, "memory_util": 1.0}]}
    half = stall.DEFAULT_THRESHOLD / 2
    run.run(stall.DEFAULT_THRESHOLD + half + 2, hung, lambda t: {789: dump(H100 / "hung-pyspy-native.json")})
    [said] = run.said("diagnosis")
    diagnosis = said.snapshot.diagnosis
    assert (diagnosis.kind, diagnosis.culprits, diagnosis.candidates, diagnosis.reason, diagnosis.certainty) == \
        (Kind.GPU_HANG, [0], [], "waits-on-gpu", "likely"), diagnosis
    assert summary(diagnosis).startswith("rank 0 waits on its GPU (cuStreamSynchronize at gpu_hang2.py:20) and no "
                                        "rank makes progress for ")
    # Stacks are taken every half threshold while it spins; the first that shows the wait is when
    # progress is known to have stopped, and the hang is named a threshold later.
    began = 1_800_000_000.0 + hung_at
    assert 0 <= diagnosis.since - began <= half + 0.5
    assert said.snapshot.time - diagnosis.since <= stall.DEFAULT_THRESHOLD + 1.0
    rank = said.snapshot.ranks[0]
    assert (rank.gpu_util, rank.gpu_memory_util, rank.state) == (100.0, 1.0, "gpu-wait")


def test_a_healthy_gpu_rank_on_one_python_line_is_never_a_hang(tmp_path):
    # The recorded healthy rank sat on one line (time.sleep) in three dumps a second apart.
    run = Run(tmp_path)
    run.receive({"type": "rank", "pid": 444, "rank": 0, "world_size": 1, "env": {}})
    dumps = [dump(H100 / f"healthy-pyspy-{i}.json") for i in (1, 2, 3)]
    healthy = lambda t: {"type": "sample", "t": t, "ranks": [{"pid": 444, "cpu": 52.8, "gpu": 0}],   # noqa: E731
                         "gpus": [{"index": 0, "util": 2.0, "memory_util": 1.0}]}
    run.run(120, healthy, lambda t: {444: dumps[int(t) % 3]})
    assert not run.said("diagnosis") and not run.said("incident")


def two_ranks(run):
    for pid, rank in ((100, 0), (101, 1)):
        run.receive({"type": "rank", "pid": pid, "rank": rank, "world_size": 2, "env": {}})


def test_a_rank_that_computes_for_ever_is_a_hang_after_the_bound_a_straggler_is_not(tmp_path):
    waiting = dump(ART / "pyspy" / "deadlock_rank0_all_reduce.json")
    looping = dump(ART / "pyspy" / "deadlock_rank1_left_loop.json")      # its own line: hang.py:11
    busy_rank_1 = lambda t: {"type": "sample", "t": t, "ranks": [{"pid": 100, "cpu": 0.0},   # noqa: E731
                                                                {"pid": 101, "cpu": 99.0}]}
    for seconds, endless in ((30, False), (50, True)):
        run = Run(tmp_path / str(seconds), notes={"h100": ("data-shards: 1 shard here, 4 on master",)})
        two_ranks(run)
        run.run(seconds, busy_rank_1, lambda t: {100: waiting, 101: looping})
        straggler = run.said("straggler")
        assert straggler and straggler[0].snapshot.diagnosis.culprits == [1]
        said = run.said("diagnosis")
        if not endless:
            assert not said, [e.text for e in said]           # a 30 s straggler arrives: never a hang
            continue
        [said] = said
        diagnosis = said.snapshot.diagnosis
        assert diagnosis.kind is Kind.ENDLESS and diagnosis.culprits == [1], diagnosis
        assert "rank 1 has computed for 4" in summary(diagnosis) and "at hang.py:11" in summary(diagnosis)
        assert "never reaches all_reduce, where rank 0 waits" in summary(diagnosis)
        assert "preflight said of h100: data-shards: 1 shard here, 4 on master" in summary(diagnosis)
        assert said.snapshot.time - diagnosis.since >= 5 * stall.DEFAULT_THRESHOLD    # the bound, not before


def test_the_rank_that_left_first_with_code_0_is_the_one_named(tmp_path):
    # Rank 1 leaves its loop and exits 0; its Gloo peer, rank 0, then fails ("Connection closed by peer").
    run = Run(tmp_path)
    two_ranks(run)
    run.run(3, lambda t: {"type": "sample", "t": t, "ranks": [{"pid": 100, "cpu": 90.0}, {"pid": 101, "cpu": 90.0}]})
    run.receive({"type": "exit", "pid": 101, "t": 1000.0, "code": 0})
    run.receive({"type": "exit", "pid": 100, "t": 1000.3, "code": 1 << 8})
    run.run(4, lambda t: {"type": "sample", "t": t, "ranks": [], "gone": [100, 101]})
    [said] = run.said("diagnosis")
    diagnosis = said.snapshot.diagnosis
    assert diagnosis.kind is Kind.EXITED and diagnosis.culprits == [1], diagnosis
    assert summary(diagnosis).startswith("rank 1 on h100 left first, while the others still ran (exit code 0); "
                                        "then rank 0 (exit code 1, +0.30 s)")


def test_ranks_on_their_gpus_name_the_one_behind_by_its_last_completed_collective():
    from ddp_preflight.hangwatch.model import Evidence
    # Four NCCL ranks wait on their GPUs; three saw collective #65 complete, rank 2 did not
    # (the recorded H100 dump's numbering: last enqueued 66, last completed 64).
    ranks = {r: Evidence("node", 100 + r, r, RankStatus.GPU_WAIT, op="cuStreamSynchronize", frame="train.py:20",
                         seq=66, seq_op="all_reduce", completed=64 if r == 2 else 65) for r in range(4)}
    found = diagnose(ranks)
    assert (found.kind, found.culprits, found.reason) == (Kind.GPU_HANG, (2,), "behind"), found
    # All at one place: all are named, waiting on their GPUs.
    same = {r: e.__class__(**{**e.__dict__, "completed": 65}) for r, e in ranks.items()}
    assert (diagnose(same).culprits, diagnose(same).reason) == ((0, 1, 2, 3), "waits-on-gpu")

