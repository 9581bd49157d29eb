"""Shard hashing throughput against the native tools, and the cached re-run, in one run.

64 files x 16 MiB of random bytes, read once to sit in the page cache, then hashed by our
manifest (no cache) and by `xxhsum -H2` (XXH128) and `b3sum` over the same files, interleaved,
median of a few rounds. Goals: ours >= 0.9x the native tool; a cached re-run of 200 shards
under 0.2 s."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_preflight.node.facts import shards  # noqa: E402

FILES, FILE_SIZE = 64, 16 << 20          # 1 GiB in all
CACHED_FILES, CACHED_SIZE = 200, 64 << 10
ROUNDS = 5


def make_files(folder: Path, count: int, size: int) -> list[str]:
    folder.mkdir()
    paths = []
    for index in range(count):
        path = folder / f"shard_{index:05d}.parquet"
        path.write_bytes(os.urandom(size))
        paths.append(str(path))
    return paths


def warm(paths: list[str]) -> None:
    for path in paths:
        with open(path, "rb") as stream:
            while stream.read(16 << 20):
                pass


def ours(folder: Path, algorithm: str, workers: int | None = None):
    def run() -> float:
        started = time.perf_counter()
        shards.manifest(str(folder), algorithm, workers=workers)
        return time.perf_counter() - started
    return run


def tool(argv: list[str]):
    def run() -> float:
        started = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return time.perf_counter() - started
    return run


def medians(runners: dict) -> dict[str, float]:
    """Median seconds of each runner; rounds interleaved, so drift on the machine hits all alike."""
    times = {name: [] for name in runners}
    for _ in range(ROUNDS):
        for name, run in runners.items():
            times[name].append(run())
    return {name: statistics.median(values) for name, values in times.items()}


def compare(label: str, ours_s: float, theirs_s: float, total: int) -> None:
    mine, native = total / ours_s / 1e9, total / theirs_s / 1e9
    ratio = mine / native
    other = label.split()[-1]
    print(f"{label}: ours {mine:.2f} GB/s, {other} {native:.2f} GB/s, ratio ours/{other} = "
          f"{ratio:.2f}x (goal >= 0.9x) {'OK' if ratio >= 0.9 else 'BELOW GOAL'}")


def main() -> int:
    if "xxh3_128" not in shards.available_algorithms():
        print("xxhash is not installed in this Python: pip install xxhash")
        return 1
    work = Path(tempfile.mkdtemp(prefix="ddp-preflight-bench-"))
    try:
        big = work / "big"
        paths = make_files(big, FILES, FILE_SIZE)
        warm(paths)
        total = FILES * FILE_SIZE
        runners = {"xxh3_128": ours(big, "xxh3_128"), "xxh3_128 1 thread": ours(big, "xxh3_128", 1)}
        xxhsum, b3sum = shutil.which("xxhsum"), shutil.which("b3sum")
        has_blake3 = "blake3" in shards.available_algorithms()
        if xxhsum:
            runners["xxhsum"] = tool([xxhsum, "-H2", *paths])
        if has_blake3:
            runners["blake3"] = ours(big, "blake3")
        if b3sum and has_blake3:
            runners["b3sum"] = tool([b3sum, *paths])
        took = medians(runners)

        workers = min(4, os.cpu_count() or 1)
        print(f"{FILES} files x {FILE_SIZE >> 20} MiB from the page cache, median of {ROUNDS}, "
              f"{workers} hashing threads on {os.cpu_count()} cpus")
        print(f"threads: xxh3_128 {total / took['xxh3_128'] / 1e9:.2f} GB/s with {workers}, "
              f"{total / took['xxh3_128 1 thread'] / 1e9:.2f} GB/s with 1 "
              f"({took['xxh3_128 1 thread'] / took['xxh3_128']:.2f}x)")
        if xxhsum:
            compare("xxh3_128 vs xxhsum", took["xxh3_128"], took["xxhsum"], total)
        else:
            print("xxhsum is not installed (apt-get install xxhash): skipped")
        if not has_blake3:
            print("the blake3 package is not installed here (pip install blake3): b3sum skipped")
        elif b3sum:
            compare("blake3 vs b3sum", took["blake3"], took["b3sum"], total)
        else:
            print("b3sum is not installed (apt-get install b3sum): skipped")

        small = work / "small"
        make_files(small, CACHED_FILES, CACHED_SIZE)
        cache = str(work / "cache.json")
        shards.manifest(str(small), "xxh3_128", cache)            # fills the cache
        reruns = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            found = shards.manifest(str(small), "xxh3_128", cache)
            reruns.append(time.perf_counter() - started)
            assert found["cached_files"] == CACHED_FILES and found["hashed_bytes"] == 0
        rerun = statistics.median(reruns)
        print(f"cached re-run of {CACHED_FILES} shards: {rerun:.3f} s (goal < 0.2 s) "
              f"{'OK' if rerun < 0.2 else 'OVER GOAL'}")
    finally:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
