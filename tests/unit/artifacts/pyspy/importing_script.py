import torch

layer = torch.nn.Linear(8, 8)
dynamo = torch._dynamo            # torch's lazy import of torch._dynamo, as DDP's constructor makes it
print("imported", flush=True)
