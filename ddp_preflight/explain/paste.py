"""A paste read as its writer printed it: what a terminal, a browser and a chat did to the lines
undone before any reader sees them. A terminal's hard wrap (every line longer than its width cut
into pieces of exactly that width, so the longest lines of the paste are all one length) is joined
back, and so are two lines a catalogued message or a launcher's exit line is said only across (a
wrap at a space, or a line as long as the widest); colour
codes and carriage returns at a line's end are dropped; markdown code fences are not lines of the
log. Only a paste (an input shorter than lines.py's block) is read so: a program's own log is never
wrapped, and a long one is streamed.

Pure, standard library only."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from ddp_preflight.hangwatch.prefixes import normalize
from ddp_preflight.rules.failures import ANY_WORD, DEEPSPEED_EXIT, FAILED_LINE, find
from ddp_preflight.rules.message_parts import EXIT_HINT, LAUNCH_EXIT, LAUNCH_EXIT_ANY, SPAWN_EXIT, TABLE_LINE_ENTRY

COLOURS = re.compile(r"\x1b\[[0-9;]*m")       # a terminal's colours (SGR): any other escape stays for the renderer to neutralize
SEPARATOR = re.compile(r"^\s*([=*#~-])\1{9,}\s*$")      # torchrun's table's rules, a logger's
LINE_STARTS = ("Traceback (most recent call last)", '  File "', "During handling of", "The above exception")
FENCE = re.compile(r"^\s*(?:>\s*)?(?:```|~~~)[\w+-]*\s*$")
PREFIX_TOKEN = re.compile(r"^\S.{0,40}?[:|\]>](?=\s)")    # a writer's tag: the line's start to a prefix's end
NARROWEST = 60          # a terminal or a page narrower than this is not one a log is read in: a shorter
                        # line was not wrapped
# The wrapped lines of a paste: the longest length is a terminal's width only when at least this
# many lines have it (one line of that length may be a line of that length)
WRAPPED_LINES = 2


def lines_of(text: str) -> Iterator[tuple[int, str]]:
    """The paste's lines, each with the number of the first line it was printed on (from 1)."""
    raw = [_plain(line) for line in text.split("\n")]
    if raw and raw[-1] == "":
        raw.pop()
    width = wrap_width(raw)
    pending, first = "", 0
    for number, line in enumerate(raw, 1):
        if FENCE.match(line):
            continue
        if not pending:
            first = number
        following = raw[number] if number < len(raw) else None
        joint = None
        if following is not None:
            joint = "" if width is not None and len(line) == width else \
                said_across(pending + line, following) if len(line) >= NARROWEST else None
            if joint is not None and (starts_a_line(following, quoted=line.startswith(">"))
                                      or _same_prefix(pending or line, following)):
                joint = None
        if joint is None:
            yield first, pending + line
            pending = ""
        else:
            pending += line + joint
    if pending:
        yield first, pending


def said_across(line: str, following: str) -> str | None:
    """What joins a line to the next one when a catalogued message is said only across the two (a
    paste wrapped one long line, at a space or not): "" or " "; None when they are two lines."""
    apart: set[str] | None = None
    for joint in ("", " "):
        around = line[-80:] + joint + following[:80]        # a message's words across the joint
        if ANY_WORD.search(around) is None and EXIT_HINT.search(around) is None:
            continue
        if apart is None:
            apart = _said(line) | _said(following)
        if _said(line + joint + following) - apart:
            return joint
    return None


# Every launcher's line on how a rank ended: torchrun's, DeepSpeed's, mp.spawn's, the old launch's
EXIT_LINES = (("failed-line", FAILED_LINE), ("deepspeed", DEEPSPEED_EXIT), ("spawn", SPAWN_EXIT), ("launch", LAUNCH_EXIT),
              ("launch-any", LAUNCH_EXIT_ANY))


def _said(text: str) -> set[str]:
    """The catalogued messages in a line, and the launchers' exit lines (mp.spawn's cut after "terminated
    with" is not its whole line: the next one may say how)."""
    said = {f.message.id for f in find(text)}
    for name, exit in EXIT_LINES:
        found = exit.search(text)
        if found is not None:
            cut = name == "spawn" and found["signal"] is None and found["code"] is None
            said.add(name + "-cut" if cut else name)
    return said


def starts_a_line(line: str, quoted: bool = True) -> bool:
    """A line a writer began (a prefix, a traceback's line, a separator), never the rest of a cut
    one: whose prefixes a reader strips, or that begins as a traceback or torchrun's table does. A
    markdown quote's ">" starts a line only in a quote (`quoted`: the line before it was one): after an
    unquoted line it is the rest of a line cut before its ">" (NCCL's "10.0.35.1<49189>")."""
    if not line or line.startswith(LINE_STARTS) or SEPARATOR.match(line) or TABLE_LINE_ENTRY.match(line):
        return True       # torchrun's table's "[2]:" after a field of one length in every entry, too
    if not quoted and line.startswith(">"):
        line = line[1:]
    return normalize(line).text != line


def _same_prefix(line: str, following: str) -> bool:
    """Both lines begin with one writer's prefix ("0:", "node1:", "[rank0]:", "host |"): two lines it wrote, never
    one cut in two (a wrap's rest goes on mid-text), whatever prefix readers know (srun's label before an
    indented frame, a host, a logger's own tag; several ranks' identical frames are the longest lines alike)."""
    said = PREFIX_TOKEN.match(line)
    return said is not None and following.startswith(said.group())


def wrap_width(lines: list[str]) -> int | None:
    """The width a terminal hard-wrapped these lines at, or None when nothing says they were: the
    length of the longest lines, when several have exactly it."""
    lengths = Counter(len(line) for line in lines if len(line) >= NARROWEST and not SEPARATOR.match(line))
    if not lengths:
        return None
    longest = max(lengths)
    return longest if lengths[longest] >= WRAPPED_LINES else None


def _plain(line: str) -> str:
    """A line without its colour codes and the carriage return of a CRLF ending (one written over by
    a carriage return mid-line is prefixes.py's: the terminal shows the last). Other escapes are
    kept: the quote shows what the file holds, made harmless where it is rendered."""
    if "\x1b" in line:
        line = COLOURS.sub("", line)
    return line[:-1] if line.endswith("\r") else line
