"""Which of preflight's findings on a node are a clue to a verdict on its ranks: a check's finding
goes beside a verdict only where it can cause that verdict's reason (uneven data shards beside a
rank that left its loop; a stale process beside a busy master port), never every warning of the
node (a stale-processes warning beside a rank that raised invites blaming the wrong thing). Pure
data and one function, for the pipeline (diagnose.py) and the ends (ended.py) alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .model import Diagnosis, NodeNote, Reason, Who

R = Reason
UNEVEN = (R.LEFT_FIRST, R.LEAVING, R.LEFT_LOOP, R.BEHIND, R.DIFFERENT_COLLECTIVE, R.SKIPPED_GROUP, R.SIZE_MISMATCH,
          R.WAITS_FOR_DATA, R.COMPUTES_FOREVER, R.STRAGGLING)
# preflight's check id -> the reasons its finding can cause
CAUSES: dict[str, tuple[Reason, ...]] = {
    "data-shards": UNEVEN,
    "code-parity": (R.DIFFERENT_COLLECTIVE, R.SIZE_MISMATCH, R.SKIPPED_GROUP, R.BEHIND, R.UNSUPPORTED),
    "torch-parity": (R.DIFFERENT_COLLECTIVE, R.SIZE_MISMATCH, R.UNSUPPORTED, R.NCCL_ERROR),
    "python-parity": (R.RAISED,),
    "compute-balance": (R.STRAGGLING, R.COMPUTES_FOREVER),
    "omp-threads": (R.STRAGGLING, R.COMPUTES_FOREVER),
    "address-family": (R.ADDRESS_FAMILY, R.CANNOT_CONNECT),
    "interface-choice": (R.ADDRESS_FAMILY, R.CANNOT_CONNECT, R.LINK, R.TIMED_OUT),
    "ephemeral-ports": (R.CANNOT_CONNECT, R.LOST_PEER),
    "path-mtu": (R.LINK, R.TIMED_OUT, R.LOST_PEER, R.CANNOT_CONNECT),
    "bandwidth": (R.LINK, R.TIMED_OUT),
    "master-port": (R.PORT_IN_USE, R.CANNOT_REACH_STORE, R.NEVER_CHECKED_IN),
    "master-reachable": (R.CANNOT_REACH_STORE, R.NEVER_CHECKED_IN),
    "stale-processes": (R.PORT_IN_USE, R.NEVER_CHECKED_IN, R.OUT_OF_MEMORY, R.OOM_KILLED),
    "launch-args": (R.SCRIPT_OPTIONS,),
    "collectives": (R.UNSUPPORTED,),
    "gpu-memory-held": (R.OUT_OF_MEMORY,),
    "gpu-visible": (R.NCCL_ERROR,),
    "ranks-per-node": (R.NCCL_ERROR, R.OUT_OF_MEMORY, R.OOM_KILLED),
    "nccl-parity": (R.NCCL_ERROR,),
    "nccl-env": (R.NCCL_ERROR, R.LINK, R.TIMED_OUT),
    "gpu-health": (R.WAITS_ON_GPU, R.NCCL_ERROR, R.KILLED),
    "slurm-time-left": (R.KILLED, R.TERMINATED),
}


def of_verdict(notes: Mapping[str, Iterable[NodeNote | str]], d: Diagnosis, node_of: Mapping[Who, str]) \
        -> tuple[NodeNote, ...]:
    """What preflight said that bears on this verdict: of the nodes of the ranks it names, or of the
    nodes it names itself (a busy master port, a launcher's parser), and that can cause its reason."""
    nodes = [node_of[k] for k in d.named if k in node_of] + list(d.nodes)
    return related(notes, nodes, d.reason)


def related(notes: Mapping[str, Iterable[NodeNote | str]], nodes: Iterable[str], reason: Reason | None) \
        -> tuple[NodeNote, ...]:
    """What preflight said of these nodes that can cause `reason`. A finding given as its words
    ("data-shards: 1 shard here, 4 on worker1") is read by the check its words begin with; words
    that name no check are no clue: nothing says they bear on the verdict."""
    out = []
    for node in dict.fromkeys(nodes):
        for note in notes.get(node, ()):
            if isinstance(note, str):
                check, _, said = note.partition(": ")
                note = NodeNote(node, said, check) if check in CAUSES else NodeNote(node, note, None)
            if note.check is not None and reason is not None and reason in CAUSES.get(note.check, ()):
                out.append(NodeNote(node, note.said, note.check))
    return tuple(out)
