"""The NVIDIA driver's own view of its GPUs, through NVML (libnvidia-ml.so.1) and ctypes.

The library comes with the driver, so nothing is installed on the node. Struct layouts and
constants are nvml.h's. Every call is guarded: a function this driver's NVML lacks, or an error
it returns, makes that one value None with the reason in `missing`, never the whole section."""

from __future__ import annotations

import ctypes

LIBRARY = "libnvidia-ml.so.1"

# nvml.h: return codes and enum values used below.
SUCCESS = 0
ERROR_INSUFFICIENT_SIZE = 7
VALUE_NOT_AVAILABLE = 2**64 - 1        # unsigned long long NVML_VALUE_NOT_AVAILABLE
MEMORY_ERROR_TYPE_UNCORRECTED = 1      # nvmlMemoryErrorType_t
VOLATILE_ECC = 0                       # nvmlEccCounterType_t: since the driver last loaded
P2P_CAPS_INDEX_NVLINK = 2              # nvmlGpuP2PCapsIndex_t
P2P_STATUS_OK = 0                      # nvmlGpuP2PStatus_t
NVLINK_MAX_LINKS = 18                  # NVML_NVLINK_MAX_LINKS
# nvmlGpuTopologyLevel_t, in the words of `nvidia-smi topo -m`.
TOPOLOGY = {0: "BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


class Memory(ctypes.Structure):            # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class PciInfo(ctypes.Structure):           # nvmlPciInfo_t
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class ProcessInfo(ctypes.Structure):       # nvmlProcessInfo_t, as the _v2 and _v3 calls fill it
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class NvmlError(Exception):
    """One NVML call failed: the function's name and NVML's reason."""


class Nvml:
    """The loaded library, initialised. OSError when it does not load, NvmlError when it does
    not initialise (no driver loaded, or a library that does not match the kernel module)."""

    def __init__(self, library: str = LIBRARY):
        self.lib = ctypes.CDLL(library)
        self.call("nvmlInit_v2")

    def close(self) -> None:
        try:
            self.call("nvmlShutdown")
        except NvmlError:
            pass

    def raw(self, name: str, *args) -> int:
        function = getattr(self.lib, name, None)
        if function is None:
            raise NvmlError(f"{name} is not in this driver's NVML")
        return function(*args)

    def call(self, name: str, *args) -> None:
        code = self.raw(name, *args)
        if code != SUCCESS:
            raise NvmlError(f"{name}: {self.reason(code)}")

    def reason(self, code: int) -> str:
        describe = getattr(self.lib, "nvmlErrorString", None)
        if describe is None:
            return f"NVML error {code}"
        describe.restype = ctypes.c_char_p
        return (describe(code) or b"").decode(errors="replace") or f"NVML error {code}"

    def number(self, name: str, *args, ctype=ctypes.c_uint) -> int:
        out = ctype()
        self.call(name, *args, ctypes.byref(out))
        return out.value

    def text(self, name: str, *args, size: int = 96) -> str:
        buffer = ctypes.create_string_buffer(size)
        self.call(name, *args, buffer, ctypes.c_uint(size))
        return buffer.value.decode(errors="replace")


class Reading:
    """Values read one at a time: a failure is that value's absence, with its reason."""

    def __init__(self) -> None:
        self.values: dict = {}
        self.missing: dict = {}

    def take(self, keys, read) -> None:
        keys = (keys,) if isinstance(keys, str) else keys
        try:
            got = read()
        except Exception as exc:       # NvmlError, or a ctypes error on an unexpected driver
            for key in keys:
                self.values[key] = None
                self.missing[key] = str(exc) if isinstance(exc, NvmlError) else f"{type(exc).__name__}: {exc}"
            return
        for key, value in zip(keys, got if len(keys) > 1 else (got,)):
            self.values[key] = value


def cuda_version(number: int) -> str:
    """NVML's CUDA version number (13000) as CUDA writes it (13.0)."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _cuda_driver_version(nvml: Nvml) -> str:
    try:                                       # nvmlSystemGetCudaDriverVersion_v2
        return cuda_version(nvml.number("nvmlSystemGetCudaDriverVersion_v2", ctype=ctypes.c_int))
    except NvmlError:                          # drivers before it have the first version
        return cuda_version(nvml.number("nvmlSystemGetCudaDriverVersion", ctype=ctypes.c_int))


def _memory(nvml: Nvml, handle) -> tuple[int, int]:
    memory = Memory()
    nvml.call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
    return memory.total, memory.used


def _bus_id(nvml: Nvml, handle) -> str:
    info = PciInfo()
    nvml.call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(info))
    return info.busId.decode(errors="replace")


def _remapped_rows(nvml: Nvml, handle) -> tuple[bool, bool]:
    """(a remapping waits for a GPU reset, a remapping failed): Ampere and newer."""
    corrected, uncorrected, pending, failed = (ctypes.c_uint() for _ in range(4))
    nvml.call("nvmlDeviceGetRemappedRows", handle, ctypes.byref(corrected), ctypes.byref(uncorrected),
              ctypes.byref(pending), ctypes.byref(failed))
    return bool(pending.value), bool(failed.value)


def _clock_event_reasons(nvml: Nvml, handle) -> int:
    try:                                       # the name since driver 535
        return nvml.number("nvmlDeviceGetCurrentClocksEventReasons", handle, ctype=ctypes.c_ulonglong)
    except NvmlError:
        return nvml.number("nvmlDeviceGetCurrentClocksThrottleReasons", handle, ctype=ctypes.c_ulonglong)


def _nvlinks(nvml: Nvml, handle) -> tuple[int, int]:
    """(links up, links down) of the links this GPU has; NvmlError when it has none."""
    up = down = 0
    first_error = None
    for link in range(NVLINK_MAX_LINKS):
        try:                                   # nvmlDeviceGetNvLinkState: a link this GPU lacks errs
            active = nvml.number("nvmlDeviceGetNvLinkState", handle, ctypes.c_uint(link))
        except NvmlError as exc:
            first_error = first_error or exc
            continue
        up, down = (up + 1, down) if active else (up, down + 1)
    if up + down == 0:
        raise first_error or NvmlError("no NVLink")
    return up, down


def compute_processes(nvml: Nvml, handle) -> list[tuple[int, int | None]]:
    """(pid, bytes used or None) of the compute processes on this GPU."""
    name = "nvmlDeviceGetComputeRunningProcesses_v3"
    if getattr(nvml.lib, name, None) is None:
        name = "nvmlDeviceGetComputeRunningProcesses_v2"
    count = ctypes.c_uint(0)
    code = nvml.raw(name, handle, ctypes.byref(count), None)
    if code == SUCCESS:
        return []
    if code != ERROR_INSUFFICIENT_SIZE:
        raise NvmlError(f"{name}: {nvml.reason(code)}")
    count.value = count.value * 2 + 5          # room for processes that start meanwhile
    infos = (ProcessInfo * count.value)()
    nvml.call(name, handle, ctypes.byref(count), infos)
    return [(p.pid, None if p.usedGpuMemory == VALUE_NOT_AVAILABLE else p.usedGpuMemory)
            for p in infos[:count.value]]


def device(nvml: Nvml, index: int) -> tuple[dict, object, list]:
    """One GPU's facts, its handle, and its compute processes [(pid, bytes)]."""
    handle = ctypes.c_void_p()
    nvml.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
    r = Reading()
    r.take("name", lambda: nvml.text("nvmlDeviceGetName", handle))
    r.take("uuid", lambda: nvml.text("nvmlDeviceGetUUID", handle))
    r.take("pci_bus_id", lambda: _bus_id(nvml, handle))
    r.take(("memory_total_bytes", "memory_used_bytes"), lambda: _memory(nvml, handle))
    r.take("ecc_uncorrected_volatile", lambda: nvml.number(       # nvmlDeviceGetTotalEccErrors
        "nvmlDeviceGetTotalEccErrors", handle, MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC, ctype=ctypes.c_ulonglong))
    r.take("retired_pages_pending", lambda: bool(nvml.number(     # before Ampere
        "nvmlDeviceGetRetiredPagesPendingStatus", handle, ctype=ctypes.c_int)))
    r.take(("remapped_rows_pending", "remapped_rows_failed"), lambda: _remapped_rows(nvml, handle))
    r.take("clock_event_reasons", lambda: _clock_event_reasons(nvml, handle))
    r.take("pcie_gen", lambda: nvml.number("nvmlDeviceGetCurrPcieLinkGeneration", handle))
    r.take("pcie_gen_max", lambda: nvml.number("nvmlDeviceGetMaxPcieLinkGeneration", handle))  # of GPU and slot
    r.take("pcie_width", lambda: nvml.number("nvmlDeviceGetCurrPcieLinkWidth", handle))
    r.take("pcie_width_max", lambda: nvml.number("nvmlDeviceGetMaxPcieLinkWidth", handle))
    r.take(("nvlinks_up", "nvlinks_down"), lambda: _nvlinks(nvml, handle))
    processes = Reading()
    processes.take("list", lambda: compute_processes(nvml, handle))
    missing = dict(r.missing)
    if processes.missing:
        missing["processes"] = processes.missing["list"]
    return {"index": index, **r.values, "missing": missing}, handle, processes.values["list"] or []


def _path(nvml: Nvml, first, second) -> str:
    """The closest common ancestor of two GPUs on the PCIe tree (BOARD closest, SYS farthest)."""
    level = nvml.number("nvmlDeviceGetTopologyCommonAncestor", first, second, ctype=ctypes.c_int)
    return TOPOLOGY.get(level, str(level))


def _link(nvml: Nvml, a: int, b: int, first, second) -> dict:
    r = Reading()
    r.take("path", lambda: _path(nvml, first, second))
    r.take("nvlink", lambda: nvml.number(                        # nvmlDeviceGetP2PStatus
        "nvmlDeviceGetP2PStatus", first, second, P2P_CAPS_INDEX_NVLINK, ctype=ctypes.c_int) == P2P_STATUS_OK)
    return {"gpus": [a, b], **r.values, **({"missing": r.missing} if r.missing else {})}


def collect(nvml: Nvml) -> dict:
    """The driver, every GPU, the compute processes on each, and how each pair is connected."""
    r = Reading()
    r.take("driver_version", lambda: nvml.text("nvmlSystemGetDriverVersion", size=80))
    r.take("cuda_driver_version", lambda: _cuda_driver_version(nvml))
    count = nvml.number("nvmlDeviceGetCount_v2")
    devices, handles, processes = [], {}, []
    for index in range(count):
        try:
            facts, handle, found = device(nvml, index)
        except NvmlError as exc:               # a GPU that fell off the bus still counts, and says why
            devices.append({"index": index, "error": str(exc)})
            continue
        devices.append(facts)
        handles[index] = handle
        processes += [{"gpu": index, "pid": pid, "used_bytes": used} for pid, used in found]
    links = [_link(nvml, a, b, handles[a], handles[b])
             for a in handles for b in handles if a < b]
    return {**r.values, "devices": devices, "processes": processes, "links": links, "missing": r.missing}
