"""hangwatch's agent: one per node, a node program (started by the watcher through the
transport; its spec on stdin). Standard library only.

It finds the training ranks (ranks.py), samples each one's CPU, kernel wait channel and state
every `interval` seconds, takes their Python stacks with py-spy when asked (all ranks at once)
and, rarely, on its own, sees each exit the moment it happens, and streams AGENT lines. Commands
come on the control line; when the watcher closes it or goes silent for the lease (its node
lost, its master dead), the agent removes what was made for the watch and exits at once. It
never signals a rank: py-spy's dump pauses a rank for a few milliseconds, and that is all.

spec: {"program": "agent", "node": name, "pids": [..], "interval": 1.0, "stack_every": 120.0,
       "py_spy": path|null, "native": false, "lease": seconds|null, "remove": [folders],
       "run": a launch's token|absent} (pids: exactly those processes, and the ranks of those that
       are launchers; run: the processes of that launch alone, ranks.py)
Lines out (AGENT + JSON), as node/protocol.py types them:
- {"type": "hello", ..., "py_spy": path|null, "py_spy_refused": why|null};
- {"type": "rank", ...what ranks.Finder says, "started"} (RankFound: /proc/stat's btime + its start
  ticks, the node's clock) and {"type": "launcher", ...} for each torchrun;
- {"type": "sample", "t", "ranks": [...], "gone": [pids], "net": bytes/s, "launchers", "gpus",
  "closures"} (Sample): each rank's state, wchan, threads and CPU; its "io" (bytes/s it read and
  wrote through system calls, /proc/PID/io's rchar + wchar; from its second sample, where
  readable) and "children_cpu" (% of a core its descendants used, from the parent map of the
  scan that finds the ranks; only with descendants), both kept by keeper.py; its "tcp" (established
  connections) and "torch" (torch's library is mapped in it: /proc/PID/maps) in one sample of
  CONNECTIONS_EVERY, and its "endpoints" (local "ip:port" of every socket) and "links" (its
  established connections, [local, remote]) when they changed;
- asked for in a stall, first {"type": "stacks", "t", "id", "stacks", "partial": [pids]} when some
  ranks' Python frames need native ones under them: those pids' stacks are Python frames alone,
  and their native frames come in the message below, with the same id;
- {"type": "stacks", "t", "id", "stacks": {pid: dump | {"error": ...}}, "flight": {pid: record},
  "sockets": {pid: SocketQueues: established, unsent and unread bytes, peer_closed (CLOSE_WAIT),
  from its network namespace's /proc/net/tcp and tcp6}, "reading": [the stores of ranks waiting in
  init_process_group, when asked in a stall]}; then {"type": "stores", "t", "id", "stores": [what
  each says (store.py), all read together under one short deadline]} (Stores);
- {"type": "exit", "pid", "t", "code", "closed", "oom", "output", "ending"} (RankExit): the node's
  OOM-kill count (/proc/vmstat) rose since the last sample in which no rank was on its way out;
  the last lines of its stdout and stderr when they are regular files, read through the
  descriptors opened from /proc/PID/fd when it was found (never a pipe, FIFO, socket or terminal);
  its own record of how its script ended (PID.end in its Flight Recorder folder, flight.ending);
  "shared" with the output: the file is another process's output too (its torchrun's, another
  rank's), so only the lines whose prefix names it are its own;
- {"type": "clock", "asked", "t"}; {"type": "py-spy", "path", "given", "refused"}.
Commands: {"cmd": "stacks", "id", "native", "pids": {node: [pids]} (the ranks to read; absent: all)},
{"cmd": "clock", "t"}, {"cmd": "py-spy", "path", "remove": folder}."""

from __future__ import annotations

import collections
import os
import shutil
import sys
import threading
import time

from . import blocked, proc, protocol, pyspy
from .agent_exits import Exits
from .agent_stacks import Stacks
from .control import Control
from .gpus import Gpus
from .keeper import Keeper, children_of
from .ranks import Finder
from .redact import redact_env
from .sockets import closures, connections, held_sockets, rank_sockets, socket_queues

__all__ = ["Agent", "closures", "connections", "held_sockets", "main", "rank_sockets", "redact_env", "socket_queues"]

TORCH_LIBRARY = "libtorch_cpu.so"   # mapped by `import torch` in every build (CPU, CUDA, ROCm)
CONNECTIONS_EVERY = 5     # samples: the ranks' TCP connections are counted in one sample of so many
TIME_WAIT_LEN = 60.0      # seconds the kernel keeps a closed connection in TIME_WAIT (TCP_TIMEWAIT_LEN)
MAX_KEPT = 4096           # ranks whose output files are remembered (an ended rank's too: its peers end after it)


