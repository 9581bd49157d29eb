"""The node's reverse-path facts, read on this machine and checked against another reader of the
same kernel values (sysctl, iproute2's nstat)."""

from __future__ import annotations

import json
import subprocess

from ddp_preflight.node.facts.network import interfaces, rp_filter
from ddp_preflight.node.proc import reverse_path_drops


def sysctl(key: str) -> int | None:
    done = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True)
    return int(done.stdout) if done.returncode == 0 else None      # None: the interface went meanwhile


def test_each_interfaces_filter_is_the_larger_of_all_and_its_own_as_sysctl_reads_them():
    found = {i["name"]: i["rp_filter"] for i in interfaces()}
    assert "lo" in found
    every = sysctl("net.ipv4.conf.all.rp_filter")
    assert every is not None
    for name, value in found.items():
        # sysctl reads a dot as a level: eth0.10's key is eth0/10. (Other tests' labs add and
        # remove interfaces on this machine while it runs: one gone meanwhile is left out.)
        own = sysctl(f"net.ipv4.conf.{name.replace('.', '/')}.rp_filter")
        assert own is None or value == max(every, own), name
    assert rp_filter("no-such-if0") is None


def test_the_reverse_path_drops_are_the_kernels_count_as_nstat_reads_it():
    # -a: absolute values, -s: leave nstat's history alone, -z: zeros too.
    done = subprocess.run(["nstat", "-asz", "--json", "TcpExtIPReversePathFilter"], capture_output=True, text=True,
                          check=True)
    assert reverse_path_drops() == json.loads(done.stdout)["kernel"]["TcpExtIPReversePathFilter"]
