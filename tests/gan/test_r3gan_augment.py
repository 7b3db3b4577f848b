"""ada_pipes: R3GAN's AugmentPipe (StyleGAN2-ADA's 'bgc' with the colour multipliers at
0.5, plus cutout) as config.train.augment="r3gan": 'ada' unchanged bit for bit, the gate
rates, the official cutout mask, the official pipe itself (a fixture the official torch
code computed from our draws: tests/fixtures/make_r3gan_augment_official.py), per-row
determinism, second order, and the GAN's p variable."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.tiny_gan import LATENT, fit  # tests/ is on sys.path
from tf_gan_scale import architectures, errors, gan, latents
from tf_gan_scale.gan import StepConfig, ada, ada_pipes

K = latents.key(11, 5, latents.AUGMENT_PHASE)
FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                       "r3gan_augment_official.npz")


def smooth(shape, seed=0):
    b, h, w, c = shape
    lo = np.random.default_rng(seed).uniform(-1, 1, (b, h // 4 + 2, w // 4 + 2, c))
    return tf.image.resize(lo.astype(np.float32), [h, w], "bicubic").numpy().clip(-1, 1)


def run(x, p, rows=None, pipe="r3gan", k=K):
    rows = np.arange(len(x)) if rows is None else np.asarray(rows)
    return ada_pipes.augment(tf.constant(x), tf.constant(p, tf.float32), k,
                             tf.constant(rows), pipe).numpy()


def np_cutout_mask(centre, fired, height, width, size=0.5):
    """augment.py's cutout block, transcribed (float32 as officially): [B, H, W]."""
    size = np.where(fired, np.float32(size), np.float32(0))[:, None, None]
    cx = centre[:, 0, None, None].astype(np.float32)
    cy = centre[:, 1, None, None].astype(np.float32)
    coord_x = np.arange(width, dtype=np.float32).reshape(1, 1, -1)
    coord_y = np.arange(height, dtype=np.float32).reshape(1, -1, 1)
    mask_x = np.abs((coord_x + np.float32(0.5)) / np.float32(width) - cx) >= size / 2
    mask_y = np.abs((coord_y + np.float32(0.5)) / np.float32(height) - cy) >= size / 2
    return np.logical_or(mask_x, mask_y).astype(np.float32)


# ---- (1) 'ada' is unchanged ------------------------------------------------------------

@pytest.mark.parametrize("channels", [3, 1])
def test_all_ones_without_cutout_is_ada_bit_for_bit(channels):
    x = smooth((6, 16, 16, channels), 1)
    for p in (0.45, 1.6):
        ref = ada.augment(tf.constant(x), tf.constant(p), K, tf.range(6)).numpy()
        np.testing.assert_array_equal(run(x, p, pipe="ada"), ref)
        np.testing.assert_array_equal(run(x, p, pipe=ada_pipes.Pipe(ada.BGC)), ref)
        np.testing.assert_array_equal(  # Cutout at multiplier 0: its gate never fires.
            run(x, p, pipe=ada_pipes.Pipe(ada.BGC, cutout=0.0)), ref)
    # R3GAN's pipe at p = 0 is ADA's at p = 0 (the identity up to float rounding).
    np.testing.assert_array_equal(run(x, 0.0), run(x, 0.0, pipe="ada"))


# ---- (2) gate rates --------------------------------------------------------------------

def _fired(params):
    one = ("scale", "aniso", "contrast", "saturation")
    return {n: np.abs(v.numpy() - (1.0 if n in one else 0.0)).reshape(len(v), -1).max(1) > 0
            for n, v in params.items()}


