"""bandwidth and compute-balance, judged from recorded real lab runs of both probes.

lab_bandwidth_clean: the clean 2-node lab (veth, CPU-bound all_reduce; both nodes on 2 threads).
lab_bandwidth_wifi: the same with wifi@worker1:100mbit (tc tbf on both directions of worker1's link).
lab_compute_straggler: worker1's training Python wrapped to set OMP_NUM_THREADS=1.
lab_compute_shared, lab_compute_straggler_shared: the clean lab, and worker1 on one thread, each
recorded while two busy loops on the host took the lab's two cores (as the other half of the test
suite does, and as VMs on one host do).
lab_bandwidth_lossy, lab_bandwidth_clean_links: lossy@worker1:2 (nftables drops 2% of the TCP
packets reaching worker1) and the clean lab, each with every rank's TCP_INFO figures (2026-11-27).
All were recorded with the probes themselves (ddp_preflight.preflight.probes.run.run_probes) on a lab
(tests/unit/artifacts/record.py)."""

import copy
import json
import subprocess
import sys

import pytest

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.checks.bandwidth import STRAGGLER_RATIO, step_seconds
from ddp_preflight.preflight.model import Context, NodeFacts, Options, Status
from ddp_preflight.preflight.probes.bandwidth import master_port_held
from ddp_preflight.preflight.probes.compute import threads_for
from ddp_preflight.preflight.probes.torchjob import exception_line

from . import facts_fixtures as ff
from . import gpu_fixtures as g
from .facts_fixtures import _recorded

CHECKS = [BY_ID["bandwidth"], BY_ID["compute-balance"]]
MBIT = 1e6 / 8      # bytes per second in one Mbit/s


def load(name):
    return json.loads(_recorded(name))


def nodes_of(art):
    return tuple(NodeFacts(n["node"], n["facts"], n["error"], n["fix"]) for n in art["nodes"])


def results(art, probes=None, **options):
    ctx = Context(nodes_of(art), Options(master_addr=art["master_addr"], **options),
                  art["probes"] if probes is None else probes)
    return run_checks(ctx, CHECKS)


def only(found, check):
    picked = [r for r in found if r.check == check]
    assert len(picked) == 1, picked
    return picked[0]


# --- bandwidth -----------------------------------------------------------------------------------

def test_a_clean_lab_passes_with_its_figures_and_a_reference_model():
    art = load("lab_bandwidth_clean")
    result = only(results(art), "bandwidth")
    assert result.status is Status.PASS and result.node is None
    assert "all_reduce latency" in result.summary and "Gbit/s" in result.summary
    assert "a 100M-parameter model's fp32 gradients would take about" in result.summary
    details = result.details
    assert details["busbw_bytes_per_s"] > 0 and all(v > 0 for v in details["latency_us"].values())
    # Per node: the interface toward the master, with its speed where the kernel reports one.
    assert {n: (entry["interface"], entry["speed_mbit"]) for n, entry in details["links"].items()} == {
        "master": ("eth0", 10000), "worker1": ("eth0", 10000)}


def test_the_shaped_link_was_measured_within_15_percent_of_its_rate():
    busbw = load("lab_bandwidth_wifi")["probes"]["bandwidth"]["busbw_bytes_per_s"]
    assert 0.85 * 100 <= busbw / MBIT <= 1.15 * 100


def test_wifi_without_params_passes_but_names_the_slowest_link():
    result = only(results(load("lab_bandwidth_wifi")), "bandwidth")
    assert result.status is Status.PASS
    assert "slowest link: worker1's wlp3s0 (Wi-Fi" in result.summary and "Mbit/s" in result.summary
    assert result.details["slowest_link"] == "worker1"


