"""What the training command imports, and which of it this Python cannot find: run in a child
of the training Python, from the folder the launch starts in, with sys.path as the rank will have
it, so the project's own packages resolve as they will for the rank.

Nothing of the user's is run: each file is read with `ast`, and each name is found the way
`import` finds it without importing it (a top-level name with importlib.util.find_spec; a
submodule with the path finder over its package's folders, so no package's __init__ runs).

The imports followed are the entry's (the script, or the module and the packages `-m` imports
first) and those of the project's own modules it imports, at module level: a function's imports
run only when it is called. Followed are the modules found in the folder Python puts first (the
start folder for -m, the script's folder: the project's own, "own") or in a folder of the
training's PYTHONPATH ("pythonpath", counted as external too), never in site-packages:
nanochat's `python scripts/base_train.py` with PYTHONPATH=. imports nanochat/* from there.
A folder without __init__.py is a namespace package, which Python imports
(nanochat's scripts/ in `-m scripts.base_train`): it has no file of its own to read. An import
inside `try: ... except ImportError` (or ModuleNotFoundError, Exception, a bare except) is
optional; one under `if TYPE_CHECKING:` never runs.

The folder may be another user's: a file is read only when it is a regular one, and at most
FILE_BYTES of it (SOURCE_BYTES in all); a FIFO is named in "unreadable", never waited on.

Run as `python -c SOURCE` in the start folder with {"entry": PATH or MODULE, "module": bool} on
stdin; prints one JSON object. Standard library only, Python 3.8+, importable for its tests."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import json
import os
import stat
import sys

MAX_FILES = 500                  # project files followed; the rest are counted, not read
FILE_BYTES = 4 << 20             # one source file read: a larger one is a generated table, not parsed
SOURCE_BYTES = 64 << 20          # read in all
OPTIONAL_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
SITE_DIRS = ("site-packages", "dist-packages")


def find(name: str):
    """The spec `import name` would use, or None; never runs a package's code."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for at in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:at + 1]),
                                                            list(spec.submodule_search_locations))
        except (ImportError, ValueError):
            return None
    return spec


def _catches_import_errors(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = {k.id if isinstance(k, ast.Name) else k.attr if isinstance(k, ast.Attribute) else "" for k in kinds}
    return bool(names & OPTIONAL_ERRORS)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(tree: ast.Module, package: str | None):
    """(module name, line, optional, names imported from it) for each import that runs when the
    file is imported. `package`: the file's package, for relative imports (None: a script)."""
    out = []

    def visit(body, optional):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                out.extend((a.name, node.lineno, optional, ()) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.module == "__future__":
                    continue
                if node.level:
                    if not package:
                        continue        # a script's relative import fails whatever is installed
                    try:
                        base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                    except ImportError:
                        continue
                else:
                    base = node.module or ""
                out.append((base, node.lineno, optional, tuple(a.name for a in node.names if a.name != "*")))
            elif isinstance(node, ast.If):
                if not _type_checking(node.test):
                    visit(node.body, optional)
                visit(node.orelse, optional)
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                guarded = optional or any(_catches_import_errors(h) for h in node.handlers)
                visit(node.body, guarded)
                for handler in node.handlers:
                    visit(handler.body, guarded)
                visit(node.orelse, guarded)
                visit(node.finalbody, optional)
            elif isinstance(node, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)):
                visit(node.body, optional)
                visit(getattr(node, "orelse", []), optional)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, optional)      # a class body runs at import
    visit(tree.body, False)
    return out


def _inside(path: str, folders) -> bool:
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _own(origin: str | None, project) -> bool:
    """A file of the project itself: found in one of the project's folders (the one Python puts
    first, the training's PYTHONPATH), not an installed package."""
    if not origin or not origin.endswith(".py"):
        return False
    path = os.path.realpath(origin)
    return _inside(path, project) and not any(d in path.split(os.sep) for d in SITE_DIRS)


def _namespace(spec) -> bool:
    """A folder without __init__.py: Python imports it (a namespace package), and it has no file."""
    return spec is not None and not spec.origin and spec.submodule_search_locations is not None


