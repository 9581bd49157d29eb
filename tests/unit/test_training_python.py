"""Where the training's Python is: one rule (rules/python.py) for the facts and probes
(preflight's targets), training-imports (Options.pythons), the launch (the targets' Python runs
torchrun) and hangwatch attach."""

from __future__ import annotations

import argparse
import socket
import sys

from ddp_preflight.cli.ddp_preflight import _targets
from ddp_preflight.cli.folders import python_of as _python_of
from ddp_preflight.preflight.config import Config
from ddp_preflight.rules.python import TrainingPython, training_python


def args(python=None) -> argparse.Namespace:
    return argparse.Namespace(python=python, code_dir=None, data_dir=None)


def test_python_flag_wins_then_the_nodes_config_then_this_interpreter():
    assert training_python("/venv/bin/python", "/opt/conf/python") == TrainingPython("/venv/bin/python", True)
    assert training_python(None, "/opt/conf/python") == TrainingPython("/opt/conf/python", True)
    assert training_python(None, None) == TrainingPython(sys.executable, False)
    assert training_python(None).given is None


def test_one_node_runs_the_python_the_config_names_for_it():
    # The config names a Python for this machine alone ([nodes.HOST]): the local run's facts and
    # probes (its target) and training-imports (Options.pythons) must both use it. The target
    # used to read only the config's top-level python, then this interpreter's.
    here = socket.gethostname()
    config = Config({"python": "/opt/every/python"}, {here: {"python": "/opt/this-node/python"}})
    [target] = _targets(args(), config, [], [])
    assert target.python == _python_of(args(), config, here).path == "/opt/this-node/python"


def test_every_host_gets_the_same_answer_as_training_imports():
    config = Config({"python": "/opt/every/python"}, {"worker1": {"python": "/opt/w1/python"}})
    targets = {t.name: t.python for t in _targets(args(), config, ["master", "worker1"], [])}
    assert targets == {"master": "/opt/every/python", "worker1": "/opt/w1/python"}
    flagged = {t.name: t.python for t in _targets(args("/venv/bin/python"), config, ["master", "worker1"], [])}
    assert flagged == {"master": "/venv/bin/python", "worker1": "/venv/bin/python"}
    # Nothing named: this interpreter's, and training-imports knows it was a guess.
    guessed = _python_of(args(), Config(), "worker1")
    assert guessed.path == sys.executable and not guessed.named


def test_a_nodes_own_python_flag_wins_over_the_flag_for_every_node_and_the_config():
    from ddp_preflight.cli.folders import pythons_given as _pythons

    config = Config({"python": "/opt/every/python"}, {"worker1": {"python": "/opt/w1/python"}})
    given = argparse.Namespace(python=["/venv/bin/python", "worker1:/w1/venv/bin/python"], code_dir=None,
                               data_dir=None)
    given.python_paths = _pythons(given, ["master", "worker1"])
    targets = {t.name: t.python for t in _targets(given, config, ["master", "worker1"], [])}
    assert targets == {"master": "/venv/bin/python", "worker1": "/w1/venv/bin/python"}
    only = argparse.Namespace(python=["worker1:/w1/venv/bin/python"], code_dir=None, data_dir=None)
    only.python_paths = _pythons(only, ["master", "worker1"])
    assert {t.name: t.python for t in _targets(only, config, ["master", "worker1"], [])} == \
        {"master": "/opt/every/python", "worker1": "/w1/venv/bin/python"}
    assert _python_of(only, config, "worker1").named
