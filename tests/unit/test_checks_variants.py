"""Each check on variants of the recorded lab facts: one small, named edit per situation
(see facts_fixtures), so a finding can be traced to the fact that caused it."""

from __future__ import annotations

import json

import pytest

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.checks import FACT_CHECKS as CHECKS  # facts only: probes have their own tests
from ddp_preflight.preflight.model import Status

from . import facts_fixtures as ff
from .facts_fixtures import clean, context, faulted, one

PYTHON = "/work/main/.venv/bin/python"      # the training Python both lab nodes reported


def run(art: dict, *checks: str, **options):
    results = run_checks(context(art, **options), [BY_ID[c] for c in checks])
    for result in results:
        json.dumps(result.to_json())        # every result must reach --json as it is
    return results


# --- torch-parity ------------------------------------------------------------------------------

def test_torch_release_mismatch_fails_with_the_masters_release_from_its_index():
    results = run(ff.torch_version(clean(), "worker1", "2.9.1+cpu"), "torch-parity")

    result = one(results, "torch-parity", "worker1")
    assert result.status is Status.FAIL
    assert result.summary == "worker1 has torch 2.9.1+cpu (cpu), the master torch 2.13.0+cpu (cpu)"
    # The CPU build: plain torch==2.13.0 from PyPI would be the CUDA build on Linux; the index
    # is in the command, so pasted it installs what it says.
    assert result.fix == (f"ssh worker1 '{PYTHON} -m pip install torch==2.13.0 "
                          "--index-url https://download.pytorch.org/whl/cpu'")
    assert one(results, "torch-parity", "master").status is Status.PASS


def test_torch_missing_fails_with_the_install_command():
    results = run(ff.torch_missing(clean(), "worker1"), "torch-parity", "device-dtype")

    result = one(results, "torch-parity", "worker1")
    assert result.status is Status.FAIL
    assert result.summary.startswith("worker1: torch is not installed in this Python")
    assert result.fix.startswith(f"ssh worker1 '{PYTHON} -m pip install torch==2.13.0 ")
    # device-dtype has nothing to look at there and says where to look instead.
    skipped = one(results, "device-dtype", "worker1")
    assert skipped.status is Status.SKIP and "see torch-parity" in skipped.summary


def test_torch_missing_on_the_master_asks_for_any_torch():
    result = one(run(ff.torch_missing(clean(), "master"), "torch-parity"), "torch-parity", "master")

    assert result.status is Status.FAIL
    assert result.fix == f"ssh master '{PYTHON} -m pip install torch'"


def test_the_cuda_build_beside_the_cpu_build_is_a_warning_not_same_as_the_master():
    # The GPU variant gives the master the +cu128 wheel of the same release (same git_version).
    results = run(ff.with_gpu(clean(), "master"), "torch-parity")

    result = one(results, "torch-parity", "worker1")
    assert result.status is Status.WARN
    assert "same torch release, different build" in result.summary
    assert "2.13.0+cu128" in result.fix


# --- python-parity -----------------------------------------------------------------------------

def test_python_minor_version_differs_fails():
    result = one(run(ff.python_version(clean(), "worker1", "3.12.3"), "python-parity"),
                 "python-parity", "worker1")

    assert result.status is Status.FAIL
    assert result.summary == "worker1 runs Python 3.12.3, the master 3.11.7"
    assert "uv venv --python 3.11.7" in result.fix


def test_python_patch_version_differs_warns():
    results = run(ff.python_version(clean(), "worker1", "3.11.9"), "python-parity")

    assert one(results, "python-parity", "worker1").status is Status.WARN
    assert one(results, "python-parity", "master").status is Status.PASS


# --- code-parity -------------------------------------------------------------------------------

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def test_code_parity_skips_without_code_facts():
    (result,) = run(clean(), "code-parity")

    assert (result.status, result.node) == (Status.SKIP, None)
    assert "--code-dir" in result.fix


