"""collectives: the operations training uses, tried over the real backend; judged from the
matrix the probe measured, with the backend's own message and a workaround for each failure."""

from __future__ import annotations

from collections.abc import Iterator

from ..model import Context, Status, Verdict
from .causes import NOT_KNOWN, because, is_gpu_error, likely_causes
from .common import probe_data

# What data-parallel training (DDP, FSDP, ZeRO-style optimizers such as seed 000's) calls: a
# failure there fails the run. The others (pipeline p2p, MoE all-to-all, NCCL's PREMUL_SUM,
# uneven gathers) are a warning unless --scan finds the training code calling them.
COMMON = {"all_reduce_sum", "all_reduce_avg", "reduce_scatter_tensor", "reduce_scatter",
          "all_gather_into_tensor", "all_gather", "broadcast", "barrier"}

MODE_WORDS = {"sync": "blocking", "async_wait": "async_op=True + wait()",
              "async_future": "async_op=True + .get_future()"}

LABEL = {"all_reduce_sum": "all_reduce (SUM)", "all_reduce_avg": "all_reduce (AVG)",
         "all_reduce_premul_sum": "all_reduce with ReduceOp.PREMUL_SUM",
         "all_gather_uneven": "all_gather with uneven sizes", "isend_irecv": "isend/irecv"}

# The torch.distributed function behind each operation id.
CALL = {"all_reduce_sum": "all_reduce", "all_reduce_avg": "all_reduce", "all_reduce_premul_sum": "all_reduce",
        "all_gather_uneven": "all_gather", "isend_irecv": "isend"}

SHIM = "docs/checks/collectives.md#the-get_future-shim"


def check_collectives(ctx: Context) -> Iterator[Verdict]:
    # --scan's findings about the code itself stand whether or not the job could run.
    alone = _group_only_under_cuda(ctx, (ctx.probes.get("collectives") or {}).get("scan") or {})
    if alone:
        yield alone
    data, early = probe_data(ctx, "collectives")
    if early:
        yield early
        return
    base = {"backend": data["backend"], "device": data["device"], "world": data["world"],
            "nodes": data["nodes"], "seconds": data["seconds"], "matrix": compact(data["matrix"]),
            # Works today, goes away later: torch 2.13 warns on reduce_scatter_tensor, for one.
            "deprecated": {r["op"]: r["deprecated"] for r in data["matrix"] if r.get("deprecated")}}
    pinned = data.get("pinned")
    if _init_failed(data["init"], data["world"]):
        yield _init_failure(ctx, data, base)
        if not pinned or _init_failed(pinned["init"], data["world"]):
            return
    if not data["matrix"]:
        yield Verdict(Status.ERROR, None, "the probe's job ended without reporting a matrix: "
                      + _job_reason(data["jobs"]), "please report this with the --json output", base)
        return
    under = _pinned_words(pinned) if pinned else ""
    failures = _failures(data["matrix"])
    scan = data.get("scan") or {}
    for op, rows in failures:
        others = [r for other, more in failures if other == op and more is not rows for r in more]
        yield _failure_result(op, rows, others, data["backend"], scan, base, under)
    if data.get("broken"):
        b = data["broken"]
        yield Verdict(Status.FAIL, None,
                      f"the process group broke after {_case_words(b['case'])} ({b['reason']}); the cases after "
                      "it were not run, and training calling it would hang or fail the same way",
                      "see the failure above for that operation's workaround", {**base, "broken": b})
    elif data.get("stopped"):
        s = data["stopped"]
        yield Verdict(Status.FAIL, None,
                      f"the job was stopped while it ran {_case_words(s['case'])}: it did not return "
                      f"({_job_reason(data['jobs'])}); training calling it would hang there",
                      "avoid this operation on this backend", {**base, "stopped": s})
    if scan.get("error"):
        yield Verdict(Status.ERROR, None, f"--scan: {scan['error']}", "give --scan a folder or .py file", base)
    if not failures and not data.get("broken") and not data.get("stopped"):
        ops = {r["op"] for r in data["matrix"]}
        sites = f"; --scan found {len(scan['sites'])} collective calls, none failing" if scan.get("sites") else ""
        yield Verdict(Status.PASS, None,
                      f"all {len(data['matrix'])} cases pass on {data['backend']} ({len(ops)} operations x "
                      f"blocking/async/get_future x float32/bfloat16/float16, {data['world']} ranks on "
                      f"{len(data['nodes'])} nodes, {data['seconds']:.1f} s){under}{sites}", None, base)


