"""Why a node could not be checked, in one line, with the fix."""

from __future__ import annotations

import errno
import socket
from typing import Any

from ddp_preflight.node import protocol


class NodeError(Exception):
    """A node that could not be reached or could not run the collector."""

    def __init__(self, summary: str, fix: str | None = None, unanswered: str | None = None):
        super().__init__(summary)
        self.summary = summary
        self.fix = fix
        # The address this machine dialled where nothing answered (a timeout, no route to host or
        # network): this machine's own route to it may be the cause, which the caller can judge.
        self.unanswered = unanswered


# connect() errors where the dial got no answer at all: nothing refused, nothing greeted.
UNANSWERED = (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH)


# What connect() failing with each errno means, and the fix for it; {host} is filled in.
CONNECT_ERRORS = {
    errno.ECONNREFUSED: ("nothing accepts ssh connections (connection refused)",
                         "start sshd on {host} (sudo systemctl start ssh) or fix Port in the ssh config"),
    errno.EHOSTUNREACH: ("no route to host: nothing answers at its address on the network",
                         "check that {host} is on and connected, and that HostName in the ssh config is its address"),
    errno.ENETUNREACH: ("network unreachable: this machine has no route to its address",
                        "check this machine's network and routes (ip route get ADDRESS), "
                        "or HostName for {host} in the ssh config"),
    errno.ETIMEDOUT: ("no answer on the ssh port within the timeout",
                      "check that {host} is on and its address in the ssh config is right; "
                      "a firewall may drop port 22"),
}


def explain_connect(host: str, exc: BaseException, address: str | None = None) -> NodeError:
    """Turn what paramiko/fabric raised into a sentence about this host; `address`: where it was
    dialled (HostName from the ssh config), kept on the error when nothing answered there."""
    error = _explain_connect(host, exc)
    if error.unanswered is None and address and _no_answer(exc):
        error.unanswered = address
    return error


def _no_answer(exc: BaseException) -> bool:
    return isinstance(exc, (socket.timeout, TimeoutError)) or isinstance(exc, OSError) and exc.errno in UNANSWERED


def _explain_connect(host: str, exc: BaseException) -> NodeError:
    import paramiko

    name = type(exc).__name__
    if isinstance(exc, socket.gaierror):
        return NodeError(f"{host}: the name does not resolve ({exc.strerror})",
                         f"add a 'Host {host}' entry with its HostName to your ssh config, "
                         "or pass --ssh-config FILE")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return _explain_addresses(host, exc.errors)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return _explain_errno(host, errno.ETIMEDOUT)
    if isinstance(exc, OSError) and exc.errno in CONNECT_ERRORS:
        return _explain_errno(host, exc.errno)
    if isinstance(exc, paramiko.AuthenticationException):
        return NodeError(f"{host}: the ssh key was refused ({exc})",
                         f"ssh-copy-id {host}   # or set IdentityFile for {host} in the ssh config")
    if isinstance(exc, paramiko.BadHostKeyException):
        return NodeError(f"{host}: its host key changed since it was recorded",
                         f"if {host} was reinstalled: ssh-keygen -R {host}; otherwise investigate")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return NodeError(f"{host}: its host key is not known here, so it cannot be verified",
                         f"ssh {host} true   # once, to check and accept its key; or ssh-keyscan {host} >> ~/.ssh/known_hosts")
    if _closed_before_greeting(exc):
        return NodeError(f"{host}: its ssh port accepted the connection, then "
                         f"{'reset' if 'reset' in str(exc) else 'closed'} it before the ssh greeting",
                         f"ssh -v {host} true   # to see what answers on its ssh port")
    if isinstance(exc, paramiko.SSHException):
        return NodeError(f"{host}: ssh failed: {exc}", f"try 'ssh {host} true' to see the full error")
    if isinstance(exc, OSError):
        return NodeError(f"{host}: cannot connect: {exc.strerror or exc}",
                         f"check the network path to {host}")
    return NodeError(f"{host}: {name}: {exc}", f"try 'ssh {host} true' to see the full error")


def _explain_errno(host: str, number: int) -> NodeError:
    summary, fix = CONNECT_ERRORS[number]
    return NodeError(f"{host}: {summary}", fix.format(host=host))


def _explain_addresses(host: str, errors: dict) -> NodeError:
    """paramiko tried each address of the host; one cause for all, or each address's own."""
    causes = {address[0]: error for address, error in errors.items()}
    numbers: set[Any] = {getattr(error, "errno", None) for error in causes.values()}
    if len(numbers) == 1 and numbers <= CONNECT_ERRORS.keys():
        number = numbers.pop()
        error = _explain_errno(host, number)
        if number in UNANSWERED:
            error.unanswered = next(iter(causes))       # the first address paramiko dialled
        return error
    listed = "; ".join(f"{address}: {error.strerror or error}" for address, error in causes.items())
    # A refusal means the machine is up, so its fix comes first.
    first = next((n for n in CONNECT_ERRORS if n in numbers), None)
    return NodeError(f"{host}: cannot connect to any of its addresses ({listed})",
                     CONNECT_ERRORS[first][1].format(host=host) if first else f"check the network path to {host}")


