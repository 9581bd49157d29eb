"""Every rank's Flight Recorder: where its folder is, what the launch program sets for it, and the
agent's side, which asks a rank for its record and reads the answer.

Where: a rank of `ddp-preflight --launch` has its run's private folder in its environment
(FOLDER_VARIABLE, set by the launch program, node/launch_runner.py); a rank whose script imported
ddp_preflight.hangwatch.flight uses its user's folder /tmp/hangwatch-fr-UID. How, in that folder:
- NCCL: torch watches a named pipe there (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) from a C++ thread, and
  a line written to it makes the rank write its record (TORCH_FR_DUMP_TEMP_FILE), even when its
  Python is stuck in a CUDA call. Verified on an H100 with torch 2.11 (shared artifacts,
  gpu-nccl-hang-h100/README.md, last section). The record is a pickle: read by an unpickler that
  builds plain data only.
- Gloo (torch has no pipe for it): the rank's thread (node/rank_bootstrap.py) answers PID.request
  with PID.json, torch's JSON dump.

The agent is often root, reading a rank of another user: it asks only in a folder that is the
rank's own and that no one else can write, creates or opens what it writes there without
following a link or reusing a file, and reads the answer the same way, bounded."""

from __future__ import annotations

import io
import json
import os
import pickle
import stat
import time

from . import proc
from .fatal import fatal_record
from .rank_bootstrap import FATAL, FOLDER_VARIABLE

FOLDER_PREFIX = "/tmp/hangwatch-fr-"    # + the rank's uid: each user's folder, for ranks that opted in
ANSWER_LIMIT = 64 << 20           # bytes: a Flight Recorder dump of 2000 entries is a few MB
BUFFER = "2000"                   # collectives kept per rank (torch 2.13's own default)
PIPE, DUMP = "nccl-pipe-", "nccl-dump-"     # + the global rank (+ ".pipe"): torch's names in the folder
PIPE_WAIT = 6.0                   # seconds for an NCCL rank to dump: torch looks at its pipe once a second

__all__ = ["FOLDER_VARIABLE", "ask", "plain_data", "rank_environment", "summary"]


class Refused(pickle.UnpicklingError):
    """A dump that would be more than plain data: it is not read."""


# -- what the launch program sets -----------------------------------------------------------------