def test_code_parity_commit_differs_fails_with_git_checkout():
    art = ff.with_code(clean(), master=ff.git_code(COMMIT_A), worker1=ff.git_code(COMMIT_B))
    results = run(art, "code-parity")

    result = one(results, "code-parity", "worker1")
    assert result.status is Status.FAIL
    assert result.summary == "worker1 has git bbbbbbbbbb, the master git aaaaaaaaaa"
    assert result.fix == (f"ssh worker1 'git -C /home/me/nanochat fetch && "
                          f"git -C /home/me/nanochat checkout {COMMIT_A}'")
    assert one(results, "code-parity", "master").status is Status.PASS


def test_code_parity_tree_hash_differs_fails_with_rsync_from_the_masters_address():
    art = ff.with_code(clean(), master=ff.tree_code("1111"), worker1=ff.tree_code("2222"))
    result = one(run(art, "code-parity"), "code-parity", "worker1")

    assert result.status is Status.FAIL
    assert result.summary == "worker1 has source tree 2222, the master source tree 1111"
    # Run on worker1, so the source is the master as worker1 dials it, not this machine's alias.
    assert result.fix == "ssh worker1 'rsync -a --delete 10.213.0.200:/home/me/nanochat/ /home/me/nanochat/'"


def test_code_parity_uncommitted_changes_fail_with_rsync():
    art = ff.with_code(clean(), master=ff.git_code(COMMIT_A),
                       worker1=ff.git_code(COMMIT_A, dirty=True, changes_hash="ff00"))
    result = one(run(art, "code-parity"), "code-parity", "worker1")

    assert result.status is Status.FAIL
    assert "1 uncommitted changes" in result.summary
    assert "rsync -a --delete" in result.fix and "checkout" not in result.fix


def test_code_parity_same_commit_passes():
    art = ff.with_code(clean(), master=ff.git_code(COMMIT_A), worker1=ff.git_code(COMMIT_A))
    result = one(run(art, "code-parity"), "code-parity", "worker1")

    assert result.status is Status.PASS
    assert result.summary.endswith("same as the master")


# --- address-family ----------------------------------------------------------------------------

def test_loopback_bind_fails_with_the_interface_to_pin():
    results = run(ff.loopback_bind(clean(), "worker1"), "address-family")

    result = one(results, "address-family", "worker1")
    assert result.status is Status.FAIL
    assert "loopback 127.0.1.1" in result.summary and "other nodes cannot reach it" in result.summary
    assert result.fix.startswith("export GLOO_SOCKET_IFNAME=eth0")
    assert "/etc/hosts" in result.fix
    assert one(results, "address-family", "master").status is Status.PASS


def test_loopback_is_fine_on_a_single_node():
    (result,) = run(ff.only(ff.loopback_bind(clean(), "master"), "master"), "address-family")

    assert result.status is Status.PASS


def test_ipv6_worker_against_an_ipv4_master_predicts_glooss_family_error():
    result = one(run(faulted(), "address-family"), "address-family", "worker1")

    assert result.status is Status.FAIL
    assert "while master's ranks bind IPv4" in result.summary
    assert result.summary.endswith("'ss1.ss_family == ss2.ss_family. 10 vs 2'")


def test_every_node_binding_ipv6_behind_an_ipv4_master_address_passes():
    # Recorded on the lab with ipv6-host on both nodes (their hostnames resolve to eth0's IPv6), the
    # master dialled at its IPv4: Gloo's pairs are IPv6 on both ends, and a real all_reduce works
    # (tests/lab/test_preflight_lab.py). Before: both nodes failed against the master address's IPv4.
    art = ff.artifact("lab_ipv6_everywhere")
    assert ":" not in art["master_addr"]
    results = run(art, "address-family")
    assert {(r.node, r.status) for r in results} == {("master", Status.PASS), ("worker1", Status.PASS)}
    assert all(r.summary.startswith("Gloo binds IPv6 fd") and r.fix is None for r in results)


def test_nccl_runs_pin_the_nccl_variable():
    result = one(run(faulted(), "address-family", backend="nccl"), "address-family", "worker1")

    assert result.fix.startswith("export NCCL_SOCKET_IFNAME=wlp3s0")


