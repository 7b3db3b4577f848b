"""Throughput switches: config.train.precision (precision.py), jit_compile and
accumulation_steps (GAN.compile). Equivalence across topologies for mixed_bfloat16 and
accumulation lives in tests/integration/test_equivalence.py (cases "bf16", "accumulate*")."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY, run_cmd, run_in_process
from helpers.tiny_gan import SHAPES, SMALL

from tf_gan_scale import architectures, configs, data, errors, gan, precision
from tf_gan_scale import training


@pytest.mark.parametrize("name,conditional", [(n, c) for n in sorted(SHAPES)
                                              for c in (False, True)
                                              if c is False or architectures.conditional(n)])
def test_mixed_bfloat16_computes_in_bf16_with_float32_variables_and_outputs(name, conditional):
    shape = SHAPES[name][0]
    classes = 3 if architectures.conditional(name) and conditional else 0
    with precision.policy("mixed_bfloat16"):
        g, d = architectures.build(name, data_shape=shape, latent_dim=7, num_classes=classes,
                                   **SMALL[name])
    assert keras.config.dtype_policy().name == "float32"  # The global policy is restored.
    for net in (g, d):
        # Variables (and so gradients, their all-reduce and checkpoints) and batch-norm
        # moving statistics stay float32 ...
        assert {v.dtype for v in net.weights if "float" in v.dtype} == {"float32"}, net.name
        # ... while the hidden layers compute in bfloat16.
        assert sum(layer.compute_dtype == "bfloat16" for layer in net.layers) >= 2, net.name
    z = tf.random.normal([5, 7])  # 5 rows: SMALL's minibatch-std groups (stylegan2).
    labels = tf.constant([0, 1, 2, 0, 1])
    x = g([z, labels] if classes else z, training=True)
    logits = d([x, labels] if classes else x, training=True)
    assert x.dtype == logits.dtype == tf.float32  # What losses and samples need.


def test_precision_names_are_checked():
    with pytest.raises(errors.ConfigError, match="unknown precision 'float16'; valid: "
                                                 "float32, mixed_bfloat16, mixed_float16"):
        precision.check("float16")
    opt = precision.optimizer(keras.optimizers.SGD(0.1), "mixed_float16")
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert not isinstance(precision.optimizer(keras.optimizers.SGD(0.1), "mixed_bfloat16"),
                          keras.optimizers.LossScaleOptimizer)


def _fp16_gan(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        with precision.policy("mixed_float16"):
            # No batch norm in D: an inf input would poison its moving statistics, which
            # no skipped update can undo (that is an error, not an overflow).
            g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=4,
                                       d_dropout=0.0, d_norm="none", g_channels=(8, 4, 4),
                                       d_channels=(4, 4))
        model = gan.GAN(g, d, 4, seed=0)
        model.compile(
            g_optimizer=precision.optimizer(keras.optimizers.SGD(0.1), "mixed_float16"),
            d_optimizer=precision.optimizer(keras.optimizers.SGD(0.1), "mixed_float16"))
    return model


def _local(strategy, variables):
    """[replica][variable] arrays of Keras variables."""
    return [[np.asarray(r) for r in strategy.experimental_local_results(v.value)]
            for v in variables]


def test_mixed_float16_an_inf_on_one_replica_skips_the_update_on_every_replica(mirrored2):
    model = _fp16_gan(mirrored2)
    x = np.random.default_rng(0).uniform(-1, 1, (16, 8, 8, 1)).astype(np.float32)
    x[12, 3, 3, 0] = np.inf  # Row 12 of 16: replica 1's half only.
    bad = tf.data.Dataset.from_tensors({"x": x, "label": np.zeros(16, np.int32)}).repeat()
    d_vars, g_vars = model.discriminator.trainable_variables, model.generator.trainable_variables
    d_before, g_before = _local(mirrored2, d_vars), _local(mirrored2, g_vars)
    scale = float(model.d_optimizer.dynamic_scale.numpy())
    logs = model.fit(mirrored2.experimental_distribute_dataset(bad), epochs=1,
                     steps_per_epoch=1, verbose=0).history
    # D's update is skipped on BOTH replicas (replica 0's own gradients were finite),
    # its scale halved, the skip counted; G's update (no real data) went ahead.
    for before, after in zip(d_before, _local(mirrored2, d_vars)):
        for a in after:
            np.testing.assert_array_equal(a, before[0])
    assert float(model.d_optimizer.dynamic_scale.numpy()) == scale / 2
    assert logs["d_skip_rate"] == [1.0] and logs["g_skip_rate"] == [0.0]
    moved = [np.abs(a[0] - b[0]).max() for a, b in zip(_local(mirrored2, g_vars), g_before)]
    assert max(moved) > 0
    # The step counter and the optimizers' update counts advance anyway: the data
    # position and the next step's latents do not depend on how many updates overflowed.
    assert int(model.step.numpy()) == 1 == int(model.d_optimizer.iterations.numpy())
    x[12, 3, 3, 0] = 0.5
    good = tf.data.Dataset.from_tensors({"x": x, "label": np.zeros(16, np.int32)}).repeat()
    logs = model.fit(mirrored2.experimental_distribute_dataset(good), epochs=1,
                     steps_per_epoch=1, verbose=0).history
    assert logs["d_skip_rate"] == [0.0]
    after = _local(mirrored2, d_vars)
    assert max(np.abs(a[0] - b[0]).max() for a, b in zip(after, d_before)) > 0
    for replicas in after:  # Still identical on both replicas.
        np.testing.assert_array_equal(replicas[0], replicas[1])


def _tiny_gan(strategy, **compile_args):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=4,
                                   d_dropout=0.0, d_norm="batch", g_channels=(8, 4, 4),
                                   d_channels=(4, 4))
        model = gan.GAN(g, d, 4, seed=0)
        model.compile(g_optimizer=keras.optimizers.SGD(0.1),
                      d_optimizer=keras.optimizers.SGD(0.1), **compile_args)
    return model


def _digits(strategy, batch=16):
    ds = data.make_dataset(data.load("embedded:digits"), global_batch_size=batch, seed=0)
    return strategy.experimental_distribute_dataset(ds)


def test_xla_step_trains_what_the_plain_step_trains(one_device):
    models = {jit: _tiny_gan(one_device, jit_compile=jit) for jit in (False, True)}
    for model in models.values():
        model.fit(_digits(one_device), epochs=1, steps_per_epoch=3, verbose=0)
    # The step really went through XLA: its per-replica function must be compiled.
    graph = models[True].step_function.get_concrete_function(
        iter(_digits(one_device))).graph
    library = graph.as_graph_def().library.function
    assert any(f.attr["_XlaMustCompile"].b for f in library)
    assert not any(f.attr["_XlaMustCompile"].b for f in models[False].step_function
                   .get_concrete_function(iter(_digits(one_device))).graph.as_graph_def()
                   .library.function)
    for a, b in zip(models[True].generator.weights, models[False].generator.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


def test_xla_with_several_replicas_is_refused(mirrored2):
    with pytest.raises(errors.ConfigError, match="jit_compile=True needs one replica"):
        _tiny_gan(mirrored2, jit_compile=True)


@pytest.mark.parametrize("jit", [False, True])
def test_accumulation_needs_a_divisor_of_the_replica_batch(one_device, jit):
    # Checked outside the per-replica step: XLA (jit) drops assertions inside it.
    model = _tiny_gan(one_device, accumulation_steps=3, jit_compile=jit)
    with pytest.raises(errors.ConfigError, match="accumulation_steps=3 does not divide the "
                                                 "per-replica batch of 16 rows"):
        model.fit(_digits(one_device), epochs=1, steps_per_epoch=1, verbose=0)


def _trained_weights(strategy, steps=2, **compile_args):
    """All weights of a tiny BN-free DCGAN after `steps` SGD steps on the digits."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=4,
                                   d_dropout=0.0, g_norm="none", d_norm="none",
                                   g_channels=(8, 4, 4), d_channels=(4, 4))
        model = gan.GAN(g, d, 4, seed=0)
        model.compile(g_optimizer=keras.optimizers.SGD(0.1),
                      d_optimizer=keras.optimizers.SGD(0.1), **compile_args)
    model.fit(_digits(strategy), epochs=1, steps_per_epoch=steps, verbose=0)
    return [w.numpy() for w in model.generator.weights + model.discriminator.weights]


