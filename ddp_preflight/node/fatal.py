"""What faulthandler wrote when a fatal signal ended a rank (the bootstrap turns it on, into the
rank's PID.fatal in its Flight Recorder folder): read into a record like PID.end's. Standard
library only: it runs on the nodes."""

import re

FATAL_LINE = re.compile(r"^Fatal Python error: (.+)$")
FRAME_LINE = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def fatal_record(raw):
    """What faulthandler wrote when a fatal signal ended the rank (PID.fatal: "Fatal Python error:
    Segmentation fault", then the crashing thread's frames, most recent first), as a record like
    PID.end's: {"how": "fatal", "error": "Segmentation fault", "frames": [...] innermost last}.
    None when it wrote nothing (the rank ended otherwise)."""
    text = raw.decode("utf-8", "replace")
    error, frames = None, []
    for line in text.splitlines():
        found = FATAL_LINE.match(line)
        if found and error is None:
            error = found.group(1).strip()
            continue
        found = FRAME_LINE.match(line)
        if found and error is not None:
            frames.append({"file": found.group(1), "line": int(found.group(2)), "function": found.group(3).strip()})
        elif frames and not line.strip():
            break                # the crashing thread's frames end at the first blank line
    if error is None:
        return None
    return {"how": "fatal", "error": error[:200], "frames": frames[::-1][-40:]}
