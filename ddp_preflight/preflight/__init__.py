"""ddp-preflight: check every node before PyTorch distributed training, launch it, watch it."""

__version__ = "0.1.0"
