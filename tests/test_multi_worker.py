"""`fit` under MultiWorkerMirroredStrategy: 2 real local worker processes over loopback.

Same seed and global batch as one device: the generators must agree to 1e-4 and the logged
losses must be the same global means. Both workers get the same --workdir; only the chief
writes it, and the other worker's temporary checkpoint directory is gone afterwards.
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
            (tmp_path / f"tmp{i}").mkdir()
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(tmp_path / f"tmp{i}"),
                       TF_CONFIG=json.dumps({"cluster": cluster,
                                             "task": {"type": "worker", "index": i}}))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tf_gan_scale.main", f"--workdir={tmp_path}/shared",
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
    assert sorted(os.listdir(tmp_path / "shared")) == ["checkpoints", "logs", "run.json",
                                                        "samples"]
    assert os.path.exists(tmp_path / "shared" / "checkpoints" / "ckpt-10.index")
    assert [f for i in range(2) for f in os.listdir(tmp_path / f"tmp{i}")
            if f.startswith("tf_gan_scale_worker_")] == []

    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={tmp_path}/one",
                    "--strategy=one_device", *ARGS])
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = {}
    for name in ("one", "shared"):
        proc = run_cmd(["tools/sample.py", f"--workdir={tmp_path}/{name}",
                        f"--output={tmp_path}/{name}.npy"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        samples[name] = np.load(tmp_path / f"{name}.npy")
    assert np.abs(samples["one"] - samples["shared"]).max() <= 1e-4
    for tag in ("d_loss", "g_loss"):
        one, multi = scalars(tmp_path / "one", tag), scalars(tmp_path / "shared", tag)
        assert set(one) == set(multi) == {5, 10}
        for step in one:
            np.testing.assert_allclose(multi[step], one[step], rtol=1e-5)
