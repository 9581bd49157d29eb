"""The Flight Recorder of ranks that opted in (hangwatch/flight.py runs in them): where each
rank's folder is, and the agent's side, which asks a rank for its record and reads the answer.

The agent is often root, reading a rank of another user: it asks only in a folder that is the
rank's own and that no one else can write, creates its request there without following a link
or reusing a file, and reads the answer the same way, bounded."""

from __future__ import annotations

import json
import os
import stat
import time

from . import proc

FOLDER_PREFIX = "/tmp/hangwatch-fr-"    # + the rank's uid: each user's private folder
ANSWER_LIMIT = 64 << 20           # bytes: a Flight Recorder dump of 2000 entries is a few MB


def ask(pid, wait=3.0):
    """The rank's Flight Recorder, if its script imported hangwatch.flight: the last collective
    it entered on each process group (sequence number and op), or None if it did not opt in.

    The agent is often root, reading a rank of another user: it asks only in a folder that is the
    rank's own and that no one else can write, creates its request there without following a
    link or reusing a file, and reads the answer the same way, bounded."""
    uid = proc.uid(pid)
    if uid is None:
        return None
    folder = folder_of(uid)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:         # a symlink (ELOOP), a file, or a folder this user may not open
        return {"error": f"{folder} not used: {exc.strerror}"}
    try:
        st = os.fstat(fd)
        if st.st_uid != uid or st.st_mode & 0o022:
            return {"error": f"{folder} not used: it is not the rank's own private folder (owner uid "
                             f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; the rank's uid is {uid})"}
        return _ask_flight(fd, pid, uid, wait)
    finally:
        os.close(fd)


def _ask_flight(folder, pid, uid, wait):
    name = str(pid)
    try:
        os.stat(name + ".ready", dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    try:
        os.close(os.open(name + ".request", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=folder))
    except FileExistsError:
        pass                     # asked before and not answered yet: that answer will do
    except OSError as exc:
        return {"error": f"cannot ask: {exc.strerror}"}
    deadline = time.monotonic() + wait
    while True:
        try:
            # O_NONBLOCK: a FIFO put there would otherwise block this open forever.
            fd = os.open(name + ".json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                return {"error": f"no answer within {wait:.0f} s"}
            time.sleep(0.05)
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
        try:
            os.unlink(name + ".json", dir_fd=folder)
        except OSError:
            pass
    if size > ANSWER_LIMIT:
        return {"error": f"the answer is over {ANSWER_LIMIT >> 20} MiB"}
    try:
        trace = json.loads(b"".join(chunks))
    except ValueError as exc:
        return {"error": f"unreadable answer: {exc}"}
    if "error" in trace:
        return {"error": trace["error"]}
    last = {}
    for entry in trace.get("entries") or []:
        group = (entry.get("process_group") or ["?", "?"])[-1]
        if not entry.get("is_p2p"):
            last[group] = {"group": group, "seq": entry.get("collective_seq_id"),
                           "op": str(entry.get("profiling_name", "")).split(":")[-1], "state": entry.get("state")}
    return {"groups": sorted(last.values(), key=lambda e: e["group"]), "entries": len(trace.get("entries") or [])}


def folder_of(uid: int) -> str:
    return FOLDER_PREFIX + str(uid)