def test_seed_002s_model_over_wifi_warns_that_the_link_bounds_the_run():
    result = only(results(load("lab_bandwidth_wifi"), params=126_000_000), "bandwidth")
    assert result.status is Status.WARN and result.node == "worker1"
    assert "the link, not compute, will bound the run" in result.summary
    assert "worker1's wlp3s0 (Wi-Fi" in result.summary
    assert "every step's all_reduce crosses it. " in result.summary
    # Issue 38: the pin was `GLOO_SOCKET_IFNAME=<its wired interface>`, a placeholder: the wired
    # interface has no name before it is there; preflight names its pin once it is.
    wire = ("connect worker1 by wire; run preflight again: interface-choice then names the interface its ranks reach "
            "the master on, and the GLOO_SOCKET_IFNAME that pins it   # or all-reduce less often: accumulate "
            "gradients over several micro-batches inside model.no_sync()")
    assert result.fix == wire
    launched = only(results(load("lab_bandwidth_wifi"), params=126_000_000, launch=True), "bandwidth")
    assert launched.fix == wire
    prediction = result.details["prediction"]
    # 2 nodes: the ring moves 2(n-1)/n = 1x the 504 MB of gradients through each rank.
    assert prediction["bytes_per_rank"] == 126_000_000 * 4
    assert prediction["seconds"] == pytest.approx(504e6 / result.details["busbw_bytes_per_s"])
    assert prediction["seconds"] > 30      # at ~95 Mbit/s
    # With the compute probe's figures: how many tokens a rank must compute to hide the link.
    assert prediction["break_even_tokens_per_rank"] > 1000 and "tokens per step" in result.summary


def test_the_same_model_on_the_clean_lab_passes_with_its_prediction():
    result = only(results(load("lab_bandwidth_clean"), params=126_000_000), "bandwidth")
    assert result.status is Status.PASS      # ~0.5 s per step at ~8 Gbit/s
    assert "126M parameters" in result.summary and result.details["prediction"]["seconds"] < 1


def test_a_small_model_over_wifi_passes():
    result = only(results(load("lab_bandwidth_wifi"), params=1_000_000), "bandwidth")
    assert result.status is Status.PASS and result.details["prediction"]["seconds"] < 1


def test_a_slow_wired_link_warns_without_blaming_wifi():
    art = load("lab_bandwidth_wifi")
    for node in art["nodes"]:                     # derived: worker1's link is a plain 100 Mbit/s NIC
        for iface in node["facts"]["network"]["interfaces"]:
            if iface["name"] == "wlp3s0":
                iface.update(name="eth0", kind="ethernet", speed_mbit=100)
        route = node["facts"]["network"].get("route_to_master") or {}
        if route.get("interface") == "wlp3s0":
            route["interface"] = "eth0"
    result = only(results(art, params=126_000_000), "bandwidth")
    assert result.status is Status.WARN and result.node == "worker1"
    assert "worker1's eth0 (ethernet, 100 Mbit/s nominal)" in result.summary and "Wi-Fi" not in result.summary


def test_bus_bandwidth_scales_with_the_ring_factor():
    # nccl-tests: busbw = algbw x 2(n-1)/n, so a rank moves 2(n-1)/n x the gradient bytes.
    assert step_seconds(1000, 2, 4000)[0] == 4000
    assert step_seconds(1000, 4, 4000) == (6000, 1.5)


def test_a_probe_that_did_not_run_is_a_skip_or_an_error_never_a_pass():
    art = load("lab_bandwidth_clean")
    assert {r.status for r in results(art, {})} == {Status.SKIP}
    skipped = results(art, {"bandwidth": {"skipped": "the master port 29500 is held on master (see master-port)"},
                            "compute": {"skipped": "no node was reached"}})
    assert {r.status for r in skipped} == {Status.SKIP} and "29500 is held" in skipped[0].summary
    broken = results(art, {"bandwidth": {"error": "the all_reduce job failed on worker1: timed out"},
                           "compute": {"error": "RuntimeError: boom"}})
    assert {r.status for r in broken} == {Status.ERROR}


def test_a_held_master_port_is_seen_in_the_masters_facts():
    art = load("lab_bandwidth_clean")
    assert not master_port_held(nodes_of(art))
    held = copy.deepcopy(art)                      # derived: a leftover holds the port (seed 002)
    held["nodes"][0]["facts"]["master_port"]["listening"] = True
    assert master_port_held(nodes_of(held))


