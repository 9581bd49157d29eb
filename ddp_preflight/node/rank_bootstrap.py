"""What a rank of `ddp-preflight --launch` runs first: it starts the thread that answers
hangwatch's agent with this rank's Flight Recorder, then runs the training script exactly as
`python SCRIPT ARGS` or `python -m MODULE ARGS` would. The script needs no change.

    python -u rank_bootstrap.py SCRIPT ARGS...        python -u rank_bootstrap.py -m MODULE ARGS...

One file, standard library only (torch is imported in the thread, when asked): the launch program
writes it into its private folder and torchrun runs it as the script. hangwatch/flight.py (the
opt-in for runs ddp-preflight did not launch) starts the same thread.

The thread: torch records every collective in its Flight Recorder (Gloo too, from torch 2.13 by
default; TORCH_FR_BUFFER_SIZE sets how many), but nothing dumps it when a Gloo collective hangs.
When the agent drops PID.request in the folder, the thread writes the record to PID.json there.
A thread works where a signal would not: a rank blocked in a collective never returns to Python's
main loop, but the wait releases the GIL. It costs a stat() twice a second until asked.

How the script ended: the moment it returns, calls sys.exit or raises, before Python's own
teardown, the rank writes PID.end in the same folder (record_ending): how, when (its clock), the
exit code or the exception's type, message and frames. The agent reads it when the process is
gone. Teardown takes half a second or more with torch loaded, and a rank's peers may die of the
lost connection before its process is gone: the time it wrote is when it really left.

A fatal signal (SIGSEGV in an extension, torch's abort) runs no Python: faulthandler, turned on
into PID.fatal in the same folder, writes the crashing thread's frames there, and the agent reads
them as the rank's record (node/flight.py's fatal_record), so the verdict names the line."""

import atexit
import json
import os
import runpy
import stat
import sys
import threading
import time
import types
from importlib.machinery import SourceFileLoader

FOLDER_VARIABLE = "DDP_PREFLIGHT_FLIGHT_RECORDER"    # the run's private folder, set by the launch program
POLL = 0.5             # seconds between looks for a request
# A new file, this process's own: never through a symlink, never into a file already there.
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


# -- the Flight Recorder, on request ------------------------------------------------------------

def start_answering(folder):
    """Answer the agent's requests in `folder` (private: the caller made sure) from now on."""
    pid = os.getpid()
    ready = os.path.join(folder, "%d.ready" % pid)
    _write_new(ready, str(time.time()))
    atexit.register(_forget, ready, pid)
    threading.Thread(target=_answer, args=(folder, pid), name="hangwatch-flight", daemon=True).start()


def _answer(folder, pid):
    request = os.path.join(folder, "%d.request" % pid)
    answer = os.path.join(folder, "%d.json" % pid)
    while True:
        time.sleep(POLL)
        if not os.path.exists(request):
            continue
        try:
            text = json.dumps(_scripts_record())
        except Exception as exc:      # no process group yet, or a torch without it: say so
            text = json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)})
        partial = answer + ".part"
        _write_new(partial, text)
        os.replace(partial, answer)
        try:
            os.unlink(request)
        except FileNotFoundError:
            pass


def _write_new(path, text):
    try:
        os.unlink(path)          # left by an earlier process with this pid (the folder is ours alone)
    except FileNotFoundError:
        pass
    with os.fdopen(os.open(path, CREATE, 0o600), "w") as f:
        f.write(text)


_probes_up_to: list = []     # the record id of the probes' last collective in this process (run_probes), if any


def _scripts_record():
    """torch's Flight Recorder of this process (every collective kept, not only active ones),
    without the probes' collectives: theirs were the same group "0", with sequence numbers the
    script's own group starts again from 1 (the recorder keeps them after destroy_process_group)."""
    import torch._C._distributed_c10d as c10d
    text = c10d._dump_fr_trace_json(True, False)
    trace = json.loads(text.decode() if isinstance(text, bytes) else text)
    if _probes_up_to and isinstance(trace, dict) and isinstance(trace.get("entries"), list):
        trace["entries"] = [e for e in trace["entries"] if not isinstance(e, dict) or
                            not isinstance(e.get("record_id"), int) or e["record_id"] > _probes_up_to[0]]
    return trace


def _last_record_id():
    """The newest record id in this process's Flight Recorder, or None (none kept, or no recorder)."""
    try:
        import torch._C._distributed_c10d as c10d
        text = c10d._dump_fr_trace_json(True, False)
        entries = json.loads(text.decode() if isinstance(text, bytes) else text).get("entries") or []
        ids = [e["record_id"] for e in entries if isinstance(e, dict) and isinstance(e.get("record_id"), int)]
        return max(ids) if ids else None
    except Exception:
        return None


# -- how the script ended ---------------------------------------------------------------------------

ENDING = "%d.end"             # in the folder, by pid
MESSAGE_LIMIT = 2000          # characters of an exception's message kept
FRAMES_LIMIT = 40             # innermost frames kept


