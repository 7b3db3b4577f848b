"""Cluster start-up with a deadline: every task waits for its peers in Python, where a
deadline and SIGTERM / SIGINT can act, before TensorFlow's own start-up begins.

    wait_for_peers(tasks, me, timeout_s=300)   # tasks: [("worker 0", "host:port"), ...]

Why not TensorFlow's own wait: MultiWorkerMirroredStrategy and DTensor join the cluster
inside one C++ call (`TFE_EnableCollectiveOps`) that holds the GIL, so no Python signal
handler or watchdog thread runs until it returns, and before connecting it installs
TensorFlow's SIGTERM handler (the preemption notifier), which only records the signal.
A task whose peer never comes waited with no end and no log line, and `kill -TERM` left it
running until SIGKILL (measured: a worker 1 of 2 alone, TF 2.21). Slurm and Kubernetes
stop a job with SIGTERM, then SIGKILL after a grace period (30 s by default).

So each task first listens at its own address (its port from TF_CONFIG, the Slurm step or
DTENSOR_JOBS), and connects to every peer's, saying who it is. A task moves on when it has
reached every peer AND heard from every peer: then every peer has reached it too, so a
task that moved on is waited for by no one (no two tasks wait for each other forever,
and none relies on TensorFlow's gRPC server taking over the port in time). When the
deadline passes, `StartupTimeout` names the tasks not both reached and heard from, with
their addresses; a SIGTERM or SIGINT raises `Interrupted` (the binary exits 143). Nothing
is written before this returns. TensorFlow's registration then runs with the time left as
its own deadline (`distribute.strategies.register_deadline`): a peer that dies in between
still ends the wait.

This module does not import TensorFlow.
"""

import contextlib
import hashlib
import signal
import socket
import threading
import time

from tf_gan_scale import errors

DEFAULT_TIMEOUT_S = 300.0
# The line a task logs once it listens: tools/launch_local.py reads it to tell which
# worker never joined.
WAITING = "waiting for the cluster"
_HELLO = "tf_gan_scale startup"  # + " INDEX\n": what a task sends its peers.
_REMIND_S = 60.0


class StartupTimeout(RuntimeError):
    """The cluster did not form within the start-up deadline; str() is one line naming the
    tasks that did not connect. Binaries exit 1."""


class Interrupted(RuntimeError):
    """SIGTERM or SIGINT while waiting for the cluster; binaries exit 143, nothing written."""

    def __init__(self, signum):
        super().__init__(f"stopped by {signal.Signals(signum).name} while waiting for the "
                         f"cluster; nothing was written")
        self.signum = signum


def split_address(address):
    """("host", port) of "host:port" (IPv6 as "[::1]:port"); ConfigError otherwise."""
    host, sep, port = str(address).rpartition(":")
    try:
        if not sep or not host:
            raise ValueError(address)
        return host.strip("[]"), int(port)
    except ValueError:
        raise errors.ConfigError(f"bad task address {address!r}; valid: host:port") from None


def check_timeout(timeout_s):
    """ConfigError unless timeout_s > 0 (seconds)."""
    if not errors.is_real(timeout_s) or not timeout_s > 0:
        raise errors.ConfigError(f"--startup_timeout_s must be > 0 seconds; "
                                 f"Received: {timeout_s!r}")


def _listen(port, address):
    """A listening socket on every interface at `port` (dual-stack when possible), as
    TensorFlow's gRPC server will bind it."""
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6,
                                        dualstack_ipv6=True, backlog=256)
        return socket.create_server(("", port), backlog=256)
    except OSError as e:
        raise errors.ConfigError(f"cannot listen at this task's address {address} "
                                 f"({e.strerror or e}); another process holds port {port}, "
                                 f"or the cluster description gives this task a wrong "
                                 f"address") from None


def _hello(tasks, index):
    """What task `index` sends its peers: it names the cluster (a digest of every task's
    name and address), so a task of another cluster, or of an older attempt on the same
    ports, is not taken for a peer."""
    digest = hashlib.sha256(repr(list(tasks)).encode()).hexdigest()[:16]
    return f"{_HELLO} {digest} {index}\n".encode()