# --- compute-balance ------------------------------------------------------------------------------

def test_balanced_nodes_pass_with_every_nodes_figure():
    result = only(results(load("lab_bandwidth_clean")), "compute-balance")
    assert result.status is Status.PASS
    assert "master" in result.summary and "worker1" in result.summary and "GFLOP/s" in result.summary
    assert all(f["gflops"] > 0 and f["threads"] == 2 for f in result.details["nodes"].values())


def test_a_node_limited_to_one_thread_is_named_the_straggler():
    result = only(results(load("lab_compute_straggler")), "compute-balance")
    assert result.status is Status.WARN and result.node == "worker1"
    assert "straggler every synchronous step waits for" in result.summary
    assert "1 thread, OMP_NUM_THREADS=1" in result.summary
    slowdown = result.details["slowdown"]
    assert 1 / STRAGGLER_RATIO < slowdown < 3 and f"about {slowdown:.1f}x" in result.summary
    assert result.fix == "export OMP_NUM_THREADS=2   # on worker1: 2 cores, 1 process(es) per node"


def test_a_slower_machine_with_the_same_threads_gets_no_thread_fix():
    art = load("lab_bandwidth_clean")
    probes = copy.deepcopy(art["probes"])
    probes["compute"]["nodes"]["worker1"]["gflops"] = 40.0   # derived: an older CPU, same settings
    result = only(results(art, probes), "compute-balance")
    assert result.status is Status.WARN and result.node == "worker1"
    assert "OMP_NUM_THREADS" not in result.fix and "leave it out" in result.fix


def test_a_node_whose_benchmark_failed_is_an_error_and_the_rest_are_judged():
    art = load("lab_bandwidth_clean")
    probes = copy.deepcopy(art["probes"])
    del probes["compute"]["nodes"]["worker1"]
    probes["compute"]["errors"]["worker1"] = "timed out"
    found = [r for r in results(art, probes) if r.check == "compute-balance"]
    assert {(r.node, r.status) for r in found} == {("worker1", Status.ERROR), (None, Status.PASS)}


def test_the_thread_count_is_the_one_training_gets():
    art = load("lab_compute_straggler")
    master, worker = nodes_of(art)
    assert threads_for(master, Options()) == (None, "torch's default")
    assert threads_for(worker, Options()) == (1, "OMP_NUM_THREADS=1")
    assert threads_for(master, Options(nproc_per_node=2))[0] == 1     # torchrun's own default


def test_nodes_slowed_by_their_neighbours_are_no_stragglers_and_it_says_why_figures_differ():
    art = load("lab_compute_shared")
    nodes = art["probes"]["compute"]["nodes"]
    # Both timed products ran well below what two threads compute (the busy loops took the cores).
    assert all(f["gflops"] < 0.7 * 2 * f["thread_gflops"] for f in nodes.values()), nodes
    result = only(results(art), "compute-balance")
    assert (result.status, result.node) == (Status.PASS, None), result
    assert "master, worker1 computed their timed products slower" in result.summary
    assert "other processes took the cores while it was measured" in result.summary


def test_a_one_thread_node_is_the_straggler_even_when_the_busy_machine_slowed_the_other_more():
    art = load("lab_compute_straggler_shared")
    nodes = art["probes"]["compute"]["nodes"]
    # The wall-clock figures alone blame the wrong node: master's two threads rarely had both
    # cores at once, worker1's one thread often had one.
    assert nodes["master"]["gflops"] < STRAGGLER_RATIO * nodes["worker1"]["gflops"], nodes
    found = [r for r in results(art) if r.check == "compute-balance"]
    assert [(r.node, r.status) for r in found] == [("worker1", Status.WARN)], found
    [result] = found
    assert "worker1 is the straggler every synchronous step waits for" in result.summary
    assert "(1 thread, OMP_NUM_THREADS=1)" in result.summary
    slowdown = result.details["slowdown"]
    # One thread against two of about the same core: about 2x (the recorded cores: 77 and 90).
    assert 1.5 < slowdown < 2.1 and f"about {slowdown:.1f}x" in result.summary
    assert result.fix == "export OMP_NUM_THREADS=2   # on worker1: 2 cores, 1 process(es) per node"


