"""What a node program may import or run: nothing another user can place or change, whoever runs
it (root, on a shared machine). Standard library only, Python 3.8+.

Every node program is `python -I -s -S -c STAGE0` (boot.py): no PYTHON* variable of the
environment (a PYTHONPATH of another user's), no folder of the caller first on sys.path (STAGE0
keeps absolute entries only), no user site from HOME (sudo may keep another user's), no site at
start-up. Then open_site() checks what `site` would read (the interpreter's
own folders, the venv's pyvenv.cfg, every site-packages folder, each .pth file in them and the
folders they add) and opens the site only when all of it belongs to root or this user and no one
else can write it (the walk of private.py: every folder up to /, sticky ones above aside), as
OpenSSH's StrictModes refuses a key in a folder others can write. This user's own user site is
found from the password database, never from HOME. A program a node program starts in Python is
started the same way (python_argv).

A refusal is one line on stderr that the master reads (transport/errors.py, explain_python):
    DDP_PREFLIGHT_PYTHON not-trusted owner|writable UID OWNER ME MODE PATH
the same line the shell before the interpreter writes for the interpreter itself."""

from __future__ import annotations

import os
import stat
import sys
from typing import List, Mapping, NamedTuple, Optional, Tuple

from .bounded import Skipped, kind, open_regular, read_regular
from .private import folders_up
from .protocol import FLAGS, PYTHON
from .writers import others_may_write, writable_mode

REFUSED = 126      # the exit code of a refused program, as the shell's for a Python it may not run
CONF_BYTES = 64 << 10     # a pyvenv.cfg: a few lines
PTH_BYTES = 1 << 20       # what is read of a .pth file (its folder lines come first)


class Refusal(NamedTuple):
    """Why `path` may not be trusted: it belongs to another user, others may write it, or (a
    .pth file) it is no regular file, which Python's site would wait on forever."""
    path: str
    why: str          # "owner", "writable" or "not-a-file"
    uid: int
    mode: str         # octal, "+acl" after it when an ACL is what lets others write

    def owner(self) -> str:
        return user_name(self.uid)

    def sentence(self) -> str:
        if self.why == "owner":
            me = os.geteuid()
            return (f"{self.path} belongs to {self.owner()} (uid {self.uid}), not to root or this user "
                    f"({user_name(me)}, uid {me})")
        if self.why == "not-a-file":
            return f"{self.path} is {self.mode}, not a regular file, which Python's site would wait on forever"
        return f"{self.path} is writable by other users (mode {mode_words(self.mode)})"

    def verdict(self) -> str:
        """The line the master turns into the node's error (ddp_preflight/transport/errors.py)."""
        mode = self.mode.replace(" ", "-")       # one word: "a-FIFO"
        return (f"{PYTHON}not-trusted {self.why} {self.uid} {self.owner()} {user_name(os.geteuid())} "
                f"{mode} {self.path}")


def mode_words(mode: str) -> str:
    """`775+acl` (a verdict's mode word) as a refusal says it: `775, with an ACL`."""
    return mode.replace("+acl", ", with an ACL")


def _mode(st: os.stat_result, where: str) -> str:
    return writable_mode(st, where).replace(", with an ACL", "+acl")


def user_name(uid: int) -> str:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def walk(path: str) -> Optional[Refusal]:
    """Why `path` (a file or a folder) may not be trusted, or None: it and every folder above it,
    as written and once symlinks are resolved, belong to root or this user and no one else may
    write them. A sticky folder (/tmp) is exempt above a file's own folder (as private.not_trusted
    has it) and above a folder itself: there, only an entry's owner can move or replace it."""
    path = os.path.abspath(path)
    for where in dict.fromkeys([path, os.path.realpath(path)]):
        refused = _walk_one(where)
        if refused is not None:
            return refused
    return None


