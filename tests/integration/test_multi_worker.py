"""`fit` under MultiWorkerMirroredStrategy: real local workers over loopback, started by
tools/launch_local.py.

Same seed and global batch as one device (plain SGD, dropout and batch norm in G and D:
tests/helpers/sgd_config.py): every checkpointed variable (weights, moving statistics,
dropout counters, optimizer state) must agree within the equivalence tolerance of
tests/integration/test_equivalence.py, for 2 workers x 1 replica, 2 workers x 2 logical
CPU replicas, and with steps_per_execution=5; the logged losses must be the same global
means. All workers get the same --workdir; only the chief writes it, and no worker leaves
temporary directories behind.
"""

import os
import time

import numpy as np
import pytest

from conftest import run_cmd
from helpers.mw_helpers import Launcher, checkpoint_arrays, max_relative_diff
from helpers.mw_helpers import Task, scalars
from test_equivalence import TOL
from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import launch, startup

pytestmark = pytest.mark.slow

ARGS = ["--config=tests/helpers/sgd_config.py"]



@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("one") / "run"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", "--strategy=one_device",
                    *ARGS])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir, checkpoint_arrays(workdir)


@pytest.mark.parametrize("devices_per_worker, steps_per_execution", [(1, 1), (2, 1), (1, 5)])
def test_workers_match_one_device(tmp_path, monkeypatch, one_device, devices_per_worker,
                                  steps_per_execution):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    shared = tmp_path / "shared"
    launcher = Launcher(tmp_path, [f"--workdir={shared}", *ARGS,
                                   f"--config.train.steps_per_execution={steps_per_execution}"],
                        devices_per_worker=devices_per_worker)
    assert launcher.finish(timeout=240) == 0, launcher.text()[-3000:]
    replicas = 2 * devices_per_worker
    assert launcher.text().count(f"starting at step 0 of 10; {replicas} replicas") == 2
    assert sorted(os.listdir(shared)) == ["checkpoints", "logs", "run.json", "samples"]
    assert os.path.exists(shared / "checkpoints" / "ckpt-10.index")
    assert os.listdir(tmp_path / "tmp") == []  # Non-chief checkpoints, preemption dirs.

    one_dir, one_arrays = one_device
    assert max_relative_diff(checkpoint_arrays(shared), one_arrays) <= TOL
    for tag in ("d_loss", "g_loss"):
        one, multi = scalars(one_dir, tag), scalars(shared, tag)
        assert set(one) == set(multi) == {5, 10}
        for step in one:
            np.testing.assert_allclose(multi[step], one[step], rtol=1e-5)


def test_a_worker_that_starts_late_within_the_deadline_trains_what_one_device_trains(
        tmp_path, one_device):
    # Worker 1 waits for worker 0, which starts 3 s later (a slow node, a pod scheduled
    # late): the group forms and trains what one device trains (issue 24).
    hosts = [f"localhost:{port}" for port in launch.free_ports(2)]
    shared = tmp_path / "shared"
    args = [f"--workdir={shared}", *ARGS, "--strategy=multi_worker_mirrored",
            "--startup_timeout_s=120"]
    late = Task(tmp_path, "worker1", args, {"TF_CONFIG": cluster_env.tf_config(hosts, 1)})
    try:
        time.sleep(max(late.wait_for(startup.WAITING) + 3 - time.monotonic(), 0))
        chief = Task(tmp_path, "worker0", args, {"TF_CONFIG": cluster_env.tf_config(hosts, 0)})
        assert chief.finish(240)[0] == 0, chief.text()[-3000:]
        assert late.finish(60)[0] == 0, late.text()[-3000:]
    finally:
        late.close()
    assert "all 2 tasks answered after " in late.text()
    assert max_relative_diff(checkpoint_arrays(shared), one_device[1]) <= TOL
