"""What of an environment may reach a process this tool starts, as root or any user: one rule,
in the spirit of sudo's env_reset. Standard library only, Python 3.8+.

A variable that makes the dynamic loader, Python or a shell load, import or run something
(LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT and every other LD_*; PYTHONPATH, PYTHONHOME,
PYTHONUSERBASE, PYTHONPYCACHEPREFIX, PYTHONSTARTUP, PYTHONPLATLIBDIR, ...; BASH_ENV, ENV;
GCONV_PATH, LOCPATH; OPENSSL_CONF, OPENSSL_MODULES, ...) is allowed in the training's
environment only when every path it names, and every folder above it, belongs to root or this
user and no one else can write it (trust.walk, as for the Python itself). Otherwise `refusal`
says so in one line, with the fix; the job does not start.

The tool's own children (ip, nft, git, nvidia-smi, py-spy, the store reader) get no such
variable at all (`tool_env`), whatever the caller's environment holds."""

from __future__ import annotations

import os
import re
import sys
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

from .code_files import Bound, first_untrusted
from .module_env import module_refusal
from .trust import mode_words, user_name, walk


class Loads(NamedTuple):
    """How a variable names what it makes a process load: its entries are `noun`s (a folder, a
    file), split at `split` (a regular expression; "" for one path); a relative entry is under
    the start folder, an empty one that folder itself. Unless `bare`, an entry without a '/' is a
    name searched elsewhere (LD_PRELOAD=libfoo.so is looked up on the library path, itself
    judged) or no path at all (LD_BIND_NOW=1), and is not walked."""
    noun: str
    verb: str
    split: str = ":"
    bare: bool = True


_FOLDERS_IMPORT = Loads("folder", "import")
_FOLDER_IMPORT = Loads("folder", "import", split="")
_FILE_RUN = Loads("file", "run", split="")
_LIBS = Loads("file", "load", split=r"[:\s]", bare=False)
_FOLDERS_LOAD = Loads("folder", "load")

KNOWN: Dict[str, Loads] = {
    "PYTHONPATH": _FOLDERS_IMPORT,
    "PYTHONHOME": _FOLDERS_IMPORT,                  # PREFIX[:EXEC_PREFIX]
    "PYTHONUSERBASE": _FOLDER_IMPORT,
    "PYTHONPYCACHEPREFIX": _FOLDER_IMPORT,          # its .pyc files are imported in place of the source
    "PYTHONPLATLIBDIR": _FOLDER_IMPORT,             # under the prefix (see _entries)
    "PYTHONSTARTUP": _FILE_RUN,
    "PYTHONEXECUTABLE": _FILE_RUN,
    "BASH_ENV": _FILE_RUN,                          # sourced by every non-interactive bash
    "ENV": _FILE_RUN,                               # sourced by sh -i, and by bash in POSIX mode
    "LD_PRELOAD": _LIBS,
    "LD_AUDIT": _LIBS,
    "LD_LIBRARY_PATH": Loads("folder", "load", split=r"[:;]"),
    "GCONV_PATH": _FOLDERS_LOAD,                    # glibc's iconv modules: shared objects
    "LOCPATH": _FOLDERS_LOAD,
    "OPENSSL_CONF": Loads("file", "load", split=""),    # names engines and providers to load
    "OPENSSL_ENGINES": Loads("folder", "load", split=""),
    "OPENSSL_MODULES": Loads("folder", "load", split=""),
    "PERL5LIB": _FOLDERS_IMPORT,
    "PERLLIB": _FOLDERS_IMPORT,
    "GIT_EXEC_PATH": Loads("folder", "run", split=""),
}
# Every other variable of these families: each word in it that is a path (has a '/') is judged.
FAMILIES = ("LD_", "PYTHON", "GCONV", "OPENSSL_", "PERL5", "RUBY", "NODE_OPTIONS", "NODE_PATH", "BASH_FUNC_")
_ANY = Loads("path", "load", split=r"[:;,=\s]", bare=False)


_FUNCTION = Loads("path", "run", split="", bare=False)


def loads(name: str) -> Optional[Loads]:
    """How `name` makes a process load something; None for a variable that does not."""
    if name in KNOWN:
        return KNOWN[name]
    if name.startswith("BASH_FUNC_"):
        return _FUNCTION
    return _ANY if name.startswith(FAMILIES) else None