def test_nodes_of_one_machine_compare_their_threads_at_its_best_core_rate():
    # A full CI run measured master's one-thread rate at 59 GFLOP/s and worker1's product at 90:
    # master 118 (2 threads) against worker1 90, within 0.7x, and the one-thread node went unnamed.
    # DERIVED from the recording: master's thread rate set to that figure; both nodes' boot_id as
    # the lab's namespaces report it (one kernel). One machine's cores are one core speed.
    art = copy.deepcopy(load("lab_compute_straggler_shared"))
    probes = art["probes"]
    probes["compute"]["nodes"]["master"]["thread_gflops"] = 59.06
    for node in art["nodes"]:
        node["facts"]["os"]["boot_id"] = "5b1c1b43-5e4e-4f0a-9a55-2c1f0b8c6c11"
    [result] = [r for r in results(art, probes) if r.check == "compute-balance"]
    assert (result.node, result.status) == ("worker1", Status.WARN), result
    assert result.details["rates"] == {"master": 179.14, "worker1": 89.57}
    assert result.summary.endswith("; master and worker1 run on one machine (one kernel: the same boot_id), so their "
                                   "cores are compared as one machine's, at the best one-thread rate measured there "
                                   "(90 GFLOP/s)"), result.summary
    # Two machines (their own boot_id each): each core is measured as its own, and nothing here
    # tells a slower core from a busier moment: the figures stand, no straggler.
    art["nodes"][1]["facts"]["os"]["boot_id"] = "0d0e4c8a-51a1-4d47-8b8e-3f6c5f4b2a90"
    [result] = [r for r in results(art, probes) if r.check == "compute-balance"]
    assert (result.node, result.status) == (None, Status.PASS), result


def test_a_cpu_quota_below_the_threads_makes_a_straggler_however_fast_its_core():
    art = load("lab_compute_shared")
    probes = copy.deepcopy(art["probes"])
    # DERIVED: worker1 in a cgroup with cpu.max "50000 100000" (half a CPU), as node/jobs/compute.py
    # reads it; its products then take twice their CPU time on the wall.
    probes["compute"]["nodes"]["worker1"].update(cpus_usable=0.5, gflops=35.0)
    result = only(results(art, probes), "compute-balance")
    assert (result.node, result.status) == ("worker1", Status.WARN), result
    assert "(2 threads, torch's default, 0.5 CPUs usable)" in result.summary


def test_a_cgroup_cpu_quota_is_read_as_the_cpus_a_benchmark_may_use(tmp_path):
    # A real cgroup with a quota of half a CPU (v1's cpu controller, as on this machine, or v2's
    # cpu.max): the compute program, started in it, reads 0.5 usable CPUs.
    import os
    from pathlib import Path
    v1 = Path("/sys/fs/cgroup/cpu")
    base = v1 if (v1 / "cpu.cfs_quota_us").exists() else Path("/sys/fs/cgroup")
    assert (base / "cpu.cfs_quota_us").exists() or "cpu" in (base / "cgroup.subtree_control").read_text().split(), \
        "no cgroup cpu controller to make a quota with (v1 /sys/fs/cgroup/cpu, or v2 with cpu enabled)"
    group = base / f"ddpp-quota-{os.getpid()}"
    group.mkdir()
    try:
        if base == v1:
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("50000")
        else:
            (group / "cpu.max").write_text("50000 100000")
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from ddp_preflight.node.jobs.compute import usable_cpus; "
                "print(usable_cpus())")
        root = str(Path(__file__).resolve().parents[2])
        out = subprocess.run(["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh",
                              sys.executable, "-c", code, root], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert float(out.stdout) == 0.5
        outside = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True, timeout=60)
        assert float(outside.stdout) == len(os.sched_getaffinity(0))
    finally:
        group.rmdir()


