import time


def train():
    for step in range(3):
        pass
    time.sleep(600)                  # line 7: the loop is over (uneven data: it ran out of batches)


train()
