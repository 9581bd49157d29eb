import os
import secrets

import pytest


@pytest.hookimpl(tryfirst=True)      # before xdist's, which reads the group marker
def pytest_collection_modifyitems(config, items):
    # Lab tests are marked by folder, so a test cannot forget the marker. With `-n 2 --dist
    # loadgroup` (make test) they run one after another in one group, on one worker and one lab,
    # while the other worker runs the unit tests. Not two labs at once: the lab's nodes share this
    # machine's /tmp, and a test that checks a stopped run left no folder there would see the
    # other lab's live runs' folders.
    for item in items:
        if "/tests/lab/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)
            item.add_marker(pytest.mark.xdist_group("lab"))


@pytest.fixture(scope="session")
def lab_name():
    return "t" + secrets.token_hex(3)


@pytest.fixture(scope="session")
def lab(lab_name):
    """A 2-node lab shared by the lab tests; each test leaves it without faults."""
    from lab import Lab, LabError

    if os.geteuid() != 0:
        pytest.fail("lab tests need root (network namespaces, sshd); run them as root, "
                    "or deselect them with -m 'not lab'")
    try:
        lab, _ = Lab.up(lab_name, nodes=2)
    except LabError as exc:
        pytest.fail(f"the lab did not come up: {exc}")
    yield lab
    Lab.down(lab_name)


@pytest.fixture
def clean_lab(lab):
    yield lab
    lab.clear_faults()
