"""gpu-visible, nccl-parity, gpu-memory-held, gpu-health and nccl-env on the recorded H100 host
(gpu_fixtures: recorded facts, a derived driver view, and derived variants, each marked), and on
the lab's recorded CPU facts, where they skip."""

from __future__ import annotations

import json

import pytest

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.checks.gpu import apply_cuda_visible, clock_reasons, nccl_device
from ddp_preflight.preflight.checks.nccl import nccl_matches
from ddp_preflight.preflight.model import Report, Status
from ddp_preflight.preflight.report import text
from ddp_preflight.rules.facts import GpuDevice

from . import facts_fixtures as ff
from . import gpu_fixtures as g
from .facts_fixtures import one

GPU_CHECKS = ("gpu-visible", "nccl-parity", "gpu-memory-held", "gpu-health", "nccl-env")


def run(ctx, *checks: str):
    results = run_checks(ctx, [BY_ID[c] for c in checks or GPU_CHECKS])
    for result in results:
        json.dumps(result.to_json())        # every result reaches --json as it is
    return results


# --- CPU runs: the lab's recorded facts --------------------------------------------------------

def test_on_the_labs_cpu_facts_every_gpu_check_skips_once_with_the_reason():
    results = run(ff.context(ff.clean()))

    assert [(r.check, r.node, r.status) for r in results] == [(c, None, Status.SKIP) for c in GPU_CHECKS]
    assert all(r.summary == "not a GPU run (--device cpu)" and r.fix is None for r in results)


def test_a_cuda_run_on_the_labs_cpu_nodes_leaves_the_failure_to_device_dtype():
    results = run(ff.context(ff.clean(), device="cuda", backend="nccl"), "device-dtype", *GPU_CHECKS)

    assert one(results, "device-dtype", "worker1").status is Status.FAIL
    assert {r.status for r in results if r.check != "device-dtype"} == {Status.SKIP, Status.PASS}
    assert one(results, "gpu-visible", "worker1").summary.startswith("not known how many GPUs worker1 has")


# --- gpu-visible -------------------------------------------------------------------------------

def test_two_ranks_on_the_recorded_one_gpu_host_fail_with_the_recorded_error():
    [result] = run(g.context(("h100", g.h100(with_driver_view=False)), nproc_per_node=2), "gpu-visible")

    assert result.status is Status.FAIL
    assert result.summary.startswith("2 ranks per node but h100 sees 1 GPU: rank 1 fails with "
                                     "'Duplicate GPU detected : rank 1 and rank 0 both on CUDA device")
    assert result.fix == "--nproc-per-node 1   # the GPUs of the node with the fewest"


def test_with_the_bus_id_the_message_is_the_recorded_one_word_for_word():
    [result] = run(g.context(("h100", g.h100()), nproc_per_node=2), "gpu-visible")

    quoted = result.summary.split("'")[1]
    assert quoted == "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60"
    assert quoted in g.recording("two-ranks-one-gpu.txt")
    assert nccl_device("00000000:3B:00.0") == "3b000"


def test_on_a_worker_the_ranks_are_numbered_as_torchrun_numbers_them():
    # DERIVED: a second host like the recorded one, as worker1 (node rank 1: ranks 2 and 3).
    results = run(g.context(("master", g.h100()), ("worker1", g.h100()), nproc_per_node=2), "gpu-visible")

    assert "rank 3 fails with 'Duplicate GPU detected : rank 3 and rank 2 both" in one(results, "gpu-visible", "worker1").summary


def test_a_hostfiles_own_slots_per_host_are_each_nodes_ranks_numbered_as_torchrun_numbers_them():
    # Issue 39 (DERIVED, two hosts like the recorded one): `master slots=1`, `worker1 slots=2`:
    # master's one rank passes on its one GPU; worker1's ranks are 1 and 2, and rank 2 shares
    # rank 1's GPU; the fix is worker1's hostfile line.
    ctx = g.context(("master", g.h100()), ("worker1", g.h100()), nproc_per_node=2, nprocs={"master": 1, "worker1": 2})
    results = run(ctx, "gpu-visible")

    assert one(results, "gpu-visible", "master").status is Status.PASS
    worker = one(results, "gpu-visible", "worker1")
    assert worker.status is Status.FAIL
    assert "rank 2 fails with 'Duplicate GPU detected : rank 2 and rank 1 both" in worker.summary
    assert worker.fix == "slots=1 for worker1 in the hostfile"


