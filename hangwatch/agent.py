"""The per-node agent. Runs ON a node with the training Python (standard library only; psutil
if the training environment has it), started over SSH with this file's source as `python -c`.

It finds the training ranks, samples each one's CPU (process and threads), kernel wait channel
and state every second, takes Python stacks with py-spy when asked (all ranks at once) and,
rarely, on its own, and streams JSON lines on stdout. Commands come as JSON lines on stdin;
EOF on stdin means the watcher is gone, and the agent exits. It never signals a rank: py-spy's
dump pauses a rank for a few milliseconds, and that is all.

argv[1] is base64 JSON: {"pids": [..], "interval": 1.0, "stack_every": 120.0, "py_spy": path|null,
"native": false, "node": name}.
Lines out: {"type": "hello", ..., "py_spy": path|null, "py_spy_refused": why|null},
{"type": "sample", "t", "ranks": [...], "net": bytes/s}, {"type": "stacks", "t", "id", "stacks":
{pid: dump | {"error": ...}}}, {"type": "py-spy", "path", "given", "refused"} (after a py-spy
command), {"type": "error", ...}.
"""

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")
RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
             "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
             "OMP_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG")
OPAQUE = ("torch/autograd/", "torch/_ops.py", "torch/_tensor.py")
TORCHRUN = ("torch.distributed.run", "torchrun", "torch/distributed/run.py")


def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def proc_stat(pid):
    """(state, ppid, cpu seconds, start ticks, exit code if a zombie) or None if gone."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rindex(")") + 2:].split()
    exit_code = int(fields[49]) if len(fields) > 49 else None
    return fields[0], int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[19]), exit_code


def thread_cpu(pid):
    """Each thread's cpu seconds, by tid."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/stat")
        if text:
            fields = text[text.rindex(")") + 2:].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def environ(pid):
    """The process's environment, or None when we may not read it (another user's process)."""
    try:
        raw = _read(f"/proc/{pid}/environ", "rb")
    except PermissionError:
        return None
    if raw is None:          # it is gone (or a kernel thread): nothing to read, nothing hidden
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def cmdline(pid):
    raw = _read(f"/proc/{pid}/cmdline", "rb") or b""
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def redact(env):
    """The environment as it may leave the node: secrets hidden by name and by value, by the
    rules of preflight/redact.py, which hangwatch/links.py ships ahead of this source."""
    try:
        rules = redact_env        # noqa: F821 (defined by the shipped rules)
    except NameError:             # imported on the master, where the package is at hand
        from preflight.redact import redact_env as rules
    return rules(env)


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class Ranks:
    """The training ranks on this node: torchrun's children and processes whose environment has
    RANK and LOCAL_RANK, plus any pid given. A rank's own children (DataLoader workers, compile
    workers) inherit RANK and are not ranks. Restarts are new pids and are picked up."""

    def __init__(self, pids):
        self.given = set(pids)
        self.netns = _netns(os.getpid())
        self.known = {}        # pid -> info dict (fixed for the process's life)
        self.seen = set()      # (pid, start) already looked at and found not a rank

    def scan(self):
        found = {}
        uptime = float((_read("/proc/uptime") or "0").split()[0])
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == os.getpid():
                continue
            stat = proc_stat(pid)
            if stat is None:
                continue
            key = (pid, stat[3])
            if key in self.seen:
                continue
            if pid in self.known and self.known[pid]["start"] == stat[3]:
                found[pid] = self.known[pid]
                continue
            info = self._look(pid, stat)
            # A process younger than 2 s may not have exec'd yet (torchrun forks, then execs the
            # rank with its RANK): look at it again next time.
            if info is not None:
                found[pid] = info
            elif uptime - stat[3] / TICK > 2.0:
                self.seen.add(key)
        # A rank's children carry the same RANK: keep only the outermost.
        for pid in [p for p, i in found.items() if i["ppid"] in found and p not in self.given]:
            self.seen.add((pid, found.pop(pid)["start"]))
        self.known = found
        return found

    def _look(self, pid, stat):
        # Another network namespace is another machine as far as training goes (a container, a
        # lab node): its ranks are that node's agent's to watch.
        netns = _netns(pid)        # None: another user's process; then we cannot tell, so look
        if pid not in self.given and netns is not None and netns != self.netns:
            return None
        env = environ(pid)
        readable = env is not None
        argv = cmdline(pid)
        parent = cmdline(stat[1])
        under_torchrun = any(t in " ".join(parent) for t in TORCHRUN)
        is_torchrun = any(t in " ".join(argv) for t in TORCHRUN)
        has_rank = env is not None and "RANK" in env and "LOCAL_RANK" in env
        if pid not in self.given and (is_torchrun or not (has_rank or (under_torchrun and env is None))):
            return None
        env = env or {}
        return {"pid": pid, "ppid": stat[1], "start": stat[3], "argv": argv[:12],
                "rank": _int(env.get("RANK")), "local_rank": _int(env.get("LOCAL_RANK")),
                "world_size": _int(env.get("WORLD_SIZE")),
                "master": f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '')}" if "MASTER_ADDR" in env else None,
                "env_readable": readable,
                "env": redact(env)}


