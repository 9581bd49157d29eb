"""`hangwatch attach --pid`: a process on any watched host, by HOST:PID (ddp_preflight/cli/hangwatch.py)."""

from __future__ import annotations

import pytest

from ddp_preflight.cli.hangwatch import UsageError, given_pids


def test_pids_go_to_the_host_they_name_and_a_bare_pid_to_the_first():
    hosts = ["master", "worker1", "fd64:6470:213:1::11"]
    assert given_pids(["worker1:4242", "17", "[fd64:6470:213:1::11]:9", "worker1:5"], hosts) == \
        {"worker1": (4242, 5), "master": (17,), "fd64:6470:213:1::11": (9,)}
    assert given_pids(["localhost:8"], ["box"], aliases=("localhost",)) == {"box": (8,)}


@pytest.mark.parametrize("value,why", [
    ("worker2:4242", "--pid 'worker2:4242': worker2 is not a watched host (watched: master, worker1)"),
    ("worker1:x", "--pid 'worker1:x': give PID or HOST:PID, PID a process id"),
    ("0", "--pid '0': give PID or HOST:PID, PID a process id"),
])
def test_a_pid_of_a_host_not_watched_or_not_a_pid_is_one_line(value, why):
    with pytest.raises(UsageError) as refused:
        given_pids([value], ["master", "worker1"])
    assert str(refused.value) == why