def rank_environment(folder: str, env: dict, nccl: bool) -> dict:
    """The variables the ranks get, where `env` (theirs so far: the node's and --env) does not set
    them already: the run's folder, the buffer, and torch's NCCL pipe and dump in that folder (the
    default, /tmp, would leave them readable by every local user). `nccl`: the node's torch has
    NCCL, whose pipe is made only when TORCH_NCCL_TRACE_BUFFER_SIZE is set (that name, not
    TORCH_FR_BUFFER_SIZE, in the torch versions that have the pipe; newer ones log that it is
    deprecated)."""
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or BUFFER
    wanted = {FOLDER_VARIABLE: folder, "TORCH_FR_BUFFER_SIZE": size,
              **({"TORCH_NCCL_TRACE_BUFFER_SIZE": size} if nccl else {}),
              "TORCH_FR_DUMP_TEMP_FILE": os.path.join(folder, DUMP),
              "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(folder, PIPE)}
    return {name: value for name, value in wanted.items() if name not in env}


# -- the agent's side -----------------------------------------------------------------------------

def ask(pid, wait=3.0, pipe_wait=PIPE_WAIT):
    """The rank's Flight Recorder: the last collective it entered on each process group (sequence
    number and op), an {"error": ...} that says why not, or None when the rank has no Flight
    Recorder to ask (not launched by ddp-preflight, and did not opt in)."""
    uid = proc.uid(pid)
    if uid is None:
        return None
    env = proc.environ(pid) or {}
    fd = open_folder(env.get(FOLDER_VARIABLE) or folder_of(uid), uid)
    if not isinstance(fd, int):
        return fd
    try:
        rank = env.get("RANK", "")
        if rank.isdigit() and _exists(PIPE + rank + ".pipe", fd):
            return _ask_pipe(fd, rank, uid, pipe_wait)
        return _ask_thread(fd, pid, uid, wait)
    finally:
        os.close(fd)


def open_folder(folder, uid):
    """The rank's Flight Recorder folder, opened (a file descriptor), when it is the rank's own
    private folder; None when there is none; {"error": why} when it must not be used."""
    if not os.path.isabs(folder):
        return {"error": f"{folder} not used: not an absolute path"}
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:         # a symlink (ELOOP), a file, or a folder this user may not open
        return {"error": f"{folder} not used: {exc.strerror}"}
    st = os.fstat(fd)
    if st.st_uid != uid or st.st_mode & 0o022:
        os.close(fd)
        return {"error": f"{folder} not used: it is not the rank's own private folder (owner uid "
                         f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; the rank's uid is {uid})"}
    return fd


def ending(folder, uid, pid):
    """How the rank's script ended, as it recorded it (node/rank_bootstrap.py's PID.end): a dict, or
    None (no record, or one that must not be read). Read once: the file goes (a pid is reused).
    `folder` and `uid` are the rank's, taken while it lived."""
    fd = open_folder(folder, uid)
    if not isinstance(fd, int):
        return None
    try:
        name, fatal = "%d.end" % pid, FATAL % pid
        crash = _read_own(fatal, fd, uid, remove=True) if _exists(fatal, fd) else None
        if not _exists(name, fd):
            return fatal_record(crash) if isinstance(crash, bytes) else None
        raw = _read_own(name, fd, uid, remove=True)
    finally:
        os.close(fd)
    if isinstance(raw, dict):
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _ask_pipe(folder, rank, uid, wait):
    """An NCCL rank: one line to its pipe, then its dump, once it is new and whole."""
    dump = DUMP + rank
    before = _version(dump, folder)
    try:
        # O_NONBLOCK: no reader (the rank gone, or not watching) is ENXIO, not a wait forever.
        fd = os.open(PIPE + rank + ".pipe", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=folder)
    except OSError as exc:
        return {"error": f"cannot ask through the rank's NCCL pipe: {exc.strerror}"}
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != uid:
            return {"error": "the NCCL pipe is not a pipe of the rank's own"}
        os.write(fd, b"1\n")
    except BlockingIOError:
        pass                     # full: asked before and not read yet; that dump will do
    except OSError as exc:
        return {"error": f"cannot ask through the rank's NCCL pipe: {exc.strerror}"}
    finally:
        os.close(fd)
    deadline = time.monotonic() + wait
    why = f"no dump within {wait:.0f} s"
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if _version(dump, folder) in (before, None):
            continue
        raw = _read_own(dump, folder, uid)
        if isinstance(raw, dict):
            return raw
        try:
            return summary(plain_data(raw))
        except Refused as exc:
            return {"error": f"the dump is not read: {exc}"}
        except Exception as exc:     # being written (torch writes in place): read again
            why = f"unreadable dump: {type(exc).__name__}: {exc}"
    return {"error": why}


def _ask_thread(folder, pid, uid, wait):
    """A rank running rank_bootstrap.py's thread: a request, then its JSON answer."""
    name = str(pid)
    if not _exists(name + ".ready", folder):
        return None
    try:
        os.close(os.open(name + ".request", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=folder))
    except FileExistsError:
        pass                     # asked before and not answered yet: that answer will do
    except OSError as exc:
        return {"error": f"cannot ask: {exc.strerror}"}
    deadline = time.monotonic() + wait
    while not _exists(name + ".json", folder):
        if time.monotonic() > deadline:
            return {"error": f"no answer within {wait:.0f} s"}
        time.sleep(0.05)
    raw = _read_own(name + ".json", folder, uid, remove=True)
    if isinstance(raw, dict):
        return raw
    try:
        trace = json.loads(raw)
    except ValueError as exc:
        return {"error": f"unreadable answer: {exc}"}
    if "error" in trace:
        return {"error": trace["error"]}
    return summary(trace)


def _exists(name, folder) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _version(name, folder):
    """(inode, mtime, size) of a file in the folder, or None: tells a new dump from the last one."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _read_own(name, folder, uid, remove=False):
    """A regular file of the rank's own in the folder, at most ANSWER_LIMIT bytes; or {"error"}.
    `remove`: once opened, it goes (an answer is read once)."""
    try:
        # O_NONBLOCK: a FIFO put there would otherwise block this open forever.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError as exc:
        return {"error": f"unreadable answer: {exc.strerror}"}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return {"error": "the answer is not a file of the rank's own"}
        chunks, size = [], 0
        while size <= ANSWER_LIMIT:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
        if remove:
            try:
                os.unlink(name, dir_fd=folder)
            except OSError:
                pass
    if size > ANSWER_LIMIT:
        return {"error": f"the answer is over {ANSWER_LIMIT >> 20} MiB"}
    return b"".join(chunks)


# -- what the launch program keeps ---------------------------------------------------------------

KEPT_ENTRIES = 64        # the last collectives of a dump kept in the run's log folder (enough to join by sequence)


def collect(folder, pids, wait=3.0):
    """Every listed rank's whole Flight Recorder (torch's JSON, its last KEPT_ENTRIES entries), asked
    at once through rank_bootstrap.py's thread in the launch program's own folder: {pid: trace}.
    Ranks that do not answer within `wait` seconds (gone, or no thread) are left out."""
    fd = open_folder(folder, os.getuid())
    if not isinstance(fd, int):
        return {}
    try:
        asked = []
        for pid in pids:
            if not _exists("%d.ready" % pid, fd):
                continue
            try:
                os.close(os.open("%d.request" % pid, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                                 dir_fd=fd))
            except FileExistsError:
                pass
            except OSError:
                continue
            asked.append(pid)
        found = {}
        deadline = time.monotonic() + wait
        while asked and time.monotonic() < deadline:
            for pid in list(asked):
                if not _exists("%d.json" % pid, fd):
                    continue
                asked.remove(pid)
                raw = _read_own("%d.json" % pid, fd, os.getuid(), remove=True)
                try:
                    trace = json.loads(raw) if not isinstance(raw, dict) else raw
                except ValueError:
                    continue
                found[pid] = trimmed(trace)
            time.sleep(0.05)
        return found
    finally:
        os.close(fd)


def trimmed(trace):
    """A dump with its last KEPT_ENTRIES entries (its status and groups kept whole)."""
    if isinstance(trace, dict) and isinstance(trace.get("entries"), list):
        return {**trace, "entries": trace["entries"][-KEPT_ENTRIES:]}
    return trace


# -- reading a dump -------------------------------------------------------------------------------

PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))


class _PlainData(pickle.Unpickler):
    """Builds what pickle builds by itself (dicts, lists, tuples, strings, numbers) and nothing it
    would have to look up by name: no class, no function, so no code of the dump's choosing runs."""

    def find_class(self, module, name):
        raise Refused(f"it would call {module}.{name}")

    def persistent_load(self, pid):
        raise Refused("it refers to an object outside it")


def plain_data(raw: bytes):
    """A pickled Flight Recorder dump as plain data; Refused when it holds anything else (a set,
    a bytearray); the pickle module's own errors when it is cut short."""
    value = _PlainData(io.BytesIO(raw)).load()
    seen, todo = set(), [value]
    while todo:                  # each container once: shared ones could otherwise blow up the walk
        item = todo.pop()
        if type(item) not in PLAIN:
            raise Refused(f"it holds a {type(item).__name__}")
        if isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            todo.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)
    return value


