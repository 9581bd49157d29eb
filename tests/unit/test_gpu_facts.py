"""ddp_preflight/node/facts/gpu.py and its parts on this machine (no NVIDIA driver: it must say so cleanly), and
the nvidia-smi fallback's parsers on the H100 host's recorded outputs. Where a driver must answer,
a fake nvidia-smi replays those recordings: the one thing that cannot exist here is the GPU."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_preflight.node.facts import gpu, nvml, nvsmi, torchinfo
from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status
from ddp_preflight.transport import LocalNode

from .gpu_fixtures import H100, MIB, recorded_apps, recording

PUBLIC = Path(__file__).parent / "artifacts" / "gpu-public"


# --- this machine: no driver ---------------------------------------------------------------------

def test_without_a_driver_the_section_says_so_and_keeps_the_presence_keys(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))          # no nvidia-smi on it (nor anywhere here)
    facts = gpu.gpu_facts()

    assert facts["source"] is None
    assert facts["no_driver"].startswith("no NVIDIA driver: libnvidia-ml.so.1 does not load (")
    assert facts["no_driver"].endswith("; nvidia-smi is not installed")
    # What device-dtype reads today is still there.
    assert facts["nvidia_devices"] == [] and facts["nvidia_driver"] is None and facts["amd_kfd"] is False
    assert facts["processes"] == [] and "devices" not in facts


def test_the_facts_program_reports_the_gpu_section_on_this_machine():
    facts = LocalNode("here", sys.executable).collect({"sections": ["facts"], "master_port": 29500})
    assert "error" not in facts["gpu"]
    assert facts["gpu"]["source"] is None and facts["gpu"]["no_driver"].startswith("no NVIDIA driver")


def test_visible_devices_are_recorded_unset_empty_or_as_written(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-79a24157,1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)

    assert gpu.gpu_facts()["visible"] == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "GPU-79a24157,1",
                                          "CUDA_DEVICE_ORDER": None}


# --- NVML through ctypes -----------------------------------------------------------------------

def test_the_structs_have_nvml_h_sizes():
    # nvmlMemory_t: 3 x unsigned long long; nvmlPciInfo_t: char[16], 5 x unsigned int, char[32];
    # nvmlProcessInfo_t: unsigned int, (padding), unsigned long long, 2 x unsigned int.
    assert ctypes.sizeof(nvml.Memory) == 24
    assert ctypes.sizeof(nvml.PciInfo) == 68
    assert ctypes.sizeof(nvml.ProcessInfo) == 24


def test_a_library_without_nvml_is_a_reason_not_a_crash():
    with pytest.raises(OSError):
        nvml.Nvml()                                   # libnvidia-ml.so.1 is not on this machine
    with pytest.raises(nvml.NvmlError, match="nvmlInit_v2 is not in this driver's NVML"):
        nvml.Nvml("libc.so.6")                        # loads, but has no NVML in it


def test_a_failed_read_is_that_values_absence_with_its_reason():
    reading = nvml.Reading()

    def fails():
        raise nvml.NvmlError("nvmlDeviceGetRemappedRows: Not Supported")
    reading.take(("remapped_rows_pending", "remapped_rows_failed"), fails)
    reading.take(("pcie_gen", "pcie_gen_max"), lambda: (5, 5))
    reading.take("name", lambda: "NVIDIA H100 80GB HBM3")

    assert reading.values == {"remapped_rows_pending": None, "remapped_rows_failed": None,
                              "pcie_gen": 5, "pcie_gen_max": 5, "name": "NVIDIA H100 80GB HBM3"}
    assert reading.missing == {"remapped_rows_pending": "nvmlDeviceGetRemappedRows: Not Supported",
                               "remapped_rows_failed": "nvmlDeviceGetRemappedRows: Not Supported"}


def test_nvmls_cuda_version_number_reads_as_cuda_writes_it():
    assert nvml.cuda_version(13000) == "13.0" and nvml.cuda_version(12080) == "12.8"


# --- the nvidia-smi fallback's parsers, on the recordings ---------------------------------------

def test_the_recorded_gpu_query_parses_with_its_units():
    [device], driver = nvsmi.devices(recording("nvidia-smi-query.csv"))

    assert driver == "580.159.04"
    assert device["index"] == 0 and device["name"] == "NVIDIA H100 80GB HBM3"
    assert device["uuid"] == "GPU-79a24157-c204-df4b-4bfa-0702835d7fe1"
    assert device["pci_bus_id"] == "00000000:00:06.0"
    assert device["memory_total_bytes"] == 81559 * MIB and device["memory_used_bytes"] == 0
    assert device["ecc_uncorrected_volatile"] == 0
    assert device["clock_event_reasons"] == 0x1                    # GPU idle
    # Asked of nvidia-smi but not in this recorded query: absent, with the reason.
    assert device["pcie_width"] is None and device["missing"]["pcie_width"] == "not in nvidia-smi's answer"
    assert device["missing"]["remapped_rows_pending"] == "not read by the nvidia-smi fallback"


def test_not_a_value_is_an_absence_with_nvidia_smis_words():
    text = "index, name, ecc.errors.uncorrected.volatile.total, retired_pages.pending\n0, X, [N/A], [Not Supported]\n"
    [device], _ = nvsmi.devices(text)
    assert device["ecc_uncorrected_volatile"] is None and device["missing"]["ecc_uncorrected_volatile"] == "nvidia-smi: N/A"
    assert device["missing"]["retired_pages_pending"] == "nvidia-smi: Not Supported"


def test_the_recorded_compute_apps_parse_on_the_one_gpu():
    [device], _ = nvsmi.devices(recording("nvidia-smi-query.csv"))
    assert nvsmi.processes(recorded_apps(), [device]) == [{"gpu": 0, "pid": 444, "used_bytes": 1836 * MIB}]


def test_the_cuda_version_comes_from_the_recorded_header():
    assert nvsmi.cuda_driver_version(recording("nvidia-smi-q.txt")) == "13.0"
    assert nvsmi.cuda_driver_version("no header here") is None


def test_topology_of_one_gpu_has_no_pairs_and_of_four_six():
    assert nvsmi.topology_links(recording("nvidia-smi-topo.txt")) == []
    links = nvsmi.topology_links((PUBLIC / "nccl-issue-634-topo.txt").read_text())
    assert [link["gpus"] for link in links] == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    assert all(link["path"] == "NV4" and link["nvlink"] for link in links)


# --- the fallback end to end, with a fake nvidia-smi that replays the recordings ------------------

FAKE = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$1" in
  --query-gpu=*)
    case "$1" in *"$REJECT"*)
      if [ -n "$REJECT" ]; then echo "Field \\"$REJECT\\" is not a valid field to query."; exit "$REJECT_EXIT"; fi;;
    esac
    cat "$H100/nvidia-smi-query.csv" ;;
  --query-compute-apps=*)
    printf 'gpu_uuid, pid, used_gpu_memory [MiB]\\nGPU-79a24157-c204-df4b-4bfa-0702835d7fe1, %s, 1836 MiB\\n' "$HOLDER" ;;
  topo) cat "$H100/nvidia-smi-topo.txt" ;;
  *) cat "$H100/nvidia-smi-q.txt" ;;
esac
"""


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """nvidia-smi answering with the H100 host's recordings. DERIVED: the compute-apps answer is
    the recorded one (1836 MiB) for a process of this test's, so its /proc can be read; plain
    `nvidia-smi` answers with the recorded `-q` (the plain table was not recorded; both headers
    carry the CUDA version)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text(FAKE)
    (folder / "nvidia-smi").chmod(0o755)
    log = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("H100", str(H100))
    monkeypatch.setenv("REJECT", "")
    return log


@pytest.fixture
def leftover_rank(tmp_path):
    """A real process that looks like a training rank: a train*.py script with RANK and WORLD_SIZE."""
    script = tmp_path / "train_gpu_hang.py"
    script.write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "RANK": "0", "WORLD_SIZE": "2"})
    time.sleep(0.2)
    yield proc
    proc.kill()
    proc.wait()


def test_the_fallback_reports_the_recorded_host_and_who_holds_its_memory(fake_nvidia_smi, leftover_rank, monkeypatch):
    monkeypatch.setenv("HOLDER", str(leftover_rank.pid))
    facts = gpu.gpu_facts()

    assert facts["source"] == "nvidia-smi" and facts["nvml_failed"].startswith("libnvidia-ml.so.1 does not load")
    assert facts["driver_version"] == "580.159.04" and facts["cuda_driver_version"] == "13.0"
    assert [d["uuid"] for d in facts["devices"]] == ["GPU-79a24157-c204-df4b-4bfa-0702835d7fe1"]
    [holder] = facts["processes"]
    assert holder["gpu"] == 0 and holder["pid"] == leftover_rank.pid and holder["used_bytes"] == 1836 * MIB
    assert holder["visible_here"] and holder["user"] == "root" and holder["cmdline"][1].endswith("train_gpu_hang.py")
    assert set(holder["why"]) == {"RANK in its environment", "a training script"}
    # One GPU: no pairs to ask `nvidia-smi topo -m` about.
    assert not any(line.startswith("topo") for line in fake_nvidia_smi.read_text().splitlines())

    # ...and gpu-memory-held, given these facts, offers to kill it: a training leftover.
    node = NodeFacts("h100", {"gpu": facts, "torch": {"build": "cuda", "imported": True, "cuda_available": True,
                                                      "cuda_devices": [{"index": 0}]}})
    [result] = run_checks(Context((node,), Options(device="cuda", backend="nccl")), [BY_ID["gpu-memory-held"]])
    assert result.status is Status.WARN                 # its parent (this test) is alive: not an orphan
    assert result.fix == f"kill {leftover_rank.pid}   # on h100: leftover training"


@pytest.mark.parametrize("exit_code", ["2", "0"])
def test_a_field_the_driver_does_not_know_is_asked_by_its_older_name(fake_nvidia_smi, monkeypatch, exit_code):
    # DERIVED: a driver before 535, which knows clocks_throttle_reasons.active only (the fake
    # still answers with the recorded table). Its refusal is read whatever its exit code.
    monkeypatch.setenv("REJECT", "clocks_event_reasons.active")
    monkeypatch.setenv("REJECT_EXIT", exit_code)
    monkeypatch.setenv("HOLDER", "1")
    facts = gpu.gpu_facts()

    queries = [line for line in fake_nvidia_smi.read_text().splitlines() if line.startswith("--query-gpu")]
    assert len(queries) == 2
    assert "clocks_event_reasons.active" in queries[0]
    assert "clocks_throttle_reasons.active" in queries[1] and "clocks_event_reasons" not in queries[1]
    assert facts["source"] == "nvidia-smi" and len(facts["devices"]) == 1


# --- the rest of the section -----------------------------------------------------------------------

def test_numa_placement_is_read_from_sysfs_under_nvmls_bus_id():
    folder = sorted(Path("/sys/bus/pci/devices").iterdir())[0]          # a real PCI device here
    domain, rest = folder.name.split(":", 1)
    placed = gpu.placement(f"0000{domain}:{rest}".upper())             # as NVML writes bus ids
    node = int((folder / "numa_node").read_text())
    assert placed["numa_node"] == (node if node >= 0 else None)
    assert placed["cpu_affinity"] == ((folder / "local_cpulist").read_text().strip() or None)
    assert gpu.placement(None) == {"numa_node": None, "cpu_affinity": None}


def test_no_infiniband_here_is_an_empty_list():
    assert gpu.infiniband() == [] and gpu.infiniband("/nonexistent") == []


def test_nccl_conf_values_and_the_user_file_before_the_systems(tmp_path, monkeypatch):
    conf = tmp_path / "nccl.conf"
    conf.write_text("# site settings\nNCCL_SOCKET_IFNAME==eth0\nNCCL_IB_DISABLE=1\nOTHER=x\n")
    monkeypatch.setenv("NCCL_CONF_FILE", str(conf))
    facts = gpu.nccl_conf()
    assert facts["files"][0] == str(conf)
    assert facts["values"]["NCCL_SOCKET_IFNAME"] == "=eth0" and facts["values"]["NCCL_IB_DISABLE"] == "1"
    assert "OTHER" not in facts["values"]


def test_torch_facts_find_a_mapped_library_and_a_wheel():
    assert torchinfo._mapped("libc") and "libc" in os.path.basename(torchinfo._mapped("libc"))
    assert torchinfo._mapped("libnccl") is None                       # a CPU build here
    assert torchinfo._wheel(("pytest",))["name"] == "pytest"
    assert torchinfo._wheel(("nvidia-nccl-cu12",)) is None
