"""What users of torchrun, ssh, git and pytest expect of a command line: every --help says what the
command does, shows examples that run as written and what the exit codes mean; a mistyped option
or command names the one meant; torchrun's options that ddp-preflight decides itself, and a
training command put before its --, say what to type instead. The real parsers, in this process."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.cli import ddp_preflight, examples, explain, hangwatch, lab

ROOT = Path(__file__).resolve().parents[2]


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command and subcommand a user can ask --help of, by how it is typed."""
    out: dict[str, argparse.ArgumentParser] = {}
    todo = [("ddp-preflight", ddp_preflight._parser()), ("ddp-preflight explain", explain._parser()),
            ("ddp-preflight lab", lab._parser()), ("hangwatch", hangwatch._parser())]
    while todo:
        name, parser = todo.pop()
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend((f"{name} {sub}", p) for sub, p in action.choices.items())
    return out


PARSERS = parsers()


def test_every_command_is_found():
    assert set(PARSERS) == {
        "ddp-preflight", "ddp-preflight explain", "ddp-preflight lab", "ddp-preflight lab up",
        "ddp-preflight lab down", "ddp-preflight lab status", "ddp-preflight lab exec", "ddp-preflight lab fault",
        "ddp-preflight lab fault add", "ddp-preflight lab fault clear", "ddp-preflight lab faults", "hangwatch",
        "hangwatch attach"}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_help_says_what_the_command_does_and_names_no_raw_argparse_word(name):
    parser = PARSERS[name]
    assert parser.description, f"{name} --help has no description"
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and not action.choices:
            # argparse would show the dest in capitals (SSH_CONFIG, INCIDENT_DIR): say what to give
            assert action.metavar, f"{name} {action.option_strings[0]} has no metavar"
        if isinstance(action, argparse._SubParsersAction):
            assert action.metavar, f"{name}: its commands show as argparse's {{a,b}}"


@pytest.mark.parametrize("name", ["ddp-preflight", "ddp-preflight explain", "ddp-preflight lab", "hangwatch",
                                  "hangwatch attach"])
def test_the_top_commands_help_ends_with_examples_and_exit_codes(name):
    text = PARSERS[name].format_help()
    assert "\nexamples:\n  " in text
    assert "\nexit codes: 0 " in text
    examples_block = text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0]
    assert all(line.startswith("  ") for line in examples_block.splitlines())   # kept as written, not re-wrapped


@pytest.mark.parametrize("text", [examples.PREFLIGHT, examples.EXPLAIN, examples.LAB, examples.HANGWATCH])
def test_every_variable_a_help_names_is_one_the_code_reads(text):
    import re
    source = "\n".join(p.read_text() for p in (ROOT / "ddp_preflight").rglob("*.py") if p.name != "examples.py")
    for name in re.findall(r"\b(DDP_PREFLIGHT_[A-Z_]+|NO_COLOR)\b", text):
        assert f'"{name}"' in source, name


def help_examples() -> list[str]:
    return [line.strip() for text in (examples.PREFLIGHT, examples.EXPLAIN, examples.LAB, examples.HANGWATCH)
            for line in text.splitlines() if line.startswith("  ")]


def test_every_example_fits_an_80_column_terminal():
    # Kept as written (not re-wrapped): a longer one would break in the middle of a command
    assert [line for line in help_examples() if len(line) + 2 > 79] == []


