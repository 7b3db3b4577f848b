"""The training binary on a DTensor mesh (`--mesh`): equal to one device, checkpoints that
move between topologies with the optimizer's moments and the EMA generator, samples (of
the EMA generator), and bad input.

Each run is the real binary (`python -m tf_gan_scale.main`) on 2 logical CPUs. The
equivalence compares every variable of the checkpoints (weights, batch-norm statistics,
both optimizers' moments and counters) after 10 Adam steps. D has no batch norm here:
a bias right before a batch norm has a zero gradient in exact arithmetic, and Adam turns
its float32 noise into +-lr steps (tests/helpers/mesh_helpers.py). Measured max gap over all
variables (mesh vs one device, and each resume across topologies): 1.5e-8 .. 6.0e-8;
TOL = 1e-5, the suite's float32 tolerance. A mesh resume that drops Adam's moments (slots
zeroed when moved onto the mesh) was measured 6.4e-3 off: 640x TOL.
"""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY, run_cmd, run_cmds, run_in_process

TOL = 1e-5
# Adam (the digits config's), D without batch norm, an EMA generator (a copy up to step 2,
# then decay 0.8: checkpointed, sampled); checkpoints at 5 and 10.
RUN = TINY + ["--config.model.d_norm=none", "--config.train.num_steps=10",
              "--config.train.ema.decay=0.8", "--config.train.ema.start=2",
              "--num_cpu_devices=2"]
MESH = "--mesh=batch:1,model:2"


def train(workdir, *flags):
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *RUN, *flags])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def variables(path):
    """{checkpoint key: array} of every variable in a checkpoint."""
    reader = tf.train.load_checkpoint(path)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if "OBJECT_GRAPH" not in k}


def gap(a, b):
    a, b = variables(a), variables(b)
    assert sorted(a) == sorted(b)  # The same checkpoint layout on both topologies.
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - b[k]), initial=0))
               for k in a)


