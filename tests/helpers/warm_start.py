"""Warm process starts for the test suite: a zygote that has imported TensorFlow once
forks a fresh process per command, so a test's `python ...` costs ~0.1 CPU-s to start
instead of ~6 (docs/testing.md: process starts were the slow tier's largest cost).

    python tests/helpers/warm_start.py serve PREFIX0      # a zygote (tests/conftest.py starts two)
    python -S -E tests/helpers/warm_start.py client PREFIX PYTHON ARGS...   # what `python ARGS` becomes

What a child is: a real, separate OS process, forked from a parent that has only
IMPORTED third-party modules (tensorflow, keras, numpy, absl, tfds; never tf_gan_scale,
so a child sees the tf_gan_scale its own PYTHONPATH names). No TensorFlow runtime,
device, thread pool or server exists before the fork; the child configures its own
devices, strategy, cluster and signal handlers exactly as after a cold start. It gets
the command's argv, working directory, environment and stdin/stdout/stderr (passed as
file descriptors), and runs the script or module as `__main__`, then atexit handlers.

The client stands in for the process the test started (Popen.pid, exit status, signals):
  - it relays every catchable signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1/2, SIGQUIT) to the
    child, and a SIGKILL of the client kills the child (its monitor sees the socket close);
  - it exits with the child's status; a child killed by signal S kills the client by S.
A child's CPU time reaches the test process through the zygote (each level waits for the
one below it), so RUSAGE_CHILDREN totals stay true at the end of the session; the
zygote's /proc stat gives the running figure for per-test timing (tools/cpu_timing.py).

If the zygote is not there (or the command is not a plain `python [-u] SCRIPT|-m MOD|-c
CODE ...`), the client execs the real interpreter: the same result, only slower.
"""

import array
import json
import os
import select
import signal
import socket
import struct
import sys
import time

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
           signal.SIGQUIT)
ZYGOTES = 2  # Sockets PREFIX0 and PREFIX1 (tests/conftest.py starts both).
PRELOAD = ["numpy", "tensorflow", "keras", "absl.app", "absl.flags", "absl.logging",
           "tensorflow_datasets", "scipy.linalg", "PIL.Image", "ml_collections"]


# ---- messages: one JSON object per line on a unix stream socket --------------------

def _send(conn, obj, fds=()):
    data = (json.dumps(obj) + "\n").encode()
    if fds:
        conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        conn.sendall(data)


class _Reader:
    def __init__(self, conn):
        self.conn, self.buf, self.fds = conn, b"", []

    def read(self):
        """The next message (dict), or None at end of stream."""
        while b"\n" not in self.buf:
            data, anc, _, _ = self.conn.recvmsg(65536, socket.CMSG_SPACE(16 * 4))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                    self.fds.extend(fds)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


# ---- the client: what the test started ------------------------------------------

# Commands that start cold: a launcher must be the real parent of its workers (tests find
# a launcher's workers by their parent pid), and it imports no TensorFlow itself.
COLD = ("tools/launch_local.py",)


def _plain(args):
    """True for the command forms the child knows how to run."""
    rest = [a for a in args if a != "-u"]
    return bool(rest) and (rest[0] in ("-m", "-c") and len(rest) > 1
                           or not rest[0].startswith("-") and not rest[0].endswith(COLD))


def _task_index():
    """This process's index in its cluster (TF_CONFIG, DTensor, Slurm), else None."""
    try:
        return int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    except (KeyError, ValueError, TypeError):
        pass
    for name in ("DTENSOR_CLIENT_ID", "SLURM_PROCID"):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            pass
    return None


def _zygote(sock_prefix):
    """Which zygote serves this command. Two zygotes with different hash secrets:
    neighbouring workers of a cluster come from different ones, and other commands take
    turns, so string-set iteration orders differ between two processes as between cold
    ones (a resumed run vs a straight one, worker 0 vs worker 1: an order bug shows)."""
    index = _task_index()
    if index is None:
        fd = os.open(sock_prefix + ".turns", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b".")
            index = os.fstat(fd).st_size
        finally:
            os.close(fd)
    return f"{sock_prefix}{index % ZYGOTES}"


def _cold(python, args):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)  # exec keeps the mask.
    os.execv(python, [python, *args])


