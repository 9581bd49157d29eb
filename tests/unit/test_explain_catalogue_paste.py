"""The catalogue's messages that pastes showed explain silent on, each read from a real line (the
thread it came from is named; NCCL's socket warning is its source's own format, socket.h's
WARN("Socket creation failed : %s", strerror(errno))), with its cause and a fix for that cause."""

from __future__ import annotations

import pytest

from ddp_preflight.rules import failures

LINES = [
    # NVIDIA/nccl#1405
    ("kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
     "10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv)", "nccl-ib-completion",
     failures.Cause.IB_COMPLETION, {"peer": "10.216.210.236<54862>", "code": "12"}),
    # NVIDIA/nccl#928 (the older wording)
    ("H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
     "fe80::966d:ae03:8b:df78%ib0<53249> with error 4, opcode 32564, len 32564, vendor err 81 (Send)",
     "nccl-ib-completion", failures.Cause.IB_COMPLETION, {"peer": "fe80::966d:ae03:8b:df78%ib0<53249>", "code": "4"}),
    ("node1:1:2 [0] include/socket.h:344 NCCL WARN Socket creation failed : Address family not supported by protocol",
     "nccl-socket-family", failures.Cause.NCCL_FAMILY, {}),
    # older Gloo's wording of a pair's two families (as quoted in pytorch/gloo#268)
    ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:210] address family mismatch",
     "gloo-family-mismatch", failures.Cause.IPV4_IPV6, {}),
    # sehoffmann/dmlcloud#47
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.h:301] Connect "
     "timeout [none]", "gloo-connect", failures.Cause.PEER_UNREACHABLE, {}),
    # gpustack/gpustack#2125
    ("[rank1]:[E528 08:52:46.164295950 ProcessGroupGloo.cpp:145] Gloo connectFullMesh failed with "
     "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] no error", "gloo-connect",
     failures.Cause.PEER_UNREACHABLE, {}),
    # jaywalnut310/vits#202 (Windows)
    ("RuntimeError: Distributed package doesn't have NCCL built in", "nccl-not-built", failures.Cause.NCCL_NOT_BUILT, {}),
    # Lightning-AI/pytorch-lightning#19598 (a forked worker that used CUDA)
    ("RuntimeError: DataLoader worker (pid 246611) is killed by signal: Aborted.", "dataloader-abort",
     failures.Cause.ABORT, {}),
    # skycrapers/TecoGAN-PyTorch#31
    ("main.py: error: unrecognized arguments: --local-rank=0", "local-rank-option", failures.Cause.LOCAL_RANK_OPTION, {}),
    # karpathy/nanoGPT#281 (train.py on a CPU build), facebookresearch/detectron2#460 (its _check_driver)
    ("AssertionError: Torch not compiled with CUDA enabled", "no-cuda", failures.Cause.NO_CUDA, {}),
    # recorded here: nanoGPT's train.py:89 torch.cuda.set_device on torch 2.13.0+cpu (explain/nanogpt-cpu)
    ("[rank1]: AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'", "no-cuda",
     failures.Cause.NO_CUDA, {}),
    # a CUDA build on a node without a GPU, and without a driver (torch/cuda/__init__.py's own words)
    ("RuntimeError: No CUDA GPUs are available", "no-cuda", failures.Cause.NO_CUDA, {}),
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
     "driver", "no-cuda", failures.Cause.NO_CUDA, {}),
]


@pytest.mark.parametrize("line,id,cause,groups", LINES, ids=[line[1] + str(i) for i, line in enumerate(LINES)])
def test_a_message_pastes_showed_is_catalogued_with_its_cause_and_fix(line, id, cause, groups):
    [found] = [f for f in failures.find(line) if f.message.part is failures.Part.ROOT]
    assert (found.message.id, found.message.cause, found.groups) == (id, cause, groups)
    assert found.message.fix is not None


def test_a_fix_fits_the_backend_its_message_is_of():
    gloo, nccl = failures.BY_ID["gloo-connect"].fix, failures.BY_ID["nccl-connect"].fix
    assert gloo is not None and nccl is not None
    assert "NCCL" not in gloo.text() and "GLOO" in gloo.text()
    assert "GLOO" not in nccl.text() and "NCCL_SOCKET_IFNAME" in nccl.text()


def test_a_user_script_error_is_not_a_local_rank_option_error():
    assert failures.find("train.py: error: unrecognized arguments: --batch-size=4") == []


def test_deepspeeds_killing_lines_alone_are_a_failure_of_a_rank_nobody_named():
    # DeepSpeed's launcher, its lines only (deepspeedai/DeepSpeed#1581): a failure, no culprit, no torchrun fix
    [found] = failures.find("[2021-11-21 08:32:07,148] [INFO] [launch.py:131:sigkill_handler] Killing subprocess 250621")
    assert (found.message.id, found.message.part, found.groups) == ("launcher-killing", failures.Part.VICTIM,
                                                                     {"pid": "250621"})
    assert found.message.fix is not None and "torchrun" not in found.message.fix.text()
