"""Why a probe's job failed, when another check saw the cause: the failures the fact and network
checks report on the same facts, the ones that fit the symptom first. When none does, the
failure is quoted as the backend said it, its cause "not known", and no fix is offered: a fix
for a cause nobody saw sends people the wrong way (issue 13: open the firewall, after a CUDA
error on a host with one GPU for two ranks)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ddp_preflight.rules import failures as catalogue
from ddp_preflight.rules.facts import Missing
from ddp_preflight.rules.failures import Cause as MessageCause
from ddp_preflight.rules.failures import FailureKind
from ddp_preflight.rules.fix import Fix, change, run
from ddp_preflight.rules.routes import toward_master

from ..model import Context, Status, Verdict

# Which checks can explain which symptom, the most likely first. A GPU error is explained by
# what the GPU checks saw, never by the network.
CAUSES_FOR = {
    "family": ("address-family", "interface-choice"),
    "timeout": ("ephemeral-ports", "interface-choice", "address-family", "master-reachable"),
    "rendezvous": ("master-reachable", "master-port", "interface-choice"),
    "other": ("address-family", "interface-choice", "ephemeral-ports", "master-reachable"),
    "gpu": ("gpu-visible", "device-dtype", "nccl-parity", "gpu-memory-held", "gpu-health"),
    "no rank": (),
}
NETWORK = ("address-family", "interface-choice", "master-port")      # from facts alone
PROBED = ("ephemeral-ports", "master-reachable")                     # need the network probe

# What a CUDA or NCCL error says of itself: the one catalogue's words (rules/failures.py GPU_WORDS).
GPU_WORDS = catalogue.GPU_WORDS

NOT_KNOWN = "the cause is not known"


@dataclass(frozen=True)
class Cause:
    """Another check's failure that may explain a probe's: its id, node, summary and fix."""
    check: str
    node: str | None
    summary: str
    fix: Fix | None

    def to_json(self) -> dict:
        return {"check": self.check, "node": self.node, "summary": self.summary,
                "fix": None if self.fix is None else self.fix.text()}


def is_gpu_error(error: str) -> bool:
    return any(word in error for word in GPU_WORDS)


# What each kind of catalogued failure message (rules/failures.py, the one catalogue explain and
# hangwatch read too) points at here.
SYMPTOMS = {FailureKind.ADDRESS_FAMILY: "family", FailureKind.NCCL_ERROR: "gpu", FailureKind.OOM_CUDA: "gpu",
            FailureKind.STORE_TIMEOUT: "rendezvous", FailureKind.GLOO_ADDRESS: "other"}


def symptom_of(error: str, timed_out: bool = False) -> str:
    """What a failed job's own error (or its bound) points at, for likely_causes: the catalogue's
    word on it first, then the words of a backend's errors it does not hold."""
    if timed_out:
        return "timeout"
    for found in catalogue.find(error):
        symptom = SYMPTOMS.get(found.message.kind)
        if found.message.cause is MessageCause.MASTER_PORT:
            symptom = "rendezvous"
        if symptom is not None:
            return symptom
    if catalogue.says("address-family", error):
        return "family"
    if is_gpu_error(error):
        return "gpu"
    if any(word in error for word in catalogue.RENDEZVOUS_WORDS):
        return "rendezvous"
    return "other"


def likely_causes(ctx: Context, symptom: str) -> list[Cause]:
    """Failures the other checks report, most relevant to this symptom first."""
    if not CAUSES_FOR[symptom]:
        return []      # the job itself broke: no fact explains that
    if symptom == "gpu":
        return _failures(ctx, CAUSES_FOR["gpu"]) if ctx.options.device == "cuda" else []
    checks = NETWORK + (PROBED if ctx.probes.get("network") and "error" not in ctx.probes["network"] else ())
    found = _failures(ctx, [c for c in CAUSES_FOR[symptom] if c in checks] +
                      [c for c in checks if c not in CAUSES_FOR[symptom]])
    if symptom in ("timeout", "other") and "ephemeral-ports" not in checks:
        # Without the network probe, a node's own firewall facts still point at the drop.
        found += firewalls(ctx)
    return found


def _failures(ctx: Context, names) -> list[Cause]:
    from . import BY_ID  # the registry imports the checks that import this: look it up when asked

    found = []
    for name in names:
        try:
            found += [Cause(name, v.node, v.summary, v.fix) for v in BY_ID[name].run(ctx) if v.status == Status.FAIL]
        except Exception:     # a cause we cannot name is not this check's failure
            continue
    return found


def because(causes: list[Cause], unexplained: str = NOT_KNOWN) -> tuple[str, Fix | None]:
    """The words that follow a failure's own message, and the fix: the first cause's, or none."""
    if not causes:
        return f"; {unexplained}", None
    c = causes[0]
    return f"; likely cause: {c.check}{' on ' + c.node if c.node else ''}: {c.summary}", c.fix


def firewalls(ctx: Context) -> list[Cause]:
    out = []
    for node in ctx.reachable:
        net = node.parsed.network
        if isinstance(net, Missing) or isinstance(net.firewall, Missing):
            continue
        fw = net.firewall
        if not (fw.input_drops or fw.input_policy_drop):
            continue
        low, high = net.ephemeral_ports or (32768, 60999)
        iface = toward_master(ctx, node)
        subnet = next((str(ipaddress.ip_network(f"{a.address}/{a.prefixlen}", strict=False))
                       for a in (iface.addresses if iface else ()) if a.scope == "global"), None)
        drops = "a drop policy" if fw.input_policy_drop else f"{fw.input_drops} drop rule(s)"
        out.append(Cause("firewall", node.node,
                         f"{node.node}'s {fw.tool or 'firewall'} drops some new inbound connections "
                         f"({drops}); Gloo listens on ephemeral ports ({low}-{high}) there (see ephemeral-ports)",
                         run(f"on {node.node}: sudo ufw allow {f'from {subnet} ' if subnet else ''}proto tcp "
                             f"to any port {low}:{high}", node.node)))
    return out


def unfinished(probe: str, node: str, why: str, load_per_cpu: float | None, details: dict) -> Verdict:
    """A probe's job that did not end by itself (our stop, its supervisor's, a signal from outside):
    who ended it, and no verdict on the network. The fix only where its node's load was seen
    above its CPUs: the probe's bounds grew with that load, and it still did not finish."""
    fix = None
    if load_per_cpu is not None and load_per_cpu > 1:
        fix = change(f"on {node}: find what keeps its CPUs busy (top -o %CPU), and run preflight again once its "
                     "load is below its CPUs", node)
    return Verdict(Status.ERROR, None, f"{probe} could not finish on {node}: {why}", fix, {"failed": details})
