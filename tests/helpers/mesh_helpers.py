"""One device vs a DTensor mesh: the same GAN, seed and global batches, max weight gap.

Run in-process (the suite's 2 logical CPUs) or as a script for other device counts:
    python tests/helpers/mesh_helpers.py DEVICES '[[MESH, ARCH, OPTIMIZER, STEPS, CONVS(, TRAIN)], ...]'
prints one JSON line per case, {"max_diff": ..., "d_loss": [ref, mesh], ...}: several
cases in one process (one TensorFlow start), and cases of the same GAN share one
one-device reference run (`reference`).
"""

import functools
import json
import os
import sys
import tempfile

GB = 8


def config(arch, optimizer, d_steps=1, ema=False, train=()):
    import ml_collections
    from tf_gan_scale import configs
    c = configs.base()
    if arch == "dcgan":  # Batch norm in G and D, dropout 0.3 in D: all on.
        c.data.source = "embedded:digits"
        c.model.latent_dim = 8
        c.model.g_channels, c.model.d_channels, c.model.d_norm = (16, 8, 4), (4, 8), "batch"
    elif arch == "resnet":  # SNGAN: residual blocks, average pooling, spectral norm in D.
        c.model = ml_collections.ConfigDict({
            "name": "resnet", "latent_dim": 8, "g_channels": (8, 8), "d_channels": (8, 8, 8),
            "d_downsample": 2, "sync_bn": True, "conditional": False})
    elif arch == "biggan":  # Conditional: shared embedding, hierarchical z, conditional
        # batch norm, self-attention at 8x8, spectral norm in G and D, projection D.
        c.model = ml_collections.ConfigDict({
            "name": "biggan", "latent_dim": 8, "conditional": True, "ch": 4,
            "g_channels": (2, 2), "d_channels": (1, 2), "attention": 8, "shared_dim": 4,
            "sync_bn": True})
    elif arch.startswith("stylegan2"):  # Mapping + synthesis (modulated convs, per-row noise,
        # FIR resampling, skip toRGBs), resnet D with minibatch std in chunks of 4
        # global rows; lazy phases, path length, style mixing, ADA, float16 all off.
        c.model = ml_collections.ConfigDict({
            "name": "stylegan2", "latent_dim": 8, "conditional": False, "w_dim": 8,
            "mapping_layers": 2, "fmaps": 1 / 256, "channel_max": 8, "mbstd_group": 2,
            "mbstd_chunk": 4, "num_fp16_res": 0, "conv_clamp": 0.0})
        # "stylegan2_cond": the class-conditional variant (label embedding into the
        # mapping, projection in D's epilogue), 4 classes.
        c.model.conditional = arch == "stylegan2_cond"
    elif arch.startswith("r3gan"):  # Normalization-free: learned 4x4 basis, 1-3-1 blocks
        # with a grouped 3x3 (2 groups), [1,3,3,1] resampling, depthwise basis conv in D;
        # "r3gan_cond": class-conditional (G's label embedding, D's projection), 4 classes.
        c.model = ml_collections.ConfigDict({
            "name": "r3gan", "latent_dim": 8, "conditional": arch == "r3gan_cond",
            "widths": (8, 8), "blocks": 1, "cardinality": 2, "expansion": 2,
            "bf16_stages": 0, "grouped_conv": "auto", "bottom_width": 4})
    else:
        c.data.source = "toy:ring8"
        c.model = ml_collections.ConfigDict({
            "name": "mlp", "latent_dim": 4, "hidden": (16, 16), "g_norm": "batch",
            "d_norm": "batch", "sync_bn": True, "conditional": False})
    if optimizer != "sgd" and arch == "dcgan":
        # D's second conv has a bias right before a batch norm: its gradient is zero in
        # exact arithmetic, rounding noise in float32, and Adam turns noise into steps of
        # +-lr (4e-4 apart after 10 steps, every other weight within 6e-8). Without D's
        # batch norm (the tutorial's D) every Adam-trained weight is comparable.
        c.model.d_norm = "none"
    c.train.global_batch_size = GB
    c.train.d_steps = d_steps
    if ema:  # A copy for 2 steps, then the decay ramping up over 3: the whole schedule.
        c.train.ema.decay, c.train.ema.start, c.train.ema.warmup = 0.8, 2, 3
    name, _, options = optimizer.partition(":")  # e.g. "sgd:momentum=0.9,nesterov=True"
    lr = {"dcgan": 0.1, "mlp": 0.1, "resnet": 0.05, "biggan": 0.01,
          "stylegan2": 0.01, "stylegan2_cond": 0.01, "r3gan": 0.01, "r3gan_cond": 0.01}[arch] if (
        name == "sgd") else 1e-3
    opt = {"name": name, "learning_rate": lr}
    for item in filter(None, options.split(",")):
        key, value = item.split("=")
        opt[key] = eval(value)  # Test-only: literals.
    c.train.d_optimizer = c.train.g_optimizer = opt
    for key, value in train:  # e.g. (("penalty", "wgan_gp"), ("penalty_weight", 1.0))
        section, _, name = key.rpartition(".")  # "model.<key>": config.model's.
        (c.model if section == "model" else c.train)[name] = value
    return c


