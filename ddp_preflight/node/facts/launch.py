"""How this node's torchrun parses the training command: its own parser, its own version.

`import torch.distributed.run` costs seconds (torch itself, then the elastic agent): the facts
stage does not pay it. torchrun's parser is built from its own file instead: the body of
`get_args_parser` in torch/distributed/run.py, with the two argparse actions it uses from
torch/distributed/argparse_util.py (standard library only). An option's `choices` computed from
something else of torch's (the NUMA binding modes) is left out: only a wrong value of that option
would parse here and fail at the launch. Where the file is not of that shape, torch is imported
as before."""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import importlib.util
import io
import os

SOURCE_BYTES = 1 << 20     # run.py is some 40 kB; a FIFO or a huge file there is not torch's


def torchrun_parse(launch_args: list[str], nnodes: int, nproc_per_node: int) -> dict | None:
    if not launch_args:
        return None
    try:
        get_args_parser = _parser_factory()
    except ImportError as exc:
        return {"error": f"torchrun is not importable here ({exc})"}
    argv = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), *launch_args]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = get_args_parser().parse_args(argv)
    except SystemExit:
        message = [line for line in stderr.getvalue().splitlines() if "error:" in line]
        return {"parsed": False, "message": message[-1].split("error:", 1)[1].strip() if message
                else stderr.getvalue().strip()[-300:]}
    return {"parsed": True, "training_script": args.training_script,
            "training_script_args": list(args.training_script_args), "module": bool(args.module),
            "run_path": bool(args.run_path), "no_python": bool(args.no_python)}


_factory: list = []     # built once per process: the facts stage parses the command twice


def _parser_factory():
    """torchrun's `get_args_parser`, from its file where it can be, else by importing it."""
    if not _factory:
        _factory.append(_from_files() or _imported())
    return _factory[0]


def _imported():
    from torch.distributed.run import get_args_parser
    return get_args_parser


def _from_files():
    """get_args_parser built from torch's files without importing torch, or None."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'torch'")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "distributed")
    try:
        run = _read(os.path.join(folder, "run.py"))
        util = _read(os.path.join(folder, "argparse_util.py"))
    except (OSError, UnicodeDecodeError):
        return None
    if run is None or util is None or not _stdlib_only(util):
        return None
    helpers: dict = {"__name__": "torch.distributed.argparse_util"}
    try:
        exec(compile(util, "torch/distributed/argparse_util.py", "exec"), helpers)  # noqa: S102 - torch's own file
    except Exception:
        return None
    function = next((node for node in run.body if isinstance(node, ast.FunctionDef)
                     and node.name == "get_args_parser"), None)
    if function is None:
        return None
    known = {"ArgumentParser": argparse.ArgumentParser, "REMAINDER": argparse.REMAINDER,
             **{name: helpers[name] for name in ("env", "check_env") if name in helpers}}
    if not _without_foreign_choices(function, set(known)):
        return None
    namespace: dict = {"__name__": "torch.distributed.run", **known}
    try:
        exec(compile(ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[])),  # noqa: S102
                     "torch/distributed/run.py", "exec"), namespace)
        namespace["get_args_parser"]()      # a name it still lacks shows here, not at the parse
    except Exception:
        return None
    return namespace["get_args_parser"]


def _read(path: str):
    if not os.path.isfile(path) or os.path.getsize(path) > SOURCE_BYTES:
        return None
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


def _stdlib_only(tree) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return False
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "torch"):
            return False
    return True


def _without_foreign_choices(function, known: set) -> bool:
    """Drops every `choices=` that needs a name from elsewhere in torch (the option then takes any
    value); False when such a name is needed for anything else."""
    bound = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {n.name for n in ast.walk(function) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    bound |= {a.arg for n in ast.walk(function) if isinstance(n, ast.arguments)
              for a in [*n.args, *n.kwonlyargs]}

    def foreign(node) -> set:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                and n.id not in bound and n.id not in known and not hasattr(builtins, n.id)}

    for call in ast.walk(function):
        if isinstance(call, ast.Call):
            call.keywords = [k for k in call.keywords if not (k.arg == "choices" and foreign(k.value))]
    return not foreign(function)
