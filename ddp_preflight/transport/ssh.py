"""A node over SSH (fabric for the connection and its ssh config, paramiko channels for the
programs): the connection is opened once and carries every program of a preflight, a launch and
its hangwatch."""

from __future__ import annotations

import collections
import io
import logging
import os
import shlex
import stat
import threading

from ddp_preflight.node.bounded import Skipped, read_regular
from ddp_preflight.node.private import folders_up
from ddp_preflight.node.writers import others_may_write, writable_mode

from .errors import NodeError, explain_connect
from .host_names import bad_host_reason
from .node import Node, Process
from .ssh_include import IncludeError, expand

CONNECT_TIMEOUT = 8

# paramiko's transport thread logs a traceback when a peer fails mid-handshake (it resets during
# the banner), and with no handler anywhere Python prints it on stderr, although connect() raises
# the same error, which becomes the node's one-line error. A handler of its own ends that; an
# application that configures logging still receives the records.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class SshProcess(Process):
    def __init__(self, connection, argv: list[str]):
        self.channel = connection.client.get_transport().open_session()
        self.channel.exec_command(" ".join(shlex.quote(a) for a in argv))
        self._lock = threading.Lock()
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=64)
        self._stderr_done = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        # Read, so the channel's window never fills; keep the tail.
        try:
            while True:
                data = self.channel.recv_stderr(4096)
                if not data:
                    return
                self._stderr.append(data)
        except Exception:
            return
        finally:
            self._stderr_done.set()

    def write(self, data: bytes) -> bool:
        with self._lock:
            try:
                self.channel.sendall(data)
                return True
            except Exception:
                return False

    def heartbeat(self) -> None:
        # Never block the one heartbeat thread on a link that is down: send only when it can go.
        with self._lock:
            if not self.channel.closed and self.channel.send_ready():
                self.channel.send(b"\n")

    def close_input(self) -> None:
        with self._lock:
            try:
                self.channel.shutdown_write()
            except Exception:
                pass

    def read(self) -> bytes:
        return self.channel.recv(65536)

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.channel.status_event.wait(timeout):
            return None
        return self.channel.recv_exit_status()

    def stderr_text(self) -> str:
        self._stderr_done.wait(5)         # once it has ended: its last words are in
        return b"".join(self._stderr).decode(errors="replace")[-8192:]

    def kill(self) -> None:
        self.channel.close()


def user_home() -> str:
    """The home of the user this runs as, from the password database, as OpenSSH takes it: never
    $HOME, which sudo may keep from another user."""
    import pwd
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return "/nonexistent"


def expand_home(name: str) -> str:
    """A per-user ssh file's name as OpenSSH expands it: `~` and `%d` are the home of the user
    this runs as (user_home), `%u` its name."""
    import pwd
    home = user_home()
    if name == "~" or name.startswith("~/"):
        name = home + name[1:]
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        me = str(os.geteuid())
    return name.replace("%d", home).replace("%u", me).replace("%%", "%")


def known_hosts_files(ssh_config) -> list[str]:
    """The known hosts files OpenSSH would read for a host (UserKnownHostsFile of its config, else
    ~/.ssh/known_hosts and known_hosts2 of the password database's home)."""
    names = ssh_config.get("userknownhostsfile") or "~/.ssh/known_hosts ~/.ssh/known_hosts2"
    if isinstance(names, list):
        names = " ".join(names)
    return [expand_home(name) for name in str(names).split()]


def _check_host_keys(conn, host: str) -> None:
    """Verify host keys the way OpenSSH would (fabric accepts any key by default): the known
    hosts files of the ssh config, and an unknown host is refused unless the config says
    StrictHostKeyChecking no or accept-new. A known hosts file vouches for a host's key, so one
    that another user owns or could change, or could put in its place, is refused as an ssh
    config is (ssh_file_problem)."""
    import paramiko

    for path in known_hosts_files(conn.ssh_config):
        if os.path.lexists(path):
            problem = ssh_file_problem("known hosts file", path, "it says which host keys to trust")
            if problem:
                raise NodeError(f"{host}: {problem}")
        if os.path.isfile(path):
            conn.client.load_host_keys(path)
    strict = str(conn.ssh_config.get("stricthostkeychecking", "ask")).lower()
    conn.client.set_missing_host_key_policy(
        paramiko.WarningPolicy() if strict in ("no", "off", "accept-new") else paramiko.RejectPolicy())


DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519", "id_dsa")


def _own_keys(conn) -> None:
    """The keys paramiko tries come from the password database's home, as OpenSSH's do: where
    $HOME is another's (sudo kept it), paramiko's own look in ~/.ssh is turned off, an
    IdentityFile it expanded under $HOME is taken from the user's own home, and the user's own
    default keys are offered instead."""
    given, home = os.path.expanduser("~"), user_home()
    if os.path.realpath(given) == os.path.realpath(home):
        return
    keys = [home + key[len(given):] if key == given or key.startswith(given + "/") else key
            for key in conn.connect_kwargs.get("key_filename") or []]
    keys += [p for p in (os.path.join(home, ".ssh", name) for name in DEFAULT_KEYS) if os.path.isfile(p)]
    conn.connect_kwargs["look_for_keys"] = False
    conn.connect_kwargs["key_filename"] = list(dict.fromkeys(keys))


def files_ssh_uses(conn) -> list[tuple[str, str, str]]:
    """(label, path, why it matters) of every file the connection will read or run as this user,
    besides its configs and known hosts: each IdentityFile (however given: an absolute path too)
    and the certificate paramiko loads beside it (KEY-cert.pub), and ProxyCommand's program and
    every absolute path among its words (paramiko runs them, split as a shell would, without a
    shell); a ProxyJump host's own, hop by hop."""
    import shutil

    out: list[tuple[str, str, str]] = []
    seen: set[int] = set()
    while conn is not None and id(conn) not in seen:
        seen.add(id(conn))
        for key in conn.connect_kwargs.get("key_filename") or []:
            for path in (key, key + "-cert.pub"):
                if os.path.lexists(path):
                    out.append(("identity file", path, "ssh signs in with it as this user"))
        gateway = conn.gateway
        if isinstance(gateway, str):
            try:
                words = shlex.split(gateway)
            except ValueError:
                words = []          # paramiko cannot run it either
            absolute = os.pathsep.join(d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d[:1] == "/")
            program = (shutil.which(words[0], path=absolute) or "") if words and "/" not in words[0] else \
                (words[0] if words else "")
            for path in dict.fromkeys([program] + [w for w in words[1:] if w.startswith("/")]):
                if path and os.path.lexists(path):
                    out.append(("ProxyCommand file", path, "ProxyCommand runs it as this user at every connection"))
            gateway = None
        conn = gateway
    return out


def ssh_config_files(ssh_config: str | None) -> list[str]:
    """The ssh configs paramiko will read for a connection: the one given, else the user's and
    the system's (as fabric loads them), those that exist."""
    if ssh_config:
        return [ssh_config]
    return [p for p in (expand_home("~/.ssh/config"), "/etc/ssh/ssh_config") if os.path.exists(p)]


def ssh_config_problem(ssh_config: str | None) -> str | None:
    """Why an ssh config must not be read, or None. Its `Match exec`, `ProxyCommand` and
    `LocalCommand` run through a shell as this user (often root): a config that another user owns
    or could change, or could put in its place, would run their commands. So, as OpenSSH refuses
    such a file ("Bad owner or permissions"), the file must be a regular file of root or this
    user that no one else may write, and so must be every folder above it (a sticky one such as
    /tmp aside: there only an entry's owner can move it)."""
    try:
        # Every file Include reads is checked as the file given: its Match exec would run too.
        every = [f for top in ssh_config_files(ssh_config) for f in expand(top, _read_config)[1]]
    except IncludeError as exc:
        return f"ssh config: {exc}"
    except OSError:
        every = ssh_config_files(ssh_config)     # said below, or by the read (checked_ssh_config)
    for given in every:
        problem = ssh_file_problem("ssh config", given, "an ssh config's Match exec and ProxyCommand run as this user")
        if problem:
            return problem
    return None


