"""up, down, status, exec and ssh: idempotent, exact, and clear about bad input."""

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.lab import Lab, LabError
from ddp_preflight.lab.state import lab_root

CLI = [sys.executable, "-m", "ddp_preflight"]


def snapshot() -> dict:
    """What the host has that a lab could leave behind."""
    def run(*argv):
        return subprocess.run(argv, capture_output=True, text=True).stdout
    links = sorted(line["ifname"] for line in json.loads(run("ip", "-j", "link")))
    pids_with_lab_paths = sorted(
        p for p in os.listdir("/proc") if p.isdigit() and str(lab_root()) in _cmdline(p))
    return {
        "netns": sorted(run("ip", "netns", "list").split()),
        "links": links,
        "etc_netns": sorted(os.listdir("/etc/netns")) if os.path.isdir("/etc/netns") else None,
        "run_sshd": os.path.isdir("/run/sshd"),
        "lab_root": sorted(os.listdir(lab_root())) if lab_root().is_dir() else None,
        "root_nft": run("nft", "list", "ruleset"),
        "lab_processes": pids_with_lab_paths,
        "routes": run("ip", "route") + run("ip", "-6", "route"),
    }


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_down_leaves_nothing_behind_even_with_every_fault(lab):
    # `lab` (the session's) is up too: the snapshot includes it, and it must survive.
    before = snapshot()
    name = "d" + secrets.token_hex(3)
    faults = ["firewall@worker1", "firewall-self@master", "vpn-ipv6@worker1", "wifi@worker2", "loopback-host@worker2",
              "port-busy@master", "shards@worker1"]
    other, built = Lab.up(name, nodes=3, faults=faults)
    assert built
    # Something a user started in a node through ssh: it goes down with the lab.
    subprocess.run(["ssh", "-F", str(other.ssh_config), "worker2", "setsid sleep 300 >/dev/null 2>&1 &"],
                   check=True, timeout=30)
    assert len(other.processes("worker2")) >= 2     # sshd and the sleep
    assert snapshot() != before
    report = Lab.down(name)
    assert report is not None and not report.problems
    after = snapshot()
    assert after == before
    assert lab.status()["nodes"][0]["sshd"]         # the other lab is untouched


def test_up_twice_and_down_twice_are_safe():
    name = "i" + secrets.token_hex(3)
    first, built = Lab.up(name, nodes=2)
    try:
        again, built_again = Lab.up(name, nodes=2)
        assert built and not built_again
        assert again.status() == first.status()
        with pytest.raises(LabError, match="already up with 2 nodes"):
            Lab.up(name, nodes=3)
    finally:
        assert Lab.down(name) is not None
    assert Lab.down(name) is None


def test_cli_status_exec_and_down(lab, lab_name):
    status = subprocess.run(CLI + ["lab", "status", "--name", lab_name, "--json"],
                            capture_output=True, text=True)
    assert status.returncode == 0
    data = json.loads(status.stdout)
    assert [n["name"] for n in data["nodes"]] == ["master", "worker1"]
    assert all(n["sshd"] for n in data["nodes"])
    exe = subprocess.run(CLI + ["lab", "exec", "--name", lab_name, "worker1", "--", "hostname"],
                         capture_output=True, text=True)
    assert (exe.returncode, exe.stdout.strip()) == (0, "worker1")
    failing = subprocess.run(CLI + ["lab", "exec", "--name", lab_name, "worker1", "--", "sh", "-c", "exit 7"])
    assert failing.returncode == 7
    missing = subprocess.run(CLI + ["lab", "exec", "--name", lab_name, "worker9", "--", "true"],
                             capture_output=True, text=True)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "no node 'worker9'" in missing.stderr


