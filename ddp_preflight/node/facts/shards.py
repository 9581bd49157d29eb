"""A manifest of one node's data folder: every shard's name, size and digest, so the master can
tell whether all nodes train on the same data (seeds 001 and 004: 201 shards on one node, 4 on
the other).

This runs on the nodes, with the training environment's Python: standard library only. xxhash
and blake3 are used when that environment has them, since they hash several times faster than
hashlib's blake2b.

The data folder may be another user's: only regular files are hashed, each read no further than
the size it had when listed, and a file that became a FIFO (or anything else) since it was listed
is skipped with a note, never waited on (node/bounded.py). A file over SAMPLE_OVER (a sparse
1 TiB file costs no disk) is hashed by a sample, the same on every node: its size and its first
and last SAMPLE_BYTES, named in "sampled"; so the hashing ends in bounded time.

The digest cache is this user's own: under its home from the password database (not HOME, which
sudo may keep), written through node/private.py (no link another user planted is followed), and
read only when it is a regular file of this user's, bounded, every entry checked."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pwd
import re
import shlex
import socket
import stat
import threading
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor, wait

from ..bounded import Skipped, open_regular, size_text
from ..private import folder


def _optional(name: str):
    """A hashing package where the node has it, else None (one form for the type checker whether
    it is installed there or not)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


xxhash = _optional("xxhash")
blake3 = _optional("blake3")

ALGORITHMS = ("xxh3_128", "blake3", "blake2b")    # in order of preference

CHUNK = 4 << 20                 # in bytes; measured fastest with 2 threads (bench/shard_hashing.py)
CACHE_BYTES = 64 << 20          # a digest cache larger than this is not ours: hash again
SAMPLE_OVER = 1 << 30           # in bytes: a larger file is hashed by a sample (about a second of blake2b)
SAMPLE_BYTES = 16 << 20         # in bytes, read at each end of a sampled file
SAMPLED = b"ddp-preflight sampled v1\n"     # what a sampled digest starts from: never a whole file's
DIGEST_LENGTHS = {"xxh3_128": 32, "blake3": 64, "blake2b": 128}     # hex digits of each algorithm's digest
PROGRESS_INTERVAL = 0.25        # in seconds: at most ~4 progress calls a second

_HASHERS: dict = {"blake2b": hashlib.blake2b}
if xxhash is not None and hasattr(xxhash, "xxh3_128"):     # xxhash < 2.0 has no xxh3
    _HASHERS["xxh3_128"] = xxhash.xxh3_128
if blake3 is not None:
    _HASHERS["blake3"] = blake3.blake3

# path: where to open it (symlinks resolved); rel: its name in the manifest
_File = namedtuple("_File", "rel path size mtime_ns inode")


class ShardError(Exception):
    """The data folder cannot be listed or hashed. The message is one line: the path and the fix."""


class DataDirMissing(ShardError):
    pass


class DataDirUnreadable(ShardError):
    pass


def available_algorithms() -> list[str]:
    """The digests this Python can compute, best first; blake2b is always there."""
    return [name for name in ALGORITHMS if name in _HASHERS]


def default_cache_path(data_dir: str) -> str | None:
    """Where this node keeps its digests of data_dir: ~/.cache/ddp-preflight/ of this user's own
    home, from the password database (sudo may keep another user's HOME), or $XDG_CACHE_HOME when
    HOME is this user's. None: this user has no home. The name holds the hostname and the
    folder's (st_dev, st_ino): lab nodes share one filesystem and home, and must never share a
    cache."""
    path = _data_root(data_dir)
    info = os.stat(path)
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return None
    base = os.environ.get("XDG_CACHE_HOME", "")
    own = os.path.realpath(os.environ.get("HOME") or "/nonexistent") == os.path.realpath(home)
    if not (own and os.path.isabs(base)):     # the XDG spec says to ignore a relative value
        base = os.path.join(home, ".cache")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    name = f"shards-{host}-{info.st_dev:x}-{info.st_ino:x}.json"
    return os.path.join(base, "ddp-preflight", name)


