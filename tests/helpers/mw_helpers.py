"""Helpers for tests that start real local workers with tools/launch_local.py."""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from conftest import REPO

# No cloud metadata lookups from PreemptionCheckpointHandler (it probes GCE with a 5 s
# timeout): point it at an address nothing listens on.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", GCE_METADATA_IP="127.0.0.7:9")


# Not training state: the object graph, and how many saves the run made.
SKIPPED = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")


def checkpoint_arrays(workdir, step=None):
    """{name: array} of every variable in the latest checkpoint of a run's workdir (or in
    its ckpt-STEP).

    All of the training state: G and D weights (stored under the optimizers'
    `_trainable_variables`, the first path that reaches them), batch-norm moving
    statistics, both optimizers' slots, learning rates and iteration counts; not SKIPPED.
    """
    import tensorflow as tf  # Only the tests that read checkpoints pay for the import.

    directory = os.path.join(workdir, "checkpoints")
    path = (tf.train.latest_checkpoint(directory) if step is None
            else os.path.join(directory, f"ckpt-{step}"))
    assert path, f"no checkpoint in {workdir}"
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name not in SKIPPED}


def checkpoint_diffs(actual, expected):
    """{name: max |actual - expected|} over the variables of two checkpoint_arrays."""
    assert sorted(actual) == sorted(expected), (
        f"different variables: only in actual {sorted(set(actual) - set(expected))}, "
        f"only in expected {sorted(set(expected) - set(actual))}")
    diffs = {}
    for name in sorted(expected):
        a, e = actual[name], expected[name]
        assert a.shape == e.shape and a.dtype == e.dtype, (name, a.shape, e.shape, a.dtype, e.dtype)
        diffs[name] = float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64)),
                                   initial=0.0))
    return diffs


def max_relative_diff(actual, expected):
    """max over variables of max|actual - expected| / (1 + max|expected|): absolute for
    weights of order 1, relative for large moving variances (the equivalence metric of
    tests/integration/test_equivalence.py). Both are {name: array} with the same names."""
    assert sorted(actual) == sorted(expected), (sorted(actual), sorted(expected))
    return max(np.abs(np.asarray(actual[k], np.float64) - expected[k]).max()
               / (1.0 + np.abs(np.asarray(expected[k], np.float64)).max()) for k in expected)


def assert_same_checkpoint(actual, expected, atol=0.0):
    """Every variable of two checkpoint_arrays equal (atol=0: bit for bit) or within atol;
    the message lists the variables that differ and by how much."""
    diffs = checkpoint_diffs(actual, expected)
    bad = {name: d for name, d in diffs.items()  # (NaN is never within atol.)
           if not (np.array_equal(actual[name], expected[name]) if atol == 0 else d <= atol)}
    assert not bad, (f"{len(bad)} of {len(diffs)} variables differ (atol={atol}); max |diff|: "
                     + ", ".join(f"{n}: {d:.3g}" for n, d in
                                 sorted(bad.items(), key=lambda kv: -kv[1])[:12]))


class _Output:
    """A process (`self.proc`) whose output goes to the file `self.log`."""

    def text(self):
        return self.log.read_text()

    def wait_for(self, needle, timeout=120):
        """Waits until `needle` is in the output; returns time.monotonic() then."""
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not seen:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        return time.monotonic()


class Launcher(_Output):
    """tools/launch_local.py running a training command; its output goes to a file.
    With `mesh` ("batch:B,model:M"), the workers are DTensor clients of one mesh
    (launch_local --mesh), else multi-worker (--strategy=multi_worker_mirrored)."""

    def __init__(self, tmp_path, train_args, *, num_workers=2, devices_per_worker=1,
                 max_restarts=0, grace_s=60, name="launch", mesh=None, env=None):
        self.log = tmp_path / f"{name}.log"
        self._file = open(self.log, "w")
        mode = ([f"--mesh={mesh}"], []) if mesh else ([], ["--strategy=multi_worker_mirrored"])
        # How a worker's environment names its index: TF_CONFIG's task, DTensor's client.
        self._index = "DTENSOR_CLIENT_ID={}\0" if mesh else '"index": {}}}'
        self.proc = subprocess.Popen(
            [sys.executable, "tools/launch_local.py", f"--num_workers={num_workers}",
             f"--devices_per_worker={devices_per_worker}", f"--max_restarts={max_restarts}",
             f"--grace_s={grace_s}", *mode[0], "--", sys.executable, "-m",
             "tf_gan_scale.main", *mode[1], *train_args],
            cwd=REPO, env=dict(ENV, **(env or {})), stdout=self._file,
            stderr=subprocess.STDOUT, start_new_session=True)


    def worker_pids(self):
        """{index: pid} of the launcher's current workers."""
        pids = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if ppid == self.proc.pid:
                for index in range(64):
                    if self._index.format(index).encode() in env:
                        pids[index] = int(pid)
        return pids

    def worker_pid(self, index):
        pid = self.worker_pids().get(index)
        assert pid, f"worker {index} not running:\n{self.text()[-3000:]}"
        return pid

    def finish(self, timeout=300):
        try:
            self.proc.wait(timeout)
        finally:
            self.close()
        return self.proc.returncode

    def close(self):
        """Ends what this test started: the launcher (which ends its workers) and, should
        it not manage within 30 s, the workers and the launcher by SIGKILL."""
        if self.proc.poll() is None:
            workers = self.worker_pids().values()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                for pid in workers:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.proc.kill()
                self.proc.wait()
        self._file.close()


class Task(_Output):
    """One worker or DTensor client of the binary, started by hand (not by the launcher:
    the start-up tests start tasks apart, or only one); its output goes to a file.
    `env`: its TF_CONFIG or DTENSOR_* variables."""

    def __init__(self, tmp_path, name, args, env):
        self.log = tmp_path / f"{name}.log"
        self._file = open(self.log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tf_gan_scale.main", *args], cwd=REPO,
            env=dict(ENV, **env), stdout=self._file, stderr=subprocess.STDOUT,
            start_new_session=True)


    def finish(self, timeout=300):
        """The exit code, and time.monotonic() when the exit was seen."""
        try:
            code = self.proc.wait(timeout)
            return code, time.monotonic()
        finally:
            self.close()

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._file.close()


def scalars(workdir, tag):
    """{step: value} of a TensorBoard scalar written by the run."""
    out = {}
    for path in glob.glob(os.path.join(workdir, "logs", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.tag == tag:
                    out[event.step] = float(tf.make_ndarray(v.tensor))
    return out
