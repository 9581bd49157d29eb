import sys

for step in range(1000):
    print("step", step, flush=True)
    if step == 3:
        sys.stdin.readline()
