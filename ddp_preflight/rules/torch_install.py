"""What to give pip for a node's torch: the master's release, in the build the node needs, with
the index in the command. One rule for torch-parity's fix and a launched node that has no torch."""

from __future__ import annotations

from .facts import Missing, TorchFacts

# PyTorch's own wheel index, one folder per build (cpu, cu128, rocm6.3), as its install page
# writes the command: `pip install torch --index-url https://download.pytorch.org/whl/cpu`.
PYTORCH_WHEELS = "https://download.pytorch.org/whl/"


def wanted_torch(master: TorchFacts | Missing, node: TorchFacts | Missing) -> str:
    """pip's arguments for the master's torch release in the build this node needs, the index in
    the command: plain `torch==X` from PyPI is the CUDA build on Linux, so a +cpu or +cuXXX
    build comes only from PyTorch's index for it. The build is the node's own (a CPU node stays on
    the CPU build), the master's where the node has none; the master's exact wheel where their
    builds are of one kind (it exists for that release)."""
    if isinstance(master, Missing):
        return "torch"
    release, _, master_build = master.version.partition("+")
    build = master_build
    if isinstance(node, TorchFacts) and node.build != master.build:
        own = node.version.partition("+")[2]
        # A CPU build exists for every release; a node's other CUDA or ROCm build, by its own label.
        build = "cpu" if node.build == "cpu" else own
    return f"torch=={release}" + (f" --index-url {PYTORCH_WHEELS}{build}" if build else "")
