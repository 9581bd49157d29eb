"""ssh itself lost to the route of the machine that dials: named with the route, not a firewall."""

from __future__ import annotations

import json

from .test_preflight_lab import CLI


def test_this_machines_route_that_takes_over_the_path_to_a_node_is_named_for_ssh_with_its_fix(clean_lab):
    # Issue 38: the ssh-level form of wrong-route. Where ddp-preflight runs (here the master's
    # namespace), a second interface's host route to worker1 takes over the LAN's, so ssh itself
    # gets no answer: the route on this machine is the cause, with `ip route del`, not "a firewall
    # may drop port 22". The fix as printed, then worker1 is reached.
    clean_lab.add_fault("wrong-route@master:worker1")
    worker1 = clean_lab.node("worker1")
    subnet = worker1.ipv4.rsplit(".", 1)[0] + ".0/24"
    argv = [*CLI, "worker1", "--json", "--ssh-config", str(clean_lab.ssh_config), "--only", "node-reachable"]
    done = clean_lab.exec("master", argv, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    [result] = json.loads(done.stdout)["results"]
    assert (result["check"], result["node"], result["status"]) == ("node-reachable", "worker1", "error"), result
    assert result["summary"] == (f"worker1: nothing answers ssh at {worker1.ipv4}: this machine's route to "
                                 f"{worker1.ipv4} goes out eth1, which takes over the route of eth0, whose own "
                                 f"subnet {subnet} holds {worker1.ipv4}: its connections to worker1 go nowhere")
    fix = f"on this machine: sudo ip route del {worker1.ipv4} dev eth1   # worker1 is then reached via eth0"
    assert result["fix"] == fix
    clean_lab.exec("master", fix.removeprefix("on this machine: sudo ").split("   #")[0].split(), check=True)
    after = json.loads(clean_lab.exec("master", argv, timeout=60).stdout)
    assert [(r["node"], r["status"]) for r in after["results"]] == [("worker1", "pass")], after
