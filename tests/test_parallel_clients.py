"""A DTensor mesh over several processes (DTensor clients): the cluster each process
joins (DTENSOR_*, or derived from TF_CONFIG and Slurm), the launcher, and real runs of two
local clients: equal to one process after a preemption and resume, and loud when a
client is lost.
"""

import json
import os
import signal

import pytest

from conftest import TINY, run_cmd
from mw_helpers import ENV, Launcher, assert_same_checkpoint, checkpoint_arrays
from tf_gan_scale import errors, launch
from tf_gan_scale.parallel import mesh as mesh_lib

HOSTS = ["10.0.0.1:8888", "10.0.0.2:8888"]


def dtensor_env(cid, hosts=HOSTS):
    return {"DTENSOR_JOBS": ",".join(hosts), "DTENSOR_CLIENT_ID": str(cid),
            "DTENSOR_NUM_CLIENTS": str(len(hosts)), "DTENSOR_JOB_NAME": "worker"}


def test_clients_from_tf_config():
    cfg = {"cluster": {"worker": HOSTS}, "task": {"type": "worker", "index": 1}}
    assert mesh_lib.client_env_from({"TF_CONFIG": json.dumps(cfg)}) == dtensor_env(1)
    # A chief comes first: it is client 0, the workers follow in order.
    cfg = {"cluster": {"chief": ["c:1"], "worker": HOSTS}, "task": {"type": "worker", "index": 0}}
    assert mesh_lib.client_env_from({"TF_CONFIG": json.dumps(cfg)}) == dtensor_env(
        1, ["c:1", *HOSTS])
    # One task, or no cluster at all: one process, nothing to join.
    one = {"cluster": {"worker": HOSTS[:1]}, "task": {"type": "worker", "index": 0}}
    assert mesh_lib.client_env_from({"TF_CONFIG": json.dumps(one)}) == {}
    assert mesh_lib.client_env_from({}) == {}


def test_clients_from_a_slurm_step():
    env = {"SLURM_PROCID": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
           "SLURM_STEP_NODELIST": "node[01-02]", "TF_GAN_SCALE_PORT": "9000"}
    assert mesh_lib.client_env_from(env) == dtensor_env(
        3, ["node01:9000", "node01:9001", "node02:9000", "node02:9001"])


def test_dtensor_variables_win_and_are_checked():
    cfg = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}
    env = {**dtensor_env(1), "TF_CONFIG": json.dumps(cfg)}
    assert mesh_lib.client_env_from(env) == {}  # Already set: kept as they are.
    for bad in ({"DTENSOR_CLIENT_ID": "2"}, {"DTENSOR_NUM_CLIENTS": "3"},
                {"DTENSOR_CLIENT_ID": "one"}, {"DTENSOR_JOBS": "10.0.0.1,10.0.0.2"}):
        with pytest.raises(errors.ConfigError, match="bad DTensor cluster: DTENSOR_JOBS=.*"
                                                     "valid: DTENSOR_JOBS=host:port"):
            mesh_lib.client_env_from({**dtensor_env(1), **bad})


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
    proc = run_cmd(["tools/launch_local.py", "--num_workers=2", "--mesh=batch:1,model:4",
                    "--", "python", "-c", "raise SystemExit(7)"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --mesh=batch:1,model:4 needs 4 devices, the run has 2 devices (2 workers "
        "x 1); meshes that fit: batch:2,model:1, batch:1,model:2")
    assert "[launch]" not in proc.stdout  # No worker started.


# ---- real clients -------------------------------------------------------------------

NO_GCE = {"GCE_METADATA_IP": ENV["GCE_METADATA_IP"]}
# Adam (the digits config's), D without batch norm (tests/test_parallel_run.py), 40 steps:
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
    tests/test_parallel_run.py and test_parallel_step.py.)"""
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
    assert sorted(saved) == ["[worker 0]", "[worker 1]"], log[-3000:]
    assert len(set(saved.values())) == 1  # The same step on both clients.
    step = int(saved["[worker 0]"])
    assert 5 <= step < 40
    assert "exited with code 143" in log and "restarting the group" in log
    assert f"resumed {workdir}/checkpoints/ckpt-{step} at step {step} of 40" in log
    assert "mesh batch:2,model:2 (CPU, 2 processes)" in log
    # Only the chief wrote the workdir: one event file, grids, the merged checkpoints.
    assert len(os.listdir(workdir / "logs")) == 2  # One per attempt of the chief.
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
    lines = [ln for ln in launcher.text().splitlines() if ln.startswith("[worker 0] error:")]
    assert lines and lines[-1].startswith(
        "[worker 0] error: multi-worker run aborted, lost /job:worker/replica:0/task:1"), \
        launcher.text()[-3000:]
    assert "worker 1 exited with code 137" in launcher.text()
