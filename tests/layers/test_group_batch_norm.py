"""Group-wise cross-replica batch norm (SyncBatchNormalization(group_size=G)).

The contract is ghost batch norm: R replicas in groups of G compute what ONE device
computes with the global batch split into R/G contiguous groups of rows, each normalized
by its own statistics (`virtual_groups=R // G`) -- not full-batch equivalence.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cmd
from helpers.group_bn_run import halves, run_bn
from test_sync_batch_norm import all_reduces_per_pass, r1_of_bn
from tf_gan_scale import configs, errors
from tf_gan_scale import training
from tf_gan_scale.layers import ConditionalBatchNormalization, SyncBatchNormalization
from tf_gan_scale.layers.normalization import check_config, set_group_size, set_row_groups
from tf_gan_scale.layers.sync_batch_norm import check_group_size

WHAT = ("y", "dx", "dgamma", "dbeta", "moving_mean", "moving_variance")


def assert_same(actual, expected, what=WHAT):
    for w in what:
        a, e = actual[w], expected[w]
        if w.startswith("moving"):  # [replicas, C] copies against one device's [1, C].
            e = np.broadcast_to(e, a.shape)
        # Relative for the large gamma gradients, absolute for the values near 0.
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5 * (1 + np.abs(e).max()),
                                   err_msg=w)


def max_diff(a, b, what=WHAT):
    return {w: float(np.abs(a[w] - b[w]).max()) for w in what}


def ghost_reference(x, gamma, groups, momentum=0.5, epsilon=1e-3):
    """Ghost BN by hand: tf.nn.moments and the BN formula per contiguous group of rows;
    moving statistics from the mean over groups of their means and variances."""
    weights = tf.constant([1.0, -2.0, 0.5])
    gamma, beta = tf.constant(gamma), tf.zeros([3])
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        parts, means, variances = [], [], []
        for part in tf.split(x, groups):
            mean, variance = tf.nn.moments(part, [0, 1, 2])
            parts.append((part - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta)
            means.append(mean)
            variances.append(variance)
        y = tf.concat(parts, 0)
        loss = tf.reduce_sum(y ** 3 * weights)
    dx, dgamma, dbeta = tape.gradient(loss, [x, gamma, beta])
    mean_of = lambda v: (1 - momentum) * tf.reduce_mean(tf.stack(v), 0).numpy()[None]  # noqa: E731
    return {"y": y.numpy(), "dx": dx.numpy(), "dgamma": dgamma.numpy(),
            "dbeta": dbeta.numpy(), "moving_mean": mean_of(means),
            "moving_variance": momentum + mean_of(variances)}  # Moving variance starts at 1.


def bn(**kwargs):
    return lambda: SyncBatchNormalization(momentum=0.5, **kwargs)


def test_virtual_groups_on_one_device_is_ghost_batch_norm(one_device):
    x = halves()
    ours = run_bn(one_device, bn(virtual_groups=2), x)
    assert_same(ours, ghost_reference(x, [1.5, 0.5, -1.0], 2))
    # The halves' means are 5 and -5: full-batch statistics are far from the ghost ones.
    full = run_bn(one_device, bn(), x)
    diffs = max_diff(ours, full, ("y", "dx", "dgamma", "moving_variance"))
    assert min(diffs.values()) > 1.0, diffs


def test_two_replicas_in_groups_of_one_equal_one_device_ghost_halves(one_device, mirrored2):
    # (c) in process: with groups ignored (full sync) the numbers would be the full
    # batch's, off by more than 1.0 where the tolerance is ~1e-5.
    x = halves()
    grouped = run_bn(mirrored2, bn(group_size=1), x)
    ghost = run_bn(one_device, bn(virtual_groups=2), x)
    assert_same(grouped, ghost)
    full = run_bn(one_device, bn(), x)
    diffs = max_diff(grouped, {k: v for k, v in full.items()}, ("y", "dx", "dgamma"))
    assert min(diffs.values()) > 1.0, diffs


@pytest.mark.parametrize("group_size", [0, 2, 5])
def test_a_group_of_all_replicas_is_full_sync(one_device, mirrored2, group_size):
    x = halves()
    assert_same(run_bn(mirrored2, bn(group_size=group_size), x), run_bn(one_device, bn(), x))


def test_groups_keep_one_all_reduce_per_pass(mirrored2):
    # Forward + backward.
    assert all_reduces_per_pass(mirrored2, lambda: SyncBatchNormalization(group_size=1)) == 2


def test_second_order_gradients_match_one_device_ghost(one_device, mirrored2):
    # The double backprop of an R1 / WGAN-GP penalty through D, float64.
    x = tf.random.stateless_normal([8, 3, 3, 4], seed=[3, 4], dtype=tf.float64) * 2.0 + 1.0
    gamma = np.array([1.5, 0.5, -1.0, 2.0])
    one = r1_of_bn(one_device, functools.partial(SyncBatchNormalization, virtual_groups=2),
                   x, gamma)
    two = r1_of_bn(mirrored2, functools.partial(SyncBatchNormalization, group_size=1),
                   x, gamma)
    full = r1_of_bn(one_device, SyncBatchNormalization, x, gamma)
    for a, b in zip(two, one):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert np.abs(full[1] - one[1]).max() > 1e-3 * np.abs(one[1]).max()


def read_4_replica_results(tmp_path):
    out = tmp_path / "group_bn.npz"
    proc = run_cmd(["tests/helpers/group_bn_run.py", f"--out={out}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = np.load(out)
    cases = {k.split("/")[0] for k in r.files}
    return {c: {w: r[f"{c}/{w}"] for w in WHAT} for c in cases}


@pytest.mark.slow
def test_four_replicas_in_groups_of_two_equal_one_device_ghost_halves(tmp_path):
    r = read_4_replica_results(tmp_path)
    # (a) group_size=2 on 4 replicas == one device with 2 contiguous ghost halves.
    assert_same(r["mirrored4_g2"], r["one_ghost2"])
    # (b) group_size=4 on 4 replicas == today's full sync == one device, full batch.
    assert_same(r["mirrored4_g4"], r["one_full"])
    # (c) it fails if the groups were ignored: ghost and full numbers differ by > 1.
    diffs = max_diff(r["mirrored4_g2"], r["mirrored4_g4"], ("y", "dx", "dgamma",
                                                             "moving_variance"))
    assert min(diffs.values()) > 1.0, diffs


def test_bad_group_sizes_are_one_line_config_errors(mirrored2):
    with pytest.raises(errors.ConfigError) as e:
        check_config(3, 4)
    assert str(e.value) == ("config.model.sync_bn_group_size=3 does not divide the 4 "
                            "replicas; valid: 0 (all) or 1, 2, 4")
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(errors.ConfigError, match="must be an integer >= 0"):
            SyncBatchNormalization(group_size=bad)
    with pytest.raises(errors.ConfigError, match="needs config.model.sync_bn=True"):
        check_config(2, 4, sync_bn=False)
    with pytest.raises(errors.ConfigError, match="virtual_groups must be an integer >= 1"):
        SyncBatchNormalization(virtual_groups=0)
    assert check_group_size(0, 8) == check_group_size(16, 8) == 8
    assert check_group_size(2, 8) == 2
    # virtual_groups is for one device; under replicas it is group_size's job.
    with mirrored2.scope():
        layer = SyncBatchNormalization(virtual_groups=2)
        layer.build([None, 4])
    with pytest.raises(errors.ConfigError, match="under 2 replicas use group_size"):
        mirrored2.run(tf.function(lambda: layer(tf.ones([2, 4]), training=True),
                                  autograph=False))
    # training.validate: before any data is read or file written (exit 2 from main).
    config = configs.base()
    config.model.sync_bn_group_size = 3
    with pytest.raises(errors.ConfigError, match="sync_bn_group_size=3 does not divide"):
        training.validate(config, 4)
    training.validate(config, 2)  # 3 >= 2 replicas: full sync, valid.
    config.model.sync_bn_group_size = 2
    training.validate(config, 4)


def test_get_config_round_trip_and_set_group_size():
    layer = SyncBatchNormalization(group_size=4, virtual_groups=2, momentum=0.8)
    config = layer.get_config()
    assert (config["group_size"], config["virtual_groups"]) == (4, 2)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(again) is SyncBatchNormalization
    assert (again.group_size, again.virtual_groups, again.momentum) == (4, 2, 0.8)
    cbn = ConditionalBatchNormalization(group_size=2)
    assert ConditionalBatchNormalization.from_config(cbn.get_config()).group_size == 2
    with pytest.raises(ValueError, match="needs synchronized=True"):
        ConditionalBatchNormalization(group_size=2, synchronized=False)
    # set_group_size reaches every cross-replica batch norm, also inside a cBN.
    x, c = keras.Input([4, 4, 3]), keras.Input([5])
    h = ConditionalBatchNormalization()([SyncBatchNormalization()(x), c])
    model = keras.Model([x, c], keras.layers.BatchNormalization()(h))
    assert set_group_size(model, 2) == 3  # Sync BN, the cBN and the cBN's inner BN.
    found = [(type(layer).__name__, layer.group_size) for layer in
             model._flatten_layers(recursive=True) if hasattr(layer, "group_size")]
    assert sorted(found) == [("ConditionalBatchNormalization", 2),
                             ("SyncBatchNormalization", 2), ("SyncBatchNormalization", 2)]
    rebuilt = keras.Model.from_config(model.get_config())
    assert [layer.group_size for layer in rebuilt._flatten_layers(recursive=True)
            if isinstance(layer, SyncBatchNormalization)] == [2, 2]


def test_row_groups_stand_for_the_batch_shards_as_replicas():
    # A mesh runs the global batch as one replica over B batch shards: group_size G
    # becomes B // G contiguous row groups in every sync BN, also a cBN's inner one.
    x, c = keras.Input([4, 4, 3]), keras.Input([5])
    h = ConditionalBatchNormalization(group_size=2)([SyncBatchNormalization()(x), c])
    model = keras.Model([x, c], h)
    set_group_size(model, 2)
    assert set_row_groups(model, 8) == 2
    assert [layer.virtual_groups for layer in model._flatten_layers(recursive=True)
            if isinstance(layer, SyncBatchNormalization)] == [4, 4]
    assert set_row_groups(model, 2) == 0  # G >= B: full statistics.
    set_group_size(model, 3)
    with pytest.raises(errors.ConfigError, match=r"^config.model.sync_bn_group_size=3 "
                       r"does not divide the 4 replicas; valid: 0 \(all\) or 1, 2, 4$"):
        set_row_groups(model, 4)


def test_config_key_reaches_every_batch_norm_of_g_and_d(one_device):
    config = configs.base()
    config.model.d_norm = "batch"
    config.model.g_channels, config.model.d_channels = (8, 8, 8), (8, 8)
    config.model.latent_dim = 4
    assert config.model.sync_bn_group_size == 0  # The default: all replicas.
    config.model.sync_bn_group_size = 2
    with one_device.scope():
        model = training.build_gan(config, (28, 28, 1))
    sizes = [layer.group_size for net in (model.generator, model.discriminator)
             for layer in net._flatten_layers(recursive=True)
             if isinstance(layer, SyncBatchNormalization)]
    assert len(sizes) >= 4 and set(sizes) == {2}, sizes
