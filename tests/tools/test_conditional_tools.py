"""A class-conditional BigGAN run through the binary and the tools: sampling by class, a
class-per-row grid, truncation, EMA vs raw weights, export with labels, bad input."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from conftest import run_cmd, run_in_process

# experiments/biggan_mnist.py shrunk to the embedded 8x8 digits: a conditional BigGAN with EMA.
TINY_BIGGAN = ["--config=experiments/biggan_mnist.py", "--config.data.source=embedded:digits",
               "--config.model.bottom_width=4", "--config.model.g_channels=(1,)",
               "--config.model.d_channels=(1,1)", "--config.model.ch=4",
               "--config.model.shared_dim=4", "--config.model.latent_dim=8",
               "--config.train.num_steps=4", "--config.train.global_batch_size=8",
               "--config.train.log_every=2", "--config.train.checkpoint_every=2",
               "--config.train.sample_every=2", "--config.train.ema.start=1",
               "--config.train.ema.decay=0.5"]


def assert_bad(proc, *needles):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("cond") / "run")
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY_BIGGAN])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir


def sample(workdir, out, *flags, process=False):
    """tools/sample.py's JSON line; in this process unless `process` (the real tool)."""
    run = run_cmd if process else run_in_process
    proc = run(["tools/sample.py", f"--workdir={workdir}", f"--output={out}", *flags])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_sampling_by_class_truncation_and_ema(run, tmp_path):
    path = lambda name: str(tmp_path / name)  # noqa: E731
    sample(run, path("c3.npy"), "--class_id=3", "--num_samples=6", process=True)
    sample(run, path("c4.npy"), "--class_id=4", "--num_samples=6")
    c3, c4 = np.load(path("c3.npy")), np.load(path("c4.npy"))
    assert c3.shape == (6, 8, 8, 1)
    assert np.abs(c3 - c4).max() > 1e-4  # The label reaches the images.
    # Sampling is in-process what the tool wrote: the EMA generator with label 3.
    from tf_gan_scale import gan, latents
    from tf_gan_scale.artifacts import sampling
    generator, latent_dim, step, _ = sampling.load_generator(run)
    assert generator.num_classes == 10 and step == 4
    want = gan.generate(generator, latents.fixed(0, 6, latent_dim), labels=np.full(6, 3))
    np.testing.assert_allclose(c3, want.numpy(), atol=1e-6)
    # The raw generator differs from the EMA one (decay 0.5 from step 1).
    sample(run, path("raw.npy"), "--class_id=3", "--num_samples=6", "--noema")
    assert np.abs(np.load(path("raw.npy")) - c3).max() > 1e-4
    # Truncation pulls latents in: different samples, same shape.
    sample(run, path("t.npy"), "--class_id=3", "--num_samples=6", "--truncation=0.3")
    assert np.abs(np.load(path("t.npy")) - c3).max() > 1e-5
    # Without --class_id: one class per row, 20 samples -> 10 rows of 2.
    sample(run, path("grid.png"), "--num_samples=20")
    picture = np.asarray(Image.open(path("grid.png")))
    scale, pad = 64 // 8, 1
    size = lambda n: (n * (8 + pad) + pad) * scale  # noqa: E731  (images.grid)
    assert picture.shape[:2] == (size(10), size(2))
    # Training's own grids are class-per-row too (64 samples: 10 rows of 7).
    train_grid = np.asarray(Image.open(os.path.join(run, "samples", "step_0000004.png")))
    assert train_grid.shape[:2] == (size(10), size(7))


@pytest.mark.slow
def test_export_takes_labels(run, tmp_path):
    out = str(tmp_path / "exported")
    proc = run_cmd(["tools/export.py", f"--workdir={run}", f"--output={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    import tensorflow as tf
    from tf_gan_scale import latents
    served = tf.saved_model.load(out).signatures["serving_default"]
    z = latents.fixed(0, 6, 8)
    images = served(z=z, labels=tf.fill([6], 3))["images"].numpy()
    sample(run, str(tmp_path / "c3.npy"), "--class_id=3", "--num_samples=6")
    np.testing.assert_allclose(images, np.load(str(tmp_path / "c3.npy")), atol=1e-5)


@pytest.mark.slow  # For `run`; the cases run in this process (no process start each).
def test_bad_sampling_input(run, tmp_path):
    out = str(tmp_path / "x.npy")
    assert_bad(run_in_process(["tools/sample.py", f"--workdir={run}", f"--output={out}",
                               "--class_id=10"]), "--class_id=10 is out of range; valid: 0 to 9")
    assert_bad(run_in_process(["tools/sample.py", f"--workdir={run}", f"--output={out}",
                               "--truncation=-1"]), "--truncation must be > 0")
    assert not os.path.exists(out)


def test_bad_conditional_configs_exit_2_before_writing(tmp_path):
    unlabeled = tmp_path / "x.npz"
    np.savez(unlabeled, x=np.zeros((16, 8, 8, 1), np.uint8))
    workdir = tmp_path / "run"
    cases = [
        ([f"--config.data.source=npz:{unlabeled}"], "needs labelled data"),
        (["--config.model.name=dcgan"], "is unconditional"),
        (["--config.train.ema.decay=-0.5"], "config.train.ema.decay must be in [0, 1)"),
        (["--config.train.ema.start=4"], "config.train.ema.start=4 is not before the end"),
        (["--config.model.bottom_width=5"], "bottom_width 5 makes 10x10 images"),
        (["--config.train.augment=flip"], "unknown augmentation 'flip'"),
    ]
    # They fail before training: in this process (conftest.run_in_process), on one device.
    for flags, needle in cases:
        args = ["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY_BIGGAN, *flags]
        if "dcgan" in flags[0]:  # dcgan's own options, so only `conditional` is wrong.
            args = ["-m", "tf_gan_scale.main", f"--workdir={workdir}",
                    "--config=experiments/digits.py", "--config.model.conditional=true"]
        assert_bad(run_in_process([*args, "--strategy=one_device"]), needle)
    assert not workdir.exists()


@pytest.mark.slow
def test_exact_resume_with_ema_spectral_norm_lecam_and_augmentation(tmp_path):
    """2 steps, stop, resume to 4 == 4 straight: every checkpointed variable (G, D,
    spectral-norm u vectors, the EMA generator, LeCam anchors, both optimizers) equal."""
    import tensorflow as tf
    extra = ["--config.train.lecam_weight=0.1", "--config.train.augment=color,translation,cutout"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    for workdir, steps in ((straight, 4), (resumed, 2), (resumed, 4)):
        proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY_BIGGAN,
                        *extra, f"--config.train.num_steps={steps}"])
        assert proc.returncode == 0, proc.stderr[-3000:]
    a = tf.train.load_checkpoint(os.path.join(straight, "checkpoints", "ckpt-4"))
    b = tf.train.load_checkpoint(os.path.join(resumed, "checkpoints", "ckpt-4"))
    names = sorted(a.get_variable_to_shape_map())
    assert names == sorted(b.get_variable_to_shape_map())
    for part in ("ema_generator", "vector_u", "lecam_anchors", "g_optimizer"):
        assert any(part in n for n in names), part
    for name in names:
        if name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH"):
            continue
        np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name), err_msg=name)