def client(sock_prefix, python, args):
    # Signals wait (blocked, pending) until the child exists and the relay is in place:
    # a SIGTERM the test sends as soon as the child said it is ready reaches the child.
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    if not _plain(args) or os.environ.get("TF_GAN_SCALE_COLD_START"):
        _cold(python, args)  # TF_GAN_SCALE_COLD_START: the test asks for a cold start.
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_zygote(sock_prefix))
        _send(conn, {"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)},
              fds=[0, 1, 2])
        reader = _Reader(conn)
        msg = reader.read()
    except OSError:
        msg = None
    if msg is None:  # No zygote, or it ended before it forked the child: start cold.
        _cold(python, args)
    started = msg
    for fd in (0, 1, 2):  # The child holds them now; the client keeps only the socket.
        os.close(fd)

    def relay(sig, frame):
        try:
            _send(conn, {"signal": int(sig)})
        except OSError:
            pass

    for sig in RELAYED:
        signal.signal(sig, relay)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
    while "exit" not in msg:
        try:
            msg = reader.read()
        except InterruptedError:
            continue
        except OSError:
            msg = None
        if msg is None:  # The zygote died under the child: report it as a crash.
            os._exit(70)
    status = msg["exit"]
    # Return once the zygote has reaped the monitor: the child's CPU is then in the
    # zygote's cutime, and tools/cpu_timing.py books it to the test that ran it.
    deadline = time.monotonic() + 2.0
    while os.path.exists(f"/proc/{started['monitor']}") and time.monotonic() < deadline:
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        for s in RELAYED:
            signal.signal(s, signal.SIG_DFL)
        try:  # Python ignores SIGPIPE and SIGXFSZ: die by them all the same.
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))


# ---- the zygote -------------------------------------------------------------------

def serve(sock_path):
    import importlib
    # Listen first: a client that comes while the imports run waits in the backlog
    # instead of falling back to a cold start (the heaviest tests start at once).
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(128)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # `import tensorflow` asks absl to list the GPUs when app.run starts (a cuInit error
    # line on this machine). A cold process that never imports TensorFlow (the cluster
    # tools, the launcher) prints no such line: neither may its warm twin.
    sys.modules["absl.app"]._init_callbacks.clear()  # noqa: SLF001
    assert not any(m.split(".")[0] == "tf_gan_scale" for m in sys.modules), \
        "the zygote must not import tf_gan_scale (children choose theirs by PYTHONPATH)"
    base_path = list(sys.path)  # Without the zygote's script directory (removed below).
    here = os.path.dirname(os.path.abspath(__file__))
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in base_path if os.path.abspath(p or ".") not in own | {here}]

    def reap():  # Wait for monitors: their CPU (and their child's) adds up here.
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    # SIGCHLD may be delivered to any thread the imports started; the wake-up fd makes
    # the main loop see it at once (tools/cpu_timing.py reads the reaped CPU per test).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    parent = os.getppid()
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([server, wake_r], [], [], 5.0)
        if os.getppid() != parent:  # The pytest process is gone (crashed, killed): so go.
            sys.exit(0)
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap()
        if server not in ready:
            continue
        conn, _ = server.accept()
        _flush()  # Nothing buffered here is written twice by the children.
        if os.fork() == 0:
            server.close()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                _monitor(conn, base_path)
            finally:
                os._exit(70)
        conn.close()


def _flush():
    """Python's and C's stdio buffers (TensorFlow's C++ code writes through C stdio)."""
    import ctypes
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    ctypes.CDLL(None).fflush(None)


