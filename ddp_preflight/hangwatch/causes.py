"""The likely causes behind each reason a verdict gives, each with what fixes it: one catalogue,
for hangwatch's verdicts (and `explain`'s). A verdict offers only the causes of the reason its
evidence showed. A cause is data (model.Cause): its words, and its fixes as ddp_preflight.rules.fix.Fix values
(what to run or change, on which node); words.cause_line() renders them at the edge."""

from __future__ import annotations

from ddp_preflight.rules.fix import Action, Fix, change, run

from .model import Cause, Reason


def _alternatives(*words: str) -> tuple[Fix, ...]:
    """Fixes any one of which is enough: said as "a, b, or c"."""
    return tuple(change(w) for w in words)


UNEVEN_DATA = Cause("uneven data across ranks: one rank ran out of batches and left the loop", _alternatives(
    "equal shards per rank (ddp-preflight's data-shards)", "a DistributedSampler with drop_last=True",
    "DDP's Join context manager (torch.distributed.algorithms.Join)",
    "one all_reduce per step of 'do I still have data'"))
RANK_DEPENDENT = Cause("rank-dependent code: an `if rank == ...` around a collective, or a different number of steps "
                       "per rank")


# A rank alone in a barrier while the others call another collective: the end of its loop, the
# shape uneven data really takes (it ran out of batches first and reached its final barrier).
END_OF_ITS_DATA = Cause("it waits in a barrier the others have not reached: most often the one after its loop, "
                        "reached first because it ran out of batches first (uneven data across ranks)",
                        UNEVEN_DATA.fixes)


def _then_uneven(what: str) -> Cause:
    """A cause whose usual root is uneven data: its words, then uneven data's, with its fixes."""
    return Cause(f"{what}. {UNEVEN_DATA.what}", UNEVEN_DATA.fixes)


