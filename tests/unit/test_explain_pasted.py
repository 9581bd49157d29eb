"""explain on the logs users really paste (tests/unit/artifacts/pasted/: logs from public issue
threads, index.json: where each came from and the verdict the log itself supports). Every log it
gets right is asserted exactly (kind, culprits, certainty, cause); the rest are listed below as
known misses, each with why, and asserted to stay wrong: a log that becomes right must move out of
the list, so the figure only goes up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_preflight.explain import explain
from ddp_preflight.explain.render import as_json, as_text
from ddp_preflight.hangwatch.prefixes import Line, normalize

ROOT = Path(__file__).parents[2]
PASTED = Path(__file__).parent / "artifacts" / "pasted"
INDEX = json.loads((PASTED / "index.json").read_text())

KNOWN_MISSES = {
    "048-nccl-remote-error-ib-reset.log": "certain in the corpus, likely here: ncclRemoteError is a victim's word, "
                                          "and 049-052 say the same words with likely",
    "071-metaseq-store-barrier-2048-ranks.log": "certain in the corpus, likely here: the same store-barrier line is "
                                                "likely in 073 and 074",
    "083-pytorch-elastic-killed-peer-nccl-remote-error.log": "certain in the corpus, likely here (as 048)",
    "110-aws-srun-label-flattened-nccl-system-error.log": "the paste ran srun's '10: ' into the middle of one line: "
                                                          "a prefix is read at a line's start only",
    "125-pytorch-detail-barrier-mismatch-in-table.log": "likely in the corpus (the report sits in a torchrun table), "
                                                        "certain here, as every other mismatch report",
}


def answer(path: Path) -> tuple | None:
    f = explain([str(path)]).finding
    return None if f is None else (f.kind.value, list(f.culprits), f.sure.value, f.cause.value)


def expected(entry: dict) -> tuple | None:
    x = entry["expected"]
    return None if x["kind"] == "no-failure" else (x["kind"], x["culprits"], x["certainty"], x["cause"])


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_each_pasted_log_gets_the_verdict_the_log_supports(entry):
    got = answer(PASTED / entry["file"])
    if entry["file"] in KNOWN_MISSES:
        assert got != expected(entry), f"{entry['file']} is right now: move it out of KNOWN_MISSES"
    else:
        assert got == expected(entry)


def test_the_known_misses_are_logs_of_the_corpus_and_few():
    files = {e["file"] for e in INDEX}
    assert set(KNOWN_MISSES) <= files
    assert len(files) - len(KNOWN_MISSES) == 356


@pytest.mark.parametrize("raw,line", [
    # torch 2.4+'s marker and c10's glog header, after a user's own line number
    ("[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught",
     Line("[Rank 0] Watchdog caught", rank=0, time="321 02:07:08.408271257")),
    # srun --label with a host: a local rank of a node, never a global rank
    ("[gpu187:1]:torch.cuda.OutOfMemoryError: CUDA out of memory.",
     Line("torch.cuda.OutOfMemoryError: CUDA out of memory.", local_rank=1, host="gpu187")),
    ("10: torch.distributed.DistBackendError: NCCL error", Line("torch.distributed.DistBackendError: NCCL error", rank=10)),
    ("[1,2]<stderr>:KeyError: 'img_r1'", Line("KeyError: 'img_r1'", rank=2)),
    ("2024-11-20 14:37:16 [rank3]: torch.OutOfMemoryError: CUDA",
     Line("torch.OutOfMemoryError: CUDA", rank=3, time="2024-11-20 14:37:16")),
    # torchrun's launcher in its glog form (torch 2.4+) and its logging form (up to 2.1)
    ("E0325 20:57:27.620000 2606 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed "
     "(exitcode: -9) local_rank: 5 (pid: 2630)",
     Line("failed (exitcode: -9) local_rank: 5 (pid: 2630)", time="0325 20:57:27.620000")),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) local_rank: 0 (pid: 2977223)",
     Line("failed (exitcode: -11) local_rank: 0 (pid: 2977223)")),
    ("05/10/2023 23:07:45 - INFO - torch.distributed.distributed_c10d - Waiting in store based barrier",
     Line("Waiting in store based barrier", time="05/10/2023 23:07:45")),
    ("[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] exits with return code = -9",
     Line("exits with return code = -9", time="2023-04-14 13:11:27,885")),
    ("(RayWorkerWrapper pid=1978, ip=10.41.0.8) [rank9]:[W ProcessGroupGloo.cpp:721] **Warning",
     Line("Warning", rank=9, host="10.41.0.8")),
    ("stderr:   rank      : 1 (local_rank: 1)", Line("  rank      : 1 (local_rank: 1)")),
    ("> **RuntimeError: x**", Line("RuntimeError: x**")),
    # a progress bar's step counter is not an srun label, and a message keeps its words
    ("step 10: loss 2.0", Line("step 10: loss 2.0")),
])
def test_one_normalizer_reads_every_prefix_into_what_it_says(raw, line):
    assert normalize(raw) == line


def _json(path: Path) -> dict:
    return json.loads(as_json(explain([str(path)])))


@pytest.mark.parametrize("name", ["001-amvur-table-sigkill-garbled.log", "023-llamafactory-watchdog-line-numbers.log",
                                  "107-qwen3coder-timestamped-rank3-oom.log", "080-pytorch-table-all-ranks-exit1-"
                                  "same-second.log", "022-nemo-watchdog-several-process-groups.log"])
def test_no_placeholder_rank_no_dangling_summary_no_blank_or_numeric_node(name):
    data = _json(PASTED / name)
    text = json.dumps(data)
    assert "1000000000" not in text
    d = data["diagnosis"]
    if d is not None:
        assert not d["summary"].startswith("; then") and " on :" not in d["summary"]
        assert all(e["node"] != "80746" for e in d["evidence"])


def test_a_fix_is_data_and_never_what_the_log_already_had():
    # a master port in use: the fix is the catalogue's, as JSON
    assert _json(PASTED / "028-torchtune-two-runs-port-29500.log")["fix"] == \
        "ss -ltnp 'sport = :MASTER_PORT'   # stop that process, or give this run another --master-port"
    # every watchdog said Timeout(ms)=1800000: timeout=30 minutes is not offered
    data = _json(PASTED / "022-nemo-watchdog-several-process-groups.log")
    assert "minutes=30" not in json.dumps(data) and data["fix"].startswith("export TORCH_NCCL_TRACE_BUFFER_SIZE=")
    # what the log cannot show: unknown, with what to collect
    assert data["finding"]["certainty"] == "unknown" and data["finding"]["culprits"] == []


def test_watchdog_lines_of_several_process_groups_never_name_a_certain_rank():
    d = explain([str(PASTED / "022-nemo-watchdog-several-process-groups.log")]).diagnosis
    assert d is not None
    assert (d.kind.value, list(d.culprits), d.certainty.value) == ("network-stall", [], "unsure")


def test_two_ops_at_one_seqnum_are_a_mismatch_not_a_slow_link():
    d = explain([str(PASTED / "021-nccl-watchdog-broadcast-vs-allreduce.log")]).diagnosis
    assert d is not None
    assert (d.kind.value, list(d.culprits), list(d.candidates), d.reason.value) == \
        ("mismatch", [], [3, 7], "different-collective")


def test_a_rank_behind_in_its_group_is_named_likely():
    d = explain([str(PASTED / "094-torchtune-save-ckpt-rank0-two-behind.log")]).diagnosis
    assert d is not None
    assert (d.kind.value, list(d.culprits), d.certainty.value) == ("deadlock", [0], "likely")


def test_a_table_alone_on_stdin_is_a_failure_with_exit_1_and_no_blank_node():
    log = (PASTED / "002-megatron-table-sigsegv.log").read_bytes()
    run = subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", "-"], input=log, capture_output=True,  # noqa: E501
                         cwd=ROOT)
    assert run.returncode == 1
    first = run.stdout.decode().splitlines()[0]
    assert " on :" not in run.stdout.decode() and "rank 0" in first


def test_the_text_names_the_finding_when_no_verdict_is_drawn():
    text = as_text(explain([str(PASTED / "058-diffusion-planner-unused-params-quoted.log")]))
    assert text.splitlines()[0] == ("ddp-unused-parameters (certain): the model has parameters that did not take part "
                                    "in the loss, so DDP's reduction never finished [unused-parameters]")
    assert "fix: DistributedDataParallel(model, find_unused_parameters=True)" in text


TORCH_213 = Path(__file__).parent / "artifacts" / "pasted" / "torch213"
# Recorded on this box with torch 2.13.0 (torch213/record.py: a real two-rank Gloo job under torchrun)
RECORDED_213 = {
    "sigkill.log": ("signal-killed", [1], "likely", "sigkill-oom-or-scheduler"),
    "segv.log": ("crashed-segv-abort", [1], "certain", "segfault"),
    "abort.log": ("crashed-segv-abort", [1], "certain", "abort"),
    "raise.log": ("exited", [1], "certain", "python-exception"),
    "exit.log": ("exited", [1], "likely", "unknown"),
    "mismatch.log": ("collective-mismatch", [], "certain", "different-collectives"),
    "port-in-use.log": ("port-in-use", [], "certain", "master-port-in-use"),
    "store-timeout.log": ("store-timeout", [], "likely", "store-unreachable"),
}


@pytest.mark.parametrize("name", sorted(RECORDED_213))
def test_torch_2_13s_own_words_on_this_box(name):
    # 2.13 lists the ranks torchrun stopped (SIGTERM) in its table in the same second: victims, not peers
    assert answer(TORCH_213 / name) == RECORDED_213[name]


@pytest.mark.parametrize("torch_range", ["<=1.12", "1.13", "2.0-2.4", "2.5+"])
def test_every_torch_version_of_the_last_years_is_read(torch_range):
    # the wordings of each range (index.json's torch_range: old logging or glog launcher lines,
    # errno: 98 or EADDRINUSE, [PG 1 Rank 0] or [PG ID 0 PG GUID 0(default_pg) Rank 1]) are all read
    logs = [e for e in INDEX if e["torch_range"] == torch_range and e["file"] not in KNOWN_MISSES]
    assert len(logs) >= 10
    assert [e["file"] for e in logs if answer(PASTED / e["file"]) != expected(e)] == []


def test_hangwatch_reads_a_ranks_output_with_the_same_catalogue():
    # what the live watcher and a launch read of a rank's exception names the catalogue's message
    from ddp_preflight.hangwatch.tracebacks import exception_in
    found = {name: exception_in((TORCH_213 / f"{name}.log").read_text().splitlines())
             for name in ("mismatch", "port-in-use", "raise")}
    assert {name: (i.type, i.failure) for name, i in found.items() if i is not None} == {
        "mismatch": ("RuntimeError", "mismatch-report"),
        "port-in-use": ("torch.distributed.DistNetworkError", "store-port-in-use"),
        "raise": ("KeyError", None)}


def test_preflight_reads_a_probe_jobs_error_with_the_same_catalogue():
    # words preflight's own list did not hold: a store's client timeout, NCCL's system error
    from ddp_preflight.preflight.checks.causes import symptom_of
    assert symptom_of("[c10d] The client socket has timed out after 60s while trying to connect to "
                      "(10.0.0.1, 29500).") == "rendezvous"
    assert symptom_of("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
                      "device error.") == "gpu"
    assert symptom_of("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:276] "
                      "ss1.ss_family == ss2.ss_family. 2 vs 10") == "family"


def _runs(*names: str) -> list[tuple]:
    e = explain([str(PASTED / n) for n in names])
    parts = e.runs or (e,)
    return [(r.finding.kind.value, r.finding.cause.value) if r.finding else None for r in parts]


def test_several_files_of_one_run_are_one_run():
    # two pastes of one job: the same store address (127.0.0.1, 48391)
    assert _runs("015a-controlnet-tcpstore-client-timeout.log", "015b-controlnet-socket-cpp-line.log") == \
        [("store-timeout", "store-unreachable")]


def test_unrelated_logs_given_together_are_separate_runs():
    # different stores (192.0.0.1:1234 and 33.145.124.128:29500), and tables of days apart
    assert _runs("016-pytorch-rendezvous-connection-error.log", "018-pytorch-client-socket-900s-torch2.4.log") == \
        [("store-timeout", "store-unreachable"), ("store-timeout", "store-unreachable")]
    assert _runs("107-qwen3coder-timestamped-rank3-oom.log", "004-bridge-llm-table-sigabrt.log") == \
        [("oom-cuda", "cuda-oom"), ("crashed-segv-abort", "abort")]
    e = explain([str(PASTED / "080-pytorch-table-all-ranks-exit1-same-second.log"),
                 str(PASTED / "107-qwen3coder-timestamped-rank3-oom.log")])
    assert not e.ok and len(e.runs) == 2 and as_text(e).startswith("2 separate runs")
    assert [r["finding"]["culprits"] for r in json.loads(as_json(e))["runs"]] == [[], [3]]


def test_a_run_whose_gloo_peers_are_on_loopback_is_not_a_run_whose_peers_are_other_hosts():
    # 068a (the reporter: "Connection closed by peer [127.0.0.1]:10895", one machine) and 068b
    # (another user in the same thread: "Read error [192.168.70.92]:25266") name no store, world or
    # date: their Gloo peers tell them apart (a rank bound to loopback is unreachable from another host).
    e = explain([str(PASTED / "068a-rvc-gloo-connection-closed-loopback.log"),
                 str(PASTED / "068b-rvc-gloo-read-error-reset-by-peer.log")])
    assert len(e.runs) == 2 and as_text(e).startswith("2 separate runs"), as_text(e)[:400]
    assert _runs("068a-rvc-gloo-connection-closed-loopback.log", "068b-rvc-gloo-read-error-reset-by-peer.log") == \
        [("exited", "unknown"), ("exited", "unknown")]
    # Two files of one machine's run (both peers on loopback) stay one.
    assert len(explain([str(PASTED / "068a-rvc-gloo-connection-closed-loopback.log")] * 2).runs) <= 1


def test_torchruns_own_traceback_is_never_a_certain_culprit():
    # torchrun's ChildFailedError traceback above its table, read as a bare writer's exception, named
    # "the writer of ..." as the certain culprit before; the table says rank 0 was SIGKILLed
    e = explain([str(PASTED / "007-minicpmv-trimmed-glog-sigkill.log")])
    assert e.diagnosis is not None and e.finding is not None
    assert (list(e.diagnosis.culprits), e.diagnosis.certainty.value) == ([], "unsure")
    assert (e.finding.kind.value, list(e.finding.culprits)) == ("signal-killed", [0])
    assert as_text(e).startswith("signal-killed (likely): rank 0: killed by SIGKILL")


def test_a_paste_that_starts_mid_traceback_is_read_whole():
    # no "Traceback" line, no word of a failure's first line: a short input is read whole
    paste = b'  File "train.py", line 3, in <module>\n    x = batch["img"]\nKeyError: \'img\'\n'
    run = subprocess.run([sys.executable, "-m", "ddp_preflight.cli.ddp_preflight", "explain", "-"], input=paste, capture_output=True,  # noqa: E501
                         cwd=ROOT)
    assert run.returncode == 1
    assert run.stdout.decode().splitlines()[:4] == ["exited (certain): raised an exception of its own [python-exception]",
                                                    "", "the lines it rests on:", "  <stdin>:3: KeyError: 'img'"]


@pytest.mark.parametrize("words,message", [
    # c10d's Backend.hpp across versions (2.x "Backend gloo", 1.x "ProcessGroup gloo"), Gloo's own
    ("RuntimeError: Backend gloo does not support reduce_scatter", "gloo-unsupported"),
    ("RuntimeError: ProcessGroup gloo does not support alltoall", "gloo-unsupported"),
    # torch 1.x's TCPStore, socket.cpp up to 2.3 (errno: 98), 2.4+ (EADDRINUSE), Gloo's pair (ephemeral ports)
    ("RuntimeError: Address already in use", "store-port-in-use"),
    ("[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29400 (errno: 98 - Address already in use).",
     "store-port-in-use"),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: "
     "56293, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use", "store-port-in-use"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:176] bind: Address already in use", "gloo-pair-bind"),
    # the store's client, its NCCL bootstrap through the store, the elastic rendezvous
    ("[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect to 192.0.0.1:1234",
     "store-client-timeout"),
    ("torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
     "c10d key-value store by key '0', but store->get('0') got error: Socket Timeout", "nccl-id-wait"),
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
     "store-client-timeout"),
    # CUDA's and NCCL's out of memory, native crashes
    ("RuntimeError: CUDA error: out of memory", "cuda-oom"),
    ("misc/cudawrap.cc:33 NCCL WARN Cuda failure 'out of memory'", "cuda-oom"),
    ("Fatal Python error: Segmentation fault", "segfault"),
    ("Fatal Python error: Aborted", "abort"),
    ("SIGABRT(6), PID: 18613, Thread 18613: ", "fatal-signal"),
    ("terminate called without an active exception", "fatal-signal"),
    # the heartbeat monitor (torch 2.2+), NCCL's own words across versions and plugins
    ("[PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping debug info.", "nccl-timed-out"),
    ("Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.",
     "nccl-timed-out"),
    ("NET/IBP:Got completion from peer 7.6.13.83<36315> with status=12 opcode=32698 len=32696 vendor err 129 (Send)",
     "nccl-ib-completion"),
    ("[0] include/socket.h:360 WARN Call to connect failed : Connection timed out", "nccl-connect"),
    ("ncclInternalError: Internal check failed.", "nccl-error"),
    ("Net : Connection closed by remote peer node-2<50260>", "nccl-remote"),
    # the launchers: a node they could not reach, a store without libuv, stopping ranks, stopped themselves
    ("RuntimeError: Using hostfile at /h but host=gpu-11 was not reachable via ssh.", "node-ssh-unreachable"),
    ("RuntimeError: use_libuv was requested but PyTorch was build without libuv support", "libuv-not-built"),
    ("[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 270 closing "
     "signal SIGTERM", "launcher-stopping"),
    ("W0823 16:54:02.337000 1 torch/distributed/elastic/agent/server/api.py:688] Received Signals.SIGTERM death signal, "
     "shutting down workers", "stopped-from-outside"),
    # Gloo's interface lookup (GLOO_SOCKET_IFNAME) before its hostname lookup
    ("RuntimeError: [enforce fail at gloo/transport/tcp/device.cc:83] ifa != nullptr. Unable to find address for: bond1",
     "gloo-interface"),
])
def test_the_catalogue_knows_each_wording_torch_prints(words, message):
    from ddp_preflight.rules.failures import id_of
    assert id_of(words) == message


def test_json_fix_is_never_null_where_a_fix_or_what_to_collect_is_known():
    # only a rank's own exception has none to give: its traceback's line is where to look
    nulls = []
    healthy = {e["file"] for e in INDEX if e["expected"]["kind"] == "no-failure"}
    for path in sorted(PASTED.glob("*.log")) + sorted(TORCH_213.glob("*.log")):
        data = json.loads(as_json(explain([str(path)])))
        if data["finding"] is None:          # the healthy part of a run: nothing to fix
            assert path.name in healthy
            continue
        if data["fix"] is None and data["finding"]["cause"] != "python-exception":
            nulls.append(path.name)
    assert nulls == []
