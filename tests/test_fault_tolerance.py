"""Fault tolerance with real processes: preemption (SIGTERM), a killed worker (kill -9),
and a process killed while saving a checkpoint. Every run that is interrupted and resumed
must end with the same generator as one that never was (zero steps lost or repeated)."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, TINY, run_cmd
from mw_helpers import ENV, Launcher, samples_of

pytestmark = pytest.mark.slow

ARGS = [*TINY, "--config.model.d_dropout=0.0"]


def straight_run(tmp_path, steps):
    """Samples of an uninterrupted one-device run of `steps` steps."""
    workdir = tmp_path / f"straight{steps}"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", "--strategy=one_device",
                    *ARGS, f"--config.train.num_steps={steps}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return samples_of(workdir, tmp_path / f"straight{steps}.npy")


def test_sigterm_to_one_worker_checkpoints_all_at_one_step_and_loses_nothing(tmp_path):
    workdir = tmp_path / "run"
    launcher = Launcher(tmp_path, [f"--workdir={workdir}", *ARGS, "--config.train.num_steps=60",
                                   "--config.train.checkpoint_every=1000"], max_restarts=1)
    try:
        launcher.wait_for("step 10:")  # The chief's log line at step 10.
        os.kill(launcher.worker_pid(1), signal.SIGTERM)
        assert launcher.finish() == 0, launcher.text()[-3000:]
    finally:
        launcher.close()
    log = launcher.text()
    saved = re.findall(r"\[worker (\d)\].*preemption: saved checkpoint at step (\d+)", log)
    assert sorted(w for w, _ in saved) == ["0", "1"], log[-3000:]
    step = int(saved[0][1])
    assert int(saved[1][1]) == step and 10 <= step < 60
    assert re.search(r"worker \d exited with code 143; worker exit codes \[143, 143\]", log)
    # Both workers resume exactly where they saved, and finish the configured steps.
    assert log.count(f"ckpt-{step} at step {step} of 60") == 2
    assert log.count("finished at step 60") == 2
    np.testing.assert_allclose(samples_of(workdir, tmp_path / "s.npy"),
                               straight_run(tmp_path, 60), atol=1e-4)


def test_sigterm_to_every_worker_at_once_saves_one_step(tmp_path):
    # What `scancel`, a node drain or Ctrl-C on the launcher do: all workers get SIGTERM.
    workdir = tmp_path / "run"
    launcher = Launcher(tmp_path, [f"--workdir={workdir}", *ARGS, "--config.train.num_steps=600",
                                   "--config.train.checkpoint_every=1000"], max_restarts=2)
    try:
        launcher.wait_for("step 10:")
        launcher.proc.send_signal(signal.SIGTERM)
        assert launcher.finish(timeout=120) == 128 + signal.SIGTERM
    finally:
        launcher.close()
    log = launcher.text()
    saved = re.findall(r"\[worker (\d)\].*preemption: saved checkpoint at step (\d+)", log)
    assert sorted(w for w, _ in saved) == ["0", "1"] and saved[0][1] == saved[1][1], log[-3000:]
    assert "worker exit codes [143, 143]" in log and log.count("starting 2 workers") == 1
    assert os.path.exists(workdir / "checkpoints" / f"ckpt-{saved[0][1]}.index")


def test_killed_worker_fails_the_others_in_bounded_time_and_restart_finishes(tmp_path):
    workdir = tmp_path / "run"
    timeout_s = 3
    launcher = Launcher(tmp_path, [f"--workdir={workdir}", *ARGS, "--config.train.num_steps=60",
                                   f"--peer_timeout_s={timeout_s}"], max_restarts=1)
    try:
        launcher.wait_for("step 10:")
        survivor = launcher.worker_pid(0)
        os.kill(launcher.worker_pid(1), signal.SIGKILL)
        killed_at = time.monotonic()
        while os.path.exists(f"/proc/{survivor}") and "Z" not in open(
                f"/proc/{survivor}/stat").read().rsplit(")", 1)[1].split()[0]:
            assert time.monotonic() - killed_at < timeout_s + 30, "worker 0 hangs"
            time.sleep(0.1)
        assert launcher.finish() == 0, launcher.text()[-3000:]
    finally:
        launcher.close()
    log = launcher.text()
    error = re.search(r"\[worker 0\] error: multi-worker run aborted, lost (\S+): ", log)
    assert error and error.group(1) == "/job:worker/replica:0/task:1", log[-3000:]
    resumed = re.findall(r"resumed \S+ckpt-(\d+) at step (\d+) of 60", log)
    assert len(resumed) == 2 and resumed[0] == resumed[1] and int(resumed[0][0]) >= 10
    assert log.count("finished at step 60") == 2
    np.testing.assert_allclose(samples_of(workdir, tmp_path / "s.npy"),
                               straight_run(tmp_path, 60), atol=1e-4)


# Runs the real binary, but SIGKILLs the process once the files of ckpt-10 are written and
# before the checkpoint index says so: the worst moment of a save.
KILL_DURING_SAVE = """
import os, runpy, signal, sys
from tensorflow.python.checkpoint import checkpoint_management as cm
record = cm.update_checkpoint_state_internal
def record_or_die(save_dir, model_checkpoint_path, *args, **kwargs):
    if model_checkpoint_path.endswith("-10"):
        os.kill(os.getpid(), signal.SIGKILL)
    return record(save_dir, model_checkpoint_path, *args, **kwargs)
cm.update_checkpoint_state_internal = record_or_die
sys.argv = ["tf_gan_scale.main"] + sys.argv[1:]
runpy.run_module("tf_gan_scale.main", run_name="__main__")
"""


def test_kill_during_a_save_leaves_a_restorable_latest_checkpoint(tmp_path):
    workdir = tmp_path / "run"
    args = [f"--workdir={workdir}", "--strategy=one_device", *ARGS,
            "--config.train.num_steps=15"]
    proc = run_cmd(["-c", KILL_DURING_SAVE, *args])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert os.path.exists(workdir / "checkpoints" / "ckpt-10.index")  # Written, not recorded.
    proc = run_cmd(["-m", "tf_gan_scale.main", *args])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ckpt-5 at step 5 of 15" in proc.stderr
    np.testing.assert_allclose(samples_of(workdir, tmp_path / "s.npy"),
                               straight_run(tmp_path, 15), atol=1e-6)


def test_sigterm_to_a_single_process_run_saves_and_resumes(tmp_path):
    workdir = tmp_path / "run"
    args = [f"--workdir={workdir}", "--strategy=mirrored", "--num_cpu_devices=2", *ARGS,
            "--config.train.num_steps=60", "--config.train.checkpoint_every=1000"]
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "tf_gan_scale.main", *args], cwd=REPO,
                            env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "step 10:" not in (tmp_path / "log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    step = int(re.search(r"preemption: saved checkpoint at step (\d+)",
                         (tmp_path / "log").read_text()).group(1))
    assert os.path.exists(workdir / "checkpoints" / f"ckpt-{step}.index")
    proc = run_cmd(["-m", "tf_gan_scale.main", *args, "--config.train.num_steps=" + str(step + 5)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"ckpt-{step} at step {step} of {step + 5}" in proc.stderr