CAUSES: dict[Reason, tuple[Cause, ...]] = {
    # how a rank ended
    Reason.RAISED: (Cause("its exception, at the line shown (its traceback is in its output: ddp-preflight --launch "
                          "keeps a log per node); the other ranks lost their peer or were stopped by torchrun"),),
    Reason.EXIT_CODE: (Cause("it called sys.exit (or os._exit) with that code: its output says why; the other ranks "
                             "lost their peer or were stopped by torchrun"),),
    Reason.KILLED: (Cause("something killed it: a user, a script, a scheduler (SIGKILL), or a crash in native code "
                          "(SIGSEGV, SIGBUS): see the node's kernel log (dmesg) and its output"),),
    Reason.OOM_KILLED: (Cause("the node ran out of memory and the kernel's OOM killer chose it (dmesg: 'Out of memory: "
                              "Killed process')", _alternatives("a smaller batch", "fewer DataLoader workers",
                                                                 "more memory")),),
    Reason.LEFT_FIRST: (_then_uneven("it left the loop early and exited while the others still trained: their next "
                                     "collective found it gone"), RANK_DEPENDENT),
    Reason.LEAVING: (_then_uneven("it left early (an exception, sys.exit, or the end of its loop: its output says "
                                  "which); its peers lost it"),),
    Reason.FAILED: (Cause("its own error or a lost peer: its exit code alone cannot tell. Its output says which; "
                          "ddp-preflight --launch keeps a log per node and records how each rank ended"),),
    Reason.LOST_PEER: (Cause("no rank ended before it: its peer's node or the link went away (a reboot, a network "
                             "outage, a firewall change), or a rank that nobody watches ended"),),
    # where a live rank is stuck
    Reason.LEFT_LOOP: (UNEVEN_DATA, RANK_DEPENDENT),
    Reason.SLEEPS: (Cause("it sleeps inside its code, outside any collective (time.sleep, at the line shown): a wait "
                          "for a file or a condition that never comes, a retry loop's back-off, a rate limiter, a "
                          "debugging pause left in; the others wait in their collective for it"),),
    Reason.WAITS_TO_RECEIVE: (Cause("it waits to receive from a connection outside any collective (the address "
                                    "shown: a data or parameter server, an HTTP API, a database; or a pipe: a "
                                    "subprocess's output) that does not answer: that service, and the line "
                                    "above; or its stdin: input() or sys.stdin.readline(), which under torchrun "
                                    "nobody answers"),),
    Reason.WAITS_ON_LOCK: (Cause("a lock, an event or a queue that another thread or process never releases: its "
                                 "line above; a thread of its own that died holding it"),),
    Reason.WAITS_FOR_DATA: (Cause("a DataLoader worker that hangs: a dataset's __getitem__ that blocks (a network file "
                                  "system, a lock taken before fork, a subprocess), or a worker killed (dmesg)",
                                  (Fix(Action.CHANGE, ("find the worker with `py-spy dump --pid WORKER`",
                                                       "num_workers=0 to see it in the rank itself")),)),),
    Reason.WAITS_ON_IO: (Cause("a disk or a network file system that does not answer: see the node's kernel log "
                               "(dmesg: 'task blocked for more than 120 seconds') and the mount (NFS, FUSE)"),),
    Reason.STOPPED: (Cause("a SIGSTOP (Ctrl-Z in its terminal, a job scheduler's suspend) or a debugger holding it",
                           (run("kill -CONT PID"), change("detach the debugger"))),),
    Reason.COMPUTES_FOREVER: (Cause("a loop that never ends: a data loader that cycles forever (too few shards on "
                                    "that node: ddp-preflight's data-shards), a retry loop, a while loop whose "
                                    "condition never changes"),
                              Cause("far more work on this rank than on the others (uneven data)")),
    Reason.WAITS_ON_GPU: (Cause("an NCCL collective's kernel waits for a peer that never sends (a rank that left, a "
                                "mismatched collective on another node, a dead link): NCCL's kernels spin on the GPU"),
                          Cause("a kernel of the training's own that never ends (a loop on the device)")),
    Reason.DIFFERENT_COLLECTIVE: (Cause("rank-dependent code: a collective only some ranks call (`if rank == 0: "
                                        "...`), or a different number of collectives per rank"),
                                  Cause("ranks disagree on a branch: compare the code and data across nodes "
                                        "(ddp-preflight code-parity and data-shards)")),
    Reason.BEHIND: (Cause("it called fewer collectives than the others: a collective behind a rank-dependent "
                          f"condition, or uneven data (one rank ran out of batches): {UNEVEN_DATA.what}",
                          UNEVEN_DATA.fixes),),
    Reason.SKIPPED_GROUP: (Cause("a collective of a subgroup (dist.new_group) behind a rank-dependent condition: every "
                                 "member of a group must call each of its collectives, in the same order as the "
                                 "others call theirs; one member skipped it (or another called one more)"),),
    Reason.WAIT_FOR_EACH_OTHER: (Cause("send/recv in an order that waits in a cycle (each rank receives before it "
                                       "sends)", _alternatives("send first on even ranks and receive first on odd ones",
                                                               "use isend/irecv (batch_isend_irecv)")),),
    Reason.NEVER_CHECKED_IN: (Cause("it never called init_process_group: a condition around it, or it exited or is "
                                    "stuck before it (its line above)"),
                              Cause("its node's torchrun did not start it: see that node's log")),
    Reason.CANNOT_REACH_STORE: (Cause("it cannot reach the store at MASTER_ADDR:MASTER_PORT: ddp-preflight's "
                                      "master-reachable"),),
    Reason.CANNOT_CONNECT: (Cause("the ranks cannot connect to each other: the firewall, address family and interface "
                                  "(ddp-preflight's ephemeral-ports, address-family, interface-choice)"),),
    Reason.LINK: (Cause("a peer or the link is gone: a node that rebooted or froze, a cable, a switch, a firewall "
                        "change (ddp-preflight's ephemeral-ports and bandwidth re-run show which path)"),),
}

# Torchruns that wait for nodes that never came (no rank started): the node's torchrun was never
# started, or it cannot reach the store.
LAUNCHERS_NEVER_CAME = CAUSES[Reason.NEVER_CHECKED_IN][1:] + (
    Cause("it cannot reach the store: ddp-preflight's master-reachable"),)

DUPLICATE_NODE_RANK = (
    Cause("the node rank was written once for every node: `--node-rank $SLURM_NODEID` (or $NODE_RANK) expanded by "
          "the batch script on the first node, so every srun task got that node's value",
          (change("let each task expand it: srun bash -c 'torchrun --node-rank $SLURM_NODEID ...' (single quotes), "
                  "or use torchrun's c10d rendezvous (--rdzv-backend c10d --rdzv-endpoint HOST:PORT, no --node-rank), "
                  "which numbers the nodes itself"),)),
    Cause("the same command, with the same --node-rank, was typed on two nodes"),
)

