"""OS, Python, CPU, memory, environment, clock (node/facts/system.py; the clock is the master's
measure, transport/node.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .read import flag, number, required, strings, text, texts, whole


@dataclass(frozen=True)
class OsFacts:
    hostname: str | None         # None: not said
    system: str | None = None    # "Linux"
    kernel: str | None = None
    distro: str | None = None    # /etc/os-release's PRETTY_NAME; None: no such file
    machine: str | None = None   # "x86_64"
    boot_id: str | None = None   # the running kernel's boot (/proc/sys/kernel/random/boot_id): one machine's

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> OsFacts:
        return cls(text(wire, "hostname"), text(wire, "system"), text(wire, "kernel"), text(wire, "distro"),
                   text(wire, "machine"), text(wire, "boot_id"))


@dataclass(frozen=True)
class PythonFacts:
    version: str                 # "3.11.7"
    executable: str | None       # the training Python's path; None: not said
    implementation: str | None = None
    venv: bool = False

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> PythonFacts:
        return cls(required(text(wire, "version"), "version"), text(wire, "executable"),
                   text(wire, "implementation"), flag(wire, "venv"))


@dataclass(frozen=True)
class CpuFacts:
    logical_cores: int
    physical_cores: int
    usable_cores: int | None     # this process's CPU affinity (cgroups, taskset); None: not said
    model: str | None = None
    bf16_instructions: tuple[str, ...] = ()    # of avx512_bf16, amx_bf16
    flags: tuple[str, ...] = ()                # the avx, amx, fma and sse4 ones
    load_1m: float | None = None               # the kernel's load average over the last minute (runnable
                                               # processes); None: not said (an older collector)
    runnable: int | None = None                # processes runnable as the facts were read, the reader too

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> CpuFacts:
        return cls(required(whole(wire, "logical_cores"), "logical_cores"),
                   required(whole(wire, "physical_cores"), "physical_cores"), whole(wire, "usable_cores"),
                   text(wire, "model"), texts(wire, "bf16_instructions"), texts(wire, "flags"),
                   number(wire, "load_1m"), whole(wire, "runnable"))

    @property
    def load_per_cpu(self) -> float | None:
        """Runnable processes per CPU this node's processes may use: above 1, each waits its turn."""
        if self.load is None:
            return None
        return self.load / max(1, self.usable_cores or self.logical_cores)

    @property
    def load(self) -> float | None:
        """The load now: the minute's mean, or the runnable processes (less the reader) where more."""
        known = [x for x in (self.load_1m, None if self.runnable is None else self.runnable - 1) if x is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class MemoryFacts:
    total_bytes: int | None      # None: /proc/meminfo did not say
    available_bytes: int | None

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> MemoryFacts:
        return cls(whole(wire, "total_bytes"), whole(wire, "available_bytes"))


def env_vars(wire: Mapping[str, Any]) -> Mapping[str, str]:
    """The env section: the variables that decide binding, threads and dtypes (secrets redacted)."""
    return strings(wire, "vars")


@dataclass(frozen=True)
class Clock:
    offset: float                # in seconds: the node's clock minus this machine's
    uncertainty: float = 0.0     # in seconds: half the round trip (0: not said)

    @classmethod
    def from_json(cls, wire: Mapping[str, Any]) -> Clock:
        return cls(required(number(wire, "offset"), "offset"), number(wire, "uncertainty") or 0.0)
