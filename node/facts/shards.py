"""A manifest of one node's data folder: every shard's name, size and digest, so the master can
tell whether all nodes train on the same data (seeds 001 and 004: 201 shards on one node, 4 on
the other).

This runs on the nodes, with the training environment's Python: standard library only. xxhash
and blake3 are used when that environment has them, since they hash several times faster than
hashlib's blake2b.

The data folder may be another user's: only regular files are hashed, each read no further than
the size it had when listed, and a file that became a FIFO (or anything else) since it was listed
is skipped with a note, never waited on (node/bounded.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import stat
import tempfile
import threading
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor, wait

from ..bounded import Skipped, open_regular, read_regular

try:
    import xxhash
except ImportError:
    xxhash = None  # type: ignore[assignment]
try:
    import blake3
except ImportError:
    blake3 = None  # type: ignore[assignment]

ALGORITHMS = ("xxh3_128", "blake3", "blake2b")    # in order of preference

CHUNK = 4 << 20                 # in bytes; measured fastest with 2 threads (bench/shard_hashing.py)
CACHE_BYTES = 64 << 20          # a digest cache larger than this is not ours: hash again
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


def default_cache_path(data_dir: str) -> str:
    """Where this node keeps its digests of data_dir. The name holds the hostname and the folder's
    (st_dev, st_ino): lab nodes share one filesystem and home, and must never share a cache."""
    path = _data_root(data_dir)
    info = os.stat(path)
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):         # the XDG spec says to ignore a relative value
        base = os.path.join(os.path.expanduser("~"), ".cache")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    name = f"shards-{host}-{info.st_dev:x}-{info.st_ino:x}.json"
    return os.path.join(base, "ddp-preflight", name)


def manifest(data_dir: str, algorithm: str, cache_path: str | None = None, progress=None,
             *, workers: int | None = None) -> dict:
    """Name, size and digest of every regular file under data_dir.

    progress(done_bytes, total_bytes, done_files, total_files) is called at most ~4 times a
    second and once at the end. workers: hashing threads (default min(4, cpus))."""
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

    def add_bytes(self, count: int) -> None:
        with self._lock:
            self.done_bytes += count
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
    read no further), or Skipped when it is no longer a regular file."""
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
    try:
        with open(fd, "rb", buffering=0) as stream:
            left = size
            while left > 0:
                count = stream.readinto(view[:min(CHUNK, left)])
                if not count:
                    break
                digest.update(view[:count])
                tally.add_bytes(count)
                left -= count
    except OSError as exc:
        raise _unreadable(path, exc) from None
    tally.add_file()
    return digest.hexdigest()


def _cache_key(f: _File, algorithm: str) -> str:
    # A file whose path, size, mtime and inode are unchanged is taken as unchanged: re-reading
    # hundreds of GB on every preflight is what would make people skip the check.
    return f"{f.path}|{f.size}|{f.mtime_ns}|{f.inode}|{algorithm}"


def _load_cache(path: str) -> dict:
    """The cached digests, or {} when the file is missing, unreadable or not ours: the cache only
    saves time, so a broken one is never an error."""
    try:
        data = json.loads(read_regular(path, CACHE_BYTES))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _save_cache(path: str, digests: dict) -> None:
    """Written to a temp file and renamed: a crash or a concurrent run never leaves half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".shards-", suffix=".tmp")
    except OSError:
        return                      # e.g. a read-only home: hash again next time
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            json.dump(digests, stream)
        os.replace(temp, path)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass
