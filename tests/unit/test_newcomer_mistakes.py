"""More of a newcomer's mistakes, each one line naming what is wrong and what to give, exit 2,
decided before any node is contacted: the commands' own main(), in this process."""

from __future__ import annotations

import pytest

from ddp_preflight.cli import ddp_preflight, explain, hangwatch


def said(main, argv: list[str], capsys, monkeypatch, env: dict[str, str] | None = None) -> str:
    monkeypatch.delenv("DDP_PREFLIGHT_SSH_CONFIG", raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out, err.count("\n")) == (2, "", 1), (code, out, err)
    assert "Traceback" not in err
    return err.strip()


def test_a_mistyped_check_id_names_the_ones_meant(capsys, monkeypatch):
    assert said(ddp_preflight.main, ["--only", "node-reachble,ptrace,clockskew"], capsys, monkeypatch) == (
        "ddp-preflight: error: unknown check node-reachble, clockskew: see --list (did you mean node-reachable, "
        "clock-skew?)")
    assert said(ddp_preflight.main, ["--only", "bogus"], capsys, monkeypatch) == (
        "ddp-preflight: error: unknown check bogus: see --list")


def test_an_ssh_config_that_is_a_folder_is_said_so(tmp_path, capsys, monkeypatch):
    assert said(ddp_preflight.main, ["master", "--ssh-config", str(tmp_path)], capsys, monkeypatch) == (
        f"ddp-preflight: error: ssh config {tmp_path} is a folder, not a file: give an OpenSSH client config file "
        "(as ssh -F takes)")
    assert said(hangwatch.main, ["attach", "master"], capsys, monkeypatch,
                env={"DDP_PREFLIGHT_SSH_CONFIG": str(tmp_path)}) == (
        f"hangwatch: error: ssh config {tmp_path} (from $DDP_PREFLIGHT_SSH_CONFIG) is a folder, not a file: give an "
        "OpenSSH client config file (as ssh -F takes)")


@pytest.mark.parametrize("argv, line", [
    (["attach", "--endless-after", "3"], "hangwatch: error: --endless-after 3 is shorter than the threshold (8 s): "
                                         "give 8 or more, or a lower --threshold"),
    (["attach", "--for", "-5", "--keep-watching"], "hangwatch: error: --for -5: give the seconds to watch, more "
                                                   "than 0"),     # was watched for no time, exit 0
])
def test_hangwatch_numbers_that_cannot_be_say_what_to_give(argv, line, capsys, monkeypatch):
    assert said(hangwatch.main, argv, capsys, monkeypatch) == line


@pytest.mark.parametrize("contents", ["nothing", "binaries"])
def test_explain_of_folders_with_no_log_is_unreadable_input_not_no_failure(contents, tmp_path, capsys, monkeypatch):
    # Was "no failure found in 0 inputs", exit 0: nothing was read, so nothing can be said.
    folder = tmp_path / "run"
    folder.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    if contents == "binaries":
        (folder / "model.bin").write_bytes(bytes(range(256)) * 64)
        (other / "optimizer.bin").write_bytes(bytes(range(256)) * 64)

    line = said(explain.main, [str(folder), str(other)], capsys, monkeypatch)

    why = {"nothing": "",
           "binaries": f" (2 not read: {folder}/model.bin: binary, ...)"}[contents]
    assert line == (f"ddp-preflight explain: error: nothing to read in {folder}, {other}{why}: give a run's log folder, "
                    "a log file, an error file, a Flight Recorder dump or an incident bundle")


def test_a_folder_with_one_log_is_read(tmp_path, capsys):
    (tmp_path / "model.bin").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "train.log").write_text("[worker1 r1] step 1 loss 3.2\n")

    assert explain.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("no failure found in 1 input: ")


@pytest.mark.parametrize("argv", [["lab", "faults"], ["--completion", "bash"]])
def test_a_reader_that_goes_away_from_a_listing_is_no_error(argv):
    # `ddp-preflight lab faults | head -1`, `lab status | head -1`, `--completion bash | head`: was
    # BrokenPipeError's traceback
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "ddp_preflight", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert (proc.wait(timeout=60), err) == (141, b"")


