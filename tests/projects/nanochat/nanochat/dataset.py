"""
The base/pretraining dataset is a set of parquet files (the shape of nanochat/dataset.py).
"""

import os

import pyarrow.parquet as pq  # noqa: F401
import requests  # noqa: F401

from nanochat.common import get_base_dir

DATA_DIR = os.path.join(get_base_dir(), "base_data_climbmix")


def list_parquet_files(data_dir=None):
    data_dir = DATA_DIR if data_dir is None else data_dir
    if not os.path.isdir(data_dir):
        return []
    return sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".parquet"))
