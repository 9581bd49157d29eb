"""The training environment's torch: version, build, backends, devices.

`import torch` costs about a second of CPU. A CPU build's answers do not need it: its version,
git hash and CUDA/HIP versions are in torch/version.py, it has no CUDA devices by construction,
and Linux builds always carry Gloo. CUDA and ROCm builds are imported, to ask the driver."""

from __future__ import annotations

import ast
import importlib.util
import os
import time

from ..bounded import read_regular

VERSION_BYTES = 1 << 20       # torch/version.py is a few lines; a FIFO or a huge file there is not torch's

def _version_file(folder: str) -> dict:
    values = {}
    tree = ast.parse(read_regular(os.path.join(folder, "version.py"), VERSION_BYTES).decode("utf-8"))
    for stmt in tree.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
        value = getattr(stmt, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return values


def torch_facts(full: bool = False) -> dict:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return {"error": "torch is not installed in this Python", "missing": True}
    folder = os.path.dirname(spec.origin)
    try:
        version = _version_file(folder)
    except (OSError, SyntaxError, ValueError):
        version = {}
    build = "cuda" if version.get("cuda") else ("rocm" if version.get("hip") else "cpu")
    if full or build != "cpu" or "__version__" not in version:
        return _imported()
    return {"version": version["__version__"], "git_version": version.get("git_version"),
            "cuda": None, "hip": None, "build": "cpu", "path": folder, "imported": False,
            "distributed": True, "backends": ["gloo"], "cuda_available": False, "cuda_devices": []}


def _imported() -> dict:
    started = time.monotonic()
    try:
        import torch
    except ImportError as exc:
        return {"error": f"torch does not import in this Python ({exc})", "missing": True}
    import torch.distributed as dist

    facts: dict = {
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "build": "cuda" if torch.version.cuda else ("rocm" if getattr(torch.version, "hip", None) else "cpu"),
        "path": os.path.dirname(torch.__file__),
        "imported": True,
        "import_seconds": round(time.monotonic() - started, 3),
        "distributed": dist.is_available(),
        "backends": [],
    }
    if dist.is_available():
        for name in ("gloo", "nccl", "mpi", "ucc", "xccl"):
            probe = getattr(dist, f"is_{name}_available", None)
            if probe is not None and probe():
                facts["backends"].append(name)
    facts["cuda_available"] = bool(torch.cuda.is_available())
    devices = []
    if facts["cuda_available"]:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append({"index": index, "name": props.name,
                            "capability": list(torch.cuda.get_device_capability(index)),
                            "memory_bytes": props.total_memory})
    facts["cuda_devices"] = devices
    if facts["build"] == "cuda":
        facts.update(_nccl(torch))
    return facts


NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def _nccl(torch) -> dict:
    """The NCCL torch will use: the version it reports, the library file this process mapped when
    torch loaded it, and the pip wheel that ships it (nccl-parity compares them across nodes)."""
    facts: dict = {"nccl_version": None, "nccl_library": _mapped("libnccl"), "nccl_wheel": _wheel(NCCL_WHEELS)}
    try:
        from torch.cuda import nccl  # not `import torch.cuda.nccl`: that would rebind the argument

        version = nccl.version()
    except Exception as exc:     # a build without NCCL, or a library that does not load
        facts["nccl_error"] = f"{type(exc).__name__}: {exc}"
        return facts
    if isinstance(version, int):  # before torch 1.13: one number, 2708 for 2.7.8 (21903 for 2.19.3)
        parts = (version // 10000, version // 100 % 100, version % 100) if version >= 10000 else \
                (version // 1000, version // 100 % 10, version % 100)
        version = parts
    facts["nccl_version"] = ".".join(str(p) for p in version)
    return facts


def _mapped(library: str) -> str | None:
    """The file of a shared library this process has mapped, e.g. torch's libnccl.so.2."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith(library + "."):
                    return path
    except OSError:
        pass
    return None


def _wheel(names: tuple[str, ...]) -> dict | None:
    from importlib import metadata

    for name in names:
        try:
            return {"name": name, "version": metadata.version(name)}
        except metadata.PackageNotFoundError:
            continue
    return None
