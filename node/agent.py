"""hangwatch's agent: one per node, a node program (started by the watcher through the
transport; its spec on stdin). Standard library only.

It finds the training ranks (ranks.py), samples each one's CPU, kernel wait channel and state
every `interval` seconds, takes their Python stacks with py-spy when asked (all ranks at once)
and, rarely, on its own, sees each exit the moment it happens, and streams AGENT lines. Commands
come on the control line; when the watcher closes it or goes silent for the lease (its node
lost, its master dead), the agent removes what was made for the watch and exits at once. It
never signals a rank: py-spy's dump pauses a rank for a few milliseconds, and that is all.

spec: {"program": "agent", "node": name, "pids": [..], "interval": 1.0, "stack_every": 120.0,
       "py_spy": path|null, "native": false, "lease": seconds|null, "remove": [folders]}
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

from . import blocked, flight, loops, proc, protocol, pyspy, store
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


def _each(work, pids) -> None:
    """work(pid) for every pid at once, each in a thread of its own; back when all are done."""
    threads = [threading.Thread(target=work, args=(p,)) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class Agent:
    def __init__(self, spec):
        self.spec = spec
        self.interval = float(spec.get("interval", 1.0))
        self.stack_every = float(spec.get("stack_every", 120.0))
        self.py_spy, self.py_spy_refused = pyspy.find(spec.get("py_spy"))
        self.native = bool(spec.get("native"))
        self.ranks = Finder(spec.get("pids") or [], redact=redact_env)
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
        self.ended_at = None          # when a rank of this node last ended (monotonic)
        self.keeper = Keeper()        # each rank's bytes, helpers, output file, record of its end
        self.outputs = {}             # pid -> (its stdout/stderr files, its parent's): proc.output_files
        self.keeping = threading.Lock()   # the keeper is used by the sampling and the exits' threads
        self.stop = threading.Event()
        self.remove = list(spec.get("remove") or [])      # folders made for this watch (a copied py-spy)
        self.unwanted = set()         # ranks found here that the watcher does not follow (another user's)
        self.gpus = Gpus()

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
                   "time": time.time()})

    def stacks(self, request_id=None, native=None, wanted=None):
        """Every rank's stack (those `wanted`, when the watcher says which it follows: the
        processes of another user's run are not read), then what their stores say."""
        pids = [p for p in self.ranks.known if wanted is None or p in wanted]
        out, deeper = {}, []
        if self.py_spy is None:
            out = {str(p): {"error": "py-spy is not on this node"} for p in pids}
        else:
            how = native if native is not None else self.native
            # In a stall, asked for: every rank's Python frames first, sent at once; then native
            # frames of those whose Python stack does not stop in torch.distributed (a wait in C++
            # under a frame of the user's, DDP's all_reduce under backward()), sent after. Native
            # frames take seconds a rank on a loaded node (libtorch's symbols): the watcher decides
            # from the Python frames wherever they decide (hangwatch/agents.py).
            staged = how == "stall"          # the watcher's ask in a stall (it has an id)

            def one(p, how=how):
                # Asleep in the kernel (time.sleep), or stopped by it (SIGSTOP: state T): its Python
                # frames say where, the kernel why; native frames, slow to take, would add nothing.
                asleep = staged and self.waits.get(p) == {"call": "sleep"}
                stopped = staged and getattr(proc.stat(p), "state", None) == "T"
                dump = self.dump(p, False if staged else how)
                if staged and not asleep and not stopped and isinstance(dump, list) and not pyspy.in_distributed(dump):
                    deeper.append(p)
                loops.annotate(dump)        # which of its lines sit inside a loop (node/loops.py)
                out[str(p)] = dump

            def native_of(p):
                dump = self.dump(p, True)
                if isinstance(dump, list):  # an error keeps the Python frames in hand
                    loops.annotate(dump)
                    out[str(p)] = dump

            with self.dumping_lock:
                self.dumping.update(pids)
            try:
                _each(one, pids)
                if deeper:
                    # The first part says what it can: the Flight Recorders, the sockets, and the
                    # stores of ranks waiting in init_process_group (their Python frames show it),
                    # read beside the native frames, their answer sent when it comes.
                    flights = self.flights(pids, request_id)
                    first = {"type": "stacks", "t": time.time(), "id": request_id, "stacks": dict(out),
                             "partial": sorted(deeper), "flight": flights, "sockets": socket_queues(pids)}
                    reading = self.read_stores(first, request_id, out)
                    _each(native_of, deeper)
                    if reading is not None:
                        reading.join()
            finally:
                with self.dumping_lock:
                    self.dumping.subtract(pids)
        if not deeper:
            flights = self.flights(pids, request_id)
        self.last_stacks = time.monotonic()
        message = {"type": "stacks", "t": time.time(), "id": request_id, "stacks": out, "flight": flights,
                   "sockets": socket_queues(pids)}
        if deeper:
            self.emit(message)                  # its stores, if any, were read with the first part
            return
        reading = self.read_stores(message, request_id, out)
        if reading is not None:
            reading.join()

    def dump(self, pid, native):
        """One py-spy dump of a rank, counted: py-spy suspends the rank while it reads (seconds, for
        native frames on a loaded node), and the samples taken meanwhile say so (`held`). One at a
        time per rank: a process has one ptrace tracer, and a second py-spy's attach fails with
        EPERM (the agent's own stacks and a watcher's ask read a rank at once: "ptrace not
        permitted", its fix offered to root)."""
        with self.dumping_lock:
            self.reading[pid] += 1
            one = self.one_reader.setdefault(pid, threading.Lock())
        try:
            with one:
                return pyspy.dump(self.py_spy, pid, native)
        finally:
            with self.dumping_lock:
                self.reading[pid] -= 1
                self.read_until[pid] = time.monotonic()
                if not self.reading[pid]:
                    self.one_reader.pop(pid, None)

    def read_since(self, pid, since) -> bool:
        """A dump of it ran at some time since `since` (monotonic)."""
        with self.dumping_lock:
            return self.reading[pid] > 0 or self.read_until.get(pid, since - 1) >= since

    def read_stores(self, message: dict, request_id, dumps: dict):
        """Send this stacks message; in a stall (asked for), the stores of the ranks its stacks show
        waiting in init_process_group (who never checked in) are read after it, each once, all under
        one bound, in a thread of their own (returned: None when there are none), their answer sent
        as a stores message. The stacks go first: a store read never holds them (one that never
        answers would hold every verdict)."""
        stores = self.rendezvous_stores(dumps) if request_id is not None else []
        if stores:
            message["reading"] = [master for master, _ in stores]
        self.emit(message)
        if not stores:
            return None

        def read():
            self.emit({"type": "stores", "t": time.time(), "id": request_id,
                       "stores": store.read_all(stores, deadline=store.READ_DEADLINE)})
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        return reader

    @staticmethod
    def flights(pids, request_id) -> dict:
        """Asked for, in a stall: each rank's Flight Recorder (launched ranks, opted-in ones), all at once."""
        found: dict = {}
        if request_id is not None:
            _each(lambda p: found.__setitem__(str(p), flight.ask(p)), pids)
        return {p: f for p, f in found.items() if f is not None}

    def rendezvous_stores(self, dumps: dict) -> list:
        """The stores (MASTER_ADDR:PORT, world size) of the ranks waiting in init_process_group,
        each once."""
        stores = {}
        for pid, dump in dumps.items():
            info = self.ranks.known.get(int(pid))
            if info is not None and store.in_rendezvous(dump) and info["master"] not in stores:
                stores[info["master"]] = info["world_size"]
        return list(stores.items())

    def command(self, command):
        """One command from the watcher, on the control line (node/control.py)."""
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

    def watch_exits(self):
        """The moment each rank exits, through a pidfd (Linux 5.3+): the order of exits names the
        rank that went first, even when its peers follow within milliseconds. The exit code is
        read while the rank is a zombie or, when torchrun reaped it first, from the kernel's own
        exit record (exitcodes.py)."""
        import select

        from .exitcodes import ExitCodes
        poller, fds, reported = select.poll(), {}, set()
        # The kernel's exit records: a rank's code even when its parent reaped it before we read
        # its zombie (exitcodes.py). Without them (no CAP_NET_ADMIN, no taskstats): the zombie alone.
        codes = ExitCodes()
        codes.start()
        def report(pid):
            reported.add(pid)           # once: a zombie's pidfd stays readable until it is reaped
            st = proc.stat(pid)
            code = st.exit_status if st is not None and st.state in "ZX" else None
            if code is None:
                code = codes.status(pid)
            at = time.time()
            self.ended_at = time.monotonic()
            closed = self.closed_since(pid)
            with self.keeping:
                kept = self.keeper.ended(pid)
                if kept.get("output"):
                    kept["shared"] = self.shared_output(pid)
            self.emit({"type": "exit", "pid": pid, "t": at, "code": code, "closed": closed, **kept})

        while not self.stop.is_set():
            gone = []
            for pid in list(self.ranks.known):
                if pid not in fds.values() and pid not in reported:
                    try:
                        fd = os.pidfd_open(pid)
                    except ProcessLookupError:
                        gone.append(pid)        # ended (and reaped) before it could be opened
                        continue
                    except (OSError, AttributeError):
                        continue
                    fds[fd] = pid
                    poller.register(fd, select.POLLIN)
            ended = poller.poll(200)
            codes.drain()               # every poll: the socket holds every process's exits
            for fd, _ in ended:
                pid = fds.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                report(pid)
            # Every rank it knew ends in one exit message (the watcher judges a run's ends once each
            # came): one gone before its pidfd was opened too, with what the kernel's records kept.
            for pid in gone:
                report(pid)
        codes.close()

    def shared_output(self, pid) -> bool:
        """Whether its output file is written by another process too: its launcher's (`torchrun >
        node.log`: every rank of the node inherits the file) or another rank's. The master then
        takes only the lines whose own prefix names it (`[rank3]: `): the others may be any rank's."""
        mine, parent = self.outputs.get(pid, (set(), set()))
        others = set(parent)
        for other, (files, _) in self.outputs.items():
            if other != pid:
                others |= files
        return bool(mine & others)

    def closed_since(self, gone):
        """For each other live rank: how many fewer TCP sockets it holds than the most it held (a
        socket its peer closed stays open, CLOSE_WAIT, until the rank closes it). A rank that had
        closed some when another ended was already on its way out."""
        now = held_sockets([p for p in list(self.ranks.known) if p != gone and p in self.held])
        return {pid: max(0, self.held[pid] - n) for pid, n in now.items()}

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
            counting = list(found) if rounds % CONNECTIONS_EVERY == 0 else [p for p in found if p not in self.settled]
            sockets = rank_sockets(counting, tables) if counting else {}
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
                    sample.update(self.keeper.sample(pid, now, self.ranks.stats, children))
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
