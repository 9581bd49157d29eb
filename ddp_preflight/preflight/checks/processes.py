"""master-port, stale-processes, ptrace: what is already running, and whether hangwatch can look."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ddp_preflight.rules.facts import Missing, Process
from ddp_preflight.rules.fix import Fix, change, run
from ddp_preflight.rules.ports import who_holds

from ..model import Context, NodeFacts, Status, Verdict
from .common import describe_process

DEFAULT_MASTER_PORT = 29500     # torchrun's


def check_master_port(ctx: Context) -> Iterator[Verdict]:
    master, port = ctx.master, ctx.options.master_port
    if master.error:
        yield Verdict(Status.SKIP, master.node, f"not checked: the master was not reached ({master.error})")
        return
    facts = master.parsed.master_port
    if isinstance(facts, Missing):
        yield Verdict(Status.ERROR, master.node, f"{master.node}: {facts.reason}")
        return
    training = _training_pids(master)
    holders = facts.holders
    details = {"port": port, "holders": [{**h.to_json(), "training": None if training is None else h.pid in training}
                                         for h in holders]}
    if not facts.listening:
        yield Verdict(Status.PASS, master.node, f"port {port} is free on {master.node}", None, details)
        return
    if not holders:
        yield Verdict(Status.FAIL, master.node,
                      f"port {port} on {master.node} is held by a process of another user",
                      who_holds(master.node, port),
                      details)
    elif training is not None and all(h.pid in training for h in holders) and _others(master, holders):
        # Another user's run on the port: not this user's to stop; the run needs another port.
        others = _others(master, holders)
        other = DEFAULT_MASTER_PORT if port != DEFAULT_MASTER_PORT else DEFAULT_MASTER_PORT + 1
        yield Verdict(Status.FAIL, master.node,
                      f"port {port} on {master.node} is held by " + "; ".join(map(_described, holders))
                      + ": rendezvous fails with EADDRINUSE",
                      change(f"--master-port {other}", note=f"another port for the run; {port} is held by "
                             f"{_whose(others)}: ask {_users(others)}, it is not yours to stop"), details)
    elif training is not None and all(h.pid in training for h in holders):
        yield Verdict(Status.FAIL, master.node,
                      f"port {port} on {master.node} is held by " + "; ".join(map(describe_process, holders))
                      + ": rendezvous fails with EADDRINUSE",
                      kill_training(master.node, holders, holds_port=True), details)
    else:
        others = [h for h in holders if training is None or h.pid not in training]
        yield _held_by_another_program(master.node, port, others, training is not None, details)


def _training_pids(master: NodeFacts) -> set[int] | None:
    """The processes the master's scan took for training (torchrun, a rank, a training
    script); None when the scan failed, so nothing can be called a leftover."""
    processes = master.parsed.processes
    return None if isinstance(processes, Missing) else {p.pid for p in processes}


def _held_by_another_program(node: str, port: int, holders: list[Process], known: bool, details: dict) -> Verdict:
    """The port belongs to something that is not training (sshd on 22, a database): not debris
    to kill, the run needs another port. Without the process scan, nothing is called either."""
    named = "; ".join(describe_process(h, orphan=False) for h in holders)
    what = ", which is not a training process" if known else " (the process scan failed: training or not is unknown)"
    program = _program(list(holders[0].cmdline))
    low = "; ports below 1024 also need root to bind" if port < 1024 else ""
    other = DEFAULT_MASTER_PORT if port != DEFAULT_MASTER_PORT else DEFAULT_MASTER_PORT + 1
    return Verdict(Status.FAIL, node,
                   f"port {port} on {node} is held by {named}{what}: rendezvous fails with EADDRINUSE{low}",
                   change(f"--master-port {other}", note=f"another port for the run; {port} is {program}'s"
                          + (", leave it running" if known else "")), details)


def _program(argv: list[str]) -> str:
    """The program's name: 'sshd' for sshd's retitled 'sshd: /usr/sbin/sshd -D [listener] ...'."""
    return argv[0].split()[0].rsplit("/", 1)[-1].rstrip(":") if argv and argv[0].strip() else "another program"


def _scanner(node: NodeFacts) -> int | None:
    """The user the node's facts were collected as (the training's user there); None: not said."""
    ptrace = node.parsed.ptrace
    return None if isinstance(ptrace, Missing) else ptrace.euid


def _others(node: NodeFacts, processes) -> list[Process]:
    """The processes of another user than the one the facts were collected as: never this run's
    to stop (a recording without owners: none)."""
    me = _scanner(node)
    return [p for p in processes if me is not None and p.uid is not None and p.uid != me]


def _described(p: Process) -> str:
    """describe_process, with its owner when it is known."""
    return describe_process(p) + (f" of {p.owner()}" if p.uid is not None else "")


def _users(processes) -> str:
    return " and ".join(dict.fromkeys(p.owner() for p in processes))


def _whose(processes) -> str:
    return "; ".join(f"{p.owner()}'s PID {p.pid}" for p in processes)


def _listed(processes) -> str:
    return "; ".join(_described(p) for p in processes[:4]) + (
        f"; and {len(processes) - 4} more" if len(processes) > 4 else "")


def check_stale_processes(ctx: Context) -> Iterator[Verdict]:
    for node in ctx.reachable:
        found = node.parsed.processes
        if isinstance(found, Missing):
            yield Verdict(Status.ERROR, node.node, f"{node.node}: {found.reason}")
            continue
        if not found:
            yield Verdict(Status.PASS, node.node, "no leftover training processes")
            continue
        details = {"processes": [p.to_json() for p in found]}
        probing = [p for p in found if p.job is not None and p.node_program is not None]
        probing_said = _probing(probing, node.node) if probing else ""
        also_probing = f"; {probing_said}" if probing else ""
        found = tuple(p for p in found if p not in probing)
        if not found:
            # Another ddp-preflight's probe job, running now: it ends by itself within its bound,
            # and its ranks are never this run's to stop (nor a run at all).
            yield Verdict(Status.WARN, node.node, probing_said,
                          change(f"wait for that run's {probing[0].job} to end, then run preflight again: two "
                                 f"preflights at once share {node.node}'s CPUs and ports, and each one's figures"),
                          details)
            continue
        others = _others(node, found)
        own = [p for p in found if p not in others]
        if not own:
            # Another user's run (or a process that shows torch and a rank): named with its owner,
            # never failed on and never killed from here; its user is the one to ask.
            yield Verdict(Status.WARN, node.node,
                          f"{len(others)} training process{'es' if len(others) > 1 else ''} of another user on "
                          f"{node.node}: {_listed(others)}: not this user's to stop{also_probing}",
                          change(f"ask {_users(others)} whether {'they are' if len(others) > 1 else 'it is'} a "
                                 f"run of theirs on {node.node}; it shares the node's CPUs, GPUs and ports with yours"),
                          details)
            continue
        orphans = [p for p in own if p.orphan]
        also = (f"; of other users: {_listed(others)}" if others else "") + also_probing
        yield Verdict(Status.FAIL if orphans else Status.WARN, node.node,
                      f"{len(own)} training process{'es' if len(own) > 1 else ''} already on {node.node}"
                      f"{f' ({len(orphans)} orphaned)' if orphans else ''}: {_listed(own)}{also}",
                      kill_training(node.node, own,
                                    holds_port=node is ctx.master and _hold_the_port(ctx, own),
                                    others=f"{_whose(others)} are not yours: ask {_users(others)}" if others else ""),
                      details)


def _probing(processes: list[Process], node: str) -> str:
    """What another ddp-preflight's running probe job is, in words: its ranks and who runs it."""
    programs = sorted({p.node_program for p in processes if p.node_program is not None})
    users = sorted({p.owner() for p in processes if p.uid is not None})
    return (f"another ddp-preflight run's {processes[0].job} job is running on {node} now "
            f"({len(processes)} rank{'s' if len(processes) > 1 else ''}: "
            f"PID {', '.join(str(p.pid) for p in processes[:4])}{', ...' if len(processes) > 4 else ''}; "
            f"its node program PID {', '.join(map(str, programs))}{' of ' + ', '.join(users) if users else ''}): "
            "not a leftover, it ends by itself")