def test_one_rank_on_the_recorded_host_passes_with_its_gpu_and_topology():
    [result] = run(g.context(("h100", g.h100()), nproc_per_node=1), "gpu-visible")

    assert result.status is Status.PASS
    assert result.summary == "1 rank on 1 GPU (NVIDIA H100 80GB HBM3): PCIe gen5 x16, NUMA 0"
    assert result.details["gpus"][0]["cpu_affinity"] == "0-15"
    # The text report shows this line even with passes hidden: the GPUs and how they connect.
    out = text.render(Report((result,), ("h100",)), color=False)
    assert "gpu-visible" in out and "PCIe gen5 x16, NUMA 0" in out


def test_cuda_visible_devices_hiding_a_gpu_gets_the_list_that_shows_enough():
    two = g.second_gpu(g.h100())          # DERIVED: a second H100
    hidden = g.cuda_visible(two, "0", torch_sees=1)
    [result] = run(g.context(("h100", hidden), nproc_per_node=2), "gpu-visible")

    assert result.status is Status.FAIL
    assert "h100 sees 1 GPU (CUDA_VISIBLE_DEVICES='0' hides 1 of 2)" in result.summary
    assert result.fix == "export CUDA_VISIBLE_DEVICES=0,1   # on h100"
    [passing] = run(g.context(("h100", two), nproc_per_node=2), "gpu-visible")
    assert passing.status is Status.PASS and passing.summary.startswith("2 ranks on 2 GPUs (2 x NVIDIA H100 80GB HBM3)")


def test_no_gpu_visible_names_the_variable_that_hides_them():
    hidden = g.cuda_visible(g.h100(), "", torch_sees=0)
    [result] = run(g.context(("h100", hidden), nproc_per_node=1), "gpu-visible")

    assert result.status is Status.FAIL
    assert result.summary == "1 rank per node but h100 sees no GPU (CUDA_VISIBLE_DEVICES='' hides 1 of 1)"
    assert result.fix == "export CUDA_VISIBLE_DEVICES=0   # on h100"


def test_a_container_given_one_gpu_says_so():
    # DERIVED: the recorded host inside a container started with NVIDIA_VISIBLE_DEVICES=0.
    def container(f):
        f["gpu"]["visible"]["NVIDIA_VISIBLE_DEVICES"] = "0"
    [result] = run(g.context(("h100", g.edited(g.h100(), container)), nproc_per_node=2), "gpu-visible")
    assert result.summary.startswith(
        "2 ranks per node but h100 sees 1 GPU (its container was started with NVIDIA_VISIBLE_DEVICES=0): rank 1 fails")


def test_the_recorded_facts_alone_have_no_memory_or_health_facts():
    results = run(g.context(("h100", g.h100(with_driver_view=False))), "gpu-memory-held", "gpu-health")
    assert [(r.status, r.summary) for r in results] == \
        [(Status.SKIP, "no GPU facts from h100: not collected (a collector older than this check)")] * 2


def test_a_node_with_no_gpu_at_all_gets_no_fix_here():
    # DERIVED: worker1's driver lists no GPU; device-dtype says what to do about that node.
    def none(f):
        f["gpu"]["devices"] = []
        f["torch"]["cuda_devices"] = []
    results = run(g.context(("master", g.h100()), ("worker1", g.edited(g.h100(), none))), "gpu-visible")

    result = one(results, "gpu-visible", "worker1")
    assert result.status is Status.FAIL and result.summary == "1 rank per node but worker1 sees no GPU"
    assert result.fix is None
    later = run(g.context(("master", g.h100()), ("worker1", g.edited(g.h100(), none))), "gpu-memory-held", "gpu-health")
    assert {r.summary for r in later if r.node == "worker1"} == {"no GPU for the ranks on worker1 (see gpu-visible)"}


