"""The GAN step on a DTensor mesh: one function per GAN step (D updates, G update, EMA),
the GAN's own Keras optimizers, the same losses, latents and batch-norm statistics as one
device.

Why it looks like this (docs/notes/dtensor.md):
- A DTensor program is written for the GLOBAL batch: the step calls the one-device step
  `gan.GanStep.train` on all GB rows (one "replica": rows 0..GB-1), and
  DTensor runs it SPMD: examples split over the "batch" axis, split weights over "model".
  Losses are divided by GB once, latents are keyed by global row, and batch-norm
  moments over a batch-split tensor are global-batch moments: one device's numbers.
- A variable read after a write in the same function returns the new value only with
  DTensor's all-reduce combining pass OFF (`tf_gan_scale.parallel` switches it off for
  every process): with it on, G's update in the same function trained against the old
  D, and Keras' optimizers (which count `iterations` and read slots after writing them)
  were silently wrong. So the step is one function, and the optimizers are Keras' own,
  with every option the data-parallel path has (momentum, clipping, weight decay).
- The global batch is a Python int in the traced function (the batches' static shape,
  `gan.step.batch_rows`: DTensor cannot lay out a range over a dynamic size), and a lazy
  penalty's schedule is decided on the host (DTensor cannot run its cond).
"""

import keras
import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from tf_gan_scale import data, errors
from tf_gan_scale.architectures.calls import generate
from tf_gan_scale.gan import Topology
from tf_gan_scale.gan import step as gan_step
from tf_gan_scale.layers import normalization
from tf_gan_scale.layers import stylegan as stylegan_layers
from tf_gan_scale.parallel import conv, layouts, tensors


class MeshTopology(Topology):
    """The step on a DTensor mesh: [real; fake] is joined as a stack and a reshape
    (`tensors.join_examples`: DTensor cannot concatenate along the split batch axis);
    devices are the mesh's, so no network has a scope of its own. Embedding gradients
    are made dense: DTensor has no layout propagation for the scatter update a Keras
    optimizer makes of IndexedSlices (ResourceScatterSub), split embedding or not."""

    sparse_updates = False

    def join(self, parts):
        return tensors.join_examples(parts)


# Keras optimizer options the mesh refuses: Keras' own gradient accumulation branches on
# a counter (a cond around the update, which DTensor cannot expand with split weights);
# config.train.accumulation_steps is the framework's accumulation.
UNSUPPORTED_OPTIONS = ("gradient_accumulation_steps",)


def _unsupported_options(opt):
    """["d_optimizer gradient_accumulation_steps=2", ...] for a Keras optimizer."""
    inner = getattr(opt, "inner_optimizer", opt)
    return [f"{k}={getattr(inner, k)!r}" for k in UNSUPPORTED_OPTIONS
            if getattr(inner, k, None)]