def test_gate_rates_at_p_04():
    """Colour transforms fire at m p = 0.2, geometric ones at p = 0.4 (each rotation at
    p_rot = 1 - sqrt(1 - p), either at p), cutout at 0.4: 8192 rows, tolerances 4.5
    binomial standard deviations. A transform whose drawn value can be the identity
    (xflip i = 0, rotate90 i = 0, lumaflip i = 0) fires visibly at that fraction."""
    n, p = 8192, 0.4
    rows = tf.range(n)
    fired = _fired(ada.draw(K, rows, p, ada_pipes.R3GAN_MULTIPLIERS))
    p_rot = 1 - np.sqrt(1 - p)
    expected = {name: p for name in ada.GEOMETRIC}
    expected.update({name: p / 2 for name in ada.COLOR})
    expected.update(xflip=p / 2, rotate90=p * 3 / 4, lumaflip=p / 4, rotate_pre=p_rot,
                    rotate_post=p_rot)
    assert set(expected) == set(fired)
    gate, centre = ada_pipes.cutout_draw(K, rows, p)
    fired["cutout"], expected["cutout"] = gate.numpy(), p
    fired["rotate"] = fired["rotate_pre"] | fired["rotate_post"]
    expected["rotate"] = p
    for name, rate in expected.items():
        tol = 4.5 * np.sqrt(rate * (1 - rate) / n)
        assert abs(fired[name].mean() - rate) < tol, (name, fired[name].mean(), rate)
    # The cutout gate is independent of the pipe's other gates; its centre is uniform.
    for other in ("scale", "brightness"):
        both, rate = (fired["cutout"] & fired[other]).mean(), p * expected[other]
        assert abs(both - rate) < 4.5 * np.sqrt(rate * (1 - rate) / n), other
    c = centre.numpy()
    assert c.min() >= 0 and c.max() < 1 and np.abs(c.mean(0) - 0.5).max() < 0.015
    assert abs(np.corrcoef(c[:, 0], c[:, 1])[0, 1]) < 0.05
    # The multipliers scale the gates and the rotations' p_rot (official formula).
    half = _fired(ada.draw(K, rows, p, {**ada.BGC, "rotate": 0.5}))
    p_rot = 1 - np.sqrt(1 - p / 2)
    assert abs(half["rotate_pre"].mean() - p_rot) < 4.5 * np.sqrt(p_rot / n)
    # p >= 1 / m saturates: at p = 2 every gate with a continuous value fires, cutout too.
    full = _fired(ada.draw(K, tf.range(64), 2.0, ada_pipes.R3GAN_MULTIPLIERS))
    assert all(full[n].all() for n in ("scale", "rotate_pre", "hue", "saturation"))
    assert ada_pipes.cutout_draw(K, tf.range(64), 2.0)[0].numpy().all()


# ---- (3) the cutout mask ---------------------------------------------------------------

@pytest.mark.parametrize("height, width", [(16, 16), (12, 20), (7, 5)])
def test_cutout_mask_is_the_official_formula(height, width):
    rng = np.random.default_rng(3)
    centre = np.concatenate([  # Random, at the corners and the centre, near the edges.
        rng.uniform(0, 1, (20, 2)), [[0, 0], [0.999, 0.999], [0.5, 0.5], [0.02, 0.97]]])
    centre = centre.astype(np.float32).astype(np.float64)  # 24-bit, as the draws.
    fired = np.arange(len(centre)) % 5 != 0
    ours = ada_pipes.cutout_mask(tf.constant(fired), tf.constant(centre), height,
                                 width).numpy()
    np.testing.assert_array_equal(ours, np_cutout_mask(centre, fired, height, width))
    assert (ours[~fired] == 1).all()  # Gated off: every pixel kept.
    # A centred cut in a 16x16 image zeroes exactly the middle 8x8 square.
    mid = ada_pipes.cutout_mask(tf.constant([True]), tf.constant([[0.5, 0.5]], tf.float64),
                                16, 16).numpy()[0]
    assert mid.sum() == 256 - 64 and (mid[4:12, 4:12] == 0).all()


def test_apply_cutout_uses_the_drawn_gates_and_centres():
    x = smooth((32, 16, 16, 3), 4)
    rows = np.arange(40, 72)
    y = ada_pipes.apply_cutout(tf.constant(x), K, tf.constant(rows), 0.5).numpy()
    gate, centre = ada_pipes.cutout_draw(K, rows, 0.5)
    mask = np_cutout_mask(centre.numpy(), gate.numpy(), 16, 16)
    np.testing.assert_array_equal(y, x * mask[..., None])
    assert 0 < gate.numpy().sum() < 32


# ---- (4) the official pipe -------------------------------------------------------------

def test_matches_the_official_augment_pipe():
    """The official AugmentPipe (R3GAN's multipliers, torch, CPU) fed our draws, stored:
    ours agrees to 1e-5 (measured 3.3e-6: float32 vs float64 parameter math and the
    official per-batch margin, ada.py's docstring). The same pipe with 'bgc''s colour
    multipliers, or without cutout, misses by > 0.4 on some rows."""
    data = np.load(FIXTURE)
    for case in ("a", "b"):
        x, p, rows, official = (data[f"{case}_{k}"] for k in ("x", "p", "rows", "official"))
        key = latents.key(int(data[f"{case}_seed"]), 17, latents.AUGMENT_PHASE)
        np.testing.assert_allclose(run(x, float(p), rows, k=key), official, atol=1e-5,
                                   rtol=0)
        for wrong in (ada_pipes.Pipe(ada.BGC, cutout=1.0),
                      ada_pipes.Pipe(ada_pipes.R3GAN_MULTIPLIERS)):
            assert np.abs(run(x, float(p), rows, wrong, key) - official).max() > 0.4


# ---- (5) per-row determinism -----------------------------------------------------------