@pytest.mark.parametrize("line", help_examples())
def test_every_example_in_a_help_is_accepted_as_written(line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(line, comments=True)
    for word in (">", "<"):
        if word in argv:
            argv = argv[:argv.index(word)]
    program, argv = argv[0], argv[1:]
    if program == "hangwatch":
        hangwatch._parser().parse_args(argv)                 # SystemExit (a usage error) fails the test
    elif argv[:1] == ["lab"]:
        lab._parser().parse_args(argv[1:])
    elif argv[:1] == ["explain"]:
        explain._parser().parse_args(argv[1:])
    else:
        launch_args = argv[argv.index("--") + 1:] if "--" in argv else []
        args = ddp_preflight._parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
        ddp_preflight._launch_request(args, launch_args)       # UsageError: refused before any node


def usage_line(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(argv)
    out, err = capsys.readouterr()
    assert (stopped.value.code, out, err.count("\n")) == (2, "", 1), (stopped.value.code, out, err)
    return err.strip()


def test_a_mistyped_option_names_the_one_meant(capsys):
    assert usage_line(ddp_preflight._parser(), ["--datadir", "/data"], capsys) == (
        "ddp-preflight: error: unrecognized arguments: --datadir: did you mean --data-dir? (see ddp-preflight --help)")
    assert usage_line(explain._parser(), ["--jsn", "x.log"], capsys) == (
        "ddp-preflight explain: error: unrecognized arguments: --jsn: did you mean --json? "
        "(see ddp-preflight explain --help)")
    # argparse reports a subcommand's unknown option from the top parser: the subcommands' options count
    assert usage_line(hangwatch._parser(), ["attach", "--thresold", "3"], capsys) == (
        "hangwatch: error: unrecognized arguments: --thresold: did you mean --threshold? (see hangwatch --help)")


def test_a_mistyped_command_names_the_one_meant(capsys):
    assert usage_line(lab._parser(), ["stauts"], capsys) == (
        "ddp-preflight lab: error: argument COMMAND: invalid choice: 'stauts' (choose from 'up', 'down', 'status', "
        "'exec', 'fault', 'faults'): did you mean 'status'? (see ddp-preflight lab --help)")
    assert usage_line(hangwatch._parser(), ["atach"], capsys) == (
        "hangwatch: error: argument COMMAND: invalid choice: 'atach' (choose from 'attach'): did you mean "
        "'attach'? (see hangwatch --help)")
    assert usage_line(hangwatch._parser(), [], capsys) == (
        "hangwatch: error: the following arguments are required: COMMAND (see hangwatch --help)")


def test_a_choice_in_capitals_is_the_one_meant(capsys):
    assert usage_line(ddp_preflight._parser(), ["--backend", "NCCL"], capsys) == (
        "ddp-preflight: error: argument --backend: invalid choice: 'NCCL' (choose from 'gloo', 'nccl'): did you mean "
        "'nccl'? (see ddp-preflight --help)")


def test_torchruns_gpu_and_cpu_process_counts_say_auto(capsys):
    assert usage_line(ddp_preflight._parser(), ["--nproc-per-node", "gpu"], capsys) == (
        "ddp-preflight: error: argument --nproc-per-node/--nproc_per_node: 'gpu' is torchrun's spelling: give auto "
        "(each node's GPUs on a CUDA run, its CPUs on a CPU run) or a number (see ddp-preflight --help)")


def test_nothing_near_is_no_guess(capsys):
    # --steps is nearest --strict of all, and far from it: no "did you mean" that would mislead
    assert usage_line(explain._parser(), ["--steps", "x.log"], capsys) == (
        "ddp-preflight explain: error: unrecognized arguments: --steps (see ddp-preflight explain --help)")


@pytest.mark.parametrize("argv, instead", [
    (["master", "worker1", "--nnodes", "2"], "--nnodes 2: ddp-preflight counts the nodes from the hosts: list them "
                                             "(ddp-preflight master worker1 ...) or give --hostfile FILE"),
    (["master", "--node_rank=0"], "--node_rank=0: each node's rank is its place among the hosts (the first is the "
                                  "master, rank 0's node)"),
    (["--rdzv-endpoint", "10.0.0.1:29500"], "--rdzv-endpoint: the master is the first host; give its address and "
                                            "port with --master-addr and --master-port"),
    (["--max-restarts", "3"], "--max-restarts: --launch runs torchrun with --max-restarts 0: a failed rank stops "
                              "the run and is explained, not restarted"),
    (["--rdzv_backend=c10d"], "--rdzv_backend=c10d: --launch runs torchrun with a static rendezvous at the master "
                              "(--master-addr, --master-port)"),
    (["--tee", "3"], "--tee: --launch brings every rank's output here, each line prefixed, and keeps a log per node "
                     "(--log-dir DIR)"),
    (["--standalone"], "--standalone: with no HOST ddp-preflight checks (and --launch runs on) this machine alone"),
    (["master", "-m", "scripts.base_train"], "-m scripts.base_train: the training command goes after --: "
                                             "ddp-preflight HOST ... -- -m MODULE [ARGS]"),
    (["master", "--launch", "--steps", "20"], "--steps 20: if it is the training command's, put it after --: "
                                              "ddp-preflight HOST ... -- SCRIPT [ARGS]"),
])
def test_torchruns_options_and_the_scripts_say_what_to_type_instead(argv, instead, capsys):
    assert usage_line(ddp_preflight._parser(), argv, capsys) == (
        f"ddp-preflight: error: unrecognized arguments: {instead} (see ddp-preflight --help)")


@pytest.mark.parametrize("parser, argv, instead", [
    ("ddp-preflight", ["-F", "cluster.ssh", "master"], "-F: ssh's -F is --ssh-config FILE here"),
    ("ddp-preflight", ["master", "-p", "2222"], "-p 2222: ssh takes a node's port from the ssh config (Host NAME / "
                                                "Port N); give --ssh-config FILE"),
    ("hangwatch", ["attach", "-i", "~/.ssh/lab", "master"], "-i: ssh takes the key from the ssh config (Host NAME / "
                                                           "IdentityFile PATH); give --ssh-config FILE"),
    ("hangwatch", ["attach", "-l", "root", "master"], "-l: give the user with the host, as ssh does: USER@HOST"),
])
def test_sshs_options_say_where_they_go_here(parser, argv, instead, capsys):
    main = {"ddp-preflight": ddp_preflight._parser, "hangwatch": hangwatch._parser}[parser]()
    assert usage_line(main, argv, capsys) == (
        f"{parser}: error: unrecognized arguments: {instead} (see {parser} --help)")


def test_a_training_script_given_as_a_host_says_where_it_goes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('training')\n")

    assert usage_line(ddp_preflight._parser(), ["master", "train.py", "--steps", "20"], capsys) == (
        "ddp-preflight: error: argument HOST: train.py is a file here, not a host: the training command goes "
        "after --: ddp-preflight HOST ... [--launch] -- train.py [ARGS] (see ddp-preflight --help)")
    # after an option argparse takes no more HOSTs: the same words, from the words it did not know
    assert usage_line(ddp_preflight._parser(), ["master", "--launch", "train.py", "--steps", "20"], capsys) == (
        "ddp-preflight: error: unrecognized arguments: train.py --steps 20: train.py is a file here, not a host: "
        "the training command goes after --: ddp-preflight HOST ... [--launch] -- train.py [ARGS] "
        "(see ddp-preflight --help)")
    # a host whose name ends as a file's would (Paraguay's .py) is a host while no such file is here
    assert ddp_preflight._parser().parse_args(["gpu1.example.py"]).hosts == ["gpu1.example.py"]


def test_the_real_command_says_it_in_one_line():
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "lab", "stauts"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)

    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.endswith("did you mean 'status'? (see ddp-preflight lab --help)\n")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_bash_completes_the_labs_options_and_hangwatch(tmp_path):
    script = tmp_path / "completion.sh"
    done = subprocess.run([sys.executable, "-m", "ddp_preflight", "--completion", "bash"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    script.write_text(done.stdout)

    def complete(function: str, line: str) -> list[str]:
        program = ('source "$0"; read -ra COMP_WORDS <<< "$1"; [[ $1 == *" " ]] && COMP_WORDS+=(""); '
                   f'COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); {function}; printf "%s\\n" "${{COMPREPLY[@]}}"')
        done = subprocess.run(["bash", "-c", program, str(script), line], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("_ddp_preflight", "ddp-preflight lab up --n") == ["--name", "--nodes"]
    assert complete("_ddp_preflight", "ddp-preflight lab status --j") == ["--json"]
    assert complete("_hangwatch", "hangwatch at") == ["attach"]
    assert complete("_hangwatch", "hangwatch attach --thr") == ["--threshold"]
    assert complete("_hangwatch", "hangwatch attach --exit") == ["--exit-on-hang"]
