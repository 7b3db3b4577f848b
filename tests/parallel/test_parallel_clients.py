"""A DTensor mesh over several processes (DTensor clients): the cluster each process
joins (DTENSOR_*, or derived from TF_CONFIG and Slurm), the launcher, and real runs of two
local clients: equal to one process after a preemption and resume, and loud when a
client is lost.
"""

import json
import os
import signal
import sys
import time

import pytest

from conftest import TINY, run_cmd, run_in_process
from helpers.mw_helpers import ENV, Launcher, Task, assert_same_checkpoint, checkpoint_arrays
from tf_gan_scale import errors
from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import launch, startup
from tf_gan_scale.parallel import mesh as mesh_lib

HOSTS = ["10.0.0.1:8888", "10.0.0.2:8888"]


def dtensor_env(cid, hosts=HOSTS):
    return {"DTENSOR_JOBS": ",".join(hosts), "DTENSOR_CLIENT_ID": str(cid),
            "DTENSOR_NUM_CLIENTS": str(len(hosts)), "DTENSOR_JOB_NAME": "worker"}


def test_clients_from_tf_config():
    cfg = {"cluster": {"worker": HOSTS}, "task": {"type": "worker", "index": 1}}
    assert cluster_env.client_env_from({"TF_CONFIG": json.dumps(cfg)}) == dtensor_env(1)
    # A chief comes first: it is client 0, the workers follow in order.
    cfg = {"cluster": {"chief": ["c:1"], "worker": HOSTS}, "task": {"type": "worker", "index": 0}}
    assert cluster_env.client_env_from({"TF_CONFIG": json.dumps(cfg)}) == dtensor_env(
        1, ["c:1", *HOSTS])
    # One task, or no cluster at all: one process, nothing to join.
    one = {"cluster": {"worker": HOSTS[:1]}, "task": {"type": "worker", "index": 0}}
    assert cluster_env.client_env_from({"TF_CONFIG": json.dumps(one)}) == {}
    assert cluster_env.client_env_from({}) == {}


def test_clients_from_a_slurm_step():
    env = {"SLURM_PROCID": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
           "SLURM_STEP_NODELIST": "node[01-02]", "TF_GAN_SCALE_PORT": "9000"}
    assert cluster_env.client_env_from(env) == dtensor_env(
        3, ["node01:9000", "node01:9001", "node02:9000", "node02:9001"])


def test_dtensor_variables_win_and_are_checked():
    cfg = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}
    env = {**dtensor_env(1), "TF_CONFIG": json.dumps(cfg)}
    assert cluster_env.client_env_from(env) == {}  # Already set: kept as they are.
    # None: unset. DTensor itself takes a missing client id for 0: two chiefs.
    for bad in ({"DTENSOR_CLIENT_ID": "2"}, {"DTENSOR_NUM_CLIENTS": "3"},
                {"DTENSOR_CLIENT_ID": "one"}, {"DTENSOR_JOBS": "10.0.0.1,10.0.0.2"},
                {"DTENSOR_CLIENT_ID": None}):
        env = {k: v for k, v in {**dtensor_env(1), **bad}.items() if v is not None}
        with pytest.raises(errors.ConfigError, match="bad DTensor cluster: DTENSOR_JOBS=.*"
                                                     "valid: DTENSOR_JOBS=host:port"):
            cluster_env.client_env_from(env)
    one = {"DTENSOR_JOBS": "localhost:1"}  # One client: its id may be left out.
    assert cluster_env.client_env_from(one) == {}


def test_launcher_starts_dtensor_clients():
    cmd = ["python", "-m", "tf_gan_scale.main", "--workdir=/tmp/x"]
    commands = launch.worker_commands(cmd, 2, 2, 0, ports=[7001, 7002], mesh="batch:2,model:2")
    hosts = ["127.0.0.1:7001", "127.0.0.1:7002"]
    for i, (argv, env) in enumerate(commands):
        assert env == dtensor_env(i, hosts)  # No TF_CONFIG.
        assert argv == cmd + ["--mesh=batch:2,model:2", "--num_cpu_devices=2"]
    with pytest.raises(errors.ConfigError, match=r"needs 8 devices, the run has 4 devices "
                                                 r"\(2 workers x 2\); meshes that fit: "
                                                 r"batch:4,model:1, batch:2,model:2"):
        launch.worker_commands(cmd, 2, 2, 0, ports=[1, 2], mesh="batch:4,model:2")
    with pytest.raises(ValueError, match="give it once"):
        launch.worker_commands(cmd + ["--mesh=batch:4"], 2, 2, 0, ports=[1, 2], mesh="batch:4")


