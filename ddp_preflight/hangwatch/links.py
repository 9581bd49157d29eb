"""The watcher's line to each node's agent (node/agent.py): the agent program over the node's
transport (an SSH channel, or a local process; no extra open port), AGENT lines in, commands out.
The transport's heartbeats keep the agent alive; closing the line ends it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ddp_preflight.node import protocol
from ddp_preflight.transport import Node, Program
from ddp_preflight.transport.errors import explain_python

OnMessage = Callable[[str, dict], None]       # (node, message)
OnClosed = Callable[[str, str | None], None]  # (node, why or None for a clean end)
LEASE = 30.0      # seconds an agent keeps watching without hearing from the watcher (default)


class AgentLink:
    """One node's agent. Lines it prints become messages; `send` writes a command to it;
    `close` ends its stdin, and the agent exits."""

    def __init__(self, node: Node, on_message: OnMessage, on_closed: OnClosed):
        self.node, self.on_message, self.on_closed = node, on_message, on_closed
        self.program: Program | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def start(self, spec: dict) -> None:
        self.program = self.node.start({"lease": LEASE, **spec, "program": "agent"}, keep_input=True,
                                       keep_marked=False, on_line=self._line)
        threading.Thread(target=self._ended, name=f"agent-{self.name}", daemon=True).start()

    def send(self, command: dict) -> bool:
        return self.program is not None and self.program.send(command)

    def close(self) -> None:
        if self.program is not None:
            self.program.stop()

    def _line(self, line: str) -> None:
        message = protocol.parse(line, protocol.AGENT)
        if isinstance(message, dict):
            self.on_message(self.name, message)

    def _ended(self) -> None:
        assert self.program is not None
        result = self.program.wait()
        why = None
        if result is not None:
            lines = result.stderr.strip().splitlines()
            last = lines[-1] if lines else None
            why = result.error or (last if result.exit not in (0, None) else None)
            if result.exit not in (0, None) and any(line.startswith(protocol.PYTHON) for line in lines):
                # What --python is, or why it was refused: said as preflight says it, with the fix.
                error = explain_python(self.name, self.node.python, result.exit, result.stderr, ran=False)
                why = f"{error.summary.removeprefix(self.name + ': ')}; fix: {error.fix}"
        self.on_closed(self.name, why)
