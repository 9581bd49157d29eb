"""The one way the master reaches nodes: a Node (local or over SSH) that starts node programs
and streams their lines. Only this package knows fabric and paramiko."""

from .errors import NodeError, explain_connect, explain_python
from .local import LocalNode
from .node import JobResult, Node, Program, ProgramResult, RunningJob
from .ssh import SshNode

__all__ = ["JobResult", "LocalNode", "Node", "NodeError", "Program", "ProgramResult", "RunningJob",
           "SshNode", "explain_connect", "explain_python"]
