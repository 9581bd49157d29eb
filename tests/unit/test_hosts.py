"""Host lists from Slurm and hostfiles, and one entry per machine: what is not a usable list is
a HostListError naming the input, never an empty list, a guess or a hang."""

from __future__ import annotations

import random
import time

import pytest

from preflight.hosts import (
    MAX_HOSTS,
    HostfileEntry,
    HostListError,
    check_unique,
    expand_slurm,
    hostfile_slots,
    read_hostfile,
    slurm_hosts,
)

# --- Slurm ---------------------------------------------------------------------------------------

# What `scontrol show hostnames LIST` prints for each list, from Slurm's hostlist rules: items
# split at commas outside brackets, a range keeps the width of its low end (zero padding), and
# with several bracket groups the last one varies fastest.
SCONTROL = {
    "node[01-03,07],gpu5": ["node01", "node02", "node03", "node07", "gpu5"],
    "n[01-10]": ["n01", "n02", "n03", "n04", "n05", "n06", "n07", "n08", "n09", "n10"],
    "n[098-101]": ["n098", "n099", "n100", "n101"],
    "n[8-10]": ["n8", "n9", "n10"],
    "rack[1-2]-n[1-3]": ["rack1-n1", "rack1-n2", "rack1-n3", "rack2-n1", "rack2-n2", "rack2-n3"],
    "node[1-3,5]-ib": ["node1-ib", "node2-ib", "node3-ib", "node5-ib"],
    "a[9-11]-ib.lan": ["a9-ib.lan", "a10-ib.lan", "a11-ib.lan"],
    "gpu[1-2],cpu[01-02],login": ["gpu1", "gpu2", "cpu01", "cpu02", "login"],
    "tux[1,3-4],tux7": ["tux1", "tux3", "tux4", "tux7"],
    "gpu5": ["gpu5"],
}


@pytest.mark.parametrize("nodelist", SCONTROL)
def test_slurm_lists_expand_as_scontrol_show_hostnames(nodelist):
    assert expand_slurm(nodelist) == SCONTROL[nodelist]


@pytest.mark.parametrize("nodelist,reason", [
    ("node[3-1]", "in node[3-1], the range 3-1 runs backwards, so it names no host"),
    (",,,", "it lists no hosts"),
    ("", "it lists no hosts"),
    ("node[a-c]", "in node[a-c], 'a-c' is not a number or a range of numbers like 1-4"),
    ("node[]", "in node[], '' is not a number or a range of numbers like 1-4"),
    ("node[1-3", "a '[' without its ']'"),
    ("node1-3]", "a ']' without its '['"),
    ("node[1-[2]]", "a '[' inside brackets: ranges do not nest"),
    ("node[1-3];x", "host name 'node1;x' has characters that are not part of a host name (';'); "
                    "give an ssh alias, a DNS name or an address"),
])
def test_slurm_lists_that_name_no_usable_host_say_why(nodelist, reason):
    with pytest.raises(HostListError) as raised:
        expand_slurm(nodelist)
    assert str(raised.value) == reason


def test_a_huge_slurm_range_is_refused_without_expanding_it():
    started = time.monotonic()
    with pytest.raises(HostListError, match=f"it lists 99999999 hosts, more than the {MAX_HOSTS}"):
        expand_slurm("node[1-99999999]")
    with pytest.raises(HostListError, match="it lists 10000000000 hosts"):
        expand_slurm("rack[1-100000]-n[1-100000]")
    assert time.monotonic() - started < 1.0        # counted, not expanded
    assert len(expand_slurm(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS


def test_the_slurm_error_names_the_variable_and_its_value():
    with pytest.raises(HostListError) as raised:
        slurm_hosts({"SLURM_JOB_NODELIST": "node[3-1]"})
    assert str(raised.value).startswith("--slurm: SLURM_JOB_NODELIST='node[3-1]': ")
    with pytest.raises(HostListError, match=r"^--slurm: SLURM_NODELIST='': it lists no hosts$"):
        slurm_hosts({"SLURM_NODELIST": ""})
    with pytest.raises(HostListError, match="SLURM_JOB_NODELIST is not set"):
        slurm_hosts({})
    assert slurm_hosts({"SLURM_JOB_NODELIST": "n[1-2]"}) == ("SLURM_JOB_NODELIST", ["n1", "n2"])


# --- hostfiles -----------------------------------------------------------------------------------

def test_a_hostfile_of_random_bytes_is_not_a_text_file(tmp_path):
    path = tmp_path / "hostfile"
    path.write_bytes(random.Random(10).randbytes(4096))

    with pytest.raises(HostListError, match=rf"^hostfile {path} is not a text file \(byte \d+ is not text\)"):
        read_hostfile(str(path))


@pytest.mark.parametrize("line,value", [("worker1 slots=0", "0"), ("worker1 slots=-1", "-1"), ("worker1:0", "0")])
def test_hostfile_slots_below_one_name_the_line(tmp_path, line, value):
    path = tmp_path / "hostfile"
    path.write_text(f"master slots=2\n{line}\n")

    with pytest.raises(HostListError) as raised:
        read_hostfile(str(path))
    assert str(raised.value) == f"hostfile {path} line 2: slots must be a number of 1 or more, not {value!r}"


def test_a_bad_host_name_in_a_hostfile_names_the_line(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("master slots=2\nw;id slots=2\n")

    with pytest.raises(HostListError, match=f"^hostfile {path} line 2: host name 'w;id' has characters"):
        read_hostfile(str(path))


def test_different_slots_per_host_are_refused_naming_hosts_and_counts(tmp_path):
    entries = [HostfileEntry("master", 4), HostfileEntry("worker1", 2), HostfileEntry("worker2", None)]

    with pytest.raises(HostListError) as raised:
        hostfile_slots(entries, "hosts.txt")
    message = str(raised.value)
    assert message.startswith("hostfile hosts.txt gives different slots "
                              "(master slots=4, worker1 slots=2, worker2 no slots): ")
    assert "the same number of ranks on every node" in message and "\n" not in message


def test_one_slot_count_for_every_host_is_the_processes_per_node():
    assert hostfile_slots([HostfileEntry("master", 4), HostfileEntry("worker1", 4)], "h") == 4
    assert hostfile_slots([HostfileEntry("master", None), HostfileEntry("worker1", None)], "h") is None


# --- one entry per machine -------------------------------------------------------------------------

@pytest.mark.parametrize("sources,message", [
    ([("the command line", ["master", "master"])],
     "master is listed twice in the command line"),
    ([("the command line", ["root@master", "worker1", "Master"])],
     "Master is listed twice in the command line"),
    ([("the command line", ["master"]), ("hostfile hosts.txt", ["worker1", "master"])],
     "master is listed in the command line and in hostfile hosts.txt"),
    ([("hostfile h", ["n1"]), ("SLURM_JOB_NODELIST", ["n2", "n1"])],
     "n1 is listed in hostfile h and in SLURM_JOB_NODELIST"),
])
def test_a_machine_listed_twice_is_named(sources, message):
    with pytest.raises(HostListError) as raised:
        check_unique(sources)
    assert str(raised.value).startswith(message + ": two entries for one machine would start two node ranks")


def test_distinct_machines_pass():
    check_unique([("the command line", ["master", "worker1"]), ("hostfile h", ["worker2", "fd00::1"])])