def collectives_run():
    """How many collectives this process ran, by its own Flight Recorder (it keeps them after
    destroy_process_group): 0 where torch's distributed library was never loaded (no process
    group can exist); None where it cannot be known (the recorder is off, or would not answer)."""
    loaded = sys.modules.get("torch._C._distributed_c10d")
    if loaded is None:
        return 0 if "torch.distributed" not in sys.modules else None
    try:
        if int(os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0) <= 0:
            return None
        return len(_scripts_record().get("entries") or [])
    except Exception:
        return None


def record_ending(folder, how, exc=None, code=None):
    """Write PID.end: {"how": "returned" | "exit" | "raised" | "ended" (returned or sys.exit, as
    ddp_preflight.hangwatch.flight sees it: the process's exit code says which), "t": epoch s, "pid", "code": the
    exit code (how == "exit", "returned"), "collectives": how many it ran (collectives_run; null:
    not known), "type", "message", "frames": [{"file", "line", "function"}, ...] innermost last,
    "causes": [{"type", "message"}] the chain before it, first to last (how == "raised")}. Never
    raises: the script's own ending goes on whatever happens here."""
    try:
        data = {"how": how, "t": time.time(), "pid": os.getpid(), "code": code, "collectives": collectives_run()}
        if exc is not None:
            data["type"] = type(exc).__name__
            data["message"] = str(exc)[:MESSAGE_LIMIT]
            frames = []
            tb = exc.__traceback__
            while tb is not None:
                code_object = tb.tb_frame.f_code
                frames.append({"file": code_object.co_filename, "line": tb.tb_lineno, "function": code_object.co_name})
                tb = tb.tb_next
            data["frames"] = frames[-FRAMES_LIMIT:]
            # The chain before it, first to last (a wrapper that re-raises a lost peer as its own).
            causes, seen, link = [], {id(exc)}, exc.__cause__ or exc.__context__
            while link is not None and id(link) not in seen and len(causes) < 10:
                seen.add(id(link))
                causes.append({"type": type(link).__name__, "message": str(link)[:MESSAGE_LIMIT]})
                link = link.__cause__ or link.__context__
            data["causes"] = causes[::-1]
        _write_new(os.path.join(folder, ENDING % os.getpid()), json.dumps(data))
    except Exception:
        pass


def record_error_file(exc):
    """torchelastic's error file for this rank (TORCHELASTIC_ERROR_FILE, which torchrun sets per rank),
    as its @record decorator writes it, for a script that does not use @record: torchrun's summary
    then shows the traceback, and ddp-preflight --launch keeps it in the run's log folder. A file
    already there (the script's own @record) is left as it is. Never raises."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    try:
        import traceback
        callstack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        data = {"message": {"message": "%s: %s" % (type(exc).__name__, exc),
                            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))}}}
        with os.fdopen(os.open(path, CREATE, 0o600), "w") as f:
            f.write(json.dumps(data))
    except Exception:
        pass


def exit_code(exc):
    """The exit code a SystemExit gives, as the interpreter computes it."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


# -- a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) -------------------------------------

FATAL = "%d.fatal"            # in the folder, by pid: faulthandler's dump of the crashing thread


def record_fatal(folder):
    """Turn on faulthandler into PID.fatal in the folder: a crash in native code (a SIGSEGV in an
    extension, torch's abort) then names the Python line the rank was at, for the agent to read
    when the rank is gone (node/flight.py's ending). A file of this process's own, never through a
    link; removed at a normal end. Returns it (it must stay open), or None (never raises)."""
    try:
        import faulthandler
        path = os.path.join(folder, FATAL % os.getpid())
        fatal = os.fdopen(os.open(path, CREATE, 0o600), "w")
        faulthandler.enable(file=fatal, all_threads=False)
        atexit.register(_forget, path, os.getpid())
        return fatal
    except Exception:
        return None


def _forget(ready, pid):
    if os.getpid() != pid:       # a forked child (a DataLoader worker) exiting: not ours to remove
        return
    try:
        os.unlink(ready)
    except FileNotFoundError:
        pass


# -- the probes, then the master's word ---------------------------------------------------------

PROBES_VARIABLE = "DDP_PREFLIGHT_PROBES"       # JSON: node/jobs/probes.py's options, run before the script
PACKAGE_VARIABLE = "DDP_PREFLIGHT_PACKAGE"     # the node package's zip, where the probes' code is
TOKEN_VARIABLE = "DDP_PREFLIGHT_STORE_TOKEN"   # the probes' store token (node/jobs/signed_store.py's name)
GATE_VARIABLE = "DDP_PREFLIGHT_GATE"           # the launch program's private folder: the master's word
GATE_OPEN = "gate-open"        # in that folder: the master read the probes and said READY (node/supervisor.py)
GATE_POLL = 0.05               # seconds between looks for it
GATE_LINE = "DDP_PREFLIGHT_GATE "   # node/protocol.py's GATE: this rank ran its probes and waits (unsigned:
                                    # the master reads the ranks' lines only until it gives its word)
NOT_OWN_FOLDER = 2             # the exit code of a rank whose gate is not in its own private folder


