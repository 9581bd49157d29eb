import time

import torch

a = torch.randn(64, 64)
end = time.monotonic() + 30
while time.monotonic() < end:     # a module that trains as it is imported (line 8, 9)
    a = torch.tanh(a @ a)
