"""The catalogue's messages of a run that never started training (rules/failures.py joins them to
its CATALOGUE; explain/finding.py ranks them with the rest): a launcher that could not reach a node,
a torch build without what its launcher asked for, a Gloo interface that is not on this host. Each
is a cause by itself, the first thing that failed. Pure, standard library only; every wording is in a
log users pasted (tests/unit/artifacts/pasted/index.json says where from)."""

from __future__ import annotations

from .failure_kinds import Cause, FailureKind, Message, Part, _m
from .fix import change, run

K, C, P = FailureKind, Cause, Part

SETUP: tuple[Message, ...] = (
    # DeepSpeed's runner checks each hostfile node over ssh before it starts anything there (runner.py):
    # "Command 'ssh -o PasswordAuthentication=no HOST hostname' returned non-zero exit status 255", then
    # "host=HOST was not reachable via ssh"; its K8s form asks "hostname -I"
    _m("node-ssh-unreachable", ("reachable via ssh", "non-zero exit status 255"),
       r"host=(?P<host>\S+) was not reachable via ssh|Command '\[?'?ssh (?:-\S+ \S+ )*(?P<host2>[^\s']+) hostname"
       r"(?: -I)?'\]?'? returned non-zero exit status 255", K.NODE_NOT_STARTED, C.NODE_ERROR, P.ROOT,
       "the launcher could not ssh to a node of its hostfile, so no rank started there",
       run("ssh -o BatchMode=yes HOST hostname",
           note="from the launching node, to each hostfile node (itself too): passwordless ssh must work (ssh-copy-id)")),
    # torch 2.4+ asks TCPStore for libuv by default; the Windows wheels are built without it
    _m("libuv-not-built", ("use_libuv",), r"use_libuv was requested but PyTorch was build without libuv support",
       K.EXITED, C.LIBUV_NOT_BUILT, P.ROOT,
       "the store was asked for libuv, which this torch build lacks (the Windows wheels): the launcher never started",
       change("export USE_LIBUV=0 before torchrun (or init_method='env://?use_libuv=0'); on Windows, backend='gloo'")),
    # gloo's transport/tcp/device.cc: "ifa != nullptr" is its lookup of GLOO_SOCKET_IFNAME's interface,
    # "rp != nullptr" its lookup of the hostname (rules/failures.py's gloo-hostname)
    _m("gloo-interface", ("ifa != nullptr",), r"ifa != nullptr\. Unable to find address for:? ?(?P<iface>\S+)",
       K.GLOO_ADDRESS, C.GLOO_INTERFACE, P.ROOT,
       "GLOO_SOCKET_IFNAME names an interface that has no address on this node",
       change("export GLOO_SOCKET_IFNAME=<this node's LAN interface, as `ip -br addr` lists it> on each node")),
)
