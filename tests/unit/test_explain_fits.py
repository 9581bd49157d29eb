"""A fix fits what the paste shows: never what it already did (NCCL_DEBUG=INFO on a paste of NCCL's
INFO lines), and for its launcher (no torchrun --tee for a DeepSpeed launch) and backend (no NCCL
Flight Recorder variables where no line shows NCCL)."""

from __future__ import annotations

from pathlib import Path

from ddp_preflight.explain import explain
from ddp_preflight.explain.fits import ALREADY_DEBUG, ANY_FLIGHT, DEEPSPEED_OUTPUT
from ddp_preflight.rules.failures_stopped import STOPPED_OUTSIDE

ARTIFACTS = Path(__file__).parent / "artifacts"
PASTED = ARTIFACTS / "pasted"


def fixes(path: Path) -> tuple[str | None, str | None]:
    e = explain([str(path)])
    return (e.fix.text() if e.fix else None, e.finding.fix.text() if e.finding and e.finding.fix else None)


def test_a_paste_with_ncclss_info_lines_is_not_told_to_turn_them_on():
    # NCCL's bootstrap INFO lines, then its system error: before, 'export NCCL_DEBUG=INFO ...'
    assert fixes(PASTED / "112-nccl-bootstrap-ib-link-local-connect-abort.log") == (ALREADY_DEBUG.text(),) * 2


def test_a_deepspeed_launch_is_not_told_to_use_torchrun():
    # DeepSpeed's launcher says local rank 4 exited 1: before, 'torchrun --log-dir=LOGS --tee=3 ...'
    fix, _ = fixes(PASTED / "144-deepspeed-killing-two-then-local-rank4-exit1.log")
    assert fix == DEEPSPEED_OUTPUT.text() and "torchrun" not in fix


def test_a_run_that_shows_no_nccl_gets_no_nccl_variables():
    # a Gloo run stopped by Ctrl-C (Windows, corpus 159): before, TORCH_NCCL_TRACE_BUFFER_SIZE
    fix, _ = fixes(PASTED / "159-ultralytics-windows-keyboardinterrupt-sync-buffers.log")
    assert fix == ANY_FLIGHT.text() and "NCCL" not in fix


def test_a_run_stopped_by_sigterm_gets_the_senders_record_not_a_hangs_fix():
    # a Gloo run of the lab that hung and was stopped by SIGTERM: its files show every rank's last step alike
    # and the agents' 'Received 15 death signal', no hang; the SIGTERM's sender is what they point to (issue
    # 37: it had the Ctrl-C reading and the Flight Recorder's fix; before that, TORCH_NCCL_TRACE_BUFFER_SIZE)
    fix, _ = fixes(ARTIFACTS / "explain" / "uneven")
    assert fix == STOPPED_OUTSIDE.text() and "NCCL" not in fix


def test_an_nccl_run_keeps_ncclss_own_fix():
    fix, _ = fixes(PASTED / "022-nemo-watchdog-several-process-groups.log")
    assert fix is not None and fix.startswith("export TORCH_NCCL_TRACE_BUFFER_SIZE=")


def test_a_log_with_torchruns_tee_prefixes_is_not_told_to_turn_tee_on():
    from ddp_preflight.explain.fits import KEEP_OUTPUT, TEED_OUTPUT, fit
    from ddp_preflight.explain.gather import gather
    from ddp_preflight.explain.inputs import find
    from ddp_preflight.explain.messages import Shown
    # the lab's launch (torchrun --tee=3): its rank lines start "[default0]:"
    shown = gather(find([str(ARTIFACTS / "explain" / "uneven" / "master.log")])).messages.shown
    assert Shown.TEE in shown and Shown.DEEPSPEED not in shown
    assert fit(KEEP_OUTPUT, shown) == TEED_OUTPUT and fit(KEEP_OUTPUT, set()) == KEEP_OUTPUT
