"""collectives: the operations training uses, tried over the real backend; judged from the
matrix the probe measured, with the backend's own message and a workaround for each failure."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from ddp_preflight.rules import failures as catalogue
from ddp_preflight.rules.collectives import workaround, wrong_numbers
from ddp_preflight.rules.facts import TorchFacts
from ddp_preflight.rules.fix import change

from ..model import Context, Status, Verdict
from ..probes.collectives_seen import Attempt, CallSite, Case, CaseEnd, CollectivesSeen, JobEnd, Scan
from ..probes.network_seen import not_run_over
from .causes import NOT_KNOWN, because, is_gpu_error, likely_causes
from .common import probed

# What data-parallel training (DDP, FSDP, ZeRO-style optimizers such as seed 000's) calls: a
# failure there fails the run. The others (pipeline p2p, MoE all-to-all, NCCL's PREMUL_SUM,
# uneven gathers) and a missing .get_future() are said only when the training code calls them
# (--scan, or the script --launch runs): otherwise they are kept in the passing results.
COMMON = {"all_reduce_sum", "all_reduce_avg", "reduce_scatter_tensor", "reduce_scatter",
          "all_gather_into_tensor", "all_gather", "broadcast", "barrier"}

MODE_WORDS = {"sync": "blocking", "async_wait": "async_op=True + wait()",
              "async_future": "async_op=True + .get_future()"}

LABEL = {"all_reduce_sum": "all_reduce (SUM)", "all_reduce_avg": "all_reduce (AVG)",
         "all_reduce_premul_sum": "all_reduce with ReduceOp.PREMUL_SUM",
         "all_gather_uneven": "all_gather with uneven sizes", "isend_irecv": "isend/irecv"}

def check_collectives(ctx: Context) -> Iterator[Verdict]:
    # --scan's findings about the code itself stand whether or not the job could run.
    code = Scan.from_json((ctx.probes.get("collectives") or {}).get("scan"))
    alone = _group_only_under_cuda(ctx, code)
    if alone:
        yield alone
    pinned_gpu = _cuda_pinned_on_cpu(ctx, code)
    if pinned_gpu:
        yield pinned_gpu
    seen, early = probed(ctx, "collectives", CollectivesSeen.from_json)
    if seen is None:
        yield from [early] if early else []
        return
    base = {"backend": seen.backend, "device": seen.device, "world": seen.world,
            "nodes": seen.sent["nodes"], "seconds": seen.seconds, "matrix": compact(seen.matrix),
            # Works today, goes away later: torch 2.13 warns on reduce_scatter_tensor, for one.
            "deprecated": {c.op: c.deprecated for c in seen.matrix if c.deprecated}}
    pinned = seen.pinned
    if not seen.first.formed(seen.world):
        yield _init_failure(ctx, seen, base)
        if not pinned or not pinned.formed(seen.world):
            return
    if not seen.matrix:
        yield Verdict(Status.ERROR, None, "the probe's job ended without reporting a matrix: "
                      + _job_reason(seen.first.jobs), change("please report this with the --json output"), base)
        return
    under = _pinned_words(pinned) if pinned else _blocked_words(seen) if seen.unpinned_blocked else ""
    failures = _failures(seen.matrix)
    scan = seen.scan
    for op, cases in failures:
        others = [c for other, more in failures if other == op and more is not cases for c in more]
        yield _failure_result(op, cases, others, seen.backend, scan, base, under)
    if seen.broken is not None:
        b = seen.broken
        yield Verdict(Status.FAIL, None,
                      f"the process group broke after {_case_words(b)} ({b.reason}); the cases after "
                      "it were not run, and training calling it would hang or fail the same way",
                      change("see the failure above for that operation's workaround"), {**base, "broken": dict(b.sent)})
    elif seen.stopped is not None:
        stop = seen.stopped
        yield Verdict(Status.FAIL, None,
                      f"the job was stopped while it ran {_case_words(stop)}: it did not return "
                      f"({_job_reason(seen.first.jobs)}); training calling it would hang there",
                      change("avoid this operation on this backend"), {**base, "stopped": dict(stop.sent)})
    if scan.error:
        yield Verdict(Status.ERROR, None, f"--scan: {scan.error}", change("give --scan a folder or .py file"), base)
    if not failures and seen.broken is None and seen.stopped is None:
        ops = {c.op for c in seen.matrix}
        sites = f"; --scan found {len(scan.sites)} collective calls, none failing" if scan.sites else ""
        yield Verdict(Status.PASS, None,
                      f"all {len(seen.matrix)} cases pass on {seen.backend} ({len(ops)} operations x "
                      f"blocking/async/get_future x float32/bfloat16/float16, {seen.world} ranks on "
                      f"{len(seen.nodes)} nodes, {seen.seconds:.1f} s){under}{sites}", None, base)


def compact(matrix: Sequence[Case]) -> dict:
    """{op: {mode: {dtype: "ok" | "error: ..." | "wrong: ..." | "not run"}}}"""
    out: dict = {}
    for case in matrix:
        cell = case.status if not case.failed else f"{case.status}: {case.message}"
        out.setdefault(case.op, {}).setdefault(case.mode, {})[case.dtype or "-"] = cell
    return out


def _failures(matrix: Sequence[Case]) -> list[tuple[str, list[Case]]]:
    """Each distinct failure of each operation, with its cases: the cases that raised the same
    error, or the cases that returned wrong numbers (each case keeps its own numbers)."""
    out: dict[tuple[str, str], list[Case]] = {}
    for case in matrix:
        if case.failed:
            out.setdefault((case.op, case.what_failed), []).append(case)
    return [(op, cases) for (op, _), cases in out.items()]


def _failure_result(op: str, cases: list[Case], others: list[Case], backend: str, scan: Scan, base: dict,
                    under: str) -> Verdict:
    """One distinct failure of op (cases); others: the op's cases that failed some other way."""
    modes = [m for m in MODE_WORDS if any(c.mode == m for c in cases)]
    dtypes = sorted({c.dtype for c in cases if c.dtype}, key=["float32", "bfloat16", "float16"].index)
    all_modes = len(modes) == len(MODE_WORDS)
    where = ("in every mode" if all_modes else " and ".join(MODE_WORDS[m] for m in modes)) + \
        (f", {'/'.join(dtypes)}" if dtypes else "")
    first = cases[0]
    wrong = first.status == "wrong"
    message = first.message
    if wrong:
        # Each case, and each rank's shard, has its own numbers: say whose these are.
        ranks = first.ranks_failing
        whose = ([MODE_WORDS[first.mode], first.dtype] if len(cases) > 1 else []) + \
            ([f"rank {ranks[0]}"] if ranks and len(ranks) < base["world"] else [])
        message = ", ".join(w for w in whose if w) + (": " if any(whose) else "") + message
    name = LABEL.get(op, op)
    future_only = modes == ["async_future"]
    if future_only:
        name = "isend/irecv(...).get_future()" if op == "isend_irecv" else \
            f"{op}(..., async_op=True).get_future()"
        if not any(c.mode != "async_future" for c in others):
            where += "; blocking calls and wait() work"
    hits = _scan_hits(op, modes, scan)
    wrapped = _scan_hits(op, modes, scan, wrapped=True)
    verb = "returns wrong results" if wrong else "fails"
    summary = f"{name} {verb} on {backend} ({where}): {message}{under}"
    if others:
        summary += f"; it also fails another way, reported on its own ({others[0].what_failed})"
    # An all_gather call site fails only if its ranks' sizes differ, which no scan can tell.
    maybe = op == "all_gather_uneven"
    if hits:
        shown = ", ".join(f"{h.file}:{h.line}" for h in hits[:3]) + \
            (f" and {len(hits) - 3} more" if len(hits) > 3 else "")
        summary += (f"; all_gather calls that fail if their sizes differ: {shown}" if maybe
                    else f"; the training code calls it at {shown}")
    elif wrapped:
        shown = ", ".join(f"{h.file}:{h.line}" for h in wrapped[:3]) + \
            (f" and {len(wrapped) - 3} more" if len(wrapped) > 3 else "")
        how = sorted({h.wrapped or "" for h in wrapped})
        summary += (f"; --scan found it called only through {' and '.join(how)}, which falls back when "
                    f"the future is missing ({shown}): not used unwrapped in {scan.path}")
    elif scan.sites is not None:
        summary += f"; --scan found no call to it in {scan.path}"
    # Only .get_future() missing: blocking calls and wait() work, so it fails the run only if the
    # code asks for the future (NCCL-style overlap, seeds 000 and 004). --scan tells.
    if future_only and not wrong and not hits and scan.sites is None:
        summary += "; code that calls .get_future() on it crashes: --scan PATH finds such calls"
    elif not wrong and scan.sites is None and op not in COMMON:
        summary += "; whether the training calls it: --scan PATH finds such calls"
    status = Status.FAIL if (wrong or (hits and not maybe) or (op in COMMON and not future_only)) else Status.WARN
    fix = wrong_numbers(op, modes, dtypes, backend) if wrong else workaround(op, modes, dtypes, backend)
    details = {**base, "op": op, "failure": first.what_failed, "failures": [dict(c.sent) for c in cases],
               "call_sites": [dict(h.sent) for h in hits], "wrapped_call_sites": [dict(h.sent) for h in wrapped]}
    if not wrong and not hits and (op not in COMMON or future_only):
        # The scanned code never calls it the way it fails, or no code was given (DDP itself may
        # call the common ones, which no scan sees): what the backend lacks, for the record (the
        # JSON, --verbose), not a finding to fix. Said as a warning only for a call the code makes.
        return Verdict(Status.PASS, None, summary, None, {**details, "workaround": fix.text()})
    return Verdict(status, None, summary, fix, details)