def test_launcher_refuses_a_mesh_that_does_not_fit_before_starting():
    proc = run_in_process(["tools/launch_local.py", "--num_workers=2", "--mesh=batch:1,model:4",
                    "--", "python", "-c", "raise SystemExit(7)"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --mesh=batch:1,model:4 needs 4 devices, the run has 2 devices (2 workers "
        "x 1); meshes that fit: batch:2,model:1, batch:1,model:2")
    assert "[launch]" not in proc.stdout  # No worker started.


# ---- real clients -------------------------------------------------------------------

NO_GCE = {"GCE_METADATA_IP": ENV["GCE_METADATA_IP"]}
# Adam (the digits config's), D without batch norm (tests/parallel/test_parallel_run.py), 40 steps:
# enough for a SIGTERM at step 5 to land mid-run.
ARGS = [*TINY, "--config.model.d_norm=none", "--config.train.num_steps=40"]
MESH = "batch:2,model:2"


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """The same mesh in ONE process of 4 logical CPUs, uninterrupted: what two clients
    must reproduce bit for bit. (Their collectives over "batch" add two partial sums,
    which float addition does exactly in either order: measured identical at step 40.
    Against one device the mesh agrees to 1e-7 up to step 29 of this run, then Adam
    turns a rounding-level difference into 1e-4 steps of a G kernel at step 30 (traced
    step by step, in-process too): the one-device comparisons stop at 10 steps, in
    tests/parallel/test_parallel_run.py and test_parallel_step.py.)"""
    workdir = tmp_path_factory.mktemp("one_process") / "run"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *ARGS,
                    f"--mesh={MESH}", "--num_cpu_devices=4"], env=NO_GCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir


@pytest.mark.slow  # A one-device run and two 2-client attempts, ~1 min.
def test_two_clients_equal_one_process_through_a_preemption(tmp_path, one_process_run):
    """2 processes x 2 logical CPUs as one batch:2,model:2 mesh (batch split across the
    processes, G's and D's Dense kernels within each). SIGTERM to client 1 mid-run: both
    save at the same step and exit 143, the launcher restarts them, they resume, and the
    final checkpoint equals the one-process run's bit for bit (every variable, Adam's
    moments and counters included): a lost or repeated step would show."""
    workdir = tmp_path / "run"
    launcher = Launcher(tmp_path, [f"--workdir={workdir}", *ARGS], mesh=MESH,
                        devices_per_worker=2, max_restarts=1)
    try:
        launcher.wait_for("step 5:")  # The chief's log line at step 5 of 40.
        os.kill(launcher.worker_pid(1), signal.SIGTERM)
        assert launcher.finish() == 0, launcher.text()[-3000:]
    finally:
        launcher.close()
    log = launcher.text()
    saved = {line.split("]")[0] + "]": line.rsplit(" ", 1)[1]
             for line in log.splitlines() if "preemption: saved checkpoint at step" in line}
    assert sorted(saved) == ["[client 0]", "[client 1]"], log[-3000:]
    assert len(set(saved.values())) == 1  # The same step on both clients.
    step = int(saved["[client 0]"])
    assert 5 <= step < 40
    assert "exited with code 143" in log and "restarting the group" in log
    assert f"resumed {workdir}/checkpoints/ckpt-{step} at step {step} of 40" in log
    assert "mesh batch:2,model:2 (CPU, 2 processes)" in log
    # Only the chief wrote the workdir (one event file per attempt, grids, the merged
    # checkpoints) but for each client's own log, both attempts' lines in one file.
    assert len([f for f in os.listdir(workdir / "logs") if "tfevents" in f]) == 2
    for i in (0, 1):
        lines = (workdir / "logs" / f"client_{i}.log").read_text().splitlines()
        assert all(ln.startswith(f"[client {i}] ") for ln in lines), lines[:5]
        assert sum("preemption: saved checkpoint" in ln for ln in lines) == 1
    assert (workdir / "samples" / "step_0000040.png").is_file()
    assert_same_checkpoint(checkpoint_arrays(workdir), checkpoint_arrays(one_process_run))


@pytest.mark.slow  # ~25 s: a peer is declared lost after ~10 s without heartbeats.
def test_a_lost_client_fails_the_other_loudly(tmp_path):
    launcher = Launcher(tmp_path, [f"--workdir={tmp_path / 'run'}", *ARGS,
                                   "--config.train.num_steps=100000"],
                        mesh="batch:1,model:2", grace_s=60)
    try:
        launcher.wait_for("step 5:")
        os.killpg(launcher.worker_pid(1), signal.SIGKILL)
        assert launcher.finish(timeout=120) == 137, launcher.text()[-3000:]
    finally:
        launcher.close()
    lines = [ln for ln in launcher.text().splitlines() if ln.startswith("[client 0] error:")]
    assert lines and lines[-1].startswith(
        "[client 0] error: multi-worker run aborted, lost /job:worker/replica:0/task:1"), \
        launcher.text()[-3000:]
    # DTensor names client 1 /job:worker/task:1; the line names client 1's log file.
    assert lines[-1].endswith(f"; last lines: {tmp_path / 'run' / 'logs' / 'client_1.log'}")
    # The launcher calls each process what it calls itself: client 1 (not "worker 1").
    assert "[launch] client 1 exited with code 137" in launcher.text(), launcher.text()[-3000:]


@pytest.mark.slow  # 2 clients that fail before training, ~30 s with the setup run.
def test_clients_that_restore_different_steps_refuse_to_train(tmp_path):
    """Each client reads the workdir it is given: one that is not shared (here, a
    directory per client) would resume client 0 at step 5 and client 1 at 0, and their
    collectives would not match. Both stop with one line, before writing anything."""
    base = tmp_path / "per_client"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={base / '0'}", *ARGS,
                    "--config.train.num_steps=5", "--strategy=one_device"], env=NO_GCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = sorted(os.listdir(base / "0" / "checkpoints"))
    # bash picks the client's own directory; launch_local adds --mesh after "$@".
    proc = run_cmd(["tools/launch_local.py", "--num_workers=2", "--mesh=batch:2,model:1",
                    "--", "bash", "-c",
                    'exec "$0" -m tf_gan_scale.main --workdir="$BASE/$DTENSOR_CLIENT_ID" "$@"',
                    sys.executable, *ARGS], env={**NO_GCE, "BASE": str(base),
                                                 # Cold clients (docs/testing.md, warm
                                                 # starts: what stays cold).
                                                 "TF_GAN_SCALE_COLD_START": "1"}, timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if "error:" in ln]
    for client, step in ((0, 5), (1, 0)):
        expected = (f"[client {client}] error: the clients restored different steps (0 to "
                    f"5; client {client}: {step}) from --workdir={base / str(client)}; valid: "
                    f"one directory that every client shares")
        assert any(ln.startswith(expected) for ln in lines), proc.stdout[-3000:]
    assert not (base / "1").exists() or not os.listdir(base / "1")
    assert sorted(os.listdir(base / "0" / "checkpoints")) == before


