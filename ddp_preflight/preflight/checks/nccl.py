"""nccl-parity and nccl-env: the same NCCL and a driver new enough on every node, and NCCL
settings that name what each node has and agree across nodes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ddp_preflight.rules.environment import env_fix, env_of
from ddp_preflight.rules.facts import DriverView, GpuFacts, Hca, Missing, NcclConf, TorchFacts
from ddp_preflight.rules.fix import Fix, change, on_node, run
from ddp_preflight.rules.routes import toward_master

from ..model import Context, NodeFacts, Status, Verdict
from .common import python_of
from .gpu import Finding, cpu_run, driver_of


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _driver_findings(node: NodeFacts, torch: TorchFacts, driver: DriverView | Missing) -> list[Finding]:
    runtime = torch.cuda
    driver_cuda = None if isinstance(driver, Missing) else driver.cuda_driver_version
    if not runtime or not driver_cuda or isinstance(driver, Missing):
        return []
    have, need = _version(driver_cuda), _version(runtime)
    fix = change(f"on {node.node}, install an NVIDIA driver for CUDA {runtime} or newer (it has "
                 f"{driver.driver_version or '?'}, for CUDA {driver_cuda}); "
                 "nvidia-smi's header shows the CUDA a driver supports", node.node)
    if have[:1] < need[:1]:
        return [Finding(Status.FAIL, f"{node.node}'s driver supports CUDA {driver_cuda} but torch is built for CUDA {runtime}: "
                        "CUDA does not start there ('The NVIDIA driver on your system is too old')", fix)]
    if have < need:
        # CUDA's minor version compatibility runs most of it; kernels JIT-compiled from PTX do not.
        return [Finding(Status.WARN, f"{node.node}'s driver supports CUDA {driver_cuda}, older than torch's CUDA {runtime}: "
                        "it runs through minor version compatibility, except kernels compiled from PTX", fix)]
    return []


def _nccl_fix(node: NodeFacts, master: TorchFacts) -> Fix:
    wheel = master.nccl_wheel
    if wheel:
        return on_node(node.node, f"{python_of(node)} -m pip install {wheel.name}=={wheel.version}")
    return change(f"install the master's torch build on {node.node} ({master.version}), with the NCCL it brings", node.node)


def check_nccl_parity(ctx: Context) -> Iterator[Verdict]:
    skip = cpu_run(ctx)
    if skip:
        yield skip
        return
    master_torch = ctx.master.parsed.torch
    master = None if isinstance(master_torch, Missing) else master_torch
    nccl_run = ctx.options.backend == "nccl"
    for node in ctx.reachable:
        torch, driver = node.parsed.torch, driver_of(node)
        if isinstance(torch, Missing) or torch.build != "cuda":
            yield Verdict(Status.SKIP, node.node, f"no CUDA build of torch on {node.node} (see device-dtype)")
            continue
        view = None if isinstance(driver, Missing) else driver
        details = {"nccl_version": torch.nccl_version, "nccl_library": torch.nccl_library,
                   "nccl_wheel": torch.nccl_wheel.to_json() if torch.nccl_wheel else None, "torch_cuda": torch.cuda,
                   "driver_version": view.driver_version if view else None,
                   "cuda_driver_version": view.cuda_driver_version if view else None,
                   "master_nccl_version": master.nccl_version if master else None,
                   "master_torch_cuda": master.cuda if master else None}
        findings = _driver_findings(node, torch, driver)
        if nccl_run and node is not ctx.master and master:
            ours, theirs = torch.nccl_version, master.nccl_version
            if ours and theirs and ours != theirs:
                findings.append(Finding(Status.FAIL, f"NCCL {ours} on {node.node}, {theirs} on the master: ranks with "
                                        "different NCCL versions fail or hang at init (NVIDIA/nccl#1267)",
                                        _nccl_fix(node, master)))
            if master.cuda and torch.cuda != master.cuda:
                findings.append(Finding(Status.WARN, f"torch on {node.node} is built for CUDA {torch.cuda}, "
                                        f"the master's for CUDA {master.cuda} (see torch-parity)",
                                        change(f"install the same wheel on every node ({master.version})")))
        if findings:
            worst = max(findings, key=lambda f: f.status.severity)
            yield Verdict(worst.status, node.node, "; ".join(f.text for f in findings),
                          next(f.fix for f in findings if f.status is worst.status), details)
            continue
        driver_cuda = view.cuda_driver_version if view else None
        if not driver_cuda and not (nccl_run and torch.nccl_version):
            yield Verdict(Status.SKIP, node.node, f"nothing to compare: {node.node}'s NCCL version and its driver's "
                          "CUDA version were not collected", None, details)
            continue
        known = [f"NCCL {torch.nccl_version}" if torch.nccl_version else "NCCL version not collected",
                 f"torch built for CUDA {torch.cuda}",
                 f"driver {(view.driver_version if view else None) or '?'} for CUDA {driver_cuda}"
                 if driver_cuda else "driver's CUDA version not collected"]
        same = ", same as the master" if nccl_run and node is not ctx.master and master and master.nccl_version else ""
        yield Verdict(Status.PASS, node.node, ", ".join(known) + same, None, details)


# --- nccl-env ----------------------------------------------------------------------------------

def _gpu(node: NodeFacts) -> GpuFacts | None:
    gpu = node.parsed.gpu
    return None if isinstance(gpu, Missing) else gpu


def _nccl_conf(node: NodeFacts) -> NcclConf | None:
    gpu = _gpu(node)
    return None if gpu is None or isinstance(gpu.nccl_conf, Missing) else gpu.nccl_conf


def _infiniband(node: NodeFacts) -> tuple[Hca, ...] | None:
    """The node's HCAs; None when not collected."""
    gpu = _gpu(node)
    return None if gpu is None or isinstance(gpu.infiniband, Missing) else gpu.infiniband


