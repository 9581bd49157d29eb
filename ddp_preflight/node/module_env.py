"""Variables that name a module rather than a path: which file the ranks would import for it, and
whether another user could change that file. Standard library only, Python 3.8+.

CPython (3.8 to 3.13) imports a module named by its environment in three places:
PYTHONBREAKPOINT (`pkg.mod.func`: pkg.mod is imported at breakpoint()), PYTHONWARNINGS (a
filter's category `mod.Class`: mod is imported as the interpreter starts, in torchrun and every
rank) and PYTHON_PRESITE (3.13, `mod` or `mod:func`, imported before site). A name says nothing
of who wrote the module; where it is found does. So the name is looked up as the rank's import
would: built in or frozen (the interpreter's own), else along the rank's sys.path (the script's
folder first, then PYTHONPATH, then the training Python's own path and site), package by package,
and every file and folder that import reads (each package's folder and __init__, the module, its
cached .pyc) is walked like PYTHONPATH's folders (trust.walk). A name found nowhere imports
nothing: what could be put there later is judged with the folders of sys.path themselves."""

from __future__ import annotations

import os
import sys
from importlib.machinery import FrozenImporter, PathFinder
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple

from .trust import Refusal, package_root, path_entries, walk

MODULE_VARIABLES = ("PYTHONBREAKPOINT", "PYTHONWARNINGS", "PYTHON_PRESITE")


def modules_named(name: str, value: str) -> List[str]:
    """The modules variable `name` = `value` makes Python import, as CPython parses it."""
    value = value.strip()
    if name == "PYTHONBREAKPOINT":          # sys.breakpointhook: "0" is off; no dot is builtins
        module, dot, _ = value.rpartition(".")
        return [module] if dot and value != "0" else []
    if name == "PYTHON_PRESITE":
        return [value.partition(":")[0].strip()] if value else []
    if name == "PYTHONWARNINGS":            # action:message:category:module:lineno, comma-separated
        out = []
        for field in value.split(","):
            parts = field.split(":")
            category = parts[2].strip() if len(parts) > 2 else ""
            if "." in category:
                out.append(category.rpartition(".")[0])
        return list(dict.fromkeys(out))
    return []


def _interpreters_own(name: str) -> bool:
    top = name.partition(".")[0]
    return top in sys.builtin_module_names or FrozenImporter.find_spec(top) is not None


def read_by_import(module: str, search: Sequence[str]) -> Iterator[str]:
    """Every file and folder that `import module` reads when sys.path is `search`, package by
    package; nothing for a module of the interpreter's own or one found nowhere."""
    if _interpreters_own(module):
        return
    path: Optional[List[str]] = list(search)
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        if not all(part.isidentifier() for part in parts[:depth]):
            return
        try:
            spec = PathFinder.find_spec(".".join(parts[:depth]), path)
        except (ImportError, ValueError, OSError):
            return
        if spec is None:
            return
        for where in list(spec.submodule_search_locations or []) + [spec.origin, spec.cached]:
            if where and os.path.isabs(where) and os.path.lexists(where):
                yield where
        path = list(spec.submodule_search_locations or [])
        if not path:
            return


def rank_path(env: Mapping[str, str], first: str, cwd: str) -> List[str]:
    """sys.path as a rank started in `cwd` with `env` has it: its script's folder (`first`), the
    PYTHONPATH folders, then this training Python's own (without this package's zip)."""
    own = [p for p in sys.path if p and p != package_root() and os.path.isabs(p)]
    return list(dict.fromkeys([first] + path_entries(env, "PYTHONPATH", cwd) + own))


def module_refusal(env: Mapping[str, str], first: str, cwd: str) -> Optional[Tuple[str, str, str, Refusal]]:
    """(the variable, the module, the file or folder the ranks would import it from, why) for the first module a
    variable of `env` names that another user could change where the rank would import it from;
    None when every one is the interpreter's own, trusted, or found nowhere."""
    search = None
    for name in MODULE_VARIABLES:
        for module in modules_named(name, env.get(name) or ""):
            search = search if search is not None else rank_path(env, first, cwd)
            for where in read_by_import(module, search):
                refused = walk(where)
                if refused is not None:
                    return name, module, where, refused
    return None
