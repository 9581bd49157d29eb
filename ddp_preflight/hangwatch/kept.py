"""Derived values kept until their input changes (issue 36): a stalled run's verdict is asked for on
every tick (4 Hz), and rebuilding every rank's evidence each time (its stack classified again, its
dashboard view redrawn) cost 67% of the watcher's CPU at 1,024 ranks and grew with the stall.

A rank's evidence (evidence.evidence_of) is a function of what the watcher holds of it and of its
node; what it holds changes only with an input the reducer takes: a message of the node's agent
(a sample, a stack, an exit), a rank's end from a launcher, the node lost. The reducer counts those
per node (`State.inputs`; a sample only where it moved what a rank's evidence reads: due.py), and
every node's at once for the inputs about all of them
(`State.inputs_all`: a launcher stopping, stacks asked, a node's status changed on a tick). The
evidence is kept under those counts, the node's status and the store's answer it was read with,
and rebuilt only when one of them moved."""

from __future__ import annotations

from .evidence import evidence_of, shown
from .model import Evidence
from .state import State, Track


def _process(t: Track) -> tuple:
    """Which process the track follows: its node, pid and start. Not its key (its rank number),
    which the ranks of another run on the node share (attach --pid of two runs: each has a rank 0)."""
    return (t.view.node, t.view.pid, t.start)


def evidence(state: State, t: Track, now: float, unformed: str | None = None) -> Evidence:
    """evidence_of(state, t, now, unformed), rebuilt only after an input about its node."""
    node = t.view.node
    key = (state.inputs_all, state.inputs.get(node, 0), state.nodes[node].status, unformed)
    held = state.kept.get((_process(t), unformed))
    if held is not None and held[0] == key:
        return held[1]
    found = evidence_of(state, t, now, unformed)
    state.kept[(_process(t), unformed)] = (key, found)
    return found


def show(state: State, t: Track, e: Evidence) -> None:
    """evidence.shown, only when what it shows from differs from the last time: the evidence (the
    same, or equal: rebuilt after a sample that changed nothing in it), the stack in hand, the
    node's status."""
    held = state.kept.get((_process(t), "shown"))
    status, v = state.nodes[t.view.node].status, t.view
    if held is not None and held[1] is t.dump and held[2] is status and (held[0] is e or held[0] == e) \
            and (v.state, v.op, v.frame, v.function) == (e.state, e.op, e.frame, e.function):
        return          # the view shows it still (a sample may have marked it running since: shown again)
    shown(state, t, e)
    state.kept[(_process(t), "shown")] = (e, t.dump, status)


def moved(state: State, node: str | None) -> None:
    """An input that can change the ranks of `node` (None: of every node) was taken."""
    if node is None or node not in state.nodes:
        state.inputs_all += 1
    else:
        state.inputs[node] = state.inputs.get(node, 0) + 1