def test_the_probes_import_without_torch():
    # The job scripts import torch inside main(): the operator never loads it.
    code = ("import sys; import ddp_preflight.preflight.probes.bandwidth, ddp_preflight.preflight.probes.compute; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# --- a failed job: its own error, and a fix only for a cause a check saw (issue 13) --------------

def test_a_failed_all_reduce_job_is_quoted_and_its_cause_not_known():
    art = load("lab_bandwidth_clean")
    probes = copy.deepcopy(art["probes"])
    # DERIVED: the job's end as the probe reads it, the rank's error a Gloo one no fact explains.
    probes["bandwidth"] = {"failed": {"node": "worker1", "timed_out": False,
                                      "error": "RuntimeError: [pair.cc:555] Connection reset by peer"}}
    result = only(results(art, probes), "bandwidth")
    assert result.status is Status.ERROR
    assert result.summary == ("the all_reduce job failed on worker1: RuntimeError: [pair.cc:555] Connection reset "
                              "by peer; the cause is not known")
    assert result.fix is None


def test_a_cuda_error_of_the_all_reduce_job_points_at_the_gpu_check_that_saw_it():
    # The recorded one-GPU host with two ranks asked (the probe itself would not start the job).
    ctx = g.context(("h100", g.h100()), nproc_per_node=2)
    error = exception_line(g.recording("two-ranks-one-gpu.txt"))
    probes = {"bandwidth": {"failed": {"node": "h100", "error": error, "timed_out": False}}}
    [result] = run_checks(Context(ctx.nodes, ctx.options, probes), [BY_ID["bandwidth"]])
    assert result.status is Status.ERROR and "Last error: Duplicate GPU detected" in result.summary
    assert "likely cause: gpu-visible on h100: 2 ranks per node but h100 sees 1 GPU" in result.summary
    assert result.fix == "--nproc-per-node 1   # the GPUs of the node with the fewest"


def test_a_benchmark_without_cuda_points_at_device_dtype():
    # The compute program's own error on a machine without CUDA (test_probes_gpu runs it), on the
    # lab's CPU nodes asked for a CUDA run.
    ctx = ff.context(ff.clean(), device="cuda", backend="nccl")
    error = "GPU 0: RuntimeError: PyTorch was compiled without CUDA support"
    probes = {"compute": {"nodes": {}, "errors": {"worker1": error}}}
    [result] = run_checks(Context(ctx.nodes, ctx.options, probes), [BY_ID["compute-balance"]])
    assert result.status is Status.ERROR and result.node == "worker1"
    assert result.summary.startswith(f"worker1: the matmul benchmark did not run: {error}; likely cause: device-dtype")
    assert result.fix.startswith("install a torch build with it")
    cpu_run = run_checks(Context(ctx.nodes, Options(), {"compute": {"nodes": {}, "errors": {"worker1": "timed out"}}}),
                         [BY_ID["compute-balance"]])
    assert cpu_run[0].summary.endswith("timed out; the cause is not known") and cpu_run[0].fix is None


# --- compute-balance on the GPUs -----------------------------------------------------------------

def gpu_figures(*rates: float, name: str = "NVIDIA H100 80GB HBM3") -> dict:
    """DERIVED: a node's figures in the shape node/jobs/compute.py's GPU branch prints them, one
    GPU per rate (GFLOP/s). That branch has not run on a GPU: the rates stand for an H100 in
    bf16 (about 700 TFLOP/s at this size), not for a measurement."""
    gpus = [{"index": i, "name": name, "dtype": "bfloat16", "gflops": r, "median_gflops": r * 0.97, "iterations": 240}
            for i, r in enumerate(rates)]
    slowest = min(gpus, key=lambda gpu: gpu["gflops"])
    return {"device": "cuda", "gpus": gpus, "gflops": slowest["gflops"], "slowest_gpu": slowest["index"], "size": 8192}


def balance(*nodes: tuple[str, dict, dict], nproc: int = 1):
    """compute-balance on (name, facts, figures) nodes of a CUDA run."""
    ctx = g.context(*[(name, facts) for name, facts, _ in nodes], nproc_per_node=nproc)
    probes = {"compute": {"nodes": {name: figures for name, _, figures in nodes}, "errors": {}}}
    return run_checks(Context(ctx.nodes, ctx.options, probes), [BY_ID["compute-balance"]])


def test_balanced_gpus_pass_with_their_rates_in_their_dtype():
    [result] = balance(("master", g.h100(), gpu_figures(702_000.0)), ("worker1", g.h100(), gpu_figures(690_500.0)))
    assert result.status is Status.PASS
    assert result.summary == ("bfloat16 matmul on the GPUs: master GPU 0 702 TFLOP/s, worker1 GPU 0 690 TFLOP/s; "
                              "all within 0.7x of the fastest")
    assert "GFLOP/s" not in result.summary and "thread" not in result.summary


def test_a_slower_gpu_of_the_same_model_is_the_straggler_with_no_fix_for_an_unseen_cause():
    [result] = balance(("master", g.h100(), gpu_figures(702_000.0)), ("worker1", g.h100(), gpu_figures(351_000.0)))
    assert result.status is Status.WARN and result.node == "worker1"
    assert result.summary.startswith(
        "worker1's GPU 0 (NVIDIA H100 80GB HBM3, bfloat16) is the straggler every synchronous step waits for: "
        "351 TFLOP/s against master's GPU 0 (NVIDIA H100 80GB HBM3, bfloat16) 702 TFLOP/s: every synchronous "
        "step's compute takes about 2.0x as long as at the fastest GPU's pace; the cause is not known")
    assert result.fix is None
    assert (result.details["straggler"], result.details["straggler_gpu"]) == ("worker1", 0)


def test_a_gpu_the_facts_show_slowed_down_gets_gpu_healths_query():
    def hot(f):
        g.device(f)["clock_event_reasons"] = 0x40     # DERIVED: HW thermal slowdown, as NVML reports it
    [result] = balance(("master", g.h100(), gpu_figures(702_000.0)),
                       ("worker1", g.edited(g.h100(), hot), gpu_figures(420_000.0)))
    assert result.status is Status.WARN and result.node == "worker1"
    assert "gpu-health saw it slowed down (HW thermal slowdown)" in result.summary
    assert result.fix == "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i 0   # on worker1: the slowdown's causes"


def test_a_throttled_gpu_beside_fast_ones_on_one_node_is_named():
    two = g.second_gpu(g.h100())           # DERIVED: a second H100
    [result] = balance(("h100", two, gpu_figures(702_000.0, 300_000.0)), nproc=2)
    assert result.status is Status.WARN and result.node == "h100"
    assert result.summary.startswith("h100's GPU 1 (NVIDIA H100 80GB HBM3, bfloat16) is the straggler")
    assert "against h100's GPU 0" in result.summary and "All: h100 2 GPUs 300 TFLOP/s to 702 TFLOP/s" in result.summary


def test_a_slower_gpu_model_is_named_with_the_fix_for_slower_hardware():
    [result] = balance(("master", g.h100(), gpu_figures(702_000.0)),
                       ("worker1", g.h100(), gpu_figures(165_000.0, name="NVIDIA A100-SXM4-80GB")))
    assert "another model: NVIDIA A100-SXM4-80GB against NVIDIA H100 80GB HBM3" in result.summary
    assert result.fix.startswith("DDP gives every rank the same batch")


def test_one_node_with_two_gpus_measures_the_link_between_them():
    art = load("lab_bandwidth_clean")
    two = g.second_gpu(g.h100())           # DERIVED: a second H100
    ctx = g.context(("h100", two), nproc_per_node=2)
    # DERIVED: the lab's recorded figures, as the job would print them for two GPUs of one node.
    data = {**copy.deepcopy(art["probes"]["bandwidth"]), "nodes": ["h100"], "device": "cuda", "backend": "nccl"}
    [result] = run_checks(Context(ctx.nodes, ctx.options, {"bandwidth": data}), [BY_ID["bandwidth"]])
    assert result.status is Status.PASS and "messages, 2 GPUs of h100)" in result.summary
    assert result.details["links"] == {} and "nominal" not in result.summary


# --- loss (issue 26: a lossy link passed) -------------------------------------------------------

def test_a_lossy_path_is_named_at_the_node_it_leads_to_with_the_kernels_count():
    art = load("lab_bandwidth_lossy")
    found = [r for r in results(art) if r.check == "bandwidth"]
    assert [(r.status, r.node) for r in found] == [(Status.WARN, "worker1"), (Status.PASS, None)], found
    loss = found[0]
    # master -> worker1: 9314 of 433562 segments lost (2.15%); the other way 72 (0.02%): not named.
    assert loss.summary.startswith("packets are lost on the way from master to worker1: 9314 of the 433562 segments "
                                   "master's ranks sent (2.15%, "), loss.summary
    assert "round trip 0.42 ms;" in loss.summary and "also" not in loss.summary
    assert [(x["src"], x["dst"], x["segs"], x["lost"]) for x in loss.details["links"]] == [
        ("master", "worker1", 433562, 9314), ("worker1", "master", 422921, 72)]
    # The lab's lossy fault is worker1's own nftables rule, which its facts list (issue 38: the fix
    # pointed at cables and Wi-Fi while the ruleset read on worker1 held the cause).
    assert loss.fix == ("on worker1: sudo nft delete rule inet ddp_lab_lossy input handle $(sudo nft -a list chain inet "
                        "ddp_lab_lossy input | grep -F 'meta l4proto tcp numgen random mod 1000 < 20 drop #' | sed "
                        "'s/.*# handle //')   # the rule in inet ddp_lab_lossy input that drops a random share of what "
                        "worker1 receives")


def test_a_clean_path_whose_host_resent_segments_the_peer_had_is_not_lossy():
    art = load("lab_bandwidth_clean_links")
    links = art["probes"]["bandwidth"]["links"]
    # Its bytes sent again look like loss (2 MB and 3.8 MB of 610 MB), its lost segments do not (45 of 423017).
    assert [x["retrans"] for x in links] == [2092360, 3836848] and [x["lost"] for x in links] == [45, 0]
    found = [r for r in results(art) if r.check == "bandwidth"]
    assert [(r.status, r.node) for r in found] == [(Status.PASS, None)], found


# What the 3-node lab's bandwidth job measured with wifi@worker2:20mbit (issue 38), per rank:
# (rank, local, peer, sent, busy_us). The ring went master -> worker2 -> worker1 -> master; the
# links off the ring sent the algorithm's few control bytes.
RING = [(0, "10.213.0.200", "10.213.0.11", 2448, 144000), (0, "10.213.0.200", "10.213.0.12", 6645920, 3084000),
        (1, "10.213.0.11", "10.213.0.200", 6645864, 8000), (1, "10.213.0.11", "10.213.0.12", 2688, 1616000),
        (2, "10.213.0.12", "10.213.0.200", 2448, 1772000), (2, "10.213.0.12", "10.213.0.11", 6338740, 3160000)]


def _three(ring):
    """DERIVED: lab_bandwidth_clean_links' job given a third node and the links the 3-node lab measured."""
    art = load("lab_bandwidth_clean_links")
    wire = art["probes"]["bandwidth"]
    # The all_reduce's figures as that run measured them.
    wire.update(nodes=["master", "worker1", "worker2"], world_size=3, bytes=1048576, busbw_bytes_per_s=2279046,
                algbw_bytes_per_s=1709284,
                links=[{"rank": r, "local": a, "peer": b, "sent": s, "retrans": 0, "rtt_us": 50000, "segs": s // 1448,
                        "lost": 0, "busy_us": busy} for r, a, b, s, busy in ring])
    return art


def test_the_node_whose_own_links_are_slow_is_named_with_its_links_with_or_without_params():
    for options in ({}, {"params": 1_000_000}):
        found = [r for r in results(_three(RING), **options) if r.check == "bandwidth" and "slow ones" in r.summary]
        assert [r.status for r in found] == [Status.WARN], found
        assert found[0].summary == (
            "worker2's links are the slow ones: master -> worker2 17 Mbit/s, worker2 -> worker1 16 Mbit/s, "
            "against worker1 -> master 6.6 Gbit/s between the other nodes (each link's bytes over the time it had data to send, "
            "the kernel's TCP_INFO); every step's all_reduce waits for worker2")
        assert found[0].fix is None      # no facts of worker2 here: no cause seen, no fix offered


def test_a_fast_link_whose_busy_time_read_0_counts_at_the_least_it_carried():
    # The kernel counts busy time in ticks: worker1 -> master sent its 6.6 MB within one, and read
    # 0 us (seen on the lab, 1 run in 2). It was dropped as "not counted", no link was left between
    # the other nodes, and worker2 went unnamed. Over one tick of the coarsest clock (10 ms) it
    # carried at least 5.3 Gbit/s, which is what the words say.
    rounded = [(r, a, b, s, 0 if (a, b) == ("10.213.0.11", "10.213.0.200") else busy) for r, a, b, s, busy in RING]
    found = [r for r in results(_three(rounded)) if r.check == "bandwidth" and "slow ones" in r.summary]
    assert [(r.status, r.node) for r in found] == [(Status.WARN, "worker2")], found
    assert "against worker1 -> master at least 5.3 Gbit/s between the other nodes" in found[0].summary, found[0].summary
    # A slow node's own link that read 0 carried fast: nobody is named.
    own_fast = [(r, a, b, s, 0 if (a, b) == ("10.213.0.200", "10.213.0.12") else busy) for r, a, b, s, busy in RING]
    assert not [r for r in results(_three(own_fast)) if r.check == "bandwidth" and r.node is not None]


def test_no_node_is_named_where_its_links_are_as_fast_as_the_others():
    even = [(r, a, b, s, busy if s < 10000 else 10000) for r, a, b, s, busy in RING]
    assert not [r for r in results(_three(even)) if r.check == "bandwidth" and r.node is not None]


def test_with_params_the_warning_that_the_link_bounds_the_run_is_on_the_node_the_links_measured_slow():
    # Issue 38: with --params it warned without naming worker2.
    found = [r for r in results(_three(RING), params=126_000_000) if r.check == "bandwidth"]
    bound = [r for r in found if "the link, not compute, will bound the run" in r.summary]
    assert [(r.node, r.status) for r in bound] == [("worker2", Status.WARN)], found
    assert "will bound the run; the slow node: worker2. " in bound[0].summary, bound[0].summary


def test_an_all_reduce_job_we_stopped_is_an_error_of_the_probe_with_its_load_never_the_networks():
    # Issue 38: the job's end as the probe reads it when the master's wait ran out on a node at
    # load 151 on 2 CPUs (the words of job_end.why_ended and load_words): who stopped it, the load
    # as the cause, and its fix; no "likely cause" of the network, no "cause is not known".
    art = load("lab_bandwidth_clean")
    probes = copy.deepcopy(art["probes"])
    why = ("ddp-preflight stopped it when its own wait of 270 s for the job ran out; the job had run 262 s on the "
           "node, and its bound there had not ended it (it started late, or ran slowly); worker1 was at load 151 on 2 CPUs")
    probes["bandwidth"] = {"failed": {"node": "worker1", "timed_out": False, "unfinished": True, "error": why,
                                      "load_per_cpu": 75.5}}
    result = only(results(art, probes), "bandwidth")
    assert (result.status, result.node) == (Status.ERROR, None)
    assert result.summary == f"the all_reduce probe could not finish on worker1: {why}"
    assert result.fix == ("on worker1: find what keeps its CPUs busy (top -o %CPU), and run preflight again once its "
                          "load is below its CPUs")
    probes["bandwidth"]["failed"]["load_per_cpu"] = 0.4         # not busy: no cause seen, no fix
    assert only(results(art, probes), "bandwidth").fix is None