def function_words(body: str, env: Mapping[str, str]) -> List[str]:
    """The words of an exported bash function (BASH_FUNC_NAME%%, which every bash the ranks start
    defines, and runs where a script calls NAME) as bash would see them: quotes removed, $NAME and
    ${NAME} of this environment put in, split at the shell's operators and at `=`, `:` and
    backquotes, so that `"/x"`, `$(/x)`, `"$(/x y)"`, `a=/x` and `$TOOL` (TOOL=/x) all name /x."""
    import shlex
    expanded = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), m.group(0)), body)
    try:
        lexer = shlex.shlex(expanded, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:          # an unfinished quote: bash refuses it too; judge its words anyway
        words = expanded.split()
    # A quoted "$(cmd /x)" stays one word: split it again at what bash would split it at inside.
    return [piece for word in words for piece in re.split(r"[\s=:`$\"'(){};&|<>]", word) if piece]


def _entries(name: str, value: str, how: Loads, cwd: str, env: Mapping[str, str]) -> List[str]:
    """The paths `value` names, as the loader, Python or bash reads them when started in `cwd`."""
    words = function_words(value, env) if how is _FUNCTION else re.split(how.split, value) if how.split else [value]
    out: List[str] = []
    for word in words:
        if "/" not in word and not how.bare:
            continue                     # a name, not a path (or no path at all: LD_BIND_NOW=1)
        if name == "PYTHONPLATLIBDIR":
            out += [os.path.normpath(os.path.join(prefix, word)) for prefix in
                    dict.fromkeys([sys.base_prefix, sys.prefix])]
            continue
        out.append(os.path.normpath(os.path.join(cwd, word)))     # "" is cwd itself
    return list(dict.fromkeys(out))


def refusal(env: Mapping[str, str], cwd: str, first: Optional[str] = None) -> Optional[Tuple[str, str]]:
    """(why, fix) when a variable of `env` would make a process started in `cwd` (its script in
    `first`, first on sys.path) load, import or run something another user owns or can write;
    None when none does. PYTHONPATH's words are those the import scan and the launch have always
    said. A variable that names a module is judged by where the rank would import it from
    (node/module_env.py)."""
    me = user_name(os.geteuid())
    who = "root" if os.geteuid() == 0 else f"root or {me}"
    for name in sorted(env, key=lambda n: (n not in KNOWN, n)):
        how = loads(name)
        value = env.get(name) or ""
        if how is None or not value:
            continue
        for path in _entries(name, value, how, cwd, env):
            refused = walk(path)
            if refused is None and name == "PYTHONPATH" and os.path.isdir(path):
                below = _imported_refusal(path, f"PYTHONPATH folder {path}")    # what the ranks import from it
                if below is not None:
                    return below
            if refused is None:
                continue
            if refused.why == "owner":
                why = f"belongs to {refused.owner()} (uid {refused.uid})"
            else:
                why = f"is writable by other users (mode {mode_words(refused.mode)})"
            said = why if refused.path == path else f"is refused: {refused.path} {why}"
            return (f"the training's {name} {how.noun} {path} {said}, who could change what the ranks "
                    f"{how.verb} as {me}"), f"give {name} only {how.noun}s that {who} alone can change, or leave it out"
    named = module_refusal(env, first or cwd, cwd)
    if named is None:
        return None
    name, module, where, refused = named
    said = _said(refused) if refused.path == where else f"is refused: {refused.path} {_said(refused)}"
    return (f"the training's {name} names the module {module}, imported from {where}, which {said}, who could "
            f"change what the ranks import as {me}",
            f"{fix_command(refused)}, or give {name} only modules that {who} alone can change, or leave it out")


# What a command of the tool's own never gets: every variable that loads, imports or runs
# something (loads()), and those that make git, a shell or the resolver read a file or run a
# command (GIT_CONFIG_*, core.fsmonitor in $XDG_CONFIG_HOME/git/config, BASH_FUNC_*, PS4, ...).
DROPPED = frozenset(KNOWN) | {"IFS", "CDPATH", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "HOSTALIASES",
                              "NLSPATH", "RES_OPTIONS", "LOCALDOMAIN", "PAGER", "EDITOR", "VISUAL",
                              "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "XDG_DATA_HOME", "XDG_CACHE_HOME"}
DROPPED_FAMILIES = FAMILIES + ("GIT_", "BASH_", "MALLOC_", "GLIBC_TUNABLES")


def tool_env(env: Optional[Mapping[str, str]] = None, **extra: str) -> Dict[str, str]:
    """The environment of a command the tool runs for itself (ip, git, nvidia-smi, py-spy, the
    store reader), whoever called it: without any variable that loads or runs something (DROPPED),
    PATH's absolute folders only (an empty or relative entry is the caller's folder), HOME from
    the password database (never the caller's HOME), then `extra`."""
    import pwd
    env = os.environ if env is None else env
    out = {k: v for k, v in env.items() if k not in DROPPED and not k.startswith(DROPPED_FAMILIES)}
    out["PATH"] = os.pathsep.join(d for d in (env.get("PATH") or os.defpath).split(os.pathsep) if d[:1] == "/")
    try:
        out["HOME"] = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        out["HOME"] = "/"
    out.update(extra)
    return out


# -- the training's own files: its code folder (first on sys.path), its script, its data -------------

def _said(refused) -> str:
    if refused.why == "owner":
        return f"belongs to {refused.owner()} (uid {refused.uid})"
    return f"is writable by other users (mode {mode_words(refused.mode)})"


def fix_command(refused) -> str:
    """The command that makes `refused.path` trusted: its owner root (or this user), no write for
    others (an ACL's entries removed)."""
    import shlex
    path = shlex.quote(refused.path)
    if refused.why == "owner":
        return f"chown {user_name(os.geteuid())} {path}"
    if refused.mode.endswith("+acl"):
        return f"setfacl -b {path}"
    return f"chmod go-w {path}"


def path_refusal(label: str, path: str, verb: str) -> Optional[Tuple[str, str]]:
    """(why, fix) when `path` (the training's `label`: "code folder", "script", "data folder") or
    a folder above it belongs to another user or others may write it; None when it is trusted,
    or not there (its reader says that it is missing)."""
    refused = walk(path) if os.path.lexists(path) else None
    if refused is None:
        return None
    said = _said(refused) if refused.path == path else f"is refused: {refused.path} {_said(refused)}"
    who = "root" if os.geteuid() == 0 else f"root or {user_name(os.geteuid())}"
    return (f"the training's {label} {path} {said}, who could change what the ranks {verb} as "
            f"{user_name(os.geteuid())}", f"{fix_command(refused)}, or use a copy that only {who} can change")


def code_refusal(folder: str, script: Optional[str]) -> Optional[Tuple[str, str]]:
    """(why, fix) when the training's code could be changed by another user: the folder it starts
    in (first on sys.path for -m), the script and the script's own folder (first on sys.path for
    a script), and what Python would import from that folder (its modules and packages, at its
    top)."""
    found = path_refusal("code folder", folder, "run")
    if found is None and script:
        found = path_refusal("script", os.path.join(folder, script), "run")
    first = os.path.dirname(os.path.join(folder, script)) if script else folder
    if found is None and first != folder:
        found = path_refusal("script's folder", first, "run")
    return found or _imported_refusal(first)


def _imported_refusal(folder: str, label: str = "") -> Optional[Tuple[str, str]]:
    """A module, package or folder below `folder` (first on sys.path), at any depth, that another
    user owns or may write, though the folder is trusted (copied with its owners kept, made
    writable); or the walk's bound, which says what was not checked (node/code_files.py)."""
    found = first_untrusted(folder)
    if found is None:
        return None
    if isinstance(found, Bound):
        return (f"the walk of the training's {label or 'code folder ' + folder} stopped after {found.names} names in "
                f"{found.seconds:.1f} s (its bound: {found.most_names} names, {found.most_seconds:g} s): not all it holds that "
                "the ranks may import was checked",
                "give PYTHONPATH folders that hold code alone" if label else
                "give --code-dir the folder that holds the code alone (keep data, runs and caches outside it)")
    return path_refusal("package" if os.path.isdir(found) else "module", found, "import")


def job_refusal(job: dict, env: Mapping[str, str], cwd: str) -> Optional[Tuple[str, str]]:
    """(why, fix) when a supervised job may not start: its environment (refusal), and for the
    launch its code (code_refusal: the folder it starts in, the script torchrun is given) and its
    data folder."""
    start = job.get("cwd") or cwd
    words = list(job.get("torchrun") or [])
    script = None
    if job.get("program") == "launch" and "--" in words and not job.get("module"):
        script = words[words.index("--") - 1]
    found = refusal(env, start, os.path.dirname(os.path.join(start, script)) if script else start)
    if found is None and job.get("program") == "launch":
        found = code_refusal(start, script)
    if found is None and job.get("program") == "launch" and job.get("data_dir"):
        # What the ranks read decides what they train and write as root: refused as code is,
        # whatever --force made of data-shards' error.
        found = path_refusal("data folder", os.path.expanduser(job["data_dir"]), "read")
    return found