def gated():
    """The rank's variables for the probes and the gate, taken out of its environment (the
    script never sees them): (gate folder or None, probes' options or None, zip, token)."""
    return tuple(os.environ.pop(name, None) for name in (GATE_VARIABLE, PROBES_VARIABLE, PACKAGE_VARIABLE,
                                                           TOKEN_VARIABLE))


def own_private_folder(folder):
    """Whether `folder` is this process's user's alone (nobody else can put the master's word there)."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def run_probes(options, package, token):
    """node/jobs/probes.py's parts in this rank (in_rank: torch imported once, for the script
    too), or none (an empty list). Their code comes from the package's zip, for this phase only:
    the script finds neither the zip on sys.path nor this package's modules in sys.modules.
    Returns what a part raised (said on the rank's stderr too), or None."""
    if not json.loads(options):
        return None
    path = list(sys.path)
    sys.path.insert(0, package)
    if token:
        os.environ[TOKEN_VARIABLE] = token
    try:
        from ddp_preflight.node.jobs import probes
        return probes.in_rank(json.loads(options))
    finally:
        last = _last_record_id()
        if last is not None:
            _probes_up_to.append(last)
        os.environ.pop(TOKEN_VARIABLE, None)
        sys.path[:] = path
        for name in [n for n in sys.modules if n == "ddp_preflight" or n.startswith("ddp_preflight.")]:
            del sys.modules[name]


def say_waiting(error):
    """The GATE line: this rank's probes are done (`error`: what a part raised) and it waits."""
    sys.stdout.write(GATE_LINE + json.dumps({"rank": int(os.environ.get("RANK", "0")),
                                              "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                                              "pid": os.getpid(), "error": error}) + "\n")
    sys.stdout.flush()


def wait_for_gate(folder):
    """Until the master's word is in the folder. Only the master's run puts it there (the
    supervisor, on the master's command over its channel); a stop from the master ends this rank
    here, before any line of the script ran."""
    word = os.path.join(folder, GATE_OPEN)
    while True:
        try:
            st = os.lstat(word)
        except FileNotFoundError:
            time.sleep(GATE_POLL)
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            return
        time.sleep(GATE_POLL)


# -- the script, as python runs it ---------------------------------------------------------------

def run(argv):
    """`SCRIPT ARGS` or `-m MODULE ARGS`, in a fresh __main__ module."""
    if argv[:1] == ["-m"]:
        run_module(argv[1], argv[2:])
    else:
        run_script(argv[0], argv[1:])


def run_script(path, args):
    """As `python PATH ARGS`: argv[0] as given, __file__ absolute, sys.path[0] the script's real
    folder (symlinks resolved), the code compiled with its absolute name (tracebacks)."""
    full = os.path.abspath(path)
    try:
        with open(full, "rb") as f:
            source = f.read()
    except OSError as exc:
        sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (sys.executable, full, exc.errno, exc.strerror))
        sys.exit(2)
    sys.argv[:] = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = _fresh_main()
    main.__file__ = full
    main.__loader__ = SourceFileLoader("__main__", full)
    exec(compile(source, full, "exec", dont_inherit=True), main.__dict__)


def run_module(name, args):
    """As `python -m NAME ARGS`, through the function python itself calls for -m (it sets
    argv[0] to the module's file and __spec__, and says "No module named ..." when missing)."""
    sys.argv[:] = ["-m", *args]
    sys.path[0] = os.getcwd()
    _fresh_main()
    runpy._run_module_as_main(name, alter_argv=True)


def _fresh_main():
    """A new __main__ in sys.modules: the script's globals, not this file's (pickle and
    multiprocessing's spawn find the script's functions there)."""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    return main


def _scripts_own(tb):
    """The traceback from the script's first frame on: this file's frames are not the script's."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    _gate, _probes, _package, _token = gated()
    if _gate is not None:
        if not own_private_folder(_gate):
            sys.stderr.write("ddp-preflight: %s is not this rank's own private folder: the training was not started "
                             "(run the launch as the user who owns it)\n" % _gate)
            sys.exit(NOT_OWN_FOLDER)
        say_waiting(run_probes(_probes or "[]", _package, _token))
        wait_for_gate(_gate)
    _folder = os.environ.get(FOLDER_VARIABLE)
    _fatal = None
    if _folder:
        start_answering(_folder)
        _fatal = record_fatal(_folder)
    try:
        run(sys.argv[1:])
    except SystemExit as exc:
        if _folder:
            record_ending(_folder, "exit", code=exit_code(exc))
        raise
    except BaseException as exc:
        # Re-raised bare at the top level, the exception ends the process as it would have
        # without this file: the same traceback from the script on (Python 3.11+; before, this
        # file's frames show above it), the same exit code, KeyboardInterrupt as SIGINT.
        exc.__traceback__ = _scripts_own(exc.__traceback__)
        if _folder:
            record_ending(_folder, "raised", exc)
        if not isinstance(exc, KeyboardInterrupt):
            record_error_file(exc)
        raise
    else:
        if _folder:
            record_ending(_folder, "returned", code=0)
