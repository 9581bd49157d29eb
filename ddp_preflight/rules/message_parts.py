"""Parts of messages: fields read out of lines the catalogue (rules/failures.py) matched, and the
words a line is searched for before a pattern of it, apart from it so that module stays a catalogue
of whole messages (and under 400 lines). Each reads one field of a message of torch, NCCL, Gloo or
torchrun (a port, an option, a rank, a peer's address, where a process group was, a field of
torchrun's table), or is one of its words.

Pure, standard library only."""

from __future__ import annotations

import re

PORT = re.compile(r"port: (?P<port>\d+)")                              # the store's port, in IN_USE's message
OPTION = re.compile(r"(?:ambiguous option: |unrecognized arguments: |argument )(?P<option>-[-\w=.]+)")   # USAGE_ERROR's
PG_STATUS = re.compile(r"last enqueued (?:NCCL )?work: (?P<enqueued>-?\d+), last completed (?:NCCL )?work: "
                       r"(?P<completed>-?\d+)", re.IGNORECASE)         # the watchdog's word on a group
RANK_IN_LOG = re.compile(r"\[Rank (?P<rank>\d+)\]|Rank (?P<pgrank>\d+)\]")     # the rank a watchdog line is of
GLOO_PEER = re.compile(r"\[(?P<host>[0-9A-Za-z.:%_-]+)\]:(?P<port>\d+)")      # Gloo: "[10.213.5.2]:24077"
# The size of the world a line states: a launcher's or the training's own line (world_size=8, DeepSpeed's
# dist_world_size=8, WORLD_SIZE=8), NCCL's init line ("comm 0x55d1 rank 1 nranks 8 cudaDev 1 ... Init COMPLETE")
WORLD_SIZE = re.compile(r"\b(?:dist_world_size|world_size|WORLD_SIZE|world size)\s*[=:]\s*(?P<world>\d+)"
                        r"|\bn[Rr]anks[ =](?P<nranks>\d+)")
WORLD_SIZE_WORDS = ("orld_size", "ORLD_SIZE", "world size", "nranks", "nRanks")
NCCL_PEER = re.compile(r"(?P<host>[0-9A-Za-z.:%_-]+)<(?P<port>\d+)>")          # NCCL: "10.213.5.2<24077>"

# torchrun's ChildFailedError table, line by line (hangwatch/torchrun_table.py; its flattened fields,
# as explain reads them, are rules/failures.py's TABLE_*): the line it starts after, the script's
# "... FAILED", an entry's "[0]:", its fields and their values.
TABLE_START = "ChildFailedError:"
TABLE_FAILURES = "Failures:"          # the entries after it are the failures after the first (under "Root Cause")
TABLE_TITLE = re.compile(r"^(?P<script>.+) FAILED$")
TABLE_LINE_ENTRY = re.compile(r"^\[(?P<index>\d+)\]:$")
TABLE_FIELD = re.compile(r"^  (?P<key>time|host|rank|exitcode|error_file|traceback)\s*: ?(?P<value>.*)$")
TABLE_RANK = re.compile(r"^(?P<rank>-?\d+)(?: \(local_rank: (?P<local>-?\d+)\))?")
TABLE_EXITCODE = re.compile(r"^(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?\s*(?:\((?P<signal>SIG\w+)\))?")
TABLE_ROOT_LINE = "Root Cause (first observed failure):"
TABLE_NOT_AVAILABLE = "<N/A>"
# A line that may be one of the lines of how a launcher says a rank ended (rules/failures.py's
# FAILED_LINE, DEEPSPEED_EXIT, TABLE_*): a cheap test before them all; one of TABLE_FIELDS_WORDS is in
# every line TABLE_FIELDS reads.
EXIT_HINT = re.compile(r"exitcode|exits with return code|Root Cause|Failures:|ChildFailedError:|local[_ ]rank"
                       r"|received by PID|terminated with"
                       r"|died with <Signals|non-zero exit status"
                       r"|\b(?:time|host|rank)\s*:|^\s*\[\d+\]:\s*$")
TABLE_FIELDS_WORDS = ("rank", "exitcode", "PID", "time", "host")
# torch.multiprocessing.spawn's word on a process it started (its index: the local rank): "process 0
# terminated with signal SIGKILL" (ProcessExitedException; a plain Exception before 1.8), "... with exit code 1", or a
# paste that cut the line there (the process failed; how, it no longer says)
SPAWN_EXIT = re.compile(r"process (?P<index>\d+) terminated with(?: signal (?P<signal>SIG[A-Z]+)| exit code (?P<code>-?\d+)"
                        r"|\s*$)")
SPAWN_EXIT_WORD = "terminated with"
# ... and its ProcessRaisedException's header: the exception after it (its frames, or the user's "...") is that process's
SPAWN_RAISED = re.compile(r"-- Process (?P<index>\d+) terminated with the following error:")
# torch.distributed.launch before elastic (up to 1.8): the CalledProcessError of the process it waited
# for, its command line with its --local_rank
LAUNCH_EXIT = re.compile(r"--local_rank=(?P<local>\d+)'[^\n]*?\]' (?:died with <Signals\.(?P<signal>SIG[A-Z]+): \d+>"
                         r"|returned non-zero exit status (?P<code>\d+))")
LAUNCH_EXIT_WORDS = ("died with <Signals", "non-zero exit status")
# ... its CalledProcessError however the command was shown (a user's "XXXXX"), when the traceback that raised it
# is the launcher's own (a frame in torch/distributed/launch.py): the rank is not named
LAUNCH_EXIT_ANY = re.compile(r"CalledProcessError: Command .*? (?:died with <Signals\.(?P<signal>SIG[A-Z]+): \d+>"
                             r"|returned non-zero exit status (?P<code>\d+))")
LAUNCH_FRAME = "distributed/launch.py"

# Exception types a log shows that are no rank's own failure: a stop by hand (Ctrl-C) or by a scheduler
# (torchrun's SignalException), and a launcher's word on a rank it started (torchrun's table, mp.spawn's)
STOPPED_TYPES = ("KeyboardInterrupt", "SignalException")
LAUNCHER_TYPES = ("ChildFailedError", "ProcessExitedException", "ProcessRaisedException")

# Words a line is searched for before a pattern of rules/failures.py (a cheap test: most lines hold none).
FAILED_LINE_WORD = "failed (exitcode"                  # FAILED_LINE
DEEPSPEED_EXIT_WORD = "exits with return code"         # DEEPSPEED_EXIT
USAGE_ERROR_WORD = ": error: "                         # USAGE_ERROR
OOM_KILL_WORDS = ("Out of memory", "oom")              # OOM_KILL
WATCHDOG_WORDS = ("Watchdog", "last enqueued", "last_enqueued", "Last enqueued")   # WATCHDOG, PG_STATUS