TRAINS_ALONE = (Cause("init_process_group behind a condition: nanochat, for one, creates its process group on CUDA "
                      "only, so on CPU it needs its Gloo patch"),
                Cause("a script written for one process, started by torchrun: it never calls init_process_group"))

# What a failure's own words name (failures.py), and its fix where no node's facts are needed to
# write it (`ddp-preflight explain` adds the fixes the rules build for the address family, the
# master port and torchrun's options: rules/routes.py, ports.py, launch_args.py, through of()).
FAILURE_CAUSES: dict[Reason, tuple[Cause, ...]] = {
    Reason.ADDRESS_FAMILY: (Cause("Gloo on these ranks' node binds another address family (IPv6 on a VPN interface) "
                                  "than its peers: pin the LAN interface on every node (ddp-preflight's "
                                  "address-family, interface-choice); GLOO_IPV6=0 does not help when the hostname "
                                  "resolves to the VPN's address"),),
    Reason.PORT_IN_USE: (Cause("a process still holds the master port: a run before this one that never ended, "
                               "or another program (ddp-preflight's master-port and stale-processes name it)"),),
    Reason.UNSUPPORTED: (Cause("the backend does not implement this call: on Gloo, Work.get_future() of "
                               "reduce_scatter and others, AVG and PREMUL_SUM reductions, uneven all_gather "
                               "(ddp-preflight's collectives, --scan PATH finds the calls in the code)"),),
    Reason.SIZE_MISMATCH: (Cause("the ranks called a collective with tensors of different sizes, or different "
                                 "collectives, at one point: a rank-dependent shape, uneven data, a call on one rank "
                                 "only (TORCH_DISTRIBUTED_DEBUG=DETAIL names the two calls)",
                                 (Fix(Action.CHANGE, ("every rank issues the same collectives with the same tensor "
                                                      "shapes in the same order",)),)),),
    Reason.SCRIPT_OPTIONS: (Cause("torchrun's parser reads options after the script that abbreviate one of its own "
                                  "(--run for --run-path): ddp-preflight's launch-args"),),
    Reason.NCCL_ERROR: (Cause("NCCL refused the process group: two ranks on one GPU (more ranks per node than GPUs, or "
                              "CUDA_VISIBLE_DEVICES hiding some), or each rank not pinned to its own GPU (NCCL_DEBUG=WARN "
                              "says more)",
                              (Fix(Action.CHANGE, ("torch.cuda.set_device(LOCAL_RANK) before init_process_group",
                                                   "--nproc-per-node no more than the node's GPUs (ddp-preflight's "
                                                   "gpu-visible)")),)),),
    Reason.OUT_OF_MEMORY: (Cause("its GPU ran out of memory: a batch, a sequence or a model too large for it, or memory "
                                 "another process holds (ddp-preflight's gpu-memory-held)",
                                 _alternatives("a smaller per-GPU batch (more gradient accumulation)",
                                               "activation checkpointing", "bf16")),),
    Reason.TIMED_OUT: (Cause("every rank waited in the same collective past the process group's timeout and none was "
                             "behind: the link is too slow for what it carries in that time (Wi-Fi, a shaped or busy "
                             "link: ddp-preflight's bandwidth), or the timeout is too short",
                             _alternatives("init_process_group(timeout=datetime.timedelta(minutes=30))",
                                           "a wired link", "smaller buffers per collective")),),
}


def of(reason: Reason | None, fix: Fix | None = None) -> tuple[Cause, ...]:
    """The causes of a reason (what a failure's own words name first, else the verdicts'), with
    `fix` (one the rules built from what the inputs showed: a pin, a port's holder) added to the
    first cause that has none of its own (`explain`)."""
    causes = (FAILURE_CAUSES.get(reason, ()) or CAUSES.get(reason, ())) if reason is not None else ()
    if fix is None:
        return causes
    if not causes:
        return (Cause("", (fix,)),)
    first = causes[0]
    return ((first if first.fixes else Cause(first.what, (fix,))),) + causes[1:]
