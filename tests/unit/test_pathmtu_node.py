"""The path-MTU node program on this machine's loopback, as the master starts it (supervised node
programs): the echo answers only its token, the probe finds the route's full size in one round."""

from __future__ import annotations

import os
import socket
import sys
import time

from ddp_preflight.node import pathmtu, protocol
from ddp_preflight.transport import LocalNode


def test_the_probe_finds_loopbacks_full_size_in_one_round_and_the_echo_answers_only_its_token():
    node, token = LocalNode("here", sys.executable), os.urandom(16).hex()
    ready: list[dict] = []
    echo = node.job({"program": "pathmtu", "mode": "echo", "address": "127.0.0.1", "interface": "lo",
                     "token": token, "duration": 30}, timeout=40,
                    on_line=lambda line: ready.extend([protocol.parse(line, protocol.READY)]
                                                      if line.startswith(protocol.READY) else []))
    try:
        deadline = time.monotonic() + 20
        while not ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready, "the echo never came up"
        port, mtu = ready[0]["port"], ready[0]["mtu"]
        assert mtu == int(open("/sys/class/net/lo/mtu").read())
        stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stranger.settimeout(0.5)
        stranger.sendto(b"x" * 64, ("127.0.0.1", port))         # not the token: never answered
        try:
            answer = stranger.recv(64)
        except socket.timeout:
            answer = None
        stranger.close()
        assert answer is None
        probe = node.job({"program": "pathmtu", "mode": "probe", "address": "127.0.0.1", "interface": "lo",
                          "token": token, "timeout": 5,
                          "targets": [{"dst": "here", "address": "127.0.0.1", "port": port}]}, timeout=30)
        [result] = probe.wait(30).json_lines(protocol.RESULT)
    finally:
        echo.stop()
    [pair] = result["pairs"]
    # The route's MTU is lo's (65536, and an IP packet holds 65535 at most); its full size passes
    # with don't-fragment set, and the first round says so.
    full = min(mtu, 65535)
    assert (pair["outcome"], pair["route_mtu"], pair["passed"], pair["lost"], pair["rounds"], pair["sent"]) == \
        ("fits", full, full, None, 1, 2)
    stats = echo.wait(20).json_lines(protocol.RESULT)[-1]
    assert stats == {"answered": 2, "rejected": 1}


def test_sizes_spread_between_the_largest_answered_and_the_smallest_lost():
    assert pathmtu.spread(1500, 9001, 8) == [2333, 3166, 4000, 4833, 5667, 6500, 7334, 8167]
    assert pathmtu.spread(1500, 1504, 8) == [1501, 1502, 1503]
    assert pathmtu.spread(1500, 1501, 8) == []
