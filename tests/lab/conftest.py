"""Fixtures shared by the lab's hangwatch tests."""

from __future__ import annotations

import pytest

from .hangjob import cmdline_of, hangwatch, start_job


@pytest.fixture
def watched(clean_lab, tmp_path):
    """Start hangwatch, then a job; stop both, and check nothing of the job is left."""
    started = []

    def run(*job_args, port, watch_args=(), **job_options):
        watch = hangwatch(clean_lab, "--incident-dir", str(tmp_path / "incidents"), *watch_args)
        job = start_job(clean_lab, *job_args, port=port, **job_options)
        started.append((watch, job))
        return watch, job

    yield run
    for watch, job in started:
        job.stop()
        watch.stop()
    for node in ("master", "worker1"):
        left = [p for p in clean_lab.processes(node) if "hang_train.py" in cmdline_of(p)]
        assert not left, f"job processes left on {node}: {left}"