def setting(node: NodeFacts, name: str) -> str | None:
    """An NCCL variable as NCCL will read it: the environment, else nccl.conf."""
    value = env_of(node).get(name)
    if value is not None:
        return value
    conf = _nccl_conf(node)
    return conf.values.get(name) if conf else None


def nccl_matches(spec: str, names: list[str]) -> list[str]:
    """The names an NCCL list selects: prefixes, separated by commas; `^` first excludes them,
    `=` (after any `^`) makes them exact names. NCCL_IB_HCA entries may add `:port`."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    wanted = [item.split(":")[0].strip() for item in body.split(",") if item.strip()]

    def listed(name: str) -> bool:
        return any(name == w if exact else name.startswith(w) for w in wanted)
    return [n for n in names if listed(n) != exclude]


def _pin(name: str, names: list[str]) -> str:
    """NCCL_SOCKET_IFNAME's value for exactly this interface: a plain prefix unless it is the
    start of another name (eth1 would also select eth10)."""
    return name if not any(n != name and n.startswith(name) for n in names) else f"={name}"


@dataclass(frozen=True)
class Network:
    kind: str          # "IB" (InfiniBand or RoCE), "Socket" (TCP), or a plugin's NCCL_NET name
    why: str


def usable_hcas(node: NodeFacts) -> list[str] | None:
    """HCAs with an active port that NCCL_IB_HCA lets NCCL use; None when not collected."""
    hcas = _infiniband(node)
    if hcas is None:
        return None
    active = [h.name for h in hcas if any(p.state == "ACTIVE" for p in h.ports)]
    spec = setting(node, "NCCL_IB_HCA")
    return nccl_matches(spec, active) if spec else active


def network(node: NodeFacts) -> Network | None:
    """The network NCCL picks on this node for traffic between nodes."""
    net = setting(node, "NCCL_NET")
    if net and net.lower() == "socket":
        return Network("Socket", "NCCL_NET=Socket")
    if net and net.lower() != "ib":
        return Network(net, f"NCCL_NET={net}")
    if setting(node, "NCCL_IB_DISABLE") == "1":
        return Network("Socket", "NCCL_IB_DISABLE=1")
    hcas = usable_hcas(node)
    if hcas is None:
        return None
    if hcas:
        return Network("IB", f"HCA {', '.join(hcas)}")
    return Network("Socket", "no active InfiniBand or RoCE HCA" + (" (NCCL_NET=IB finds none)" if net else ""))


WORDS = {"IB": "InfiniBand", "Socket": "TCP sockets"}
# Transports within a node: a difference makes one node slower, not the run fail.
INTRA_NODE = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")


def _up_names(node: NodeFacts) -> list[str]:
    """Interfaces NCCL can bind: up, with an address."""
    network = node.parsed.network
    return [] if isinstance(network, Missing) else [i.name for i in network.interfaces if i.up and i.addresses]


def _ifname_findings(ctx: Context, node: NodeFacts) -> list[Finding]:
    spec = setting(node, "NCCL_SOCKET_IFNAME")
    if not spec:
        return []
    names = _up_names(node)
    matched = nccl_matches(spec, names)
    route = toward_master(ctx, node)
    fix = env_fix(ctx, node.node, [("NCCL_SOCKET_IFNAME", _pin(route.name, names))]) if route else None
    if matched:
        return []
    return [Finding(Status.FAIL, f"NCCL_SOCKET_IFNAME={spec} selects no interface with an address on {node.node} "
                    f"(it has {', '.join(names) or 'none'}): NCCL stops at init with 'no socket interface found'", fix)]


def _hca_findings(ctx: Context, node: NodeFacts) -> list[Finding]:
    spec, hcas = setting(node, "NCCL_IB_HCA"), _infiniband(node)
    if not spec or hcas is None:
        return []
    names = [h.name for h in hcas]
    if nccl_matches(spec, names):
        return []
    fix = (env_fix(ctx, node.node, [("NCCL_IB_HCA", ",".join(names))]) if names
           else run("unset NCCL_IB_HCA", node.node, f"on {node.node}: it has no HCA"))
    return [Finding(Status.WARN, f"NCCL_IB_HCA={spec} names no HCA on {node.node} (it has "
                    f"{', '.join(names) or 'none'}): NCCL leaves InfiniBand out there", fix)]


def _cross_node_findings(ctx: Context, node: NodeFacts, master: NodeFacts) -> list[Finding]:
    found = []
    ours, theirs = network(node), network(master)
    if ours and theirs and ours.kind != theirs.kind:
        lacking = node.node if theirs.kind == "IB" else master.node
        found.append(Finding(Status.FAIL, f"NCCL will use {WORDS.get(ours.kind, ours.kind)} on {node.node} ({ours.why}) "
                             f"but {WORDS.get(theirs.kind, theirs.kind)} on the master ({theirs.why}): ranks on different "
                             "networks do not connect, init hangs (NVIDIA/nccl#234)",
                             env_fix(ctx, None, [("NCCL_IB_DISABLE", "1")],
                                     note=f"for TCP everywhere; or give {lacking} a working HCA")))
    for name in INTRA_NODE:
        if setting(node, name) != setting(master, name):
            found.append(Finding(Status.WARN, f"{name}={setting(node, name)} on {node.node}, "
                                 f"{setting(master, name)} on the master: one node's GPUs talk another way, and slower",
                                 change(f"the same {name} on every node")))
    return found


def check_nccl_env(ctx: Context) -> Iterator[Verdict]:
    skip = cpu_run(ctx)
    if skip:
        yield skip
        return
    if ctx.options.backend != "nccl":
        yield Verdict(Status.SKIP, None, f"not an NCCL run (--backend {ctx.options.backend})")
        return
    multi = len(ctx.reachable) > 1 and ctx.master.error is None
    for node in ctx.reachable:
        findings = _ifname_findings(ctx, node) + _hca_findings(ctx, node)
        if multi and node is not ctx.master:
            findings += _cross_node_findings(ctx, node, ctx.master)
        net = network(node)
        variables = {k: v for k, v in env_of(node).items() if k.startswith("NCCL_")}
        conf = _nccl_conf(node)
        details = {"env": variables, "nccl_conf": conf.to_json() if conf else {},
                   "network": net.kind if net else None,
                   "infiniband": [h.to_json() for h in _infiniband(node) or ()]}
        if findings:
            worst = max(findings, key=lambda f: f.status.severity)
            yield Verdict(worst.status, node.node, "; ".join(f.text for f in findings),
                          next(f.fix for f in findings if f.status is worst.status), details)
            continue
        yield Verdict(Status.PASS, node.node, _settings_seen(node, net if multi else None, multi), None, details)


def _settings_seen(node: NodeFacts, net: Network | None, multi: bool) -> str:
    parts = []
    if multi:
        parts.append(f"NCCL between nodes over {WORDS.get(net.kind, net.kind)} ({net.why})" if net else
                     f"NCCL's network between nodes not known (no InfiniBand facts from {node.node})")
    ifname, hca = setting(node, "NCCL_SOCKET_IFNAME"), setting(node, "NCCL_IB_HCA")
    if ifname:
        parts.append(f"NCCL_SOCKET_IFNAME={ifname} selects {', '.join(nccl_matches(ifname, _up_names(node)))}")
    if hca:
        hcas = [h.name for h in _infiniband(node) or ()]
        parts.append(f"NCCL_IB_HCA={hca} selects {', '.join(nccl_matches(hca, hcas)) or '?'}")
    return "; ".join(parts) or "no NCCL_SOCKET_IFNAME or NCCL_IB_HCA to check on one node"
