"""
Distributed data loader (the shape of nanochat/dataloader.py): each rank reads its own part.
"""

import pyarrow.parquet as pq  # noqa: F401
import torch

from nanochat.common import get_dist_info
from nanochat.dataset import list_parquet_files  # noqa: F401


def batches(steps, batch_size, features):
    """Each rank's own batches: seeded by its rank, as each rank reads other rows."""
    _, rank, _, _ = get_dist_info()
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        yield torch.randn(batch_size, features, generator=generator)