def test_every_node_answers_ssh_with_its_own_hostname_and_data(lab):
    for node in lab.nodes:
        done = subprocess.run(["ssh", "-F", str(lab.ssh_config), node.name,
                               f"hostname; ls {lab.state.data_dir} | wc -l"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [node.name, "8"]


def test_fabric_runs_a_command_on_every_node(lab):
    from fabric import Config, Connection

    config = Config(runtime_ssh_path=str(lab.ssh_config))
    for node in lab.nodes:
        with Connection(node.name, config=config) as conn:
            result = conn.run("hostname && ip -4 -br addr show eth0", hide=True, in_stream=False)
        assert result.stdout.splitlines()[0] == node.name
        assert node.ipv4 in result.stdout


def test_not_root_is_a_one_line_error():
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           *CLI, "lab", "up", "--name", "nr"],
                          capture_output=True, text=True, env={**os.environ, "HOME": "/tmp"},
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "needs root" in done.stderr and "sudo" in done.stderr


def test_a_subnet_clash_is_a_one_line_error(lab):
    host_net = lab.state.subnet4      # another lab's subnet: taken
    done = subprocess.run(CLI + ["lab", "up", "--name", "clash", "--subnet", host_net],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "clashes" in done.stderr
    assert not (lab_root() / "clash").exists()


def test_a_subnet_clash_with_the_hosts_own_network_is_refused():
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route"], capture_output=True,
                                       text=True).stdout)
    host_nets = [r["dst"] for r in routes if "/" in r.get("dst", "")]
    if not host_nets:
        pytest.fail("this machine has no IPv4 subnet route to clash with")
    with pytest.raises(LabError, match="clashes with the host's"):
        Lab.up("clash2", subnet=host_nets[0])


def test_bad_fault_and_node_count_are_one_line_errors():
    with pytest.raises(LabError, match="unknown fault 'nosuch'"):
        Lab.up("bad", faults=["nosuch@worker1"])
    with pytest.raises(LabError, match="no such node"):
        Lab.up("bad", faults=["firewall@worker7"])
    with pytest.raises(LabError, match="1 to 16 nodes"):
        Lab.up("bad", nodes=17)
    with pytest.raises(LabError, match="not usable"):
        Lab.up("Bad Name!")


def test_sixteen_nodes_come_up_and_every_sshd_answers():
    name = "s" + secrets.token_hex(3)
    lab, _ = Lab.up(name, nodes=16)
    try:
        assert [n.name for n in lab.nodes] == ["master"] + [f"worker{i}" for i in range(1, 16)]
        assert len({n.ipv4 for n in lab.nodes}) == 16
        assert all(n["sshd"] for n in lab.status()["nodes"])
        done = subprocess.run(["ssh", "-F", str(lab.ssh_config), "worker15",
                               "getent hosts master worker15"], capture_output=True, text=True, timeout=30)
        assert lab.node("master").ipv4 in done.stdout and lab.node("worker15").ipv4 in done.stdout
    finally:
        Lab.down(name)


def test_one_labs_down_leaves_the_folders_other_labs_share(lab):
    """/run/sshd is the first lab's to create and every lab's sshd needs it at each connection:
    the first lab's `down` leaves it while another lab is up, and hands its removal over."""
    from ddp_preflight.lab import sshd
    from ddp_preflight.lab.state import LabState, all_labs

    name = "f" + secrets.token_hex(3)
    first, _ = Lab.up(name, nodes=2)
    try:
        state = LabState.load(name)
        shared = {"kind": "dir_if_empty", "path": str(sshd.PRIVSEP_DIR)}
        if shared not in state.undo:
            # It existed before this lab (the session's lab made it): record it as this lab's,
            # as it is when this lab is the first.
            state.undo.insert(1, shared)
            state.save()
    finally:
        report = Lab.down(name)
    try:
        assert report is not None and not report.problems
        assert sshd.PRIVSEP_DIR.is_dir()
        done = subprocess.run(["ssh", "-F", str(lab.ssh_config), "worker1", "true"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        # A lab still up removes it last: the session's, or another a user has up (CI saw one).
        assert any(shared in other.undo for other in all_labs()), [o.name for o in all_labs()]
    finally:
        sshd.PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)   # never leave the session's lab broken