def _own_label(spec, root: str, project) -> str | None:
    """Where a top-level module of the project lives (its file, or a namespace package's folder,
    relative to the start folder where it is under it); None: not the project's."""
    if _namespace(spec):
        where = [os.path.realpath(p) for p in spec.submodule_search_locations]
        if not where or not all(_inside(p, project) for p in where):
            return None
        return _label(where[0], root) + "/"
    if spec is None or not _own(spec.origin, project):
        return None
    return _label(os.path.realpath(spec.origin), root)


def _record(out: dict, top: str, where) -> None:
    """A top-level module followed: the project's own (under the start folder: `own`), or found
    in a folder of the training's PYTHONPATH (`pythonpath`, read all the same, and outside the
    project: counted with the `external` modules, as an installed one)."""
    if where is None:
        return
    if not where.startswith("/"):
        out["own"].setdefault(top, where)
        return
    out["pythonpath"].setdefault(top, where)
    if top not in out["external"]:
        out["external"].append(top)


def _label(real: str, root: str) -> str:
    return os.path.relpath(real, root) if real.startswith(root + os.sep) else real


def scan(entry: str, module: bool, root: str, path=()) -> dict:
    """`path`: the training's PYTHONPATH folders (the project's too, where its modules are found)."""
    root = os.path.realpath(root)
    project = [root] + [os.path.realpath(p) for p in path]
    out: dict = {"python": sys.executable, "entry": entry, "module": module, "root": root,
                 "files": [], "unreadable": [], "missing": [], "optional_missing": [], "own": {},
                 "pythonpath": {}, "external": [], "torch": find("torch") is not None}
    queue: list = []                 # (file, its module name or None, its package or None)
    if module:
        # `-m a.b.c` imports a and a.b (their __init__) before it runs a/b/c.py (or its __main__);
        # a namespace package among them has no __init__ to run.
        parts = entry.split(".")
        for at in range(1, len(parts) + 1):
            name = ".".join(parts[:at])
            spec = find(name)
            if spec is None or not (spec.origin or _namespace(spec)):
                out["entry_error"] = f"no module named {name!r} from {root}"
                return out
            if at == 1:
                _record(out, name, _own_label(spec, root, project))
            if _namespace(spec):
                continue
            if spec.submodule_search_locations is not None and spec.origin.endswith("__init__.py"):
                queue.append((spec.origin, name, name))
            else:
                queue.append((spec.origin, name, name.rpartition(".")[0] or None))
        spec = find(entry)
        if spec is not None and spec.submodule_search_locations is not None:
            main = find(entry + ".__main__")
            if main is None or not main.origin:
                out["entry_error"] = f"{entry} is a package without a __main__ module: it cannot be run with -m"
                return out
            queue.append((main.origin, entry + ".__main__", entry))
    else:
        if not os.path.isfile(entry):
            what = _not_regular(entry)
            out["entry_error"] = f"the script {entry} " + (f"is {what}" if what else "does not exist here")
            return out
        queue.append((entry, None, None))

    seen, reported = set(), set()
    budget = [SOURCE_BYTES]
    while queue:
        path, name, package = queue.pop(0)
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        label = _label(real, root)
        if len(out["files"]) >= MAX_FILES:
            out["not_followed"] = out.get("not_followed", 0) + 1
            continue
        try:
            tree = ast.parse(_read_source(real, budget), filename=real)
        except _NotRead as exc:
            out["unreadable"].append(f"{label}: {exc}")
            continue
        except SyntaxError as exc:
            # This Python cannot compile it: the training would stop there before its first step.
            out.setdefault("syntax_error", f"{label}:{exc.lineno or 0}: {exc.msg}")
            out["unreadable"].append(f"{label}: SyntaxError")
            continue
        except (OSError, ValueError) as exc:
            out["unreadable"].append(f"{label}: {type(exc).__name__}")
            continue
        out["files"].append(label)
        for wanted, line, optional, names in imports_of(tree, package):
            if not wanted:
                continue
            spec = find(wanted)
            if spec is None:
                if wanted not in reported:
                    reported.add(wanted)
                    key = "optional_missing" if optional else "missing"
                    out[key].append({"module": wanted, "file": label, "line": line})
                continue
            candidates = [(wanted, spec)]
            if spec.submodule_search_locations is not None:
                # `from package import x`: x is a submodule (followed) or a name in the package.
                for n in names:
                    sub = find(f"{wanted}.{n}")
                    if sub is not None:
                        candidates.append((f"{wanted}.{n}", sub))
            for full, found in candidates:
                if _own(found.origin, project):
                    parts = full.split(".")
                    _record(out, parts[0], _own_label(find(parts[0]), root, project))
                    # Importing a.b.c runs a's and a.b's __init__ first (a namespace package has none).
                    for at in range(1, len(parts)):
                        parent = ".".join(parts[:at])
                        parent_spec = find(parent)
                        if parent_spec is not None and _own(parent_spec.origin, project):
                            queue.append((parent_spec.origin, parent, parent))
                    is_package = found.submodule_search_locations is not None
                    queue.append((found.origin, full, full if is_package else full.rpartition(".")[0] or None))
                elif _namespace(found) and _own_label(found, root, project) is not None:
                    top = full.split(".")[0]            # the project's folder without __init__.py
                    _record(out, top, _own_label(find(top), root, project))
                else:
                    top = full.split(".")[0]
                    stdlib = top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ())
                    if not stdlib and top not in out["external"]:
                        out["external"].append(top)
    out["distributions"] = _distributions(out["external"], root)
    return out