@pytest.mark.parametrize("channels", [3, 1])
def test_each_row_depends_only_on_its_own_global_row(channels):
    x = smooth((8, 16, 16, channels), 5)
    rows = np.arange(200, 208)
    whole = run(x, 0.8, rows)
    np.testing.assert_array_equal(run(x[:4], 0.8, rows[:4]), whole[:4])  # Bit for bit.
    halves = np.concatenate([run(x[:4], 0.8, rows[:4]), run(x[4:], 0.8, rows[4:])])
    np.testing.assert_array_equal(halves, whole)
    perm = np.random.default_rng(0).permutation(8)
    np.testing.assert_array_equal(run(x[perm], 0.8, rows[perm]), whole[perm])
    assert (whole == 0).any()  # Some cutout fired.


# ---- (6) second order ------------------------------------------------------------------

def test_second_order_through_the_pipe():
    """R1 through the pipe: the D-weight gradient of ||d sum D(aug(x)) / dx||^2 is finite,
    non-zero and matches central finite differences (float64 arithmetic on the float32
    penalties), with p = 1: every transform and the cutout fire."""
    rng = np.random.default_rng(10)
    x = tf.constant(smooth((3, 16, 16, 3), 10))
    w = tf.Variable(rng.normal(size=(3, 3, 3, 4)).astype(np.float32) * 0.3)
    v = tf.constant(rng.normal(size=(4,)).astype(np.float32))
    p, rows = tf.constant(1.0), tf.range(3)

    def input_grad(weights):
        with tf.GradientTape() as inner:
            inner.watch(x)
            h = tf.nn.conv2d(ada_pipes.augment(x, p, K, rows, "r3gan"), weights, 1, "SAME")
            total = tf.reduce_sum(tf.reduce_sum(tf.nn.softplus(h) * v, axis=[1, 2, 3]))
        return inner.gradient(total, x)

    r1 = lambda weights: tf.reduce_sum(tf.square(input_grad(weights)))
    with tf.GradientTape() as outer:
        penalty = r1(w)
    grad = outer.gradient(penalty, w).numpy()
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0
    eps = 1e-2
    for idx in [(1, 1, 0, 2), (0, 2, 2, 1)]:
        delta = np.zeros(w.shape, np.float32)
        delta[idx] = eps
        fd = (np.float64(r1(w + delta)) - np.float64(r1(w - delta))) / (2 * eps)
        assert fd == pytest.approx(float(grad[idx]), rel=2e-2, abs=1e-3), idx
    # Every row was cut (at least a 4x4 corner of the 8x8 square survives the border
    # clip), and every row still has an input gradient.
    y = ada_pipes.augment(x, p, K, rows, "r3gan").numpy()
    assert (y == 0).all(axis=-1).sum(axis=(1, 2)).min() >= 16
    assert np.abs(input_grad(w).numpy()).reshape(3, -1).max(1).min() > 0


# ---- config and the GAN ----------------------------------------------------------------

def test_config_accepts_r3gan_and_engines_refuse_as_for_ada():
    config = StepConfig(augment="r3gan", ada_p=0.3, ada_interval=0)
    config.validate()
    for engine, refused in (("replicas", False), ("mesh", False), ("placement", True),
                            ("pipeline", True)):
        assert any("augment='r3gan'" in r for r in config.unsupported(engine)) == refused
    with pytest.raises(errors.ConfigError):
        StepConfig(augment="r3gan2").validate()


def _tiny_gan(strategy, **knobs):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                                   d_dropout=0.0, d_norm="none", g_channels=(16, 8, 4),
                                   d_channels=(4, 8))
        model = gan.GAN(g, d, LATENT, seed=5)
        model.compile(g_optimizer=keras.optimizers.SGD(0.05),
                      d_optimizer=keras.optimizers.SGD(0.05), loss="non_saturating",
                      **knobs)
    return model


def test_gan_runs_r3gan_on_its_p_variable(one_device, monkeypatch):
    """augment="r3gan" makes the GAN's ada_p (checkpointed): D's inputs go through the
    R3GAN pipe at the variable's value, which a schedule may assign between steps; with
    ada_interval=0 the controller leaves it alone."""
    model = _tiny_gan(one_device, augment="r3gan", ada_p=0.3, ada_interval=0)
    assert "ada_p" in model.step_state() and float(model.ada_p.numpy()) == pytest.approx(0.3)
    seen = []
    original = ada_pipes.augment
    monkeypatch.setattr(ada_pipes, "augment", lambda x, p, key, rows, pipe: seen.append(
        (pipe, p)) or original(x, p, key, rows, pipe))
    fit(model, one_device, 2)
    assert seen and {pipe for pipe, _ in seen} == {"r3gan"}
    assert float(model.ada_p.numpy()) == pytest.approx(0.3)  # No controller.
    model.ada_p.assign(0.9)  # What a p schedule does.
    fit(model, one_device, 1)
    assert float(model.ada_p.numpy()) == pytest.approx(0.9)
