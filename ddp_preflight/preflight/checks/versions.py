"""torch-parity, python-parity, code-parity: the same software on every node."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from ddp_preflight.rules.facts import CodeFacts, Missing, TorchFacts
from ddp_preflight.rules.fix import change, on_node
from ddp_preflight.rules.torch_install import wanted_torch

from ..model import Context, Status, Verdict
from .common import python_of


def _torch_label(t: TorchFacts) -> str:
    return f"torch {t.version} ({t.build}{', CUDA ' + t.cuda if t.cuda else ''})"


def _short(git_version: str | None) -> str:
    return (git_version or "?")[:10]


def check_torch_parity(ctx: Context) -> Iterator[Verdict]:
    master = ctx.master.parsed.torch
    for node in ctx.reachable:
        torch = node.parsed.torch
        if isinstance(torch, Missing):
            yield Verdict(Status.FAIL, node.node, f"{node.node}: {torch.reason}",
                          on_node(node.node, f"{python_of(node)} -m pip install {wanted_torch(master, torch)}"),
                          {"python": python_of(node)})
            continue
        if node is ctx.master:
            yield Verdict(Status.PASS, node.node, _torch_label(torch),
                          details={"version": torch.version, "git_version": torch.git_version})
            continue
        if isinstance(master, Missing):
            yield Verdict(Status.SKIP, node.node, f"{_torch_label(torch)}; not compared: the master has no torch",
                          details={"version": torch.version, "git_version": torch.git_version})
            continue
        same_release = torch.version.split("+")[0] == master.version.split("+")[0]
        if not same_release:
            # Gloo/NCCL wire formats and the store protocol are only tested within one release.
            yield Verdict(Status.FAIL, node.node,
                          f"{node.node} has {_torch_label(torch)}, the master {_torch_label(master)}",
                          on_node(node.node, f"{python_of(node)} -m pip install {wanted_torch(master, torch)}"),
                          {"version": torch.version, "master_version": master.version})
        elif torch.git_version != master.git_version:
            yield Verdict(Status.WARN, node.node,
                          f"{node.node}: same torch release, different build "
                          f"({_short(torch.git_version)} vs {_short(master.git_version)})",
                          change(f"install the same wheel on every node ({master.version})"),
                          {"git_version": torch.git_version, "master_git_version": master.git_version})
        elif (torch.build, torch.cuda) != (master.build, master.cuda):
            # The +cpu and +cuXXX wheels of one release share their git_version.
            yield Verdict(Status.WARN, node.node,
                          f"{node.node}: same torch release, different build "
                          f"({_torch_label(torch)} vs the master's {_torch_label(master)})",
                          change(f"install the same wheel on every node ({master.version})"),
                          {"version": torch.version, "master_version": master.version})
        else:
            yield Verdict(Status.PASS, node.node, f"{_torch_label(torch)}, same as the master",
                          details={"version": torch.version, "git_version": torch.git_version})


def check_python_parity(ctx: Context) -> Iterator[Verdict]:
    master_python = ctx.master.parsed.python
    master = None if isinstance(master_python, Missing) else master_python.version
    for node in ctx.reachable:
        python = node.parsed.python
        if isinstance(python, Missing):
            yield Verdict(Status.ERROR, node.node, f"{node.node}: no Python version was collected")
            continue
        version = python.version
        if master is None:
            yield Verdict(Status.SKIP, node.node,
                          f"Python {version}; not compared: no Python version from the master ({ctx.master.node})")
            continue
        if version == master:
            yield Verdict(Status.PASS, node.node, f"Python {version}" + ("" if node is ctx.master else ", same as the master"))
            continue
        # Object collectives pickle across nodes; torch wheels are built per minor version.
        minor_differs = version.split(".")[:2] != master.split(".")[:2]
        fix = change(f"on {node.node}, make the training environment with Python {master} "
                     f"(uv venv --python {master}, or pyenv install {master}) and reinstall torch", node.node)
        yield Verdict(Status.FAIL if minor_differs else Status.WARN, node.node,
                      f"{node.node} runs Python {version}, the master {master}", fix,
                      {"version": version, "master_version": master})


def _code_label(code: CodeFacts) -> str:
    if code.git:
        label = f"git {str(code.commit)[:10]}" + (f" + {code.changed_count} uncommitted changes" if code.dirty else "")
    else:
        label = f"source tree {code.tree_hash}"
    if code.skipped:        # a FIFO put among the sources: named, never waited on
        named = [f"{name} ({why})" for name, why in sorted(code.skipped.items())]
        label += "; not read: " + ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    return label


def _code_key(code: CodeFacts) -> tuple:
    if code.git:
        return ("git", code.commit, code.changes_hash)
    return ("tree", code.tree_hash)


def check_code_parity(ctx: Context) -> Iterator[Verdict]:
    codes = {node.node: node.parsed.code for node in ctx.reachable}
    # A code section that failed still says a folder was given; none at all says none was.
    if all(isinstance(c, Missing) and not c.failed for c in codes.values()):
        yield Verdict(Status.SKIP, None, "no training code given",
                      change("pass --code-dir PATH, or the training command after --"))
        return
    master = ctx.master.parsed.code
    master_folder = master.dir if isinstance(master, CodeFacts) else master.path
    for node in ctx.reachable:
        code = codes[node.node]
        # The node's own folder (--code-dir NODE:PATH, [nodes.NAME] code_dir): where its launch
        # starts, so the copy goes there, from wherever the master keeps it.
        folder = (code.dir if isinstance(code, CodeFacts) else code.path) or master_folder or "?"
        origin = master_folder or folder
        # From the master's address as the workers dial it: the ssh alias is known on this machine only.
        source = ctx.options.master_addr or ctx.master.node
        sync = on_node(node.node, f"rsync -a --delete {source}:{shlex.quote(origin)}/ {shlex.quote(folder)}/")
        if isinstance(code, Missing):
            yield Verdict(Status.FAIL, node.node, f"{node.node}: {code.reason}", sync)
        elif node is ctx.master:
            yield Verdict(Status.PASS, node.node, _code_label(code), details=code.to_json())
        elif isinstance(master, Missing):
            yield Verdict(Status.SKIP, node.node, f"{_code_label(code)}; not compared: no code facts from the master",
                          details=code.to_json())
        elif _code_key(code) != _code_key(master):
            fix = sync
            if code.git and master.git and not master.dirty and not code.dirty:
                fix = on_node(node.node, f"git -C {shlex.quote(code.dir)} fetch && "
                                         f"git -C {shlex.quote(code.dir)} checkout {master.commit}")
            yield Verdict(Status.FAIL, node.node,
                          f"{node.node} has {_code_label(code)}, the master {_code_label(master)}",
                          fix, {"node": code.to_json(), "master": master.to_json()})
        else:
            yield Verdict(Status.PASS, node.node, f"{_code_label(code)}, same as the master", details=code.to_json())
