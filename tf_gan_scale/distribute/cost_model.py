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

The model axis (`mesh_*`): a DTensor mesh "batch:B,model:M" (parallel/, MeshTrainer), B x
M devices, b = global batch / B examples per device (the M devices of a model row hold the
same b examples). Per device and GAN step:
  * gradients: one all-reduce over the B devices of the batch axis per update (as if
    fused; DTensor combines independent all-reduces itself), of 4 bytes x (replicated
    parameters + split parameters / M). Replicated weights' gradients are computed
    redundantly by the M devices of a row and never reduced over "model".
  * batch norm: as step_messages (same passes and float64 sizes), over B devices; a BN
    layer right after a column-parallel Dense normalizes C / M channels per device.
  * activations (the model axis): per split layer and pass, an all-gather over the M
    devices of the whole b x width float32 tensor (column-parallel outputs, split
    embeddings) or an all-reduce of it (row-parallel outputs; column-parallel input
    gradients) -- see MESH_KINDS. Ring all-gather of S bytes in all: (M-1) steps of S/M.
  * compute: a split Dense's FLOPs / M; every replicated layer's whole, for b examples.
Not modelled: where DTensor's layout propagation puts a relayout (the model gathers at
each split layer; a column -> row pair might skip it), DTensor's split of one BN into
several smaller all-reduces (3 of C / M values forward on a 2x2 CPU mesh; the model counts
one of 2C+1 per pass, as for data parallelism) and link sharing: each device is assumed
to have its own link of the given bandwidth on each axis.
"""

import keras
import tensorflow as tf

from tf_gan_scale.parallel import conv, layouts

BYTES_PER_FLOAT = 4
BN_BYTES_PER_VALUE = 8


def forward_flops(model, input_shape):
    """FLOPs of model(x) for ONE example of shape `input_shape` (TensorFlow's profiler).
    A conditional network (inputs [x, labels]) gets one int32 label per example."""
    specs = [tf.TensorSpec([1, *input_shape])]
    if len(getattr(model, "inputs", None) or ()) == 2:
        specs.append(tf.TensorSpec([1], tf.int32))
    fn = tf.function(lambda *x: model(list(x) if len(x) > 1 else x[0], training=False),
                     autograph=False)
    graph = fn.get_concrete_function(*specs).graph
    opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    opts["output"] = "none"
    return int(tf.compat.v1.profiler.profile(graph=graph, options=opts).total_float_ops)


def _bn_layers(model):
    """Cross-replica BN layers of `model` (local BN communicates nothing), in layer order,
    also inside composite layers (BigGAN's conditional BN holds its SyncBatchNormalization
    as a sub-layer; the composite itself has no moving statistics)."""
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if getattr(layer, "synchronized", False) and hasattr(layer, "moving_mean")]


def _bn_channels(model):
    """Channels of each cross-replica BN layer."""
    return [int(layer.moving_mean.shape[0]) for layer in _bn_layers(model)]


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


def _ring_s(sizes, n, gbit_per_s, latency_s, rounds):
    """Seconds for ring collectives of `sizes` bytes (one after another) over n devices:
    rounds x (n - 1) steps, each moving size / n bytes (all-reduce: 2 rounds, a
    reduce-scatter then an all-gather; all-gather: 1)."""
    if n < 2:
        return 0.0
    beta = gbit_per_s * 1e9 / 8
    return sum(rounds * (n - 1) * (latency_s + s / n / beta) for s in sizes)


def ring_time_s(sizes, replicas, gbit_per_s, latency_s):
    """Seconds for ring all-reduces of `sizes` bytes (one after another) over `replicas`."""
    return _ring_s(sizes, replicas, gbit_per_s, latency_s, rounds=2)


def ring_gather_time_s(sizes, devices, gbit_per_s, latency_s):
    """Seconds for ring all-gathers over `devices`, each of a tensor of `sizes` bytes IN
    ALL (each device contributes size / devices): (N-1) alpha + (N-1)/N S / beta."""
    return _ring_s(sizes, devices, gbit_per_s, latency_s, rounds=1)


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


# ---- The model axis: a DTensor mesh "batch:B,model:M" (tf_gan_scale/parallel/) ----------
#
# Kinds of split layer (layouts.plan), and the collectives over the M devices of a model
# row that each one adds per pass, for b examples per device (4 bytes per value: float32
# activations):
#   column  Dense kernel [in, out] split on out: forward, the [b, out] output is split on
#           features and whatever consumes it needs it whole: an all-gather of b x out;
#           backward, the gradient w.r.t. the [b, in] input is a partial sum over the M
#           shards of out: an all-reduce of b x in (only when that input needs a gradient).
#   row     Dense kernel split on in (or an Embedding split on its rows): forward, the
#           output is a partial sum: an all-reduce of b x out; backward, the gradient
#           w.r.t. the input is split like the input: no collective.
#   gather  Embedding [V, D] split on D: forward an all-gather of b x D; no input gradient.
# A Conv2D / Conv2DTranspose split on its output channels (parallel/conv.py) is a column:
# its [b, H', W', out] output is gathered, the gradient w.r.t. its [b, H, W, in] input
# all-reduced.
MESH_KINDS = ("column", "row", "gather")


def _leaf_split(layer, weight_plan, model):
    """(kind, kernel path, in, out) of a Dense / Embedding / Conv2D / Conv2DTranspose leaf
    whose kernel is split over "model" (in, out: its input and output features or
    channels), else None. ValueError for a split over "batch" (not modelled)."""
    if isinstance(layer, keras.layers.Dense):
        kernel = layer.kernel
    elif isinstance(layer, keras.layers.Embedding):
        kernel = layer.embeddings
    elif conv.out_axis(layer) is not None:
        kernel = layer.kernel
    else:
        return None
    path = layouts.weight_path(model, kernel)
    spec = weight_plan[path]
    if any(axis not in (None, "model") for axis in spec):
        raise ValueError(f"the cost model covers weights split over 'model' only; "
                         f"Received: {layouts.format_spec(spec)} for {path}")
    if not any(spec):
        return None
    if conv.out_axis(layer) is not None:  # Split on output channels only (layouts).
        out_axis = conv.out_axis(layer)
        return "column", path, int(kernel.shape[5 - out_axis]), int(kernel.shape[out_axis])
    n_in, n_out = (int(v) for v in kernel.shape)
    if isinstance(layer, keras.layers.Embedding):
        return ("gather" if spec[1] else "row"), path, n_in, n_out
    return ("column" if spec[1] else "row"), path, n_in, n_out


def _per_example(shape):
    n = 1
    for v in shape[1:]:
        n *= int(v)
    return n


def _positions(tensor, embedding):
    """Rows a Dense / Embedding computes per example: the product of the input's
    dimensions between batch and features (Dense; 1 for feature vectors), or of all its
    non-batch index dimensions (Embedding; 1 for one label per example)."""
    n = 1
    for v in tensor.shape[1:] if embedding else tensor.shape[1:-1]:
        n *= int(v)
    return n


def _split_passes_through(layer):
    """Layers that keep a feature-split activation split (elementwise in the features:
    DTensor propagates the split through them; seen for BN and LeakyReLU)."""
    return isinstance(layer, (keras.layers.BatchNormalization, keras.layers.ReLU,
                              keras.layers.LeakyReLU, keras.layers.Activation,
                              keras.layers.Dropout))


def mesh_layers(model, weight_plan, input_grads):
    """The split Dense / Embedding layers of `model` under `weight_plan`, and which of its
    synchronized BN layers normalize a feature-split activation.

    Walks the model's layer graph (Keras functional; a Sequential's inner functional),
    tagging each tensor by what it depends on: "weights" (a trainable weight upstream: its
    gradient is needed in every backward pass through it), "input" (only the model's
    first input, D's images: needed only when back-propagating to the input, as through D
    to G in the G update) or "never" (latents, labels, functions of them).

    Args:
        model: a built Keras model.
        weight_plan: {weight path: spec} (layouts.plan).
        input_grads: whether the model's first input can need a gradient (D: True, its
            images are G's output in the G update; G: False, nothing differentiates z).

    Returns:
        (layers, bn_split). layers: a list of {"path" (of the kernel), "kind"
        (MESH_KINDS), "in", "out" (features or channels), "params" (of the kernel),
        "in_values" / "out_values" (values of its input / output per example: what a
        backward all-reduce / forward collective moves), "positions" (rows per example),
        "flops" (forward FLOPs per example of the whole layer: 2 x in x out x positions
        for a Dense, 2 x kernel x output positions for a convolution (input positions
        for a transposed one), 0 for an Embedding), "input_grad" ("never" | "input" |
        "weights")}, in graph order. bn_split: one bool per `_bn_layers(model)`, True when a top-level BN
        layer's input is the feature-split output of a column-parallel Dense or split
        Embedding (through elementwise layers): each device then normalizes C / M
        channels and all-reduces their moments only (DTensor's SPMD expansion of
        Dense -> SyncBatchNormalization -> LeakyReLU -> Reshape on a 2x2 mesh: the
        moments' all-reduces over "batch" are C / M long, the all-gather over "model"
        comes at the Reshape).

    A leaf Dense inside a composite layer is taken to read the composite's LAST input
    (a spectral-norm wrapper has one; BigGAN's conditional BN reads c, its second).
    """
    graph = getattr(model, "_functional", None) or model
    tags = {id(t): "input" if (i == 0 and input_grads) else "never"
            for i, t in enumerate(graph.inputs)}
    split = set()  # ids of feature-split tensors.
    layers, split_bn = [], set()
    for op in graph._operations:
        for node in op._inbound_nodes:
            ins = list(node.input_tensors)
            if not ins or any(id(t) not in tags for t in ins):
                continue  # An InputLayer, or a call of this layer in another graph.
            deps = {tags[id(t)] for t in ins}
            dep = ("weights" if (op.trainable_weights or "weights" in deps)
                   else "input" if "input" in deps else "never")
            sub = op._flatten_layers(include_self=False, recursive=True)
            inner = op.layer if isinstance(op, keras.layers.Wrapper) else op
            out_split = False
            for leaf in sub or [op]:
                found = _leaf_split(leaf, weight_plan, model)
                if not found:
                    continue
                kind, path, n_in, n_out = found
                embedding = isinstance(leaf, keras.layers.Embedding)
                feed = ins[-1]
                rows = _positions(feed, embedding)
                rec = {"path": path, "kind": kind, "in": n_in, "out": n_out,
                       "params": n_in * n_out, "in_values": rows * n_in,
                       "out_values": rows * n_out, "positions": rows,
                       "flops": 0 if embedding else 2 * n_in * n_out * rows,
                       "input_grad": "never" if embedding else tags[id(feed)]}
                if isinstance(leaf, (keras.layers.Conv2D, keras.layers.Conv2DTranspose)):
                    kernel = int(leaf.kernel.shape[0]) * int(leaf.kernel.shape[1])
                    out_shape = leaf.compute_output_shape(feed.shape)
                    # Tap products: per output position (conv), per input one (transposed).
                    where = feed.shape if isinstance(leaf, keras.layers.Conv2DTranspose) \
                        else out_shape
                    rec.update(params=kernel * n_in * n_out,
                               in_values=_per_example(feed.shape),
                               out_values=_per_example(out_shape),
                               positions=int(where[1]) * int(where[2]),
                               flops=2 * kernel * n_in * n_out * int(where[1]) * int(where[2]))
                layers.append(rec)
                out_split |= leaf is inner and kind in ("column", "gather")
            if _split_passes_through(op) and any(id(t) in split for t in ins):
                out_split = True
                if isinstance(op, keras.layers.BatchNormalization):
                    split_bn.add(id(op))
            for t in node.output_tensors:
                tags[id(t)] = dep
                if out_split:
                    split.add(id(t))
    return layers, [id(layer) in split_bn for layer in _bn_layers(model)]


def mesh_network_costs(generator, discriminator, data_shape, latent_dim, dims, overrides=(),
                       costs=None):
    """`network_costs` plus what the "model" axis of `dims` splits.

    Args:
        generator, discriminator: built Keras models (not yet on a mesh).
        data_shape, latent_dim: as for network_costs.
        dims: {"batch": B, "model": M} (parallel.mesh.parse); only M matters here.
        overrides: ((regex, spec text), ...): config.parallel.layouts (layouts.plan).
        costs: network_costs of the same pair if already computed (profiling FLOPs is
            the slow part), so one profile serves several meshes.

    Returns:
        network_costs' dict (whole networks) plus "model_size": M, "g_layers" /
        "d_layers" and "g_bn_split" / "d_bn_split" (mesh_layers).
    """
    costs = dict(costs or network_costs(generator, discriminator, data_shape, latent_dim))
    plan = layouts.plan((generator, discriminator), dims, overrides)
    costs["model_size"] = int(dims["model"])
    for net, model, grads in (("g", generator, False), ("d", discriminator, True)):
        layers, bn_split = mesh_layers(model, plan, input_grads=grads)
        costs[f"{net}_layers"], costs[f"{net}_bn_split"] = layers, bn_split
    return costs


def mesh_device_costs(costs):
    """What ONE device of a "batch:B,model:M" mesh holds and computes, in network_costs'
    keys, so that step_messages / step_time price its batch-axis collectives:
      *_params: trainable parameters held (and gradients all-reduced over "batch"):
          replicated ones whole, split kernels / M;
      *_bn_channels: C / M for BN layers on a feature-split activation, else C;
      *_flops: forward FLOPs per example: the split layers' / M, everything else whole
          (replicated layers are computed redundantly by the M devices of a model row).
    """
    m = costs["model_size"]
    out = dict(costs)
    for net in ("g", "d"):
        layers = costs[f"{net}_layers"]
        params = sum(rec["params"] for rec in layers)
        flops = sum(rec["flops"] for rec in layers)
        out[f"{net}_params"] = costs[f"{net}_params"] - params + params // m
        out[f"{net}_flops"] = costs[f"{net}_flops"] - flops + flops // m
        out[f"{net}_bn_channels"] = [c // m if split else c for c, split in
                                     zip(costs[f"{net}_bn_channels"],
                                         costs[f"{net}_bn_split"])]
    return out


def _check_mesh(costs, dims):
    b, m = (_positive(f"dims[{axis!r}]", dims[axis]) for axis in ("batch", "model"))
    if m != costs["model_size"]:
        raise ValueError(f"costs were planned for model={costs['model_size']} "
                         f"(mesh_network_costs); Received: dims={dims}")
    return b, m


def _model_collectives(layers, examples, forward, needs=()):
    """(all-gather sizes, all-reduce sizes) in bytes over "model" of one pass of a network
    over `examples` examples per device: forward, or backward where a column-parallel
    layer's input gradient is needed when its input_grad is in `needs`."""
    gathers, reduces = [], []
    for rec in layers:
        if forward:
            (gathers if rec["kind"] in ("column", "gather") else reduces).append(
                BYTES_PER_FLOAT * examples * rec["out_values"])
        elif rec["kind"] == "column" and rec["input_grad"] in needs:
            reduces.append(BYTES_PER_FLOAT * examples * rec["in_values"])
    return gathers, reduces


def mesh_step_messages(costs, dims, per_device_batch, d_steps=1, *,
                       grad_bytes_per_param=BYTES_PER_FLOAT):
    """Sizes in bytes of every collective of one GAN step on a "batch:B,model:M" mesh,
    per device (MeshTrainer: d_steps D updates, then one G update, each its own function).

    Args:
        costs: mesh_network_costs (or a dict of its keys).
        dims: {"batch": B, "model": M}, M as planned in costs.
        per_device_batch: b = global batch / B examples per device (every device of a
            model row holds the same b examples).

    Returns:
        {"gradients": [one all-reduce over "batch" per update: D's d_steps times, then
            G's; grad_bytes_per_param x (replicated parameters + split ones / M)],
         "batch_norm": [over "batch", per BN layer and pass as step_messages; C / M
            channels for feature-split BN],
         "model_gather": [all-gathers over "model", each the size of the WHOLE gathered
            tensor b x features x 4 bytes],
         "model_all_reduce": [all-reduces over "model"]}.
    Passes (as step_messages / update_flops_per_example): each D update runs G forward
    on b latents and D forward + backward on b real + b fake examples (2b; backward to
    D's weights only); the G update runs G forward, D forward, D backward to its input
    (every column-parallel layer of D whose input depends on weights or images) and G
    backward, on b examples.
    """
    _check_mesh(costs, dims)
    msgs = step_messages(mesh_device_costs(costs), d_steps,
                         grad_bytes_per_param=grad_bytes_per_param)
    b, g, d = per_device_batch, costs["g_layers"], costs["d_layers"]
    passes = ([(g, b, True, ()), (d, 2 * b, True, ()), (d, 2 * b, False, ("weights",))]
              * d_steps
              + [(g, b, True, ()), (d, b, True, ()), (d, b, False, ("weights", "input")),
                 (g, b, False, ("weights",))])
    msgs["model_gather"], msgs["model_all_reduce"] = [], []
    for layers, examples, forward, needs in passes:
        gathers, reduces = _model_collectives(layers, examples, forward, needs)
        msgs["model_gather"] += gathers
        msgs["model_all_reduce"] += reduces
    return msgs


def mesh_step_bytes(costs, dims, per_device_batch, d_steps=1, *,
                    grad_bytes_per_param=BYTES_PER_FLOAT):
    """Totals of mesh_step_messages per category, per device and GAN step:
    {"messages": {category: bytes of its tensors}, "sent": {category: bytes one device
    sends in ring collectives: 2 (N-1)/N S per all-reduce, (N-1)/N S per all-gather, N
    the devices of the axis (B for "gradients" and "batch_norm", M for "model_*")}}."""
    b, m = _check_mesh(costs, dims)
    msgs = mesh_step_messages(costs, dims, per_device_batch, d_steps,
                              grad_bytes_per_param=grad_bytes_per_param)
    share = {"gradients": 2 * (b - 1) / b, "batch_norm": 2 * (b - 1) / b,
             "model_gather": (m - 1) / m, "model_all_reduce": 2 * (m - 1) / m}
    total = {k: sum(v) for k, v in msgs.items()}
    return {"messages": total, "sent": {k: share[k] * total[k] for k in total}}


def mesh_step_time(costs, *, dims, per_device_batch, gbit_per_s, latency_s, flops_per_s,
                   d_steps=1, sync_bn=True, grad_bytes_per_param=BYTES_PER_FLOAT,
                   model_gbit_per_s=None, model_latency_s=None):
    """Predicted time of one GAN step on a "batch:B,model:M" mesh, per device.

    The batch axis is step_time of one device's share (mesh_device_costs) over B
    replicas; the model axis adds its all-gathers and all-reduces over M, on links of
    model_gbit_per_s / model_latency_s (default: the same link). Nothing overlaps:
    activation collectives sit between layers, on the critical path by construction.

    Returns:
        step_time's keys (compute_s: per device, including the redundant compute of
        replicated layers; grad_comm_s, bn_comm_s over "batch"), plus model_comm_s;
        step_s (all of them); examples (global batch B x b); params_per_device
        (trainable G + D parameters one device holds); efficiency: the one-device
        compute of the global batch spread evenly over B x M devices, / step_s -- at
        M = 1, step_time's efficiency.
    """
    b, m = _check_mesh(costs, dims)
    local = mesh_device_costs(costs)
    t = step_time(local, replicas=b, per_replica_batch=per_device_batch,
                  gbit_per_s=gbit_per_s, latency_s=latency_s, flops_per_s=flops_per_s,
                  d_steps=d_steps, sync_bn=sync_bn,
                  grad_bytes_per_param=grad_bytes_per_param)
    msgs = mesh_step_messages(costs, dims, per_device_batch, d_steps,
                              grad_bytes_per_param=grad_bytes_per_param)
    bw = gbit_per_s if model_gbit_per_s is None else model_gbit_per_s
    lat = latency_s if model_latency_s is None else model_latency_s
    model = (ring_gather_time_s(msgs["model_gather"], m, bw, lat)
             + ring_time_s(msgs["model_all_reduce"], m, bw, lat))
    step = t["step_s"] + model
    ideal = t["examples"] * step_flops_per_example(costs, d_steps) / flops_per_s / (b * m)
    return {**t, "model_comm_s": model, "step_s": step,
            "step_s_per_example": step / t["examples"],
            "params_per_device": local["g_params"] + local["d_params"],
            "efficiency": ideal / step}
