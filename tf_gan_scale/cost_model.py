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

Three levers, as parameters of `step_messages` / `step_time` (defaults: today's step);
model output only, none of them is implemented in the step yet:
  * gradient accumulation over K micro-batches (`accumulation_steps`): each update sums
    K micro-batches' gradients locally and all-reduces ONCE, so gradient communication
    per optimizer step is unchanged and per example falls by K; BN still all-reduces per
    micro-batch (K times as many BN messages per optimizer step), and compute is K x.
  * gradient bytes per parameter (`grad_bytes_per_param`): 4 today, also under a mixed
    bfloat16 / float16 policy (variables stay float32, so do their gradients and the
    all-reduce: replica.apply_global_gradients casts nothing); 2 if gradients were cast
    to bfloat16 for the all-reduce.
  * overlap (`packs`, `overlap`): each update's all-reduce split into `packs` equal packs
    (each a ring all-reduce of its own: P x the latency term). With `overlap`, packs are
    sent as the backward pass makes them ready, so they hide behind the backward pass of
    the update's last micro-batch (window W), except the last pack, which is ready only
    when the backward pass ends: an update costs C - W + max(W, comm - last) + last
    instead of C + comm (C: the update's compute; comm: all its packs; last: one pack).
    That is never more than C + comm at the same `packs`; with packs=1 it equals it.
    BN all-reduces stay on the critical path.
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
    def count(m):
        return sum(int(tf.size(w)) for w in m.trainable_weights)

    return {"g_params": count(generator), "d_params": count(discriminator),
            "g_bn_channels": _bn_channels(generator),
            "d_bn_channels": _bn_channels(discriminator),
            "g_flops": forward_flops(generator, [latent_dim]),
            "d_flops": forward_flops(discriminator, list(data_shape))}


def step_messages(costs, d_steps=1, *, accumulation_steps=1,
                  grad_bytes_per_param=BYTES_PER_FLOAT):
    """Sizes in bytes of every all-reduce of one optimizer step (one GAN step, of
    `accumulation_steps` micro-batches per update), per replica:
    {"gradients": [one per update: d_steps of D, then G], "batch_norm": [...]}."""
    k = _positive("accumulation_steps", accumulation_steps)
    b = grad_bytes_per_param
    grads = [b * costs["d_params"]] * d_steps + [b * costs["g_params"]]
    # BN statistics are summed in float64 (layers.SyncBatchNormalization: numerically
    # stable; O(channels), so the doubled bytes are negligible next to the gradients).
    # Every micro-batch normalizes with its own cross-replica statistics.
    bn = ([BN_BYTES_PER_VALUE * (2 * c + 1) for c in costs["g_bn_channels"]] * (d_steps + 2)
          + [BN_BYTES_PER_VALUE * (2 * c + 1) for c in costs["d_bn_channels"]] * (2 * d_steps + 2))
    return {"gradients": grads, "batch_norm": bn * k}


def _positive(name, value):
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1; Received: {name}={value}")
    return int(value)


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


def update_flops_per_example(costs, d_steps=1):
    """[(total, backward) FLOPs per example] of each update, in step_messages' order.
    D update: G forward (fakes), D forward + backward on real + fake: g + 2d + 4d, of
    which 4d backward. G update: G and D forward, backward through D to its input and
    through G: g + d + (d + 2g), of which d + 2g backward."""
    g, d = costs["g_flops"], costs["d_flops"]
    return [(g + 6 * d, 4 * d)] * d_steps + [(3 * g + 2 * d, 2 * g + d)]


def step_time(costs, *, replicas, per_replica_batch, gbit_per_s, latency_s, flops_per_s,
              d_steps=1, sync_bn=True, accumulation_steps=1,
              grad_bytes_per_param=BYTES_PER_FLOAT, packs=1, overlap=False):
    """Predicted time of one optimizer step (module docstring), per replica.

    per_replica_batch is the micro-batch: an optimizer step sees accumulation_steps x
    per_replica_batch examples per replica. Returns a dict of seconds:
      compute_s, grad_comm_s (all packs, whether hidden or not), bn_comm_s, step_s;
      examples (global, per optimizer step); step_s_per_example,
      grad_comm_s_per_example (= grad_comm_s / examples); efficiency = compute_s / step_s.
    """
    k = _positive("accumulation_steps", accumulation_steps)
    p = _positive("packs", packs)
    msgs = step_messages(costs, d_steps, accumulation_steps=k,
                         grad_bytes_per_param=grad_bytes_per_param)
    compute = grad_comm = step = 0.0
    for size, (total, backward) in zip(msgs["gradients"],
                                       update_flops_per_example(costs, d_steps)):
        c = k * per_replica_batch * total / flops_per_s
        window = per_replica_batch * backward / flops_per_s  # Last micro-batch's backward.
        last = ring_time_s([size / p], replicas, gbit_per_s, latency_s)
        comm = p * last
        step += (c - window + max(window, comm - last) + last) if overlap else (c + comm)
        compute += c
        grad_comm += comm
    bn = ring_time_s(msgs["batch_norm"], replicas, gbit_per_s, latency_s) if sync_bn else 0.0
    step += bn
    examples = replicas * k * per_replica_batch
    return {"compute_s": compute, "grad_comm_s": grad_comm, "bn_comm_s": bn,
            "step_s": step, "examples": examples, "step_s_per_example": step / examples,
            "grad_comm_s_per_example": grad_comm / examples, "efficiency": compute / step}


def efficiency(costs, *, replicas, per_replica_batch, gbit_per_s, latency_s, flops_per_s,
               d_steps=1, sync_bn=True, **levers):
    """Predicted scaling efficiency (compute / step time) at `replicas`; `levers`:
    accumulation_steps, grad_bytes_per_param, packs, overlap (see step_time)."""
    return step_time(costs, replicas=replicas, per_replica_batch=per_replica_batch,
                     gbit_per_s=gbit_per_s, latency_s=latency_s, flops_per_s=flops_per_s,
                     d_steps=d_steps, sync_bn=sync_bn, **levers)["efficiency"]
