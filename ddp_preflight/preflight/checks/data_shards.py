"""data-shards: every node must hold the master's training shards, byte for byte.

With 201 shards on one node and 4 on another (seeds 001, 004) the ranks read different data, or
one rank runs out of batches, leaves the loop and the others wait in all_reduce forever."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from ddp_preflight.rules.facts import Missing, ShardManifest
from ddp_preflight.rules.fix import Fix, change, run, said

from ..model import Context, NodeFacts, Status, Verdict

SHOWN = 5                       # names listed per kind of difference; the rest is a count


def check_data_shards(ctx: Context) -> Iterator[Verdict]:
    if not ctx.options.data_dir and not ctx.options.data_dirs:
        yield Verdict(Status.SKIP, None, "no --data-dir given",
                      fix=change("pass --data-dir PATH (the folder of training shards, the same path on "
                                 "every node)"))
        return
    master = ctx.master
    # Each node's own folder ([nodes.NAME] data_dir in the config), else the one for every node.
    master_dir = ctx.options.data_dir_of(master.node) or ""
    reference = yield from _manifest_or_result(master, master_dir, fix=_unreadable_fix(master_dir))
    if reference is not None:
        yield _master_result(master, reference, master_dir)
    for node in ctx.nodes[1:]:
        data_dir = ctx.options.data_dir_of(node.node) or ""
        found = yield from _manifest_or_result(node, data_dir, fix=_rsync_fix(ctx, node, data_dir))
        if found is None:
            continue
        if reference is None:
            yield Verdict(Status.SKIP, node.node,
                          f"not compared: no shard manifest from the master ({master.node})")
        else:
            yield _compare(ctx, node, found, reference, data_dir)


def _manifest_or_result(node: NodeFacts, data_dir: str, fix: Fix):
    """The node's manifest; or, when there is none, yields the verdict that says why."""
    if node.error is not None:
        yield Verdict(Status.SKIP, node.node, f"not checked: {node.error}", fix=said(node.fix, node.node))
        return None
    manifest = node.parsed.shards
    if isinstance(manifest, Missing):
        if manifest.absent is False:
            fix = _unreadable_fix(data_dir)     # the folder is there: copying will not help
        yield Verdict(Status.ERROR, node.node,
                      (manifest.failed and manifest.reason) or f"no shard manifest was collected for {data_dir}",
                      fix=fix, details={"data_dir": data_dir})
        return None
    return manifest


def _master_result(master: NodeFacts, reference: ShardManifest, data_dir: str) -> Verdict:
    count, size = reference.file_count, reference.total_bytes
    details = {"data_dir": data_dir, "shards": count, "bytes": size,
               "algorithm": reference.algorithm, "skipped": dict(reference.skipped),
               "sampled": dict(reference.sampled)}
    if count == 0:
        return Verdict(Status.WARN, master.node,
                       f"no shards in {data_dir} on the master: the training would read nothing",
                       fix=change(f"put the training shards in {data_dir}, or pass the folder that holds "
                                  f"them as --data-dir", master.node), details=details)
    return Verdict(Status.PASS, master.node,
                   f"{count} shards, {_size(size)} (the reference for the other nodes)",
                   details=details)


def _compare(ctx: Context, node: NodeFacts, found: ShardManifest, reference: ShardManifest,
             data_dir: str) -> Verdict:
    ours, theirs = reference.files, found.files
    same_algorithm = found.algorithm == reference.algorithm
    # Digests from two algorithms say nothing about each other: fall back to name and size.
    missing = sorted(set(ours) - set(theirs))
    extra = sorted(set(theirs) - set(ours))
    differs = sorted(n for n in set(ours) & set(theirs) if ours[n].size != theirs[n].size
                     or (same_algorithm and ours[n].digest != theirs[n].digest))
    details = {"data_dir": data_dir, "shards": found.file_count, "bytes": found.total_bytes,
               "master_shards": reference.file_count,
               "compared_by": "digest" if same_algorithm else "name+size",
               "algorithm": found.algorithm, "master_algorithm": reference.algorithm,
               "skipped": dict(found.skipped), "sampled": dict(found.sampled)}
    for kind, names in (("missing", missing), ("extra", extra), ("differs", differs)):
        details[kind], details[f"{kind}_count"] = names[:SHOWN], len(names)

    if missing or extra or differs:
        parts = [f"{len(names)} {kind} ({_names(names)})"
                 for kind, names in (("missing", missing), ("differs", differs), ("extra", extra))
                 if names]
        if not same_algorithm:
            parts.append("content not compared (other hash algorithm)")
        present = len(ours) - len(missing)
        return Verdict(Status.FAIL, node.node,
                       f"{node.node} has {present} of the master's {len(ours)} shards; "
                       + ", ".join(parts),
                       fix=_rsync_fix(ctx, node, data_dir), details=details)
    if not same_algorithm:
        return Verdict(Status.WARN, node.node,
                       f"{len(ours)} shards with the master's names and sizes, but their content "
                       f"could not be compared (master hashed with {reference.algorithm}, "
                       f"{node.node} with {found.algorithm})",
                       fix=change("pip install xxhash in the training environment on every node, so all "
                                  "of them hash with xxh3_128"), details=details)
    return Verdict(Status.PASS, node.node,
                   f"{len(ours)} shards, {_size(found.total_bytes)}, identical to master",
                   details=details)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown if len(names) <= SHOWN else f"{shown} and {len(names) - SHOWN} more"


def _rsync_fix(ctx: Context, node: NodeFacts, data_dir: str) -> Fix:
    """Pulls the master's folder into the node's own (`data_dir`; they differ where the config
    gives a node its own); --delete drops shards the master does not have. The master's address
    as the workers dial it, since the node has to reach it."""
    source = ctx.options.master_addr or ctx.master.node
    origin = (ctx.options.data_dir_of(ctx.master.node) or data_dir).rstrip("/") or "/"
    folder = data_dir.rstrip("/") or "/"
    return run(f"run on {node.node}: rsync -a --delete {shlex.quote(f'{source}:{origin}/')} "
               f"{_shell_path(folder + '/')}", node.node)


def _unreadable_fix(data_dir: str) -> Fix:
    return run(f"check that {data_dir} is the training data folder and readable: "
               f"ls -la {_shell_path(data_dir)}")


def _shell_path(path: str) -> str:
    # A leading ~/ stays unquoted so the shell still expands it.
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def _size(count: int) -> str:   # count in bytes
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
