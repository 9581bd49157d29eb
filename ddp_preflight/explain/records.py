"""The documents a run leaves beside its logs: torchelastic's error files, Flight Recorder dumps,
hangwatch's incident bundles, ddp-preflight --launch's plan.json and result.json. Each is read
once (bounded: inputs.py), into what each rank said: a regular file of at most inputs.JSON_LIMIT
bytes (node/bounded.py), whatever it became since inputs.py looked at it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddp_preflight.hangwatch import failures
from ddp_preflight.hangwatch.exit_json import exit_from_json
from ddp_preflight.hangwatch.exits import StoppedBy, stop_of
from ddp_preflight.hangwatch.model import HANGS, Diagnosis
from ddp_preflight.hangwatch.tracebacks import exception_in
from ddp_preflight.hangwatch.words import who
from ddp_preflight.node.bounded import Skipped, read_regular
from ddp_preflight.node.flight import Refused, plain_data
from ddp_preflight.node.protocol import ExitStatus

from .inputs import JSON_LIMIT
from .seen import Gathered, NodeError, Quote

RANK_IN_NAME = re.compile(r"(?:rank[-_]?|nccl-dump-|nccl_trace_rank_|frdump_)(?P<rank>\d+)")
LOCAL_IN_PATH = re.compile(r"attempt_\d+/(?P<local>\d+)/error\.json$")


def read_error_file(gathered: Gathered, path: str) -> None:
    """torchelastic's error file: {"message": {"message": "RuntimeError: ...", "extraInfo":
    {"py_callstack": the traceback, "timestamp": "..."}}} (torch.distributed.elastic's
    ErrorHandler; ddp-preflight --launch keeps one per rank: errors/rank-N.json)."""
    data = _load(path)
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, dict):
        return
    extra = message.get("extraInfo") or {}
    callstack = str(extra.get("py_callstack") or "")
    lines = callstack.splitlines() or [str(message.get("message") or "")]
    info = exception_in(lines)
    if info is None:
        return
    rank = data.get("rank") if isinstance(data.get("rank"), int) else _rank_in(path)
    local = LOCAL_IN_PATH.search(path.replace("\\", "/"))
    node = data.get("node") if isinstance(data.get("node"), str) else None
    seen = gathered.rank(node, rank, int(local["local"]) if local else None)
    if seen.exception is None or seen.source != "output" or not seen.exception.message:
        seen.exception, seen.source = info, "record"
        seen.said = failures.said_by(info.type, info.message)
        seen.quotes = [Quote(path, None, q) for q in info.quote]


def read_flight(gathered: Gathered, path: str) -> None:
    """A Flight Recorder dump: torch's JSON (Gloo: rank_bootstrap.py's answer), its pickle (NCCL's
    dump on timeout or on request), or the launcher's kept one ({"rank", "node", "flight"})."""
    rank, node = _rank_in(path), None
    try:
        raw = read_regular(path, JSON_LIMIT)
    except Skipped as exc:
        gathered.skipped.append(f"{path}: {exc}")
        return
    except OSError:
        gathered.skipped.append(f"{path}: not a readable Flight Recorder dump")
        return
    try:
        if raw[:1] == b"\x80":
            data = plain_data(raw)
        else:
            data = json.loads(raw)
    except (OSError, ValueError, Refused, Exception):     # a cut or foreign dump is not the run's evidence
        gathered.skipped.append(f"{path}: not a readable Flight Recorder dump")
        return
    if isinstance(data, dict) and isinstance(data.get("flight"), dict):
        rank = data.get("rank") if isinstance(data.get("rank"), int) else rank
        node = data.get("node") if isinstance(data.get("node"), str) else None
        data = data["flight"]
    entries = data.get("entries", [] if "pg_status" in data else None) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return                    # no entries and no status: not a dump (a rank that ran no collective has its status)
    if rank is None:
        rank = _rank_of_dump(data)
    if rank is None and not entries:
        return                    # an empty recorder of a rank nothing names says nothing
    seen = gathered.rank(node, rank)
    seen.flight = {"entries": entries, "path": path, "pg_status": data.get("pg_status")}


def _rank_of_dump(data: dict) -> int | None:
    config = data.get("pg_config") or {}
    for group in config.values() if isinstance(config, dict) else ():
        ranks = group.get("ranks") if isinstance(group, dict) else None
        if isinstance(ranks, str) and ranks.strip("[]").isdigit():
            return int(ranks.strip("[]"))        # a world of one
    return None


