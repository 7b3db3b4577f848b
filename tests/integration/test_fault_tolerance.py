"""Fault tolerance with real processes: preemption (SIGTERM), a killed worker (kill -9),
and a process killed while saving a checkpoint. Every run that is interrupted and resumed
must end with the same training state as one of the same topology that never was: every
checkpointed variable (G and D weights, batch-norm statistics, both optimizers' slots and
iteration counts) bit for bit. Training is deterministic (stateless randomness keyed by
the step, fixed ring all-reduce order, data position restored from the step), so any lost
or repeated step or wrong data position shows as a difference.

Measured (2 loaded cores, TF 2.21): six uninterrupted 2-worker 60-step runs
(checkpoint_every 1, 5 or 1000; with and without --peer_timeout_s=3) and a 2-replica
mirrored run ended with bit-identical checkpoints, so one reference run serves all 2-worker
tests; the resumed runs below match theirs bit for bit. What the comparison must catch,
as max |diff| in weights / Adam slots / batch-norm statistics vs the final reference:
  one step lost (the reference's ckpt-59)                       4.9e-4 / 0.028 / 6.4e-3
  resumed at step 12 one batch ahead of the data position       1.3e-3 / 0.039 / 2.0e-4
  resumed at step 12 one batch behind (a batch repeated)        1.0e-3 / 0.028 / 2.8e-4
(62-64 of 68 variables differ). Summation order alone moves a weight as far: one device vs
2 workers (same math) ended 1.1e-3 apart in a D conv bias that batch norm follows (its
gradient is rounding noise, which Adam scales to whole steps; other weights within 7e-7),
so no tolerance tells these apart. Hence an exact comparison, with a run of the same
topology.
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, TINY, run_cmd
from helpers.mw_helpers import ENV, Launcher, assert_same_checkpoint, checkpoint_arrays

pytestmark = pytest.mark.slow

ARGS = [*TINY, "--config.model.d_dropout=0.0"]
# StyleGAN2-ADA, tiny, on the digits (8x8): every piece of state a resume must bring back
# is reached within 15 steps: lazy R1 (every 4th step) and path length (every 3rd) as
# their own phases with pl_mean, style mixing, ADA's p adjusted every 2 steps toward a
# target the sign statistic passes, the kimg EMA, w_avg and the noise call counter.
SG2_ARGS = ["--config=experiments/stylegan2_mnist.py", "--config.data.source=embedded:digits",
            "--config.model.latent_dim=8", "--config.model.w_dim=8",
            "--config.model.fmaps=0.00390625", "--config.model.channel_max=4",
            "--config.model.mbstd_group=2", "--config.model.mbstd_chunk=4",
            "--config.train.global_batch_size=8", "--config.train.steps_per_execution=1",
            "--config.train.penalty_every=4", "--config.train.pl_every=3",
            "--config.train.ada_interval=2", "--config.train.ada_kimg=0.01",
            "--config.train.ada_target=0.01", "--config.train.log_every=1",
            "--config.train.sample_every=0"]
NO_GCE = {"GCE_METADATA_IP": ENV["GCE_METADATA_IP"]}


@pytest.fixture(scope="module")
def two_workers_60(tmp_path_factory):
    """Workdir of an uninterrupted 2-worker run of 60 steps: the reference of the 2-worker
    tests. It checkpoints every step (ckpt-58..60 are kept); how often a run checkpoints,
    and --peer_timeout_s, do not change its weights (measured: bit-identical)."""
    tmp = tmp_path_factory.mktemp("two_workers_60")
    launcher = Launcher(tmp, [f"--workdir={tmp / 'run'}", *ARGS, "--config.train.num_steps=60",
                              "--config.train.checkpoint_every=1"])
    assert launcher.finish() == 0, launcher.text()[-3000:]
    return tmp / "run"


def straight_run(tmp_path, steps, *flags, args=ARGS):
    """Workdir of an uninterrupted single-process run of `steps` steps."""
    workdir = tmp_path / f"straight{steps}"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *flags, *args,
                    f"--config.train.num_steps={steps}"], env=NO_GCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir


def test_checkpoint_comparison_sees_one_lost_step(two_workers_60):
    # The check the tests below rely on sees a lost step (see the numbers above).
    final = checkpoint_arrays(two_workers_60)
    assert_same_checkpoint(checkpoint_arrays(two_workers_60, step=60), final)
    with pytest.raises(AssertionError, match="variables differ"):
        assert_same_checkpoint(checkpoint_arrays(two_workers_60, step=59), final)


def test_sigterm_to_one_worker_checkpoints_all_at_one_step_and_loses_nothing(
        tmp_path, two_workers_60):
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
    assert_same_checkpoint(checkpoint_arrays(workdir), checkpoint_arrays(two_workers_60))


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


# Worker 0 must report the lost peer and exit within --peer_timeout_s + this, counted from
# the kill -9 of worker 1. Measured over 15 runs with --peer_timeout_s=3 (2 cores, load
# 2-4.6): through the heartbeat timeout, the error line came 2.0-3.5 s after the kill and
# worker 0 exited at 3.5-4.8 s; when the ring all-reduce saw the connection reset first,
# 0.06-0.1 s and 0.9-1.3 s. A heartbeat sent just before the kill makes it less than the
# timeout; process exit adds about 1-1.5 s.
DETECTION_MARGIN_S = 5


def _running(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_worker_fails_the_others_in_bounded_time_and_restart_finishes(
        tmp_path, two_workers_60):
    workdir = tmp_path / "run"
    timeout_s = 3
    lost = "[worker 0] error: multi-worker run aborted, lost "
    launcher = Launcher(tmp_path, [f"--workdir={workdir}", *ARGS, "--config.train.num_steps=60",
                                   f"--peer_timeout_s={timeout_s}"], max_restarts=1)
    try:
        launcher.wait_for("step 10:")
        survivor, victim = launcher.worker_pid(0), launcher.worker_pid(1)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()  # The clock starts at the kill.
        while lost not in launcher.text() or _running(survivor):
            assert time.monotonic() - killed_at < timeout_s + DETECTION_MARGIN_S, (
                f"worker 0 did not report the lost peer and exit within {timeout_s} + "
                f"{DETECTION_MARGIN_S} s of the kill:\n{launcher.text()[-3000:]}")
            time.sleep(0.05)
        assert launcher.finish() == 0, launcher.text()[-3000:]
    finally:
        launcher.close()
    log = launcher.text()
    error = re.search(r"\[worker 0\] error: multi-worker run aborted, lost (\S+): .*$", log,
                      re.MULTILINE)
    assert error and error.group(1) == "/job:worker/replica:0/task:1", log[-3000:]
    # It names the file with the lost worker's last lines: every task's lines, prefixed
    # once (the launcher adds none to the binary's own), in logs/<task>.log of the
    # shared workdir, both attempts in one file.
    assert error.group(0).endswith(f"; last lines: {workdir / 'logs' / 'worker_1.log'}")
    assert not re.search(r"^\[worker \d\] \[worker", log, re.MULTILINE), log[-3000:]
    files = {i: (workdir / "logs" / f"worker_{i}.log").read_text() for i in (0, 1)}
    for i, text in files.items():
        assert all(ln.startswith(f"[worker {i}] ") for ln in text.splitlines()), text[:3000]
        assert text.count("starting at step 0 of 60") == 1 and "finished at step 60" in text
    assert error.group(0) in files[0].splitlines()
    assert "worker exit codes [1, 137]" in log, log[-3000:]  # Worker 0 exited on its own.
    resumed = re.findall(r"resumed \S+ckpt-(\d+) at step (\d+) of 60", log)
    assert len(resumed) == 2 and resumed[0] == resumed[1] and int(resumed[0][0]) >= 10
    assert log.count("finished at step 60") == 2
    assert_same_checkpoint(checkpoint_arrays(workdir), checkpoint_arrays(two_workers_60))


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
    proc = run_cmd(["-c", KILL_DURING_SAVE, *args], env=NO_GCE)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert os.path.exists(workdir / "checkpoints" / "ckpt-10.index")  # Written, not recorded.
    proc = run_cmd(["-m", "tf_gan_scale.main", *args], env=NO_GCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ckpt-5 at step 5 of 15" in proc.stderr
    assert_same_checkpoint(checkpoint_arrays(workdir),
                           checkpoint_arrays(straight_run(tmp_path, 15, "--strategy=one_device")))


# The DCGAN on 2 mirrored replicas; StyleGAN2 on one device (issue 22: its 2-replica
# traces cost ~53 CPU-s of three runs). Accepted loss: no test now resumes StyleGAN2's
# own state (ada_p, ada_stats, pl_mean, w_avg, the noise call counter) onto mirrored
# variables; the DCGAN case resumes mirrored variables, and test_equivalence.py's
# stylegan2 case compares that state across replicas without a resume.
SIGTERM_CASES = {"dcgan": (ARGS, ["--strategy=mirrored", "--num_cpu_devices=2"]),
                 "stylegan2": (SG2_ARGS, ["--strategy=one_device"])}


@pytest.mark.parametrize("family", sorted(SIGTERM_CASES))
def test_sigterm_to_a_single_process_run_saves_and_resumes(tmp_path, family):
    model_args, strategy = SIGTERM_CASES[family]
    workdir = tmp_path / "run"
    args = [f"--workdir={workdir}", *strategy, *model_args,
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
    proc = run_cmd(["-m", "tf_gan_scale.main", *args, "--config.train.num_steps=" + str(step + 5)],
                   env=NO_GCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"ckpt-{step} at step {step} of {step + 5}" in proc.stderr
    reference = straight_run(tmp_path, step + 5, *strategy, args=model_args)
    final = checkpoint_arrays(reference)
    assert_same_checkpoint(checkpoint_arrays(workdir), final)
    if family == "stylegan2":  # The state the comparison covers really moved.
        ada_p = [v for k, v in final.items() if "ada" in k.lower() and v.shape == ()]
        pl_mean = [v for k, v in final.items() if "pl_mean" in k.lower()]
        assert ada_p and max(float(v) for v in ada_p) > 0, sorted(final)[:40]
        assert pl_mean and all(np.all(v != 0) for v in pl_mean), sorted(final)[:40]
        assert any("ada_stats" in k for k in final), sorted(final)[:40]  # Compared too.


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory):
    """A TFDS TFRecord build of 256 8x8 grey images in 3 files (the digits' shape), which
    the workers stream (TF_GAN_SCALE_IN_MEMORY_BYTES=0): each reads its half."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds
    d = str(tmp_path_factory.mktemp("tfds"))
    x = np.random.default_rng(0).integers(0, 256, (256, 8, 8, 1), dtype=np.uint8)
    tfds.dataset_builders.store_as_tfds_dataset(
        name="grey_stream", version="1.0.0", data_dir=d, disable_shuffling=True,
        features=tfds.features.FeaturesDict({"image": tfds.features.Image(shape=(8, 8, 1)),
                                             "label": tfds.features.ClassLabel(num_classes=10)}),
        split_datasets={"train": tf.data.Dataset.from_tensor_slices(
            {"image": x, "label": np.arange(256) % 10})},
        file_format="tfrecord", download_config=tfds.download.DownloadConfig(num_shards=3))
    return d


def test_sigterm_on_a_streamed_tfds_source_resumes_at_each_workers_position(
        tmp_path, stream_dir):
    # Issue 25's regression test: before, each worker's stream skipped the GLOBAL count
    # of consumed examples in its own file shard, landing W times too far on resume.
    args = [*ARGS, "--config.data.source=tfds:grey_stream", f"--tfds_data_dir={stream_dir}",
            "--config.train.num_steps=40", "--config.train.checkpoint_every=1000"]
    env = {"TF_GAN_SCALE_IN_MEMORY_BYTES": "0"}
    reference = Launcher(tmp_path, [f"--workdir={tmp_path / 'ref'}", *args], env=env,
                         name="ref")
    assert reference.finish() == 0, reference.text()[-3000:]
    launcher = Launcher(tmp_path, [f"--workdir={tmp_path / 'run'}", *args], env=env,
                        max_restarts=1)
    try:
        launcher.wait_for("step 10:")
        os.kill(launcher.worker_pid(1), signal.SIGTERM)
        assert launcher.finish() == 0, launcher.text()[-3000:]
    finally:
        launcher.close()
    log = launcher.text()
    step = int(re.findall(r"preemption: saved checkpoint at step (\d+)", log)[0])
    # Each worker skips its own consumed examples: step x 32 rows / 2 workers.
    assert log.count(f"skips its {step * 16} consumed examples (exact if the run had 2 "
                     f"workers x 1 replicas)") == 2, log[-3000:]
    assert_same_checkpoint(checkpoint_arrays(tmp_path / "run"),
                           checkpoint_arrays(tmp_path / "ref"))
