"""The launch program, ON a node under the supervisor, with the training Python (standard library
and torch): torchrun in this process, and one marked line with every rank's exit, which
torchrun itself does not print for ranks it stopped. Its folders (torchrun's --tee files) are in
the supervisor's private folder and go with it, however the run ends.

spec: {"cwd": path, "module": bool, "flight_recorder": bool,
       "torchrun": [torchrun's options..., SCRIPT, "--", the script's options...],
       "probes": {"args": node/jobs/probes.py's options, "store_token": hex} or absent}
The script's options never go through torchrun's parser: they are handed to it as parsed, so
no option of the script can be taken for one of torchrun's (seed 000).

With "probes", each rank first runs the probes that need torch (node/jobs/probes.py's in_rank),
prints their marked lines and a GATE line, and waits for the master's word (its "open-gate",
which the supervisor puts in this program's private folder) before the script's first line;
without that word the master's stop ends the ranks there (a refusal: no line of the script ran).

With the Flight Recorder on (or "probes"), torchrun runs each rank through rank_bootstrap.py (written into this
program's private folder), which runs the script as python would; the ranks' Flight Recorder
files go in a private folder beside it (flight.rank_environment), read by hangwatch's agent.

Marked stdout lines, MARKER + JSON:
  {"kind": "error", "message": str, "fix": str}             nothing was started
  {"kind": "started", "watched": bool}                       torchrun starts now (watched: exits will come)
  {"kind": "ranks", "ranks": [{"local_rank", "rank", "pid"}]}   the ranks were started
  {"kind": "stopping", "t": epoch s, "ranks": [{"local_rank", "rank", "pid"}], "failed": [local ranks]}
                                                            torchrun begins to stop the ranks still
                                                            running (one ended, or it was signalled)
  {"kind": "flight", "local_rank", "rank", "pid", "trace": torch's Flight Recorder JSON (its last entries)}
                                                            each rank still running, right after "stopping"
  {"kind": "error_file", "local_rank", "rank", "document": torchelastic's error file}
                                                            each rank torchrun saw fail that left one,
                                                            before "exits"
  {"kind": "frozen", "ranks": [{"local_rank", "rank", "pid"}]}
                                                            after SIGUSR2 (the master's "prepare-stop",
                                                            through the supervisor): each running rank's
                                                            Flight Recorder was kept, then the rank was
                                                            frozen (SIGSTOP) until torchrun stops it
  {"kind": "exits", "code": int, "ranks": [{"local_rank", "rank", "pid", "exit", "signal"}]}

A stop by ddp-preflight comes in two steps, so that no rank sees a peer die before its own stop
reaches it (it would fail on the lost peer, and read as a failure, not a stop): SIGUSR2 first, on
every node (each rank's Flight Recorder kept, then every rank frozen), then the stop itself
(SIGTERM from the supervisor): torchrun's close sends its SIGTERM to the frozen ranks and this
program lets them go on (SIGCONT): a rank with SIGTERM's default action dies at once, frozen or
not; one with a handler of its own runs it.

The ranks share this program's stdout: its lines are signed with a key the ranks never see
(node/signing.py), so a rank cannot write one. Each rank in a line is one of torchrun's processes
(its pid from torchrun's contexts), with the rank torchrun gave it, never a number read from a
file a rank wrote."""

import json
import os
import pkgutil
import signal
import stat
import sys
import threading
import time

from . import flight, proc, protocol, rank_bootstrap, signing, tail
from .private import write_file
from .protocol import LAUNCH as MARKER


def say(kind, **data):
    protocol.emit(MARKER, {"kind": kind, **data})