def _netns(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def net_bytes():
    """All non-loopback interfaces' received + sent bytes in this network namespace."""
    total = 0
    for line in (_read("/proc/net/dev") or "").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        fields = rest.split()
        total += int(fields[0]) + int(fields[8])
    return total


def find_py_spy(given):
    """(the py-spy to run, why the one given was refused or None). The one given (the watcher's,
    or copied here for this watch) is run only if no other user can have placed or changed it;
    else the training environment's own, as its Python is trusted."""
    refused, real = None, None
    if given:
        real = os.path.realpath(given)
        refused = _not_trusted(real)
        if refused is None and os.access(real, os.X_OK):
            return real, None
    for path in (os.path.join(os.path.dirname(sys.executable), "py-spy"), shutil.which("py-spy"),
                 os.path.expanduser("~/.local/bin/py-spy")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK) and os.path.realpath(path) != real:
            return path, refused
    return None, refused


def _not_trusted(path):
    """Why this user must not run `path` (a real path: no symlink in it), or None. The file and its
    folder must be owned by root or this user and writable by no one else; so must every folder
    above, except sticky ones such as /tmp, where only an entry's owner can move it."""
    me = os.geteuid()
    folder = os.path.dirname(path)
    for where in [path] + _folders(folder):
        try:
            st = os.lstat(where)
        except OSError as exc:
            return f"{where}: {exc.strerror}"
        if where == path and not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        if where != path and not stat.S_ISDIR(st.st_mode):
            return f"{where} is not a folder (it changed while being checked)"
        if st.st_uid not in (0, me):
            return f"{where} belongs to uid {st.st_uid}, not to root or this user (uid {me})"
        sticky = where not in (path, folder) and st.st_mode & stat.S_ISVTX
        if _others_may_write(st) and not sticky:
            return f"{where} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _others_may_write(st):
    """Anyone but the owner may write it. Group write counts only if the group holds someone else:
    with a user's private group (umask 002: Fedora, RHEL) only the owner is in it."""
    if st.st_mode & 0o002:
        return True
    if not st.st_mode & 0o020:
        return False
    import grp
    import pwd
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
        members = set(grp.getgrgid(st.st_gid).gr_mem)
    except KeyError:          # an owner or group with no name here: cannot tell who is in it
        return True
    return bool(members - {owner}) or any(p.pw_gid == st.st_gid and p.pw_uid != st.st_uid for p in pwd.getpwall())


def _folders(folder):
    """folder and every folder above it, up to /."""
    out = [folder]
    while out[-1] != os.path.dirname(out[-1]):
        out.append(os.path.dirname(out[-1]))
    return out


def dump(py_spy, pid, native):
    """One rank's stack as py-spy's JSON, or {"error": why}. native: True, False, or "auto":
    native frames only when the Python stack stops at a call into C++ that can hide a wait
    (backward, where DDP's reducer waits for its all_reduce): they take ~0.5 s more."""
    argv = [py_spy, "dump", "--pid", str(pid), "--json"] + (["--native"] if native is True else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return {"error": "py-spy took over 10 s"}
    if done.returncode == 0:
        try:
            stack = json.loads(done.stdout)
        except ValueError:
            return {"error": "py-spy printed no JSON"}
        if native == "auto" and _opaque(stack):
            deeper = dump(py_spy, pid, True)
            return stack if isinstance(deeper, dict) else deeper
        return stack
    text = (done.stderr or done.stdout).strip()
    if not os.path.exists(f"/proc/{pid}"):
        return {"error": "the process exited"}
    if re.search(r"Permission denied|Operation not permitted|EPERM", text, re.IGNORECASE):
        return {"error": "ptrace not permitted", "permission": True}
    lines = [l for l in text.splitlines() if l.strip() and not re.match(r"\s*\d+: ", l)]
    return {"error": lines[0][:200] if lines else f"py-spy exit {done.returncode}"}


def _opaque(stack):
    main = next((t for t in stack if t.get("thread_name") == "MainThread"), stack[0] if stack else None)
    frames = (main or {}).get("frames") or []
    return bool(frames) and (frames[0].get("short_filename") or "").startswith(OPAQUE)


FLIGHT = "/tmp/hangwatch-fr-"      # + the rank's uid: each user's private folder (hangwatch/flight.py)
ANSWER_LIMIT = 64 << 20           # bytes: a Flight Recorder dump of 2000 entries is a few MB


def flight(pid, wait=3.0):
    """The rank's Flight Recorder, if its script imported hangwatch.flight: the last collective
    it entered on each process group (sequence number and op), or None if it did not opt in.

    The agent is often root, reading a rank of another user: it asks only in a folder that is the
    rank's own and that no one else can write, creates its request there without following a
    link or reusing a file, and reads the answer the same way, bounded."""
    uid = _uid(pid)
    if uid is None:
        return None
    folder = FLIGHT + str(uid)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:         # a symlink (ELOOP), a file, or a folder this user may not open
        return {"error": f"{folder} not used: {exc.strerror}"}
    try:
        st = os.fstat(fd)
        if st.st_uid != uid or st.st_mode & 0o022:
            return {"error": f"{folder} not used: it is not the rank's own private folder (owner uid "
                             f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; the rank's uid is {uid})"}
        return _ask_flight(fd, pid, uid, wait)
    finally:
        os.close(fd)


def _ask_flight(folder, pid, uid, wait):
    name = str(pid)
    try:
        os.stat(name + ".ready", dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    try:
        os.close(os.open(name + ".request", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=folder))
    except FileExistsError:
        pass                     # asked before and not answered yet: that answer will do
    except OSError as exc:
        return {"error": f"cannot ask: {exc.strerror}"}
    deadline = time.monotonic() + wait
    while True:
        try:
            # O_NONBLOCK: a FIFO put there would otherwise block this open forever.
            fd = os.open(name + ".json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                return {"error": f"no answer within {wait:.0f} s"}
            time.sleep(0.05)
        except OSError as exc:
            return {"error": f"unreadable answer: {exc.strerror}"}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return {"error": "the answer is not a file of the rank's own"}
        chunks, size = [], 0
        while size <= ANSWER_LIMIT:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
        try:
            os.unlink(name + ".json", dir_fd=folder)
        except OSError:
            pass
    if size > ANSWER_LIMIT:
        return {"error": f"the answer is over {ANSWER_LIMIT >> 20} MiB"}
    try:
        trace = json.loads(b"".join(chunks))
    except ValueError as exc:
        return {"error": f"unreadable answer: {exc}"}
    if "error" in trace:
        return {"error": trace["error"]}
    last = {}
    for entry in trace.get("entries") or []:
        group = (entry.get("process_group") or ["?", "?"])[-1]
        if not entry.get("is_p2p"):
            last[group] = {"group": group, "seq": entry.get("collective_seq_id"),
                           "op": str(entry.get("profiling_name", "")).split(":")[-1], "state": entry.get("state")}
    return {"groups": sorted(last.values(), key=lambda e: e["group"]), "entries": len(trace.get("entries") or [])}


def _uid(pid):
    """The process's effective uid (the owner of what it creates), or None if it is gone."""
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])
    return None


class Agent:
    def __init__(self, spec):
        self.spec = spec
        self.interval = float(spec.get("interval", 1.0))
        self.stack_every = float(spec.get("stack_every", 120.0))
        self.py_spy, self.py_spy_refused = find_py_spy(spec.get("py_spy"))
        self.native = bool(spec.get("native"))
        self.ranks = Ranks(spec.get("pids") or [])
        self.lock = threading.Lock()
        self.last_stacks = 0.0
        self.alive = True

    def emit(self, message):
        with self.lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    def hello(self):
        torch_version = None
        try:
            from importlib.metadata import version
            torch_version = version("torch")
        except Exception:
            pass
        self.emit({"type": "hello", "node": self.spec.get("node"), "host": os.uname().nodename,
                   "pid": os.getpid(), "uid": os.geteuid(), "python": sys.version.split()[0],
                   "torch": torch_version, "py_spy": self.py_spy, "py_spy_refused": self.py_spy_refused,
                   "time": time.time()})

    def stacks(self, request_id=None, native=None):
        pids = list(self.ranks.known)
        out = {}
        if self.py_spy is None:
            out = {str(p): {"error": "py-spy is not on this node"} for p in pids}
        else:
            threads = [threading.Thread(target=lambda p=p: out.__setitem__(str(p), dump(self.py_spy, p, native if native is not None else self.native)))
                       for p in pids]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        flights = {}
        if request_id is not None:      # asked for, in a stall: the Flight Recorder too, where opted in
            threads = [threading.Thread(target=lambda p=p: flights.__setitem__(str(p), flight(p))) for p in pids]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        self.last_stacks = time.monotonic()
        self.emit({"type": "stacks", "t": time.time(), "id": request_id, "stacks": out,
                   "flight": {p: f for p, f in flights.items() if f is not None}})

    def commands(self):
        for line in sys.stdin:
            try:
                command = json.loads(line)
            except ValueError:
                continue
            if command.get("cmd") == "stacks":
                threading.Thread(target=self.stacks, args=(command.get("id"), command.get("native")),
                                 daemon=True).start()
            elif command.get("cmd") == "py-spy":
                path, refused = find_py_spy(command.get("path"))
                self.py_spy = path or self.py_spy
                self.emit({"type": "py-spy", "path": path, "given": command.get("path"), "refused": refused})
        self.alive = False       # EOF: the watcher is gone

    def watch_exits(self):
        """The moment each rank exits, through a pidfd (Linux 5.3+): the order of exits names the
        rank that went first, even when its peers follow within milliseconds. The exit code is
        read while the rank is a zombie, before torchrun reaps it."""
        import select
        poller, fds, reported = select.poll(), {}, set()
        while self.alive:
            for pid in list(self.ranks.known):
                if pid not in fds.values() and pid not in reported:
                    try:
                        fd = os.pidfd_open(pid)
                    except (OSError, AttributeError):
                        continue
                    fds[fd] = pid
                    poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll(200):
                pid = fds.pop(fd)
                reported.add(pid)       # once: a zombie's pidfd stays readable until it is reaped
                poller.unregister(fd)
                os.close(fd)
                stat = proc_stat(pid)
                code = stat[4] if stat is not None and stat[0] in "ZX" else None
                self.emit({"type": "exit", "pid": pid, "t": time.time(), "code": code})

    def run(self):
        self.hello()
        threading.Thread(target=self.commands, daemon=True).start()
        threading.Thread(target=self.watch_exits, daemon=True).start()
        last = {}        # pid -> (monotonic, cpu seconds, {tid: cpu seconds})
        last_net = (time.monotonic(), net_bytes())
        announced = set()
        while self.alive:
            started = time.monotonic()
            found = self.ranks.scan()
            samples = []
            for pid, info in found.items():
                stat = proc_stat(pid)
                if stat is None:
                    continue
                now, cpu, threads = time.monotonic(), stat[2], thread_cpu(pid)
                before = last.get(pid)
                last[pid] = (now, cpu, threads)
                sample = {"pid": pid, "rank": info["rank"], "state": stat[0], "threads": len(threads),
                          "wchan": (_read(f"/proc/{pid}/wchan") or "").strip() or None}
                if stat[0] == "Z":
                    sample["exit"] = stat[4]
                if before:
                    dt = max(now - before[0], 1e-6)
                    sample["cpu"] = round(100 * (cpu - before[1]) / dt, 1)
                    busiest = max(((c - before[2].get(t, c)) for t, c in threads.items()), default=0.0)
                    sample["main_cpu"] = round(100 * (threads.get(pid, 0) - before[2].get(pid, 0)) / dt, 1)
                    sample["top_thread_cpu"] = round(100 * busiest / dt, 1)
                if (pid, info["start"]) not in announced:
                    announced.add((pid, info["start"]))
                    self.emit({"type": "rank", **info})
                samples.append(sample)
            for pid in [p for p in last if p not in found]:
                del last[pid]
            now, total = time.monotonic(), net_bytes()
            net = (total - last_net[1]) / max(now - last_net[0], 1e-6)
            last_net = (now, total)
            gone = sorted(p for p, _ in announced if p not in found)
            announced = {(p, s) for p, s in announced if p in found}
            self.emit({"type": "sample", "t": time.time(), "ranks": samples, "gone": gone,
                       "net": round(net, 1)})
            if found and time.monotonic() - self.last_stacks > self.stack_every:
                threading.Thread(target=self.stacks, daemon=True).start()
                self.last_stacks = time.monotonic()
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))


def main():
    spec = json.loads(base64.b64decode(sys.argv[1])) if len(sys.argv) > 1 else {}
    try:
        Agent(spec).run()
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