def compact(matrix: list[dict]) -> dict:
    """{op: {mode: {dtype: "ok" | "error: ..." | "wrong: ..." | "not run"}}}"""
    out: dict = {}
    for row in matrix:
        message = f"{row.get('error_type', '')}: {row.get('error', '')}".lstrip(": ")
        cell = row["status"] if row["status"] in ("ok", "not run") else f"{row['status']}: {message}"
        out.setdefault(row["op"], {}).setdefault(row["mode"], {})[row["dtype"] or "-"] = cell
    return out


def _failures(matrix: list[dict]) -> list[tuple[str, list[dict]]]:
    """Each distinct failure of each operation, with its rows: the rows that raised the same
    error, or the rows that returned wrong numbers (each row keeps its own numbers)."""
    out: dict[tuple[str, str], list[dict]] = {}
    for row in matrix:
        if row["status"] not in ("ok", "not run"):
            out.setdefault((row["op"], _what_failed(row)), []).append(row)
    return [(op, rows) for (op, _), rows in out.items()]


def _what_failed(row: dict) -> str:
    return "wrong results" if row["status"] == "wrong" else _message(row)


def _message(row: dict) -> str:
    return f"{row.get('error_type', '')}: {row.get('error', '')}".lstrip(": ")


def _failure_result(op: str, rows: list[dict], others: list[dict], backend: str, scan: dict, base: dict,
                    under: str) -> Verdict:
    """One distinct failure of op (rows); others: the op's rows that failed some other way."""
    modes = [m for m in MODE_WORDS if any(r["mode"] == m for r in rows)]
    dtypes = sorted({r["dtype"] for r in rows if r["dtype"]}, key=["float32", "bfloat16", "float16"].index)
    all_modes = len(modes) == len(MODE_WORDS)
    where = ("in every mode" if all_modes else " and ".join(MODE_WORDS[m] for m in modes)) + \
        (f", {'/'.join(dtypes)}" if dtypes else "")
    first = rows[0]
    wrong = first["status"] == "wrong"
    message = _message(first)
    if wrong:
        # Each case, and each rank's shard, has its own numbers: say whose these are.
        ranks = first.get("ranks_failing") or []
        whose = ([MODE_WORDS[first["mode"]], first["dtype"]] if len(rows) > 1 else []) + \
            ([f"rank {ranks[0]}"] if ranks and len(ranks) < base["world"] else [])
        message = ", ".join(w for w in whose if w) + (": " if any(whose) else "") + message
    name = LABEL.get(op, op)
    future_only = modes == ["async_future"]
    if future_only:
        name = "isend/irecv(...).get_future()" if op == "isend_irecv" else \
            f"{op}(..., async_op=True).get_future()"
        if not any(r["mode"] != "async_future" for r in others):
            where += "; blocking calls and wait() work"
    hits = _scan_hits(op, modes, scan)
    wrapped = _scan_hits(op, modes, scan, wrapped=True)
    seed = " (seed 000)" if future_only and op.startswith("reduce_scatter") and not wrong else ""
    verb = "returns wrong results" if wrong else "fails"
    summary = f"{name} {verb} on {backend} ({where}): {message}{seed}{under}"
    if others:
        summary += f"; it also fails another way, reported on its own ({_what_failed(others[0])})"
    # An all_gather call site fails only if its ranks' sizes differ, which no scan can tell.
    maybe = op == "all_gather_uneven"
    if hits:
        shown = ", ".join(f"{h['file']}:{h['line']}" for h in hits[:3]) + \
            (f" and {len(hits) - 3} more" if len(hits) > 3 else "")
        summary += (f"; all_gather calls that fail if their sizes differ: {shown}" if maybe
                    else f"; the training code calls it at {shown}")
    elif wrapped:
        shown = ", ".join(f"{h['file']}:{h['line']}" for h in wrapped[:3]) + \
            (f" and {len(wrapped) - 3} more" if len(wrapped) > 3 else "")
        how = sorted({h["wrapped"] for h in wrapped})
        summary += (f"; --scan found it called only through {' and '.join(how)}, which falls back when "
                    f"the future is missing ({shown}): not used unwrapped in {scan['path']}")
    elif "sites" in scan:
        summary += f"; --scan found no call to it in {scan['path']}"
    # Only .get_future() missing: blocking calls and wait() work, so it fails the run only if the
    # code asks for the future (NCCL-style overlap, seeds 000 and 004). --scan tells.
    if future_only and not wrong and not hits and "sites" not in scan:
        summary += "; code that calls .get_future() on it crashes: --scan PATH finds such calls"
    status = Status.FAIL if (wrong or (hits and not maybe) or (op in COMMON and not future_only)) else Status.WARN
    fix = wrong_numbers(op, modes, dtypes, backend) if wrong else workaround(op, modes, dtypes, backend)
    details = {**base, "op": op, "failure": _what_failed(first), "failures": rows, "call_sites": hits,
               "wrapped_call_sites": wrapped}
    if "sites" in scan and not hits and (op not in COMMON or future_only):
        # The scanned code never calls it the way it fails (DDP itself may call the common ones,
        # which no scan sees): what the backend lacks, for the record, not a finding to fix.
        return Verdict(Status.PASS, None, summary, None, {**details, "workaround": fix})
    return Verdict(status, None, summary, fix, details)