def test_gloo_socket_ifname_naming_a_missing_interface_fails():
    results = run(ff.gloo_socket_ifname(clean(), "worker1", "eth1"), "address-family", "interface-choice")

    result = one(results, "address-family", "worker1")
    assert result.status is Status.FAIL
    assert result.summary == "worker1: GLOO_SOCKET_IFNAME=eth1 names no interface with an address"
    assert result.fix.startswith("export GLOO_SOCKET_IFNAME=eth0")
    choice = one(results, "interface-choice", "worker1")
    assert "Gloo would bind eth1 (no address)" in choice.summary


def test_pinning_the_wifi_interface_clears_the_family_mismatch():
    # The fix address-family gives on lab_faulted, applied: GLOO_SOCKET_IFNAME=wlp3s0 on worker1.
    results = run(ff.gloo_socket_ifname(faulted(), "worker1", "wlp3s0"), "address-family", "interface-choice")

    result = one(results, "address-family", "worker1")
    assert result.status is Status.PASS
    assert result.summary == "Gloo binds IPv4 10.213.0.11 on wlp3s0 (set by GLOO_SOCKET_IFNAME)"
    # What remains is the Wi-Fi itself.
    choice = one(results, "interface-choice", "worker1")
    assert choice.status is Status.WARN and "Wi-Fi" in choice.summary
    assert "would bind" not in choice.summary


def test_the_fixtures_gloo_bind_is_the_collectors():
    from ddp_preflight.node.facts.network import gloo_bind

    for name in ("wlp3s0", "tailscale0", "eth1"):
        node = ff.facts(ff.gloo_socket_ifname(faulted(), "worker1", name), "worker1")
        network = node["network"]
        assert network["gloo_bind"] == gloo_bind(network["interfaces"], network["hostname"],
                                                 node["env"]["vars"]), name


# --- interface-choice --------------------------------------------------------------------------

def test_a_vpn_link_to_the_master_warns():
    art = ff.relink(clean(), "worker1", "eth0", "wg0", kind="vpn", link_kind="wireguard")
    results = run(art, "interface-choice")

    result = one(results, "interface-choice", "worker1")
    assert result.status is Status.WARN
    assert "over wg0, a VPN tunnel" in result.summary
    assert result.fix.startswith("export GLOO_SOCKET_IFNAME=wg0")
    assert one(results, "interface-choice", "master").status is Status.PASS


def test_a_container_bridge_link_to_the_master_warns():
    art = ff.relink(clean(), "worker1", "eth0", "docker0", kind="docker/bridge", link_kind="bridge")
    result = one(run(art, "interface-choice"), "interface-choice", "worker1")

    assert result.status is Status.WARN
    assert "over docker0, a container bridge" in result.summary
    assert result.details["kind"] == "docker/bridge"


def test_interface_choice_skips_on_a_single_node():
    (result,) = run(ff.only(clean(), "master"), "interface-choice")

    assert (result.status, result.node) == (Status.SKIP, None)
    assert result.summary.startswith("one node")


# --- master-port -------------------------------------------------------------------------------

def test_port_held_by_another_users_process_fails_with_ss():
    (result,) = run(ff.port_held_by_other_user(clean()), "master-port")

    assert (result.status, result.node) == (Status.FAIL, "master")
    assert result.summary == "port 29500 on master is held by a process of another user"
    assert result.fix.startswith("sudo ss -ltnp 'sport = :29500'")


def test_master_port_follows_the_port_asked_for():
    (result,) = run(ff.port_held_by_other_user(clean()), "master-port", master_port=29501)

    # The facts are about the port they were collected for; the check names the one asked for.
    assert "29501" in result.summary and "29501" in result.fix


def test_a_port_held_by_sshd_is_not_an_orphan_to_kill():
    (result,) = run(ff.port_held_by_service(clean(), port=22), "master-port", master_port=22)

    assert (result.status, result.node) == (Status.FAIL, "master")
    assert result.summary == ("port 22 on master is held by PID 811 (sshd: /usr/sbin/sshd -D [listener] 0 of "
                              "10-100 startups, 24.0 h old), which is not a training process: rendezvous fails "
                              "with EADDRINUSE; ports below 1024 also need root to bind")
    assert result.fix == "--master-port 29500   # another port for the run; 22 is sshd's, leave it running"
    assert "kill" not in result.fix and "orphan" not in result.summary
    assert result.details["holders"][0]["training"] is False