# As the node sends them, parsed as the checks read them.
DEVICES = [GpuDevice.from_json(d) for d in ({"index": 0, "uuid": "GPU-79a24157-c204"},
                                            {"index": 1, "uuid": "GPU-00000000-0000"})]


@pytest.mark.parametrize("value, seen", [
    (None, [0, 1]), ("", []), ("1", [1]), ("1,0", [1, 0]), ("GPU-79a2", [0]), ("GPU-", []),
    ("none", []), ("0,-1,1", [0]), ("0,0", [0]), ("2,1", []), (" 1 , 0", [1, 0]),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, seen):
    assert [d.index for d in apply_cuda_visible(value, DEVICES)] == seen


# --- nccl-parity -------------------------------------------------------------------------------

def test_the_recorded_host_passes_nccl_parity_with_what_it_found():
    [result] = run(g.context(("h100", g.h100())), "nccl-parity")

    assert result.status is Status.PASS
    assert result.summary == "NCCL 2.28.9, torch built for CUDA 13.0, driver 580.159.04 for CUDA 13.0"


def test_the_recorded_facts_alone_have_nothing_to_compare():
    [result] = run(g.context(("h100", g.h100(with_driver_view=False))), "nccl-parity")
    assert result.status is Status.SKIP and "were not collected" in result.summary


def _driver_for(cuda: str):
    def edit(f):
        f["gpu"]["cuda_driver_version"] = cuda
    return edit


def test_a_driver_for_an_older_cuda_major_fails_and_an_older_minor_warns():
    # DERIVED: the same host with a driver for CUDA 12.8, then torch built for CUDA 13.1.
    [old] = run(g.context(("h100", g.edited(g.h100(), _driver_for("12.8")))), "nccl-parity")
    assert old.status is Status.FAIL
    assert old.summary.startswith("h100's driver supports CUDA 12.8 but torch is built for CUDA 13.0")
    assert old.fix.startswith("on h100, install an NVIDIA driver for CUDA 13.0 or newer (it has 580.159.04, for CUDA 12.8)")

    def newer_torch(f):
        f["torch"]["cuda"] = "13.1"
    [minor] = run(g.context(("h100", g.edited(g.h100(), newer_torch))), "nccl-parity")
    assert minor.status is Status.WARN and "minor version compatibility" in minor.summary


def test_a_different_nccl_on_a_worker_fails_with_the_masters_version_to_install():
    # DERIVED: worker1 a copy of the recorded host with NCCL 2.27.5, the master's from the wheel.
    def older_nccl(f):
        f["torch"]["nccl_version"] = "2.27.5"

    def wheel(f):
        f["torch"]["nccl_wheel"] = {"name": "nvidia-nccl-cu13", "version": "2.28.9"}
    results = run(g.context(("master", g.edited(g.h100(), wheel)), ("worker1", g.edited(g.h100(), older_nccl))),
                  "nccl-parity")

    result = one(results, "nccl-parity", "worker1")
    assert result.status is Status.FAIL
    assert result.summary.startswith("NCCL 2.27.5 on worker1, 2.28.9 on the master")
    assert result.fix == "ssh worker1 '/opt/torch/.venv/bin/python3 -m pip install nvidia-nccl-cu13==2.28.9'"
    assert one(results, "nccl-parity", "master").status is Status.PASS
    # Over Gloo NCCL does not carry the traffic: only the driver is judged.
    gloo = run(g.context(("master", g.h100()), ("worker1", g.edited(g.h100(), older_nccl)), backend="gloo"), "nccl-parity")
    assert one(gloo, "nccl-parity", "worker1").status is Status.PASS


# --- gpu-memory-held ---------------------------------------------------------------------------

def test_the_recorded_host_holds_no_memory():
    [result] = run(g.context(("h100", g.h100())), "gpu-memory-held")
    assert result.status is Status.PASS


def test_an_orphaned_training_leftover_fails_with_its_kill():
    [result] = run(g.context(("h100", g.holding(g.h100(), g.LEFTOVER))), "gpu-memory-held")

    assert result.status is Status.FAIL
    assert result.summary == ("GPU memory already held on h100: PID 444 (python -u train_gpu_hang.py, orphan, "
                              "1.5 h old, root) holds 1836 MiB on GPU 0")
    assert result.fix == "kill 444   # on h100: leftover training"


def test_someone_elses_process_is_named_but_never_killed():
    # DERIVED: the recorded holder as a notebook of another user (not training).
    notebook = {**g.LEFTOVER, "cmdline": ["/usr/bin/python3", "-m", "jupyter", "lab"], "user": "ana", "uid": 1001,
                "orphan": False, "ppid": 3021, "why": []}
    [result] = run(g.context(("h100", g.holding(g.h100(), notebook))), "gpu-memory-held")
    assert result.status is Status.WARN and "jupyter lab" in result.summary and "ana" in result.summary
    assert result.fix is None                       # its only GPU is the busy one: nothing to move to

    two = g.holding(g.second_gpu(g.h100()), notebook)
    [moved] = run(g.context(("h100", two), nproc_per_node=1), "gpu-memory-held")
    assert moved.fix == "export CUDA_VISIBLE_DEVICES=1   # on h100: the GPUs no one else uses"
    # Under --launch the flag for that node: an export there would not reach the launched ranks.
    [launched] = run(g.context(("h100", two), nproc_per_node=1, launch=True), "gpu-memory-held")
    assert launched.fix == "--env h100:CUDA_VISIBLE_DEVICES=1   # the GPUs no one else uses"


def test_memory_used_by_processes_this_node_cannot_see_is_a_warning_without_a_fix():
    # The recorded run's 1845 MiB used, its process in another PID namespace, then not listed at all.
    away = {"gpu": 0, "pid": 444, "used_bytes": 1836 * g.MIB, "visible_here": False}
    [hidden_pid] = run(g.context(("h100", g.holding(g.h100(), away))), "gpu-memory-held")
    assert "PID 444 (not in this node's /proc: another container) holds 1836 MiB on GPU 0" in hidden_pid.summary
    assert hidden_pid.fix is None

    [unlisted] = run(g.context(("h100", g.holding(g.h100(), used_mib=1845))), "gpu-memory-held")
    assert unlisted.status is Status.WARN and unlisted.fix is None
    assert "1845 MiB used on GPU 0 by processes h100 cannot see" in unlisted.summary


# --- gpu-health --------------------------------------------------------------------------------

def test_the_recorded_gpu_is_healthy_and_idle():
    [result] = run(g.context(("h100", g.h100())), "gpu-health")

    assert result.status is Status.PASS
    assert result.details["clock_event_reasons"] == {"0": ["idle"]}
    assert "not readable here: nvlinks_down, nvlinks_up, remapped_rows_failed" in result.summary


def _gpu0(**values):
    def edit(f):
        g.device(f).update(values)
    return edit


@pytest.mark.parametrize("values, status, words, fix", [
    ({"ecc_uncorrected_volatile": 2}, Status.FAIL, "GPU 0 has 2 uncorrected ECC errors",
     "sudo nvidia-smi -r -i 0   # on h100, with nothing running on GPU 0; or reboot h100"),
    ({"remapped_rows_pending": True}, Status.WARN, "memory rows wait to be remapped", "sudo nvidia-smi -r -i 0"),
    ({"remapped_rows_failed": True}, Status.FAIL, "a memory row remapping failed", None),
    ({"clock_event_reasons": 0x40}, Status.WARN, "slowed down now (HW thermal slowdown)", "nvidia-smi -q -d"),
    ({"clock_event_reasons": 0x88}, Status.WARN, "(HW slowdown, HW power brake slowdown)", "nvidia-smi -q -d"),
    ({"pcie_width": 8}, Status.WARN, "PCIe link runs x8 of x16", None),
    ({"pcie_gen": 3, "clock_event_reasons": 0x0}, Status.WARN, "runs gen3 of gen5 while not idle", None),
    ({"error": "nvmlDeviceGetHandleByIndex_v2: GPU is lost"}, Status.FAIL, "GPU 0 does not answer", "reboot h100"),
])
def test_each_health_problem_is_named_with_its_fix(values, status, words, fix):
    # DERIVED: one value of the recorded GPU changed (see the parameters).
    [result] = run(g.context(("h100", g.edited(g.h100(), _gpu0(**values)))), "gpu-health")

    assert result.status is status and words in result.summary
    assert (result.fix is None) if fix is None else result.fix.startswith(fix)


def test_an_idle_gpu_at_a_lower_pcie_gen_is_normal():
    # DERIVED: the recorded idle GPU (reason 0x1) with its link at gen1, as idle links drop.
    [result] = run(g.context(("h100", g.edited(g.h100(), _gpu0(pcie_gen=1)))), "gpu-health")
    assert result.status is Status.PASS


def test_a_gpu_with_fewer_nvlinks_up_than_its_peers_warns():
    # DERIVED: two H100 SXM-like GPUs, 18 NVLinks up on one and 12 on the other.
    [result] = run(g.context(("h100", g.second_gpu(g.h100(), nvlinks=(18, 12))), nproc_per_node=2), "gpu-health")
    assert result.status is Status.WARN and result.summary == \
        "GPU 1 has 12 NVLinks up, its peers 18: traffic to it falls back to fewer links or PCIe"


def test_clock_reasons_decode_into_slowdowns_and_normal_ones():
    assert clock_reasons(0x1) == ([], ["idle"])
    assert clock_reasons(0x4 | 0x20) == (["SW thermal slowdown"], ["SW power cap"])
    assert clock_reasons(0) == ([], [])


# --- nccl-env ----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, chosen", [
    ("eth", ["eth0", "eth10"]), ("=eth1", []), ("=eth0,docker0", ["eth0", "docker0"]),
    ("^docker,lo", ["eth0", "eth10", "ib0"]), ("^=eth0", ["eth10", "docker0", "lo", "ib0"]), ("ib", ["ib0"]),
])
def test_nccl_socket_ifname_reads_prefixes_exclusions_and_exact_names(spec, chosen):
    assert nccl_matches(spec, ["eth0", "eth10", "docker0", "lo", "ib0"]) == chosen


