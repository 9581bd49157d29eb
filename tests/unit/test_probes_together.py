"""The probes that need torch share one job (preflight/probes/together.py): which parts one job
carries, when the shared job holds a part's answer, and that it starts once, when every probe has
asked or declined, and nothing later rides on it."""

from __future__ import annotations

import threading

from ddp_preflight.node import protocol
from ddp_preflight.preflight.probes.together import Part, Together, fitting, printed, shared_job
from ddp_preflight.transport import JobResult

COMPUTE = Part((0, 1), (1, 1), timeout=30.0,
               specs=({"program": "compute", "threads": 1}, {"program": "compute", "threads": None}))
COLLECTIVES = Part((0, 1), (2, 2), ("--backend", "gloo"), 60.0, {"PET_RDZV_CONF": "timeout=15"})
BANDWIDTH = Part((0, 1), (1, 1), ("--backend", "gloo"), 60.0)


def result(node: str, *lines: tuple[str, dict]) -> JobResult:
    return JobResult(node, exit=0, marked=[protocol.line(marker, data) for marker, data in lines])


def test_one_job_carries_all_three_with_bandwidth_on_one_rank_per_node():
    assert fitting({"compute": COMPUTE, "collectives": COLLECTIVES, "bandwidth": BANDWIDTH}) == \
        ["compute", "collectives", "bandwidth"]


def test_parts_that_do_not_fit_are_left_to_their_own_jobs():
    three_per_node = Part((0, 1), (3, 3), ("--backend", "gloo"))
    assert fitting({"collectives": COLLECTIVES, "bandwidth": three_per_node}) == ["collectives"]
    other_nodes = Part((0,), (1,), specs=({"program": "compute"},))
    assert fitting({"compute": other_nodes, "bandwidth": BANDWIDTH}) == ["bandwidth"]
    no_spec = Part((0, 1), (1, 1), specs=({"program": "compute"}, None))
    assert fitting({"compute": no_spec, "collectives": COLLECTIVES}) == ["collectives"]
    assert fitting({"compute": COMPUTE}) == []     # compute alone is its own torch program


def test_nodes_with_their_own_counts_each_start_as_many_ranks_as_training_will_there():
    # A hostfile of master slots=1, worker1 slots=3: the job runs 1 + 3 ranks, not 1 + 1 (the
    # fewest any node has), and bandwidth rides on it with one rank per node.
    uneven = Part((0, 1), (1, 3), ("--backend", "gloo"), 60.0)
    asked = {"compute": COMPUTE, "collectives": uneven, "bandwidth": BANDWIDTH}
    assert fitting(asked) == ["compute", "collectives", "bandwidth"]
    job = shared_job(asked, fitting(asked))
    assert job is not None and job.counts == (1, 3) and job.args[-1] == "--bandwidth-per-node", job
    # Bandwidth asking for the collectives' own counts runs on every rank, as they do.
    same = shared_job({"collectives": uneven, "bandwidth": uneven}, ["collectives", "bandwidth"])
    assert same is not None and same.counts == (1, 3) and "--bandwidth-per-node" not in same.args
    # Another uneven shape is its own job.
    assert fitting({"collectives": uneven, "bandwidth": Part((0, 1), (2, 1), ("--backend", "gloo"))}) == \
        ["collectives"]
    assert shared_job({"compute": COMPUTE}, []) is None


def test_a_part_that_printed_nothing_runs_its_own_job():
    done = [result("master", (protocol.COMPUTE, {"gflops": 1.0}), (protocol.COLLECTIVES, {"event": "init"})),
            result("worker1", (protocol.COLLECTIVES, {"event": "init"}))]
    assert printed(done, "collectives") is True          # a group that did not form is their finding
    assert printed(done, "bandwidth") is False           # the collectives broke the group first
    assert printed(done, "compute") is False             # worker1 has no figure
    done.append(result("worker2", (protocol.INTERFERED, {"key": "k", "by": "torchrun"})))
    assert printed(done, "bandwidth") is True            # a stranger's value: every part says so


class Counted(Together):
    """The real coordination, with the job itself recorded instead of started on a cluster."""
    def __init__(self, members):
        super().__init__(None, (), None, members)
        self.started: list[dict] = []

    def _shared(self, asked):
        self.started.append(dict(asked))
        return {member: [result(member)] for member in asked}


def test_the_shared_job_starts_once_after_every_probe_asked_or_declined():
    together = Counted(["compute", "collectives", "bandwidth"])
    got: dict = {}

    def ask(member, part):
        got[member] = together.run(member, part)
    asking = [threading.Thread(target=ask, args=m) for m in (("compute", COMPUTE), ("bandwidth", BANDWIDTH))]
    for thread in asking:
        thread.start()
    for thread in asking:
        thread.join(0.3)
    assert together.started == [] and all(t.is_alive() for t in asking)     # collectives not heard yet
    together.done("collectives")                                            # it skipped
    for thread in asking:
        thread.join(5)
    assert together.started == [{"compute": COMPUTE, "bandwidth": BANDWIDTH}]
    assert {m: [r.node for r in rs] for m, rs in got.items()} == {"compute": ["compute"], "bandwidth": ["bandwidth"]}
    assert together.run("collectives", COLLECTIVES) is None      # too late: its own job
    assert len(together.started) == 1