def test_a_service_on_the_default_port_gets_another_port_and_no_root_note():
    (result,) = run(ff.port_held_by_service(clean(), port=29500, cmdline=["/usr/bin/redis-server", "*:29500"]),
                    "master-port")

    assert "redis-server *:29500" in result.summary and "root" not in result.summary
    assert result.fix.startswith("--master-port 29501   # another port for the run; 29500 is redis-server's")


def test_a_holder_is_not_called_a_leftover_when_the_process_scan_failed():
    (result,) = run(ff.processes_failed(faulted(), "master"), "master-port")

    # The holder is the recorded train.py, but without the scan nothing says it is training.
    assert result.status is Status.FAIL and "the process scan failed" in result.summary
    assert not result.fix.startswith("kill") and "leave it running" not in result.fix
    assert result.details["holders"][0]["training"] is None


# --- stale-processes ---------------------------------------------------------------------------

def test_an_orphaned_leftover_fails():
    result = one(run(faulted(), "stale-processes"), "stale-processes", "master")

    assert result.status is Status.FAIL
    assert result.details["processes"][0]["orphan"] is True


def test_a_leftover_with_a_live_parent_warns():
    results = run(ff.not_orphaned(faulted(), "master"), "stale-processes")

    result = one(results, "stale-processes", "master")
    assert result.status is Status.WARN
    assert "orphan" not in result.summary
    assert result.fix.startswith("kill 16882 ") and "if they are not a run you want" in result.fix
    assert one(results, "stale-processes", "worker1").status is Status.PASS


# --- ranks-per-node ----------------------------------------------------------------------------

def test_more_ranks_than_usable_cores_fails_on_every_such_node():
    results = run(clean(), "ranks-per-node", nproc_per_node=10000)

    for node in ("master", "worker1"):
        result = one(results, "ranks-per-node", node)
        assert result.status is Status.FAIL
        assert result.summary == (f"10000 ranks per node, but {node} has 2 usable cores: "
                                  "each rank needs at least a core of its own")
        assert result.fix == "--nproc-per-node 2   # the fewest usable cores of any node"
        assert result.details == {"nproc_per_node": 10000, "usable_cores": 2, "device": "cpu"}


def test_the_fix_is_the_fewest_cores_of_any_node():
    results = run(ff.cores(clean(), "worker1", physical=1), "ranks-per-node", nproc_per_node=2)

    assert one(results, "ranks-per-node", "master").status is Status.PASS
    worker = one(results, "ranks-per-node", "worker1")
    assert worker.status is Status.FAIL and "worker1 has 1 usable core:" in worker.summary
    assert worker.fix.startswith("--nproc-per-node 1 ")


def test_a_hostfiles_own_slots_are_judged_on_each_node_and_fixed_in_its_line():
    # Issue 39: `master slots=1`, `worker1 slots=3` on two 2-core nodes: master's one rank passes,
    # worker1's three are one too many, and its hostfile line is what to change.
    results = run(clean(), "ranks-per-node", nproc_per_node=3, nprocs={"master": 1, "worker1": 3})

    assert [(r.node, r.status, r.summary, r.fix) for r in results] == [
        ("master", Status.PASS, "1 rank on 2 usable cores", None),
        ("worker1", Status.FAIL, "3 ranks on worker1, but worker1 has 2 usable cores: each rank needs at least a core "
                                 "of its own", "slots=2 for worker1 in the hostfile")]
    omp = run(clean(), "omp-threads", nproc_per_node=3, nprocs={"master": 1, "worker1": 3})
    assert [r.details["nproc_per_node"] for r in omp] == [1, 3]


