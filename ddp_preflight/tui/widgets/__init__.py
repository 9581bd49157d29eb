"""The dashboard's panels; each shows one part of a snapshot and reads nothing else."""

from .cluster import ClusterHeader
from .diagnosis import DiagnosisPanel
from .preflight import PreflightPanel
from .ranks import RanksTable

__all__ = ["ClusterHeader", "DiagnosisPanel", "PreflightPanel", "RanksTable"]
