"""How a launch ended, per node and per rank, and the summary the CLI prints.

A rank's outcome is what its process really did (torchrun's worker exit, read on the node);
"why" is added from who stopped whom, as the launchers said it: ddp-preflight stops every node
when one fails or the user quits; torchrun stops a node's other ranks when one of them ends (the
launch program's "stopping" marker lists them). Which rank failed first, and why, is decided by
one rule (hangwatch/exits.py's judge, through ends.py) for a launched run, a watched one and
`explain`: the run's verdict is hangwatch's where it watched, the launcher's own otherwise, and
the rank of a node that torchrun stopped the others for is that rule's over the node's ends. The
headline renders the verdict."""

from __future__ import annotations

from dataclasses import replace

from ddp_preflight.hangwatch.exits import StoppedBy
from ddp_preflight.hangwatch.model import Basis, Kind
from ddp_preflight.hangwatch.text import headline
from ddp_preflight.node.protocol import ExitStatus
from ddp_preflight.node.terminal import shown, shown_data, shown_text

from .ends import first_on_node, judged, stopped_by_us
from .launched import LaunchedRank, LaunchResult, NodeRun, NodeState, Why

__all__ = ["LaunchResult", "LaunchedRank", "NodeState", "STOPPED_BY_US", "Why", "explain", "render", "stop_signal"]

STOPPED_BY_US = Why.STOPPED_BY_US.value


def stop_signal(rank: LaunchedRank) -> bool:
    """Ended by a signal someone sends to stop a process (SIGTERM, SIGINT, SIGHUP)."""
    return rank.status is not None and rank.status.stopped


def explain(ranks: list[LaunchedRank], node: NodeState) -> None:
    """Fill in `why` for one node's ranks once the node has ended."""
    failed = [r for r in ranks if r.ended and not r.ok and not stop_signal(r)]
    first = first_on_node(ranks, node) if failed else ()
    for r in ranks:
        if r.ended and r.ok:
            continue
        r.stopped_for, r.torchrun, r.node_error = (), None, None
        if stopped_by_us(r, node) and r.status is not None and r.status.signal is not None:
            r.why = Why.STOPPED_BY_US
        elif stop_signal(r) and (r.stopped_by == StoppedBy.TORCHRUN or failed):
            # The launch program saw torchrun begin to stop it; without its word (an older torch), a
            # rank of its node that failed is why torchrun stopped the others: the one that failed
            # first by the one rule (exits.judge), or the ones it cannot tell apart.
            r.why, r.stopped_for = Why.STOPPED_BY_TORCHRUN, tuple(first)
        elif r.ended and r.error is not None and r.error.lost_peer and r.error_after_stop:
            # It lost a peer that ddp-preflight's stop had ended (the nodes are stopped one by one):
            # the error came after the stop began, so it is the stop's victim, not a failure.
            r.why = Why.LOST_TO_OUR_STOP
        elif r.ended:
            r.why = None                   # it failed by itself
        elif not node.launched or (node.watched and r.pid is None):
            r.why = Why.NODE_FAILED if node.error else Why.STOPPED_BEFORE_START if node.stopped else Why.NOT_STARTED
        elif node.stopped:
            r.why = Why.TORCHRUN_KILLED
        else:
            r.why, r.node_error = Why.TORCHRUN_ENDED, node.error
            r.torchrun = ExitStatus(code=node.exit) if node.exit is not None else \
                ExitStatus(signal=node.signal) if node.signal is not None else None


def render(result: LaunchResult, port: int, master: str) -> str:
    """The end-of-run summary: a headline, one line per rank, node problems, where the logs are.
    What the ranks and nodes said (an exception's message, a function's name, a node's error) is
    shown, never obeyed: every string of the result goes through node/terminal.py first."""
    verdict = judged(result)          # its headline is rendered from the raw fields, then shown as one line
    result, master = shown_data(replace(result, verdict=None)), shown(master)
    lines = []
    told = None          # the node whose error the headline already says
    n = len(result.ranks)
    if result.ok:
        lines.append(f"training finished: all {n} ranks exited with code 0 ({result.seconds:.1f} s)")
    else:
        first_node = next((x for x in result.nodes if x.node == result.first_failure), None)
        stopped = "; every node was stopped" if result.stop_reason else ""
        if result.alone:
            lines.append(f"training failed: the {n} ranks exited with code 0, but none ever joined a process group: "
                         f"each imported torch, ran not one collective (its Flight Recorder) and was seen with no "
                         f"TCP connection to the store or a peer, so each trained alone (WORLD_SIZE {n}; "
                         f"init_process_group skipped?) ({result.seconds:.1f} s)")
        elif verdict is not None and verdict.named and verdict.kind is not Kind.EXITED and result.stop_reason:
            # Nothing failed on its own: the run was stopped (--stop-on-hang, Ctrl-C, a quit) while
            # the hang hangwatch named stood; that hang is the run's verdict.
            lines.append(f"training stopped ({result.stop_reason}): every node was stopped")
            lines.append(f"  the hang: {shown(headline(verdict))}")
        elif verdict is not None and (verdict.named or (verdict.basis is Basis.WORDS and verdict.nodes)):
            # The run's verdict: the ranks no other end explains (or the hang named), and why; or the
            # nodes whose launcher's own words named the failure (its store's port, its parser).
            lines.append(f"training failed: {shown(headline(verdict))}" + stopped)
        elif first_node is not None and first_node.error:
            lines.append(f"training failed on {first_node.node}: {first_node.error}"
                         + (f" (fix: {first_node.fix})" if first_node.fix else "") + stopped)
            told = first_node.node
        elif first_node is not None:
            lines.append(f"training failed: torchrun on {first_node.node} ended with "
                         f"{'exit code %s' % first_node.exit if first_node.exit is not None else 'signal %s' % first_node.signal}"
                         + stopped)
        elif result.stop_reason:
            lines.append(f"training stopped ({result.stop_reason}): every node was stopped")
        else:
            bad = [x for x in result.nodes if x.error] or [x for x in result.nodes if x.status != NodeRun.EXITED]
            lines.append(f"training failed on {', '.join(x.node for x in bad) or 'a node'}")
    lines += [f"  {note}" for note in result.notes]      # right under the headline: it may qualify it
    for node in result.nodes:
        if node.error and node.node != told:
            lines.append(f"  {node.node}: {node.error}" + (f" (fix: {node.fix})" if node.fix else ""))
    for r in result.ranks:
        lines.append(f"  rank {r.rank} on {r.node}: {r.outcome()}")
    if result.port_free is True:
        lines.append(f"  port {port} on {master} is free again")
    elif result.port_free is False:
        lines.append(f"  port {port} on {master} is still held: see `ddp-preflight {master} --only master-port`")
    if result.log_dir:
        lines.append(f"logs: {result.log_dir}" + (f" (incomplete: {result.logs_error})" if result.logs_error else ""))
    return shown_text("\n".join(lines) + "\n")
