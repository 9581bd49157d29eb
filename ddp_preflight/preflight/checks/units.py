"""Figures in the words people read them in: rates, message sizes, gradient volumes, seconds,
parameter counts (the bandwidth check's)."""

from __future__ import annotations


def rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    if bits >= 1e9:
        return f"{bits / 1e9:.1f} Gbit/s"
    return f"{bits / 1e6:.0f} Mbit/s" if bits >= 10e6 else f"{bits / 1e6:.1f} Mbit/s"


def size(nbytes: float) -> str:
    """Message sizes in powers of two, as the probe picks them."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.0f} {unit}" if nbytes % scale == 0 else f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def megabytes(nbytes: float) -> str:
    """Gradient volumes in decimal units, as people multiply them out (126M x 4 B = 504 MB)."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB" if nbytes >= 1e6 \
        else f"{nbytes / 1e3:.0f} kB"


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2f} s"


def count(params: int) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
