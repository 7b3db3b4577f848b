"""A damaged latest checkpoint with two real workers (MultiWorkerMirroredStrategy): every
worker passes over it and resumes from the same older one; workers that read different
checkpoints (here: not one shared directory) refuse together with one line, through
the collective of training/checkpoints.agree, instead of training apart. And on a DTensor
mesh, whose checkpoints are sharded (one data file per device and one for the host) and
saved asynchronously (the save-time check waits for the files).

The default tier covers the choice itself in one process (tests/training/test_checkpoints.py).
"""

import os
import re

import pytest

from conftest import TINY, TINY_RUN_STEPS, copy_run, run_cmd
from helpers.mw_helpers import Task
from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import launch

pytestmark = pytest.mark.slow

DATA = "ckpt-10.data-00000-of-00001"


def truncate(workdir):
    path = os.path.join(workdir, "checkpoints", DATA)
    os.truncate(path, os.path.getsize(path) // 2)


def start(tmp_path, workdirs):
    """Worker i of 2 on workdirs[i]; their exit codes and logs."""
    hosts = [f"localhost:{port}" for port in launch.free_ports(2)]
    tasks = [Task(tmp_path, f"worker{i}", [f"--workdir={w}", *TINY,
                                           f"--config.train.num_steps={TINY_RUN_STEPS}",
                                           "--strategy=multi_worker_mirrored"],
                  {"TF_CONFIG": cluster_env.tf_config(hosts, i)})
             for i, w in enumerate(workdirs)]
    try:
        return [(task.finish(240)[0], task.text()) for task in tasks]
    finally:
        for task in tasks:
            task.close()


def test_workers_resume_the_same_readable_checkpoint(tiny_run, tmp_path):
    shared = copy_run(tiny_run, tmp_path / "shared")
    truncate(shared)
    for code, log in start(tmp_path, [shared, shared]):
        assert code == 0, log[-3000:]
        assert f"{shared}/checkpoints/ckpt-10 cannot be read ({DATA}: Read less" in log
        assert "at step 5 of 10" in log and "finished at step 10" in log
    assert sorted(os.listdir(shared / "checkpoints" / "damaged")) == [DATA, "ckpt-10.index"]


def test_workers_that_read_different_checkpoints_refuse_together(tiny_run, tmp_path):
    damaged, intact = copy_run(tiny_run, tmp_path / "a"), copy_run(tiny_run, tmp_path / "b")
    truncate(damaged)
    for (code, log), mine in zip(start(tmp_path, [damaged, intact]), (5, 10)):
        assert code == 2, log[-3000:]
        [line] = [x for x in log.splitlines() if re.match(r"(\[worker \d\] )?error:", x)]
        assert f"the workers restored different steps (5 to 10; this worker: {mine})" in line
    assert not os.path.exists(damaged / "checkpoints" / "damaged")  # Refused before writing.


def test_a_mesh_run_resumes_past_a_damaged_shard(tmp_path):
    workdir = tmp_path / "mesh"
    args = ["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY, "--num_cpu_devices=2",
            "--mesh=batch:1,model:2", f"--config.train.num_steps={TINY_RUN_STEPS}"]
    proc = run_cmd(args)  # Every save read back: the DTensor files complete when checked.
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = workdir / "checkpoints"
    shards = sorted(f for f in os.listdir(ckpts) if f.startswith("ckpt-10.data-"))
    assert len(shards) > 1, shards
    os.truncate(ckpts / shards[1], os.path.getsize(ckpts / shards[1]) // 2)
    proc = run_cmd(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{ckpts}/ckpt-10 cannot be read (ckpt-10.data-*: Read less bytes" in proc.stderr
    assert "at step 5 of 10" in proc.stderr and "finished at step 10" in proc.stderr
    assert sorted(os.listdir(ckpts / "damaged")) == sorted([*shards, "ckpt-10.index"])
