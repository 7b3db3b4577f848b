"""All-reduce cost model of a GAN training step under data parallelism.

What one GAN step (d_steps D updates, then one G update) all-reduces, per replica:
  * gradients: one fused all-reduce per update (gan.apply_global_gradients):
    4 bytes x D's trainable parameters per D update, 4 bytes x G's per G update;
  * cross-replica batch norm (SyncBatchNormalization): one all-reduce of 2C+1 floats per
    layer per pass. G's BN layers run forward in every D update (to make the fakes) and
    forward + backward in the G update: d_steps + 2 times. D's BN layers run forward +
    backward in every D update and in the G update: 2 d_steps + 2 times.

Ring all-reduce of S bytes over N replicas (Patarasuk & Yuan): 2(N-1) sequential steps,
each sending S/N bytes, so time = 2(N-1) alpha + 2 (N-1)/N S / beta, with beta the link
bandwidth and alpha the per-step latency. The bandwidth term is almost independent of N;
the latency term grows with N and dominates small messages -- which every BN message is.

Compute per replica, for the predicted efficiency: forward FLOPs per example g (G) and
d (D) from TensorFlow's profiler; a step costs about d_steps (g + 6 d) + 3 g + 2 d per
example of the replica's batch (backward ~ 2 x forward; D sees real + fake in D updates;
the G update back-propagates through D to its input only). Efficiency assumes no overlap
of communication with compute (TensorFlow's collectives here run after the backward
pass and BN's are on the critical path): compute / (compute + communication).
"""

import tensorflow as tf

BYTES_PER_FLOAT = 4
BN_BYTES_PER_VALUE = 8


def forward_flops(model, input_shape):
    """FLOPs of model(x) for ONE example of shape `input_shape` (TensorFlow's profiler)."""
    fn = tf.function(lambda x: model(x, training=False), autograph=False)
    graph = fn.get_concrete_function(tf.TensorSpec([1, *input_shape])).graph
    opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    opts["output"] = "none"
    return int(tf.compat.v1.profiler.profile(graph=graph, options=opts).total_float_ops)


def _bn_channels(model):
    """Channels of each cross-replica BN layer (local BN communicates nothing)."""
    return [int(layer.moving_mean.shape[0]) for layer in model.layers
            if getattr(layer, "synchronized", False)]


def network_costs(generator, discriminator, data_shape, latent_dim):
    """Parameter counts, synchronized-BN channels and forward FLOPs of a G/D pair."""
    count = lambda m: sum(int(tf.size(w)) for w in m.trainable_weights)
    return {"g_params": count(generator), "d_params": count(discriminator),
            "g_bn_channels": _bn_channels(generator),
            "d_bn_channels": _bn_channels(discriminator),
            "g_flops": forward_flops(generator, [latent_dim]),
            "d_flops": forward_flops(discriminator, list(data_shape))}


def step_messages(costs, d_steps=1):
    """Sizes in bytes of every all-reduce of one GAN step, per replica:
    {"gradients": [...], "batch_norm": [...]}."""
    grads = [BYTES_PER_FLOAT * costs["d_params"]] * d_steps + [BYTES_PER_FLOAT * costs["g_params"]]
    # BN statistics are summed in float64 (layers.SyncBatchNormalization: numerically
    # stable; O(channels), so the doubled bytes are negligible next to the gradients).
    bn = ([BN_BYTES_PER_VALUE * (2 * c + 1) for c in costs["g_bn_channels"]] * (d_steps + 2)
          + [BN_BYTES_PER_VALUE * (2 * c + 1) for c in costs["d_bn_channels"]] * (2 * d_steps + 2))
    return {"gradients": grads, "batch_norm": bn}


def ring_time_s(sizes, replicas, gbit_per_s, latency_s):
    """Seconds for ring all-reduces of `sizes` bytes (one after another) over `replicas`."""
    if replicas < 2:
        return 0.0
    n = replicas
    beta = gbit_per_s * 1e9 / 8
    return sum(2 * (n - 1) * latency_s + 2 * (n - 1) / n * s / beta for s in sizes)


def step_flops_per_example(costs, d_steps=1):
    g, d = costs["g_flops"], costs["d_flops"]
    return d_steps * (g + 6 * d) + 3 * g + 2 * d


def efficiency(costs, *, replicas, per_replica_batch, gbit_per_s, latency_s, flops_per_s,
               d_steps=1, sync_bn=True):
    """Predicted scaling efficiency (compute / (compute + communication)) at `replicas`."""
    compute = per_replica_batch * step_flops_per_example(costs, d_steps) / flops_per_s
    msgs = step_messages(costs, d_steps)
    sizes = msgs["gradients"] + (msgs["batch_norm"] if sync_bn else [])
    comm = ring_time_s(sizes, replicas, gbit_per_s, latency_s)
    return compute / (compute + comm)
