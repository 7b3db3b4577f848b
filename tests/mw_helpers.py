"""Helpers for tests that start real local workers with tools/launch_local.py."""

import os
import signal
import subprocess
import sys
import time

import numpy as np

from conftest import REPO, run_cmd

# No cloud metadata lookups from PreemptionCheckpointHandler (it probes GCE with a 5 s
# timeout): point it at an address nothing listens on.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", GCE_METADATA_IP="127.0.0.7:9")


def samples_of(workdir, out):
    """Generator samples of a run's latest checkpoint (tools/sample.py, fixed latents)."""
    proc = run_cmd(["tools/sample.py", f"--workdir={workdir}", f"--output={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


class Launcher:
    """tools/launch_local.py running a training command; its output goes to a file."""

    def __init__(self, tmp_path, train_args, *, num_workers=2, devices_per_worker=1,
                 max_restarts=0, grace_s=60, name="launch"):
        self.log = tmp_path / f"{name}.log"
        self._file = open(self.log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "tools/launch_local.py", f"--num_workers={num_workers}",
             f"--devices_per_worker={devices_per_worker}", f"--max_restarts={max_restarts}",
             f"--grace_s={grace_s}", "--", sys.executable, "-m", "tf_gan_scale.main",
             "--strategy=multi_worker_mirrored", *train_args],
            cwd=REPO, env=ENV, stdout=self._file, stderr=subprocess.STDOUT,
            start_new_session=True)

    def text(self):
        return self.log.read_text()

    def wait_for(self, needle, timeout=120):
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not seen:\n{self.text()[-3000:]}")
            time.sleep(0.1)

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
                    if f'"index": {index}}}'.encode() in env:
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
