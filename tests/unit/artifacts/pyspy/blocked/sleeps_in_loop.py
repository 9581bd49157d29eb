import time


def train():
    for step in range(1000):
        if step == 3:
            time.sleep(600)          # line 7: asleep inside the loop (a wait for a file, a back-off)


train()