def test_as_many_ranks_as_cores_pass():
    results = run(clean(), "ranks-per-node", nproc_per_node=2)

    assert [(r.node, r.status, r.summary) for r in results] == [
        ("master", Status.PASS, "2 ranks on 2 usable cores"), ("worker1", Status.PASS, "2 ranks on 2 usable cores")]


def test_a_cuda_run_is_not_judged_on_cores():
    (result,) = run(clean(), "ranks-per-node", nproc_per_node=8, device="cuda", backend="nccl")

    assert (result.status, result.node) == (Status.SKIP, None)
    assert "--device cuda" in result.summary


# --- device-dtype ------------------------------------------------------------------------------

def test_nccl_on_cpu_fails_on_every_node():
    results = run(clean(), "device-dtype", backend="nccl", device="cpu")

    assert [(r.node, r.status) for r in results] == [("master", Status.FAIL), ("worker1", Status.FAIL)]
    assert all(r.fix.startswith("--backend gloo") for r in results)


def test_a_backend_the_torch_build_lacks_fails():
    results = run(clean(), "device-dtype", backend="nccl", device="cuda")

    result = one(results, "device-dtype", "worker1")
    assert result.status is Status.FAIL
    assert result.summary == "worker1's torch has no nccl backend (it has: gloo)"


def test_cuda_requested_without_a_gpu_fails():
    result = one(run(clean(), "device-dtype", device="cuda"), "device-dtype", "worker1")

    assert result.status is Status.FAIL
    assert result.summary == "worker1 has no usable CUDA device (torch 2.13.0+cpu, cpu build)"
    assert "--device cpu --backend gloo" in result.fix


def test_the_gpu_node_passes_a_cuda_nccl_run_the_cpu_node_does_not():
    results = run(ff.with_gpu(clean(), "master"), "device-dtype", backend="nccl", device="cuda")

    assert one(results, "device-dtype", "master").status is Status.PASS
    assert one(results, "device-dtype", "worker1").status is Status.FAIL


def test_a_gpu_beside_a_cpu_run_warns_with_the_seeds_switches():
    results = run(ff.with_gpu(clean(), "master"), "device-dtype")

    result = one(results, "device-dtype", "master")
    assert result.status is Status.WARN
    assert "NVIDIA GeForce RTX 4070" in result.summary
    assert "picks bf16 and flash attention anyway" in result.summary
    # Without --launch the user starts torchrun on master: only an export there reaches it.
    assert result.fix == ("export NANOCHAT_DTYPE=float32 NANOCHAT_FORCE_SDPA=1   # on master: your code's "
                          "switches; or export CUDA_VISIBLE_DEVICES= to hide the GPU")
    # Under --launch, flags that set them for the launched ranks (one dtype for every node's ranks).
    launched = one(run(ff.with_gpu(clean(), "master"), "device-dtype", launch=True), "device-dtype", "master")
    assert launched.fix == ("--env NANOCHAT_DTYPE=float32 --env NANOCHAT_FORCE_SDPA=1   # your code's "
                            "switches; or --env CUDA_VISIBLE_DEVICES= to hide the GPU")
    assert one(results, "device-dtype", "worker1").status is Status.PASS


def test_a_hidden_gpu_passes():
    result = one(run(ff.hide_gpu(ff.with_gpu(clean(), "master"), "master"), "device-dtype"),
                 "device-dtype", "master")

    assert result.status is Status.PASS
    assert result.summary.endswith("present and hidden")


def test_a_gpu_with_float32_forced_passes():
    art = ff.env(ff.with_gpu(clean(), "master"), "master", NANOCHAT_DTYPE="float32")
    result = one(run(art, "device-dtype"), "device-dtype", "master")

    assert result.status is Status.PASS
    assert "dtype float32" in result.summary


