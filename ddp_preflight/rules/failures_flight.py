"""torch's Flight Recorder analyzer's words (torch.distributed.flight_recorder's fr_trace, `torchfrtrace`,
torch 2.5+; rules/failures.py joins them to its CATALOGUE): what it decided from every rank's dump, each
report's first line. The ranks each report names are on its later lines (explain/flight_text.py reads
the whole report). Pure, standard library only; the words are torch 2.13's builder.py, utils.py and
types.py (tests/unit/artifacts/pasted/fr-trace/ holds its output, recorded here)."""

from __future__ import annotations

from .failure_kinds import Cause, FailureKind, Message, Part, Sure, _m
from .fix import change, run

K, C, P = FailureKind, Cause, Part

NEVER_ENTERED = change("find why that rank never reached the collective: its own log, or its stack (py-spy dump --pid "
                       "PID) while it hangs", note="most often uneven data across ranks (one ran out of batches): equal "
                       "shards per rank, a DistributedSampler with drop_last=True, DDP's Join, or one all_reduce per "
                       "step of 'do I still have data'")
DIFFERENT = change("make every rank issue the same collectives with the same shapes and dtypes in the same order (a "
                   "rank-dependent branch, a log call on rank 0 only, uneven data)")
MISSING_DUMPS = run("torchfrtrace --prefix PREFIX DIR", note="with every rank's dump in DIR: it read none of the ranks "
                    "it names, so it cannot tell which rank never came")

ANALYZER: tuple[Message, ...] = (
    # utils.py's error_analysis, case one: the missing ranks' own dumps were read and hold no entry for it
    _m("fr-missing-ranks", ("Not all ranks joining collective",),
       r"Not all ranks joining collective, sequence number: (?P<seq>\d+)", K.RANK_BEHIND, C.BEHIND, P.ROOT,
       "the Flight Recorder analyzer read every rank's dump: these ranks never entered the collective the others "
       "issued", NEVER_ENTERED),
    # ... case four: the ranks' entries at one sequence number differ in op, sizes or dtypes ("Culprit rank N;
    # Error type: ..." against the first rank's entry)
    _m("fr-collective-errors", ("has errors", "Input/output mismatch"),
       r"Collective sequence number: (?P<seq>\d+) has errors"
       r"|Input/output mismatch in the collective sequence number: (?P<seq2>\d+)",
       K.MISMATCH, C.DIFFERENT_COLLECTIVES, P.ROOT,
       "the Flight Recorder analyzer found the ranks in different collectives (op, sizes or dtypes) at one sequence "
       "number", DIFFERENT, Sure.LIKELY),
    # ... and its own assert before it analyzes anything (utils.py's check_no_missing_dump_files)
    _m("fr-missing-dumps", ("missed FR dumps", "Missing dump files"),
       r"missed FR dumps from ranks \((?P<ranks>\{[\d, ]*\})\)|Missing dump files from ranks (?P<ranks2>\{[\d, ]*\})",
       K.TIMEOUT_UNKNOWN_ROOT, C.COLLECT_FLIGHT_RECORDER, P.TIMEOUT,
       "the Flight Recorder analyzer could not decide: it read no dump of some ranks", MISSING_DUMPS, Sure.UNKNOWN),
)
# the analyzer's own exception (its assert on missing dumps) is the tool's, never a rank's failure
ANALYZER_IDS = frozenset(m.id for m in ANALYZER)
