"""The agent's exits (node/agent.py): the moment each rank exits, its code, the sockets its peers
closed, and whether its output file is shared. Standard library only; a mixin of Agent, whose
attributes it uses (ranks, stop, held, outputs, keeper, keeping, ended_at, emit)."""

from __future__ import annotations

import os
import time

from . import proc
from .sockets import held_sockets


class Exits:
    outputs: dict             # Agent's, set in its __init__

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
