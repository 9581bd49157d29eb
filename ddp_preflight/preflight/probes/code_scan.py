"""--scan, and under --launch the training command's own files: which torch.distributed calls the
training code makes and how (blocking, async, asking for a future), and where it creates its
process group and under which condition. A plain AST scan on this machine: nothing is run, each
file is read bounded (node/bounded.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from ddp_preflight.node.bounded import Skipped, read_regular
from ddp_preflight.rules.facts import TrainingImports

# Which torch.distributed calls the training code makes, and how.
CALLS = {
    "all_reduce": "all_reduce_sum", "reduce_scatter_tensor": "reduce_scatter_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter": "reduce_scatter",
    "all_gather_into_tensor": "all_gather_into_tensor", "_all_gather_base": "all_gather_into_tensor",
    "all_gather": "all_gather", "broadcast": "broadcast", "barrier": "barrier",
    "isend": "isend_irecv", "irecv": "isend_irecv", "send": "isend_irecv", "recv": "isend_irecv",
    "batch_isend_irecv": "isend_irecv", "all_to_all_single": "all_to_all_single",
}
ALWAYS_ASYNC = {"isend", "irecv", "batch_isend_irecv"}
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "site-packages", "node_modules", ".tox"}
MAX_FILES = 5000
SCAN_FILE_BYTES = 4 << 20     # one source file: a FIFO or a generated giant is named in "unreadable", not read


def scan(path: str) -> dict:
    """Every torch.distributed collective call in the .py files under path, with its mode."""
    root = Path(path).expanduser()
    if not root.exists():
        return {"path": path, "error": f"{path} does not exist", "sites": []}
    files = [root] if root.is_file() else sorted(
        f for f in root.rglob("*.py") if not SKIP_DIRS.intersection(f.relative_to(root).parts))
    return _scan(path, [(f.name if f == root else str(f.relative_to(root)), f) for f in files[:MAX_FILES]])


def scan_project(imports) -> dict | None:
    """The files the training command imports, as training-imports found them on the master
    (ddp_preflight.rules.facts.TrainingImports: each under its start folder, or an absolute path): the script
    and the project's own modules, read here as --scan reads a folder. None when there are none."""
    if not isinstance(imports, TrainingImports) or not imports.root or not imports.files:
        return None
    root = imports.root
    return _scan(root, [(f, Path(f if f.startswith("/") else f"{root}/{f}")) for f in imports.files])


def _scan(path: str, files: list[tuple[str, Path]]) -> dict:
    out: dict = {"path": path, "files": 0, "sites": [], "unreadable": [], "inits": []}
    parsed = []
    for name, f in files:
        try:
            text = read_regular(str(f), SCAN_FILE_BYTES).decode(errors="replace")
            tree = ast.parse(text)
        except Skipped as exc:
            out["unreadable"].append(f"{name}: {exc}")
            continue
        except (OSError, SyntaxError, ValueError) as exc:
            out["unreadable"].append(f"{name}: {type(exc).__name__}")
            continue
        out["files"] += 1
        parsed.append((name, tree, text.splitlines()))
    # Functions that take a Work and call .get_future() on it (seed 000's _async_op), in any file.
    shims: dict[str, bool] = {}
    for _, tree, _ in parsed:
        for function, guarded in _shims(tree).items():
            shims[function] = shims.get(function, True) and guarded
    out["shims"] = shims
    for name, tree, lines in parsed:
        for site in _sites(tree, shims):
            site.update(file=name, text=lines[site["line"] - 1].strip()[:160])
            out["sites"].append(site)
        for init in _inits(tree):
            init.update(file=name, text=lines[init["line"] - 1].strip()[:160])
            out["inits"].append(init)
        for pin in _pins(tree):
            pin.update(file=name, text="; ".join(lines[n - 1].strip() for n in range(pin["first_line"], pin["line"] + 1)
                                                   )[:240])
            out.setdefault("pins", []).append(pin)
    return out


