"""ddp_preflight/preflight/facts.py: the nodes' JSON, as recorded (artifacts/lab_*.json, artifacts/gpu-h100),
parsed into typed facts; failed and absent sections are Missing with the reason; keys this
version does not know are ignored."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ddp_preflight.rules.facts import (
    CodeFacts,
    CpuFacts,
    DriverView,
    Facts,
    GlooBind,
    GpuFacts,
    Missing,
    NetworkFacts,
    PortHolders,
    PythonFacts,
    Route,
    ShardManifest,
    TorchFacts,
)

from . import facts_fixtures as ff
from . import gpu_fixtures as g

ARTIFACTS = Path(__file__).parent / "artifacts"
LAB = sorted(p.stem for p in ARTIFACTS.glob("lab_*.json"))

# Every key Facts reads from the wire, by its attribute (the wire's own names).
SECTIONS = ("os", "python", "cpu", "memory", "gpu", "env", "torch", "network", "master_port", "processes",
            "ptrace", "code", "shards", "launch", "hash_algorithms", "clock", "reached_at")


def recorded_nodes():
    """(artifact, node, the facts it sent) for every recorded node, lab and GPU host."""
    for name in LAB:
        for entry in json.loads((ARTIFACTS / f"{name}.json").read_text())["nodes"]:
            yield name, entry["node"], entry["facts"]
    yield "gpu-h100", "h100", g.recorded_facts()
    yield "gpu-h100 (derived driver view)", "h100", g.h100()


@pytest.mark.parametrize("artifact, node, wire", list(recorded_nodes()),
                         ids=[f"{a}:{n}" for a, n, _ in recorded_nodes()])
def test_every_recorded_section_parses(artifact, node, wire):
    facts = Facts.from_json(wire)

    sent = [s for s in SECTIONS if s in wire]
    assert sent, "a recording with no section"
    missing = {s: getattr(facts, s) for s in sent if isinstance(getattr(facts, s), Missing)}
    assert missing == {}
    # ... and what was not sent is Missing, saying so.
    for name in set(SECTIONS) - set(sent) - {"reached_at"}:
        assert getattr(facts, name) == Missing(f"no {name} facts were collected")


@pytest.mark.parametrize("name", LAB)
def test_the_lab_recordings_read_as_sent(name):
    for entry in json.loads((ARTIFACTS / f"{name}.json").read_text())["nodes"]:
        wire, facts = entry["facts"], Facts.from_json(entry["facts"])
        assert isinstance(facts.cpu, CpuFacts) and facts.cpu.physical_cores == wire["cpu"]["physical_cores"]
        assert facts.cpu.bf16_instructions == tuple(wire["cpu"]["bf16_instructions"])
        assert isinstance(facts.torch, TorchFacts) and facts.torch.version == wire["torch"]["version"]
        assert facts.torch.backends == tuple(wire["torch"]["backends"])
        assert isinstance(facts.network, NetworkFacts)
        assert [i.name for i in facts.network.interfaces] == [i["name"] for i in wire["network"]["interfaces"]]
        assert [a.address for i in facts.network.interfaces for a in i.addresses] == \
            [a["address"] for i in wire["network"]["interfaces"] for a in i["addresses"]]
        assert isinstance(facts.network.gloo_bind, GlooBind)
        assert facts.network.gloo_bind.address == wire["network"]["gloo_bind"]["address"]
        assert isinstance(facts.network.route_to_master, Route)
        assert facts.network.route_to_master.interface == wire["network"]["route_to_master"]["interface"]
        # Reverse-path filtering (older recordings: not read, None).
        route = wire["network"]["route_to_master"]
        assert (facts.network.route_to_master.source, facts.network.route_to_master.then_interface,
                facts.network.route_to_master.table) == (route.get("source"), route.get("then_interface"),
                                                         route.get("table"))
        assert [i.rp_filter for i in facts.network.interfaces] == \
            [i.get("rp_filter") for i in wire["network"]["interfaces"]]
        assert facts.network.rp_filter_drops == wire["network"].get("rp_filter_drops")
        assert facts.network.ephemeral_ports == tuple(wire["network"]["ephemeral_ports"])
        assert isinstance(facts.master_port, PortHolders)
        assert facts.master_port.listening == wire["master_port"]["listening"]
        assert [p.pid for p in facts.processes] == [p["pid"] for p in wire["processes"]["processes"]]
        assert facts.env == wire["env"]["vars"]
        assert isinstance(facts.shards, ShardManifest) and facts.shards.file_count == wire["shards"]["file_count"]
        assert {n: (f.size, f.digest) for n, f in facts.shards.files.items()} == \
            {n: (f["size"], f["digest"]) for n, f in wire["shards"]["files"].items()}
        assert facts.clock.offset == wire["clock"]["offset"] and facts.reached_at == wire["reached_at"]
        assert facts.hash_algorithms == tuple(wire["hash_algorithms"]["available"])
        # What goes into a result's details whole is the node's own JSON, unchanged.
        assert facts.network.gloo_bind.to_json() == wire["network"]["gloo_bind"]
        assert facts.ptrace.to_json() == wire["ptrace"]


def test_the_gpu_recordings_read_as_sent():
    wire = g.h100()
    gpu = Facts.from_json(wire).gpu
    assert isinstance(gpu, GpuFacts) and isinstance(gpu.driver, DriverView)
    assert gpu.driver.source == "nvidia-smi" and gpu.driver.cuda_driver_version == "13.0"
    [device], [sent] = gpu.driver.devices, wire["gpu"]["devices"]
    assert (device.index, device.name, device.pci_bus_id, device.memory_total_bytes) == \
        (0, "NVIDIA H100 80GB HBM3", sent["pci_bus_id"], sent["memory_total_bytes"])
    assert (device.pcie_gen, device.pcie_width, device.numa_node) == (5, 16, 0)
    assert device.missing == sent["missing"] and device.to_json() == sent
    assert gpu.visible == {"CUDA_VISIBLE_DEVICES": None, "NVIDIA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}
    # The recording from before the driver view: the GPU is there, what the driver says was not asked.
    old = Facts.from_json(g.recorded_facts()).gpu
    assert isinstance(old, GpuFacts) and old.nvidia_devices == ("nvidia0",)
    assert old.driver == Missing("not collected (a collector older than this check)")
    assert isinstance(old.visible, Missing) and isinstance(old.infiniband, Missing)


# --- failed and absent sections ----------------------------------------------------------------

def test_a_failed_section_is_missing_with_the_nodes_reason():
    art = ff.processes_failed(ff.faulted(), "worker1")
    facts = Facts.from_json(ff.facts(art, "worker1"))
    assert facts.processes == Missing("PermissionError: [Errno 13] Permission denied: '/proc' (at processes.py:96)",
                                      failed=True)
    assert not facts.processes                  # Missing is false: `if not x` reads as missing too
    assert isinstance(facts.cpu, CpuFacts)      # one failed section leaves the others alone


def test_what_a_failed_section_says_about_the_thing_itself_is_kept():
    no_torch = Facts.from_json(ff.facts(ff.torch_missing(ff.clean(), "worker1"), "worker1")).torch
    assert no_torch == Missing("torch is not installed in this Python", failed=True, absent=True)
    unreadable = Facts.from_json({"shards": {"error": "cannot read /data (Permission denied): ...", "missing": False}})
    assert unreadable.shards == Missing("cannot read /data (Permission denied): ...", failed=True, absent=False)
    no_folder = Facts.from_json({"code": {"error": "code folder /x does not exist here", "missing": True, "dir": "/x"}})
    assert no_folder.code == Missing("code folder /x does not exist here", failed=True, absent=True, path="/x")


def test_an_absent_section_is_missing_and_says_none_was_collected():
    wire = ff.facts(ff.clean(), "worker1")
    del wire["ptrace"]
    facts = Facts.from_json(wire)
    assert facts.ptrace == Missing("no ptrace facts were collected")
    assert not facts.ptrace.failed
    # A node that was not reached has no section at all.
    assert all(isinstance(getattr(Facts.from_json({}), s), Missing) for s in SECTIONS)


def test_unknown_keys_are_ignored_everywhere():
    wire = ff.facts(ff.faulted(), "master")
    newer = copy.deepcopy(wire)
    newer["a_section_from_a_newer_collector"] = {"anything": [1, 2]}
    for section in ("os", "python", "cpu", "memory", "torch", "network", "master_port", "processes", "ptrace",
                    "shards", "launch", "clock"):
        newer[section]["a_key_from_a_newer_collector"] = {"nested": True}
    newer["network"]["interfaces"][0]["newer"] = 1
    newer["network"]["interfaces"][0]["addresses"][0]["newer"] = 1
    newer["network"]["gloo_bind"]["newer"] = 1
    assert Facts.from_json(newer) == Facts.from_json(wire)


def test_older_collectors_keys_are_ignored_too():
    # lab_clean.json was recorded with torch facts that had num_threads, cpu_capability and
    # mkldnn_bf16 (since dropped) and no path or imported (added later).
    wire = ff.facts(ff.clean(), "master")
    assert {"num_threads", "cpu_capability", "mkldnn_bf16"} <= set(wire["torch"]) and "imported" not in wire["torch"]
    torch = Facts.from_json(wire).torch
    assert isinstance(torch, TorchFacts) and torch.imported is False and torch.version == wire["torch"]["version"]


@pytest.mark.parametrize("section, edit, reason", [
    ("cpu", lambda s: s.pop("physical_cores"), "the cpu facts could not be read: no physical_cores"),
    ("cpu", lambda s: s.update(physical_cores="8"),
     "the cpu facts could not be read: physical_cores is not a whole number (str)"),
    ("torch", lambda s: s.pop("version"), "the torch facts could not be read: no version"),
    ("network", lambda s: s["interfaces"][0].pop("name"), "the network facts could not be read: no name"),
    ("master_port", lambda s: s.pop("holders"), "the master_port facts could not be read: no holders"),
    ("ptrace", lambda s: s.pop("ptrace_scope"), "the ptrace facts could not be read: no ptrace_scope"),
    ("shards", lambda s: s.pop("files"), "the shards facts could not be read: no files"),
])
def test_a_section_without_what_it_cannot_do_without_is_missing_with_the_key(section, edit, reason):
    wire = ff.facts(ff.clean(), "worker1")
    edit(wire[section])
    facts = Facts.from_json(wire)
    assert getattr(facts, section) == Missing(reason, failed=True)
    assert isinstance(facts.python, PythonFacts)    # the other sections are read as sent


def test_code_facts_keep_the_nodes_json_for_the_report():
    section = ff.git_code("a" * 40, dirty=True, changes_hash="0123")
    code = Facts.from_json({"code": section}).code
    assert isinstance(code, CodeFacts) and (code.commit, code.dirty, code.changed_count) == ("a" * 40, True, 1)
    assert code.to_json() == section