def workaround(op: str, modes: list[str], dtypes: list[str], backend: str) -> str:
    """For an operation that raises: what to call instead."""
    call = CALL.get(op, op)
    if modes == ["async_future"]:
        wrapped = "dist.isend(...)" if op == "isend_irecv" else f"dist.{call}(..., async_op=True)"
        return (f"call it as _async_op({wrapped}): a shim that returns work.get_future() and falls back to "
                f"an object whose wait() calls work.wait() (seed 000; {SHIM})")
    if op == "all_reduce_premul_sum":
        return "multiply first, then reduce with SUM: t.mul_(factor); dist.all_reduce(t, op=dist.ReduceOp.SUM)"
    if op == "all_gather_uneven":
        return ("pad every rank's tensor to the largest size, gather with dist.all_gather_into_tensor, then cut "
                "each rank's part back to its own length (send the lengths first with a small all_gather)")
    if op == "all_reduce_avg":
        return "reduce with SUM, then divide: dist.all_reduce(t); t.div_(dist.get_world_size())"
    if dtypes and "float32" not in dtypes:
        return f"communicate in float32: t32 = t.float(); dist.{call}(t32, ...); t.copy_(t32)"
    if modes == ["async_wait", "async_future"]:
        return f"call dist.{call} without async_op=True on {backend}"
    return f"{backend} does not implement it here: avoid this call, or use a backend that does (nccl on GPUs)"


def wrong_numbers(op: str, modes: list[str], dtypes: list[str], backend: str) -> str:
    """For an operation that returns, but further from the exact result than rounding explains."""
    call = CALL.get(op, op)
    if dtypes and "float32" not in dtypes:
        return f"communicate in float32: t32 = t.float(); dist.{call}(t32, ...); t.copy_(t32)"
    if "sync" not in modes:
        return f"call dist.{call} without async_op=True on {backend}"
    return (f"{backend} computes dist.{call} wrongly here, in float32 too: avoid it on this backend and report "
            "it to the backend's developers with the --json output")


def _scan_hits(op: str, modes: list[str], scan: dict, *, wrapped: bool = False) -> list[dict]:
    """The call sites that use op in a failing mode: unwrapped ones (default), or those a shim
    or a try/except around .get_future() already makes safe."""
    sites = scan.get("sites") or []
    wanted = "all_gather" if op == "all_gather_uneven" else op
    return [s for s in sites if s["op"] == wanted and s["mode"] in modes and bool(s.get("wrapped")) is wrapped]


def _group_only_under_cuda(ctx: Context, scan: dict) -> Verdict | None:
    """A CPU run of code that calls init_process_group only under a CUDA condition (nanochat's
    compute_init): every rank would train alone, in no group, until hangwatch notices."""
    inits = scan.get("inits") or []
    if ctx.options.device != "cpu" or not inits or not all(i.get("cuda_only") for i in inits):
        return None
    first = inits[0]
    where = f"{first['file']}:{first['line']}"
    otherwise = " and ".join(first.get("otherwise") or [])
    branch = f"elif {otherwise}:" if otherwise else "else:"
    return Verdict(Status.WARN, None,
                   f"the training code creates its process group only under CUDA ({where}, inside "
                   f"`if {first['guard']}:` at line {first['guard_line']}): on this CPU run no rank joins a "
                   "group and each trains alone (seed 000's compute_init)",
                   f"in {first['file']}, after that branch: {branch} "
                   f"dist.init_process_group(backend=\"{ctx.options.backend}\")   # seed 000's first patch",
                   {"scan_path": scan.get("path"), "inits": inits})


def _init_failed(init: list[dict], world: int) -> bool:
    return len(init) < world or not all(r.get("ok") for r in init)


