"""Every input read once, in an order that lets each add to what the others said (a launch's plan
first: the ranks' nodes; torchrun's tables last: the exits the logs print), into one Gathered."""

from __future__ import annotations

from dataclasses import replace

from ddp_preflight.node.protocol import ExitStatus

from . import inputs, logs, records
from .seen import Gathered

ORDER = {inputs.InputKind.PLAN: 0, inputs.InputKind.LOG: 1, inputs.InputKind.LAUNCH_RESULT: 2,
         inputs.InputKind.ERROR_FILE: 3, inputs.InputKind.FLIGHT: 4, inputs.InputKind.BUNDLE: 5}


def gather(found: list[inputs.Input]) -> Gathered:
    gathered = Gathered()
    for item in sorted(found, key=lambda i: ORDER.get(i.kind, 9)):
        kind = item.kind
        if kind is inputs.InputKind.OTHER:
            gathered.skipped.append(f"{item.path}: {item.why}")
            continue
        gathered.read.append(item.path)
        if kind is inputs.InputKind.LOG:
            logs.read_log(gathered, item.path, limit=item.limit)
        elif kind is inputs.InputKind.ERROR_FILE:
            records.read_error_file(gathered, item.path)
        elif kind is inputs.InputKind.FLIGHT:
            records.read_flight(gathered, item.path)
        elif kind is inputs.InputKind.BUNDLE:
            records.read_bundle(gathered, item.path)
        else:
            records.read_launch(gathered, item.path, plan=kind is inputs.InputKind.PLAN)
    exits_from_tables(gathered)
    return gathered


def exits_from_tables(gathered: Gathered) -> None:
    """torchrun's tables: each failed rank's exit code or signal (torch's exitcode, negative for a
    signal, read into an ExitStatus here, once), and its global rank; a rank two tables say ended on another
    node, in another process or with another code is said twice (Gathered.twice)."""
    first: dict[int, tuple] = {}
    for node, table, quote in gathered.tables:
        for child in (*table.others, table):
            if child.rank is None:
                continue
            said = (child.host or node, child.pid, child.exitcode)
            seen = gathered.rank(node, child.rank, child.local_rank)
            known = (None, seen.pid, None if seen.exit is None else
                     -seen.exit.signal if seen.exit.signal is not None else seen.exit.code)
            if any(a is not None and b is not None and a != b for k in (first.get(child.rank, said), known)
                   for a, b in zip(said, k, strict=True)):
                gathered.twice.add(child.rank)    # a process ends once, on one node: two runs' (or attempts') ends
            first.setdefault(child.rank, said)
            if seen.pid is None:
                seen.pid = child.pid
            if seen.exit is None and child.exitcode is not None:
                seen.exit = ExitStatus.from_returncode(child.exitcode)
                seen.exit_quotes.append(replace(quote, text=f"rank {child.rank} (local_rank {child.local_rank}) on "
                                                            f"{child.host or node}: exitcode {child.exitcode}"
                                                            + (f" ({child.signal})" if child.signal else "")))
