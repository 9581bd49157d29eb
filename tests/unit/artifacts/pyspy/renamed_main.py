import threading
import time


def helper():
    while True:
        time.sleep(1)                                   # a helper thread: it sleeps, as a logger's does


threading.Thread(target=helper, name="helper", daemon=True).start()
threading.current_thread().name = "trainer"             # the script renames its main thread
lock = threading.Lock()
lock.acquire()
print("ready", flush=True)
lock.acquire()                                          # line 15: a lock nobody releases