def _init_failure(ctx: Context, data: dict, base: dict) -> Verdict:
    init, bound = data["init"], data["bound"]
    failed = [r for r in init if not r.get("ok")]
    port = f"{ctx.options.master_addr or ctx.master.node}:{data['port']}"
    if not init:
        reason = _job_reason(data["jobs"])
        symptom = "rendezvous" if any(w in reason for w in ("DistNetworkError", "DistStoreError", "endezvous",
                                                              "timed out")) else \
            "gpu" if is_gpu_error(reason) else "no rank"
    elif any(r.get("timed_out") for r in failed):
        symptom = "timeout"
    elif any("ss_family" in r.get("error", "") for r in failed):
        symptom = "family"
    else:
        symptom = "gpu" if any(is_gpu_error(_message(r)) for r in failed) else "other"
    causes = likely_causes(ctx, symptom)
    if symptom == "rendezvous":
        what = f"torchrun's rendezvous at {port} did not complete within {bound:g} s; no rank started ({reason})"
    elif not init:
        what = f"the job ended before any rank reported ({reason})"
    elif symptom == "timeout":
        nodes = sorted({r["node"] for r in failed if r.get("timed_out")})
        what = (f"process-group creation did not finish within {bound:g} s on {', '.join(nodes)} "
                "(stopped there, not waited on)")
    else:
        # The rank on the node the likely cause names, so the message and the cause agree.
        at = causes[0]["node"] if causes else None
        r = next((r for r in failed if r["node"] == at), failed[0] if failed else init[0])
        what = f"process-group creation failed on {r['node']} after {r['seconds']:.1f} s: {_message(r)}"
        missing = data["world"] - len(init)
        if missing > 0:
            what += f" ({missing} rank{'s' if missing > 1 else ''} never reported)"
    unexplained = f"{NOT_KNOWN}: no {'GPU check' if symptom == 'gpu' else 'fact or network check'} explains it"
    if symptom != "gpu" and not ctx.probes.get("network"):
        unexplained += " (run the ephemeral-ports and master-reachable checks too)"
    said, fix = because(causes, unexplained)
    what += said
    pinned = data.get("pinned")
    if pinned and not _init_failed(pinned["init"], data["world"]):
        what += (f". With the interface preflight chose ({_env_words(pinned['env'])}) the group forms: "
                 "the matrix was measured that way")
    elif pinned:
        # The pin did not make it form: say how it failed then, and what else explains that.
        again = [r for r in pinned["init"] if not r.get("ok")]
        if again:
            r = next((r for r in again if r.get("timed_out")), again[0])
            how = (f"did not finish within {bound:g} s on {r['node']}" if r.get("timed_out") else
                   f"failed on {r['node']}: {_message(r)}")
        else:
            how = f"ended before any rank reported ({_job_reason(pinned['jobs'])})"
        others = [c for c in causes if c["check"] not in ("interface-choice", "address-family")]
        then, _ = because(others, NOT_KNOWN)
        what += (f". With the interface preflight chose ({_env_words(pinned['env'])}) process-group creation "
                 f"{how}{then}")
    details = {**base, "init": init, "jobs": data["jobs"], "env": data.get("env"), "likely_causes": causes}
    if pinned:
        details["pinned"] = pinned
    return Verdict(Status.FAIL, None, what, fix, details)


def _job_reason(jobs: dict) -> str:
    reasons: dict[str, list[str]] = {}
    for node, job in jobs.items():
        if job.get("error"):
            reason = job["error"]
        elif job.get("timed_out"):
            reason = f"killed at the job's bound after {job['seconds']:.0f} s"
        else:
            reason = job.get("reason") or job.get("tail")
        if reason:
            reasons.setdefault(reason.rstrip("."), []).append(node)
    if len(reasons) == 1 and len(next(iter(reasons.values()))) == len(jobs) > 1:
        return f"every node: {next(iter(reasons))}"
    return "; ".join(f"{', '.join(nodes)}: {reason}" for reason, nodes in reasons.items()) or "no reason reported"


def _case_words(case: dict) -> str:
    return f"{case['op']} ({MODE_WORDS[case['mode']]}{', ' + case['dtype'] if case.get('dtype') else ''})"


def _env_words(env: dict) -> str:
    pairs = [(node, k, v) for node, values in env.items() for k, v in values.items() if v]
    if pairs and len(pairs) == len(env) and len({(k, v) for _, k, v in pairs}) == 1:
        return f"{pairs[0][1]}={pairs[0][2]} on every node"
    return ", ".join(f"{k}={v} on {node}" for node, k, v in pairs) or "no interface pinned"


def _pinned_words(pinned: dict) -> str:
    return f" (measured with {_env_words(pinned['env'])}, as preflight chose)"