def ssh_file_problem(label: str, given: str, because: str) -> str | None:
    """Why a per-user ssh file (`label`: "ssh config", "known hosts file") must not be read, or
    None: it and every folder above it, links resolved, must be root's or this user's and
    writable by no one else (a sticky folder above it aside), and it a regular file."""
    me = os.geteuid()
    real = os.path.realpath(given)
    for where in [real] + folders_up(os.path.dirname(real)):
        try:
            st = os.stat(where)
        except OSError as exc:
            return f"{label} {given}: {where}: {exc.strerror}"
        why = None
        if where == real and not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif st.st_uid not in (0, me):
            why = f"belongs to uid {st.st_uid}, not to root or this user (uid {me})"
        elif others_may_write(st, where) and not (where != real and st.st_mode & stat.S_ISVTX):
            why = f"is writable by other users (mode {writable_mode(st, where)})"
        if why:
            shown = "it" if where == real == given else where
            undo = f"setfacl -b {where}" if why.endswith("with an ACL)") else \
                f"chown {me} FILE; chmod go-w FILE and its folders"
            kind = "a config" if label == "ssh config" else ("an " if label[0] in "aeiou" else "a ") + label
            return (f"{label} {given} is refused: {shown} {why}, and {because}; give {kind} only root or this "
                    f"user can change ({undo})")
    return None


SSH_CONFIG_BYTES = 1 << 20     # an ssh config: a few KB; a larger "config" is not one


def checked_ssh_config(ssh_config: str | None, host: str):
    """The ssh configs paramiko will use, parsed here from the files ssh_config_problem() checked
    (links resolved: the path checked is the path read; a regular file, bounded), and nothing
    else. fabric's own Config() would also load ~/.fabric.{py,yaml,yml,json} and /etc/fabric.* of
    whatever HOME says (sudo may keep another user's): a .fabric.py runs as this user, and a
    .fabric.yaml's ssh_config_path names an ssh config no one checked, whose Match exec runs. So
    fabric is given this object and lazy=True: it loads no file of its own."""
    from paramiko import SSHConfig

    parsed = SSHConfig()
    for given in ssh_config_files(ssh_config):
        try:
            text = expand(given, _read_config)[0]      # with OpenSSH's Include read in place
        except IncludeError as exc:
            raise NodeError(f"{host}: ssh config {given}: {exc}", "fix the Include line") from None
        except Skipped as exc:
            raise NodeError(f"{host}: ssh config {given} is not read: {exc}",
                            "give a regular file: --ssh-config FILE") from None
        except OSError as exc:
            if ssh_config:      # the one given: paramiko would have said it is missing too
                raise NodeError(f"{host}: ssh config {given}: {exc.strerror}",
                                "give an existing file: --ssh-config FILE") from None
            continue            # a default one that went away meanwhile: as if it had never been there
        parsed.parse(io.StringIO(text))
    return parsed


def _read_config(path: str) -> str:
    """One ssh config file, links resolved (the path checked is the path read), a regular file, bounded."""
    return read_regular(os.path.realpath(path), SSH_CONFIG_BYTES).decode("utf-8", "replace")


class SshNode(Node):
    def __init__(self, name: str, python: str, ssh_config: str | None = None):
        super().__init__(name, python)
        self.ssh_config = ssh_config
        self.connection = None

    def connect(self) -> None:
        from fabric import Config, Connection

        # The host goes into the ssh config's Match exec and ProxyCommand (paramiko's %h), which
        # run through a shell: it passes the one check before paramiko sees it, however this node
        # was made; so does the config itself.
        reason = bad_host_reason(self.name)
        if reason:
            raise NodeError(reason, "fix the host list; nothing was run for this entry")
        problem = ssh_config_problem(self.ssh_config)
        if problem:
            raise NodeError(f"{self.name}: {problem}")
        # Only the checked configs, parsed here: fabric loads no file of its own (lazy=True).
        config = Config(ssh_config=checked_ssh_config(self.ssh_config, self.name), lazy=True)
        conn = Connection(self.name, config=config, connect_timeout=CONNECT_TIMEOUT)
        _check_host_keys(conn, self.name)
        _own_keys(conn)
        for label, path, because in files_ssh_uses(conn):
            problem = ssh_file_problem(label, path, because)
            if problem:
                raise NodeError(f"{self.name}: {problem}")
        try:
            conn.open()
        except Exception as exc:   # every connect failure becomes one line with a fix
            raise explain_connect(self.name, exc, conn.host) from None
        self.connection = conn

    @property
    def address(self) -> str:
        """The address this node is reached at (HostName from the ssh config)."""
        if self.connection is not None:
            return self.connection.host
        return self.name

    def _spawn(self, argv: list[str]) -> Process:
        if self.connection is None:
            self.connect()
        return SshProcess(self.connection, argv)

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