def data_of(arch):
    """(shape, classes) of the data an arch trains on here (only the shape and classes
    are used: the batches are random)."""
    if arch == "biggan":
        return (16, 16, 1), 4
    if arch in ("stylegan2_cond", "r3gan_cond"):
        return (8, 8, 1), 4
    if arch == "mlp":
        from tf_gan_scale import data
        return data.load("toy:ring8").shape, 0
    return (8, 8, 1), 0


@functools.lru_cache(maxsize=None)
def reference(arch, optimizer, steps, d_steps=1, ema=False, train=(), shards=1):
    """The one-device run (GAN.train_step; with lazy phases the model's step loop, which
    runs them) of a config: (the trained GAN, the initial
    weights of [G, D(, EMA G)], the batches it saw: steps x d_steps arrays [GB, *shape],
    the last step's logs). Cached: mesh cases of the same GAN compare against one run,
    and none of them changes it (they copy its initial weights)."""
    import numpy as np
    import tensorflow as tf
    from tf_gan_scale import training
    c = config(arch, optimizer, d_steps, ema, train)
    shape, classes = data_of(arch)
    ref = training.build_gan(c, shape, classes)
    nets = [ref.generator, ref.discriminator] + ([ref.ema.model] if ema else [])
    if shards > 1:  # Group batch norm: `shards` replicas' groups as row groups.
        from tf_gan_scale.layers import normalization
        for net in nets:
            normalization.set_row_groups(net, shards)
    init = [net.get_weights() for net in nets]
    rng = np.random.default_rng(0)
    # (real, labels) batches per GAN step: one per D update, then with a paired loss
    # (RpGAN) G's own reals.
    batches = [[(np.tanh(rng.standard_normal((GB, *shape))).astype(np.float32),
                 rng.integers(0, max(classes, 1), GB).astype(np.int32))
                for _ in range(ref.step_config.batches_per_step)] for _ in range(steps)]
    if ref.step_config.lazy_phases:
        # StyleGAN2's lazy phases (and the EMA after them) live in the model's step loop
        # (step_function.make_train_function), not in GAN.train_step: run that loop,
        # one GAN step per call, its trackers reset so the logs are that step's losses.
        flat = [pair for xs in batches for pair in xs]
        iterator = iter(tf.data.Dataset.from_tensor_slices(
            {"x": np.stack([x for x, _ in flat]), "label": np.stack([y for _, y in flat])}))
        train_function = ref.make_train_function()
        for _ in batches:
            for m in ref.metrics:
                m.reset_state()
            out = train_function(iterator)
        out = {k: out[k] for k in ("d_loss", "g_loss")}
    else:
        ref_step = tf.function(ref.train_step)
        for xs in batches:
            feed = [{"x": tf.constant(x), "label": tf.constant(y)} for x, y in xs]
            out = ref_step(feed[0] if len(feed) == 1 else tuple(feed))
    return ref, init, batches, {k: float(v) for k, v in out.items()}


