"""Host lists from Slurm and hostfiles, and one entry per machine: what is not a usable list is
a HostListError naming the input, never an empty list, a guess or a hang."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from ddp_preflight.preflight.hosts import (
    MAX_HOSTS,
    HostfileEntry,
    HostListError,
    check_unique,
    hostfile_slots,
    read_hostfile,
    slurm_hosts,
)
from ddp_preflight.transport.slurm_hostlist import expand
from ddp_preflight.transport.slurm_job import hostnames

# --- Slurm ---------------------------------------------------------------------------------------

# What the lab's real Slurm (22.05.8) printed for each list with `scontrol show hostnames LIST`,
# or the line it said when it refused one (artifacts/slurm/record_hostnames.py): the expander
# that stands in for scontrol where Slurm cannot answer must give the same names, in the same
# order, and refuse what Slurm refuses.
RECORDED = json.loads((Path(__file__).parent / "artifacts" / "slurm" / "hostnames.json").read_text())["lists"]


@pytest.mark.parametrize("nodelist", [k for k, v in RECORDED.items() if "names" in v])
def test_slurm_lists_expand_as_scontrol_show_hostnames(nodelist):
    assert expand(nodelist) == RECORDED[nodelist]["names"]


@pytest.mark.parametrize("nodelist", [k for k, v in RECORDED.items() if "refused" in v])
def test_slurm_lists_slurm_refuses_are_refused(nodelist):
    with pytest.raises(HostListError):
        expand(nodelist)


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
    ("node[1-3]-ib", "in node[1-3]-ib, '-ib' follows the last ']': Slurm ends a host list's item with its bracket "
                     "(write the names out, or name the nodes so the number comes last)"),
])
def test_slurm_lists_that_name_no_usable_host_say_why(nodelist, reason):
    with pytest.raises(HostListError) as raised:
        expand(nodelist)
    assert str(raised.value) == reason


def _slurm_conf(folder: Path) -> Path:
    """The least configuration scontrol reads before it expands a list (no daemon is asked)."""
    conf = folder / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    return conf


def test_where_slurm_answers_its_own_expansion_is_used_and_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(_slurm_conf(tmp_path)))
    for nodelist in ("a[1-2]b[1-2]c[1-2]", "node[01-03,07],gpu5"):
        assert hostnames(nodelist) == RECORDED[nodelist]["names"]
    # Slurm refuses it (exit 0, nothing printed): the refusal says why, never an empty list.
    with pytest.raises(HostListError, match="'x' follows the last"):
        hostnames("n[1-2]x")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))     # scontrol cannot read its config
    assert hostnames("a[1-2]b[1-2]c[1-2]") == RECORDED["a[1-2]b[1-2]c[1-2]"]["names"]


def test_a_huge_slurm_range_is_refused_without_expanding_it():
    started = time.monotonic()
    with pytest.raises(HostListError, match=f"it lists 99999999 hosts, more than the {MAX_HOSTS}"):
        expand("node[1-99999999]")
    with pytest.raises(HostListError, match="it lists 10000000000 hosts"):
        expand("rack[1-100000]-n[1-100000]")
    assert time.monotonic() - started < 1.0        # counted, not expanded
    assert len(expand(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS


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


def test_different_slots_per_host_are_each_hosts_own_ranks_as_deepspeed_allows():
    # Issue 39: DeepSpeed takes `host1 slots=4` and `host2 slots=2`; they were refused here.
    entries = [HostfileEntry("master", 4), HostfileEntry("worker1", 2), HostfileEntry("worker2", 1)]
    assert hostfile_slots(entries, "hosts.txt") == (4, {"master": 4, "worker1": 2, "worker2": 1})


def test_slots_on_some_hosts_only_are_refused_naming_the_hosts_without(tmp_path):
    entries = [HostfileEntry("master", 4, 1), HostfileEntry("worker1", 2, 2), HostfileEntry("worker2", None, 3)]

    with pytest.raises(HostListError) as raised:
        hostfile_slots(entries, "hosts.txt")
    assert str(raised.value) == ("hostfile hosts.txt gives slots for some hosts but not for worker2 (line 3): give "
                                 "every host its slots=N, or pass --nproc-per-node N")


def test_one_slot_count_for_every_host_is_the_processes_per_node():
    assert hostfile_slots([HostfileEntry("master", 4), HostfileEntry("worker1", 4)], "h") == (4, {})
    assert hostfile_slots([HostfileEntry("master", None), HostfileEntry("worker1", None)], "h") == (None, {})


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