def _walk_one(path: str) -> Optional[Refusal]:
    me = os.geteuid()
    folder = os.path.dirname(path)
    strict = (path,) if os.path.isdir(path) else (path, folder)     # no sticky folder exempt here
    for where in [path] + folders_up(folder):
        try:
            st = os.lstat(where)
        except OSError:
            continue        # gone or unreadable: what is there is refused or missed when it is used
        if st.st_uid not in (0, me):
            return Refusal(where, "owner", st.st_uid, f"{stat.S_IMODE(st.st_mode):o}")
        if stat.S_ISLNK(st.st_mode):
            continue        # a link's own mode means nothing; its folder says who may replace it
        sticky = where not in strict and st.st_mode & stat.S_ISVTX
        if others_may_write(st, where) and not sticky:
            return Refusal(where, "writable", st.st_uid, _mode(st, where))
    return None


# -- the site: checked, then opened ------------------------------------------------------------------

def _venv() -> Tuple[Optional[str], Optional[str], bool]:
    """(the pyvenv.cfg site.venv() would read, the venv's folder it makes sys.prefix, whether it
    includes the system's site-packages), found as site.py finds it: beside the interpreter, or
    one folder up; the venv is the folder above the interpreter's either way. The file is read
    only once walked, and bounded (a FIFO put in its place is not waited on; site skips one too)."""
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    prefix = os.path.dirname(exe_dir)
    for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(prefix, "pyvenv.cfg")):
        if os.path.isfile(conf):
            system = False
            try:
                text = read_regular(conf, CONF_BYTES).decode("utf-8") if walk(conf) is None else ""
            except (OSError, UnicodeDecodeError):
                text = ""       # unread: check_site refuses what the walk refused
            for line in text.splitlines():
                key, eq, value = line.partition("=")
                if eq and key.strip().lower() == "include-system-site-packages":
                    system = value.strip().lower() == "true"
            return conf, prefix, system
    return None, None, True


