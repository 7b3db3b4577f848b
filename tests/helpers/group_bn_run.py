"""Group-wise SyncBatchNormalization on 4 logical CPU replicas vs one device (a test helper).

    python tests/helpers/group_bn_run.py --out=results.npz

Writes {CASE/WHAT: array} for CASE in
  one_full       one device, full batch statistics;
  one_ghost2     one device, virtual_groups=2 (rows 0-7 and 8-15 apart);
  mirrored4_g2   MirroredStrategy over 4 CPUs, group_size=2 (replicas {0, 1}, {2, 3});
  mirrored4_g4   the same, group_size=4 (all replicas: full sync);
and WHAT in y (outputs), dx (input gradients), dgamma, dbeta (summed over replicas),
moving_mean, moving_variance. tests/layers/test_group_batch_norm.py compares them. A separate
process because the pytest process has 2 logical CPUs (tests/conftest.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Halves of different means: ghost statistics differ from full-batch ones by far.
CHANNEL_WEIGHTS = [1.0, -2.0, 0.5]


def halves(rows=16, dtype=tf.float32):
    """[rows, 2, 2, 3]: the first half around 5, the second around -5 (spread 2)."""
    x = tf.random.stateless_normal([rows, 2, 2, 3], seed=[7, 8], dtype=dtype) * 2.0
    shift = tf.concat([tf.fill([rows // 2, 1, 1, 1], 5.0),
                       tf.fill([rows - rows // 2, 1, 1, 1], -5.0)], 0)
    return x + tf.cast(shift, dtype)


def run_bn(strategy, layer_fn, x):
    """{y, dx, dgamma, dbeta, moving_mean, moving_variance} of ONE training call of a fresh
    layer on the global batch x, split over the strategy's replicas in row order."""
    with strategy.scope():
        layer = layer_fn()
        layer.build(x.shape)
    layer.gamma.assign(tf.constant([1.5, 0.5, -1.0]))
    weights = tf.constant(CHANNEL_WEIGHTS)

    def fn(xr):
        with tf.GradientTape() as tape:
            tape.watch(xr)
            y = layer(xr, training=True)
            # Cubed: the gradient flows through the group means and variances.
            loss = tf.reduce_sum(y ** 3 * weights)
        dx, dgamma, dbeta = tape.gradient(loss, [xr, layer.gamma, layer.beta])
        ctx = tf.distribute.get_replica_context()
        if ctx.num_replicas_in_sync > 1:
            dgamma, dbeta = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [dgamma, dbeta])
        return y, dx, dgamma, dbeta

    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(x).unbatch().batch(x.shape[0]))
    y, dx, dgamma, dbeta = tf.function(lambda xs: strategy.run(fn, args=(xs,)))(
        next(iter(ds)))
    local = lambda v: [t.numpy() for t in strategy.experimental_local_results(v)]  # noqa: E731
    # Moving statistics are per replica (aggregation none): [replicas, C], all must agree.
    copies = lambda v: np.stack(local(v.value))  # noqa: E731  (.value: tf's variable)
    return {"y": np.concatenate(local(y)), "dx": np.concatenate(local(dx)),
            "dgamma": local(dgamma)[0], "dbeta": local(dbeta)[0],
            "moving_mean": copies(layer.moving_mean),
            "moving_variance": copies(layer.moving_variance)}


def main(out):
    from tf_gan_scale import distribute
    from tf_gan_scale.layers import SyncBatchNormalization

    distribute.configure_cpu_devices(4)
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    mirrored = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    x = halves()
    bn = lambda **kw: lambda: SyncBatchNormalization(momentum=0.5, **kw)  # noqa: E731
    cases = {"one_full": (one, bn()), "one_ghost2": (one, bn(virtual_groups=2)),
             "mirrored4_g2": (mirrored, bn(group_size=2)),
             "mirrored4_g4": (mirrored, bn(group_size=4))}
    arrays = {}
    for case, (strategy, layer_fn) in cases.items():
        for what, value in run_bn(strategy, layer_fn, x).items():
            arrays[f"{case}/{what}"] = value
    np.savez(out, **arrays)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].startswith("--out="):
        sys.exit("usage: group_bn_run.py --out=FILE.npz")
    main(sys.argv[1][len("--out="):])
