"""The lab: several "machines" on one Linux box, as network namespaces on a bridge."""

from .errors import LabError
from .faults import FAULTS, FaultSpec
from .lab import Lab

__all__ = ["FAULTS", "FaultSpec", "Lab", "LabError"]
