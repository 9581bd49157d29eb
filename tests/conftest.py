import os
import secrets
import time

import pytest


@pytest.hookimpl(tryfirst=True)      # before xdist's, which reads the group marker
def pytest_collection_modifyitems(config, items):
    # Lab tests are marked by folder, so a test cannot forget the marker. With `-n 2 --dist
    # loadgroup` (make test) they run in two groups, one after another within each, each group on
    # one worker and its own lab (the unit tests fill in around them). The labs share this
    # machine's /tmp: a test that checks a stopped run left no folder there leaves out the folders
    # a live process still uses (test_node_safety.py). Slurm's tests share one group (one Slurm).
    for item in items:
        path = str(item.fspath)
        if "/tests/lab/" in path:
            item.add_marker(pytest.mark.lab)
            group = "lab2" if os.path.basename(path) in SECOND_LAB else "lab"
            item.add_marker(pytest.mark.xdist_group(group))


# The lab tests the second lab runs: about half of the lab's time (the watcher's tests, the
# preflight's, the dashboard's), the rest (launch, Slurm, the lab's own, the hostile user's) in the first.
SECOND_LAB = {"test_hangwatch_lab.py", "test_hangwatch_real_programs.py", "test_hangwatch_permissions.py",
              "test_preflight_lab.py", "test_probes_network.py", "test_dashboard_tmux.py", "test_explain_lab.py",
              "test_path_mtu_lab.py", "test_hangwatch_verdicts_lab.py", "test_nanochat_lab.py"}


@pytest.fixture(scope="session")
def lab_name():
    return "t" + secrets.token_hex(3)


@pytest.fixture(scope="session")
def lab(lab_name):
    """A 2-node lab shared by the lab tests; each test leaves it without faults."""
    from ddp_preflight.lab import Lab, LabError

    if os.geteuid() != 0:
        pytest.fail("lab tests need root (network namespaces, sshd); run them as root, "
                    "or deselect them with -m 'not lab'")
    try:
        lab, _ = Lab.up(lab_name, nodes=2)
    except LabError as exc:
        pytest.fail(f"the lab did not come up: {exc}")
    lab.own_processes = {n.name: set(lab.processes(n.name)) for n in lab.nodes}     # each node's sshd
    yield lab
    Lab.down(lab_name)


QUIET_SECONDS = 30      # a test that failed midway leaves its run's remote side ending


@pytest.fixture
def clean_lab(lab):
    """The shared lab without faults, and without what an earlier test left ending on its nodes: a
    test that failed midway (its own leftover check never ran) left a rank of its run on worker1,
    still ending as the next test took its snapshot of the nodes, and that test was blamed for a
    process that went away during it. Waits for the nodes to hold only the lab's own processes."""
    deadline = time.monotonic() + QUIET_SECONDS
    while time.monotonic() < deadline and any(set(lab.processes(n.name)) - lab.own_processes[n.name]
                                              for n in lab.nodes):
        time.sleep(0.2)
    for n in lab.nodes:
        # Still there after QUIET_SECONDS: an earlier test's processes that its own stop missed.
        # Named (pytest shows it with this test's failure) and ended, so that a stale torchrun
        # agent cannot join this test's run, nor a stale rank be counted in it.
        for pid in sorted(set(lab.processes(n.name)) - lab.own_processes[n.name]):
            try:
                line = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                print(f"clean_lab: {n.name}: an earlier test left pid {pid}: {line[:300]}; killing it")
                os.kill(pid, 9)
            except (FileNotFoundError, ProcessLookupError):
                pass
    yield lab
    lab.clear_faults()