def test_nccl_ib_hca_entries_may_name_a_port():
    assert nccl_matches("=mlx5_0:1,mlx5_1:1", ["mlx5_0", "mlx5_1", "mlx5_10"]) == ["mlx5_0", "mlx5_1"]
    assert nccl_matches("mlx5_1", ["mlx5_0", "mlx5_1", "mlx5_10"]) == ["mlx5_1", "mlx5_10"]


# The lab's two recorded nodes (real interfaces: eth0 and lo) in a CUDA run over NCCL.
def lab(art: dict):
    return ff.context(art, device="cuda", backend="nccl")


def with_hca(art: dict, node: str, name: str = "mlx5_0", state: str = "ACTIVE") -> dict:
    """DERIVED: an HCA on `node` as ddp_preflight/node/facts/gpu.py's infiniband() lists one; the others none."""
    art = ff._copy(art)
    for entry in art["nodes"]:
        entry["facts"]["gpu"]["infiniband"] = []
    ff.facts(art, node)["gpu"]["infiniband"] = [
        {"name": name, "ports": [{"port": 1, "state": state, "link_layer": "InfiniBand"}]}]
    return art


def test_an_ifname_that_selects_nothing_fails_with_the_interface_toward_the_master():
    results = run(lab(ff.env(ff.clean(), "worker1", NCCL_SOCKET_IFNAME="ib")), "nccl-env")

    result = one(results, "nccl-env", "worker1")
    assert result.status is Status.FAIL
    assert result.summary.startswith("NCCL_SOCKET_IFNAME=ib selects no interface with an address on worker1 (it has ")
    assert result.fix == "export NCCL_SOCKET_IFNAME=eth0   # on worker1"
    assert one(results, "nccl-env", "master").status is Status.PASS


