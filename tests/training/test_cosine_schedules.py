"""R3GAN's cosine schedules (schedules.py, config.train.cosine) of the learning rate, Adam's
beta_2, the EMA half-life and ADA's p, against NumPy transcriptions of the official code
(brownvc/R3GAN training/training_loop.py:29-38 cosine_decay_with_warmup, 307-355; and
torch.optim.Adam's update); a resume continues them exactly, two replicas agree."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import configs, data, errors, schedules, training
from tf_gan_scale.gan import ada_controller, ema
from tf_gan_scale.gan.step_config import StepConfig
from tf_gan_scale.training import build, record


def official(cur_nimg, base_value, total_nimg, final_value=0.0):
    """training_loop.py:29-38 (warm-up and hold are 0 in every preset)."""
    decay = 0.5 * (1 + np.cos(np.pi * cur_nimg / float(total_nimg)))
    cur_value = base_value + (1 - decay) * (final_value - base_value)
    return float(np.where(cur_nimg > total_nimg, final_value, cur_value))


# ---- the value --------------------------------------------------------------------------

@pytest.mark.parametrize("base, final", [(2e-4, 5e-5), (0.9, 0.99), (0.0, 0.55), (150, 15)])
def test_the_value_is_the_official_one(base, final):
    total, batch = 2e7, 512
    cos = schedules.Cosine(base, final, total)
    steps = [0, 1, 3, 19531, 19532, 39062, 39063, 39064, 10 ** 6]  # T/2 and T fall near.
    for step in steps:
        want = official(step * batch, base, total, final)
        assert float(cos.at(step, batch)) == np.float32(want), step
    assert float(cos.at(0, batch)) == np.float32(base)
    assert float(cos.at(10 ** 6, batch)) == np.float32(final)  # Past T: final.
    half = schedules.Cosine(base, final, 1000).at(50, 10)  # T/2: the mean.
    np.testing.assert_allclose(float(half), (base + final) / 2, rtol=1e-6)


def test_an_optimizers_schedule_counts_g_steps():
    # D makes d_steps = 3 updates per G step, all at the images seen before the step.
    s = schedules.CosineSchedule(1.0, 0.0, 100, batch_size=10, updates_per_step=3)
    got = [float(s(i)) for i in range(12)]
    want = [np.float32(official(i // 3 * 10, 1.0, 100, 0.0)) for i in range(12)]
    assert got == want and got[3] != got[2]
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(s))
    assert [float(again(i)) for i in range(12)] == got


# ---- Adam's beta_2 ------------------------------------------------------------------------

def torch_adam(p, grads, lrs, beta2s, beta1=0.0, eps=1e-8):
    """torch.optim.Adam (_single_tensor_adam, not capturable) in NumPy, with R3GAN's lr and
    betas written into the param group before each step: float64 scalars, float32
    tensors, the same order of operations."""
    p, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
    out = []
    for step, (g, lr, beta2) in enumerate(zip(grads, lrs, beta2s), 1):
        w = np.float32(1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1)
        m = m + w * (g - m) if w < 0.5 else g - (g - m) * (np.float32(1) - w)
        v = v * np.float32(beta2) + np.float32(1 - beta2) * g * g  # mul_, addcmul_
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        step_size = lr / bias_correction1
        denom = np.sqrt(v) / np.float32(bias_correction2 ** 0.5) + np.float32(eps)
        p = p + np.float32(-step_size) * m / denom  # addcdiv_(exp_avg, denom, -step_size)
        out.append(p)
    return out


@pytest.mark.parametrize("beta1", [0.0, 0.5])
def test_torch_adam_with_a_beta2_schedule_is_torchs(beta1):
    batch, total = 4, 16  # beta_2 and the rate move fast: a wrong one shows at once.
    lr = schedules.CosineSchedule(0.1, 0.02, total, batch)
    b2 = schedules.CosineSchedule(0.9, 0.99, total, batch)
    opt = schedules.TorchAdam(learning_rate=lr, beta_1=beta1, beta_2=b2, epsilon=1e-8)
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(64).astype(np.float32)
    grads = [(rng.standard_normal(64) * 10.0 ** rng.uniform(-3, 1, 64)).astype(np.float32)
             for _ in range(6)]
    var = keras.Variable(p0)
    opt.build([var])
    nimg = [i * batch for i in range(len(grads))]
    lrs = [official(n, 0.1, total, 0.02) for n in nimg]
    beta2s = [official(n, 0.9, total, 0.99) for n in nimg]
    want = torch_adam(p0, grads, lrs, beta2s, beta1)
    # Bias correction with the first beta_2 (what a constant beta_2 would give).
    stale = torch_adam(p0, grads, lrs, [beta2s[0]] * len(grads), beta1)
    for g, w, s in zip(grads, want, stale):
        opt.apply([tf.constant(g)], [var])
        got = var.numpy()
        assert (np.abs(got - w) <= np.spacing(np.abs(w))).all()  # Within one float32 ulp.
        if s is not stale[0]:
            assert np.abs(got - s).max() > 1e-3
    # A .keras round trip keeps the schedule.
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(again, schedules.TorchAdam)
    again.iterations.assign(5)
    assert float(again.current_beta_2()) == beta2s[5]


# ---- the EMA and ADA's p ----------------------------------------------------------------

def test_the_ema_decay_is_the_official_beta():
    g = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    batch, total = 8, 200
    for base, final in ((0.0, 0.05), (0.02, 0.1)):  # kimg: 0 -> 50 images, as R3GAN's 0 ->.
        e = ema.GeneratorEMA(g, 0.0, batch_size=batch, cosine=(base, final, total))
        for t in range(1, 31):  # G step t counted after the update; images before it.
            half_life = official((t - 1) * batch, base * 1000, total, final * 1000)
            beta = 0.5 ** (batch / max(half_life, 1e-8))
            np.testing.assert_allclose(float(e.decay_at(t)), beta, rtol=1e-6, atol=0)
        if base == 0:
            assert float(e.decay_at(1)) == 0.0  # R3GAN's first update copies G.


def test_ada_p_is_set_from_the_schedule_every_step():
    c = StepConfig(augment="ada", ada_interval=0,
                   cosine={"images": 100.0, "ada_p": (0.0, 0.55)})
    c.validate()
    p, stats = tf.Variable(0.3), tf.Variable([5.0, 8.0])
    ctl = ada_controller.AdaController(config=c, state=(p, stats))
    for step in range(12):
        ctl.adjust(tf.constant(step, tf.int64), 16)
        assert float(p.numpy()) == np.float32(official(step * 16, 0.0, 100, 0.55))
    with pytest.raises(errors.ConfigError, match="cosine.ada_p") as e:
        StepConfig(augment="ada", cosine={"images": 1.0, "ada_p": (0, 1)}).validate()
    assert "\n" not in str(e.value) and "ada_interval=4" in str(e.value)
    with pytest.raises(errors.ConfigError, match="cosine.ada_p"):
        StepConfig(augment="", ada_interval=0,
                   cosine={"images": 1.0, "ada_p": (0, 1)}).validate()


# ---- the config -------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"lr_decay": "linear"}, "lr_decay='linear'"),
    ({"lr_warmup_steps": 2}, "lr_warmup_steps=2"),
    ({"lazy_phases": True}, "lazy_phases=True"),
    ({"g_optimizer.name": "sgd"}, "g_optimizer.name='sgd'"),
    ({"ema.decay": 0.999}, "ema.decay=0.999"),
    ({"ema.rampup": 0.05}, "ema.rampup=0.05"),
    ({"ema.kimg": 10.0}, "ema.kimg=10.0"),
])
def test_conflicting_settings_are_refused_in_one_line(change, words):
    c = tiny_config()
    for key, value in change.items():
        node, *path = key.split(".")
        target = c.train[node] if path else c.train
        target[path[0] if path else node] = value
    with pytest.raises(errors.ConfigError) as e:
        build.cosine_options(c.train)
    assert "\n" not in str(e.value) and "config.train.cosine." in str(e.value)
    assert words in str(e.value)


def test_cosine_keys_are_math_on_resume():
    flat = {"train.lr_decay": "none"}
    for key in ("images", *schedules.COSINE_KEYS):
        assert not record.is_free(f"train.cosine.{key}", flat)
    assert record.is_free("train.num_steps", flat)  # In images: the run's length is free.


# ---- training: resume and replicas ------------------------------------------------------

STEPS, GB = 6, 8


def tiny_config():
    """A tiny DCGAN with every schedule of this file on, each moving over the run."""
    c = configs.base()
    c.model.g_channels, c.model.d_channels, c.model.latent_dim = (8, 4, 2), (4, 4), 4
    # No batch norm: a bias before it has a zero gradient, whose rounding noise Adam
    # (beta_1 = 0) would scale up to +-lr on one topology and not on another.
    c.model.g_norm = c.model.d_norm = "none"
    c.train.num_steps, c.train.global_batch_size, c.train.d_steps = STEPS, GB, 2
    c.train.augment, c.train.ada_interval = "ada", 0
    for opt in (c.train.g_optimizer, c.train.d_optimizer):
        opt.beta_1, opt.epsilon = 0.0, 1e-8
    c.train.cosine.images = float(STEPS * GB)
    c.train.cosine.learning_rate = (2e-3, 5e-4)
    c.train.cosine.beta_2 = (0.9, 0.99)
    c.train.cosine.ema_kimg = (0.0, 0.02)
    c.train.cosine.ada_p = (0.0, 0.55)
    return c


def dataset(c, start_step):
    source = data.load(c.data.source)
    return data.make_dataset(source, global_batch_size=GB, seed=c.seed,
                             start_batch=start_step * c.train.d_steps)


def values(model):
    """Every checkpointed variable's value, by name."""
    items = model.checkpoint_items()
    return {f"{name}/{i}": v.numpy() for name in sorted(items)
            for i, v in enumerate(getattr(items[name], "variables", [items[name]]))}


