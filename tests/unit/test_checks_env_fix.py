"""A check's fix that sets a variable says it in the form that reaches the training as the user
runs it (preflight/checks/common.py's env_fix): under --launch, or where the variable was given to
preflight (--env, --env NODE:, the config's [env] or [nodes.NODE.env]), the flag or config line
that sets it, once for every node where every node gets the same value, per node where it
differs; otherwise the export on the node where the user starts torchrun. On the recorded lab
facts (two nodes of 2 cores, each reaching the master over eth0)."""

from __future__ import annotations

import pytest

from ddp_preflight.preflight.checks import BY_ID, run_checks
from ddp_preflight.preflight.model import Status
from ddp_preflight.rules.environment import env_fix
from ddp_preflight.rules.training_env import TrainingEnv, from_config, parse_env_args

from . import facts_fixtures as ff
from .facts_fixtures import clean, context

HOSTS = ["master", "worker1"]


def fix_of(art: dict, check: str, node: str, **options) -> str | None:
    [result] = [r for r in run_checks(context(art, **options), [BY_ID[check]]) if r.node == node]
    assert result.status in (Status.WARN, Status.FAIL), result.summary
    return result.fix


def given(*pairs: str, config: dict | None = None, per_node: dict | None = None) -> TrainingEnv:
    """The training's variables as --env and the config (cluster.toml) gave them."""
    return TrainingEnv(tuple(from_config(config or {}, per_node or {}) + parse_env_args(pairs, HOSTS)),
                       "cluster.toml")


# Both nodes: OMP_NUM_THREADS=4 on 2 cores, oversubscribed; omp-threads advises 2 on each.
def oversubscribed() -> dict:
    return ff.env(ff.env(clean(), "master", OMP_NUM_THREADS="4"), "worker1", OMP_NUM_THREADS="4")


# worker1 with 8 cores and 2 ranks per node: 4 threads there, 1 on the 2-core master.
def uneven() -> dict:
    return ff.env(ff.cores(clean(), "worker1", physical=8, logical=16), "worker1", OMP_NUM_THREADS="8")


def test_without_launch_a_variable_not_given_is_exported_on_the_node():
    assert fix_of(oversubscribed(), "omp-threads", "worker1") == "export OMP_NUM_THREADS=2   # on worker1"


def test_under_launch_the_same_value_on_every_node_is_one_flag():
    assert fix_of(oversubscribed(), "omp-threads", "worker1", launch=True) == "--env OMP_NUM_THREADS=2"
    assert fix_of(oversubscribed(), "omp-threads", "master", launch=True) == "--env OMP_NUM_THREADS=2"


def test_under_launch_a_value_that_differs_by_node_is_set_for_that_node():
    fix = fix_of(uneven(), "omp-threads", "worker1", launch=True, nproc_per_node=2)
    assert fix == "--env worker1:OMP_NUM_THREADS=4"


@pytest.mark.parametrize("launch", [False, True])
def test_a_variable_given_with_env_node_is_changed_there_launched_or_not(launch):
    env = given("worker1:OMP_NUM_THREADS=4")
    art = ff.env(clean(), "worker1", OMP_NUM_THREADS="4")     # the collector ran with it
    assert fix_of(art, "omp-threads", "worker1", env=env, launch=launch) == "--env worker1:OMP_NUM_THREADS=2"


def test_a_variable_given_for_every_node_with_env_stays_one_flag_where_the_value_is_the_same():
    env = given("OMP_NUM_THREADS=4")
    assert fix_of(oversubscribed(), "omp-threads", "worker1", env=env) == "--env OMP_NUM_THREADS=2"


def test_a_variable_given_for_every_node_with_env_is_set_per_node_where_the_value_differs():
    env = given("OMP_NUM_THREADS=8")
    fix = fix_of(uneven(), "omp-threads", "worker1", env=env, nproc_per_node=2)
    assert fix == "--env worker1:OMP_NUM_THREADS=4"


def test_a_variable_from_the_configs_env_is_changed_in_that_table():
    env = given(config={"OMP_NUM_THREADS": "4"})
    for launch in (False, True):
        fix = fix_of(oversubscribed(), "omp-threads", "worker1", env=env, launch=launch)
        assert fix == 'OMP_NUM_THREADS = "2" under [env] in cluster.toml'


def test_a_variable_from_the_configs_env_that_differs_by_node_goes_in_the_nodes_table():
    env = given(config={"OMP_NUM_THREADS": "8"})
    fix = fix_of(uneven(), "omp-threads", "worker1", env=env, nproc_per_node=2)
    assert fix == 'OMP_NUM_THREADS = "4" under [nodes.worker1.env] in cluster.toml'


def test_a_variable_from_a_nodes_table_is_changed_there():
    env = given(per_node={"worker1": {"OMP_NUM_THREADS": "4"}})
    art = ff.env(clean(), "worker1", OMP_NUM_THREADS="4")
    assert fix_of(art, "omp-threads", "worker1", env=env, launch=True) == \
        'OMP_NUM_THREADS = "2" under [nodes.worker1.env] in cluster.toml'


def test_the_interface_pin_under_launch_is_one_flag_when_every_node_reaches_the_master_on_eth0():
    art = ff.loopback_bind(clean(), "worker1")
    hostname = ff.facts(art, "worker1")["network"]["gloo_bind"]["hostname"]
    assert fix_of(art, "address-family", "worker1") == \
        f"export GLOO_SOCKET_IFNAME=eth0   # on worker1: or map {hostname} to its LAN address in /etc/hosts"
    assert fix_of(art, "address-family", "worker1", launch=True) == \
        f"--env GLOO_SOCKET_IFNAME=eth0   # or map {hostname} to its LAN address in /etc/hosts"


def test_an_nccl_interface_given_with_env_is_fixed_with_env_for_that_node():
    art = ff.env(clean(), "worker1", NCCL_SOCKET_IFNAME="ib")
    env = given("worker1:NCCL_SOCKET_IFNAME=ib")
    fix = fix_of(art, "nccl-env", "worker1", env=env, device="cuda", backend="nccl")
    assert fix == "--env worker1:NCCL_SOCKET_IFNAME=eth0"


def test_env_fix_for_every_node_lists_a_node_whose_own_setting_would_win():
    # worker1 has its own --env worker1:; a flag for every node would not reach it there.
    ctx = context(clean(), env=given("worker1:NCCL_IB_DISABLE=0"), launch=True)
    assert env_fix(ctx, None, [("NCCL_IB_DISABLE", "1")]).text() == "--env NCCL_IB_DISABLE=1 --env worker1:NCCL_IB_DISABLE=1"
    assert env_fix(context(clean()), None, [("NCCL_IB_DISABLE", "1")]).text() == "export NCCL_IB_DISABLE=1   # on every node"


def test_env_fix_quotes_values_for_the_shell_but_not_placeholders():
    ctx = context(clean(), launch=True)
    assert env_fix(ctx, "worker1", [("DATA", "/data/my shards")]).text() == "--env 'worker1:DATA=/data/my shards'"
    assert env_fix(ctx, "worker1", [("GLOO_SOCKET_IFNAME", "<its wired interface>")]).text() == \
        "--env worker1:GLOO_SOCKET_IFNAME=<its wired interface>"
    assert env_fix(context(clean()), "worker1", [("DATA", "/data/my shards")]).text() == \
        "export 'DATA=/data/my shards'   # on worker1"
