"""One vocabulary for failures (issue 35): what a failure's own words name (hangwatch/failures.py's
said_by, read live by the watcher and the launcher, and by explain) is said in the catalogue's
terms (rules/failure_kinds.py: FailureKind, and Cause where one kind has several), the same kind the
catalogue's own message gives those words. Read from recorded runs (tests/unit/artifacts/logs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_preflight.hangwatch import failures
from ddp_preflight.hangwatch.tracebacks import exceptions_by_writer
from ddp_preflight.rules.failure_kinds import Cause, FailureKind
from ddp_preflight.rules.failures import BY_ID

LOGS = Path(__file__).parent / "artifacts" / "logs"
# (a recorded run's log, the catalogue's message id that reads its rank's failure)
LOGGED = [("size/master.log", "gloo-size-mismatch"), ("vpn-ipv6/master.log", "address-family"),
          ("nccl-h100/two-ranks-one-gpu.log", "duplicate-gpu")]


@pytest.mark.parametrize("log, id", LOGGED)
def test_what_a_failures_words_name_is_the_catalogues_kind_of_them(log, id):
    found = exceptions_by_writer((LOGS / log).read_text().splitlines()).values()
    info, said = next((i, s) for i in found if (s := failures.said_by(i.type, i.message)) is not None)
    assert said is not None and BY_ID[id].pattern.search(f"{info.type}: {info.message}")
    assert isinstance(said.failure, FailureKind) and said.failure is BY_ID[id].kind
    if said.failure is FailureKind.NCCL_ERROR:
        assert said.cause is BY_ID[id].cause is Cause.DUPLICATE_GPU


def test_the_older_names_are_the_same_members_not_more_kinds():
    assert failures.Failure is FailureKind
    assert FailureKind.OOM_KILLED is FailureKind.OOM_HOST and FailureKind.RENDEZVOUS_TIMEOUT is FailureKind.STORE_TIMEOUT
    assert "oom-killed" not in {k.value for k in FailureKind}