def _aliases(tree: ast.AST) -> tuple[set[str], dict[str, str]]:
    """Names torch.distributed goes by in this file, and its functions imported bare."""
    modules, bare = {"dist", "torch.distributed"}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            modules |= {a.asname or a.name for a in node.names if a.name == "distributed"}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            bare.update({a.asname or a.name: a.name for a in node.names
                         if a.name in CALLS or a.name == "init_process_group"})
    return modules, bare


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _sites(tree: ast.AST, shims: dict[str, bool] | None = None) -> list[dict]:
    """Every collective call in the file with its mode; `shims`: functions (by name) that call
    .get_future() on the Work they are given, True where they fall back when it raises."""
    shims = shims or {}
    modules, bare = _aliases(tree)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    # Names whose .get_future() is called, per function: `work = dist.x(..., async_op=True)` then
    # `work.get_future()` is the seed's pattern as much as the chained form. Each name maps to
    # whether every such call is guarded (inside a try that catches the backend's RuntimeError).
    futures_in: dict[ast.AST | None, dict[str, bool]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "get_future" and isinstance(node.value, ast.Name):
            names = futures_in.setdefault(_scope(node, parents), {})
            names[node.value.id] = names.get(node.value.id, True) and _guarded(node, parents)
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func) or ""
        module, _, function = name.rpartition(".")
        if not module:
            function = bare.get(function, "")
        elif module not in modules:
            continue
        if function not in CALLS:
            continue
        op = CALLS[function]
        if op == "all_reduce_sum":
            op = _reduce_op(node)
        keyword = next((k.value for k in node.keywords if k.arg == "async_op"), None)
        is_async = function in ALWAYS_ASYNC or (
            keyword is not None and not (isinstance(keyword, ast.Constant) and keyword.value is False))
        parent = parents.get(node)
        target = parent.targets[0] if isinstance(parent, ast.Assign) and len(parent.targets) == 1 else None
        futures = futures_in.get(_scope(node, parents), {})
        shim = None
        if isinstance(parent, ast.Attribute) and parent.attr == "get_future":
            future, wrapped = True, _guarded(parent, parents)
        elif isinstance(target, ast.Name) and target.id in futures:
            future, wrapped = True, futures[target.id]
        elif isinstance(parent, ast.Call) and node in parent.args and \
                (_dotted(parent.func) or "").rpartition(".")[2] in shims:
            # Handed straight to a function that asks the Work for its future (seed 000's shim).
            shim = (_dotted(parent.func) or "").rpartition(".")[2]
            future, wrapped = True, shims[shim]
        else:
            future, wrapped = False, False
        mode = "async_future" if is_async and future else "async_wait" if is_async else "sync"
        site = {"line": node.lineno, "call": name, "op": op, "mode": mode}
        if mode == "async_future" and wrapped:
            # Its future is asked for where a failure falls back (to work.wait()): it does not crash.
            site["wrapped"] = shim or "try/except"
        sites.append(site)
    return sorted(sites, key=lambda s: s["line"])


def _catches_runtime_error(handler: ast.ExceptHandler) -> bool:
    """Gloo's "Work::getFuture not implemented" is a RuntimeError."""
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((_dotted(k) or "").rpartition(".")[2] in ("RuntimeError", "Exception", "BaseException")
               for k in kinds)


def _guarded(node: ast.AST, parents: dict) -> bool:
    """Inside the body of a try (in its function) whose handlers catch a RuntimeError."""
    child = node
    while child in parents:
        parent = parents[child]
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(parent, ast.Try) and child in parent.body and any(
                _catches_runtime_error(h) for h in parent.handlers):
            return True
        child = parent
    return False


