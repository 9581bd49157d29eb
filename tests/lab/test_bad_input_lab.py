"""Bad input that needs a real node: an address nothing answers at, a machine with no route,
--master-port 22 where sshd listens, and a --python that is not a Python, over real ssh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddp_preflight.node.boot import STAGE0

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ddp_preflight"]


def with_host(lab, tmp_path, name: str, address: str) -> Path:
    """The lab's ssh config plus `name` at `address`, with the lab's key and known hosts."""
    text = Path(lab.ssh_config).read_text()
    block = text[text.index("Host master"):].split("\n\n")[0]
    config = tmp_path / "ssh_config"
    config.write_text(text + "\n" + block.replace("Host master", f"Host {name}")
                      .replace(f"HostName {lab.node('master').ipv4}", f"HostName {address}") + "\n")
    return config


def report_of(done: subprocess.CompletedProcess, expect: int) -> dict:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == expect, (done.returncode, done.stdout[-3000:], done.stderr)
    return json.loads(done.stdout)


def preflight(lab, *args, hosts=("master", "worker1"), ssh_config=None, expect=1) -> dict:
    done = subprocess.run([*CLI, *hosts, "--json", "--ssh-config", str(ssh_config or lab.ssh_config), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    return report_of(done, expect)


def result(report, check, node):
    (found,) = [r for r in report["results"] if r["check"] == check and r["node"] == node]
    return found


def test_an_address_nothing_answers_at_is_no_route_not_a_refusal(clean_lab, tmp_path):
    # In the lab's subnet, held by no node: the neighbour lookup fails, connect() says EHOSTUNREACH.
    unused = clean_lab.node("master").ipv4.rsplit(".", 1)[0] + ".250"
    config = with_host(clean_lab, tmp_path, "ghost", unused)

    report = preflight(clean_lab, "--only", "node-reachable", hosts=("ghost",), ssh_config=config)
    ghost = result(report, "node-reachable", "ghost")
    assert ghost["status"] == "error"
    assert ghost["summary"] == "ghost: no route to host: nothing answers at its address on the network"
    assert "sshd" not in ghost["fix"]


def test_a_machine_without_a_route_says_network_unreachable(clean_lab, tmp_path):
    # worker1's namespace has no default route (the lab never routes out): run preflight there.
    config = with_host(clean_lab, tmp_path, "far", "198.51.100.7")

    done = clean_lab.exec("worker1", [*CLI, "far", "--json", "--ssh-config", str(config), "--only", "node-reachable"],
                          cwd=ROOT, timeout=120)
    far = result(report_of(done, 1), "node-reachable", "far")
    assert far["summary"] == "far: network unreachable: this machine has no route to its address"


def test_master_port_22_is_sshds_and_not_a_leftover_to_kill(clean_lab):
    report = preflight(clean_lab, "--only", "master-port,stale-processes", "--master-port", "22")

    port = result(report, "master-port", "master")
    assert port["status"] == "fail"
    assert "sshd" in port["summary"] and "which is not a training process" in port["summary"]
    assert "orphan" not in port["summary"] and "ports below 1024 also need root to bind" in port["summary"]
    assert port["fix"] == "--master-port 29500   # another port for the run; 22 is sshd's, leave it running"
    # sshd is not a training process either.
    assert result(report, "stale-processes", "master")["status"] == "pass"


def test_a_python_that_is_not_a_python_says_what_it_is_over_ssh(clean_lab, tmp_path):
    script = tmp_path / "notes.txt"
    marker = tmp_path / "ran-as-a-shell-script"
    script.write_text(f"touch {marker}\n")
    script.chmod(0o755)
    cases = {
        "/bin/ls": "worker1: /bin/ls is not a Python: it ran and exited with code 2: "
                   f"/bin/ls: cannot access '{STAGE0}': No such file or directory",
        str(tmp_path): f"worker1: {tmp_path} is a folder, not a Python",
        str(script): f"worker1: {script} is a plain file (neither a binary nor a #! script), not a Python",
    }
    for python, summary in cases.items():
        report = preflight(clean_lab, "--only", "node-reachable", "--python", python, hosts=("worker1",))
        reached = result(report, "node-reachable", "worker1")
        assert (reached["status"], reached["summary"]) == ("error", summary)
        assert "chmod" not in reached["fix"]
    assert not marker.exists()          # the node's shell never ran the text file as a script
