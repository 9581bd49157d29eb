"""The data shards in each node's data folder: identical on every node unless a fault says not."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

WORDS = ("the model sees tokens and every rank reads its own row group while the gradients "
         "meet in all reduce across the ring of nodes on the lan").split()
ROWS_PER_SHARD = 2000


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.parquet"


def _rows(index: int, altered: bool) -> list[str]:
    rng = random.Random(f"ddp-preflight-lab-{index}")
    rows = [" ".join(rng.choices(WORDS, k=rng.randint(8, 40))) for _ in range(ROWS_PER_SHARD)]
    if altered:
        rows[0] = rows[0][::-1]   # same length, other content: a re-downloaded, different shard
    return rows


def write_shard(path: Path, index: int, altered: bool = False) -> None:
    """A real parquet file when pyarrow is installed (what nanochat-style loaders read),
    else the same rows as plain text: the shard checks only compare bytes."""
    rows = _rows(index, altered)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_text("\n".join(rows) + "\n")
        return
    pq.write_table(pa.table({"text": rows}), path)


def make_dataset(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        write_shard(folder / shard_name(index), index)


def copy_dataset(source: Path, target: Path) -> None:
    """Make target's contents those of source. The folder itself stays: running nodes have it
    bind-mounted, and a new folder in its place would be invisible to them."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in target.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in source.iterdir():
        shutil.copy2(entry, target / entry.name)


def make_mismatched(source: Path, target: Path, count: int) -> None:
    """Fewer shards, and one of those with other content under the same name (seed 001: 201 vs 4)."""
    copy_dataset(source, target)
    keep = max(1, count // 2)
    for index in range(keep, count):
        (target / shard_name(index)).unlink()
    write_shard(target / shard_name(0), 0, altered=True)