def test_bf16_on_a_cpu_without_bf16_instructions_warns():
    art = ff.env(ff.without_bf16(clean(), "worker1"), "worker1", NANOCHAT_DTYPE="bfloat16")
    results = run(art, "device-dtype")

    result = one(results, "device-dtype", "worker1")
    assert result.status is Status.WARN
    assert "no bf16 instructions" in result.summary
    # worker1's own environment sets it, and the user starts torchrun there: an export reaches it ...
    assert result.fix == "export NANOCHAT_DTYPE=float32   # on worker1"
    # ... and under --launch the flag, which wins over worker1's own environment.
    launched = one(run(art, "device-dtype", launch=True), "device-dtype", "worker1")
    assert launched.fix == "--env NANOCHAT_DTYPE=float32"
    assert one(results, "device-dtype", "master").status is Status.PASS


@pytest.mark.parametrize("given, fix", [
    (["NANOCHAT_DTYPE=bfloat16"], "--env NANOCHAT_DTYPE=float32"),
    (["worker1:NANOCHAT_DTYPE=bfloat16"], "--env worker1:NANOCHAT_DTYPE=float32"),
    ([], 'NANOCHAT_DTYPE = "float32" under [nodes.worker1.env] in cluster.toml'),
])
def test_bf16_given_for_the_training_is_fixed_where_it_was_given(given, fix):
    from ddp_preflight.rules.training_env import TrainingEnv, from_config, parse_env_args

    settings = parse_env_args(given, ["master", "worker1"]) if given else \
        from_config({}, {"worker1": {"NANOCHAT_DTYPE": "bfloat16"}})
    # The collector ran with the training's variables on top of worker1's own: the facts hold them.
    art = ff.env(ff.without_bf16(clean(), "worker1"), "worker1", NANOCHAT_DTYPE="bfloat16")
    result = one(run(art, "device-dtype", env=TrainingEnv(tuple(settings), "cluster.toml")), "device-dtype", "worker1")

    assert (result.status, result.fix) == (Status.WARN, fix)


def test_bf16_on_the_recorded_cpu_with_avx512_bf16_passes():
    # The lab's EPYC reports avx512_bf16: bf16 is a reasonable choice there.
    art = ff.env(clean(), "worker1", NANOCHAT_DTYPE="bfloat16")
    result = one(run(art, "device-dtype"), "device-dtype", "worker1")

    assert result.status is Status.PASS
    assert result.details["bf16_instructions"] == ["avx512_bf16"]


# --- omp-threads -------------------------------------------------------------------------------

def test_oversubscribed_threads_warn():
    result = one(run(ff.env(clean(), "worker1", OMP_NUM_THREADS="4"), "omp-threads"), "omp-threads", "worker1")

    assert result.status is Status.WARN
    assert result.summary.startswith("4 threads x 1 processes = 4 on 2 physical cores: oversubscribed")
    assert result.fix == "export OMP_NUM_THREADS=2   # on worker1"


def test_unset_with_several_processes_warns_when_the_cores_allow_more_than_one_thread():
    art = ff.cores(clean(), "worker1", physical=8, logical=16)
    results = run(art, "omp-threads", nproc_per_node=2)

    result = one(results, "omp-threads", "worker1")
    assert result.status is Status.WARN
    assert "torchrun sets it to 1 for 2 processes" in result.summary
    assert result.fix == "export OMP_NUM_THREADS=4   # on worker1"
    # The recorded 2-core master: 2 processes get 1 thread each either way.
    master = one(results, "omp-threads", "master")
    assert master.status is Status.PASS
    assert master.summary == "1 thread for each of 2 process(es) on 2 cores"


def test_unset_under_launch_passes_with_the_value_the_launch_sets():
    # --launch sets OMP_NUM_THREADS to the advice for the ranks it starts (launch/plan.py): no warning,
    # no fix, and the value said is the one the ranks get.
    art = ff.cores(clean(), "worker1", physical=8, logical=16)
    result = one(run(art, "omp-threads", nproc_per_node=2, launch=True), "omp-threads", "worker1")
    assert (result.status, result.fix) == (Status.PASS, None)
    assert result.summary == "OMP_NUM_THREADS is not set: --launch sets it to 4 for each of 2 process(es) on 8 cores"
    # A node's own value is the ranks' (the launch passes it through): judged as it is.
    art = ff.env(ff.cores(clean(), "worker1", physical=8, logical=16), "worker1", OMP_NUM_THREADS="8")
    result = one(run(art, "omp-threads", nproc_per_node=2, launch=True), "omp-threads", "worker1")
    assert result.status is Status.WARN and result.summary.startswith("8 threads x 2 processes = 16 on 8 physical")


