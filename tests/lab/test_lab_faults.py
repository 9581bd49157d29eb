"""Each fault changes its node for real, and clearing it restores the node."""

import json

from ddp_preflight.lab.faults import FIREWALL_SELF_TABLE, FIREWALL_TABLE, VPN_IFACE, WIFI_IFACE


def py(lab, node, code, *args, timeout=30):
    import sys
    return lab.exec(node, [sys.executable, "-c", code, *args], timeout=timeout)


def connect_outcome(lab, source, address, port, timeout=2.0):
    """'open', 'refused' or 'filtered', as seen by a real connect() from `source`."""
    code = f"""
import socket, sys
s = socket.socket(socket.AF_INET6 if ':' in {address!r} else socket.AF_INET)
s.settimeout({timeout})
try:
    s.connect(({address!r}, {port})); print('open')
except ConnectionRefusedError: print('refused')
except (TimeoutError, socket.timeout): print('filtered')
"""
    return py(lab, source, code).stdout.strip()


def listen_in(lab, node, port):
    import subprocess
    import sys
    code = (f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0',{port})); s.listen(); "
            "print('ready', flush=True); time.sleep(60)")
    proc = lab.popen(node, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_firewall_drops_new_inbound_ephemeral_connections_but_not_ssh(clean_lab):
    lab = clean_lab
    worker = lab.node("worker1")
    listener = listen_in(lab, "worker1", 40000)
    try:
        assert connect_outcome(lab, "master", worker.ipv4, 40000) == "open"
        lab.add_fault("firewall@worker1")
        rules = lab.exec("worker1", ["nft", "list", "table", "inet", FIREWALL_TABLE]).stdout
        assert "32768-60999" in rules and "drop" in rules
        assert connect_outcome(lab, "master", worker.ipv4, 40000) == "filtered"
        assert connect_outcome(lab, "master", worker.ipv4, 22) == "open"
        # Outside the ephemeral range nothing listens: refused, not dropped.
        assert connect_outcome(lab, "master", worker.ipv4, 29999) == "refused"
        # The other direction is untouched: the master has no firewall.
        assert connect_outcome(lab, "worker1", lab.node("master").ipv4, 22) == "open"
        lab.clear_faults(["firewall@worker1"])
        assert connect_outcome(lab, "master", worker.ipv4, 40000) == "open"
    finally:
        listener.kill()
        listener.wait()


def test_firewall_self_drops_the_nodes_own_connections_to_its_lan_address_and_firewall_does_not(clean_lab):
    lab = clean_lab
    worker = lab.node("worker1")
    listener = listen_in(lab, "worker1", 40000)
    try:
        lab.add_fault("firewall@worker1")      # exempts lo: a connection to its own address arrives there
        assert connect_outcome(lab, "worker1", worker.ipv4, 40000) == "open"
        lab.clear_faults(["firewall@worker1"])
        lab.add_fault("firewall-self@worker1")
        rules = lab.exec("worker1", ["nft", "list", "table", "inet", FIREWALL_SELF_TABLE]).stdout
        assert "32768-60999" in rules and "drop" in rules and '"lo"' not in rules
        assert connect_outcome(lab, "worker1", worker.ipv4, 40000) == "filtered"
        assert connect_outcome(lab, "master", worker.ipv4, 40000) == "filtered"
        assert connect_outcome(lab, "master", worker.ipv4, 22) == "open"
        lab.clear_faults(["firewall-self@worker1"])
        assert connect_outcome(lab, "worker1", worker.ipv4, 40000) == "open"
        assert lab.exec("worker1", ["nft", "list", "ruleset"]).stdout.strip() == ""
    finally:
        listener.kill()
        listener.wait()


def test_vpn_ipv6_adds_tailscale0_and_the_hostname_resolves_to_it(clean_lab):
    lab = clean_lab
    lab.add_fault("vpn-ipv6@worker1")
    links = json.loads(lab.exec("worker1", ["ip", "-j", "addr", "show", VPN_IFACE]).stdout)
    addresses = [a["local"] for a in links[0]["addr_info"]]
    assert addresses == ["fd7a:115c:a1e0::11"]          # IPv6 only
    assert lab.exec("worker1", ["getent", "hosts", "worker1"]).stdout.split()[0] == "fd7a:115c:a1e0::11"
    # Only the node's own view changes: the master still resolves worker1 to its LAN address.
    assert lab.exec("master", ["getent", "hosts", "worker1"]).stdout.split()[0] == lab.node("worker1").ipv4
    lab.clear_faults()
    assert lab.exec("worker1", ["ip", "link", "show", VPN_IFACE]).returncode != 0
    assert lab.exec("worker1", ["getent", "hosts", "worker1"]).stdout.split()[0] == lab.node("worker1").ipv4


def test_loopback_host_makes_the_hostname_resolve_to_127_0_1_1(clean_lab):
    lab = clean_lab
    lab.add_fault("loopback-host@worker1")
    assert lab.exec("worker1", ["getent", "hosts", "worker1"]).stdout.split()[0] == "127.0.1.1"
    assert lab.exec("master", ["getent", "hosts", "worker1"]).stdout.split()[0] == lab.node("worker1").ipv4
    lab.clear_faults()
    assert lab.exec("worker1", ["getent", "hosts", "worker1"]).stdout.split()[0] == lab.node("worker1").ipv4


def measure_mbit(lab, sender, receiver_ip, megabytes=3):
    """Send bytes over TCP from `sender` to a sink on the master; return Mbit/s."""
    import subprocess
    import sys
    sink = lab.popen("master", [sys.executable, "-c",
        "import socket; s=socket.socket(); s.bind(('0.0.0.0',5201)); s.listen(); print('ready',flush=True);"
        "c,_=s.accept()\nwhile c.recv(1<<16): pass"], stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "ready"
    code = f"""
import socket, time
s = socket.create_connection(({receiver_ip!r}, 5201)); chunk = b'x' * 65536
start = time.monotonic(); total = {megabytes} * 1024 * 1024; sent = 0
while sent < total: s.sendall(chunk); sent += len(chunk)
s.shutdown(socket.SHUT_WR); s.recv(1); print(sent * 8 / (time.monotonic() - start) / 1e6)
"""
    try:
        return float(py(lab, sender, code, timeout=60).stdout)
    finally:
        sink.wait(timeout=10)


def test_wifi_renames_the_link_and_shapes_it_to_the_rate(clean_lab):
    lab = clean_lab
    lab.add_fault("wifi@worker1:40mbit")
    assert lab.node("worker1").iface == WIFI_IFACE
    qdisc = lab.exec("worker1", ["tc", "qdisc", "show", "dev", WIFI_IFACE]).stdout
    assert "tbf" in qdisc and "40Mbit" in qdisc
    rate = measure_mbit(lab, "worker1", lab.node("master").ipv4)
    assert 20 < rate < 48, rate          # shaped near 40 Mbit/s (a veth alone does gigabits)
    lab.clear_faults()
    assert lab.exec("worker1", ["ip", "link", "show", "eth0"]).returncode == 0
    assert measure_mbit(lab, "worker1", lab.node("master").ipv4) > 200


def test_port_busy_holds_the_master_port_with_a_leftover_train_process(clean_lab):
    lab = clean_lab
    # SO_REUSEADDR as torch's TCPStore does: TIME_WAIT from an earlier run does not count.
    bind = ("import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
            "s.bind(('0.0.0.0', 29500)); print('free')")
    assert py(lab, "master", bind).stdout.strip() == "free"
    lab.add_fault("port-busy@master")
    held = py(lab, "master", bind)
    assert "Address already in use" in held.stderr
    listeners = lab.exec("master", ["ss", "-Hltnp", "sport", "= :29500"]).stdout
    pid = int(listeners.split("pid=")[1].split(",")[0])
    assert "train.py" in open(f"/proc/{pid}/cmdline").read()
    lab.clear_faults()
    assert py(lab, "master", bind).stdout.strip() == "free"


def shard_digests(lab, node):
    code = """
import hashlib, json, os, sys
d = sys.argv[1]
print(json.dumps({n: hashlib.sha256(open(os.path.join(d, n), 'rb').read()).hexdigest()
                  for n in sorted(os.listdir(d))}))
"""
    return json.loads(py(lab, node, code, str(lab.state.data_dir)).stdout)


def test_shards_gives_the_node_fewer_and_different_shards(clean_lab):
    lab = clean_lab
    master = shard_digests(lab, "master")
    assert len(master) == 8 and shard_digests(lab, "worker1") == master
    lab.add_fault("shards@worker1")
    worker = shard_digests(lab, "worker1")
    assert set(worker) < set(master) and len(worker) == 4
    changed = [name for name in worker if worker[name] != master[name]]
    assert changed == ["shard_00000.parquet"]
    lab.clear_faults()
    assert shard_digests(lab, "worker1") == master


def test_shards_are_real_parquet_when_pyarrow_is_installed(clean_lab):
    import pyarrow.parquet as pq  # the test environment has it (the `lab` extra); the lab works without it
    table = pq.read_table(clean_lab.state.path / "dataset" / "shard_00000.parquet")
    assert table.column_names == ["text"] and table.num_rows == 2000