def test_an_exclusion_that_leaves_the_lan_passes_and_says_what_it_selects():
    results = run(lab(ff.env(ff.clean(), "worker1", NCCL_SOCKET_IFNAME="^docker,lo")), "nccl-env")
    assert "NCCL_SOCKET_IFNAME=^docker,lo selects eth0" in one(results, "nccl-env", "worker1").summary


def test_infiniband_on_the_master_only_fails_on_the_node_without_it():
    results = run(lab(with_hca(ff.clean(), "master")), "nccl-env")

    result = one(results, "nccl-env", "worker1")
    assert result.status is Status.FAIL
    assert result.summary == ("NCCL will use TCP sockets on worker1 (no active InfiniBand or RoCE HCA) but InfiniBand "
                              "on the master (HCA mlx5_0): ranks on different networks do not connect, init hangs "
                              "(NVIDIA/nccl#234)")
    assert result.fix == "export NCCL_IB_DISABLE=1   # on every node: for TCP everywhere; or give worker1 a working HCA"
    # Under --launch the flag sets it once for every node's ranks.
    launched = one(run(ff.context(with_hca(ff.clean(), "master"), device="cuda", backend="nccl", launch=True),
                       "nccl-env"), "nccl-env", "worker1")
    assert launched.fix == "--env NCCL_IB_DISABLE=1   # for TCP everywhere; or give worker1 a working HCA"
    # With InfiniBand turned off everywhere, both nodes speak TCP.
    off = ff.env(ff.env(with_hca(ff.clean(), "master"), "master", NCCL_IB_DISABLE="1"), "worker1", NCCL_IB_DISABLE="1")
    assert {r.status for r in run(lab(off), "nccl-env")} == {Status.PASS}


