"""Which processes the watch follows, and which run each belongs to. Pure: functions of what the
agents said (each rank's user, store and world size; each agent's own user).

Anyone on a node can start a Python with RANK, WORLD_SIZE and MASTER_ADDR in its environment and
a name like torchrun's ranks; no one can start one as another user. So the evidence that a
process is a rank of a run is the run's own: its user, its store (MASTER_ADDR:MASTER_PORT) and
its world size.

- A run is one user's: ranks alive together with one store and one world size, run by one user
  (by name: the same account on every node, as ssh, srun and torchrun start them). A process of
  another user is never joined to a run, whatever rank, store and world it claims.
- The watch follows the ranks (and torchruns) of its own user on each node (the user its agent
  runs as), and of the users of its --pid processes. Another user's are followed only while none
  of those have been found: root, or a user who cannot read the ranks' environments, attaching to
  someone else's run, sees that run (each user's runs apart, a hang of any of them named as
  such). Once the watch's own are found, other users' processes are dropped, said once, and never
  followed again: they are not stacked, their stores are not read, and no verdict, bundle or
  --on-hang is about them. A launched run (its plan known) follows its own user's alone, from
  the start.
- Each run is judged alone (reducer.py): what one run's ranks do never names, hides or delays
  the verdict on another's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ddp_preflight.node import protocol

from .inputs import Effect
from .model import NodeStatus
from .state import State, Track, notice
from .who import Who

Found = Union[protocol.RankFound, protocol.LauncherFound]     # a rank, or a torchrun that starts ranks


def own(state: State, node: str, info: Found) -> bool:
    """A rank (or torchrun) of the watch's own users on its node: the agent's user, the user of a
    --pid; or of a user not known (an older agent's message: nothing to tell apart)."""
    if getattr(info, "given", False) or info.uid is None:
        return True
    hello = state.hello.get(node)
    if hello is not None and hello.uid == info.uid:
        return True
    return any(t.info is not None and t.info.given and t.info.uid == info.uid for t in state.tracks(node))


def followed(state: State, node: str, info: Found) -> bool:
    """Whether the watch follows this rank (or torchrun); another user's, when followed, marks the
    state so that they are dropped once the watch's own are found."""
    if own(state, node, info):
        return True
    if state.config.planned:          # a launched run: its ranks run as the user its agents run as
        return False
    if any(t.info is not None and own(state, t.view.node, t.info) for t in state.ranks.values()) or \
            any(own(state, launcher.node, launcher.info) for launcher in state.launchers.values()):
        return False
    state.others = True
    return True


def refuse(state: State, node: str, info: Found, out: list[Effect]) -> None:
    """A process of another user that claims a rank, not followed: said once per node and user."""
    notice(state, f"{node}: processes of user {info.user or '?'} claim ranks: not followed (this watch follows "
           "its own user's ranks); to watch that user's run, run hangwatch as that user or give one of its pids "
           "(--pid)", out)


def drop_others(state: State, node: str, out: list[Effect]) -> None:
    """The watch's own ranks are found: other users' processes followed until now are dropped."""
    if not state.others:
        return
    state.others = False
    others = [(key, t.view.node, t.info) for key, t in state.ranks.items()
              if t.info is not None and not own(state, t.view.node, t.info)]
    for key, where, info in others:
        del state.ranks[key]
        state.unindex()
        state.nodes[where].ranks = state.count(where)
        refuse(state, where, info, out)
    for key, launcher in list(state.launchers.items()):
        if not own(state, launcher.node, launcher.info):
            del state.launchers[key]
            refuse(state, launcher.node, launcher.info, out)


def run_of(state: State, node: str, info: protocol.RankFound) -> int:
    """The run a new rank (of `node`) belongs to: the run of a live rank with the same user, store
    (MASTER_ADDR:PORT) and world size; else a new one. Ranks of one run are alive together; a run
    whose ranks have all ended is over, and the next rank with the same store starts another."""
    store = (info.user, info.master, info.world_size)
    # The live track last seen of that run answers at once (finding 16,384 ranks walked them all for each).
    known = state.ranks.get(state.run_keys.get(store, ("", -1)))
    if known is not None and not known.ended and known.info is not None and \
            (known.info.user, known.info.master, known.view.world_size) == store:
        return known.run
    for key, t in state.ranks.items():
        if not t.ended and t.info is not None and t.info.master == info.master \
                and t.view.world_size == info.world_size and t.info.user == info.user:
            state.run_keys[store] = key
            return t.run
    state.runs += 1
    state.run_keys[store] = (node, info.pid)     # its first rank: the key it is about to be found under
    return state.runs


def quiet_runs(state: State) -> list[int]:
    """The runs with a live rank that makes no progress."""
    return sorted({t.run for t in state.live() if t.idle_since is not None})


def of_run(state: State, run: int) -> list[Track]:
    return [t for t in state.ranks.values() if t.run == run]


# -- the end of what the watch followed, and nothing to follow -------------------------------------

FIRST_SCANS = 3     # samples of every watched node with nothing found: nothing is there to watch (a
                    # process too young to have exec'd its program is looked at again at the next)


@dataclass(frozen=True)
class Over:
    """Every rank the watch followed has ended, its end judged, and every torchrun of theirs is
    gone or leaving: the run is over. Decided from the ranks' exits and the torchruns' children,
    never from a time without progress."""
    ranks: tuple[Who, ...]               # every rank followed, in order
    failed: tuple[Who, ...] = ()         # those that did not exit 0 (a signal, a code)
    unknown: tuple[Who, ...] = ()        # those whose exit no one read (their parent collected it first)
    alone: tuple[Who, ...] = ()          # ranks of a world of more than one that imported torch and never
                                         # held a TCP socket (never_connected): each trained alone

    @property
    def finished(self) -> bool:
        """Every rank exited 0, each in a process group when its world was more than itself: the
        run finished."""
        return not self.failed and not self.unknown and not self.alone


def over(state: State) -> Over | None:
    """The run the watch followed is over, or None while anything of it may still run: a live
    rank, a node whose ranks cannot be seen, an end not yet judged, a torchrun that has started no
    rank yet (it may still), or one that stays after its ranks failed (it may restart them). A
    torchrun whose ranks all exited 0 never restarts them: it is leaving (its exit barrier waits
    for the other nodes' torchruns)."""
    tracks = list(state.ranks.values())
    if not tracks or state.live() or state.exit_check_at is not None or state.lost:
        return None
    ok = all(t.exit_status is not None and t.exit_status.ok for t in tracks)
    for launcher in state.launchers.values():
        if not launcher.had_ranks or launcher.ranks > 0 or not ok:
            return None
    keys = sorted(t.key for t in tracks)
    return Over(tuple(keys), tuple(sorted(t.key for t in tracks if t.exit_status is not None
                                          and not t.exit_status.ok)),
                tuple(sorted(t.key for t in tracks if t.exit_status is None)),
                never_connected(state))


def ran_no_collective(state: State) -> tuple[Who, ...]:
    """The ranks never_connected whose own record of their end (PID.end, which --launch's bootstrap
    writes) says they ran not one collective (their Flight Recorder, kept after
    destroy_process_group): what a launch fails on. Connections are counted each second, and a
    short run's group can live between two counts; its record cannot miss it."""
    keys = set(never_connected(state))
    return tuple(sorted(t.key for t in state.ranks.values() if t.key in keys and isinstance(t.ending, dict)
                        and t.ending.get("collectives") == 0))


def never_connected(state: State) -> tuple[Who, ...]:
    """The ranks of a world of more than one that imported torch and never held a TCP socket
    (counted: none; a rank without one is counted every sample, so one it opened later shows): no
    process group, each trained alone. Launch and attach judge a run's end by this one rule."""
    return tuple(sorted(t.key for t in state.ranks.values() if (t.view.world_size or 0) > 1 and t.torch
                        and not t.talked and t.alone_since is not None and not t.endpoints))


def none_found(state: State) -> tuple[str, ...]:
    """The watched nodes, when their agents have scanned FIRST_SCANS times and found nothing to
    follow: no rank (a process with RANK and WORLD_SIZE, or a --pid), no torchrun. Empty while
    something was found, or a node has not scanned that often yet."""
    if state.found_any:
        return ()
    watched = [name for name, n in state.nodes.items() if n.status is NodeStatus.WATCHING]
    if not watched or any(state.samples.get(name, 0) < FIRST_SCANS for name in watched):
        return ()
    return tuple(watched)