def _shims(tree: ast.AST) -> dict[str, bool]:
    """Functions that call .get_future() on one of their parameters: name -> every such call is
    guarded (the shim falls back when the backend has no future)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out: dict[str, bool] = {}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = {a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs}
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and node.attr == "get_future" and \
                    isinstance(node.value, ast.Name) and node.value.id in params and \
                    _scope(node, parents) is function:
                out[function.name] = out.get(function.name, True) and _guarded(node, parents)
    return out


def _inits(tree: ast.AST) -> list[dict]:
    """Every init_process_group call, and the CUDA condition it sits under, if any: nanochat's
    compute_init creates the group only `if is_ddp_requested and device_type == "cuda"`."""
    modules, bare = _aliases(tree)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func) or ""
        module, _, function = name.rpartition(".")
        if (function if module in modules else bare.get(name, "") if not module else "") != "init_process_group":
            continue
        init: dict = {"line": node.lineno, "call": name, "cuda_only": False}
        child: ast.AST = node
        while child in parents:
            parent = parents[child]
            if isinstance(parent, ast.If) and child in parent.body and _requires_cuda(parent.test):
                others = [v for v in (parent.test.values if isinstance(parent.test, ast.BoolOp) else [])
                          if not _requires_cuda(v)]
                init.update(cuda_only=True, guard=ast.unparse(parent.test), guard_line=parent.lineno,
                            statement_end=parent.end_lineno, column=parent.col_offset,
                            otherwise=[ast.unparse(v) for v in others])
                break
            child = parent
        out.append(init)
    return out


def _pins(tree: ast.AST) -> list[dict]:
    """Every torch.cuda.set_device call (the CUDA device a rank pins) and whether a CUDA condition
    guards it; with the assignment just before it in its block that makes its argument a CUDA
    device (`device = f"cuda:{local_rank}"`, as nanoGPT's train.py writes it), which a CPU run must
    skip too: `first_line` to `line`."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not (_dotted(node.func) or "").endswith("cuda.set_device"):
            continue
        guarded = False
        child: ast.AST = node
        while child in parents:
            parent = parents[child]
            if isinstance(parent, ast.If) and child in parent.body and _on_cuda(parent.test):
                guarded = True
                break
            child = parent
        statement = next((n for n in _ancestors(node, parents) if isinstance(n, ast.stmt)), None)
        first = statement.lineno if statement is not None else node.lineno
        block = _block_of(statement, parents) if statement is not None else []
        arg = node.args[0] if node.args else None
        if statement in block and isinstance(arg, ast.Name):
            before = block[:block.index(statement)]
            made = next((s for s in reversed(before) if isinstance(s, ast.Assign) and
                         any(isinstance(t, ast.Name) and t.id == arg.id for t in s.targets)), None)
            if made is not None and "cuda" in ast.unparse(made.value) and all(
                    not isinstance(s, (ast.If, ast.For, ast.While, ast.With, ast.Try)) for s in before[before.index(made):]):
                first = made.lineno
        out.append({"line": node.lineno, "first_line": first, "call": _dotted(node.func), "guarded": guarded,
                    "column": statement.col_offset if statement is not None else 0})
    return out


def _ancestors(node: ast.AST, parents: dict):
    yield node
    while node in parents:
        node = parents[node]
        yield node


def _block_of(statement: ast.stmt, parents: dict) -> list:
    """The statement list that holds `statement` (a body, an else, a handler's)."""
    parent = parents.get(statement)
    for field in ("body", "orelse", "finalbody", "handlers"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and statement in block:
            return block
    return []


def _on_cuda(test: ast.expr) -> bool:
    """A condition true only on a CUDA run: _requires_cuda's, `"cuda" in device`, `device.startswith("cuda")`."""
    if _requires_cuda(test):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In):
        return isinstance(test.left, ast.Constant) and test.left.value == "cuda"
    if isinstance(test, ast.Call) and (_dotted(test.func) or "").endswith("startswith"):
        return any(isinstance(a, ast.Constant) and a.value == "cuda" for a in test.args)
    return False


def _requires_cuda(test: ast.expr) -> bool:
    """`device_type == "cuda"`, `torch.cuda.is_available()`, or an `and` holding one."""
    if isinstance(test, ast.BoolOp):
        return isinstance(test.op, ast.And) and any(_requires_cuda(v) for v in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [test.left, *test.comparators]
        return any(isinstance(x, ast.Constant) and x.value == "cuda" for x in sides)
    if isinstance(test, ast.Call):
        return (_dotted(test.func) or "").endswith("cuda.is_available")
    return False


def _scope(node: ast.AST, parents: dict) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return node
    return None


def _reduce_op(call: ast.Call) -> str:
    """all_reduce's operation, from its op= (or second) argument, as the matrix names it."""
    arg = next((k.value for k in call.keywords if k.arg == "op"), call.args[1] if len(call.args) > 1 else None)
    text = ast.unparse(arg) if arg is not None else ""
    if "PREMUL_SUM" in text or "premul_sum" in text:
        return "all_reduce_premul_sum"
    return "all_reduce_avg" if text.endswith("AVG") else "all_reduce_sum"