def _scan_hits(op: str, modes: list[str], scan: Scan, *, wrapped: bool = False) -> list[CallSite]:
    """The call sites that use op in a failing mode: unwrapped ones (default), or those a shim
    or a try/except around .get_future() already makes safe."""
    wanted = "all_gather" if op == "all_gather_uneven" else op
    return [s for s in scan.sites or () if s.op == wanted and s.mode in modes and bool(s.wrapped) is wrapped]


def _group_only_under_cuda(ctx: Context, scan: Scan) -> Verdict | None:
    """A CPU run of code that calls init_process_group only under a CUDA condition (nanochat's
    compute_init): every rank would train alone, in no group, until hangwatch notices. A failure
    when the training is about to start (--launch) on CPUs alone with more than one rank: the
    run would "finish" with every rank's own model; otherwise a warning (a GPU on some node may
    take the branch, and --scan alone only reads code)."""
    inits = scan.inits
    if ctx.options.device != "cpu" or not inits or not all(i.cuda_only for i in inits):
        return None
    first = inits[0]
    where = f"{first.file}:{first.line}"
    # After the whole `if` (its else included, which may set what the code needs, as nanochat's
    # sets `device`), a group created where that `if` created none: one line that works pasted.
    module = first.call.rpartition(".")[0] or "torch.distributed"
    wanted = " and ".join([*first.otherwise, f"not {module}.is_initialized()"])
    after = f"after line {first.statement_end} (the end of that `if`), indented as it" if first.statement_end \
        else "after that `if`"
    world = sum(ctx.options.nproc_on(n.node) for n in ctx.reachable)
    alone = ctx.options.launch and world > 1 and not any(
        isinstance(t := n.parsed.torch, TorchFacts) and t.cuda_available for n in ctx.reachable)
    return Verdict(Status.FAIL if alone else Status.WARN, None,
                   f"the training code creates its process group only under CUDA ({where}, inside "
                   f"`if {first.guard}:` at line {first.guard_line}): on this CPU run no rank joins a "
                   "group and each trains alone"
                   + (f"; all {world} ranks would train {world} separate models" if alone else ""),
                   change(f"in {first.file}, {after}: if {wanted}: "
                          f"{first.call}(backend=\"{ctx.options.backend}\")"),
                   {"scan_path": scan.path, "inits": [dict(i.sent) for i in inits], "world": world})


