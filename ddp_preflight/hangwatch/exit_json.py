"""A rank's exit as JSON holds it (result.json, an incident bundle), read back into one type."""

from __future__ import annotations

from ddp_preflight.node.protocol import ExitStatus

OLD_EXIT = {"exit code": "code", "signal": "signal"}


def exit_from_json(value) -> ExitStatus | None:
    """An exit as the JSON holds it ({"code", "signal"}). A bundle or result.json written before
    exits were typed holds its text ("exit code 1", "signal 9"): read here, once, as any input is."""
    if isinstance(value, dict):
        code, signal = value.get("code"), value.get("signal")
        return ExitStatus(code if isinstance(code, int) else None, signal if isinstance(signal, int) else None)
    if isinstance(value, str):
        words, _, number = value.strip().rpartition(" ")
        if words in OLD_EXIT and number.lstrip("-").isdigit():
            return ExitStatus(**{OLD_EXIT[words]: int(number)})
    return None
