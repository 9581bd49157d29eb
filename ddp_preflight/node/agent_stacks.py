"""The agent's stacks (node/agent.py): each rank's py-spy dump, one reader at a time per rank,
staged in a stall (Python frames first, native frames after), with the Flight Recorders, the
sockets and the rendezvous stores of the ranks that wait in init_process_group. Standard library
only; a mixin of Agent, whose attributes it uses (ranks, py_spy, native, dumping, reading,
read_until, dumping_lock, one_reader, waits, last_stacks, emit)."""

from __future__ import annotations

import collections
import threading
import time

from . import flight, loops, proc, pyspy, store
from .ranks import Finder
from .sockets import socket_queues


def _each(work, pids) -> None:
    """work(pid) for every pid at once, each in a thread of its own; back when all are done."""
    threads = [threading.Thread(target=work, args=(p,)) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class Stacks:
    # Agent's, set in its __init__.
    ranks: Finder
    dumping_lock: threading.Lock
    reading: collections.Counter
    read_until: dict

    def emit(self, message) -> None:
        raise NotImplementedError

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
                before = getattr(proc.stat(p), "state", None)
                dump = self.dump(p, False if staged else how)
                # A stopped process another reader holds at that moment (py-spy of the agent's own
                # first stacks) reads "t", tracing stop; once read it is "T" again: either says so.
                stopped = staged and "T" in (before, getattr(proc.stat(p), "state", None))
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