def equivalence(spec, arch="dcgan", optimizer="sgd", steps=10, d_steps=1, convs=False,
                ema=False, train=(), grouped_reference=True, control=2.0):
    """Trains one copy on one device (GAN.train_step) and one on the mesh `spec`
    (MeshTrainer) from the same weights and batches; returns the JSON dict above.
    control=2.0 then trains the mesh copy again, from the same start (a checkpoint of
    its `checkpoint_items` taken before the first step: the exact-resume state) with its
    learning rates doubled (what a gradient off by 2 does to SGD), through the same
    traced step (the rate is a variable: no retrace, ~free): its gaps are
    out["control"] = {"max_diff", "relative_diff", "ema_diff"}, each case its own control
    (control=1.0: the same run again, bit for bit; None: no control run);
    convs=True splits every convolution the model axis divides (the policy's size
    threshold at 0): "split_convs" counts them; ema=True trains an EMA generator too and
    compares its weights ("ema_diff"); train: ((config.train key, value), ...) for both
    runs (a penalty, LeCam, accumulation), or config.model's as "model.<key>". With
    "model.sync_bn_group_size" the reference is one device with the batch shards' row
    groups (grouped_reference=False: full batch statistics, the control)."""
    import tensorflow as tf
    from tf_gan_scale import training
    from tf_gan_scale.cluster import mesh_spec
    from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib
    train = tuple(map(tuple, train))
    dims = mesh_spec.parse(spec)
    grouped = dict(train).get("model.sync_bn_group_size") and grouped_reference
    ref, init, batches, ref_out = reference(arch, optimizer, steps, d_steps, ema, train,
                                        dims["batch"] if grouped else 1)
    c = config(arch, optimizer, d_steps, ema, train)
    mesh_gan = training.build_gan(c, *data_of(arch))
    pairs = [(ref.generator, mesh_gan.generator), (ref.discriminator, mesh_gan.discriminator)]
    if ema:
        pairs.append((ref.ema.model, mesh_gan.ema.model))
    for (_, b), weights in zip(pairs, init):  # The reference's weights before training.
        b.set_weights(weights)
    threshold = layouts.CONV_SPLIT_MIN_PARAMS
    try:
        layouts.CONV_SPLIT_MIN_PARAMS = 0 if convs else threshold
        plan = layouts.plan((mesh_gan.generator, mesh_gan.discriminator), dims)
    finally:
        layouts.CONV_SPLIT_MIN_PARAMS = threshold
    split_convs = sum(1 for p, s in plan.items() if "conv" in p and any(s))
    trainer = step_lib.MeshTrainer(mesh_gan, mesh_lib.make(dims, "CPU"), plan)

    def train():
        """The batches through the mesh step; the last step's (d_loss, g_loss)."""
        for xs in batches:
            losses = trainer.train_step([trainer.batch(x, y) for x, y in xs])
        return losses

    with tempfile.TemporaryDirectory(prefix="mesh-start-") as tmp:
        if control:  # The start, before the first step (see the docstring).
            start = tf.train.Checkpoint(**mesh_gan.checkpoint_items())
            start_path = start.write(os.path.join(tmp, "start"))
        d_loss, g_loss = train()
        out = {**measure(ref, mesh_gan, pairs, init), "step": trainer.step}
        if control:  # The same run, its learning rates scaled.
            start.read(start_path).assert_consumed()
            for opt in (mesh_gan.d_optimizer, mesh_gan.g_optimizer):
                rate = getattr(opt, "inner_optimizer", opt)._learning_rate
                rate.assign(rate * control)
            train()
            controlled = measure(ref, mesh_gan, pairs, init)
            out["control"] = {k: controlled[k]
                              for k in ("max_diff", "relative_diff", "ema_diff")}
    return {**out, "d_loss": [ref_out["d_loss"], d_loss],
            "g_loss": [ref_out["g_loss"], g_loss], "split_convs": split_convs,
            "split": sorted(p for p, s in plan.items() if any(s))}


def measure(ref, mesh_gan, pairs, init):
    """The mesh GAN's gaps to the one-device reference (equivalence's dict: max_diff,
    ema_diff, relative_diff, state). pairs: [(reference net, mesh net)] of G, D
    (and the EMA G); init: the nets' weights before training."""
    import numpy as np
    from tf_gan_scale.parallel import tensors

    def gap(a_net, b_net):
        return max(float(np.abs(a.numpy().astype(np.float64)
                                - tensors.gather(b).astype(np.float64)).max())
                   for a, b in zip(a_net.weights, b_net.weights))

    def relative(a_net, b_net, start):
        """|w_mesh - w_ref| / |w_ref - w_start| over the network's trainable weights:
        the gap as a fraction of how far training moved the weights."""
        trained = {id(w) for w in a_net.trainable_weights}
        gaps, moved = 0.0, 0.0
        for a, b, w0 in zip(a_net.weights, b_net.weights, start):
            if id(a) in trained:
                ref = a.numpy().astype(np.float64)
                gaps += float(np.sum((ref - tensors.gather(b).astype(np.float64)) ** 2))
                moved += float(np.sum((ref - w0) ** 2))
        return (gaps / moved) ** 0.5

    # The step's own state (ADA's p and statistic, LeCam's anchors, StyleGAN2's pl_mean):
    # [one device, mesh] values of those the GAN has.
    state = {name: [np.asarray(v.numpy()).tolist(),
                    np.asarray(tensors.gather(mesh_gan.step_state()[name])).tolist()]
             for name, v in ref.step_state().items()}
    diff = max(gap(a, b) for a, b in pairs[:2])
    ema_diff = gap(*pairs[2]) if len(pairs) > 2 else None
    return {"max_diff": diff, "ema_diff": ema_diff, "state": state,
            "relative_diff": max(relative(a, b, w0) for (a, b), w0 in zip(pairs[:2], init))}


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tf_gan_scale import distribute
    distribute.configure_cpu_devices(int(sys.argv[1]))
    from tf_gan_scale import parallel
    for spec, arch, optimizer, steps, convs, *train in json.loads(sys.argv[2]):
        out = equivalence(spec, arch, optimizer, steps, convs=convs,
                          train=train[0] if train else ())
        out["combine"] = os.environ[parallel.COMBINE_VAR] == "1"
        print(json.dumps(out), flush=True)