@pytest.mark.parametrize("given, config, instead", [
    ("master:22", "Host master / Port 22", "master"),
    ("root@10.0.0.1:2222", "Host 10.0.0.1 / Port 2222", "root@10.0.0.1"),
    ("[fd7a::11]:2222", "Host fd7a::11 / Port 2222", "[fd7a::11]"),
])
def test_a_host_with_a_port_says_where_ssh_takes_the_port_from(given, config, instead, capsys, monkeypatch):
    # scp's and URLs' HOST:PORT: was "is not a host name", or for an IPv4 address taken as an address
    assert said(ddp_preflight.main, [given, "--no-probes"], capsys, monkeypatch) == (
        f"ddp-preflight: error: the command line: host name {given!r} names a port: ssh takes it from the ssh config "
        f"({config}, as ssh -p does); give {instead}")


@pytest.mark.parametrize("address", ["fe80::1", "fd7a:115c:a1e0::11", "::1"])
def test_an_ipv6_address_is_no_host_with_a_port(address):
    from ddp_preflight.transport.host_names import bad_host_reason
    assert bad_host_reason(address) is None


def test_a_misspelt_explain_before_a_path_here_is_that_command(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("[worker1 r1] step 1 loss 3.2\n")
    with pytest.raises(SystemExit) as stopped:
        ddp_preflight.main(["explian", str(log)])     # was two hosts that do not resolve, exit 1
    out, err = capsys.readouterr()

    assert (stopped.value.code, out) == (2, "")
    assert err == (f"ddp-preflight: error: 'explian' is no command, and {str(log)!r} is a path here: did you mean "
                   f"ddp-preflight explain {log}? (see ddp-preflight --help)\n")


@pytest.mark.parametrize("argv", [["explian", "/no/such/log"], ["explain-node", "worker1"], ["lab1", "lab2"]])
def test_a_host_is_never_refused_for_its_name_alone(argv):
    from ddp_preflight.cli.args import misspelt_command
    assert misspelt_command(argv) is None


def test_a_log_dir_that_cannot_be_made_is_said_before_preflight(capsys, monkeypatch):
    import os
    # root may write anywhere os.access can tell, but no folder can be made in /proc: was said after
    # the whole preflight, when the launch began
    why = "No such file or directory" if os.geteuid() == 0 else "Permission denied"
    assert said(ddp_preflight.main, ["--launch", "--log-dir", "/proc/nope/run", "--", "train.py"], capsys,
                monkeypatch) == (f"ddp-preflight: error: cannot write the logs in /proc/nope/run ({why}): give "
                                 "--log-dir a folder this user can write to")


def test_asking_whether_a_log_dir_can_be_made_leaves_nothing_behind(tmp_path):
    from ddp_preflight.cli.launch import log_dir_problem

    assert log_dir_problem(str(tmp_path / "runs" / "first")) is None
    assert list(tmp_path.iterdir()) == []


FAULT_NAMES = ("firewall, firewall-part, firewall-self, vpn-ipv6, wifi, dead-route, rp-filter, wrong-route, lossy, "
               "lossy-out, loopback-host, ipv6-host, ipv6-off, stale-hosts, port-busy, mtu-blackhole, shards")


@pytest.mark.parametrize("argv, line", [
    (["fault", "add", "--name", "nolab43", "firewal@worker1"],
     "ddp-preflight lab fault add: error: argument FAULT@NODE[:PARAM]: unknown fault 'firewal': choose from "
     f"{FAULT_NAMES} (did you mean firewall?) (see ddp-preflight lab fault add --help)"),
    (["up", "--name", "nolab43", "--fault", "vpn-ipv7@worker1"],
     "ddp-preflight lab up: error: argument --fault: unknown fault 'vpn-ipv7': choose from "
     f"{FAULT_NAMES} (did you mean vpn-ipv6?) (see ddp-preflight lab up --help)"),
    (["fault", "add", "--name", "nolab43", "firewall"],
     "ddp-preflight lab fault add: error: argument FAULT@NODE[:PARAM]: fault 'firewall' is not FAULT@NODE[:PARAM], "
     "e.g. firewall@worker1 or wifi@worker1:100mbit (see ddp-preflight lab fault add --help)"),
])
def test_a_mistyped_fault_is_said_before_the_lab_is_looked_at(argv, line, capsys):
    # Was "no lab named ... is up" first, then, with the lab up, the unknown fault without the one meant
    from ddp_preflight.cli import lab
    with pytest.raises(SystemExit) as stopped:
        lab.main(argv)
    out, err = capsys.readouterr()
    assert (stopped.value.code, out, err) == (2, "", line + "\n")
