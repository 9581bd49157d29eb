"""Which processes are training ranks: decided once, here, for hangwatch's agent and for
preflight's stale-processes alike.

A rank is a worker that a launcher started: a Python process whose environment has RANK and
WORLD_SIZE (what torch.distributed's env:// needs; torchrun, the launcher, DeepSpeed and Slurm
scripts set both) and whose parent is not itself a rank. Its children inherit RANK and are not
ranks: DataLoader workers, torch.compile's compile workers and the compilers they run (gcc,
collect2). A process whose environment this user may not read is a rank when torchrun started it
(its rank number is then unknown)."""

from __future__ import annotations

import os
from typing import Dict, Iterable, Optional, Set, Tuple

from . import proc

# A launcher's command line: torchrun (any spelling) or ddp-preflight's own launch program,
# which runs torchrun in its process.
LAUNCHERS = ("torch.distributed.run", "torchrun", "torch/distributed/run.py", "torch.distributed.launch",
             "torchelastic", "node.programs import child")
YOUNG = 2.0       # seconds: a process this young may not have exec'd its program yet


def has_rank(env: Optional[Dict[str, str]]) -> bool:
    return env is not None and "RANK" in env and "WORLD_SIZE" in env


def is_launcher(argv) -> bool:
    joined = " ".join(argv)
    return any(word in joined for word in LAUNCHERS)


def is_python(argv) -> bool:
    program = os.path.basename(argv[0]) if argv else ""
    return program.startswith("python") or program == "pt_main_thread"


def _int(value) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class Finder:
    """The ranks on this node, found again on each scan (restarts are new pids). Only processes
    in this network namespace: another namespace is another machine as far as training goes (a
    container, a lab node); its ranks are its own agent's to watch. `given` pids are ranks
    whatever they look like."""

    def __init__(self, given: Iterable[int] = (), redact=None):
        self.given: Set[int] = set(given)
        self.redact = redact or (lambda env: env)
        self.own_netns = proc.netns(os.getpid())
        self.known: Dict[int, dict] = {}            # pid -> what it is, fixed for its life
        self.not_ranks: Set[Tuple[int, int]] = set()  # (pid, start) looked at, not a rank

    def scan(self) -> Dict[int, dict]:
        found: Dict[int, dict] = {}
        now = proc.uptime()
        me = os.getpid()
        for pid in proc.pids():
            if pid == me:
                continue
            st = proc.stat(pid)
            if st is None or (pid, st.start_ticks) in self.not_ranks:
                continue
            known = self.known.get(pid)
            if known is not None and known["start"] == st.start_ticks:
                found[pid] = known
                continue
            info = self.look(pid, st)
            if info is not None:
                found[pid] = info
            elif now - st.start_seconds > YOUNG:
                self.not_ranks.add((pid, st.start_ticks))
        # A rank's children carry its RANK: keep only the outermost.
        for pid in [p for p, i in found.items() if i["ppid"] in found and p not in self.given]:
            self.not_ranks.add((pid, found.pop(pid)["start"]))
        self.known = found
        return found

    def look(self, pid: int, st: proc.Stat) -> Optional[dict]:
        given = pid in self.given
        netns = proc.netns(pid)           # None: another user's process; then we cannot tell, so look
        if not given and netns is not None and netns != self.own_netns:
            return None
        argv = proc.cmdline(pid)
        env = proc.environ(pid)
        if not given:
            if is_launcher(argv):
                return None
            started_by_launcher = is_launcher(proc.cmdline(st.ppid))
            if env is None:                 # unreadable: a rank only if torchrun started it
                if not started_by_launcher:
                    return None
            elif not has_rank(env):
                return None
            elif not (started_by_launcher or is_python(argv)):
                return None                 # a tool a rank ran (gcc, collect2): not a rank
            parent = proc.environ(st.ppid)
            if has_rank(parent) and not started_by_launcher and is_python(proc.cmdline(st.ppid)):
                return None                 # a rank's own child
        readable, env = env is not None, env or {}
        return {"pid": pid, "ppid": st.ppid, "start": st.start_ticks, "argv": argv[:12],
                "rank": _int(env.get("RANK")), "local_rank": _int(env.get("LOCAL_RANK")),
                "world_size": _int(env.get("WORLD_SIZE")),
                "master": f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '')}" if "MASTER_ADDR" in env else None,
                "env_readable": readable,
                "env": self.redact(env)}
