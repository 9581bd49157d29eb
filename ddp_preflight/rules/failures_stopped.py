"""How a run was stopped from outside it (rules/failures.py joins these to its CATALOGUE): a SIGTERM to
torchrun's agent (a scheduler's cancel, a supervising process or platform that saw something else fail,
kill), a SIGHUP (its terminal or ssh session closed: nohup does not keep torchrun) and Slurm ending a
job for a reason it names (its time limit, a preemption, a node it lost). A consequence, never a rank's
root: no rank is named. The run ended; none of these says it hung (a person's Ctrl-C, rules/failures.py's
stopped-by-hand, is what a stuck run gets), so the fix is what the sender's own record says, or what the
reason it names asks for. Pure, standard library only; every wording is in a log users pasted
(tests/unit/artifacts/pasted/index.json says where from) or in torch's elastic/agent/server/api.py and
Slurm's slurmstepd."""

from __future__ import annotations

from .failure_kinds import Cause, FailureKind, Message, Part, Sure, _m
from .fix import change, run

K, C, P = FailureKind, Cause, Part

# who sent a SIGTERM from outside, and why, is in its own record, not in the run's lines
STOPPED_OUTSIDE = run("ddp-preflight explain <every node's log> <the log of what started this run>",
                      note="the SIGTERM came from outside the run: the scheduler's or supervisor's record of the job "
                           "says who sent it and why (a cancel, a time limit, another process that failed)")
# ... and under Slurm, its accounting says it (explain/fits.py swaps it in where the paste shows Slurm)
SLURM_RECORD = run("sacct -j JOBID -o JobID,State,ExitCode,Elapsed,Timelimit,NodeList",
                   note="Slurm's record of the job: CANCELLED by whom, TIMEOUT at its limit, PREEMPTED, NODE_FAIL, "
                        "or a step that FAILED first")

STOPPED: tuple[Message, ...] = (
    # Slurm's own reason, in slurmstepd's "*** JOB 37361369 ON learnfair5146 CANCELLED AT ... DUE TO PREEMPTION ***"
    _m("scheduler-time-limit", ("DUE TO TIME LIMIT",), r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT",
       K.EXITED, C.UNKNOWN, P.VICTIM, "Slurm ended the job at its time limit: the run was stopped, not failed",
       change("give the job more time (#SBATCH --time=...), or let it resume: save a checkpoint when Slurm warns "
              "(#SBATCH --signal=B:USR1@300) and requeue (#SBATCH --requeue)"), Sure.CERTAIN),
    _m("scheduler-preempted", ("DUE TO PREEMPTION",), r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION",
       K.EXITED, C.UNKNOWN, P.VICTIM, "Slurm preempted the job (a job of higher priority took its nodes): the run "
       "was stopped, not failed",
       change("let it resume after a preemption: requeue (#SBATCH --requeue) and load the last checkpoint at start"),
       Sure.CERTAIN),
    _m("scheduler-node-failure", ("DUE TO NODE FAILURE",),
       r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+ DUE TO NODE FAILURE",
       K.EXITED, C.UNKNOWN, P.VICTIM, "Slurm lost a node of the job (NODE_FAIL): the ranks there died with it",
       run("sinfo -R; sacct -j JOBID -o JobID,State,NodeList", note="which node failed and why; resubmit without it "
           "(--exclude=NODE)"), Sure.CERTAIN),
    # torchrun's agent on a SIGHUP: its exception, its log line, and the SIGHUP it passes on to its ranks (it sends
    # its ranks the signal it got; after a rank's failure, SIGTERM)
    _m("stopped-by-hangup", ("got signal: 1", "death signal", "signal SIGHUP"),
       r"SignalException: Process \d+ got signal: 1\b|Received (?:1|Signals\.SIGHUP) death signal"
       r"|Sending process \d+ closing signal SIGHUP|via signal SIGHUP",
       K.EXITED, C.UNKNOWN, P.VICTIM,
       "torchrun's agent got SIGHUP: the terminal or ssh session it ran in closed (nohup does not keep it: the agent "
       "stops its ranks on SIGHUP itself); no rank failed",
       change("run it in tmux or screen (or setsid nohup <the launch command> &), so that closing the terminal or the ssh "
              "session sends it no SIGHUP"), Sure.CERTAIN),
    # torchrun's agent on a SIGTERM, in its exception and its log line (torch 1.9+)
    _m("stopped-from-outside", ("got signal: 15", "death signal"),
       r"SignalException: Process \d+ got signal: 15\b|Received (?:15|Signals\.SIGTERM) death signal",
       K.EXITED, C.UNKNOWN, P.VICTIM,
       "the launcher was stopped from outside (SIGTERM: a scheduler's cancel or time limit, a supervising process or "
       "platform, kill): a consequence, never the root; why the sender stopped it is not in these lines",
       STOPPED_OUTSIDE, Sure.UNKNOWN),
)
# the order a finding takes them in when nothing else failed: the reason a line names before the bare signal
REASONS = ("scheduler-time-limit", "scheduler-preempted", "scheduler-node-failure", "stopped-by-hangup")