def test_unset_with_one_process_passes():
    result = one(run(ff.cores(clean(), "worker1", physical=8), "omp-threads"), "omp-threads", "worker1")

    assert result.status is Status.PASS
    assert result.summary == "8 threads for each of 1 process(es) on 8 cores"


def test_a_value_that_is_not_a_number_fails():
    result = one(run(ff.env(clean(), "worker1", OMP_NUM_THREADS="auto"), "omp-threads"),
                 "omp-threads", "worker1")

    assert result.status is Status.FAIL
    assert result.summary == "OMP_NUM_THREADS='auto' is not a number"


def test_threads_that_fit_the_cores_pass():
    result = one(run(ff.env(clean(), "worker1", OMP_NUM_THREADS="2"), "omp-threads"), "omp-threads", "worker1")

    assert result.status is Status.PASS


# --- ptrace ------------------------------------------------------------------------------------

def test_scope_1_as_a_normal_user_warns_with_the_sysctl():
    results = run(ff.ptrace(clean(), "worker1", scope=1, euid=1000, cap_sys_ptrace=False), "ptrace")

    result = one(results, "ptrace", "worker1")
    assert result.status is Status.WARN
    assert result.summary.startswith("ptrace_scope=1 on worker1")
    assert result.fix.startswith("sudo sysctl kernel.yama.ptrace_scope=0")
    assert one(results, "ptrace", "master").status is Status.PASS


def test_scope_1_as_root_passes():
    result = one(run(ff.ptrace(clean(), "worker1", scope=1, euid=0, cap_sys_ptrace=False), "ptrace"),
                 "ptrace", "worker1")

    assert result.status is Status.PASS


def test_scope_3_warns_even_for_root():
    result = one(run(ff.ptrace(clean(), "worker1", scope=3, euid=0, cap_sys_ptrace=True), "ptrace"),
                 "ptrace", "worker1")

    assert result.status is Status.WARN
    assert "reboot" in result.fix


# --- clock-skew --------------------------------------------------------------------------------

@pytest.mark.parametrize("shift,side", [(5.0, "ahead of"), (-5.0, "behind")])
def test_a_clock_5_s_off_warns_and_says_which_way(shift, side):
    results = run(ff.clock(clean(), "worker1", shift), "clock-skew")

    result = one(results, "clock-skew", "worker1")
    assert result.status is Status.WARN
    assert result.summary == f"worker1's clock is 5.0 s {side} the master's"
    assert "timedatectl set-ntp true" in result.fix
    assert one(results, "clock-skew", "master").status is Status.PASS


def test_skew_the_round_trip_can_explain_passes():
    # 2.5 s apart, but the sample is only sure to 1 s: what is certain stays under 2 s.
    result = one(run(ff.clock(clean(), "worker1", 2.5, uncertainty=1.0), "clock-skew"), "clock-skew", "worker1")

    assert result.status is Status.PASS
    assert result.details["skew_seconds"] > 2.0


# --- launch-args -------------------------------------------------------------------------------

def test_options_torchrun_swallows_fail():
    (result,) = run(ff.launch(clean(), ff.SWALLOWING_PARSE), "launch-args",
                    launch_args=ff.RECORDED_LAUNCH_ARGS)

    assert (result.status, result.node) == (Status.FAIL, "master")
    assert result.summary.startswith("torchrun takes --run=x for itself")
    assert result.fix.endswith("-m scripts.base_train -- --run=x --depth 4")


def test_options_after_the_separator_pass():
    (result,) = run(ff.launch(clean(), ff.SEPARATED_PARSE), "launch-args",
                    launch_args=ff.SEPARATED_LAUNCH_ARGS)

    assert result.status is Status.PASS
    assert result.summary == "torchrun passes all 3 script options to scripts.base_train"


