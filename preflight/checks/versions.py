"""torch-parity, python-parity, code-parity: the same software on every node."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from ..model import Context, Result, Status
from .common import on_node, python_of


def _torch_label(t: dict) -> str:
    return f"torch {t['version']} ({t['build']}{', CUDA ' + t['cuda'] if t.get('cuda') else ''})"


def _wanted_torch(master: dict | None) -> str:
    """pip's arguments for the master's torch release, and which build to take: plain `torch==X`
    is the CUDA build on Linux, so a +cpu or +cuXXX build comes from PyTorch's index for it."""
    if master is None:
        return "torch"
    release, _, build = master["version"].partition("+")
    return f"torch=={release}" + (f"  # the {build} build: from the PyTorch {build} wheel index" if build else "")


def check_torch_parity(ctx: Context) -> Iterator[Result]:
    ID = "torch-parity"
    master = ctx.master.section("torch")
    for node in ctx.reachable:
        torch = node.section("torch")
        if torch is None:
            reason = node.section_error("torch")
            yield Result(ID, Status.FAIL, node.node, f"{node.node}: {reason}",
                         on_node(node.node, f"{python_of(node)} -m pip install {_wanted_torch(master)}"),
                         {"python": python_of(node)})
            continue
        if node is ctx.master:
            yield Result(ID, Status.PASS, node.node, _torch_label(torch),
                         details={"version": torch["version"], "git_version": torch.get("git_version")})
            continue
        if master is None:
            yield Result(ID, Status.SKIP, node.node, f"{_torch_label(torch)}; not compared: the master has no torch",
                         details={"version": torch["version"], "git_version": torch.get("git_version")})
            continue
        same_release = torch["version"].split("+")[0] == master["version"].split("+")[0]
        if not same_release:
            # Gloo/NCCL wire formats and the store protocol are only tested within one release.
            yield Result(ID, Status.FAIL, node.node,
                         f"{node.node} has {_torch_label(torch)}, the master {_torch_label(master)}",
                         on_node(node.node, f"{python_of(node)} -m pip install {_wanted_torch(master)}"),
                         {"version": torch["version"], "master_version": master["version"]})
        elif torch.get("git_version") != master.get("git_version"):
            yield Result(ID, Status.WARN, node.node,
                         f"{node.node}: same torch release, different build "
                         f"({torch.get('git_version', '?')[:10]} vs {master.get('git_version', '?')[:10]})",
                         f"install the same wheel on every node ({master['version']})",
                         {"git_version": torch.get("git_version"), "master_git_version": master.get("git_version")})
        elif (torch.get("build"), torch.get("cuda")) != (master.get("build"), master.get("cuda")):
            # The +cpu and +cuXXX wheels of one release share their git_version.
            yield Result(ID, Status.WARN, node.node,
                         f"{node.node}: same torch release, different build "
                         f"({_torch_label(torch)} vs the master's {_torch_label(master)})",
                         f"install the same wheel on every node ({master['version']})",
                         {"version": torch["version"], "master_version": master["version"]})
        else:
            yield Result(ID, Status.PASS, node.node, f"{_torch_label(torch)}, same as the master",
                         details={"version": torch["version"], "git_version": torch.get("git_version")})


def check_python_parity(ctx: Context) -> Iterator[Result]:
    ID = "python-parity"
    master = (ctx.master.section("python") or {}).get("version")
    for node in ctx.reachable:
        version = (node.section("python") or {}).get("version")
        if version is None:
            yield Result(ID, Status.ERROR, node.node, f"{node.node}: no Python version was collected")
            continue
        if master is None:
            yield Result(ID, Status.SKIP, node.node,
                         f"Python {version}; not compared: no Python version from the master ({ctx.master.node})")
            continue
        if version == master:
            yield Result(ID, Status.PASS, node.node, f"Python {version}" + ("" if node is ctx.master else ", same as the master"))
            continue
        # Object collectives pickle across nodes; torch wheels are built per minor version.
        minor_differs = version.split(".")[:2] != master.split(".")[:2]
        fix = (f"on {node.node}, make the training environment with Python {master} "
               f"(uv venv --python {master}, or pyenv install {master}) and reinstall torch")
        yield Result(ID, Status.FAIL if minor_differs else Status.WARN, node.node,
                     f"{node.node} runs Python {version}, the master {master}", fix,
                     {"version": version, "master_version": master})


def _code_label(code: dict) -> str:
    if code.get("git"):
        return f"git {str(code.get('commit'))[:10]}" + (f" + {code['changed_count']} uncommitted changes" if code.get("dirty") else "")
    return f"source tree {code.get('tree_hash')}"


def _code_key(code: dict) -> tuple:
    if code.get("git"):
        return ("git", code.get("commit"), code.get("changes_hash"))
    return ("tree", code.get("tree_hash"))


def check_code_parity(ctx: Context) -> Iterator[Result]:
    ID = "code-parity"
    if not any("code" in n.facts for n in ctx.reachable):
        yield Result(ID, Status.SKIP, None, "no training code given",
                     "pass --code-dir PATH, or the training command after --")
        return
    master = ctx.master.section("code")
    for node in ctx.reachable:
        code = node.section("code")
        folder = (master or {}).get("dir") or (node.facts.get("code") or {}).get("dir", "?")
        # From the master's address as the workers dial it: the ssh alias is known on this machine only.
        source = ctx.options.master_addr or ctx.master.node
        sync = on_node(node.node, f"rsync -a --delete {source}:{shlex.quote(folder)}/ {shlex.quote(folder)}/")
        if code is None:
            yield Result(ID, Status.FAIL, node.node, f"{node.node}: {node.section_error('code')}", sync)
        elif node is ctx.master:
            yield Result(ID, Status.PASS, node.node, _code_label(code), details=dict(code))
        elif master is None:
            yield Result(ID, Status.SKIP, node.node, f"{_code_label(code)}; not compared: no code facts from the master",
                         details=dict(code))
        elif _code_key(code) != _code_key(master):
            fix = sync
            if code.get("git") and master.get("git") and not master.get("dirty") and not code.get("dirty"):
                fix = on_node(node.node, f"git -C {shlex.quote(code['dir'])} fetch && "
                                         f"git -C {shlex.quote(code['dir'])} checkout {master['commit']}")
            yield Result(ID, Status.FAIL, node.node,
                         f"{node.node} has {_code_label(code)}, the master {_code_label(master)}",
                         fix, {"node": dict(code), "master": dict(master)})
        else:
            yield Result(ID, Status.PASS, node.node, f"{_code_label(code)}, same as the master", details=dict(code))
