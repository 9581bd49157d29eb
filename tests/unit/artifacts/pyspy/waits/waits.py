import os, sys, time, datetime, torch, torch.distributed as dist
mode = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
t = torch.ones(4)
class _AsyncWorkWrapper:
    def __init__(self, work): self._work = work
    def wait(self):
        self._work.wait()
        return None
def step():
    if mode == "work":
        w = _AsyncWorkWrapper(dist.all_reduce(t, async_op=True))
        w.wait()
    elif mode == "future":
        fut = dist.all_reduce(t, async_op=True).get_future()
        fut.wait()
    elif mode == "store":
        store = dist.distributed_c10d._get_default_store()
        store.get("never-set-key")
for i in range(3 if mode != 'store' else 0):
    step()
if rank == 1:
    print("LEFT", flush=True)
    time.sleep(120)
print("READY", os.getpid(), flush=True)
step()