class _View:
    """What the callbacks read of a mesh run's HostView; counts refreshes of G's copy."""

    def __init__(self):
        import keras
        self.latent_dim, self.num_classes, self.stop_training = 4, 0, False
        self.g_optimizer = self.d_optimizer = keras.optimizers.SGD(0.1)
        self.current, self.refreshed = 0, []

    @property
    def step(self):
        import tensorflow as tf
        return tf.constant(self.current, tf.int64)

    @property
    def sampler(self):
        if self.current not in self.refreshed:  # As HostView: once per step.
            self.refreshed.append(self.current)
        return None

    def generate(self, z, labels=None):
        import tensorflow as tf
        self.sampler  # noqa: B018
        return tf.zeros((len(z), 8, 8, 1))


@pytest.mark.parametrize("chief", [True, False])
def test_every_client_refreshes_g_and_saves_at_the_same_steps(tmp_path, monkeypatch, chief):
    """The chief's sample grids (every 5 steps) and scores (every 7) gather G's host copy;
    another client must gather at exactly those steps too (SyncHost, and its scores), and
    write its part of each checkpoint at the chief's steps, recording none."""
    import tensorflow as tf
    from tf_gan_scale import configs, data
    from tf_gan_scale.training import mesh_runner
    config = configs.base()
    config.train.num_steps, config.train.sample_every, config.train.checkpoint_every = 10, 5, 5
    config.eval.every, config.eval.best = 7, ""
    monkeypatch.setattr(mesh_lib, "clients", lambda: (0, 1) if chief else (1, 2))
    monkeypatch.setattr(mesh_lib, "cluster",
                        lambda: __import__("types").SimpleNamespace(cluster_resolver=None))
    view = _View()

    def score():
        view.sampler  # noqa: B018
        return {"fid": 1.0, "extractor": "test", "num_samples": 2}

    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    cbs = mesh_runner.callbacks_for(config, data.load(config.data.source), None, checkpoint,
                                    str(tmp_path), 0, 0, score)
    for cb in cbs:
        cb.set_model(view)
    for cb in cbs:
        cb.on_train_begin()
    for step in range(1, 11):
        view.current = step
        for cb in cbs:
            cb.on_train_batch_end(step - 1, {"d_loss": 1.0, "g_loss": 1.0})
    for cb in cbs:
        cb.on_train_end()
    assert view.refreshed == [5, 7, 10]
    saved = sorted(f for f in os.listdir(tmp_path / "checkpoints") if f.endswith(".index"))
    assert saved == ["ckpt-10.index", "ckpt-5.index"]
    # Only the chief records checkpoints (the index) and writes run.json and samples.
    assert (tmp_path / "checkpoints" / "checkpoint").exists() == chief
    assert (tmp_path / "run.json").exists() == chief
    assert (tmp_path / "samples").exists() == chief