def _closed_before_greeting(exc: BaseException) -> bool:
    """The port took the connection, then closed or reset it before sshd's banner (not sshd, or
    one refusing more connections): paramiko raises the reset itself, an EOF, or its banner
    error, depending on when the peer's close arrives."""
    import paramiko

    return (isinstance(exc, (EOFError, ConnectionResetError))
            or isinstance(exc, paramiko.SSHException) and "protocol banner" in str(exc))


# --- the training Python ---------------------------------------------------------------------------

# Runs on the node before the training Python: says what --python is when it is not a program,
# instead of letting the shell guess (a folder, a missing path, a text file the shell would run
# as a script). A binary or a #! script (a wrapper that sets variables) is run, once neither it
# nor any folder above it, as given and with its symlinks resolved, belongs to another user or
# is writable by one (a sticky folder such as /tmp aside, above the file's own; a POSIX ACL, which
# GNU ls marks with '+', counts as others when the mask, the mode's group bits, allows writing):
# whoever can change it runs code as this user, root too (node/trust.py checks what the site adds
# after it). A bare --python is found on the caller's PATH (and walked as any); the wrapper's own
# tools (stat, head, ls, id, ...) come from the system's folders alone, never from a folder on the
# caller's PATH that another user can write (or an empty entry: the current folder), and the
# Python gets the caller's PATH back.
PYTHON_VERDICT = protocol.PYTHON
NODE_PYTHON = "3.8"          # the oldest Python the node package runs on (node/boot.py says when it is older)
SYSTEM_PATH = "/usr/bin:/bin"
_RUN_PYTHON = r"""p=$1; shift
case $p in */*) ;; *) p=$(command -v "$p") || p=$1 ;; esac
had=${PATH+x}; caller=${PATH-}; PATH=@SYSTEM_PATH@
program() { case $(head -c 4 "$p" 2>/dev/null) in
  "#!"*|"$(printf '\177ELF')"|"$(printf '\317\372\355\376')"|"$(printf '\312\376\272\276')") return 0 ;;
  *) return 1 ;; esac; }
others_in() {  # group $1 holds someone besides user $2
  g=$(getent group "$1" 2>/dev/null || grep "^[^:]*:[^:]*:$1:" /etc/group) || return 0
  n=$(getent passwd "$2" 2>/dev/null || grep "^[^:]*:[^:]*:$2:" /etc/passwd) || return 0
  for m in $(echo "${g##*:}" | tr , ' '); do [ "$m" = "${n%%:*}" ] || return 0; done
  { getent passwd 2>/dev/null || cat /etc/passwd; } | awk -F: -v g="$1" -v u="$2" '$4==g && $3!=u {f=1} END {exit !f}'; }
walk() {  # $1: an absolute path; prints why it may not be trusted
  w=$1; d=${1%/*}; me=$(id -u)
  while :; do
    if s=$(stat -c '%u %g %a %F' -- "${w:-/}" 2>/dev/null); then
      set -- $s; a=$((0$3)); k=; mode=$3; acl=
      case $(ls -ld -- "${w:-/}" 2>/dev/null) in ??????????+*) acl=1 ;; esac
      if [ "$1" != 0 ] && [ "$1" != "$me" ]; then k=owner
      elif [ "$4" != symbolic ] &&
           { [ $((a & 2)) != 0 ] || { [ $((a & 16)) != 0 ] && { [ -n "$acl" ] || others_in "$2" "$1"; }; }; } &&
           { [ $((a & 512)) = 0 ] || [ "$w" = "$p" ] || [ "$w" = "$d" ]; }; then
        k=writable; [ -n "$acl" ] && mode=$mode+acl; fi
      if [ -n "$k" ]; then echo "$k $1 $(id -nu "$1" 2>/dev/null || echo "uid-$1") $(id -nu) $mode ${w:-/}"; return; fi
    fi
    [ -z "$w" ] && return; w=${w%/*}
  done; }
case $p in /*) ;; *) p=$PWD/$p ;; esac
if [ -d "$p" ]; then what=folder; [ -x "$p/bin/python" ] && what=environment-folder
elif [ ! -e "$p" ]; then what=missing
elif why=$(walk "$p"; q=$p; p=$(readlink -f -- "$p") && [ "$p" != "$q" ] && walk "$p"); [ -n "$why" ]; then
  what="not-trusted ${why%%
*}"
elif [ -r "$p" ] && ! program; then what=not-a-program
elif [ ! -x "$p" ]; then what=not-executable
else if [ -n "$had" ]; then PATH=$caller; else unset PATH; fi; exec "$p" "$@"
fi
# Not a read of the payload to its end: a program's stdin may stay open (heartbeats) until it ends.
echo "DDP_PREFLIGHT_PYTHON $what" >&2
exit 126""".replace("@SYSTEM_PATH@", SYSTEM_PATH)


def python_argv(python: str, *args: str) -> list[str]:
    """The command that runs `python ARGS...` on a node, once it is known to be a program that
    no other user can change: /bin/sh by its path (locally, over ssh and through srun alike), never
    an `sh` found on a PATH."""
    return ["/bin/sh", "-c", _RUN_PYTHON, "ddp-preflight", python, *args]