def test_an_ib_hca_name_the_node_lacks_is_named_with_what_it_has():
    art = ff.env(with_hca(ff.clean(), "master"), "master", NCCL_IB_HCA="=mlx5_2")
    result = one(run(lab(art), "nccl-env"), "nccl-env", "master")

    assert result.status is Status.WARN
    assert result.summary.startswith("NCCL_IB_HCA==mlx5_2 names no HCA on master (it has mlx5_0)")
    assert result.fix == "export NCCL_IB_HCA=mlx5_0   # on master"


def test_p2p_switched_off_on_one_node_only_warns():
    result = one(run(lab(ff.env(ff.clean(), "worker1", NCCL_P2P_DISABLE="1")), "nccl-env"), "nccl-env", "worker1")
    assert result.status is Status.WARN and result.summary.startswith("NCCL_P2P_DISABLE=1 on worker1, None on the master")


def test_a_setting_from_nccl_conf_counts_and_the_environment_wins():
    # DERIVED: worker1's /etc/nccl.conf pins an interface it lacks.
    art = ff._copy(ff.clean())
    ff.facts(art, "worker1")["gpu"]["nccl_conf"] = {"files": ["/etc/nccl.conf"], "values": {"NCCL_SOCKET_IFNAME": "=ens1f0"}}
    assert one(run(lab(art), "nccl-env"), "nccl-env", "worker1").status is Status.FAIL
    fixed = ff.env(art, "worker1", NCCL_SOCKET_IFNAME="eth0")
    assert one(run(lab(fixed), "nccl-env"), "nccl-env", "worker1").status is Status.PASS


def test_a_gloo_cuda_run_skips_nccl_env():
    [result] = run(ff.context(ff.clean(), device="cuda", backend="gloo"), "nccl-env")
    assert result.status is Status.SKIP and result.summary == "not an NCCL run (--backend gloo)"