@pytest.mark.slow  # One 4-CPU process and two 2-CPU clients of the tiny BigGAN, ~1.5 min.
def test_two_clients_train_the_conditional_biggan_as_one_process_though_one_starts_late(
        tmp_path):
    """The conditional BigGAN (tests/helpers/tiny_biggan_config.py: hierarchical z, shared
    embedding, cBN, self-attention, spectral norm, projection D, LeCam, an EMA) on one
    batch:2,model:2 mesh over 2 processes x 2 logical CPUs ends where the same mesh in
    one process ends, every checkpointed variable: labels, latents and the split
    embeddings meet across processes as within one. Client 1 waits for client 0, which
    starts 3 s later: the mesh forms all the same (issue 24; issue 22 folded the
    DCGAN's own late-start run into this one)."""
    import numpy as np
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.integers(0, 256, (64, 16, 16, 1)).astype(np.uint8),
             y=np.arange(64) % 4)
    args = ["--config=tests/helpers/tiny_biggan_config.py", f"--config.data.source=npz:{data}"]
    one = tmp_path / "one"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={one}", *args, f"--mesh={MESH}",
                    "--num_cpu_devices=4"], env=NO_GCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = tmp_path / "two"
    hosts = [f"localhost:{port}" for port in launch.free_ports(2)]
    args = [f"--workdir={two}", *args, f"--mesh={MESH}", "--num_cpu_devices=2",
            "--startup_timeout_s=120"]
    late = Task(tmp_path, "client1", args, cluster_env.client_env(hosts, 1))
    try:
        time.sleep(max(late.wait_for(startup.WAITING) + 3 - time.monotonic(), 0))
        chief = Task(tmp_path, "client0", args, cluster_env.client_env(hosts, 0))
        assert chief.finish(240)[0] == 0, chief.text()[-3000:]
        assert late.finish(60)[0] == 0, late.text()[-3000:]
    finally:
        late.close()
    assert "all 2 tasks answered after " in late.text()
    assert "mesh batch:2,model:2 (CPU, 2 processes)" in chief.text()
    assert_same_checkpoint(checkpoint_arrays(two), checkpoint_arrays(one))
