"""What counts as a training step in a rank's Python frames (hangwatch/alone.py): the call the
script's own line made into torch. Real processes read by the real py-spy: one that only builds
optimizers and layers (set-up, before a script creates its process group: never a step, though
torch.optim's constructor runs code named for steps), one that trains."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ddp_preflight.hangwatch.alone import training_step
from ddp_preflight.hangwatch.classify import frames_of
from ddp_preflight.node import pyspy

SETUP = """
import torch
params = [torch.nn.Parameter(torch.randn(64, 64)) for _ in range(200)]
print("up", flush=True)
while True:
    torch.optim.SGD(params, lr=0.1, momentum=0.9)
    torch.optim.AdamW(params, lr=0.1)
    torch.nn.Linear(256, 256)
"""

TRAINS = """
import torch
model = torch.nn.Linear(512, 512)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
print("up", flush=True)
while True:
    loss = model(torch.randn(64, 512)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _steps(code: str, dumps: int) -> list[str | None]:
    py_spy, _ = pyspy.find()
    if py_spy is None:
        pytest.fail("py-spy is not installed (make setup installs it)")
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline() == "up\n"
        found = []
        for _ in range(dumps):
            dump = pyspy.dump(py_spy, rank.pid, False)
            assert isinstance(dump, list), dump
            found.append(training_step(frames_of(dump)))
            time.sleep(0.05)
        return found
    finally:
        rank.kill()
        rank.wait()


def test_building_optimizers_and_layers_is_no_training_step():
    assert _steps(SETUP, 30) == [None] * 30


def test_a_training_loop_is_found_in_its_steps_at_its_own_lines():
    lines = {text: i for i, text in enumerate(TRAINS.splitlines(), 1) if text}
    expected = {f"a module's forward at <string>:{lines['    loss = model(torch.randn(64, 512)).pow(2).mean()']}",
                f"its optimizer at <string>:{lines['    optimizer.zero_grad()']}",
                f"backward at <string>:{lines['    loss.backward()']}",
                f"its optimizer at <string>:{lines['    optimizer.step()']}"}
    found = _steps(TRAINS, 30)
    assert set(found) - {None} <= expected, found
    assert len([f for f in found if f is not None]) >= 10, found      # most of a step is in torch
