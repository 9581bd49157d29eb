"""The dashboard's words and glyphs for the snapshot's values. Pure, no Textual: the same text
could go to a plain terminal, and tests check it without starting an app."""

from __future__ import annotations

from ddp_preflight.hangwatch.model import Diagnosis, RankStatus, RankView

BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_SAMPLES = 10
NA = "-"                 # a value the snapshot does not have (yet)

# Worst first: what the user has to act on comes before what is fine.
STATUS_ORDER = {"fail": 0, "error": 1, "warn": 2, "skip": 3, "pass": 4}
# Written out so a status reads the same without colour (NO_COLOR).
STATUS_LABEL = {"fail": "FAIL", "error": "ERROR", "warn": "WARN", "skip": "skip", "pass": "ok"}


def sparkline(history: list[float], samples: int = SPARK_SAMPLES) -> str:
    """The last `samples` CPU percentages as block characters, 0% to 100% of one core, padded
    on the left so every rank's line ends at the same column."""
    top = len(BLOCKS) - 1
    glyphs = "".join(BLOCKS[min(top, max(0, round(v / 100 * top)))] for v in history[-samples:])
    return glyphs.rjust(samples)


def cpu_text(rank: RankView) -> str:
    return f"{sparkline(rank.history)} {rank.cpu:3.0f}%"


def state_label(rank: RankView) -> str:
    """What the rank is doing, in one short word or two: the collective by name, since
    "collective" alone does not say which one the ranks disagree on."""
    if rank.state == "collective":
        return rank.op or "collective"
    if rank.state == "exited":
        return f"exited, {rank.exit}" if rank.exit else "exited"
    if rank.state == "idle" and rank.idle_for >= 1:
        return f"idle {duration(rank.idle_for)}"
    return rank.state


def step_text(rank: RankView, threshold: float | None = None) -> str:  # threshold in seconds
    """The step the output last showed and how fast steps come; "stalled" once the rank has made
    no progress for the watcher's stall threshold (its last rate is history then); blank when the
    output shows no step."""
    if rank.step is None and rank.step_rate is None:
        return ""
    step = NA if rank.step is None else str(rank.step)
    if rank.state is RankStatus.EXITED:
        return step                                      # no rate: it ended
    rate = "stalled" if threshold is not None and stalled(rank, threshold) else rate_text(rank.step_rate)
    return f"{step} {rate}".strip()


PROGRESSING = (RankStatus.RUNNING, RankStatus.COMPUTING, RankStatus.EXITED, RankStatus.UNKNOWN)


def stalled(rank: RankView, threshold: float = 1.0) -> bool:  # threshold in seconds
    """No progress for `threshold` (the watcher's own, for "stalled"): waiting or idle that long."""
    return rank.state not in PROGRESSING and rank.idle_for >= threshold


def rate_text(rate: float | None) -> str:  # rate in steps per second
    if rate is None:
        return ""
    if rate <= 0:
        return "stalled"
    return f"{rate:.1f}/s" if rate >= 1 else f"{1 / rate:.1f}s/step"


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def since_text(diagnosis: Diagnosis, now: float) -> str:
    """How long the hang has lasted, by the snapshot's own clock (the master's), so a recorded
    snapshot renders the same whenever it is shown."""
    return "" if diagnosis.since is None else f"for {duration(now - diagnosis.since)}"


def stack_lines(stack: list[dict]) -> list[str]:
    """A py-spy stack, innermost first, as `file:line  function`."""
    return [f"{f.get('file', '?')}:{f.get('line', '?')}  {f.get('function', '?')}" for f in stack]


def preflight_counts(results: list[dict]) -> str:
    """"2 warn, 2 skip, 21 ok", worst first."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result["status"]] = counts.get(result["status"], 0) + 1
    parts = [f"{n} {STATUS_LABEL.get(s, s).lower()}" for s, n in
             sorted(counts.items(), key=lambda item: STATUS_ORDER.get(item[0], 0))]
    return ", ".join(parts) if results else "no checks"


def preflight_rows(results: list[dict], show_all: bool) -> list[dict]:
    """The results worth looking at, worst first: by default everything but the passes."""
    shown = [r for r in results if show_all or r["status"] != "pass"]
    return sorted(shown, key=lambda r: STATUS_ORDER.get(r["status"], 0))


def node_text(node: str | None) -> str:
    return node or "cluster"