def _cuda_pinned_on_cpu(ctx: Context, scan: Scan) -> Verdict | None:
    """A CPU run of code that pins a CUDA device with no CUDA condition around it (nanoGPT's
    train.py: `torch.cuda.set_device(device)` in its DDP set-up): on a node without CUDA it raises
    before training starts, on every rank. A failure where no node has CUDA; where some have, a
    warning: their ranks compute on a GPU, not as the run was asked."""
    pins = [p for p in scan.pins if not p.guarded]
    if ctx.options.device != "cpu" or not pins:
        return None
    first = pins[0]
    where = f"{first.file}:{first.line}"
    without = [n.node for n in ctx.reachable if not (isinstance(t := n.parsed.torch, TorchFacts) and t.cuda_available)]
    lines = f"line {first.line}" if first.first_line == first.line else f"lines {first.first_line}-{first.line}"
    fix = change(f"in {first.file}, put {lines} (`{first.text}`) under `if torch.cuda.is_available():`",
                 note="a CPU run then keeps the device it was given")
    details = {"scan_path": scan.path, "pins": [dict(p.sent) for p in pins]}
    if without:
        return Verdict(Status.FAIL, None,
                       f"the training code pins a CUDA device with no CUDA condition around it ({where}: "
                       f"`{first.text}`): on this CPU run it raises on {', '.join(without)} (no CUDA there) before "
                       "training starts, on every rank", fix, details)
    return Verdict(Status.WARN, None,
                   f"the training code pins a CUDA device with no CUDA condition around it ({where}: `{first.text}`): "
                   "on this CPU run its ranks compute on a GPU, not on the CPU", fix, details)


