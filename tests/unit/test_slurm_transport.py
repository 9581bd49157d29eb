"""The Slurm transport's parts that need no Slurm: scontrol's records as recorded from the lab's
real Slurm 22.05, node states, and the relay (node/relay.py) as a real local process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddp_preflight.node import relay
from ddp_preflight.transport.payload import boot_argv, stdin_payload
from ddp_preflight.transport.slurm import SlurmNodeInfo, _fields

# `scontrol show node -o worker1` on the lab's Slurm after `scontrol update nodename=worker1
# state=drain reason="bad disk here"`.
DRAINED = ("NodeName=worker1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=6.92 "
           "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.213.5.11 NodeHostName=worker1 "
           "Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 "
           "FreeMem=20302 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
           "MCS_label=N/A Partitions=lab  BootTime=2026-11-25T05:39:13 SlurmdStartTime=2026-11-25T06:11:16 "
           "LastBusyTime=2026-11-25T06:11:16 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a "
           "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
           "Reason=bad disk here [root@2026-11-25T06:11:18]")


def test_scontrol_records_split_into_fields_with_spaces_in_values():
    fields = _fields(DRAINED)
    assert (fields["NodeName"], fields["NodeAddr"], fields["State"]) == ("worker1", "10.213.5.11", "IDLE+DRAIN")
    assert fields["OS"] == "Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0"
    assert fields["Reason"] == "bad disk here [root@2026-11-25T06:11:18]"
    assert fields["AllocTRES"] == ""


@pytest.mark.parametrize("state, unusable, draining", [
    ("IDLE", None, False), ("MIXED", None, False), ("ALLOCATED", None, False), ("IDLE+DRAIN", "drained", False),
    # Drained with jobs on it (sinfo's drng): the job's steps still run there (issue 26).
    ("MIXED+DRAIN", None, True), ("ALLOCATED+DRAIN", None, True), ("COMPLETING+DRAIN", None, True),
    ("DOWN+NOT_RESPONDING", "down", False), ("IDLE+NOT_RESPONDING", "down", False),
    ("DOWN+DRAIN", "drained", False), ("FUTURE", None, False)])
def test_node_states_that_run_nothing(state, unusable, draining):
    node = SlurmNodeInfo("n", "10.0.0.1", state)
    assert (node.unusable, node.draining) == (unusable, draining)


def test_a_relay_frame_of_a_full_chunk_stays_under_sruns_message_size():
    line = relay.frame("15", 1 << 40, "out", b"\xff" * relay.CHUNK)
    assert len(line) <= relay.MAX_FRAME < 1024
    assert relay.parse(line) == ("15", 1 << 40, "out", b"\xff" * relay.CHUNK)
    assert relay.parse(relay.frame("*", 3, "eof").decode()) == ("*", 3, "eof", b"")
    assert relay.parse(b"a rank's own line\n") is None


def test_a_real_relay_runs_a_program_for_its_task_only_and_returns_its_output_and_exit():
    proc = subprocess.Popen(boot_argv(sys.executable), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"SLURM_PROCID": "1", "SLURMD_NODENAME": "worker1",
                                                         "PATH": "/usr/bin:/bin"})
    program = ["sh", "-c", "cat; echo to-stderr >&2; exit 3"]
    frames = [relay.frame("1", 7, "open", b'{"argv": %s, "boot": null}' % str(program).replace("'", '"').encode()),
              relay.frame("0", 7, "in", b"for task 0\n"),          # another node's: not this relay's
              relay.frame("*", 7, "in", b"for all\n"),
              relay.frame("1", 7, "in", b"x" * 5000),
              relay.frame("1", 7, "eof")]
    out, err = proc.communicate(stdin_payload({"program": "relay"}) + b"".join(frames), timeout=60)
    assert proc.returncode == 0, err
    said = [relay.parse(line) for line in out.split(b"\n") if line]
    assert said[0][:3] == ("1", 0, "hello") and b'"node": "worker1"' in said[0][3]
    got = {op: b"".join(d for t, c, o, d in said if c == 7 and o == op) for op in ("out", "err", "exit")}
    assert got == {"out": b"for all\n" + b"x" * 5000, "err": b"to-stderr\n", "exit": b"3"}
    assert [o for t, c, o, d in said if c == 7][-1] == "exit"
    assert all(len(line) + 1 <= relay.MAX_FRAME for line in out.split(b"\n"))