class SaveAt(keras.callbacks.Callback):
    def __init__(self, step, path):
        super().__init__()
        self.step, self.path = step, path

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            tf.train.Checkpoint(**self.model.checkpoint_items()).write(self.path)


@pytest.fixture(scope="module")
def straight(one_device, tmp_path_factory):
    """The tiny GAN trained STEPS steps in one fit, checkpointed at STEPS / 2."""
    c = tiny_config()
    path = os.path.join(tmp_path_factory.mktemp("cosine"), "half")
    with one_device.scope():
        model = training.build_gan(c, (8, 8, 1))
    model.fit(one_device.experimental_distribute_dataset(dataset(c, 0)), epochs=1,
              steps_per_epoch=STEPS, verbose=0, callbacks=[SaveAt(STEPS // 2, path)])
    return c, model, path


def test_the_schedules_reach_the_optimizers_the_ema_and_p(straight):
    c, model, _ = straight
    g, d = model.g_optimizer, model.d_optimizer
    assert isinstance(g, schedules.TorchAdam) and isinstance(d, schedules.TorchAdam)
    assert int(g.iterations.numpy()) == STEPS and int(d.iterations.numpy()) == 2 * STEPS
    last = (STEPS - 1) * GB  # p was set at the start of the last step.
    assert float(model.ada_p.numpy()) == np.float32(official(last, 0.0, STEPS * GB, 0.55))
    assert float(model.ada_p.numpy()) > 0.4
    for opt in (g, d):  # At the images after STEPS steps: the final values.
        assert float(opt.learning_rate) == np.float32(5e-4)
        assert float(opt.current_beta_2()) == 0.99
    assert model.ema is not None  # ema.decay = ema.kimg = 0: the schedule turns it on.
    live = model.generator.get_weights()
    assert any(np.abs(a - b).max() > 1e-6 for a, b in zip(model.ema.model.get_weights(), live))


def test_a_keras_file_keeps_the_schedules(straight, one_device, tmp_path):
    _, model, _ = straight
    path = str(tmp_path / "gan.keras")
    model.save(path)
    with one_device.scope():
        loaded = keras.models.load_model(path)
    for name in ("g_optimizer", "d_optimizer"):
        opt, want = getattr(loaded, name), getattr(model, name)
        assert type(opt) is schedules.TorchAdam and opt.get_config() == want.get_config()
        assert float(opt.current_beta_2()) == float(want.current_beta_2())
    assert loaded.step_config.schedule("ada_p") is not None
    assert float(loaded.ema.decay_at(2)) == float(model.ema.decay_at(2)) > 0
    want, got = values(model), values(loaded)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_resume_continues_every_schedule_exactly(straight, one_device):
    c, model, path = straight
    with one_device.scope():
        resumed = training.build_gan(c, (8, 8, 1))
    tf.train.Checkpoint(**resumed.checkpoint_items()).read(path).assert_consumed()
    assert int(resumed.step.numpy()) == STEPS // 2
    resumed.fit(one_device.experimental_distribute_dataset(dataset(c, STEPS // 2)),
                epochs=1, steps_per_epoch=STEPS - STEPS // 2, verbose=0)
    want, got = values(model), values(resumed)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.slow  # The equivalence matrix's "rpgan" case runs the same schedules on
# 2 workers x 2 replicas in the default tier (all but beta_2: plain SGD there).
def test_two_replicas_agree_with_one_device(straight, mirrored2):
    c, model, _ = straight
    with mirrored2.scope():
        two = training.build_gan(c, (8, 8, 1))
    two.fit(mirrored2.experimental_distribute_dataset(dataset(c, 0)), epochs=1,
            steps_per_epoch=STEPS, verbose=0)
    want, got = values(model), values(two)
    for name in want:
        a = want[name]
        assert np.abs(got[name] - a).max() <= 1e-5 * (1 + np.abs(a).max()), name
    assert float(two.ada_p.numpy()) == float(model.ada_p.numpy())
    # Each replica holds the same p and EMA (local copies, assigned in replica context).
    for v in [two.ada_p, *two.ema.model.weights]:
        first, second = (x.numpy() for x in mirrored2.experimental_local_results(v.value))
        np.testing.assert_array_equal(first, second)
