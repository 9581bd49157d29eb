"""A probe job under torchrun, ON a node: torchrun runs in this process (the node's own torchrun,
its own version) and starts every rank as `python -m ddp_preflight.node.jobs.<job>`, with this package's zip
on PYTHONPATH. Nothing is written but what torchrun writes in its own log folder, which goes
with the supervisor's private folder.

spec: {"job": "collectives" | "bandwidth" | "probes", "torchrun": [torchrun's options], "args": [the
       job's options], "bind": the master's address or null, "store_token": hex}
On the master node (node rank 0) torchrun's rendezvous store listens on `bind` only, not on
every interface: nobody on another network can reach the probe's store. On the network it is on,
anyone can: every value in it is signed with `store_token`, the same on every node of this job
and made for it alone (node/jobs/signed_store.py), and a value no process of the job wrote
ends the job with one INTERFERED line.

The ranks are this package's own code: their environment (torchrun's, which is this process's)
carries the key this program signs its lines with and the store's token."""

from __future__ import annotations

import os
import socket
import sys

from . import signing

JOBS = ("collectives", "bandwidth", "probes")
_held: list = []       # the store's listening sockets live as long as this process


def sign_the_store(token: bytes, address: str | None) -> None:
    """torchrun's static rendezvous store, signed with the job's token; on the master node it
    listens on `address` alone (torchrun creates it with is_master=True and no address to bind,
    so give it a socket already bound)."""
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static

    from .jobs.signed_store import SignedStore

    original = static.TCPStore

    def store(host_name, port, world_size=None, is_master=False, *args, **kwargs):
        if address and is_master and kwargs.get("master_listen_fd") is None:
            listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(512)
            _held.append(listener)
            kwargs["master_listen_fd"] = listener.fileno()
        # No "init/" counter (TCPStore's own count of the nodes that came, which a stranger can
        # set to anything): the rank assignment that follows waits for every node's signed key.
        kwargs["wait_for_workers"] = False
        return SignedStore(original(host_name, port, world_size, is_master, *args, **kwargs), token)

    # A function in the class's place, set in the module's namespace: the same to the type
    # checker with torch installed (a class is not assignable) and without (the module is Any).
    vars(static)["TCPStore"] = store


def main(spec: dict, work) -> int:
    if spec["job"] not in JOBS:
        raise ValueError(f"no probe job {spec['job']!r}")
    token = spec.get("store_token")
    if not token:
        raise ValueError("no store_token in the spec: the master makes one for each probe job")
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = work.zip_path + (os.pathsep + path if path else "")
    from .jobs import signed_store
    os.environ.update({**signing.child_environment(), signed_store.TOKEN_VARIABLE: token})
    sign_the_store(bytes.fromhex(token), spec.get("bind"))
    from torch.distributed.run import main as torchrun
    try:
        torchrun([*spec["torchrun"], "--log-dir", os.path.join(work.folder, "torchrun"),
                  "-m", f"ddp_preflight.node.jobs.{spec['job']}", *spec.get("args", [])])
    except BaseException:
        signed_store.stop_if_interfered("torchrun")     # its own reads of the store, before any rank's
        raise
    # torchrun's exit barrier logs what fails in it and goes on: a stranger's value it met there
    # (a counter) ends the job as interfered all the same.
    signed_store.stop_if_interfered("torchrun")
    # The ranks' lines are out and every rank has ended: this process's teardown with torch loaded
    # (its modules, torchrun's log tailing threads) holds the job's end and measures nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