def _say_hello(address, hello, timeout_s):
    """Connects to a peer's listener and sends `hello`; True if it listened."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            # On one host, a connection to a port nobody listens on can connect the socket
            # to itself (TCP simultaneous open; ports of the ephemeral range): not a peer.
            if conn.getsockname() == conn.getpeername():
                return False
            conn.sendall(hello)
            return True
    except OSError:  # Refused, unreachable, unknown host (yet), timed out: not up yet.
        return False


def _read_hello(conn, prefix, heard):
    """Reads one line (at most 128 bytes, within 1 s) from an accepted connection; a hello
    of this cluster (`prefix` + index) adds the index to `heard`, anything else (a port
    scanner, a health probe) is ignored."""
    with conn:
        conn.settimeout(1.0)
        data = b""
        try:
            while b"\n" not in data and len(data) < 128:
                chunk = conn.recv(128)
                if not chunk:
                    break
                data += chunk
        except OSError:
            return
    line = data.split(b"\n", 1)[0].decode("ascii", "replace")
    if line.startswith(prefix) and line[len(prefix):].isdigit():
        heard.add(int(line[len(prefix):]))


def _listen_for_hellos(listener, prefix, heard, stop):
    """Accepts connections on `listener` until `stop` is set, each read in its own short
    thread (an idle connection delays no other)."""
    listener.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except (TimeoutError, socket.timeout):
            continue
        except OSError:  # E.g. ECONNABORTED: a client gave up before the accept.
            time.sleep(0.05)
            continue
        threading.Thread(target=_read_hello, args=(conn, prefix, heard), daemon=True).start()


@contextlib.contextmanager
def _signals_raise():
    """SIGTERM and SIGINT raise Interrupted in the main thread while inside (as they would
    not inside TensorFlow's start-up); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        del frame
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            # None: the previous handler was not Python's (it cannot be put back).
            signal.signal(sig, signal.SIG_DFL if old is None else old)


def wait_for_peers(tasks, me, timeout_s=DEFAULT_TIMEOUT_S, *, log=print, poll_s=0.2,
                   clock=time.monotonic):
    """Waits until every task of `tasks` answers at its address.

    Args:
        tasks: [(name, "host:port")] of every task of the cluster, this one included
            (e.g. ("worker 1", "10.0.0.2:8888")).
        me: index of this task in `tasks`.
        timeout_s: the start-up deadline, from now.
        log: called with each progress line (one when waiting starts, a reminder every
            minute naming the tasks still missing).
    Returns:
        The seconds left of the deadline (for TensorFlow's own registration).
    Raises:
        StartupTimeout: naming the tasks that did not answer in time.
        Interrupted: SIGTERM or SIGINT arrived (from the main thread only).
        ConfigError: a bad address, or this task's port is taken.
    """
    check_timeout(timeout_s)
    start = clock()
    deadline = start + float(timeout_s)
    name, address = tasks[me]
    missing = {i: t for i, t in enumerate(tasks) if i != me}
    for _, peer in missing.values():
        split_address(peer)
    listener = _listen(split_address(address)[1], address)
    heard, stop = set(), threading.Event()
    hello = _hello(tasks, me)
    prefix = hello.decode().rsplit(" ", 1)[0] + " "  # Ours but for the index.
    hearing = threading.Thread(target=_listen_for_hellos,
                               args=(listener, prefix, heard, stop), daemon=True)
    hearing.start()
    reached = set()
    try:
        with _signals_raise():
            log(f"{WAITING}: {name} listens at {address}; up to {float(timeout_s):g} s "
                f"(--startup_timeout_s) for {_names(missing.values())}")
            remind = start + _REMIND_S
            while missing:
                for i, (_, peer) in sorted(missing.items()):
                    if i not in reached and _say_hello(
                            peer, hello, max(min(1.0, deadline - clock()), 0.05)):
                        reached.add(i)
                    if i in reached and i in heard:
                        del missing[i]
                now = clock()
                if not missing:
                    break
                if now >= deadline:
                    raise StartupTimeout(
                        f"the cluster did not form within --startup_timeout_s="
                        f"{float(timeout_s):g}: {_names(missing.values())} did not connect "
                        f"(this is {name} at {address}); start the missing tasks, check "
                        f"their addresses, or raise --startup_timeout_s")
                if now >= remind:
                    log(f"{WAITING}: still no answer from {_names(missing.values())} after "
                        f"{now - start:.0f} s")
                    remind = now + _REMIND_S
                time.sleep(min(poll_s, max(deadline - now, 0)))
    finally:
        stop.set()
        hearing.join()
        listener.close()
    left = deadline - clock()
    log(f"all {len(tasks)} tasks answered after {clock() - start:.1f} s; joining the cluster")
    return max(left, 1.0)


def _names(tasks):
    tasks = list(tasks)
    shown = ", ".join(f"{n} ({a})" for n, a in tasks[:8])
    return shown + (f" and {len(tasks) - 8} more" if len(tasks) > 8 else "")
