"""ddp_preflight/node/tcp_info.py on real TCP connections over loopback: what the kernel counts of a process's
own sockets (TCP_INFO), read from its descriptors as the bandwidth job's ranks read Gloo's."""

from __future__ import annotations

import socket
import threading
import time

from ddp_preflight.node import tcp_info


def _pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server


def test_the_bytes_a_connection_sent_between_two_readings_are_counted_to_the_byte():
    client, server = _pair()
    received = []

    def read(wanted=3_000_000):
        got = 0
        while got < wanted:
            chunk = server.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        received.append(got)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        started = time.monotonic()
        before = tcp_info.connections()
        mine = before[client.fileno()]
        assert (mine.local, mine.peer, mine.retrans) == ("127.0.0.1", "127.0.0.1", 0)
        client.sendall(b"x" * 3_000_000)
        reader.join(10)            # all read: every byte was sent on the wire, none is still queued
        after = tcp_info.connections()
        moved = tcp_info.moved(before, after)
        # Both ends are this process's: the client sent 3 MB, the server nothing, and nothing was
        # lost. Re-sent bytes may be there: on a loaded box an ACK can come after the tail-loss
        # probe's timer and the kernel sends the tail again (14,875 and 95,232 B seen here), which
        # the peer reports as a duplicate (D-SACK): not loss, and `lost` says so. The kernel's
        # bytes sent (tcpi_bytes_sent) count those again: less its bytes re-sent, the 3 MB exactly.
        assert [(m["local"], m["peer"], m["sent"] - m["retrans"], m["lost"]) for m in moved] == [
            ("127.0.0.1", "127.0.0.1", 3_000_000, 0)]
        assert moved[0]["rtt_us"] > 0 and moved[0]["segs"] >= 3_000_000 // 65_536
        # No longer than the whole transfer took. The kernel counts busy time in its clock's ticks
        # (jiffies), so a transfer over loopback shorter than one tick reads 0 (bandwidth_seen.rate
        # then says None, never a rate), and one longer than part of a tick reads the whole tick:
        # at most one tick (10 ms at the coarsest kernel clock, 100 Hz) over the transfer's time.
        assert 0 <= moved[0]["busy_us"] <= (time.monotonic() - started) * 1e6 + 10_000
    finally:
        client.close()
        server.close()
    assert received == [3_000_000]


def test_a_listening_socket_and_a_closed_one_are_not_connections():
    listener = socket.create_server(("127.0.0.1", 0))
    client, server = _pair()
    try:
        found = tcp_info.connections()
        assert listener.fileno() not in found
        assert {client.fileno(), server.fileno()} <= set(found)
        fd = client.fileno()
        client.close()
        assert fd not in tcp_info.connections()
    finally:
        listener.close()
        server.close()


def test_a_descriptor_reused_by_another_connection_counts_from_nothing():
    before = {7: tcp_info.Connection("10.0.0.1", "10.0.0.2", 5_000, 10, 100, 5, 1, 0)}
    after = {7: tcp_info.Connection("10.0.0.1", "10.0.0.3", 2_000, 0, 120, 2, 0, 0, delivered=2)}
    assert tcp_info.moved(before, after) == [{"local": "10.0.0.1", "peer": "10.0.0.3", "sent": 2_000,
                                               "retrans": 0, "rtt_us": 120, "segs": 2, "lost": 0, "busy_us": 0,
                                               "undelivered": 0}]


def test_segments_sent_again_that_the_peer_saw_twice_are_not_lost():
    # As a busy box's loopback pair measured it: 42 segments sent again, 42 reported as duplicates.
    before = {3: tcp_info.Connection("127.0.0.1", "127.0.0.1", 0, 0, 180, 0, 0, 0)}
    after = {3: tcp_info.Connection("127.0.0.1", "127.0.0.1", 610_882_188, 2_361_260, 182, 11_469, 42, 42)}
    [pair] = tcp_info.moved(before, after)
    assert (pair["segs"], pair["lost"], pair["retrans"]) == (11_469, 0, 2_361_260)


def test_segments_never_acknowledged_and_never_counted_as_resent_are_undelivered():
    # As the 3-node lab's worker2 -> worker1 link measured it with 5% of what worker2 sends dropped by
    # its own output rules: 265360 segments sent, 2 resends counted; the peer acknowledged 251840.
    before = {4: tcp_info.Connection("10.0.0.12", "10.0.0.11", 0, 0, 1791, 0, 0, 0)}
    after = {4: tcp_info.Connection("10.0.0.12", "10.0.0.11", 383_656_784, 2_588, 1791, 265_360, 2, 1,
                                    busy_us=1_480_000, delivered=251_840)}
    [pair] = tcp_info.moved(before, after)
    assert (pair["lost"], pair["undelivered"], pair["busy_us"]) == (1, 13_519, 1_480_000)


def test_segments_still_in_flight_at_the_second_reading_are_not_undelivered():
    # As a 3-node lab's worker2 (shaped to 20 Mbit/s, a 100 ms queue) measured it under load: the
    # all_reduce returned while its last segments were still queued on the way, their ACKs not back.
    # 40 were in flight at the first reading (delivered in between), 170 at the second: none lost.
    before = {5: tcp_info.Connection("10.0.0.13", "10.0.0.11", 0, 0, 59_000, 0, 0, 0, unacked=40)}
    after = {5: tcp_info.Connection("10.0.0.13", "10.0.0.11", 2_900_000, 0, 59_278, 2_000, 0, 0,
                                    delivered=1_870, unacked=170)}
    [pair] = tcp_info.moved(before, after)
    assert (pair["lost"], pair["undelivered"]) == (0, 0)