def read_bundle(gathered: Gathered, path: str) -> None:
    """hangwatch's incident.json: each rank's evidence as the live watcher saw it."""
    data = _load(path)
    snapshot = data.get("snapshot") if isinstance(data, dict) else None
    diagnosis = snapshot.get("diagnosis") if isinstance(snapshot, dict) else None
    kind = diagnosis.get("kind") if isinstance(diagnosis, dict) else None
    if kind in {k.value for k in HANGS}:
        gathered.hang_bundled = True
    for e in (diagnosis or {}).get("evidence") or []:
        if not isinstance(e, dict):
            continue
        seen = gathered.rank(e.get("node"), e.get("rank"))
        if isinstance(e.get("frame"), str) and seen.frame is None:
            seen.frame = e["frame"]
        status = exit_from_json(e.get("exit"))
        if status is not None and seen.exit is None:
            seen.exit = status
            seen.exit_quotes.append(Quote(path, None, f"rank {e.get('rank')}: {status}"))
        if isinstance(e.get("seq"), int) and seen.flight is None:
            seen.flight = {"entries": [], "summary": {"seq": e["seq"], "op": e.get("seq_op"),
                                                      "completed": e.get("completed")}, "path": path,
                           "frame": e.get("frame")}


def read_launch(gathered: Gathered, path: str, plan: bool) -> None:
    """A launch's plan.json (the world, its nodes in order) or result.json: how each rank ended, who
    stopped it, and hangwatch's verdict on the run as the launch saved it."""
    data = _load(path)
    if not isinstance(data, dict):
        return
    if plan:
        gathered.world = data.get("world_size") or gathered.world
        gathered.nproc_per_node = data.get("nproc_per_node") or gathered.nproc_per_node
        nodes = [n for n in data.get("nodes") or [] if isinstance(n, dict)]
        gathered.node_order = [str(n.get("node")) for n in nodes]
        gathered.node_ranks = {str(n.get("node")): [r for r in n["ranks"] if isinstance(r, int)]
                               for n in nodes if isinstance(n.get("ranks"), list)}
        gathered.launched = True
        return
    gathered.stop_reason = data.get("stop_reason")
    gathered.launched = True
    gathered.finished = data.get("ok") is True
    stopped = {n.get("node") for n in data.get("nodes") or [] if isinstance(n, dict) and n.get("stopped")}
    gathered.watched = any(isinstance(n, dict) and n.get("watched") is True for n in data.get("nodes") or [])
    for n in data.get("nodes") or []:
        # A node's own error (ssh refused, torchrun missing, its cwd gone), not one ddp-preflight's
        # stop caused: the launch's record of why the training did not run there.
        if isinstance(n, dict) and isinstance(n.get("error"), str) and n["error"] and not n.get("stopped"):
            name = str(n.get("node"))
            fix = n.get("fix") if isinstance(n.get("fix"), str) else None
            gathered.node_errors.append(NodeError(name, n["error"], fix,
                                                  Quote(path, None, f"{name}: {n.get('status')}: {n['error']}")))
    for r in data.get("ranks") or []:
        if not isinstance(r, dict) or not isinstance(r.get("rank"), int):
            continue
        seen = gathered.rank(r.get("node"), r["rank"], r.get("local_rank"))
        code, signal = r.get("exit"), r.get("signal")
        status = ExitStatus(signal=signal) if isinstance(signal, int) else \
            ExitStatus(code=code) if isinstance(code, int) else None
        if status is not None and seen.exit is None:
            seen.exit = status
            seen.exit_quotes.append(Quote(path, None, f"rank {r['rank']} on {r.get('node')}: {status}"))
        if isinstance(r.get("pid"), int) and seen.pid is None:
            seen.pid = r["pid"]
        seen.stopped_by = _stopped_by(r, status, r.get("node") in stopped) or seen.stopped_by
    verdict = data.get("verdict")
    if isinstance(verdict, dict):
        try:
            gathered.saved = Diagnosis.from_json(verdict)
        except (KeyError, TypeError, ValueError) as exc:
            gathered.skipped.append(f"{path}: its verdict is not one this version reads ({type(exc).__name__}: {exc})")
    if gathered.saved is not None:
        d = gathered.saved
        gathered.result = Quote(path, None, f"the verdict the launch saved: {d.kind} ({d.reason}) "
                                            f"{who(d.named) or 'no rank named'}")


def _stopped_by(rank: dict, status: ExitStatus | None, node_stopped: bool) -> StoppedBy | None:
    """Who began stopping a launched rank before it ended, as its launch recorded it: the one rule
    (hangwatch/exits.py's stop_of), the launch summary's too."""
    return stop_of(status, node_stopped, rank.get("error_after_stop") is True, rank.get("failed_first") is True,
                   rank.get("stopped_by") == StoppedBy.TORCHRUN.value)


def _rank_in(path: str) -> int | None:
    found = RANK_IN_NAME.search(Path(path).name)
    return int(found["rank"]) if found else None


def _load(path: str):
    try:
        return json.loads(read_regular(path, JSON_LIMIT).decode("utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):    # RecursionError: nested too deep (rewritten since inputs.py)
        return None
