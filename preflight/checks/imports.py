"""training-imports: on every node, the training Python has torch and finds every module the
training command imports at start-up, resolved from where the launch will start (nothing of the
user's run). Without it the launch dies on its first line: `ModuleNotFoundError: No module named
'wandb'`, after a preflight that checked its own interpreter."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from rules.facts import Missing, MissingImport, TrainingImports
from rules.fix import Action, Fix, change

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
            for top, file in found.own.items():
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
            yield Verdict(Status.FAIL, name, f"{name}: {found.entry_error}",
                          change("copy the training code to the same path, or set code_dir for this node in --config",
                                 name), details)
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
                fixes.append(f"or --python PATH if {found.python} (ddp-preflight's own) is not the training's")
        for top in sorted({m.top for m in theirs}):
            node, file, root = own[top]
            where = (root.rstrip("/") or "/") + "/"
            fixes.append(f"{top} is the project's own ({file} on {node}): copy the training code to {name}: "
                         f"run on {name}: rsync -a {shlex.quote(f'{node}:{where}')} {shlex.quote(found.root or where)}/")
        yield Verdict(Status.FAIL, name, summary, Fix(Action.RUN, tuple(fixes), name),
                      {**details, "cannot_import": [m.module for m in missing]})


def _where(m: MissingImport) -> str:
    return "torch (torchrun runs in it)" if m is TORCH else f"{m.module} ({m.file}:{m.line})"
