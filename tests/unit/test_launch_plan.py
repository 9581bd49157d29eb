"""The launch plan from the recorded lab facts: each node's torchrun options, folder and environment."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest

from ddp_preflight.launch.plan import PlanError, build_plan, parse_command
from ddp_preflight.preflight.checks import FACT_CHECKS, run_checks
from ddp_preflight.preflight.cluster import Target
from ddp_preflight.preflight.model import NodeFacts, Report
from ddp_preflight.rules.training_env import EnvError, TrainingEnv, from_config, parse_env_args

from .facts_fixtures import clean, context, facts, only

PY = "/opt/venv/bin/python"
TARGETS = [Target("master", PY), Target("worker1", PY)]


def plan_for(art=None, *, command=("train.py", "--depth", "4"), env=None, targets=TARGETS, cwd="/home/me/run",
             **options):
    if env is not None:
        options["env"] = env if isinstance(env, TrainingEnv) else TrainingEnv(tuple(parse_env_args(env)))
    ctx = context(art or clean(), launch_args=(), **options)
    report = Report(tuple(run_checks(ctx, FACT_CHECKS)), tuple(n.node for n in ctx.nodes))
    return build_plan(report, ctx.nodes, ctx.options, targets, parse_command(command), cwd=cwd)


def torchrun_options(node_plan) -> dict:
    argv = list(node_plan.torchrun)
    return {argv[i]: argv[i + 1] for i in range(0, argv.index("--tee") + 2, 2)}


def test_every_node_gets_the_static_rendezvous_with_its_own_rank():
    plan = plan_for(nproc_per_node=2)
    assert [n.node for n in plan.nodes] == ["master", "worker1"] and plan.world_size == 4
    for rank, node in enumerate(plan.nodes):
        assert torchrun_options(node) == {
            "--nnodes": "2", "--nproc-per-node": "2", "--node-rank": str(rank),
            # The address the master resolved for itself: the one the probes dialled.
            "--master-addr": "10.213.0.200", "--master-port": "29500", "--rdzv-backend": "static",
            "--max-restarts": "0", "--tee": "3"}
        assert node.python == PY and node.cwd == "/home/me/run"
    assert plan.nodes[0].ranks == (0, 1) and plan.nodes[1].ranks == (2, 3)
    assert plan.rank("worker1", 1) == 3 and plan.where(2) == ("worker1", 0)


def test_each_node_starts_its_own_ranks_where_a_hostfile_gives_different_slots():
    # Issue 39: `master slots=2`, `worker1 slots=1` (DeepSpeed allows it): torchrun on each node
    # gets its own --nproc-per-node, and the ranks are numbered as torchrun numbers them, node
    # after node (its agents add up the local world sizes in node-rank order).
    plan = plan_for(nproc_per_node=2, nprocs={"master": 2, "worker1": 1})
    assert [torchrun_options(n)["--nproc-per-node"] for n in plan.nodes] == ["2", "1"]
    assert plan.nodes[0].ranks == (0, 1) and plan.nodes[1].ranks == (2,) and plan.world_size == 3
    assert plan.rank("worker1", 0) == 2 and plan.where(1) == ("master", 1) and plan.where(2) == ("worker1", 0)
    # The other way round: the master holds one, its ranks first.
    plan = plan_for(nproc_per_node=3, nprocs={"master": 1, "worker1": 3})
    assert plan.nodes[0].ranks == (0,) and plan.nodes[1].ranks == (1, 2, 3) and plan.where(3) == ("worker1", 2)
    # plan.json (and the dashboard's run info) say each node's own count, no single figure.
    kept = plan.to_json()
    assert (kept["nproc_per_node"], kept["ranks_per_node"], kept["world_size"]) == (None, {"master": 1, "worker1": 3}, 4)
    assert plan_for(nproc_per_node=2).to_json()["nproc_per_node"] == 2


def test_explain_places_each_rank_on_its_node_from_an_uneven_plan():
    # A rank no file shows is put on its node from plan.json's own lists, not node rank x a count.
    from ddp_preflight.explain.records import read_launch
    from ddp_preflight.explain.seen import Gathered
    plan = plan_for(nproc_per_node=3, nprocs={"master": 1, "worker1": 3})
    gathered = Gathered()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plan.json")
        with open(path, "w") as f:
            json.dump(plan.to_json(), f)
        read_launch(gathered, path, plan=True)
    assert [gathered.node_of(r) for r in range(5)] == ["master", "worker1", "worker1", "worker1", None]
    assert gathered.first_ranks() == {"master": 0, "worker1": 1}
    # An older plan.json, with one count and no lists: node rank x that count.
    old = Gathered(nproc_per_node=2, node_order=["master", "worker1"])
    assert [old.node_of(r) for r in range(5)] == ["master", "master", "worker1", "worker1", None]


def test_the_scripts_options_come_after_the_script_and_a_separator():
    plan = plan_for(command=("train.py", "--nproc-per-node", "7", "--run=x"))
    argv = list(plan.nodes[1].torchrun)
    at = argv.index("--")
    assert argv[at - 1] == "/home/me/run/train.py"         # made absolute: every node starts it from cwd
    assert argv[at + 1:] == ["--nproc-per-node", "7", "--run=x"]
    # torchrun's own parser takes its options and the script from the part before the separator,
    # and leaves everything after it to the script (the node runner hands them over as parsed).
    from torch.distributed.run import get_args_parser
    with contextlib.redirect_stderr(io.StringIO()):
        parsed = get_args_parser().parse_args(argv)
    assert parsed.nproc_per_node == "1" and parsed.training_script == "/home/me/run/train.py"
    assert [a for a in parsed.training_script_args if a != "--"] == ["--nproc-per-node", "7", "--run=x"]


def test_a_module_runs_with_dash_m_and_keeps_its_name():
    plan = plan_for(command=("-m", "scripts.base_train", "--", "--run=x"))
    argv = list(plan.nodes[0].torchrun)
    at = argv.index("--")
    assert argv[at - 2:at] == ["-m", "scripts.base_train"] and argv[at + 1:] == ["--run=x"]
    assert plan.command.module and plan.command.words() == ["-m", "scripts.base_train", "--run=x"]


def test_the_environment_is_preflights_interface_and_threads():
    plan = plan_for(nproc_per_node=2)
    for node in plan.nodes:
        # 2 physical cores, 2 processes: one thread each (omp-threads' advice), on eth0 (interface-choice).
        assert dict(node.env) == {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
        assert dict(node.env_sources) == {"GLOO_SOCKET_IFNAME": "interface-choice", "OMP_NUM_THREADS": "omp-threads"}
    assert plan_for(nproc_per_node=1).nodes[0].env["OMP_NUM_THREADS"] == "2"


def test_nccl_pins_its_own_variable_and_leaves_threads_to_torchrun_on_cuda():
    plan = plan_for(backend="nccl", device="cuda")
    assert [dict(n.env) for n in plan.nodes] == [{"NCCL_SOCKET_IFNAME": "eth0"}] * 2


def test_a_nodes_own_omp_setting_passes_through():
    art = clean()
    facts(art, "worker1")["env"]["vars"]["OMP_NUM_THREADS"] = "2"   # set in worker1's environment
    plan = plan_for(art, nproc_per_node=2)
    assert "OMP_NUM_THREADS" in plan.nodes[0].env and "OMP_NUM_THREADS" not in plan.nodes[1].env


def test_user_env_wins_over_preflights_and_adds_its_own():
    plan = plan_for(env=["GLOO_SOCKET_IFNAME=eth1", "NANOCHAT_DTYPE=float32", "X=a=b"])
    for node in plan.nodes:
        assert node.env["GLOO_SOCKET_IFNAME"] == "eth1" and node.env_sources["GLOO_SOCKET_IFNAME"] == "--env"
        assert node.env["NANOCHAT_DTYPE"] == "float32" and node.env["X"] == "a=b"
    assert "NANOCHAT_DTYPE=float32" in plan.nodes[1].command_line()


def test_one_nodes_setting_reaches_that_node_alone_and_wins_over_every_nodes():
    config = from_config({"NANOCHAT_DATA_DIR": "/data/all", "NANOCHAT_DTYPE": "float32"},
                         {"worker1": {"NANOCHAT_DATA_DIR": "/data/w1"}})
    given = parse_env_args(["master:NANOCHAT_DTYPE=bfloat16", "worker1:OMP_NUM_THREADS=3"], ["master", "worker1"])
    master, worker = plan_for(env=TrainingEnv(tuple(config + given)), nproc_per_node=2).nodes
    assert {k: master.env[k] for k in ("NANOCHAT_DATA_DIR", "NANOCHAT_DTYPE")} == {
        "NANOCHAT_DATA_DIR": "/data/all", "NANOCHAT_DTYPE": "bfloat16"}
    assert {k: worker.env[k] for k in ("NANOCHAT_DATA_DIR", "NANOCHAT_DTYPE", "OMP_NUM_THREADS")} == {
        "NANOCHAT_DATA_DIR": "/data/w1", "NANOCHAT_DTYPE": "float32", "OMP_NUM_THREADS": "3"}
    assert master.env_sources["NANOCHAT_DTYPE"] == "--env master:"
    assert master.env_sources["NANOCHAT_DATA_DIR"] == "config [env]"
    assert worker.env_sources["NANOCHAT_DATA_DIR"] == "config [nodes.worker1.env]"
    assert worker.env_sources["OMP_NUM_THREADS"] == "--env worker1:"
    assert master.env_sources["OMP_NUM_THREADS"] == "omp-threads"


def test_without_the_interface_result_the_same_rule_picks_the_interface():
    art = clean()
    ctx = context(art, launch_args=())
    report = Report((), ("master", "worker1"))       # e.g. --only launch-args
    plan = build_plan(report, ctx.nodes, ctx.options, TARGETS, parse_command(["train.py"]), cwd="/x")
    assert [n.env.get("GLOO_SOCKET_IFNAME") for n in plan.nodes] == ["eth0", "eth0"]


def test_a_node_with_its_code_elsewhere_starts_there_with_the_script_moved():
    targets = [Target("master", PY, code_dir="/mnt/data/nanochat"), Target("worker1", PY, code_dir="/home/x/projects/nanochat")]
    plan = plan_for(command=("scripts/train.py", "--lr", "1"), targets=targets, cwd="/mnt/data/nanochat")
    master, worker = plan.nodes
    assert master.cwd == "/mnt/data/nanochat" and "/mnt/data/nanochat/scripts/train.py" in master.torchrun
    assert worker.cwd == "/home/x/projects/nanochat" and "/home/x/projects/nanochat/scripts/train.py" in worker.torchrun


def test_an_unreached_node_cannot_be_launched_on_even_with_force():
    art = only(clean(), "master", "worker1")
    ctx = context(art, launch_args=())
    nodes = (ctx.nodes[0], NodeFacts("worker1", {}, "worker1: ssh: connection refused", "start sshd"))
    with pytest.raises(PlanError, match="worker1 was not reached"):
        build_plan(Report(()), nodes, ctx.options, TARGETS, parse_command(["train.py"]), cwd="/x")


@pytest.mark.parametrize("words, message", [
    ([], "needs the training command after --"),
    (["--nproc-per-node", "2", "train.py"], "comes before the script"),
    (["-m"], "-m needs a module name"),
    (["torchrun", "train.py"], "give the script itself"),
    (["python3", "train.py"], "give the script itself"),
])
def test_bad_commands_are_one_line_with_the_fix(words, message):
    with pytest.raises(PlanError, match=message) as caught:
        parse_command(words)
    assert "\n" not in str(caught.value)


def test_the_launchers_separator_is_not_doubled():
    assert parse_command(["train.py", "--", "--x"]).args == ("--x",)
    assert parse_command(["train.py", "a", "--", "b"]).args == ("a", "--", "b")


@pytest.mark.parametrize("pair, message", [("NOEQUALS", "has no '='"), ("1X=2", "not a variable name"),
                                           ("=v", "not a variable name")])
def test_bad_env_pairs_name_the_pair_and_the_form(pair, message):
    with pytest.raises(EnvError, match=message):
        parse_env_args([pair])


def test_a_bad_env_name_is_said_without_its_value():
    with pytest.raises(EnvError) as error:
        parse_env_args(["1HF_TOKEN=hf_secret"])
    assert "hf_secret" not in str(error.value) and str(error.value).startswith("--env 1HF_TOKEN=...: ")


def test_secrets_reach_the_node_but_never_the_plan_shown_or_kept():
    secrets = {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI", "HF_TOKEN": "hf_abc", "WANDB_API_KEY": "0123abcd",
               "PASSWORD": "hunter2", "DATABASE_URL": "postgres://u:p@db/x"}
    plan = plan_for(env=[f"{k}={v}" for k, v in secrets.items()], command=("train.py", "--hub-token", "hf_arg", "--mirror", "https://me:pw@host/s"))  # noqa: E501
    shown = json.dumps(plan.to_json()) + "".join(n.command_line() for n in plan.nodes)
    for value in (*secrets.values(), "hf_arg", "me:pw"):
        assert value not in shown
    node = plan.nodes[1]
    assert node.to_json()["env"]["DATABASE_URL"] == "<redacted>"      # not a name known safe (issue 23)
    assert "HF_TOKEN='<redacted>'" in node.command_line() and "--hub-token '<redacted>'" in node.command_line()
    # What starts on the node is the real thing.
    assert {k: node.env[k] for k in secrets} == secrets
    assert list(node.torchrun[-4:]) == ["--hub-token", "hf_arg", "--mirror", "https://me:pw@host/s"]