class Agent(Stacks, Exits):
    def __init__(self, spec):
        self.spec = spec
        self.interval = float(spec.get("interval", 1.0))
        self.stack_every = float(spec.get("stack_every", 120.0))
        self.py_spy, self.py_spy_refused = pyspy.find(spec.get("py_spy"))
        self.native = bool(spec.get("native"))
        self.ranks = Finder(spec.get("pids") or [], redact=redact_env, run=spec.get("run"))
        self.last_stacks: float | None = None   # when it last took stacks (None: never; the first at once)
        self.dumping = collections.Counter()   # pid -> py-spy reads of it under way: its state 't' is ours
        self.reading = collections.Counter()   # pid -> py-spy dumps of it running now (each suspends it)
        self.read_until: dict = {}             # pid -> when the last dump of it ended (monotonic)
        self.dumping_lock = threading.Lock()
        self.one_reader: dict = {}             # pid -> the lock each read of it holds: one tracer at a time
        self.waits = {}               # pid -> its main thread's blocking system call at the last sample
        self.held = {}                # pid -> the most TCP sockets it held at a count
        self.endpoints = {}           # pid -> its TCP sockets' local endpoints when last counted
        self.links = {}               # pid -> its established connections (local, remote) when last counted
        self.settled = set()          # pids whose endpoints were the same at two counts in a row
        self.torch = set()            # pids that have torch's library mapped (it imported torch)
        self.not_tcp = set()          # socket inodes of ranks that were not in the TCP table when counted
        self.counted = {}             # pid -> its TCP sockets at its last count from the table
        self.counted_inodes = {}      # pid -> the socket inodes it held then
        self.ended_at = None          # when a rank of this node last ended (monotonic)
        self.keeper = Keeper()        # each rank's bytes, helpers, output file, record of its end
        self.outputs = {}             # pid -> (its stdout/stderr files, its parent's): proc.output_files
        self.keeping = threading.Lock()   # the keeper is used by the sampling and the exits' threads
        self.stop = threading.Event()
        self.remove = list(spec.get("remove") or [])      # folders made for this watch (a copied py-spy)
        self.unwanted = set()         # ranks found here that the watcher does not follow (another user's)
        self.gpus = Gpus()

    def no_new_socket(self, pid) -> bool:
        """Whether every socket it holds was counted before and was not a TCP one (or it holds none)."""
        held_now = proc.socket_inodes(pid)
        return held_now is not None and held_now <= self.not_tcp

    def count_sockets(self, pids, tables, now) -> dict:
        """Each rank's TCP sockets (sockets.rank_sockets), read again from the TCP table only for a rank
        whose sockets or their states (as the wire's reading of this sample has them) changed since
        its last count: the table costs milliseconds, the wire's reading is made anyway. Only the
        queues' sizes are not read again, and no count uses them."""
        out, reading = {}, []
        for pid in pids:
            last = self.counted.get(pid)
            states = self.keeper.wire.states_of(pid, now) if last is not None else None
            if last is not None and states is not None and states == {s.inode: int(s.state, 16) for s in last} \
                    and proc.socket_inodes(pid) == self.counted_inodes.get(pid):
                out[pid] = last
            else:
                reading.append(pid)
        # Kept with the inodes this reading saw, not a later listing's: a socket the rank made
        # between the two would be in neither the count nor a change (CI: a rank whose three
        # connections came in that gap counted none for ever).
        read_against: dict = {}
        for pid, mine in (rank_sockets(reading, tables, read_against) if reading else {}).items():
            out[pid] = self.counted[pid] = mine
            self.counted_inodes[pid] = read_against.get(pid)
        return out

    def emit(self, message):
        protocol.emit(protocol.AGENT, message)

    def hello(self):
        torch_version = None
        try:
            from importlib.metadata import version
            torch_version = version("torch")
        except Exception:
            pass
        self.emit({"type": "hello", "node": self.spec.get("node"), "host": os.uname().nodename,
                   "pid": os.getpid(), "uid": os.geteuid(), "python": sys.version.split()[0],
                   "torch": torch_version, "py_spy": self.py_spy, "py_spy_refused": self.py_spy_refused,
                   "time": time.time(),
                   "missing": sorted(p for p in self.ranks.given if not os.path.exists(f"/proc/{p}"))})
    def command(self, command):
        """One command from the watcher, on the control line (ddp_preflight/node/control.py)."""
        if command.get("cmd") == "stacks":
            # {"pids": {node: [pids]}}: the ranks the watcher follows on each node (absent: all).
            wanted = (command.get("pids") or {}).get(self.spec.get("node")) \
                if isinstance(command.get("pids"), dict) else None
            if wanted is not None:
                wanted = set(wanted)
                self.unwanted = set(self.ranks.known) - wanted
            threading.Thread(target=self.stacks, args=(command.get("id"), command.get("native"), wanted),
                             daemon=True).start()
        elif command.get("cmd") == "clock":
            # Answered at once: the watcher reads this node's clock against its own (its offset, to
            # within half the round trip).
            self.emit({"type": "clock", "asked": command.get("t"), "t": time.time()})
        elif command.get("cmd") == "py-spy":
            if command.get("remove"):
                self.remove.append(command["remove"])
            path, refused = pyspy.find(command.get("path"))
            self.py_spy = path or self.py_spy
            self.emit({"type": "py-spy", "path": path, "given": command.get("path"), "refused": refused})
    def run(self):
        self.hello()
        threading.Thread(target=self.watch_exits, daemon=True).start()
        last = {}        # pid -> (monotonic, cpu seconds), ranks and launchers alike
        last_net = (time.monotonic(), proc.net_bytes())
        announced = set()
        announced_launchers = set()
        boot = proc.boot_time()
        rounds = 0
        me = os.getuid()
        while not self.stop.is_set():
            started = time.monotonic()
            # Read before the ranks: the OOM killer counts a kill just before it sends its SIGKILL,
            # so a kill counted here shows in its victim's stat below (proc.Stat.leaving).
            oom_kills = proc.oom_kills()
            found = self.ranks.scan()
            samples = []
            tables = {}          # network namespace -> its TCP table, read at most once a sample
            # Sockets are counted every few samples; a rank whose connections are still being made
            # (it was found lately, or they changed at the last count) every sample, so that a rank
            # that ends young is known.
            # A rank none of whose sockets is a TCP one (none at all; unix ones) as they were at the last
            # count is not counted again until it holds a new socket: the table costs milliseconds.
            if rounds % CONNECTIONS_EVERY == 0:
                counting, self.not_tcp = list(found), set()
            else:
                counting = [p for p in found if p not in self.settled and not self.no_new_socket(p)]
            sockets = self.count_sockets(counting, tables, started) if counting else {}
            for pid in counting:
                held_now = proc.socket_inodes(pid) if pid in sockets else None
                if held_now is not None:
                    self.not_tcp |= held_now - {s.inode for s in sockets[pid]}
            tcp = {pid: sum(1 for s in mine if s.state == proc.ESTABLISHED) for pid, mine in sockets.items()} \
                if rounds % CONNECTIONS_EVERY == 0 else {}
            rounds += 1
            endpoints = {pid: {s.local for s in mine} for pid, mine in sockets.items()}
            links = {pid: {(s.local, s.remote) for s in mine if s.state == proc.ESTABLISHED}
                     for pid, mine in sockets.items()}
            if counting:
                # The most it has held: a rank on its way out closes them, and that must still show.
                for pid, mine in sockets.items():
                    self.held[pid] = max(len(mine), self.held.get(pid, 0))
                for pid, now_at in endpoints.items():
                    if now_at and now_at == self.endpoints.get(pid):
                        self.settled.add(pid)
                    else:
                        self.settled.discard(pid)
            children = children_of(self.ranks.stats)
            leaving = False      # a rank on its way out: the OOM count before it is kept for its exit
            # This user's ranks and the given ones first: the watcher knows its own ranks before it
            # hears another user's process claim one (hangwatch/runs.py follows its own alone then).
            for pid, info in sorted(found.items(), key=lambda kv: not kv[1]["given"] and kv[1]["uid"] != me):
                st = proc.stat(pid)
                if st is None or st.leaving:
                    leaving = True
                if st is None:
                    continue
                now, cpu = time.monotonic(), st.cpu_seconds
                before = last.get(pid)
                last[pid] = (now, cpu)
                # py-spy holds a rank it reads (state t) for milliseconds: that is not the rank's state.
                state = None if st.state == "t" and self.dumping[pid] > 0 else st.state
                sample = {"pid": pid, "rank": info["rank"], "state": state, "threads": proc.threads(pid),
                          "wchan": proc.wchan(pid)}
                if before is not None and self.read_since(pid, before[0]):
                    sample["held"] = True
                # Its main thread's system call (a sleep, a socket...), while asleep: kept for the
                # stacks, which need not read it again.
                waits = blocked.waits_in(pid, tables) if st.state == "S" else None
                self.waits[pid] = waits
                if waits is not None:
                    sample["waits_in"] = waits
                if st.state == "Z":
                    sample["exit"] = st.exit_status
                if self.gpus.of(pid) is not None:
                    sample["gpu"] = self.gpus.of(pid)
                if pid in tcp:
                    sample["tcp"] = tcp[pid]
                    # Whether it imported torch, with its connections: ranks with none that never
                    # imported torch are no process group's (a script that only prints).
                    if pid not in self.torch and proc.maps_library(pid, TORCH_LIBRARY):
                        self.torch.add(pid)
                    sample["torch"] = pid in self.torch
                if pid in endpoints and endpoints[pid] != self.endpoints.get(pid):
                    self.endpoints[pid] = endpoints[pid]
                    sample["endpoints"] = sorted(endpoints[pid])
                if pid in links and links[pid] != self.links.get(pid):
                    # Which rank each connection joins it to: a Gloo process group is a mesh of
                    # connections, one per pair of its members, so a subgroup shows as a second one.
                    self.links[pid] = links[pid]
                    sample["links"] = sorted(list(link) for link in links[pid])
                if before:
                    dt = max(now - before[0], 1e-6)
                    sample["cpu"] = round(100 * (cpu - before[1]) / dt, 1)
                if (pid, info["start"]) not in announced:
                    announced.add((pid, info["start"]))
                    with self.keeping:
                        self.keeper.found(pid)
                        self.outputs[pid] = (proc.output_files(pid), proc.output_files(info["ppid"]))
                        while len(self.outputs) > MAX_KEPT:
                            del self.outputs[next(iter(self.outputs))]      # the oldest: long gone
                    self.emit({"type": "rank", **info, "started": boot + info["start"] / proc.TICK})
                with self.keeping:
                    sample.update(self.keeper.sample(pid, now, self.ranks.stats, children, started))
                samples.append(sample)
            launchers = []
            for pid, info in list(self.ranks.launchers.items()):
                st = proc.stat(pid)
                if st is None:
                    continue
                if (pid, info["start"]) not in announced_launchers:
                    announced_launchers.add((pid, info["start"]))
                    self.emit({"type": "launcher", **info, "started": boot + info["start"] / proc.TICK})
                now, cpu = time.monotonic(), st.cpu_seconds
                before = last.get(pid)
                last[pid] = (now, cpu)
                launchers.append({"pid": pid, "ranks": sum(1 for i in found.values() if i["ppid"] == pid),
                                  **({"cpu": round(100 * (cpu - before[1]) / max(now - before[0], 1e-6), 1)}
                                     if before else {})})
            for pid in [p for p in last if p not in found and p not in self.ranks.launchers]:
                del last[pid]
            now, total = time.monotonic(), proc.net_bytes()
            net = (total - last_net[1]) / max(now - last_net[0], 1e-6)
            last_net = (now, total)
            gone = sorted(p for p, _ in announced if p not in found)
            announced = {(p, s) for p, s in announced if p in found}
            with self.keeping:
                # The count the next exit is compared with (RankExit.oom), unless a rank is on its
                # way out or went since the last sample: its exit compares with the count before.
                if not leaving and not gone and oom_kills is not None:
                    self.keeper.sampled(oom_kills)
                self.keeper.forget(found)
            self.torch &= set(found)
            for pid in [p for p in self.held if p not in found]:
                del self.held[pid]
                self.endpoints.pop(pid, None)
                self.links.pop(pid, None)
                self.settled.discard(pid)
            for pid in [p for p in self.waits if p not in found]:
                del self.waits[pid]
            for pid in [p for p in self.counted if p not in found]:
                del self.counted[pid]
                self.counted_inodes.pop(pid, None)
            with self.dumping_lock:
                for pid in [p for p in self.read_until if p not in found]:
                    del self.read_until[pid]
            message = {"type": "sample", "t": time.time(), "ranks": samples, "gone": gone, "net": round(net, 1)}
            if self.ended_at is not None and time.monotonic() - self.ended_at < TIME_WAIT_LEN:
                message["closures"] = closures(tables)
            gpus = self.gpus.sample()
            if gpus:
                message["gpus"] = gpus
            if launchers:
                message["launchers"] = launchers
            self.emit(message)
            if found and (self.last_stacks is None or time.monotonic() - self.last_stacks > self.stack_every):
                wanted = {p for p in found if p not in self.unwanted}
                threading.Thread(target=self.stacks, args=(None, None, wanted), daemon=True).start()
                self.last_stacks = time.monotonic()
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


AHEAD = -10              # the agent's niceness as root: ahead of the training in the run queue


def main(spec: dict, work=None) -> int:
    # As root, ahead of the training in the run queue: this thread, and every thread and py-spy it
    # then starts (Linux's niceness is per thread, and inherited). On a loaded box both agents'
    # stacks came 11-12 s after they were asked for (a full run's trace), and the verdict with them;
    # the agent uses about 1% of a core. Without root the niceness stays as it is.
    if os.geteuid() == 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, AHEAD)
        except OSError:
            pass
    agent = Agent(spec)
    control = Control(spec.get("lease"), on_gone=lambda why: agent.stop.set(), on_command=agent.command).start()
    try:
        agent.run()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        control.gone.set()
        for folder in agent.remove:
            shutil.rmtree(folder, ignore_errors=True)
    return 0
