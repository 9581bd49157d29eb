"""What the failures' own words name (hangwatch/failures.py, the one catalogue): a launcher's
(torchrun's parser, its store's port, its rendezvous), then a rank's, decided by the one judge's
first step (hangwatch/named.py: the address family, a refused connection, NCCL, CUDA's memory,
what the backend does not implement, a collective's timeout; the live watcher uses it too), then
what only the files hold (the OOM killer's lines, NCCL's watchdog lines), and where the ranks'
Flight Recorders say one is behind. Each rule decides or passes; the fix is preflight's own (rules/)."""

from __future__ import annotations

from ddp_preflight.hangwatch import named
from ddp_preflight.hangwatch.model import Certainty, Kind, Reason

from .ended import context, ended, ending_of, from_named, judged, ooms_of
from .join import Joined, join
from .root import Root
from .seen import Gathered
from .watchdog_root import from_analyzer, from_watchdog_lines


def named_by_words(g: Gathered) -> Root | None:
    """The first root a failure's words name, in the order a run fails in: its launcher, then its ranks."""
    return said(g) or behind(g)


def said(g: Gathered) -> Root | None:
    """What the ranks' own exceptions name, by the one judge's first step (hangwatch/named.py, the
    live watcher's too); ranks the kernel's OOM killer ended (its dmesg lines: Ending.oom, as the live
    agent's OOM-kill count) go to the one judge of ends; then NCCL's watchdog lines; a collective's
    timeout yields to the Flight Recorders' word on who is behind."""
    launchers = [named.LauncherSaid(n.node, n.said) for n in g.nodes if n.said.failure in named.LAUNCHERS]
    endings = [ending_of(r, ooms_of(g)) for r in ended(g)]
    words = from_named(g, named.by_words(endings, context=context(g), launchers=launchers))
    if words is not None and words.reason not in (Reason.TIMED_OUT, Reason.BEHIND):
        return words
    if any(e.oom for e in endings):
        return judged(g)     # the kernel's OOM killer ended ranks: the one judge of ends reads them (exits.read)
    analyzed = from_analyzer(g)
    if analyzed is not None:
        return analyzed      # torch's Flight Recorder analyzer read every rank's dump: it says who the others waited for
    if _behind_ranks(g):
        return None
    watched = [r for r in g.ranks if r.watchdog is not None]
    if watched:
        alone = len({r.rank for r in g.ranks if r.rank is not None}) < 2
        return Root(Kind.NETWORK_STALL, Reason.TIMED_OUT, culprits=sorted(r.key for r in watched),
                    certainty=Certainty.LIKELY, quotes=[q for r in watched for q in r.watchdog_quotes[:2]],
                    unknown_why="only its output was read: the other ranks' logs or Flight Recorder dumps say "
                                "which rank is behind" if alone else None)
    return words


def _behind_ranks(g: Gathered) -> Joined | None:
    """The ranks the Flight Recorders say are behind; none in a watched launch a person stopped
    (Gathered.watched_no_hang: dumps kept while the ranks ran)."""
    if g.watched_no_hang:
        return None
    joined = join(g.ranks, g.world)
    return joined if joined is not None and joined.behind else None


def behind(g: Gathered) -> Root | None:
    joined = _behind_ranks(g)
    if joined is None:
        return None
    if not any(r.flight for r in g.ranks):
        return from_watchdog_lines(g)     # NCCL's watchdog lines alone: by process group, never a certain rank
    lines = [e.quote for e in joined.entered if e.rank in joined.behind] + \
        [e.quote for e in joined.entered if e.rank in joined.ahead][:3]
    return Root(Kind.DEADLOCK, Reason.BEHIND, culprits=list(joined.behind), quotes=lines, named_by_words=False)