def explain_python(host: str, python: str, exit_code: int, stderr: str, ran: bool) -> NodeError:
    """Why the collector gave no facts; `ran`: the program started (it sent its first line),
    so `python` is a Python."""
    verdict = next((line[len(PYTHON_VERDICT):] for line in stderr.splitlines() if line.startswith(PYTHON_VERDICT)), None)
    last = (stderr.strip().splitlines() or [""])[-1][:300]
    pick = (f"pass --python {host}:PATH (that node's own; PATH alone: every node), "
            f"or set python under [nodes.{host}] in the config")
    if verdict and verdict.startswith("not-trusted "):
        return _not_trusted(host, python, verdict)
    if verdict and verdict.startswith("too-old "):
        return NodeError(f"{host}: {python} is Python {verdict[len('too-old '):]}, too old: ddp-preflight needs "
                         f"Python {NODE_PYTHON} or newer on the nodes", _newer(host))
    if "Unknown option: -I" in stderr:
        # Python 2 (and 3 before 3.4) has no -I: its getopt says so, then its usage.
        return NodeError(f"{host}: {python} is Python 2 (or 3 before 3.4), too old: ddp-preflight needs "
                         f"Python {NODE_PYTHON} or newer on the nodes", _newer(host))
    if verdict == "missing":
        return NodeError(f"{host}: the training Python {python} does not exist there", pick)
    if verdict == "environment-folder":
        inside = f"{python.rstrip('/')}/bin/python"
        return NodeError(f"{host}: {python} is a folder, not a Python (it holds {inside})",
                         f"--python {host}:{inside}   # or set python under [nodes.{host}] in the config")
    if verdict == "folder":
        return NodeError(f"{host}: {python} is a folder, not a Python", f"give the interpreter's path: {pick}")
    if verdict == "not-a-program":
        return NodeError(f"{host}: {python} is a plain file (neither a binary nor a #! script), not a Python", pick)
    if verdict == "not-executable":
        return NodeError(f"{host}: {python} is not executable there",
                         f"chmod +x {python} on {host}, or pass the right one: --python {host}:PATH")
    if "SyntaxError: " in stderr and (ran or 'File "<string>"' in stderr):
        # An old Python 3 stopped at the node program's syntax (a Python's traceback, of `-c`'s code).
        return NodeError(f"{host}: {python} is too old to run the collector ({last}): ddp-preflight needs "
                         f"Python {NODE_PYTHON} or newer on the nodes", _newer(host))
    if not ran and "Python" not in stderr:
        # What it said, cut short: it may quote the few lines of Python it was given to run.
        said = f": {last[:200]}{'…' if len(last) > 200 else ''}" if last else ""
        return NodeError(f"{host}: {python} is not a Python: it ran and exited with code {exit_code}{said}", pick)
    return NodeError(f"{host}: the collector failed with exit code {exit_code}: {last}",
                     f"run '{python} -c \"import torch\"' on {host} to see what is wrong")


def _newer(host: str) -> str:
    return (f"give a Python {NODE_PYTHON}+ environment on {host}: --python {host}:PATH, "
            f"or python under [nodes.{host}] in the config")


def _not_trusted(host: str, python: str, verdict: str) -> NodeError:
    """`not-trusted owner|writable|not-a-file UID OWNER ME MODE PATH`: the interpreter (the sh above) or what
    its site would read (node/trust.py) can be changed by another user, as OpenSSH's StrictModes
    refuses a key in a folder others can write."""
    parts = verdict.split(" ", 6)
    if len(parts) < 7:
        return NodeError(f"{host}: the training Python {python} is refused: another user can change it",
                         f"give a Python only root or this user can change: --python {host}:PATH")
    _, why, uid, owner, me, mode, path = parts
    who = "root" if me == "root" else f"root or {me}"
    if why == "owner":
        return NodeError(f"{host}: the training Python {python} is refused: {path} belongs to {owner} (uid {uid}), "
                         f"who could change what it runs as {me}",
                         f"connect as {owner} to run {owner}'s Python, or give one only {who} can change: --python {host}:PATH")
    if why == "not-a-file":        # a .pth that is a FIFO (or a device): Python's site would wait on it
        return NodeError(f"{host}: the training Python {python} is refused: {path} is {mode.replace('-', ' ')}, "
                         "not a regular file, which Python's site would wait on forever",
                         f"remove {path} once you have checked who made it, or give another Python: --python {host}:PATH")
    # "775+acl": a POSIX ACL lets others write (the mode's group bits are then its mask).
    acl = mode.endswith("+acl")
    undo = f"setfacl -b {path}" if acl else f"chmod go-w {path}"
    return NodeError(f"{host}: the training Python {python} is refused: {path} is writable by other users "
                     f"(mode {mode[:-4] + ', with an ACL' if acl else mode}), who could change what it runs as {me}",
                     f"give a Python only {who} can change: --python {host}:PATH, or {undo} once you have "
                     "checked what it holds")