def test_accumulation_adds_the_orthogonal_regularizer_once_per_update(one_device):
    # A regularizer of the weights (not per example) must count once per update, not
    # once per micro-batch: with it, K = 2 still equals one big batch.
    want = _trained_weights(one_device, ortho_weight=0.1)
    got = _trained_weights(one_device, ortho_weight=0.1, accumulation_steps=2)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-5)
    off = _trained_weights(one_device, ortho_weight=0.0, accumulation_steps=2)
    assert max(np.abs(a - b).max() for a, b in zip(off, want)) > 1e-3  # It matters.


def test_conditional_biggan_accumulates_its_sparse_embedding_gradients(one_device, mirrored2):
    # G's shared class embedding has sparse (IndexedSlices) gradients; summed over
    # micro-batches they must give the same training on one device and on 2 replicas.
    def train(strategy):
        keras.utils.set_random_seed(0)
        source = data.load("embedded:digits")
        x = np.repeat(np.repeat(source.arrays["x"], 2, axis=1), 2, axis=2)  # 16x16
        source = data.from_arrays("digits16", x, source.arrays["label"])
        with strategy.scope():
            g, d = architectures.build("biggan", data_shape=(16, 16, 1), latent_dim=8,
                                       num_classes=10, ch=4, g_channels=(2, 2),
                                       d_channels=(1, 2), attention=0, shared_dim=4)
            model = gan.GAN(g, d, 8, seed=0, num_classes=10)
            model.compile(g_optimizer=keras.optimizers.SGD(0.01),
                          d_optimizer=keras.optimizers.SGD(0.01), loss="hinge",
                          accumulation_steps=2)
        ds = data.make_dataset(source, global_batch_size=8, seed=0)
        model.fit(strategy.experimental_distribute_dataset(ds), epochs=1, steps_per_epoch=2,
                  verbose=0)
        return [w.numpy() for w in model.generator.weights]

    for a, b in zip(train(mirrored2), train(one_device)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("key, value, message", [
    ("precision", "float16", "unknown precision 'float16'; valid: float32, mixed_bfloat16, "
                             "mixed_float16"),
    ("jit_compile", "yes", "config.train.jit_compile='yes'; valid: auto, true, false"),
    ("accumulation_steps", 0, "config.train.accumulation_steps must be an integer >= 1; "
                              "Received: 0"),
    ("accumulation_steps", 3, "config.train.accumulation_steps=3 does not divide the "
                              "per-replica batch 128 (global batch 256 / 2 replicas); "
                              "valid: 1, 2, 4, 8, 16, 32, 64, 128"),
])
def test_bad_throughput_settings_are_one_line_errors(key, value, message):
    config = configs.base()
    config.train[key] = value
    with pytest.raises(errors.ConfigError) as e:
        training.validate(config, 2)
    assert str(e.value) == message


# In this process (conftest.run_in_process, on one device): no process start each. The
# XLA case with 2 replicas needs a strategy of its own: the real binary.
@pytest.mark.parametrize("flags, message, run", [
    (["--config.train.precision=half", "--strategy=one_device"], "unknown precision 'half'",
     run_in_process),
    pytest.param(["--config.train.jit_compile=true", "--strategy=mirrored",
                  "--num_cpu_devices=2"], "config.train.jit_compile='true' needs one replica",
                 run_cmd, marks=pytest.mark.slow),
    (["--config.train.accumulation_steps=5", "--strategy=one_device"],
     "accumulation_steps=5 does not divide", run_in_process),
], ids=["precision", "jit", "accumulation"])
def test_binary_exits_2_before_writing(tmp_path, flags, message, run):
    workdir = tmp_path / "run"
    proc = run(["-m", "tf_gan_scale.main", *TINY, f"--workdir={workdir}",
                "--config.train.num_steps=2", *flags])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if message in line]
    assert lines, proc.stderr[-2000:]
    assert not os.path.exists(workdir) or not os.listdir(workdir)


@pytest.mark.slow
def test_binary_trains_mixed_bfloat16_with_accumulation(tmp_path):
    workdir = tmp_path / "run"
    proc = run_cmd(["-m", "tf_gan_scale.main", *TINY, f"--workdir={workdir}",
                    "--config.train.num_steps=4", "--config.train.precision=mixed_bfloat16",
                    "--config.train.accumulation_steps=2", "--config.train.log_every=2",
                    "--config.train.checkpoint_every=2", "--config.train.sample_every=0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.exists(workdir / "checkpoints" / "ckpt-4.index")
    config, shape, _ = training.load_run(str(workdir))
    assert config.train.precision == "mixed_bfloat16" and config.train.accumulation_steps == 2
