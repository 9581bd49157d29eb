"""A probe job under torchrun, ON a node: torchrun runs in this process (the node's own torchrun,
its own version) and starts every rank as `python -m node.jobs.<job>`, with this package's zip
on PYTHONPATH. Nothing is written but what torchrun writes in its own log folder, which goes
with the supervisor's private folder.

spec: {"job": "collectives" | "bandwidth", "torchrun": [torchrun's options], "args": [the
       job's options], "bind": the master's address or null}
On the master node (node rank 0) torchrun's rendezvous store listens on `bind` only, not on
every interface: nobody on another network can reach the probe's store."""

from __future__ import annotations

import os
import socket

JOBS = ("collectives", "bandwidth")
_held: list = []       # the store's listening sockets live as long as this process


def bind_store_to(address: str) -> None:
    """Make the master's rendezvous store listen on `address` alone: torchrun's static rendezvous
    creates it with is_master=True and no address to bind, so give it a socket already bound."""
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static

    original = static.TCPStore

    def store(host_name, port, world_size=None, is_master=False, *args, **kwargs):
        if is_master and kwargs.get("master_listen_fd") is None:
            listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(512)
            _held.append(listener)
            kwargs["master_listen_fd"] = listener.fileno()
        return original(host_name, port, world_size, is_master, *args, **kwargs)

    static.TCPStore = store  # type: ignore[misc,assignment]


def main(spec: dict, work) -> int:
    if spec["job"] not in JOBS:
        raise ValueError(f"no probe job {spec['job']!r}")
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = work.zip_path + (os.pathsep + path if path else "")
    if spec.get("bind"):
        bind_store_to(spec["bind"])
    from torch.distributed.run import main as torchrun
    torchrun([*spec["torchrun"], "--log-dir", os.path.join(work.folder, "torchrun"),
              "-m", f"node.jobs.{spec['job']}", *spec.get("args", [])])
    return 0