def summary(trace) -> dict:
    """The last collective of each process group in a dump (pickled or JSON: the same fields), and
    the last one completed ("completed": its sequence number, None when none is recorded so).
    Each group by its id ("id": torch's pg name, "0" the default group; "group": its description,
    which two subgroups may share: "undefined"), its members where the dump lists them ("ranks":
    NCCL's pg_config; Gloo's is empty), and "last": whether the rank's last collective of all is
    this group's, which is where a rank that waits waits. Sequence numbers count per group: only
    a group's own are ever compared (hangwatch/sequence.py)."""
    entries = trace.get("entries") if isinstance(trace, dict) else None
    entries = entries if isinstance(entries, list) else []
    last: dict = {}
    completed: dict = {}
    newest = None
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        where = entry.get("process_group")
        where = where if isinstance(where, (list, tuple)) and where else ("?",)
        group, name = str(where[0]), where[-1]
        seq, op = entry.get("collective_seq_id"), entry.get("profiling_name")
        if isinstance(name, str) and isinstance(seq, int) and isinstance(op, str):
            state = entry.get("state") if isinstance(entry.get("state"), str) else None
            last[group] = {"group": name, "id": group, "seq": seq, "op": op.split(":")[-1], "state": state}
            newest = group           # entries are in the order the rank issued them
            if state == "completed":
                completed[group] = max(seq, completed.get(group, seq))
    members = _members(trace.get("pg_config") if isinstance(trace, dict) else None)
    for group, e in last.items():
        e["completed"] = completed.get(group)
        e["last"] = group == newest
        if group in members:
            e["ranks"] = members[group]
    return {"groups": sorted(last.values(), key=lambda e: (e["group"], e["id"])), "entries": len(entries)}


def _members(config) -> dict:
    """Each group's ranks as the dump's pg_config lists them ({"0": {"name": "0", "ranks": "[0, 1]"}}),
    where it does (Gloo's lists none)."""
    found: dict = {}
    for key, value in (config.items() if isinstance(config, dict) else ()):
        if not isinstance(value, dict) or not isinstance(value.get("ranks"), str):
            continue
        try:
            ranks = json.loads(value["ranks"])
        except ValueError:
            continue
        name = value.get("name") if isinstance(value.get("name"), str) and value.get("name") else key
        if isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks) and name:
            found[str(name)] = sorted(ranks)
    return found


def folder_of(uid: int) -> str:
    return FOLDER_PREFIX + str(uid)