def own_user_site() -> Tuple[Optional[str], Optional[str]]:
    """(user base, user site) of this user: its home from the password database, not HOME,
    unless PYTHONUSERBASE names one (it is walked like the rest)."""
    import pwd
    import site
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return None, None
    base = os.environ.get("PYTHONUSERBASE") or os.path.join(home, ".local")
    layout = getattr(site, "_get_path", None)
    user_site = layout(base) if layout else os.path.join(
        base, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    return base, user_site


def _pth_folders(site_dir: str) -> Tuple[Optional[Refusal], List[str]]:
    """(why the .pth files of a site-packages folder may not be trusted, or None; the existing
    folders their lines add). Each is walked before it is opened, then read only if it is a
    regular file, never waited on: a FIFO there would hold this program (and Python's site after
    it) forever, before any lease exists."""
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
    except OSError:
        return None, []
    added = []
    for name in names:
        pth = os.path.join(site_dir, name)
        refused = walk(pth)
        if refused is not None:
            return refused, []
        try:
            fd, st = open_regular(pth)
        except Skipped:
            try:
                st = os.stat(pth)
            except OSError:
                continue
            return Refusal(pth, "not-a-file", st.st_uid, kind(st.st_mode)), []
        except OSError:
            continue            # gone, or unreadable: site skips it too
        try:
            lines = os.read(fd, PTH_BYTES).decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        finally:
            os.close(fd)
        for line in lines:
            if line.startswith("#") or line.startswith(("import ", "import\t")) or not line.strip():
                continue
            folder = os.path.join(site_dir, line.rstrip())
            if os.path.exists(folder):
                added.append(folder)
    return None, added


def check_site(user_site: Optional[str]) -> Optional[Refusal]:
    """What `site` is about to read, walked: the folders on sys.path now (the interpreter's
    standard library, this package's zip), the venv's pyvenv.cfg, every site-packages folder (and
    `user_site`), each .pth file in them and the folders those add. Each is walked before
    anything in it is read."""
    import site
    conf, venv, system = _venv()
    prefixes = ([venv] if venv else []) + (list(site.PREFIXES) if system else [])
    folders = [p for p in sys.path if os.path.exists(p)] + ([conf] if conf else [])
    # site's own list, and each prefix's lib/pythonX.Y/site-packages: Debian's site.py names a
    # venv's only once site.venv() has moved sys.prefix there.
    version = "python%d.%d" % sys.version_info[:2]
    site_dirs = ([user_site] if user_site else []) + list(site.getsitepackages(prefixes)) + [
        os.path.join(prefix, lib, version, "site-packages") for prefix in prefixes for lib in ("lib", "lib64")]
    walked: set = set()

    def first_refused(paths: List[str]) -> Optional[Refusal]:
        for where in paths:
            if where not in walked:
                walked.add(where)
                refused = walk(where)
                if refused is not None:
                    return refused
        return None

    refused = first_refused(folders)
    for site_dir in (d for d in site_dirs if os.path.isdir(d)):
        refused = refused or first_refused([site_dir])
        if refused is not None:
            return refused
        refused, added = _pth_folders(site_dir)
        refused = refused or first_refused(added)
    return refused


def open_site() -> Optional[Refusal]:
    """Check, then add site-packages as `site` would have at start-up (with this user's own user
    site); the refusal instead when something there may not be trusted."""
    import site
    # An entry that is not there now could be made later by someone else (in /tmp): dropped.
    sys.path[:] = [p for p in sys.path if p[:1] == "/" and os.path.exists(p)]
    conf, _, system = _venv()
    base, user_site = own_user_site() if (conf is None or system) else (None, None)
    if user_site and not os.path.isdir(user_site):
        user_site = None
    refused = check_site(user_site)
    if refused is not None:
        return refused
    if not sys.flags.no_site:
        return None          # a wrapper dropped -S: the site is open already, and was just checked
    if user_site:
        site.USER_BASE, site.USER_SITE, site.ENABLE_USER_SITE = base, user_site, True
    else:
        site.ENABLE_USER_SITE = False
    site.main()
    _pin_user_base(base)
    return None


def _pin_user_base(base: Optional[str]) -> None:
    """What this program starts in Python without -s (torchrun's ranks) reads its user site from
    HOME: where HOME is not this user's own, point them at this user's own (or at none)."""
    import pwd
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return
    if os.path.realpath(os.path.expanduser("~")) == os.path.realpath(home) or "PYTHONUSERBASE" in os.environ:
        return
    if base and walk(base) is None:
        os.environ["PYTHONUSERBASE"] = base
    else:
        os.environ["PYTHONNOUSERSITE"] = "1"


def opened() -> None:
    """open_site() for a child started by python_argv: its refusal is the line and the exit code
    the master knows; this package leaves sys.path (it is imported: its modules still load)."""
    root = package_root()
    refused = open_site()
    if refused is not None:
        sys.stderr.write(refused.verdict() + "\n")
        sys.stderr.flush()
        sys.exit(REFUSED)
    while root in sys.path:
        sys.path.remove(root)


def package_root() -> str:
    """The zip (or the folder) this package was imported from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# A child's first line: as STAGE0, absolute entries only; then this package, to check and open the site.
PRELUDE = ('import sys; sys.path[:] = [p for p in sys.path if p[:1] == "/"]; sys.path.insert(0, %r); '
           'from ddp_preflight.node.trust import opened; opened()\n')


def python_argv(python: str, code: str, *args: str) -> List[str]:
    """`python -c CODE ARGS` as a node program starts a Python of its own (the supervisor's job,
    the store reader, the import scan): -I -s -S, absolute sys.path, the site checked and opened
    before CODE runs (CODE is compiled on its own, so it may begin with a __future__ import)."""
    run = "exec(compile(%r, '<ddp-preflight>', 'exec'))" % code
    return [python, *FLAGS, "-c", PRELUDE % package_root() + run, *args]


# -- the training's own Python: what its environment makes it import --------------------------------

# What a Python started without -I (torchrun and the ranks, of the launch and of the probes)
# imports from, or runs a site from, because its environment says so.
PATH_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE")


def path_entries(env: Mapping[str, str], name: str, cwd: str) -> List[str]:
    """The folders of `name` as a Python started in `cwd` reads them: an empty entry is the start
    folder, a relative one is under it."""
    value = env.get(name) or ""
    return [os.path.normpath(os.path.join(cwd, entry)) for entry in value.split(os.pathsep)] if value else []
