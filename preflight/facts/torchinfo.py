"""The training environment's torch: version, build, backends, devices."""

from __future__ import annotations

import time


def torch_facts() -> dict:
    started = time.monotonic()
    try:
        import torch
    except ImportError as exc:
        return {"error": f"torch is not installed in this Python ({exc})", "missing": True}
    import torch.distributed as dist

    facts = {
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "build": "cuda" if torch.version.cuda else ("rocm" if getattr(torch.version, "hip", None) else "cpu"),
        "import_seconds": round(time.monotonic() - started, 3),
        "num_threads": torch.get_num_threads(),
        "distributed": dist.is_available(),
        "backends": [],
    }
    if dist.is_available():
        for name in ("gloo", "nccl", "mpi", "ucc", "xccl"):
            probe = getattr(dist, f"is_{name}_available", None)
            if probe is not None and probe():
                facts["backends"].append(name)
    try:
        facts["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:
        facts["cpu_capability"] = None
    try:
        facts["mkldnn_bf16"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        facts["mkldnn_bf16"] = None
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
