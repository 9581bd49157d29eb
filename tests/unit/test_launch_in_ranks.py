"""launch/in_ranks.py on the recorded lab facts: which shared probe jobs the training's ranks can
carry (else the probe runs its own job: never a lost probe, never a wrong figure), and how the
gate reads the nodes' torchrun lines into each node's probe result."""

from __future__ import annotations

import json

from ddp_preflight.launch.in_ranks import Gate, InRanks, carries
from ddp_preflight.launch.run import Launch
from ddp_preflight.node import protocol
from ddp_preflight.preflight.model import Options
from ddp_preflight.preflight.probes.together import Part, fitting, shared_job

from .facts_fixtures import clean, context
from .test_launch_plan import plan_for

SPEC = {"program": "compute", "seconds": 0.5}


def job_for(collectives=(2, 2), bandwidth=(1, 1), compute=({**SPEC, "threads": 1}, {**SPEC, "threads": 1}), nodes=(0, 1)):
    """The shared job together.py builds from the parts the probes ask for."""
    asked = {"collectives": Part(nodes, collectives, ("--backend", "gloo")),
             "bandwidth": Part(nodes, bandwidth, ("--backend", "gloo"))}
    if compute is not None:
        asked["compute"] = Part(nodes, (1,) * len(nodes), specs=compute)
    job = shared_job(asked, fitting(asked))
    assert job is not None
    return job


def test_the_training_ranks_carry_the_job_that_starts_as_many_ranks_on_every_node_in_order():
    plan = plan_for(nproc_per_node=2)
    nodes = context(clean()).nodes
    assert carries(plan, job_for(), [0, 1], nodes)
    # A hostfile's slots: as many ranks as training starts on each node.
    uneven = plan_for(nproc_per_node=2, nprocs={"master": 2, "worker1": 1})
    assert carries(uneven, job_for(collectives=(2, 1)), [0, 1], nodes)


def test_a_job_the_ranks_cannot_run_as_its_own_run_would_runs_on_its_own():
    plan = plan_for(nproc_per_node=2)
    nodes = context(clean()).nodes
    # Another count of ranks than training's on a node.
    assert not carries(plan, job_for(collectives=(1, 1), bandwidth=(1, 1)), [0, 1], nodes)
    assert not carries(plan, job_for(collectives=(4, 4), bandwidth=(4, 4)), [0, 1], nodes)
    # Compute at torch's own thread count: a rank whose torch started with the training's
    # OMP_NUM_THREADS cannot measure it; a GPU benchmark is not run inside the training either.
    assert not carries(plan, job_for(compute=({**SPEC, "threads": None}, {**SPEC, "threads": 1})), [0, 1], nodes)
    gpu = {"program": "compute", "seconds": 0.5, "device": "cuda", "gpus": 2}
    assert not carries(plan, job_for(compute=(gpu, gpu)), [0, 1], nodes)
    # Not every node, or not in the plan's order.
    assert not carries(plan, job_for(collectives=(2,), bandwidth=(1,), compute=None, nodes=(0,)), [0], nodes)
    assert not carries(plan, job_for(), [1, 0], nodes)
    # Without compute, the rest is carried.
    assert carries(plan, job_for(compute=None), [0, 1], nodes)


def test_only_the_first_shared_job_is_asked_of_the_ranks():
    built = []
    in_ranks = InRanks(None, lambda nodes, options: built.append(nodes))
    assert in_ranks(job_for(), [0, 1], (), Options()) is None      # no plan: the job's own run
    assert in_ranks(job_for(), [0, 1], (), Options()) is None      # a second job: its own run, unasked
    assert len(built) == 1
    # NCCL: never in the ranks (torch's own pipe would give hangwatch the probes' collectives).
    nccl = InRanks(None, lambda nodes, options: built.append(nodes))
    assert nccl(job_for(), [0, 1], (), Options(backend="nccl", device="cuda")) is None and len(built) == 1


def line(local: int, marker: str, data: dict) -> str:
    return f"[default{local}]:{marker}{json.dumps(data)}"


def test_the_gate_keeps_each_nodes_probe_lines_and_holds_the_rest_until_the_word():
    plan = plan_for(nproc_per_node=2)
    master, worker = plan.nodes
    launch = Launch(None, plan, None)
    gate = Gate(launch)
    case = {"event": "case", "rank": 0, "i": 0, "op": "all_reduce", "status": "ok"}
    said = [(master, line(0, protocol.COLLECTIVES, case)),
            (master, "[default1]:a warning of rank 1"),
            (master, "[W socket.cpp:207] torchrun's own line"),
            # A GATE line under a prefix no rank of this node has: not a rank of its plan.
            (master, line(5, protocol.GATE, {"rank": 5, "local_rank": 5, "pid": 9, "error": None})),
            (master, line(0, protocol.GATE, {"rank": 0, "local_rank": 0, "pid": 100, "error": None})),
            (master, line(1, protocol.GATE, {"rank": 1, "local_rank": 1, "pid": 101, "error": None})),
            (worker, line(0, protocol.BANDWIDTH, {"world_size": 2})),
            (worker, line(0, protocol.GATE, {"rank": 2, "local_rank": 0, "pid": 200, "error": None}))]
    for node, raw in said:
        assert gate.held(node, raw)
    assert gate.waiting == {3} and not gate.reached(0)
    assert gate.held(worker, line(1, protocol.GATE, {"rank": 3, "local_rank": 1, "pid": 201, "error": "OSError: x"}))
    assert not gate.reached(0) and gate.errors == {3: "OSError: x"}      # a part that raised: its own job
    results = {r.node: r for r in gate.results()}
    assert [c["i"] for c in results["master"].json_lines(protocol.COLLECTIVES)] == [0]
    assert results["worker1"].json_lines(protocol.BANDWIDTH) == [{"world_size": 2}]
    assert results["master"].json_lines(protocol.BANDWIDTH) == [] and results["master"].exit == 0
    assert 0 <= results["master"].seconds <= results["worker1"].seconds      # until each node's last GATE
    assert [raw for _, raw in gate.later] == [said[1][1], said[2][1], said[3][1]]
    assert gate.pids == {0: 100, 1: 101, 2: 200, 3: 201}
