"""Which processes are training ranks: decided once, here, for hangwatch's agent and for
preflight's stale-processes alike.

A rank is a worker that a launcher started, told by its environment and its ancestry. A process
is a rank when
- it is a Python process whose environment has RANK and WORLD_SIZE (what torch.distributed's
  env:// needs; torchrun, the launcher, DeepSpeed and Slurm scripts set both), or its environment
  is one this user may not read and torchrun started it (its rank number is then unknown), or
  torch.multiprocessing.spawn started it with the store's MASTER_ADDR and MASTER_PORT in its
  environment (spawned_rank: its number is an argument, unknown here);
- and no ancestor of it is a rank.

An ancestor is a rank when it was given by pid, was found a rank before, or is itself a Python
process with RANK and WORLD_SIZE in its environment (or one with an unreadable environment that
torchrun started). The walk up from the parent goes through everything else: sh, bash, env, nice,
timeout, compile and DataLoader workers, and the srun or mpirun wrapper that exports RANK to the
Python only. It stops, with no rank above, at a launcher (LAUNCHERS), after pid 1 (judged like
the others: a container's first process may be its rank), at a process whose environment cannot
be read (another user's: sudo, a setuid wrapper; one torchrun started is a rank, as above), at a
process gone, and after MAX_DEPTH ancestors.

So what a rank starts inherits RANK and is never a rank, however many wrappers lie between: its
DataLoader workers, torch.compile's compile workers, a helper run with os.system or
subprocess(shell=True), and the compilers they run (gcc, collect2: not Python). A program that is
not Python (a shell) is a rank only when given by pid, or unreadable and started by torchrun: when
torchrun runs `wrapper.sh`, the Python that wrapper.sh runs is the rank (a user who cannot read
their environments gets the shell, all it can tell). Processes claiming the same RANK with no rank
above either (two runs) are all ranks: what that means is the watcher's to say. A process given
by pid is a rank whatever it looks like.

What a watch follows is narrowed by what it was given, never widened:
- a launch's agents are given its run token (RUN_VARIABLE, set in the environment of the launch
  program it starts, which torchrun and every rank inherit): only processes whose environment
  holds that token, run by the agent's own user, are ranks or launchers to them (another user
  who copied the token is not that user). Another run on the node, of the same user
  too (another store, another torchrun waiting in its rendezvous), is not seen at all: never
  read, stopped or reported;
- `hangwatch attach --pid A --pid B`: those processes exactly, and the ranks of those that are
  launchers (a given torchrun is a launcher, its ranks below it followed); no other process of
  the node, of any user.

A process is judged once for its life (its pid and start time): a rank stays one whatever its
ancestors turn into. One that is not a rank is looked at again while it is young (YOUNG: it may
not have exec'd its program yet), unless a rank is above it: no exec changes that.

Each rank is reported with the user who runs it (its real uid and that user's name on the node):
anyone can start a Python with RANK, WORLD_SIZE and MASTER_ADDR in its environment, but not as
another user, so the watcher never joins one user's process to another user's run
(hangwatch/runs.py)."""

from __future__ import annotations

import os
import pwd
from typing import Dict, Iterable, List, Optional, Set, Tuple

from . import proc
from .redact import redact_text

# A launcher's command line: torchrun (any spelling) or ddp-preflight's own launch program,
# which runs torchrun in its process.
LAUNCHERS = ("torch.distributed.run", "torchrun", "torch/distributed/run.py", "torch.distributed.launch",
             "torchelastic", "ddp_preflight.node.programs import child")
# A launch's run token, in its launch program's environment (so in torchrun's and every rank's).
RUN_VARIABLE = "DDP_PREFLIGHT_RUN"
YOUNG = 2.0       # seconds: a process this young may not have exec'd its program yet
MAX_DEPTH = 64    # ancestors walked at most: real chains are a few deep; a bound all the same
FULL_EVERY = 10   # scans: every process's stat is read again in one scan of so many (a reused pid)


def has_rank(env: Optional[Dict[str, str]]) -> bool:
    return env is not None and "RANK" in env and "WORLD_SIZE" in env


def is_launcher(argv) -> bool:
    """torchrun itself: a Python running torchrun (its entry script runs in the Python its #! names,
    so argv[0] is that Python). A shell, `timeout`, `nohup` or srun whose command line only mentions
    torchrun (`sh -c "torchrun ... > node.log"`, `timeout 600 torchrun ...`) starts no rank itself:
    taken for one, it was a second torchrun of the node that never started a rank, read as waiting
    for the other nodes' at the run's end."""
    if not is_python(argv):
        return False
    joined = " ".join(argv)
    return any(word in joined for word in LAUNCHERS)


