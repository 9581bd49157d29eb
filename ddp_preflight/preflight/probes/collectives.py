"""The collectives probe: a tiny torchrun job on every node (the training Python, the requested
backend and device; the nodes' own interface setting, then preflight's choice if only that keeps
the group from forming) tries each collective training uses, and every rank reports what
happened. The matrix is what the backend did here, never a table.

With --scan, the training code's collective call sites are listed too (a plain AST scan on this
machine, code_scan.py), so the check can say which of them use an operation that failed. Under
--launch without --scan, the files the training command imports on the master are scanned
(training-imports followed them: the script and the project's own modules): the code about to
run is known."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ddp_preflight.node import jobs as node_jobs
from ddp_preflight.node import protocol, signing
from ddp_preflight.node.protocol import COLLECTIVES as MARKER
from ddp_preflight.rules.environment import env_of
from ddp_preflight.rules.facts import Missing

from ..model import NodeFacts, Options
from . import torchjob
from .bandwidth import master_port_held
from .code_scan import scan, scan_project
from .gpus import collective_plan
from .network_seen import NetworkSeen, not_run_over
from .together import Part, Together, serial

# What runs in every rank: the job and the protocol it prints with (it imports torch: read, not imported).
JOB = "\n".join(Path(f).read_text() for f in (Path(node_jobs.__file__).parent / "collectives.py",
                                              Path(node_jobs.__file__).parent / "signed_store.py",
                                              protocol.__file__, signing.__file__))
OP_TIMEOUT = 10.0       # the process group's timeout: each collective, each wait in its creation
INIT_BOUND = 15.0       # torchrun's rendezvous, then the process group's creation: seconds each
JOB_TIMEOUT = 60.0      # the node's supervisor kills everything left at this bound


def probe(cluster, nodes: tuple[NodeFacts, ...], options: Options, network: dict | None = None,
          together: Together | None = None) -> dict:
    """`network`: the network probe's data, when it ran first: a job is not started over a path
    it found blocked (its ranks could not connect; the job would wait out its bound).
    `together`: its first job is the shared one of the probes that need torch (together.py)."""
    # What the code calls is read on this machine, whatever the job then does: a finding of the
    # scan (a group created only under CUDA) stands even when the job cannot run.
    scanned = {"scan": scan(options.scan)} if options.scan else \
        {"scan": scan_project(nodes[0].parsed.imports)} if nodes else {}      # the training command's own files
    if scanned.get("scan") is None:
        scanned = {}
    usable = [i for i in cluster.usable() if nodes[i].error is None]
    if 0 not in usable:
        return {"skipped": "the master was not reached", **scanned}
    if master_port_held(nodes):
        return {"skipped": f"port {options.master_port} is already held on {nodes[0].node}, so the job "
                           "could not rendezvous there; see master-port", **scanned}
    plan = collective_plan(nodes, options, usable)
    if plan.skipped:
        return {"skipped": plan.skipped, **scanned}
    counts = plan.counts
    names = [nodes[i].node for i in usable]
    var = "NCCL_SOCKET_IFNAME" if options.backend == "nccl" else "GLOO_SOCKET_IFNAME"
    # As training gets it: the node's own environment with the training's variables (--env, the
    # config's [env]) on top, which the facts were collected with.
    configured = [env_of(nodes[i]).get(var, "") for i in usable]
    # preflight's own pin, where it has one; elsewhere the node keeps what training gets.
    chosen = [torchjob.preflight_env(nodes[i], options).get(var, "") or configured[n]
              for n, i in enumerate(usable)]
    started = time.monotonic()
    seen = NetworkSeen.from_json(network or {})
    ranks = {nodes[i].node: n for i, n in zip(usable, counts, strict=True)}
    blocked = seen.blocking(_binds(nodes, usable), ranks)
    if blocked:
        pinned_blocked = seen.blocking(seen.pinned_binds(names), ranks)
        if configured == chosen or pinned_blocked:
            return {"skipped": not_run_over((pinned_blocked or blocked)[0]),
                    "blocked": [d.to_json() for d in pinned_blocked or blocked], **scanned}
    # First as the nodes are set up (what a hand-started torchrun meets); when that cannot even
    # create the group, quickly, and preflight's interface choice differs, again with that choice:
    # the matrix is then measured as training will run once the interface is pinned. Where the
    # network probe found the paths as set up blocked, that first is not started: pinned, alone.
    first_env = chosen if blocked else configured
    first = _attempt(cluster, nodes, options, usable, counts, None if configured == chosen else first_env, together)
    stranger = first.pop("interfered")
    if stranger:            # a process of the job read a stranger's value: no matrix of this run's
        return {"error": stranger, **scanned}
    out = {**first, "env": {n: {var: v or None} for n, v in zip(names, first_env, strict=True)}, "pinned": None}
    if blocked:
        out["unpinned_blocked"] = [d.to_json() for d in blocked]
    if first_env != chosen and first["init_failed"] is not None and first["init_failed"] < 0.8 * INIT_BOUND:
        # On purpose over the training's own setting (an --env GLOO_SOCKET_IFNAME included): the
        # job pins preflight's choice per node, to measure the matrix as the fix would run it.
        second = _attempt(cluster, nodes, options, usable, counts, chosen, together)
        stranger = second.pop("interfered")
        if stranger:
            return {"error": stranger, **scanned}
        out["pinned"] = {"env": {n: {var: v or None} for n, v in zip(names, chosen, strict=True)},
                         "init": second["init"], "jobs": second["jobs"], "init_failed": second["init_failed"]}
        out.update(matrix=second["matrix"], broken=second["broken"], stopped=second["stopped"])
    out.update(backend=options.backend, device=options.device, world=sum(counts), nodes=names,
               port=options.master_port, bound=INIT_BOUND, seconds=round(time.monotonic() - started, 2))
    out.update(scanned)
    return out


def _binds(nodes: tuple[NodeFacts, ...], usable: list[int]) -> dict[str, str | None]:
    """The address each node's ranks bind as the node is set up (Gloo's bind, from its facts:
    the hostname's address, or GLOO_SOCKET_IFNAME's where it is set)."""
    out: dict[str, str | None] = {}
    for i in usable:
        network = nodes[i].parsed.network
        bind = network if isinstance(network, Missing) else network.gloo_bind
        out[nodes[i].node] = None if isinstance(bind, Missing) else bind.address
    return out


def _attempt(cluster, nodes, options, usable, counts: tuple[int, ...], ifnames: list[str] | None,
             together: Together | None = None) -> dict:
    args = ["--backend", options.backend, "--device", options.device, "--timeout", str(OP_TIMEOUT),
            "--bound", str(INIT_BOUND)]
    if ifnames is not None:
        args += ["--ifnames", json.dumps(ifnames)]
    job = torchjob.TorchJob(job="collectives", counts=counts, timeout=JOB_TIMEOUT, args=tuple(args))
    # torchrun's own rendezvous waits 600 s for missing nodes by default: bound it like the rest
    # (set on purpose over any PET_RDZV_CONF of the training's).
    extra_env = {"PET_RDZV_CONF": f"timeout={int(INIT_BOUND)}"}
    results = together.run("collectives", Part(tuple(usable), counts, job.args, job.timeout, extra_env)) \
        if together is not None else None
    if results is None:
        with serial(together):
            results = torchjob.run(cluster, nodes, options, job, indexes=usable, extra_env=extra_env)
    out = assemble([(r.node, r.json_lines(MARKER)) for r in results], {r.node: _job_outcome(r) for r in results})
    out["interfered"] = torchjob.interfered(results, options.master_port)
    ok = len(out["init"]) == sum(counts) and all(r["ok"] for r in out["init"])
    # How long the failed creation took (the longest rank, or the jobs when no rank reported).
    out["init_failed"] = None if ok else max([r["seconds"] for r in out["init"]] or
                                             [j["seconds"] for j in out["jobs"].values()] or [0.0])
    return out


def _job_outcome(result) -> dict:
    outcome = {"exit": result.exit, "signal": result.signal, "timed_out": result.timed_out,
               "seconds": result.seconds, "error": result.error}
    if not result.ok:
        outcome["reason"] = torchjob.exception_line(result.stderr) or torchjob.tail(result, 3)
    return outcome


def assemble(lines_by_node: list[tuple[str, list[dict]]], jobs: dict) -> dict:
    """Rank 0's matrix, with every other rank's disagreement folded into its row."""
    init, broken, plan, done = [], [], None, set()
    cases: dict = {}
    for node, lines in lines_by_node:
        for line in lines:
            event = line.get("event")
            if event == "init":
                init.append({"node": node, **{k: v for k, v in line.items() if k != "event"}})
            elif event == "plan":
                plan = [tuple(c) for c in line["cases"]]
            elif event == "case":
                cases.setdefault(line["i"], {})[line["rank"]] = line
            elif event == "broken":
                broken.append({"node": node, "rank": line["rank"], "after": line["after"], "reason": line["reason"]})
            elif event == "done":
                done.add(line["rank"])
    init.sort(key=lambda r: r["rank"])
    out: dict = {"init": init, "jobs": jobs, "matrix": [], "broken": None, "stopped": None}
    if plan is None:
        return out
    for i, (op, mode, dtype) in enumerate(plan):
        by_rank = cases.get(i, {})
        row = {"op": op, "mode": mode, "dtype": dtype}
        if not by_rank:
            row["status"] = "not run"
        else:
            first = by_rank.get(0) or next(iter(by_rank.values()))
            bad = sorted(r for r, c in by_rank.items() if c["status"] != "ok")
            worst = by_rank[bad[0]] if bad else first
            row.update(status=worst["status"], seconds=first.get("seconds"))
            for key in ("error_type", "error", "deprecated"):
                if worst.get(key) or first.get(key):
                    row[key] = worst.get(key) or first.get(key)
            if bad:
                row["ranks_failing"] = bad
                others = {str(r): c.get("error") for r, c in by_rank.items()
                          if c["status"] != "ok" and c.get("error") != row.get("error")}
                if others:
                    row["other_errors"] = others
        out["matrix"].append(row)
    if broken:
        first = min(broken, key=lambda b: b["after"])
        op, mode, dtype = plan[first["after"]]
        out["broken"] = {**first, "case": {"op": op, "mode": mode, "dtype": dtype}}
    elif init and all(r.get("ok") for r in init) and len(done) < len(init):
        # Killed in the middle (the bound, or a node that vanished): name the case it was on.
        ran = [i for i in range(len(plan)) if i in cases]
        at = (max(ran) + 1) if ran else 0
        if at < len(plan):
            op, mode, dtype = plan[at]
            out["stopped"] = {"at": at, "case": {"op": op, "mode": mode, "dtype": dtype}}
    return out
