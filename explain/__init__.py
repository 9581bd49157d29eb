"""`ddp-preflight explain PATH ...`: the cause of a failed or stuck run, named from what it left
(its logs, torchelastic's error files, Flight Recorder dumps, hangwatch's incident bundles, a
launch's result.json), with hangwatch's typed verdicts and the same causes and fixes. Pure logic
over files read once, line by line: inputs.py finds what each path holds, lines.py streams a file,
logs.py and records.py read each kind into what each rank said (gather.py, in order), a launch's
saved verdict is the answer, else words.py (what a failure's words name, who is behind) and
ended.py (who failed first: hangwatch/exits.py's one rule) name the root (verdict.py), render.py
only renders."""

from .verdict import Explanation, explain

__all__ = ["Explanation", "explain"]
