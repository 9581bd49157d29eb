"""`ddp-preflight explain PATH ...`: the cause of a failed or stuck run, named from what it left
(its logs, torchelastic's error files, Flight Recorder dumps, hangwatch's incident bundles, a
launch's result.json), with hangwatch's typed verdicts and the same causes and fixes. Pure logic
over files read once, line by line: inputs.py finds what each path holds, lines.py streams a file,
logs.py and records.py read each kind into what each rank said (gather.py, in order), a launch's
saved verdict is the answer, else the one judge the live watcher and a launch's summary use
(hangwatch/named.py: what the launchers' and the ranks' failure words name; hangwatch/exits.py:
who failed first, through ended.py) names the root, with what only files hold beside it (words.py:
the OOM killer's and NCCL's watchdog lines, who is behind by sequence number); render.py only
renders."""

from .verdict import Explanation, explain

__all__ = ["Explanation", "explain"]
