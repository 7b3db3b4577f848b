"""Test setup: logical CPU devices before TensorFlow initializes, subprocess helpers.

In-process tests share ONE 2-replica MirroredStrategy: strategies created one after
another in a process share collective keys and abort each other (tensorflow#61314), so
other replica counts run in subprocesses (the real binary).
"""

import concurrent.futures
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_gan_scale import distribute  # noqa: E402

NUM_CPU_DEVICES = 2
distribute.configure_cpu_devices(NUM_CPU_DEVICES)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny DCGAN on the embedded digits with batch norm in BOTH networks: seconds per run.
# One step per call (auto would pick 5 for a 10-step run but 1 for a 6-step one: the
# weights agree only to float32 rounding across the two, and tests compare runs bit for
# bit); test_cli.py runs auto.
TINY = ["--config=experiments/digits.py", "--config.train.global_batch_size=32",
        "--config.train.steps_per_execution=1",
        "--config.model.d_norm=batch", "--config.model.g_channels=(32,16,8)",
        "--config.model.d_channels=(8,16)", "--config.model.latent_dim=16",
        "--config.train.log_every=5", "--config.train.sample_every=5",
        "--config.train.checkpoint_every=5"]


def run_cmd(args, timeout=300, env=None):
    """Runs `python ARGS` in the repo root; returns CompletedProcess (text)."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable] + list(args), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def run_cmds(arg_lists, timeout=300, env=None, workers=2):
    """run_cmd for each of `arg_lists`, `workers` at a time; results in order. For
    commands that fail early (bad input): each spends its seconds starting Python and
    importing TensorFlow, mostly on one core, so two share the 2 cores well."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda args: run_cmd(args, timeout, env), arg_lists))


@pytest.fixture(scope="session")
def mirrored2():
    # One instance per process: each new MirroredStrategy restarts the collective keys,
    # and its all-reduces then collide with the previous instance's (tensorflow#61314).
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(2)])


@pytest.fixture
def one_device():
    return tf.distribute.OneDeviceStrategy("/cpu:0")
