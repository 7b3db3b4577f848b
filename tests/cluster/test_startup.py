"""cluster/startup.py in this process (real sockets over loopback, real signals, no
TensorFlow): the deadline names the task that never came, late peers within it are fine,
SIGTERM ends the wait, and the launcher names a worker that never joined. The same with
the real binary, for workers and DTensor clients, is in tests/integration/test_cluster_startup.py."""

import io
import os
import signal
import socket
import threading
import time

import pytest

from tf_gan_scale import errors
from tf_gan_scale.cluster import launch, startup
from test_launch_local import write_worker


def tasks(n):
    return [(f"worker {i}", f"localhost:{port}") for i, port in enumerate(launch.free_ports(n))]


def test_a_task_alone_gives_up_at_the_deadline_naming_the_missing_task():
    cluster, lines = tasks(3), []
    t0 = time.monotonic()
    with pytest.raises(startup.StartupTimeout) as e:
        startup.wait_for_peers(cluster, 1, timeout_s=1.0, log=lines.append)
    elapsed = time.monotonic() - t0
    # Not before the deadline, and soon after it (slack for a loaded 2-core machine).
    assert 1.0 <= elapsed < 10.0
    assert str(e.value) == (
        f"the cluster did not form within --startup_timeout_s=1: worker 0 ({cluster[0][1]}), "
        f"worker 2 ({cluster[2][1]}) did not connect (this is worker 1 at {cluster[1][1]}); "
        f"start the missing tasks, check their addresses, or raise --startup_timeout_s")
    assert lines == [f"waiting for the cluster: worker 1 listens at {cluster[1][1]}; up to 1 s "
                     f"(--startup_timeout_s) for worker 0 ({cluster[0][1]}), worker 2 "
                     f"({cluster[2][1]})"]
    # The port is free again (TensorFlow's gRPC server binds it next).
    socket.create_server(("", int(cluster[1][1].rsplit(":", 1)[1]))).close()


def test_tasks_that_start_apart_within_the_deadline_all_join():
    # Task 0 waits (in a thread) 1 s before task 1 starts; both return, with the time
    # left of their deadlines. Neither waits for the other forever: each answers while
    # it waits.
    cluster, out = tasks(2), {}

    def first():
        out[0] = startup.wait_for_peers(cluster, 0, timeout_s=10, log=lambda line: None)

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(1.0)
    lines = []
    out[1] = startup.wait_for_peers(cluster, 1, timeout_s=10, log=lines.append)
    thread.join(10)
    assert not thread.is_alive()
    assert 8.0 < out[0] < 9.2 and 9.0 < out[1] <= 10
    assert lines[-1].startswith("all 2 tasks answered after ")


def test_a_listener_that_is_not_a_waiting_task_does_not_count():
    # Worker 0's port answers, but not as a task waiting here (e.g. a stale server or a
    # port scanner's target): it never says hello, so worker 1 does not move on alone.
    cluster = tasks(2)
    server = socket.create_server(("", int(cluster[0][1].rsplit(":", 1)[1])))
    try:
        with pytest.raises(startup.StartupTimeout, match="worker 0 .* did not connect"):
            startup.wait_for_peers(cluster, 1, timeout_s=1, log=lambda line: None)
    finally:
        server.close()


def test_a_peer_that_says_hello_but_cannot_be_reached_is_still_missing():
    # Worker 0 reaches worker 1 (its hello arrives, every 0.1 s) but listens nowhere that
    # worker 1 can reach: worker 1 must not move on, since worker 0 still waits for its
    # hello. A hello of ANOTHER cluster (other addresses) counts for nothing either.
    cluster, stop = tasks(2), threading.Event()
    other = [(n, a.replace("localhost", "127.0.0.1")) for n, a in cluster]

    def say_hello():
        while not stop.is_set():
            for hello in (startup._hello(cluster, 0), startup._hello(other, 0)):
                startup._say_hello(cluster[1][1], hello, 0.5)
            time.sleep(0.1)

    thread = threading.Thread(target=say_hello)
    thread.start()
    try:
        with pytest.raises(startup.StartupTimeout, match=r"worker 0 \(localhost:\d+\) did not"):
            startup.wait_for_peers(cluster, 1, timeout_s=1.5, log=lambda line: None)
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_waiting_raises_interrupted_and_restores_the_handlers(sig):
    before = signal.getsignal(sig)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), sig))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(startup.Interrupted, match=f"^stopped by {sig.name} while waiting for "
                                                  f"the cluster; nothing was written$"):
        startup.wait_for_peers(tasks(2), 0, timeout_s=60, log=lambda line: None)
    assert time.monotonic() - t0 < 30  # The signal (0.5 s) ended it, not the 60 s timeout.
    assert signal.getsignal(sig) is before


def test_a_preempted_process_exits_128_plus_sigterm():
    # Kubernetes, Slurm and the launcher read 143 (128 + SIGTERM) as "stopped after
    # saving: restart me" (the binary's start-up wait exits with the same constant). In
    # process here (not tf_gan_scale.main: importing it defines the binary's absl flags in
    # this process); the slow tier's SIGTERM runs check both paths end to end.
    from tf_gan_scale.training import callbacks
    with pytest.raises(SystemExit) as e:
        callbacks.Preemption(strategy=None, manager=None)._exit()
    assert e.value.code == 128 + signal.SIGTERM


@pytest.mark.parametrize("timeout", [0, -1, "5", None])
def test_a_bad_timeout_is_one_line(timeout):
    with pytest.raises(errors.ConfigError, match=r"^--startup_timeout_s must be > 0 seconds; "
                                                 r"Received: "):
        startup.wait_for_peers(tasks(2), 0, timeout_s=timeout)


def test_a_taken_port_or_a_bad_address_is_one_line():
    cluster = tasks(2)
    port = int(cluster[0][1].rsplit(":", 1)[1])
    with socket.create_server(("", port)):
        with pytest.raises(errors.ConfigError, match=(
                rf"^cannot listen at this task's address localhost:{port} \(.*\); another "
                rf"process holds port {port}, or the cluster description gives this task a "
                rf"wrong address$")):
            startup.wait_for_peers(cluster, 0, timeout_s=5)
    with pytest.raises(errors.ConfigError, match=r"^bad task address 'nohost'; valid: host:port"):
        startup.wait_for_peers([cluster[0], ("worker 1", "nohost")], 0, timeout_s=5)


def test_the_launcher_names_the_worker_that_never_joined(tmp_path):
    # Worker 1 reaches the cluster (logs the WAITING line) and gives up; worker 0 is stuck
    # before it (a slow import, a dead disk): the launcher's last line names it.
    cmd = write_worker(tmp_path, f"""
        if INDEX == 1:
            print("I1204 startup.py:1] {startup.WAITING}: worker 1 listens ...", flush=True)
            time.sleep(0.5)
            print("error: the cluster did not form", flush=True)
            sys.exit(1)
        time.sleep(600)
    """)
    out = io.StringIO()
    assert launch.launch(cmd, 2, grace_s=1, out=out) == 1, out.getvalue()
    assert out.getvalue().splitlines()[-1] == (
        "[launch] worker 1 exited with code 1; worker exit codes [137, 1]; "
        "never joined: worker 0")
