"""The training environment's torch: version, build, backends, devices.

`import torch` costs about a second of CPU. A CPU build's answers do not need it: its version,
git hash and CUDA/HIP versions are in torch/version.py, it has no CUDA devices by construction,
and Linux builds always carry Gloo. CUDA and ROCm builds are imported, to ask the driver."""

from __future__ import annotations

import ast
import importlib.util
import os
import time


def _version_file(folder: str) -> dict:
    values = {}
    with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
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
    except (OSError, SyntaxError):
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

    facts = {
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
    return facts