class Stop:
    """The master's two-step stop: the ranks frozen, their Flight Recorders kept (prepare), then
    let go once torchrun has signalled them (release)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.contexts = []
        self.frozen = []          # pids frozen by prepare
        self.kept = False         # the Flight Recorders were kept

    def asked(self, *_):
        threading.Thread(target=self.prepare, name="prepare-stop", daemon=True).start()

    def prepare(self):
        with self.lock:
            running = running_ranks(self.contexts)
            try:
                keep_flight(running)
            except Exception:
                pass        # its evidence must not hold the stop
            self.kept = True
            for r in running:
                try:
                    os.kill(r["pid"], signal.SIGSTOP)
                    self.frozen.append(r["pid"])
                except OSError:
                    pass    # it ended meanwhile: its exit says how
            # Said once the kernel holds them: kill() returns before a rank has stopped (it stops
            # when it next runs; on a loaded node, a while after).
            held(self.frozen, FREEZE_BOUND)
            say("frozen", ranks=[r for r in running if r["pid"] in self.frozen])

    def release(self, pids):
        """torchrun is about to signal these: SIGTERM, then SIGCONT to those frozen."""
        for pid in pids:
            if pid in self.frozen:
                for sig in (signal.SIGTERM, signal.SIGCONT):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass


STOP = Stop()


# A bound on the wait, not a judgement: a rank stops when it next returns to user space, and one in
# the kernel's D state (a disk, a file system) only once that wait ends, which may be never.
FREEZE_BOUND = 5.0


def held(pids, bound) -> None:
    """Wait until each of `pids` is stopped (/proc's state T) or gone, at most `bound` seconds."""
    deadline = time.monotonic() + bound
    while any((st := proc.stat(pid)) is not None and st.state not in ("T", "t", "Z", "X") for pid in pids) \
            and time.monotonic() < deadline:
        time.sleep(0.01)


def running_ranks(contexts):
    """The ranks still running (their local rank, global rank, pid) in torchrun's worker group."""
    return [{"local_rank": lr, "rank": rank_of(context, lr), "pid": h.proc.pid}
            for context in contexts[-1:] for lr, h in sorted(context.subprocess_handlers.items())
            if h.proc.poll() is None]


def bounded_tee():
    """torchrun's --tee in bounded memory, whatever a rank prints (node/tail.py), where this torch's
    tail can be replaced; else its own."""
    try:
        from torch.distributed.elastic.multiprocessing import tail_log
    except Exception:
        return
    if callable(getattr(tail_log, "tail_logfile", None)):
        tail_log.tail_logfile = tail.tail_logfile


def watch_ranks():
    """Keep torchrun's worker contexts to read their processes' exits (private API: without it
    the run still works, only the per-rank exits are missing)."""
    contexts = []
    try:
        from torch.distributed.elastic.multiprocessing import api
        start = api.SubprocessContext._start
    except Exception:
        return contexts, False

    def _start(self):
        start(self)
        contexts.append(self)
        STOP.contexts = contexts
        say("ranks", ranks=[{"local_rank": lr, "rank": rank_of(self, lr), "pid": h.proc.pid}
                            for lr, h in sorted(self.subprocess_handlers.items())])

    api.SubprocessContext._start = _start
    close = getattr(api.SubprocessContext, "_close", None)
    if close is not None:
        def _close(self, *args, **kwargs):
            # Said before torchrun signals them: a rank that ends after this was stopped by it.
            # torch calls close() up to three times (its poll, _stop_workers, run's end): only a
            # close that stops a running rank says so.
            with STOP.lock:       # a prepare under way ends first
                handlers = sorted(self.subprocess_handlers.items())
                running = [{"local_rank": lr, "rank": rank_of(self, lr), "pid": h.proc.pid}
                           for lr, h in handlers if h.proc.poll() is None]
                try:
                    if running:
                        say("stopping", t=time.time(), ranks=running,
                            failed=[lr for lr, h in handlers if h.proc.poll() not in (None, 0)])
                        if not STOP.kept:
                            keep_flight(running)
                except Exception:
                    pass    # a line that cannot be written (the master gone) must not keep the ranks running
                finally:
                    STOP.release([r["pid"] for r in running])     # frozen ones too, whatever happened
            return close(self, *args, **kwargs)

        api.SubprocessContext._close = _close
    return contexts, True


def keep_flight(running):
    """Before torchrun stops the ranks still running (one ended, or the run is stopped): each one's
    Flight Recorder, one marked line per rank, for the run's log folder (explain joins them by
    sequence number). Bounded: the ranks that do not answer within a few seconds are left out."""
    folder = os.environ.get(flight.FOLDER_VARIABLE)
    if not folder:
        return
    dumps = flight.collect(folder, [r["pid"] for r in running])
    for r in running:
        if r["pid"] in dumps:
            say("flight", local_rank=r["local_rank"], rank=r["rank"], pid=r["pid"], trace=dumps[r["pid"]])


ERROR_FILE_LIMIT = 1 << 20      # bytes of a rank's error file read (a traceback is a few KB)


def keep_error_files(contexts):
    """Each failed rank's torchelastic error file (torchrun gives every rank its own under its
    --log-dir; rank_bootstrap.py writes it when the script raises), one marked line each. Only
    for a rank torchrun saw fail (as torchrun itself reads them), from the path torchrun gave that
    rank, under the rank torchrun gave it: a file another rank wrote there, or one of a rank that
    exited 0, says nothing for it."""
    for context in contexts[-1:]:
        paths = getattr(context, "error_files", None) or {}
        for lr, handler in sorted(context.subprocess_handlers.items()):
            if handler.proc.poll() in (None, 0) or not paths.get(lr):
                continue
            document = read_error_file(paths[lr])
            if isinstance(document, dict):
                say("error_file", local_rank=lr, rank=rank_of(context, lr), document=document)


def read_error_file(path):
    """The JSON of a rank's error file, or None: a regular file only (a FIFO there would block
    the run's end), never through a symlink, at most ERROR_FILE_LIMIT bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, ERROR_FILE_LIMIT + 1)
        return json.loads(data.decode("utf-8", "replace")) if len(data) <= ERROR_FILE_LIMIT else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def rank_of(context, local_rank):
    try:
        return int(context.envs[local_rank]["RANK"])
    except Exception:
        return None


def exits(contexts):
    out = []
    for context in contexts[-1:]:        # --max-restarts 0: one worker group
        for lr, handler in sorted(context.subprocess_handlers.items()):
            code = handler.proc.poll()
            out.append({"local_rank": lr, "rank": rank_of(context, lr), "pid": handler.proc.pid,
                        "exit": code if code is not None and code >= 0 else None,
                        "signal": -code if code is not None and code < 0 else None})
    return out


def with_flight_recorder(work, module, script, script_args, recorder=True, probes=None):
    """(the script torchrun runs, its arguments) for ranks whose Flight Recorder hangwatch can
    read (`recorder`), or that run the probes first and wait for the master's word (`probes`:
    {"args": node/jobs/probes.py's options, "store_token": hex}): the bootstrap, with the user's
    command after it. The ranks' variables go into this process's environment, which torchrun
    hands on to them. None: the bootstrap could not be written."""
    folder = os.path.join(work.folder, "flight-recorder")
    bootstrap = os.path.join(work.folder, "rank_bootstrap.py")
    try:
        if recorder:
            os.mkdir(folder, 0o700)
        write_file(bootstrap, pkgutil.get_data(__package__, "rank_bootstrap.py").decode())
    except OSError as exc:       # a full disk: the run matters more than its Flight Recorder
        print(f"ddp-preflight: the Flight Recorder is off on this node: cannot write in {work.folder}: "
              f"{exc.strerror}")
        return None
    if recorder:
        os.environ.update(flight.rank_environment(folder, dict(os.environ), has_nccl()))
    if probes:
        # The master's word comes into this program's private folder (node/supervisor.py's "open-gate").
        os.environ.update({rank_bootstrap.GATE_VARIABLE: work.folder, rank_bootstrap.PACKAGE_VARIABLE: work.zip_path,
                           rank_bootstrap.PROBES_VARIABLE: json.dumps(list(probes["args"])),
                           rank_bootstrap.TOKEN_VARIABLE: str(probes["store_token"])})
    return bootstrap, [*(["-m"] if module else []), script, *script_args]


def has_nccl():
    try:
        import torch.distributed as dist
        return bool(dist.is_nccl_available())
    except Exception:
        return False


def main(spec, work):
    signal.signal(signal.SIGUSR2, STOP.asked)       # then let a prepare that came early in (the supervisor
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})   # started this program with it held)
    os.dup2(1, 2)       # one stream, in order: the launcher reads the channel's stdout
    # The ranks get this environment through torchrun: never the key this program signs with
    # (it came on stdin; this only makes sure no variable of the node's carries one either).
    os.environ.pop(signing.KEY_VARIABLE, None)
    sys.stdout.reconfigure(line_buffering=True)      # every rank's line as it comes
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        say("error", message=f"cannot start in {spec['cwd']}: {exc.strerror}",
            fix="create the folder with the training code there, or set code_dir for this node in --config")
        return 2
    argv = spec["torchrun"]
    at = argv.index("--") if "--" in argv else len(argv)
    own, script_args = argv[:at], argv[at + 1:]
    script = own[-1]
    if not spec["module"] and not os.path.isfile(script):
        say("error", message=f"the script {script} does not exist here",
            fix="copy the training code to the same path, or set code_dir for this node in --config")
        return 2
    try:
        import torch.distributed.run as torchrun
    except Exception as exc:
        # The master's torch release in this node's build, the index in the command (the launch's
        # plan): a bare `pip install torch` would install another release, or the CUDA build.
        wanted = spec.get("torch_pip") if isinstance(spec.get("torch_pip"), str) else "torch"
        say("error", message=f"torchrun is not importable with {sys.executable}: {exc}",
            fix=f"{sys.executable} -m pip install {wanted}, or --python the training environment's interpreter")
        return 2
    contexts, watched = watch_ranks()
    bounded_tee()
    logs = os.path.join(work.folder, "torchrun")     # torchrun's --tee files
    code = 0
    try:
        options = own[:-1]
        probes = spec.get("probes") if isinstance(spec.get("probes"), dict) else None
        bootstrapped = (spec.get("flight_recorder") or probes) and \
            with_flight_recorder(work, spec["module"], script, script_args, bool(spec.get("flight_recorder")), probes)
        if probes and not bootstrapped:
            # Never the training without its gate: the master's READY would come after its first line.
            say("error", message=f"cannot run the probes in the ranks: cannot write in {work.folder}", fix=None)
            code = 2
            return code
        if bootstrapped:
            script, script_args = bootstrapped
            if spec["module"]:
                options = options[:-1]      # torchrun's -m: the bootstrap is the script, the module its argument
        args = torchrun.get_args_parser().parse_args(options + ["--log-dir", logs, script])
        args.training_script_args = script_args
        say("started", watched=bool(watched), gated=bool(probes))
        torchrun.run(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:     # ChildFailedError (a rank failed), SignalException (stopped), ...
        sigval = getattr(exc, "sigval", None)
        code = 128 + int(sigval) if sigval is not None else 1
        if sigval is None and type(exc).__name__ != "ChildFailedError":   # torchrun logged that one
            text = (str(exc).strip().splitlines() or [""])[-1][:400]
            say("error", message=f"torchrun failed: {type(exc).__name__}: {text}", fix=None)
    finally:
        try:
            keep_error_files(contexts)
        except Exception:
            pass         # the run's end must be said whatever its evidence
        say("exits", code=code, ranks=exits(contexts))
    sys.stdout.flush()
    os._exit(code)       # torchrun's log tailing threads must not hold the exit
