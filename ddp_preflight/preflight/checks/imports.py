"""training-imports: on every node, the training Python has torch and finds every module the
training command imports at start-up, resolved from where the launch will start (nothing of the
user's run). Without it the launch dies on its first line: `ModuleNotFoundError: No module named
'wandb'`, after a preflight that checked its own interpreter."""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterator

from ddp_preflight.rules.facts import Missing, MissingImport, TrainingImports
from ddp_preflight.rules.fix import Action, Fix, change

from ..model import Context, Status, Verdict

# Where the module's name is not the name pip installs it by (and no node has it to ask).
PIP_NAMES = {"yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn", "cv2": "opencv-python",
             "bs4": "beautifulsoup4", "dateutil": "python-dateutil", "attr": "attrs", "dotenv": "python-dotenv",
             "skimage": "scikit-image", "Crypto": "pycryptodome", "jwt": "PyJWT", "serial": "pyserial",
             "git": "GitPython", "fitz": "PyMuPDF", "docx": "python-docx", "google": "protobuf"}
SHOWN = 5                    # modules named in a summary; the rest is a count
TORCH = MissingImport("torch", "torchrun", 0)     # torchrun itself runs in the training Python


def check_training_imports(ctx: Context) -> Iterator[Verdict]:
    if not ctx.options.launch_args:
        yield Verdict(Status.SKIP, None, "no training command given (put it after --): nothing to import")
        return
    scans = {n.node: n.parsed.imports for n in ctx.reachable}
    # What the other nodes know: the project's own modules (where they are) and pip's names.
    own: dict[str, tuple[str, str, str]] = {}        # top-level module -> (node, file, that node's folder)
    pip: dict[str, str] = {}
    for name, found in scans.items():
        if isinstance(found, TrainingImports):
            for top, file in [*found.own.items(), *found.pythonpath.items()]:
                own.setdefault(top, (name, file, found.root or ""))
            for top, dist in found.distributions.items():
                pip.setdefault(top, dist)
    for name, found in scans.items():
        if isinstance(found, Missing):
            if found.failed:
                yield Verdict(Status.ERROR, name,
                              f"{name}: the training command's imports were not resolved: {found.reason}")
            else:       # a collector (or a recording) from before this check
                yield Verdict(Status.SKIP, name, f"{name}: not checked: {found.reason}")
            continue
        details = found.to_json()
        if found.skipped:
            yield Verdict(Status.SKIP, name, f"{name}: {found.skipped}", None, details)
            continue
        if found.entry_error:
            yield Verdict(Status.FAIL, name, f"{name}: {found.entry_error}", _copy_code(ctx, name, found), details)
            continue
        if found.syntax_error:
            where = found.syntax_error.split(": ", 1)[0]
            yield Verdict(Status.FAIL, name, f"{name}: {found.python} cannot compile {found.syntax_error}: the "
                          "training would stop there before its first step", change(f"fix the syntax at {where}", name),
                          details)
            continue
        missing = ([] if found.torch else [TORCH]) + [m for m in found.missing if m.top != "torch" or found.torch]
        optional = sorted({m.top for m in found.optional_missing})
        if not missing:
            extra = f"; optional, not there: {', '.join(optional)}" if optional else ""
            yield Verdict(Status.PASS, name,
                          f"{found.python} has torch and finds all {len(found.external)} installed and "
                          f"{len(found.own)} own top-level modules of {found.entry} ({len(found.files)} files read)"
                          + extra, None, details)
            continue
        theirs = [m for m in missing if m.top in own and own[m.top][0] != name]
        installable = [m for m in missing if m not in theirs]
        words = ", ".join(_where(m) for m in missing[:SHOWN]) + \
            (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")
        summary = f"{found.python} on {name} cannot import {words}"
        if optional:
            summary += f" (optional, not there either: {', '.join(optional)})"
        fixes = []
        if installable:
            names = sorted({pip.get(m.top) or PIP_NAMES.get(m.top) or m.top for m in installable})
            fixes.append(f"{name}: {shlex.quote(found.python)} -m pip install {' '.join(names)}")
            if name not in ctx.options.pythons:
                # Not named by --python or the config: ddp-preflight's own interpreter was used.
                fixes.append(f"or --python {name}:PATH if {found.python} (ddp-preflight's own) is not the training's")
        in_tree = sorted({m.top for m in theirs if not own[m.top][1].startswith("/")})
        for top in in_tree:
            node, file, root = own[top]
            where = (root.rstrip("/") or "/") + "/"
            fixes.append(f"{top} is the project's own ({file} on {node}): copy the training code to {name}: "
                         f"run on {name}: rsync -a {shlex.quote(f'{node}:{where}')} {shlex.quote(found.root or where)}/")
        # Found on the other node outside its start folder: through the training's PYTHONPATH
        # there. Copying the project would not bring it; that folder and the variable would.
        folders: dict[tuple[str, str], list[str]] = {}
        for top in sorted({m.top for m in theirs} - set(in_tree)):
            node, file, _ = own[top]
            folders.setdefault((node, _path_folder(file)), []).append(top)
        for (node, folder), tops in folders.items():
            fixes.append(f"{', '.join(tops)} {'is' if len(tops) == 1 else 'are'} found on {node} through the "
                         f"training's PYTHONPATH ({folder}): run on {name}: rsync -a "
                         f"{shlex.quote(f'{node}:{folder}/')} {shlex.quote(folder)}/ and give {name} the same "
                         f"PYTHONPATH (--env {name}:PYTHONPATH={shlex.quote(folder)})")
        yield Verdict(Status.FAIL, name, summary, Fix(Action.RUN, tuple(fixes), name),
                      {**details, "cannot_import": [m.module for m in missing]})


def _copy_code(ctx: Context, name: str, found: TrainingImports) -> Fix:
    """The entry is not where this node's launch starts: copy the master's code into this node's
    own folder (its --code-dir NODE:PATH, where it has one), or name the folder it is in. Not on
    the master itself, where the code is read from: there the command names what is not there
    (a name mistyped, or run from another folder), and there is no copy to make."""
    master = ctx.master.parsed.imports
    elsewhere = f"or give {name}'s own folder: --code-dir {name}:PATH"
    if name == ctx.master.node:
        what = "module" if found.module else "script"
        return change(f"correct the training command's {what} name, or run ddp-preflight from the "
                      "folder that holds it, or give that folder: --code-dir PATH", name)
    if not isinstance(master, TrainingImports) or master.entry_error or not master.root or not found.root:
        return change("copy the training code to the same path, " + elsewhere, name)
    source = f"{ctx.master.node}:{master.root.rstrip('/') or '/'}/"
    return Fix(Action.RUN, (f"copy the training code to {name}: run on {name}: rsync -a {shlex.quote(source)} "
                            f"{shlex.quote(found.root.rstrip('/') or '/')}/", elsewhere), name)


def _path_folder(file: str) -> str:
    """The sys.path folder a top-level module was found in: its file's folder (a module), or the
    one above its package (`/x/deps/wandb/__init__.py`, a namespace package's `/x/deps/wandb/`)."""
    path = file.rstrip("/")
    if file.endswith("/") or path.endswith("/__init__.py"):
        path = posixpath.dirname(path)
    return posixpath.dirname(path) or "/"


def _where(m: MissingImport) -> str:
    return "torch (torchrun runs in it)" if m is TORCH else f"{m.module} ({m.file}:{m.line})"
