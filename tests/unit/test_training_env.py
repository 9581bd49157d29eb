"""The training's variables per node: the config's [env] and [nodes.NAME.env], then --env NAME=VALUE
and --env NODE:NAME=VALUE; the later layer wins, one node's setting over every node's."""

from __future__ import annotations

import pytest

from ddp_preflight.preflight.config import ConfigError, load
from ddp_preflight.rules.training_env import EnvError, TrainingEnv, from_config, parse_env_args

HOSTS = ["master", "worker1", "fd00::2"]


def test_a_value_keeps_every_colon_and_equals_sign():
    (s,) = parse_env_args(["URL=http://h:80/?a=b"], HOSTS)
    assert (s.name, s.value, s.node, s.source) == ("URL", "http://h:80/?a=b", None, "--env")


def test_a_node_prefix_names_one_node_an_ipv6_host_at_its_last_colon():
    one, six = parse_env_args(["worker1:NANOCHAT_DATA_DIR=/data/w1", "fd00::2:X=1"], HOSTS)
    assert (one.node, one.name, one.value, one.source) == ("worker1", "NANOCHAT_DATA_DIR", "/data/w1", "--env worker1:")
    assert (six.node, six.name, six.value) == ("fd00::2", "X", "1")


@pytest.mark.parametrize("pair, message", [
    ("worker9:X=1", "--env worker9:X=...: worker9 is not one of the hosts (master, worker1, fd00::2): "
                    "name a host of this run before the ':'"),
    (":X=1", "--env :X=...: no node before ':': write --env NODE:NAME=VALUE "
             "(e.g. --env worker1:NANOCHAT_DATA_DIR=/data/small)"),
    ("worker1:1X=secret", "--env worker1:1X=...: '1X' is not a variable name (letters, digits and _, "
                          "not starting with a digit)"),
])
def test_bad_settings_are_one_line_naming_the_fix_never_the_value(pair, message):
    with pytest.raises(EnvError) as error:
        parse_env_args([pair], HOSTS)
    assert str(error.value) == message


def test_layers_win_in_order_and_each_node_gets_its_own():
    env = TrainingEnv(tuple(from_config({"A": "config", "B": "config"}, {"worker1": {"A": "config-w1"}})
                            + parse_env_args(["B=arg", "master:A=arg-master"], HOSTS)))
    assert env.for_node("master") == {"A": "arg-master", "B": "arg"}
    assert env.for_node("worker1") == {"A": "config-w1", "B": "arg"}
    assert env.sources("worker1") == {"A": "config [nodes.worker1.env]", "B": "--env"}
    assert env.for_node("fd00::2") == {"A": "config", "B": "arg"}
    assert not TrainingEnv() and env


def test_the_config_takes_env_tables_for_all_and_for_one_node(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[env]\nNANOCHAT_DTYPE = "float32"\nOMP_NUM_THREADS = 4\n'
                    '[nodes.worker1.env]\nNANOCHAT_DATA_DIR = "/data/w1"\n')
    config = load(str(path))
    assert config.env == {"NANOCHAT_DTYPE": "float32", "OMP_NUM_THREADS": "4"}
    assert config.node_env == {"worker1": {"NANOCHAT_DATA_DIR": "/data/w1"}}


@pytest.mark.parametrize("text, message", [
    ('[env]\n"1X" = "v"\n', "[env] has '1X', not a variable name (letters, digits and _, not starting with a digit)"),
    ('[nodes.w.env]\nTOKEN = true\n', "[nodes.w.env] TOKEN must be a string (write TOKEN = \"...\"), not a bool"),
    ('env = "X=1"\n', "[env] must be a table of NAME = \"value\" pairs"),
])
def test_a_bad_env_table_is_one_line(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load(str(path))
    assert str(error.value) == f"config {path}: {message}"