def _monitor(conn, base_path):
    """Forks the child of one command, relays signals to it, reports its exit status."""
    reader = _Reader(conn)
    try:
        request = reader.read()
    except OSError:
        request = None
    if request is None:  # The client went away before it asked for anything.
        os._exit(0)
    fds = reader.fds
    monitor = os.getpid()
    pid = os.fork()
    if pid == 0:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the monitor.
        if os.getppid() != monitor:
            os._exit(70)
        try:
            code = _child(request, fds, conn, base_path)
        except BaseException:  # noqa: BLE001  Whatever escapes: exit as Python would.
            code = 1
        os._exit(code)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        _send(conn, {"started": pid, "monitor": os.getpid()})
        while True:
            if b"\n" not in reader.buf:  # A relayed signal already read waits no longer.
                ready, _, _ = select.select([conn, pidfd], [], [])
                if pidfd in ready:
                    _, status, _ = os.wait4(pid, 0)
                    try:
                        _send(conn, {"exit": status})
                    except OSError:
                        pass
                    os._exit(0)
            msg = reader.read()
            if msg is None:
                raise ConnectionResetError("the client is gone")
            if "signal" in msg:
                try:
                    os.kill(pid, msg["signal"])
                except ProcessLookupError:
                    pass
    except OSError:  # The client is gone (SIGKILL, a reset socket): so is its process.
        os.kill(pid, signal.SIGKILL)
        os.wait4(pid, 0)
        os._exit(0)


def _child(request, fds, conn, base_path):
    """Becomes `python ARGV` in CWD with ENV and the client's stdin/stdout/stderr."""
    import atexit
    import io
    import runpy
    import threading
    import types
    conn.close()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    for sig in RELAYED + (signal.SIGCHLD,):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # As Python sets it.
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])  # putenv too: C code (TensorFlow) sees it.
    args = list(request["argv"])
    unbuffered = "-u" in args[:args.index(next(a for a in args if a != "-u"))] or bool(
        os.environ.get("PYTHONUNBUFFERED"))
    while args[0] == "-u":
        args.pop(0)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    # As the interpreter sets them up: -u / PYTHONUNBUFFERED make the binary layer
    # unbuffered and the text layer write-through; stderr is line-buffered anyway.
    raw = lambda fd: io.FileIO(fd, "w", closefd=False)  # noqa: E731
    out = (lambda fd: raw(fd)) if unbuffered else (lambda fd: io.BufferedWriter(raw(fd)))
    sys.stdout = io.TextIOWrapper(out(1), write_through=unbuffered, line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(out(2), write_through=unbuffered, line_buffering=True,
                                  errors="backslashreplace")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    if "numpy" in sys.modules:  # random reseeds itself after a fork; numpy does not.
        sys.modules["numpy"].random.seed()
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if args[0] == "-c":  # As the interpreter sets sys.path[0]: "" for -c, the cwd for -m,
        sys.argv, first = ["-c", *args[2:]], ""  # the script's directory for a script.
    elif args[0] == "-m":
        sys.argv, first = ["-m", *args[2:]], os.getcwd()
    else:
        sys.argv, first = args, os.path.dirname(os.path.abspath(args[0]))
    sys.path[:] = [first, *extra, *base_path]
    # What this process starts with sys.executable starts warm too (e.g. a launcher's
    # workers, tools/benchmark.py's runs).
    sys.executable = os.environ.get("TF_GAN_SCALE_WARM_PYTHON") or sys.executable
    code, interrupted = 0, False
    try:
        if args[0] == "-m":
            runpy._run_module_as_main(args[1], alter_argv=True)  # noqa: SLF001  As `-m`.
        else:  # A script or -c: run in a fresh __main__ module, as the interpreter does.
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            if args[0] == "-c":
                source, filename = args[1], "<string>"
            else:
                filename = main.__file__ = os.path.abspath(args[0])
                try:
                    with open(filename, "rb") as f:
                        source = f.read()
                except OSError as e:  # The interpreter's own message and status.
                    print(f"{sys.executable}: can't open file {filename!r}: [Errno "
                          f"{e.errno}] {e.strerror}", file=sys.stderr)
                    return 2
            sys.modules["__main__"] = main
            exec(compile(source, filename, "exec"), main.__dict__)  # noqa: S102
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001  Printed as the interpreter prints it,
        tb = e.__traceback__.tb_next or e.__traceback__  # without this frame.
        sys.excepthook(type(e), e, tb)
        # Uncaught KeyboardInterrupt: Python 3.8+ dies by SIGINT (after the exit handlers).
        interrupted, code = isinstance(e, KeyboardInterrupt), 1
    threading._shutdown()  # noqa: SLF001  As the interpreter does at exit.
    atexit._run_exitfuncs()  # noqa: SLF001
    _flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3], sys.argv[4:])