def manifest(data_dir: str, algorithm: str, cache_path: str | None = None, progress=None,
             *, workers: int | None = None) -> dict:
    """Name, size and digest of every regular file under data_dir.

    progress(done_bytes, total_bytes, done_files, total_files) is called at most ~4 times a
    second and once at the end. workers: hashing threads (default min(4, cpus)). A file over
    SAMPLE_OVER has a sampled digest (_hash_file), and is named in "sampled" with how."""
    started = time.perf_counter()
    if algorithm not in _HASHERS:
        raise ShardError(f"hash algorithm {algorithm!r} is not available in this Python (it has "
                         f"{', '.join(available_algorithms())}): pip install xxhash blake3")
    root = _data_root(data_dir)
    files, skipped = _walk(os.path.realpath(root))

    cache = _load_cache(cache_path) if cache_path else {}
    keys = {f.rel: _cache_key(f, algorithm) for f in files}
    digests = {f.rel: cache[keys[f.rel]] for f in files if keys[f.rel] in cache}
    to_hash = [f for f in files if f.rel not in digests]
    cached_files = len(digests)

    total_bytes = sum(f.size for f in files)
    tally = _Tally(total_bytes - sum(f.size for f in to_hash), len(digests))
    hashed = _hash_files(to_hash, _HASHERS[algorithm], tally, total_bytes, len(files),
                         progress, workers or min(4, os.cpu_count() or 1))
    for rel, digest in hashed.items():
        if isinstance(digest, Skipped):
            skipped[rel] = f"{digest} (it changed after it was listed)"
        else:
            digests[rel] = digest
    if progress is not None:
        progress(total_bytes, total_bytes, len(files), len(files))
    files = [f for f in files if f.rel in digests]
    total_bytes = sum(f.size for f in files)
    sampled = {f.rel: f"over {size_text(SAMPLE_OVER)} ({size_text(f.size)}): hashed by its size and its first "
                      f"and last {size_text(SAMPLE_BYTES)}" for f in files if f.size > SAMPLE_OVER}

    if cache_path:
        fresh = {keys[rel]: digest for rel, digest in digests.items()}   # drops deleted files
        if fresh != cache:
            _save_cache(cache_path, fresh)
    return {
        "root": root,
        "algorithm": algorithm,
        "files": {f.rel: {"size": f.size, "digest": digests[f.rel]} for f in files},
        "file_count": len(files),
        "total_bytes": total_bytes,
        "hashed_bytes": tally.hashed_bytes,
        "cached_files": cached_files,
        "skipped": skipped,         # name -> why it is not in files (e.g. a symlink leading out)
        "sampled": sampled,         # name -> how its digest was taken, when not from every byte
        "seconds": round(time.perf_counter() - started, 6),
    }


def _data_root(data_dir: str) -> str:
    path = os.path.abspath(os.path.expanduser(data_dir))
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise DataDirMissing(f"data folder {path} does not exist on this node: copy the training "
                             f"shards there (the same path as on the master), or pass the folder "
                             f"that holds them as --data-dir") from None
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if not stat.S_ISDIR(info.st_mode):
        raise DataDirUnreadable(f"data folder {path} is a file, not a folder: pass the folder "
                                f"that holds the training shards as --data-dir")
    return path


def _unreadable(path: str, exc: OSError) -> DataDirUnreadable:
    return DataDirUnreadable(f"cannot read {path} ({exc.strerror or exc}): let the training user "
                             f"read it, e.g. chmod -R a+rX {shlex.quote(path)}")


def _walk(root: str) -> tuple[list[_File], dict[str, str]]:
    """Every regular file under root (a real path), sorted by name. Hidden entries (.git, .cache)
    are not shards. Symlinks are followed only while they stay inside root, and never into a
    folder that is already on the way down (a loop)."""
    files, skipped = [], {}
    pending: list = [("", root, (_identity(root),))]  # (name, real path, (st_dev, st_ino) of it and up)
    while pending:
        rel_dir, real_dir, parents = pending.pop()
        try:
            with os.scandir(real_dir) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            raise _unreadable(real_dir, exc) from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            path = entry.path
            if entry.is_symlink():
                path = os.path.realpath(path)
                if path != root and not path.startswith(root + os.sep):
                    skipped[rel] = "symlink to outside the data folder"
                    continue
            try:
                info = os.stat(path)
            except FileNotFoundError:
                skipped[rel] = "broken symlink"
                continue
            except OSError as exc:
                raise _unreadable(path, exc) from None
            if stat.S_ISDIR(info.st_mode):
                here = (info.st_dev, info.st_ino)
                if here in parents:
                    skipped[rel] = "symlink loop"
                else:
                    pending.append((rel, path, parents + (here,)))
            elif stat.S_ISREG(info.st_mode):
                files.append(_File(rel, path, info.st_size, info.st_mtime_ns, info.st_ino))
            else:                   # a FIFO would block the reader forever
                skipped[rel] = "not a regular file"
    files.sort()
    return files, skipped


