"""Where a worker's name for the master came from (node/netprobe.py's hosts_line, on a real file)
and the cause it makes: a name that resolves to none of the master's addresses (issue 38)."""

from __future__ import annotations

from ddp_preflight.node.netprobe import hosts_line
from ddp_preflight.preflight.checks.name_cause import name_cause
from ddp_preflight.preflight.probes.network_seen import Dial, MasterListener

from .test_checks_ports import ctx_of, load

HOSTS = """127.0.0.1\tlocalhost
# 10.213.0.200 master   (a comment names nothing)
10.213.0.250\tmaster mh
10.213.0.200\tMaster
"""


def test_the_line_that_maps_the_name_to_what_it_resolved_to_is_found_else_the_first_that_names_it(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(HOSTS)
    assert hosts_line("master", "10.213.0.250", str(path)) == {"line": 3, "text": "10.213.0.250\tmaster mh"}
    assert hosts_line("master", "10.213.0.200", str(path)) == {"line": 4, "text": "10.213.0.200\tMaster"}
    assert hosts_line("mh", "10.9.9.9", str(path)) == {"line": 3, "text": "10.213.0.250\tmaster mh"}
    assert hosts_line("worker1", "10.213.0.11", str(path)) is None
    assert hosts_line("master", "10.213.0.200", str(tmp_path / "absent")) is None


def _dial(resolved: str, line: dict | None) -> Dial:
    sent = {"src": "worker1", "dst": "master", "port": 29500, "kind": "master", "outcome": "filtered",
            "address": "master", "resolved": resolved, "hosts_line": line}
    return Dial.from_json(sent)


def test_a_name_resolved_to_none_of_the_masters_addresses_is_the_cause_with_the_line_to_change():
    master = ctx_of(load("lab_probe_clean")).master      # recorded facts: 10.213.0.200 on eth0
    listener = MasterListener("master", 29500, None, "10.213.0.200")
    cause = name_cause(master, listener, _dial("10.213.0.250", {"line": 3, "text": "10.213.0.250\tmaster"}))
    assert cause is not None
    assert cause.why == ("the name master resolves on worker1 to 10.213.0.250 (/etc/hosts line 3: "
                         "`10.213.0.250\tmaster`), which is none of the master's addresses (it listens at 10.213.0.200)")
    assert cause.fix.text() == ("on worker1: sudo sh -c 'h=$(sed \"3s/^[^[:space:]]*/10.213.0.200/\" /etc/hosts) && "
                                "printf \"%s\\n\" \"$h\" > /etc/hosts'   # line 3 of worker1's /etc/hosts then maps "
                                "master to 10.213.0.200, the master's address")
    dns = name_cause(master, listener, _dial("10.213.0.250", None))
    assert dns is not None and "(not from /etc/hosts: DNS" in dns.why
    assert dns.fix.text().startswith("on worker1: echo '10.213.0.200 master' | sudo tee -a /etc/hosts   #")


def test_a_name_that_resolves_to_one_of_the_masters_own_addresses_is_not_stale():
    master = ctx_of(load("lab_probe_clean")).master
    listener = MasterListener("master", 29500, None, "10.213.0.200")
    own = [a.address for i in master.parsed.network.interfaces for a in i.addresses if a.address != "10.213.0.200"]
    assert own
    assert name_cause(master, listener, _dial(own[0], None)) is None
    assert name_cause(master, listener, _dial("10.213.0.200", None)) is None