def resume_from_5(src, dst):
    """A copy of run `src` as it was at step 5."""
    shutil.copytree(src, dst)
    ckpts = os.path.join(dst, "checkpoints")
    for name in os.listdir(ckpts):
        if name.startswith("ckpt-10."):
            os.remove(os.path.join(ckpts, name))
    with open(os.path.join(ckpts, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "ckpt-5"\nall_model_checkpoint_paths: "ckpt-5"\n')


@pytest.mark.slow  # Four runs of the binary, ~12 s each.
def test_mesh_run_equals_one_device_and_resumes_on_either(tmp_path):
    mesh, one = tmp_path / "mesh", tmp_path / "one"
    log = train(mesh, MESH).stderr
    assert "mesh batch:1,model:2" in log and "weights split" in log
    train(one, "--strategy=one_device")
    for step in (5, 10):
        assert (mesh / "samples" / f"step_{step:07d}.png").is_file()
    assert any(k.startswith("ema_generator/") for k in variables(f"{mesh}/checkpoints/ckpt-10"))
    assert gap(f"{one}/checkpoints/ckpt-10", f"{mesh}/checkpoints/ckpt-10") < TOL
    # Trained on the mesh to 5, resumed on one device to 10 -- and the other way round.
    resume_from_5(mesh, tmp_path / "mesh_then_one")
    train(tmp_path / "mesh_then_one", "--strategy=one_device")
    resume_from_5(one, tmp_path / "one_then_mesh")
    log = train(tmp_path / "one_then_mesh", MESH).stderr
    assert "resumed" in log and "at step 5 of 10" in log
    for run in ("mesh_then_one", "one_then_mesh"):
        assert gap(f"{one}/checkpoints/ckpt-10", f"{tmp_path}/{run}/checkpoints/ckpt-10") < TOL
    # tools/sample.py reads a mesh-trained run like any other: the same samples.
    out = {}
    for run in (mesh, one):
        proc = run_cmd(["tools/sample.py", f"--workdir={run}", f"--output={run}/s.npy",
                        "--num_samples=8"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[run] = np.load(f"{run}/s.npy")
    np.testing.assert_allclose(out[mesh], out[one], atol=1e-4)


BAD = [
    (["--mesh=batch:3,model:1"], "needs 3 devices, the run has 2 CPU; meshes that fit: "
                                 "batch:2,model:1, batch:1,model:2"),
    (["--mesh=batch:2,rows:1"], "unknown axis 'rows'"),
    ([MESH, "--strategy=mirrored"], "cannot be combined with --strategy=mirrored"),
    ([MESH, "--config.parallel.layouts=(('generator/nope', '-,model'),)"],
     "layout override 'generator/nope' matches no weight"),
    ([MESH, "--config.parallel.layouts=(('generator/dense/kernel', 'model,model'),)"],
     "splits two dimensions over the same axis"),
    ([MESH, "--config.train.jit_compile=True"], "not supported on a mesh yet: "
                                                 "config.train.jit_compile='True'"),
    ([MESH, "--config.model.sync_bn=False"],
     "config.model.sync_bn=False (per-shard statistics: sync_bn_group_size=1)"),
    # TF_CONFIG names a cluster: this process joins it as a DTensor client, and the
    # cluster must be sound before anything starts.
    ([MESH, "--config.train.num_steps=1"], "bad DTensor cluster"),
]


# Fail before DTensor initializes (flags, the mesh spec): in this process.
IN_PROCESS = [BAD[1], BAD[2]]


def test_bad_mesh_flags_exit_2_before_writing(tmp_path):
    marker = tmp_path / "keep.txt"
    marker.write_text("existing run")
    for flags, message in IN_PROCESS:
        proc = run_in_process(["-m", "tf_gan_scale.main", f"--workdir={tmp_path}", *RUN,
                               *flags])
        assert proc.returncode == 2, (flags, proc.stderr[-2000:])
        assert message in proc.stderr.strip().splitlines()[-1], flags
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]


@pytest.mark.slow  # Each case initializes DTensor on its devices: its own process.
def test_bad_mesh_input_exits_2_before_writing(tmp_path):
    marker = tmp_path / "keep.txt"
    marker.write_text("existing run")
    env = {"DTENSOR_JOBS": "localhost:1,localhost:2", "DTENSOR_CLIENT_ID": "2"}
    # One at a time: two commands on one workdir at once are two runs, and the second
    # would be refused as such (training/run_lock.py) while the first's input is checked.
    procs = run_cmds([["-m", "tf_gan_scale.main", f"--workdir={tmp_path}", *RUN, *flags]
                      for flags, _ in BAD[:-1]], workers=1)
    procs.append(run_cmd(["-m", "tf_gan_scale.main", f"--workdir={tmp_path}", *RUN,
                          *BAD[-1][0]], env=env))
    for (flags, message), proc in zip(BAD, procs):
        assert proc.returncode == 2, (flags, proc.stderr[-2000:])
        assert message in proc.stderr.strip().splitlines()[-1], flags
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
    assert marker.read_text() == "existing run"


@pytest.mark.slow  # Four runs of the binary, ~35 s each.
def test_conditional_biggan_checkpoints_move_between_a_mesh_and_mirrored(tmp_path):
    # The conditional BigGAN (hierarchical z, shared embedding, cBN, self-attention,
    # spectral norm, projection D; LeCam's anchors and an EMA generator checkpointed)
    # trained on a 1x2 mesh with its embeddings split equals 2 mirrored replicas, and
    # each resumes the other's step-5 checkpoint to the same step 10. Measured max gap
    # 4.7e-6 (a spectral-norm u vector; the weights closer).
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.integers(0, 256, (64, 16, 16, 1)).astype(np.uint8),
             y=np.arange(64) % 4)
    args = ["--config=tests/helpers/tiny_biggan_config.py", f"--config.data.source=npz:{data}",
            "--num_cpu_devices=2"]

    def run(workdir, *flags):
        proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *args, *flags])
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr

    mesh, mirrored = tmp_path / "mesh", tmp_path / "mirrored"
    assert "weights split" in run(mesh, MESH)
    run(mirrored, "--strategy=mirrored")
    assert "lecam_anchors/.ATTRIBUTES/VARIABLE_VALUE" in variables(f"{mesh}/checkpoints/ckpt-10")
    assert gap(f"{mirrored}/checkpoints/ckpt-10", f"{mesh}/checkpoints/ckpt-10") < TOL
    resume_from_5(mesh, tmp_path / "mesh_then_mirrored")
    run(tmp_path / "mesh_then_mirrored", "--strategy=mirrored")
    resume_from_5(mirrored, tmp_path / "mirrored_then_mesh")
    assert "at step 5 of 10" in run(tmp_path / "mirrored_then_mesh", MESH)
    for name in ("mesh_then_mirrored", "mirrored_then_mesh"):
        assert gap(f"{mirrored}/checkpoints/ckpt-10",
                   f"{tmp_path}/{name}/checkpoints/ckpt-10") < TOL, name
