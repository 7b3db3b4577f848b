"""`fit` under MultiWorkerMirroredStrategy: 2 real local worker processes over loopback.

Same seed and global batch as one device: the generators must agree to 1e-4, and both
workers must log the same global losses.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, TINY, run_cmd
from test_cli import scalars

pytestmark = pytest.mark.slow

ARGS = [*TINY, "--config.train.num_steps=10", "--config.model.d_dropout=0.0"]


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_two_workers_match_one_device(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    try:
        for i in range(2):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                       TF_CONFIG=json.dumps({"cluster": cluster,
                                             "task": {"type": "worker", "index": i}}))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tf_gan_scale.main", f"--workdir={tmp_path}/w{i}",
                 "--strategy=multi_worker_mirrored", *ARGS],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:  # Only the processes this test started.
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={tmp_path}/one",
                    "--strategy=one_device", *ARGS])
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = {}
    for name in ("one", "w0"):
        proc = run_cmd(["tools/sample.py", f"--workdir={tmp_path}/{name}",
                        f"--output={tmp_path}/{name}.npy"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        samples[name] = np.load(tmp_path / f"{name}.npy")
    assert np.abs(samples["one"] - samples["w0"]).max() <= 1e-4
    one, w0, w1 = (scalars(tmp_path / n, "d_loss") for n in ("one", "w0", "w1"))
    assert w0 == w1 and set(one) == {5, 10}
    for step in one:
        np.testing.assert_allclose(w0[step], one[step], rtol=1e-5)
