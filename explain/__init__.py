"""`ddp-preflight explain PATH ...`: the cause of a failed or stuck run, named from what it left
(its logs, torchelastic's error files, Flight Recorder dumps, hangwatch's incident bundles), with
hangwatch's typed verdicts and the same causes and fixes. Pure logic over files read once, line by
line: inputs.py finds what each path holds, lines.py streams a file, logs.py and records.py read
each kind into what each rank said, join.py lines the ranks' collectives up by sequence number,
verdict.py names the root, render.py only renders."""

from .verdict import Explanation, explain

__all__ = ["Explanation", "explain"]
