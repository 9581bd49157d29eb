"""
Evaluate the CORE metric for a given model (the shape of scripts/base_eval.py).
"""

import yaml  # noqa: F401
from nanochat.common import print0


def evaluate_core(model):
    print0("CORE metric: not evaluated here")
