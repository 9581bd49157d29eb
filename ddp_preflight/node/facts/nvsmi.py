"""The same GPU facts from nvidia-smi, for a node where NVML does not load through ctypes.

Queried as CSV with its header (`--format=csv,nounits`): the header names each column, so a field
this nvidia-smi renamed or lacks cannot shift the others. A field it does not know fails the whole
query ('Field "x" is not a valid field to query.'): that field is renamed or dropped and the query
asked again. The parsers also read the recorded outputs, which were taken with units."""

from __future__ import annotations

import csv
import re

from .util import command

GPU_FIELDS = ("index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total", "memory.used",
              "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "clocks_event_reasons.active",
              "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
# Names older drivers know instead (clocks_event_reasons arrived with driver 535).
OLDER_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)")
NOT_A_VALUE = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|GPU is lost)\]?$", re.I)
MIB = 2**20


class NvidiaSmiError(Exception):
    """nvidia-smi is missing or failed: the reason, in its words."""


def _number(text: str) -> int:
    return int(text.split()[0])             # "81559 MiB" when taken with units


def _mib(text: str) -> int:
    return _number(text) * MIB


def _yes(text: str) -> bool:
    return text.strip().lower() == "yes"


def _bitmask(text: str) -> int:
    return int(text, 16)


# A column's name (as the header writes it, units left out) -> the fact and how to read it.
GPU_COLUMNS: dict = {
    "index": ("index", int), "name": ("name", str), "uuid": ("uuid", str), "pci.bus_id": ("pci_bus_id", str),
    "memory.total": ("memory_total_bytes", _mib), "memory.used": ("memory_used_bytes", _mib),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected_volatile", _number),
    "retired_pages.pending": ("retired_pages_pending", _yes),
    "clocks_event_reasons.active": ("clock_event_reasons", _bitmask),
    "clocks_throttle_reasons.active": ("clock_event_reasons", _bitmask),
    "pcie.link.gen.current": ("pcie_gen", _number), "pcie.link.gen.max": ("pcie_gen_max", _number),
    "pcie.link.width.current": ("pcie_width", _number), "pcie.link.width.max": ("pcie_width_max", _number),
}
# What NVML gives and this fallback does not ask for.
NOT_QUERIED = ("remapped_rows_pending", "remapped_rows_failed", "nvlinks_up", "nvlinks_down")


def rows(text: str) -> list[dict]:
    """CSV with a header -> one dict per row, keyed by the column name without its unit."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    table = list(csv.reader(lines, skipinitialspace=True))
    names = [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in table[0]]
    return [dict(zip(names, (cell.strip() for cell in row))) for row in table[1:]]


def devices(text: str) -> tuple[list[dict], str | None]:
    """`--query-gpu` output -> (devices as NVML's collector writes them, the driver version)."""
    found, driver = [], None
    for row in rows(text):
        device: dict = {"missing": {}}
        for column, value in row.items():
            if column == "driver_version":
                driver = driver or value
                continue
            if column not in GPU_COLUMNS:
                continue
            key, parse = GPU_COLUMNS[column]
            if NOT_A_VALUE.match(value):
                device[key] = None
                device["missing"][key] = f"nvidia-smi: {value.strip('[]')}"
                continue
            try:
                device[key] = parse(value)
            except ValueError:
                device[key] = None
                device["missing"][key] = f"nvidia-smi wrote {value!r}"
        for key, _ in GPU_COLUMNS.values():
            if key not in device:
                device[key] = None
                device["missing"][key] = "not in nvidia-smi's answer"
        for key in NOT_QUERIED:
            device[key] = None
            device["missing"][key] = "not read by the nvidia-smi fallback"
        found.append(device)
    return found, driver


def processes(text: str, gpus: list[dict]) -> list[dict]:
    """`--query-compute-apps` output -> [{gpu (index), pid, used_bytes}]."""
    by_uuid = {d.get("uuid"): d.get("index") for d in gpus}
    found = []
    for row in rows(text):
        used = row.get("used_memory", row.get("used_gpu_memory", ""))
        if "gpu_uuid" in row:
            gpu = by_uuid.get(row["gpu_uuid"])
        else:                               # a query without it (the recording): one GPU is that one
            gpu = gpus[0].get("index") if len(gpus) == 1 else None
        found.append({"gpu": gpu, "pid": int(row["pid"]),
                      "used_bytes": None if NOT_A_VALUE.match(used) else _mib(used)})
    return found


def cuda_driver_version(text: str) -> str | None:
    """The CUDA version the driver supports, from nvidia-smi's header (plain or -q)."""
    match = CUDA_VERSION.search(text)
    return match.group(1) if match else None


def topology_links(text: str) -> list[dict]:
    """`nvidia-smi topo -m` -> [{gpus: [a, b], path, nvlink}] for each pair of GPUs."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)           # it underlines the header on a terminal
    lines = text.splitlines()
    header = next((line for line in lines if re.search(r"\bGPU\d+\b", line) and not line.startswith("GPU")), "")
    columns = [c for c in re.split(r"\t|\s{2,}", header.strip()) if c]
    links = []
    for line in lines:
        if not re.match(r"GPU\d+\s", line):              # a GPU's row; the header is indented
            continue
        cells = [c.strip() for c in re.split(r"\t|\s{2,}", line) if c.strip()]
        a = int(cells[0][3:])
        for column, cell in zip(columns, cells[1:]):
            match = re.fullmatch(r"GPU(\d+)", column)
            if match and int(match.group(1)) > a:
                links.append({"gpus": [a, int(match.group(1))], "path": cell, "nvlink": cell.startswith("NV")})
    return links


def _query(kind: str, fields: tuple[str, ...]) -> str:
    wanted = list(fields)
    while True:
        done = command(["nvidia-smi", f"--query-{kind}={','.join(wanted)}", "--format=csv,nounits"])
        if done is None:
            raise NvidiaSmiError("nvidia-smi is not installed")
        unknown = INVALID_FIELD.search(done.stdout + done.stderr)    # whatever its exit code says
        if unknown is None and done.returncode == 0:
            return done.stdout
        if unknown is None or unknown.group(1) not in wanted:
            raise NvidiaSmiError(_first_line(done) or f"nvidia-smi exited with {done.returncode}")
        at = wanted.index(unknown.group(1))
        older = OLDER_NAMES.get(wanted[at])
        wanted[at:at + 1] = [older] if older else []


def _first_line(done) -> str:
    lines = (done.stdout + "\n" + done.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def collect() -> dict:
    """The facts nvml.collect() gives, from nvidia-smi; NvidiaSmiError when it cannot answer."""
    found, driver = devices(_query("gpu", GPU_FIELDS))
    apps = processes(_query("compute-apps", APP_FIELDS), found)
    header = command(["nvidia-smi"])
    missing = {}
    cuda = cuda_driver_version(header.stdout) if header is not None else None
    if cuda is None:
        missing["cuda_driver_version"] = "nvidia-smi's header shows no CUDA Version"
    links = []
    if len(found) > 1:
        topo = command(["nvidia-smi", "topo", "-m"])
        if topo is not None and topo.returncode == 0:
            links = topology_links(topo.stdout)
        else:
            missing["links"] = "nvidia-smi topo -m failed"
    return {"driver_version": driver, "cuda_driver_version": cuda, "devices": found, "processes": apps,
            "links": links, "missing": missing}
