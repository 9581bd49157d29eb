"""NCCL's own words on a failure (rules/failures.py joins them to its CATALOGUE, after its own
messages, so a line they share keeps the catalogue's reading): the result code its calls return up
the stack ("NCCL INFO init.cc:1402 -> 6", a proxy's "retcode 3", "res=3"), read from NCCL's
nccl.h.in (ncclResult_t) and its INFO/WARN lines, and a CUDA call of its that failed. A paste of
NCCL's WARN and INFO lines alone is a failure with the cause its code says, whatever torch printed
or the paste cut. Pure, standard library only; every wording is in a log users pasted
(tests/unit/artifacts/pasted/index.json says where from)."""

from __future__ import annotations

from .failure_kinds import Cause, FailureKind, Message, Part, Sure, _m
from .fix import run

K, C, P = FailureKind, Cause, Part

# ncclResult_t (nccl.h): what each code returned up NCCL's stack means; 7 (in progress) is no failure
RESULT_CAUSES = {1: C.NCCL_CUDA, 2: C.NCCL_SYSTEM_ERROR, 3: C.UNKNOWN, 4: C.UNKNOWN, 5: C.NCCL_INVALID_USAGE,
                 6: C.NCCL_REMOTE}
RESULT_NAMES = {1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError", 4: "ncclInvalidArgument",
                5: "ncclInvalidUsage", 6: "ncclRemoteError"}
_CUDA = run("nvidia-smi; python -c 'import torch; print(torch.version.cuda, torch.cuda.nccl.version())'",
            note="on the node that failed: a driver older than the CUDA this torch and its NCCL were built for fails "
                 "NCCL's CUDA calls; update the driver, or use a torch built for the driver's CUDA")

NCCL_WORDS: tuple[Message, ...] = (
    _m("nccl-result-system", ("NCCL INFO", "NCCL WARN"), r"NCCL (?:INFO|WARN) \S+:\d+ -> 2\b",
       K.NCCL_ERROR, C.NCCL_SYSTEM_ERROR, P.ROOT,
       "NCCL's calls returned 2 (ncclSystemError): a system call failed, often a connect on a wrong interface",
       run("export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET", note="and rerun: NCCL names the call and interface"),
       Sure.LIKELY),
    # a CUDA call NCCL made failed (its WARN line, torch's "unhandled cuda error"); out of memory is cuda-oom's
    _m("nccl-cuda-failure", ("Cuda failure", "unhandled cuda error", "ncclUnhandledCudaError"),
       r"Cuda failure (?:\d+ )?'(?!out of memory)(?P<what>[^']*)'|unhandled cuda error|ncclUnhandledCudaError",
       K.NCCL_ERROR, C.NCCL_CUDA, P.ROOT,
       "a CUDA call NCCL made failed: usually a GPU driver older than the CUDA of this torch's NCCL, or a GPU feature "
       "(NVLS, CUMEM) the driver lacks", _CUDA, Sure.LIKELY),
    # any other code NCCL's calls returned, in its INFO trace or a proxy's WARN line
    _m("nccl-result", ("NCCL INFO", "NCCL WARN"),
       r"NCCL (?:INFO|WARN) \S+:\d+ -> (?P<code>[1-6])\b|NCCL WARN [^\n]*?(?:retcode |res=)(?P<code2>[1-6])\b",
       K.NCCL_ERROR, C.UNKNOWN, P.ROOT, "NCCL's calls returned an error code: its WARN lines say which call failed",
       run("export NCCL_DEBUG=INFO", note="and rerun: NCCL says why"), Sure.LIKELY),
)