def kill_training(node: str, processes: Sequence[Process], *, holds_port: bool, others: str = "") -> Fix:
    """The one fix for training processes left on a node: master-port and stale-processes offer the
    same line when the leftovers are the port's holders, so the report says it once. It says whose
    they are (the user who runs preflight there: a kill is theirs to give). `others`: what to say
    of other users' processes there (never killed from here)."""
    pids = " ".join(str(p.pid) for p in processes)
    whose = f" (owned by {_users(processes)})" if all(p.uid is not None for p in processes) else ""
    return run(f"kill {pids}", node, f"on {node}{whose}, if they are not a run you want"
               + ("; or choose another port with --master-port" if holds_port else "")
               + (f"; {others}" if others else ""))


def _hold_the_port(ctx: Context, found: Sequence[Process]) -> bool:
    """The master's leftovers are exactly the master port's holders (master-port names them too)."""
    facts = ctx.master.parsed.master_port
    return not isinstance(facts, Missing) and facts.listening and \
        {h.pid for h in facts.holders} == {p.pid for p in found}


PTRACE_FIX = {
    1: run("sudo sysctl kernel.yama.ptrace_scope=0", note="or run hangwatch with sudo"),
    2: change("run hangwatch with sudo (ptrace_scope=2 allows only CAP_SYS_PTRACE)"),
    3: change("ptrace_scope=3 forbids ptrace until reboot: set kernel.yama.ptrace_scope=1 in /etc/sysctl.d and reboot"),
}


def check_ptrace(ctx: Context) -> Iterator[Verdict]:
    for node in ctx.reachable:
        facts = node.parsed.ptrace
        if isinstance(facts, Missing):
            yield Verdict(Status.ERROR, node.node, f"{node.node}: {facts.reason}")
            continue
        scope = facts.ptrace_scope
        privileged = facts.euid == 0 or facts.cap_sys_ptrace
        details = facts.to_json()
        if privileged and scope != 3:
            yield Verdict(Status.PASS, node.node, "hangwatch can read stacks (root or CAP_SYS_PTRACE)", None, details)
        elif scope in (None, 0):
            yield Verdict(Status.PASS, node.node,
                          "hangwatch can read stacks of this user's processes"
                          + (" (no Yama ptrace restriction)" if scope is None else " (ptrace_scope=0)"), None, details)
        else:
            yield Verdict(Status.WARN, node.node,
                          f"ptrace_scope={scope} on {node.node}: hangwatch cannot read the ranks' stacks, "
                          "only their CPU and state", PTRACE_FIX.get(scope), details)