def is_python(argv) -> bool:
    program = os.path.basename(argv[0]) if argv else ""
    return program.startswith("python") or program == "pt_main_thread"


def spawned_rank(argv: List[str], env: Optional[Dict[str, str]]) -> bool:
    """A rank of torch.multiprocessing.spawn: a Python that multiprocessing's spawn started
    (`python -c 'from multiprocessing.spawn import spawn_main; ...' --multiprocessing-fork`) with
    the store it is to join, MASTER_ADDR and MASTER_PORT, in its environment: mp.spawn hands a
    rank its number as an argument, never in RANK, and the script sets the store's address in
    os.environ before it spawns (env://), which the spawned Python starts with. Its rank number
    is then unknown here: it is named by its process, never by a guess."""
    return env is not None and is_python(argv) and "--multiprocessing-fork" in argv \
        and "MASTER_ADDR" in env and "MASTER_PORT" in env


def looks_like_rank(argv: List[str], env: Optional[Dict[str, str]], ppid: int) -> bool:
    """The first half of the rule, the process alone: a Python with RANK and WORLD_SIZE, or
    unreadable and torchrun's child, or mp.spawn's (spawned_rank). Not a launcher, a shell, or a
    tool a rank ran (gcc)."""
    if is_launcher(argv):
        return False
    if env is None:
        return is_launcher(proc.cmdline(ppid))
    return (has_rank(env) and is_python(argv)) or spawned_rank(argv, env)


