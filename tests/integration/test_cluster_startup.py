"""Cluster start-up with real processes over loopback (issue 24): a worker or DTensor
client whose peer never starts gives up at --startup_timeout_s with one line naming the
peer's address, and a SIGTERM during the wait ends it at once with 143; nothing is
written either way. Tasks that start apart within the deadline train normally:
tests/integration/test_multi_worker.py and tests/parallel/test_parallel_clients.py
(each against one device / one process). The mechanics in-process:
tests/cluster/test_startup.py."""

import os
import signal
import threading
import time

import pytest

from conftest import TINY
from helpers.mw_helpers import Task
from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import launch, startup

pytestmark = pytest.mark.slow
KINDS = ["worker", "client"]  # multi_worker_mirrored, a DTensor mesh.


def task_1_alone(tmp_path, kind, timeout_s):
    """Task 1 of a 2-task cluster, started without task 0: (Task, task 0's address,
    workdir)."""
    hosts = [f"localhost:{port}" for port in launch.free_ports(2)]
    if kind == "worker":
        env, args = {"TF_CONFIG": cluster_env.tf_config(hosts, 1)}, [
            "--strategy=multi_worker_mirrored"]
    else:
        env, args = cluster_env.client_env(hosts, 1), ["--mesh=batch:2", "--num_cpu_devices=1"]
    workdir = tmp_path / "run"
    task = Task(tmp_path, "task1", [*TINY, f"--workdir={workdir}",
                                    f"--startup_timeout_s={timeout_s}", *args], env)
    return task, hosts, workdir


@pytest.mark.parametrize("kind", KINDS)
def test_a_task_whose_peer_never_starts_gives_up_in_time_naming_it(tmp_path, kind):
    task, hosts, workdir = task_1_alone(tmp_path, kind, timeout_s=5)
    try:
        waiting = task.wait_for(startup.WAITING)
        code, ended = task.finish(60)
    finally:
        task.close()
    assert code == 1, task.text()[-3000:]
    # 5 s from the line that says it waits; the rest is the exit of a TensorFlow process.
    assert ended - waiting < 5 + 3, task.text()[-3000:]
    errors = [line for line in task.text().splitlines() if line.startswith("error:")]
    assert errors == [f"error: the cluster did not form within --startup_timeout_s=5: "
                      f"{kind} 0 ({hosts[0]}) did not connect (this is {kind} 1 at "
                      f"{hosts[1]}); start the missing tasks, check their addresses, or "
                      f"raise --startup_timeout_s"], task.text()[-3000:]
    assert f"{startup.WAITING}: {kind} 1 listens at {hosts[1]}; up to 5 s" in task.text()
    assert not workdir.exists()  # No checkpoint, no run.json: nothing at all.


@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_while_waiting_for_the_cluster_exits_143_at_once(tmp_path, kind):
    task, _, workdir = task_1_alone(tmp_path, kind, timeout_s=300)
    try:
        waiting = task.wait_for(startup.WAITING)
        time.sleep(max(waiting + 10 - time.monotonic(), 0))  # 10 s into the wait.
        sent = time.monotonic()
        os.kill(task.proc.pid, signal.SIGTERM)
        code, ended = task.finish(30)
    finally:
        task.close()
    assert code == 143, task.text()[-3000:]
    assert ended - sent < 5
    assert "stopped by SIGTERM while waiting for the cluster; nothing was written" in task.text()
    assert not workdir.exists()


@pytest.mark.parametrize("kind, me", [("worker", 1), ("worker", 0), ("client", 1)])
def test_a_peer_that_answers_then_dies_ends_tensorflows_registration_naming_it(
        tmp_path, kind, me):
    # The other task (a thread here) answers the Python wait, then stops before
    # TensorFlow's registration: the binary's registration deadline (the time left) ends
    # it with one line naming that task; as the leader (task 0) and as a follower.
    hosts = [f"localhost:{port}" for port in launch.free_ports(2)]
    names = [(f"{kind} {i}", host) for i, host in enumerate(hosts)]
    if kind == "worker":
        env, args = {"TF_CONFIG": cluster_env.tf_config(hosts, me)}, [
            "--strategy=multi_worker_mirrored"]
    else:
        env, args = cluster_env.client_env(hosts, me), ["--mesh=batch:2", "--num_cpu_devices=1"]
    peer = threading.Thread(target=startup.wait_for_peers, args=(names, 1 - me, 60),
                            kwargs={"log": lambda line: None}, daemon=True)
    workdir = tmp_path / "run"
    task = Task(tmp_path, "task", [*TINY, f"--workdir={workdir}", "--startup_timeout_s=10",
                                   *args], env)
    try:
        peer.start()
        task.wait_for("all 2 tasks answered")
        joined = time.monotonic()
        code, ended = task.finish(60)
    finally:
        task.close()
    assert code == 1, task.text()[-3000:]
    assert ended - joined < 10 + 8, task.text()[-3000:]  # TensorFlow's RPC adds ~5 s.
    errors = [line for line in task.text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: the cluster did not form within --startup_timeout_s=10: every task "
        f"answered, then TensorFlow's registration failed waiting for {kind} {1 - me} "
        f"({hosts[1 - me]}) (this is {kind} {me} at {hosts[me]}): "), task.text()[-3000:]
    assert not workdir.exists()