def place_optimizer(optimizer, mesh):
    """Moves a built Keras optimizer's variables onto `mesh`, in place: each slot (a
    variable Keras made from a weight with `add_variable_from_reference`, so named after
    the weight's path) takes its weight's layout, so a device holds 1/M of a split
    weight's moments; the rest (iterations, the learning rate, a loss scale) is
    replicated (`tensors.place`, as the GAN's step state). They stay the optimizer's own
    Keras variables: its checkpoint is the same on a mesh and on one device, and a run
    moves between them with its moments.

    optimizer: a built Keras optimizer (or LossScaleOptimizer) whose weights are on
    `mesh` already (`layouts.shard`)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    # Keras finds a weight's slots by the id of its TensorFlow variable, which
    # `layouts.shard` replaced by a DVariable: index the weights again.
    inner._trainable_variables_indices = {
        inner._var_key(w): i for i, w in enumerate(inner._trainable_variables)}
    weights = {w.path.replace("/", "_") + "_": w for w in inner._trainable_variables}
    for v in optimizer.variables:
        owners = [w for prefix, w in weights.items()
                  if v.name.startswith(prefix) and tuple(v.shape) == tuple(w.shape)]
        spec = None  # Replicated: no weight made it.
        if owners:  # The longest matching path is the weight the slot was made from.
            owner = max(owners, key=lambda w: len(w.path))
            spec = tuple(None if a == dtensor.UNSHARDED else a
                         for a in dtensor.fetch_layout(owner._value).sharding_specs)
        tensors.place(v, mesh, spec)


def by_kind(items):
    """A GAN's checkpoint items ({key: item}, `GAN.checkpoint_items()`) -> (networks,
    optimizers, variables), each a list in the items' order: what MeshTrainer moves onto
    the mesh, read from the checkpoint's own list, so nothing a checkpoint holds (the
    EMA copy of G, LeCam's anchors, ADA's p and statistic, the path-length mean, or a
    later item) is left on the host, and nothing else is moved. An item of another kind
    is a TypeError naming it, before anything moves."""
    kinds = ((keras.layers.Layer, []), (keras.optimizers.Optimizer, []),
             (keras.Variable, []))
    for key, item in items.items():
        lists = [of_kind for kind, of_kind in kinds if isinstance(item, kind)]
        if not lists:
            raise TypeError(f"checkpoint item {key!r} is a {type(item).__name__}, which "
                            f"parallel.step cannot move onto a mesh; valid: a Keras "
                            f"layer or model, optimizer or variable")
        lists[0].append(item)
    return tuple(of_kind for _, of_kind in kinds)


def _unsupported_layers(models):
    """["AveragePooling2D with data_format='channels_first' in discriminator", ...] for
    the layers of `models` a mesh cannot run: a ConfigError before anything runs, not an
    error inside the first step. Average pooling runs by strided slices (conv.avg_pool;
    DTensor cannot expand AvgPool's own gradient), depthwise convolutions by taps
    (conv.depthwise_conv2d; nor its filter gradient), both written for channels last."""
    found = []
    for model in models:
        checks = ((keras.layers.AveragePooling2D, conv.pool_unsupported),
                  (keras.layers.DepthwiseConv2D, conv.depthwise_unsupported))
        whys = sorted({f"{type(layer).__name__} with {why(layer)}"
                       for layer in model._flatten_layers(include_self=False, recursive=True)
                       for kind, why in checks if isinstance(layer, kind) and why(layer)})
        found += [f"{why} in {model.name}" for why in whys]
    return found


def refuse(bad):
    """The one ConfigError for what a mesh cannot run yet (`bad`: settings, each with its
    reason), from the config check (before anything is built) and MeshTrainer (after)."""
    if bad:
        raise errors.ConfigError(
            f"not supported on a mesh yet: {', '.join(bad)}; valid: those settings off, "
            f"or train them with a tf.distribute strategy (no --mesh)")


class MeshTrainer:
    """Trains `gan` (a compiled `gan.GAN`) on `mesh` with the data-parallel step itself
    (`GanStep.train` on the global batch: penalties, lazy penalties, LeCam, accumulation,
    EMA). Tested with DCGAN, MLP, SNGAN, the conditional BigGAN (d_steps 1 and 2),
    StyleGAN2 with its lazy phases, path length, style mixing, ADA and float16 blocks,
    and the conditional R3GAN with its paired loss, R1 + R2 and pipe.

    What moves onto the mesh is the GAN's checkpoint items (`gan.checkpoint_items()`,
    `by_kind`): the networks' weights by `weight_plan` (layouts.plan), then the
    optimizers' variables (`place_optimizer`), then the step's own state, replicated.
    They stay the same objects, so a tf.train.Checkpoint of them saves and restores on
    the mesh exactly as on one device: restore before or after.
    One call of `train_step(batches)` is one GAN step, one tf.function: d_steps D
    updates, then one G update, then the EMA generator's; `gan.step` counts it as on one
    device. The updates go through `GanStep.apply` (`replica.apply_global_gradients`,
    with one "replica": the global batch), so clipping and gradient cleaning act as on
    one device.

    Args:
        gan: gan.GAN, compiled with Keras optimizers (their state, learning rates and
            schedules are used) and built.
        mesh: dtensor.Mesh with axes ("batch", "model").
        weight_plan: {weight path: spec} (layouts.plan).

    The EMA generator, if any, is split like G.

    Not yet on a mesh (a ConfigError, not a silently different run): the step knobs
    StepConfig marks (`unsupported("mesh")`), Keras' gradient_accumulation_steps, and
    channels-first average pooling. Mixed precision runs, mixed_float16 with its
    loss-scale optimizer. The GAN's Keras loss trackers are not updated (host
    variables): `train_step` returns the losses.
    """

    def __init__(self, gan, mesh, weight_plan):
        # The step's knobs the mesh cannot run (StepConfig's engine metadata), then what
        # the built GAN holds beyond them.
        bad = gan.step_config.unsupported("mesh")
        for name in ("d_optimizer", "g_optimizer"):
            bad += [f"{name} {o}" for o in _unsupported_options(getattr(gan, name))]
        bad += _unsupported_layers((gan.generator, gan.discriminator))
        refuse(bad)
        self.gan, self.mesh = gan, mesh
        self.step_math = gan.gan_step
        gan.topology = MeshTopology()  # [real; fake] joined without a concat.
        # The Keras trackers are host variables, not on the mesh: the mesh's losses
        # come back from the step (train_step) instead.
        self.step_math.trackers = {}
        networks, optimizers, state = by_kind(gan.checkpoint_items())
        # Group batch norm (config.model.sync_bn_group_size=G): the mesh's batch shards
        # stand for replicas; the global batch is one "replica" here, so each group of
        # G shards' rows is normalized apart (contiguous rows, as on one device with
        # virtual_groups). Before the step is traced.
        for net in networks:
            normalization.set_row_groups(net, mesh.dim_size("batch"))
        if gan.ema is not None:  # The EMA copy of G: each weight laid out as G's twin.
            ema = gan.ema.model
            weight_plan = {**weight_plan, **{
                layouts.weight_path(ema, e): weight_plan[layouts.weight_path(gan.generator, w)]
                for e, w in zip(ema.weights, gan.generator.weights)}}
        layouts.shard(networks, mesh, weight_plan)
        for opt in optimizers:  # After the weights: each slot takes its weight's layout.
            place_optimizer(opt, mesh)
        # The step's own state (LeCam's anchors, ADA's p and statistic, the path-length
        # mean): small, replicated, updated from global values.
        for v in state:
            tensors.place(v, mesh)
        # autograph=False: the step math is plain Python around ops
        # (gan.step_function.unconverted_if_own). One trace per d_steps and batch shape.
        self._step_fn = tf.function(self._step, autograph=False)
        self._sample_fn = None

    @property
    def step(self):
        """GAN steps taken (G's update count, read from the mesh: restores included)."""
        return int(tensors.gather(self.gan.g_optimizer.iterations))

    def _step(self, batches, penalty_due, phases_due=()):
        """One GAN step (traced by _step_fn): GanStep.train on the global batch, with
        batches a tuple of StepConfig.batches_per_step {"x": [GB, ...], "label": [GB]}
        DTensors (one per D update, then G's reals with a paired loss) and
        penalty_due None or a tuple of d_steps Python bools (a lazy penalty's schedule,
        decided on the host: DTensor cannot run its cond; one trace per pattern).
        phases_due: with lazy phases, a Python bool per phase of
        `GanStep.lazy_phases` (decided on the host the same way): after the main
        updates, the due phases, then `end_of_step`, in step_function's order and with
        its arguments (the step's first batch, the step count before it).
        Returns (last D loss, G loss, the nonfinite code: 0 or NONFINITE_D/_G)."""
        # StyleGAN2's FIR resampling by strided slices (DTensor cannot lay out the
        # depthwise convolution's input gradient); a no-op for the other families.
        with stylegan_layers.slice_resampling():
            before = tf.identity(self.gan.step)
            out = self.step_math.train(batches[0] if len(batches) == 1 else batches,
                                       penalty_due)
            code = out[gan_step.NONFINITE]
            phases = self.step_math.lazy_phases()
            for (phase, _), due in zip(phases, phases_due):
                if due:  # After the main updates (and any phase before it).
                    with tf.control_dependencies([code]):
                        phase_code = phase(batches[0], before)[gan_step.NONFINITE]
                    code = tf.where(code > 0, code, phase_code)
            if phases:  # The EMA, after every phase.
                with tf.control_dependencies([code]):
                    done = self.step_math.end_of_step(before)
                code = tf.where(code > 0, code, done)
        return out["d_loss"], out["g_loss"], code

    def split(self):
        """The rows of each global batch this client builds (data.pipeline.Split): one
        chunk of GB / dims["batch"] rows per distinct "batch" coordinate of its local
        devices (devices that differ only in "model" hold the same rows)."""
        chunks = tuple(sorted({loc["batch"] for loc in self.mesh.local_device_locations()}))
        return data.Split(self.mesh.dim_size("batch"), chunks,
                          num_parts=dtensor.num_clients(), part=dtensor.client_id())

    def batches(self, input_fn):
        """An endless iterator of (real, labels) DTensors split over "batch", assembled
        from per-device pieces (`dtensor.pack`): the client reads and decodes only its
        local devices' rows, never the whole global batch.

        input_fn: a data.input_fn; called with this client's `split`."""
        split = self.split()
        pieces = iter(input_fn(split=split))  # Now: bad input fails here, not at next().
        spot = {c: i for i, c in enumerate(split.chunks)}
        owners = [spot[loc["batch"]] for loc in self.mesh.local_device_locations()]

        def assembled():
            while True:
                got = [next(pieces) for _ in split.chunks]
                yield tuple(dtensor.pack(
                    [got[i][key] for i in owners],
                    tensors.layout(self.mesh,
                                   ("batch",) + (None,) * (got[0][key].shape.rank - 1)))
                    for key in ("x", "label"))
        return assembled()

    def batch(self, real, labels=None):
        """Host arrays [GB, ...] (and labels [GB]) -> DTensors split over "batch"."""
        def put(x, dtype):
            x = tf.convert_to_tensor(x, dtype)
            return tensors.to_mesh(x, self.mesh, ("batch",) + (None,) * (x.shape.rank - 1))

        if labels is None:
            labels = np.zeros([np.shape(real)[0]], np.int32)
        return put(real, tf.float32), put(labels, tf.int32)

    def train_step(self, batches):
        """One GAN step: `batches` is a list of (real, labels) pairs of mesh DTensors
        (`batch`): one per D update, then with a paired loss (RpGAN) G's own reals
        (StepConfig.batches_per_step). Returns (last D loss, G loss) as floats."""
        d_steps = self.gan.d_steps
        if len(batches) != self.gan.step_config.batches_per_step:
            raise ValueError(f"{len(batches)} batches for d_steps={d_steps}; valid: "
                             f"{self.gan.step_config.batches_per_step} (one per D "
                             f"update, then G's reals with a paired loss)")
        step = self.step
        due = None
        if self.gan.step_config.penalty_every > 1:
            due = tuple(self.step_math.penalty_due(step, k) for k in range(d_steps))
        # StyleGAN2's lazy phases after this step: the data-parallel loop's rule
        # (gan.step.phase_due) on the host, as for the lazy penalty.
        phases = tuple(gan_step.phase_due(step, every)
                       for _, every in self.step_math.lazy_phases())
        d_loss, g_loss, code = (tensors.gather(x) for x in self._step_fn(
            tuple({"x": x, "label": y} for x, y in batches), due, phases))
        losses = (float(d_loss), float(g_loss))
        if code or not np.all(np.isfinite(losses)):
            net = {gan_step.NONFINITE_G: "generator"}.get(int(code), "discriminator")
            raise errors.NonFiniteError(f"non-finite loss, gradients or weights of the "
                                        f"{net} at step {step + 1} on the mesh: "
                                        f"d_loss={losses[0]}, g_loss={losses[1]}")
        return losses


class _Rate:
    """An optimizer as `callbacks.Summaries` reads it: `learning_rate` of the next update
    (the schedule at the update count, or the constant), computed on the host."""

    def __init__(self, optimizer):
        self._optimizer = getattr(optimizer, "inner_optimizer", optimizer)

    @property
    def learning_rate(self):
        rate = self._optimizer._learning_rate
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            return float(np.asarray(rate(int(tensors.gather(self._optimizer.iterations)))))
        return float(tensors.gather(rate))


class HostView:
    """What the training callbacks and the scorer read of a GAN
    (`training.callbacks.TrainedModel`), for one trained on a mesh: `step`, `latent_dim`,
    `num_classes`, the optimizers' learning rates, `sampler` and `generate`.

    Samples and scores run on `host_generator`, a plain Keras copy of G, or of its EMA
    copy when there is one (same architecture, TensorFlow's default device) refreshed
    from the mesh when `sampler` is
    read at a new step, so sampling and evaluation code need no DTensor. It costs one
    gathered copy of G's weights in host memory.

    Args:
        trainer: the MeshTrainer.
        host_generator: a built generator like trainer.gan.generator, not on the mesh.
    """

    def __init__(self, trainer, host_generator):
        shapes = [tuple(w.shape) for w in trainer.gan.sampler.weights]
        if [tuple(w.shape) for w in host_generator.weights] != shapes:  # Names differ (dense_1).
            raise ValueError("host_generator's weights differ from the mesh generator's")
        self.trainer, self.host_generator = trainer, host_generator
        self.latent_dim = trainer.gan.latent_dim
        self.num_classes = trainer.gan.num_classes
        self.g_optimizer = _Rate(trainer.gan.g_optimizer)
        self.d_optimizer = _Rate(trainer.gan.d_optimizer)
        self.stop_training = False  # Set by callbacks.StopAtStep.
        self._synced = None

    @property
    def step(self):
        return tf.constant(self.trainer.step, tf.int64)

    @property
    def sampler(self):
        if self._synced != self.trainer.step:
            for h, w in zip(self.host_generator.weights, self.trainer.gan.sampler.weights):
                h.assign(tensors.gather(w))
            self._synced = self.trainer.step
        return self.host_generator

    def generate(self, z, batch_size=256, labels=None):
        """As gan.GAN.generate: [N, latent_dim] (labels [N]) -> [N, *data_shape]."""
        return generate(self.sampler, z, batch_size, labels)