class _NotRead(Exception):
    """A file not read, and why."""


def _read_source(path: str, budget: list) -> bytes:
    """A regular file's bytes (a real path: no link in it), bounded; _NotRead otherwise. The type
    is asked first and again once open (O_NONBLOCK: a FIFO swapped in opens at once)."""
    what = _not_regular(path)
    if what:
        raise _NotRead(what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotRead("not a regular file")
        if st.st_size > FILE_BYTES:
            raise _NotRead(f"over {FILE_BYTES >> 20} MiB ({st.st_size >> 20} MiB), not parsed")
        limit = min(FILE_BYTES, budget[0])
        if st.st_size > limit:
            raise _NotRead(f"not parsed: the scan has read {SOURCE_BYTES >> 20} MiB already")
        os.set_blocking(fd, True)
        data = os.read(fd, limit + 1)
        while len(data) <= limit:
            more = os.read(fd, limit + 1 - len(data))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _NotRead("it grew while read, not parsed")
    budget[0] -= len(data)
    return data


def _not_regular(path: str):
    """What the path is when it is there and not a regular file ("a FIFO"), else None."""
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
    return next((words for test, words in kinds if test(mode)), "not a regular file") + ", not a regular file"


def _distributions(tops, root):
    """The pip name of each installed top-level module, where the metadata says (3.10+). The
    installed ones only: metadata in the project's own folder (which may be another user's, with
    a FIFO for a METADATA file) is not read."""
    try:
        from importlib.metadata import packages_distributions
    except ImportError:
        return {}
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if os.path.realpath(p or ".") != root]
    try:
        known = packages_distributions()
    except Exception:   # a broken metadata file must not lose the scan
        return {}
    finally:
        sys.path[:] = saved
    return {top: known[top][0] for top in tops if known.get(top)}


def main() -> None:
    request = json.load(sys.stdin)
    entry, module = request["entry"], request["module"]
    # As `python SCRIPT` and `python -m MODULE` begin: the script's folder, or the start folder
    # (this process's), first on sys.path; the project is what lies under it.
    root = os.getcwd() if module else os.path.dirname(os.path.abspath(entry))
    try:
        import importlib.metadata  # noqa: F401  (its csv, email... from the interpreter, not the project)
    except ImportError:
        pass
    # The training's PYTHONSAFEPATH and PYTHONPATH come in the request: this Python was started
    # with -I (it ignores both, and its own sys.flags.safe_path is -I's).
    if request.get("safe_path"):
        pass                    # PYTHONSAFEPATH: the rank puts no folder first either
    elif sys.path and sys.path[0] == "":
        sys.path[0] = root      # `python -c` put the current folder there
    else:
        sys.path.insert(0, root)
    first = 0 if request.get("safe_path") else 1
    sys.path[first:first] = list(request.get("path") or [])     # walked by the caller
    print(json.dumps(scan(entry, module, root, list(request.get("path") or []))))


if __name__ == "__main__":
    main()