def launcher_options(argv, env) -> dict:
    """What a torchrun's command line (and environment) says of the run: nodes, this node's rank,
    the store. None where it does not say (ddp-preflight's own launch program reads them from
    its spec, not its command line)."""
    options: Dict[str, str] = {}
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        name, eq, value = word[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                continue
            value = argv[i + 1]
        options.setdefault(name.replace("_", "-"), value)
    nnodes = options.get("nnodes", env.get("NNODES"))
    nnodes = nnodes.split(":")[-1] if nnodes else None        # "1:4": elastic, at most 4
    endpoint = options.get("rdzv-endpoint")
    if endpoint is None and options.get("master-addr", env.get("MASTER_ADDR")):
        endpoint = f"{options.get('master-addr', env.get('MASTER_ADDR'))}:" \
                   f"{options.get('master-port', env.get('MASTER_PORT', '29500'))}"
    return {"nnodes": _int(nnodes), "node_rank": _int(options.get("node-rank", env.get("NODE_RANK"))),
            "master": redact_text(endpoint) if endpoint else None, "nproc_per_node": _int(options.get("nproc-per-node"))}


def real_uid(pid: int) -> Optional[int]:
    """The user who runs it: its real uid (/proc/PID/status), which a setuid program it runs or
    a /proc entry made root's (not dumpable) does not change."""
    for line in (proc.read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


_names: Dict[int, str] = {}


def user_name(uid: Optional[int]) -> Optional[str]:
    """Its name on this node ("uid N" for a uid without one); None when the uid is unknown."""
    if uid is None:
        return None
    if uid not in _names:
        try:
            _names[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _names[uid] = f"uid {uid}"
    return _names[uid]


def _family(ranks: Dict[int, dict], stats: Dict[int, proc.Stat]) -> Set[int]:
    """The ranks and all their descendants, by the parents in `stats`."""
    children: Dict[int, List[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    out: Set[int] = set()
    todo = list(ranks)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, ())
    return out


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

    def __init__(self, given: Iterable[int] = (), redact=None, run: Optional[str] = None):
        self.given: Set[int] = set(given)
        self.run = run                              # a launch's token: its processes alone are followed
        self.redact = redact or (lambda env: env)
        self.own_netns = proc.netns(os.getpid())
        self.known: Dict[int, dict] = {}            # pid -> what it is, fixed for its life
        self.not_ranks: Set[Tuple[int, int]] = set()  # (pid, start) looked at, not a rank
        self.launchers: Dict[int, dict] = {}        # pid -> a torchrun of this node, as its command line says
        self.stats: Dict[int, proc.Stat] = {}       # pid -> every process's stat at the last scan
        self.scans = 0

    def scan(self) -> Dict[int, dict]:
        found: Dict[int, dict] = {}
        now = proc.uptime()
        me = os.getpid()
        alive: Set[Tuple[int, int]] = set()
        stats: Dict[int, proc.Stat] = {}
        # A process judged not a rank that was there at the last scan is the same process (a pid is
        # reused only after the kernel's pid counter wraps; every FULL_EVERY scans all are read
        # again all the same): its stat is kept, unless it is a launcher or of a rank's family
        # (their CPU and parents are read every scan). Reading ~150 stat files was most of a scan.
        self.scans += 1
        before = self.stats if self.scans % FULL_EVERY else {}
        family = _family(self.known, before) if before else set()
        for pid in proc.pids():
            if pid == me:
                continue
            kept = before.get(pid)
            if kept is not None and pid not in family and pid not in self.launchers \
                    and (pid, kept.start_ticks) in self.not_ranks:
                alive.add((pid, kept.start_ticks))
                stats[pid] = kept
                continue
            st = proc.stat(pid)
            if st is not None:
                alive.add((pid, st.start_ticks))
                stats[pid] = st
            if st is None or (pid, st.start_ticks) in self.not_ranks:
                continue
            known = self.known.get(pid)
            if known is not None and known["start"] == st.start_ticks:
                found[pid] = known
                continue
            info = self.look(pid, st, found)
            if info is not None:
                found[pid] = info
            elif now - st.start_seconds > YOUNG:
                self.not_ranks.add((pid, st.start_ticks))
        self.known, self.stats = found, stats
        self.launchers = {p: i for p, i in self.launchers.items() if (p, i["start"]) in alive}
        return found

    def look(self, pid: int, st: proc.Stat, found: Optional[Dict[int, dict]] = None) -> Optional[dict]:
        """What a process not judged before is, when it is a rank; `found`: the ranks of this
        scan so far."""
        given = pid in self.given
        netns = proc.netns(pid)           # None: another user's process; then we cannot tell, so look
        if not given and netns is not None and netns != self.own_netns:
            return None
        argv = proc.cmdline(pid)
        env = proc.environ(pid)
        if self.run is not None and ((env or {}).get(RUN_VARIABLE) != self.run or real_uid(pid) != os.getuid()):
            return None                   # not the launch's: another run's, or a copy of its token by another user
        below = not given and bool(self.given) and self.given_above(st.ppid)
        if self.given and not given and not below:
            return None                   # attach --pid: those processes, and their ranks if launchers
        if is_launcher(argv) and (netns is None or netns == self.own_netns or given):
            uid = real_uid(pid)
            self.launchers[pid] = {"pid": pid, "start": st.start_ticks, "argv": argv[:40],
                                   "uid": uid, "user": user_name(uid), **launcher_options(argv, env or {})}
            return None
        if not given:
            if not looks_like_rank(argv, env, st.ppid):
                return None
            if self.rank_above(st.ppid, found or {}):
                self.not_ranks.add((pid, st.start_ticks))     # whatever its age: no exec changes that
                return None
        readable, env = env is not None, env or {}
        uid = real_uid(pid)
        return {"pid": pid, "ppid": st.ppid, "start": st.start_ticks, "argv": argv[:12],
                "uid": uid, "user": user_name(uid), "given": given or below,
                "rank": _int(env.get("RANK")), "local_rank": _int(env.get("LOCAL_RANK")),
                "world_size": _int(env.get("WORLD_SIZE")),
                # Shown in events and bundles: a password in it (admin:pw@host) never leaves the node.
                "master": redact_text(f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '')}")
                if "MASTER_ADDR" in env else None,
                "env_readable": readable,
                "env": self.redact(env)}

    def given_above(self, pid: int) -> bool:
        """Whether `pid` (a parent) or one of its ancestors was given (attach --pid): a given
        launcher's ranks are followed (rank_above keeps out a given rank's helpers)."""
        seen: Set[int] = set()
        for _ in range(MAX_DEPTH):
            if pid <= 0 or pid in seen:
                return False
            if pid in self.given:
                return True
            seen.add(pid)
            st = proc.stat(pid)
            if st is None:
                return False
            pid = st.ppid
        return False

    def rank_above(self, pid: int, found: Dict[int, dict]) -> bool:
        """Whether `pid` (a parent) or one of its ancestors is a rank, as the module says. Ranks
        known already are told by their pid and start time, without reading more of them."""
        seen: Set[int] = set()
        for _ in range(MAX_DEPTH):
            if pid <= 0 or pid in seen:
                return False
            seen.add(pid)
            if pid in self.given and not is_launcher(proc.cmdline(pid)):
                return True
            st = proc.stat(pid)
            if st is None:
                return False
            for ranks in (found, self.known):
                rank = ranks.get(pid)
                if rank is not None and rank["start"] == st.start_ticks:
                    return True
            argv = proc.cmdline(pid)
            if is_launcher(argv):
                return False
            env = proc.environ(pid)
            if looks_like_rank(argv, env, st.ppid):
                return True
            if env is None:                 # another user's: above it we cannot see
                return False
            pid = st.ppid
        return False