def _identity(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


class _Tally:
    """Bytes and files done so far; the hashing threads add to it, the caller's thread reads it."""

    def __init__(self, done_bytes: int, done_files: int):
        self.done_bytes, self.done_files, self.hashed_bytes = done_bytes, done_files, 0
        self._lock = threading.Lock()

    def add_bytes(self, count: int, hashed: bool = True) -> None:
        with self._lock:
            self.done_bytes += count
            if hashed:
                self.hashed_bytes += count

    def add_file(self) -> None:
        with self._lock:
            self.done_files += 1


def _hash_files(files, hasher, tally, total_bytes, total_files, progress, workers) -> dict:
    """Digest of each file by name. Several threads: the hashers and readinto release the GIL,
    and on 2 cores two threads hash ~1.6x faster than one (bench/shard_hashing.py)."""
    if not files:
        return {}
    pool = ThreadPoolExecutor(max(1, min(workers, len(files))))
    futures = {pool.submit(_hash_file, f.path, f.size, hasher, tally): f.rel for f in files}
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=PROGRESS_INTERVAL)
            for future in done:
                future.result()     # raises the first unreadable file now, not after all others
            if pending and progress is not None:
                progress(tally.done_bytes, total_bytes, tally.done_files, total_files)
    except BaseException:
        for future in pending:
            future.cancel()
        raise
    finally:
        pool.shutdown(wait=True)
    return {rel: future.result() for future, rel in futures.items()}


_buffers = threading.local()        # one read buffer per hashing thread, reused across files


def _hash_file(path: str, size: int, hasher, tally: _Tally):
    """The digest of the file's first `size` bytes (its size when listed: a file that grows is
    read no further), or Skipped when it is no longer a regular file. Over SAMPLE_OVER, the digest
    of SAMPLED, its size, and its first and last SAMPLE_BYTES: the same on every node for the same
    file, and read in a moment however large (or sparse) the file is."""
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    digest = hasher()
    try:
        fd, _ = open_regular(path, follow=False)      # a real path: the walk resolved its links
    except Skipped as exc:
        tally.add_file()
        return exc
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if size > SAMPLE_OVER:
        digest.update(SAMPLED + b"%d\n" % size)
        spans = [(0, SAMPLE_BYTES), (size - SAMPLE_BYTES, SAMPLE_BYTES)]
    else:
        spans = [(0, size)]
    try:
        with open(fd, "rb", buffering=0) as stream:
            for start, length in spans:
                stream.seek(start)
                left = length
                while left > 0:
                    count = stream.readinto(view[:min(CHUNK, left)])
                    if not count:
                        break
                    digest.update(view[:count])
                    tally.add_bytes(count)
                    left -= count
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if size > SAMPLE_OVER:
        tally.add_bytes(size - 2 * SAMPLE_BYTES, hashed=False)    # done, though not read
    tally.add_file()
    return digest.hexdigest()


def _cache_key(f: _File, algorithm: str) -> str:
    # A file whose path, size, mtime and inode are unchanged is taken as unchanged: re-reading
    # hundreds of GB on every preflight is what would make people skip the check. A sampled
    # digest is keyed apart: it is never taken for a whole file's.
    sampled = "|sampled-v1" if f.size > SAMPLE_OVER else ""
    return f"{f.path}|{f.size}|{f.mtime_ns}|{f.inode}|{algorithm}{sampled}"


_KEY = re.compile(r".+\|\d+\|-?\d+\|\d+\|([a-z0-9_]+)(?:\|sampled-v1)?")


def _load_cache(path: str) -> dict:
    """The cached digests, or {} when the file is missing, unreadable or not ours: the cache only
    saves time, so a broken one is never an error. Read only from a folder no other user can
    change (walked as node/private.py walks), only a regular file of this user's (another user's
    file there could name any digest for any of our files), at most CACHE_BYTES, and only entries
    of the form _cache_key writes, each with a digest of its algorithm's length."""
    where, name = os.path.split(path)
    try:
        with folder(where, make=False) as place:
            fd, st = open_regular(name, follow=False, dir_fd=place.fd, limit=CACHE_BYTES)
            try:
                if st.st_uid != os.geteuid():
                    return {}
                with open(fd, "rb", buffering=0, closefd=False) as stream:
                    data = json.loads(stream.read(CACHE_BYTES + 1))
            finally:
                os.close(fd)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str) and _entry(k, v)}


def _entry(key: str, digest: str) -> bool:
    match = _KEY.fullmatch(key)
    return (match is not None and len(digest) == DIGEST_LENGTHS.get(match.group(1), -1)
            and all(c in "0123456789abcdef" for c in digest))


def _save_cache(path: str, digests: dict) -> None:
    """Written to a temp file and renamed: a crash or a concurrent run never leaves half a file.
    Through node/private.py: the folder is walked from / and made 0700, never through a link
    another user could have placed, and the files are opened relative to it."""
    where, name = os.path.split(path)
    temp = f".shards-{os.urandom(8).hex()}.tmp"
    try:
        with folder(where) as place:
            try:
                place.write_file(temp, json.dumps(digests))
                os.replace(temp, name, src_dir_fd=place.fd, dst_dir_fd=place.fd)
            except OSError:
                try:
                    os.unlink(temp, dir_fd=place.fd)
                except OSError:
                    pass
    except OSError:
        return                      # e.g. a read-only home, or a folder refused: hash again next time