def _init_failure(ctx: Context, seen: CollectivesSeen, base: dict) -> Verdict:
    init, bound = seen.first.init, seen.bound
    failed = [r for r in init if not r.ok]
    port = f"{ctx.options.master_addr or ctx.master.node}:{seen.port}"
    reason = ""
    if not init:
        reason = _job_reason(seen.first.jobs)
        symptom = "rendezvous" if any(w in reason for w in catalogue.STORE_WORDS) else \
            "gpu" if is_gpu_error(reason) else "no rank"
    elif any(r.timed_out for r in failed):
        symptom = "timeout"
    elif any(catalogue.says("address-family", r.sent.get("error", "")) for r in failed):
        symptom = "family"
    else:
        symptom = "gpu" if any(is_gpu_error(r.message) for r in failed) else "other"
    causes = likely_causes(ctx, symptom)
    if symptom == "rendezvous":
        what = f"torchrun's rendezvous at {port} did not complete within {bound:g} s; no rank started ({reason})"
    elif not init:
        what = f"the job ended before any rank reported ({reason})"
    elif symptom == "timeout":
        nodes = sorted({r.node for r in failed if r.timed_out})
        what = (f"process-group creation did not finish within {bound:g} s on {', '.join(nodes)} "
                "(stopped there, not waited on)")
    else:
        # The rank on the node the likely cause names, so the message and the cause agree.
        at = causes[0].node if causes else None
        r = next((r for r in failed if r.node == at), failed[0] if failed else init[0])
        what = f"process-group creation failed on {r.node} after {r.seconds:.1f} s: {r.message}"
        missing = seen.world - len(init)
        if missing > 0:
            what += f" ({missing} rank{'s' if missing > 1 else ''} never reported)"
    unexplained = f"{NOT_KNOWN}: no {'GPU check' if symptom == 'gpu' else 'fact or network check'} explains it"
    if symptom != "gpu" and not ctx.probes.get("network"):
        unexplained += " (run the ephemeral-ports and master-reachable checks too)"
    said, fix = because(causes, unexplained)
    what += said
    pinned = seen.pinned
    if pinned and pinned.formed(seen.world):
        what += (f". With the interface preflight chose ({_env_words(pinned.env)}) the group forms: "
                 "the matrix was measured that way")
    elif pinned:
        # The pin did not make it form: say how it failed then, and what else explains that.
        again = [r for r in pinned.init if not r.ok]
        if again:
            r = next((r for r in again if r.timed_out), again[0])
            how = (f"did not finish within {bound:g} s on {r.node}" if r.timed_out else
                   f"failed on {r.node}: {r.message}")
        else:
            how = f"ended before any rank reported ({_job_reason(pinned.jobs)})"
        others = [c for c in causes if c.check not in ("interface-choice", "address-family")]
        then, _ = because(others, NOT_KNOWN)
        what += (f". With the interface preflight chose ({_env_words(pinned.env)}) process-group creation "
                 f"{how}{then}")
    details = {**base, "init": seen.sent["init"], "jobs": seen.sent["jobs"], "env": seen.sent.get("env"),
               "likely_causes": [c.to_json() for c in causes]}
    if pinned:
        details["pinned"] = dict(pinned.sent)
    return Verdict(Status.FAIL, None, what, fix, details)


def _job_reason(jobs: Mapping[str, JobEnd]) -> str:
    reasons: dict[str, list[str]] = {}
    for node, job in jobs.items():
        reason: str | None
        if job.error:
            reason = job.error
        elif job.timed_out:
            reason = f"killed at the job's bound after {job.seconds:.0f} s"
        else:
            reason = job.reason or job.tail
        if reason:
            reasons.setdefault(reason.rstrip("."), []).append(node)
    if len(reasons) == 1 and len(next(iter(reasons.values()))) == len(jobs) > 1:
        return f"every node: {next(iter(reasons))}"
    return "; ".join(f"{', '.join(nodes)}: {reason}" for reason, nodes in reasons.items()) or "no reason reported"


def _case_words(case: CaseEnd) -> str:
    return f"{case.op} ({MODE_WORDS[case.mode]}{', ' + case.dtype if case.dtype else ''})"


def _env_words(env: Mapping[str, Mapping[str, str | None]]) -> str:
    pairs = [(node, k, v) for node, values in env.items() for k, v in values.items() if v]
    if pairs and len(pairs) == len(env) and len({(k, v) for _, k, v in pairs}) == 1:
        return f"{pairs[0][1]}={pairs[0][2]} on every node"
    return ", ".join(f"{k}={v} on {node}" for node, k, v in pairs) or "no interface pinned"


def _pinned_words(pinned: Attempt) -> str:
    return f" (measured with {_env_words(pinned.env)}, as preflight chose)"


def _blocked_words(seen: CollectivesSeen) -> str:
    """The job ran pinned alone: as the nodes are set up, a path its ranks use is blocked."""
    return (f" (measured with {_env_words(seen.first.env)}, as preflight chose; as the nodes are set up, "
            f"{not_run_over(seen.unpinned_blocked[0])})")