def test_no_command_skips():
    (result,) = run(faulted(), "launch-args", launch_args=())

    assert (result.status, result.node) == (Status.SKIP, None)


def test_the_fixtures_parses_are_torchruns():
    from ddp_preflight.node.facts.launch import torchrun_parse

    assert torchrun_parse(list(ff.SEPARATED_LAUNCH_ARGS), 2, 1) == ff.SEPARATED_PARSE
    # And the recorded command is still rejected the way the artifacts say.
    assert torchrun_parse(list(ff.RECORDED_LAUNCH_ARGS), 2, 1) == ff.facts(faulted(), "master")["launch"]


# --- node-reachable ----------------------------------------------------------------------------

def test_an_unreachable_node_is_an_error_carrying_its_fix():
    results = run(ff.unreachable(faulted(), "worker1"), "node-reachable")

    result = one(results, "node-reachable", "worker1")
    assert result.status is Status.ERROR
    assert result.summary == "worker1: nothing accepts ssh connections (connection refused)"
    assert result.fix.startswith("start sshd on worker1")
    assert one(results, "node-reachable", "master").status is Status.PASS


def test_one_unreachable_node_does_not_stop_the_report_for_the_others():
    results = run_checks(context(ff.unreachable(faulted(), "worker1")), CHECKS)

    # No check crashed on the missing facts.
    assert not [r for r in results if r.status is Status.ERROR and r.node != "worker1"]
    # Every check still reports, and the master's faults are still found.
    assert {r.check for r in results} == {c.id for c in CHECKS}
    assert one(results, "master-port", "master").status is Status.FAIL
    assert one(results, "stale-processes", "master").status is Status.FAIL
    assert one(results, "launch-args", "master").status is Status.FAIL
    for check in ("torch-parity", "python-parity", "address-family", "device-dtype",
                  "omp-threads", "ptrace", "clock-skew"):
        assert one(results, check, "master").status is Status.PASS, check
    # About worker1: the error, and data-shards saying it could not look.
    about_worker = {(r.check, r.status) for r in results if r.node == "worker1"}
    assert about_worker == {("node-reachable", Status.ERROR), ("data-shards", Status.SKIP)}


def test_an_unreachable_master_leaves_the_workers_checked_but_not_compared():
    results = run_checks(context(ff.unreachable(faulted(), "master")), CHECKS)

    assert one(results, "node-reachable", "master").status is Status.ERROR
    # worker1's own faults are still found: its IPv6 bind, against the IPv4 the master is reached with
    # (the master's own bind is not known: a warning, not a certainty).
    family = one(results, "address-family", "worker1")
    assert family.status is Status.WARN and "the master's ranks' family is not known" in family.summary
    # Nothing to compare against: not a claim about worker1.
    python = one(results, "python-parity", "worker1")
    assert python.status is Status.SKIP and "no Python version from the master" in python.summary
    shards = one(results, "data-shards", "worker1")
    assert shards.status is Status.SKIP and "no shard manifest from the master" in shards.summary


def test_nodes_on_one_kernel_share_one_clock_and_no_skew_is_judged_between_them():
    # Issue 38: the lab's nodes are namespaces of one machine; a slow round trip under load made a
    # "skew" of their one clock. DERIVED: both nodes given one boot_id, worker1's sample 5 s off.
    art = ff.clock(clean(), "worker1", 5.0)
    for name in ("master", "worker1"):
        ff.facts(art, name).setdefault("os", {})["boot_id"] = "5b1c1b43-5e4e-4f0a-9a55-2c1f0b8c6c11"
    result = one(run(art, "clock-skew"), "clock-skew", "worker1")
    assert (result.status, result.summary, result.fix) == (
        Status.PASS, "shares the master's clock: one kernel (the same boot_id), so no skew is possible and none "
        "was judged", None)
    ff.facts(art, "worker1")["os"]["boot_id"] = "0d5e3c1a-7f4e-4b55-8c2e-1f0b8c6c1100"
    assert one(run(art, "clock-skew"), "clock-skew", "worker1").status is Status.WARN
