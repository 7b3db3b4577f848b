"""The GAN step on a DTensor mesh: D and G updates as SEPARATE functions, a read-once
optimizer, the same losses, latents and batch-norm statistics as one device.

Why it looks like this (docs/notes/dtensor.md):
- A DTensor program is written for the GLOBAL batch: the step calls the one-device code
  of `gan.GanStep` (`d_grads`, `g_grads`) on all GB rows, with rows 0..GB-1, and DTensor
  runs it SPMD: examples split over the "batch" axis, split weights over "model".
  Losses are divided by GB once, latents are keyed by global row, and batch-norm
  moments over a batch-split tensor are global-batch moments: one device's numbers.
- Inside one function a DVariable read after a write can return the OLD value. So D's
  update and G's update run in separate functions (a fused step would train G against
  the stale D), and the optimizer reads each variable once and writes it last (Keras'
  optimizers count `iterations` and read slots after writing them: silently wrong).
  The step number is passed in from the host, not read from a counter the same
  function increments.
"""

import keras
import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from tf_gan_scale import data, errors
from tf_gan_scale.architectures.calls import generate
from tf_gan_scale.gan import Topology
from tf_gan_scale.parallel import layouts, tensors


class MeshTopology(Topology):
    """The step on a DTensor mesh: [real; fake] is joined as a stack and a reshape
    (`tensors.join_examples`: DTensor cannot concatenate along the split batch axis);
    devices are the mesh's, so no network has a scope of its own."""

    def join(self, parts):
        return tensors.join_examples(parts)


def _optimizer_name(opt):
    """"sgd" / "adam" for the Keras optimizers the mesh can run, else a ConfigError naming
    the setting and what is valid."""
    names = {keras.optimizers.SGD: "sgd", keras.optimizers.Adam: "adam"}
    name = names.get(type(opt))  # Exactly: AdamW is an Adam with weight decay.
    bad = [] if name else [f"optimizer {type(opt).__name__}"]
    bad += [f"{k}={getattr(opt, k)!r}" for k in
            ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm",
             "gradient_accumulation_steps") if getattr(opt, k, None)]
    bad += [f"{k}=True" for k in ("use_ema", "amsgrad", "nesterov") if getattr(opt, k, False)]
    if name == "sgd" and opt.momentum:
        bad.append(f"momentum={opt.momentum}")
    if bad:
        raise errors.ConfigError(f"not supported on a mesh: {', '.join(bad)}; valid: sgd "
                                 f"(momentum 0) or adam, without decay, clipping or EMA")
    return name


# Layers whose ops DTensor cannot expand on a mesh (a ConfigError before anything runs,
# not an error inside the first step): AveragePooling2D's gradient, AvgPoolGrad, has no
# layout propagation (SNGAN's and BigGAN's residual D blocks).
UNSUPPORTED_LAYERS = ("AveragePooling2D",)


def _unsupported_layers(models):
    """["AveragePooling2D in discriminator", ...] for the layers of `models` a mesh cannot
    run."""
    found = []
    for model in models:
        kinds = sorted({type(layer).__name__ for layer in
                        model._flatten_layers(include_self=False, recursive=True)
                        if type(layer).__name__ in UNSUPPORTED_LAYERS})
        found += [f"{kind} in {model.name}" for kind in kinds]
    return found


class ReadOnceOptimizer:
    """Runs a built Keras SGD or Adam over (possibly sharded) DVariables, reading each
    variable and slot once and writing it once per update (Keras' own update reads
    `iterations` and slots after writing them: silently wrong on a mesh).

    It keeps the Keras optimizer's own variables (moved onto the mesh: each slot with its
    weight's layout, the counters replicated), so a checkpoint of the optimizer is the
    same on a mesh and on one device, and a run moves between them with its moments.
    The update count and learning rate come from the host (`lr(n)`, `apply(..., t, lr)`)
    and `iterations` is written from the host between steps (`count`).

    Args:
        optimizer: a built keras.optimizers.SGD (momentum 0) or Adam; its variables'
            weights must be on `mesh` already (`layouts.shard`).
        mesh: the dtensor.Mesh.
    """

    def __init__(self, optimizer, mesh):
        self.name, self.keras, self.mesh = _optimizer_name(optimizer), optimizer, mesh
        self.variables = list(optimizer._trainable_variables)
        slots = ((optimizer._momentums, optimizer._velocities) if self.name == "adam"
                 else ())
        spec_of = {}  # A slot's layout is its weight's.
        for kind in slots:
            for w, slot in zip(self.variables, kind):
                spec_of[id(slot)] = tuple(
                    None if a == dtensor.UNSHARDED else a
                    for a in dtensor.fetch_layout(w._value).sharding_specs)
        for v in optimizer.variables:  # iterations, learning_rate, slots.
            spec = spec_of.get(id(v), (None,) * len(v.shape))
            value = tensors.to_mesh(v._value.read_value(), mesh, spec)
            v._value = dtensor.DVariable(value, trainable=False, name=v.name)
        self.slots = list(zip(*slots)) if slots else []
        self.updates = int(tensors.gather(optimizer.iterations))

    def lr(self, n=None):
        """The learning rate of update number n (0-based; default: the next), as Keras
        computes it: the schedule at n, or the constant."""
        rate = self.keras._learning_rate
        n = self.updates if n is None else n
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            return float(np.asarray(rate(n)))
        return float(tensors.gather(rate))

    def count(self, n):
        """Sets `iterations` to n updates (on the host, between steps)."""
        self.updates = int(n)
        self.keras.iterations._value.assign(tensors.to_mesh(
            tf.constant(self.updates, self.keras.iterations.dtype), self.mesh, ()))

    def apply(self, grads, t, lr):
        """Updates with `grads` (global gradients, the variables' layouts); t: float32
        scalar, the 1-based update number (Adam's bias correction); lr: float32 scalar."""
        for i, (v, g) in enumerate(zip(self.variables, grads)):
            if g is None:
                continue
            w = v._value.read_value()
            if self.name == "sgd":
                v._value.assign(w - lr * g)
                continue
            k = self.keras
            m_var, v_var = (slot._value for slot in self.slots[i])
            # Keras' Adam, term for term (its rounding): m += (g - m)(1 - b1), likewise
            # s with g^2, w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(s) + eps).
            m = m_var.read_value()
            m = m + (g - m) * (1 - k.beta_1)
            s = v_var.read_value()
            s = s + (tf.square(g) - s) * (1 - k.beta_2)
            rate = lr * tf.sqrt(1 - tf.pow(k.beta_2, t)) / (1 - tf.pow(k.beta_1, t))
            v._value.assign(w - m * rate / (tf.sqrt(s) + k.epsilon))
            m_var.assign(m)
            v_var.assign(s)


class MeshTrainer:
    """Trains `gan` (a compiled `gan.GAN`) on `mesh`. Tested unconditional, with d_steps
    1 and 2, batch norm and dropout; conditional models run the same code, untested here.

    The networks' weights are moved onto the mesh by `weight_plan` (layouts.plan), then
    the optimizers' variables (ReadOnceOptimizer). The GAN's checkpoint items
    (`gan.checkpoint_items()`) stay the same objects, so a tf.train.Checkpoint of them
    saves and restores on the mesh exactly as on one device: restore before or after.
    One call of `train_step(batches)` is one GAN step: d_steps D updates, then one G
    update, each in its own tf.function; `gan.step` counts it as on one device.

    Args:
        gan: gan.GAN, compiled with Keras SGD (momentum 0) or Adam optimizers (their
            state, learning rates and schedules are used) and built.
        mesh: dtensor.Mesh with axes ("batch", "model").
        weight_plan: {weight path: spec} (layouts.plan).

    The EMA generator, if any, is split like G and updated in a function of its own,
    after G's (it reads G's new weights).

    Not yet on a mesh (a ConfigError, not a silently different run): gradient
    accumulation, mixed_float16 loss scaling, gradient penalties (D called twice in one
    function: its stateful layers would hit the read-after-write trap), LeCam, and the
    layers of UNSUPPORTED_LAYERS.
    """

    def __init__(self, gan, mesh, weight_plan):
        # The step's knobs the mesh cannot run (StepConfig's engine metadata), then what
        # the built GAN holds beyond them.
        bad = gan.step_config.unsupported("mesh")
        if isinstance(gan.g_optimizer, keras.optimizers.LossScaleOptimizer):
            bad.append("precision=mixed_float16 (loss scaling)")
        bad += _unsupported_layers((gan.generator, gan.discriminator))
        if bad:
            raise errors.ConfigError(f"not supported on a mesh yet: {', '.join(bad)}; "
                                     f"valid: run them with a tf.distribute strategy")
        for opt in (gan.d_optimizer, gan.g_optimizer):
            _optimizer_name(opt)  # Before anything moves.
        self.gan, self.mesh = gan, mesh
        self.step_math = gan.gan_step
        gan.topology = MeshTopology()  # [real; fake] joined without a concat.
        layouts.shard((gan.generator, gan.discriminator), mesh, weight_plan)
        if gan.ema is not None:  # The EMA copy of G: each weight laid out as G's twin.
            ema = gan.ema.model
            layouts.shard((ema,), mesh, {
                layouts.weight_path(ema, e): weight_plan[layouts.weight_path(gan.generator, w)]
                for e, w in zip(ema.weights, gan.generator.weights)})
        self.d_opt = ReadOnceOptimizer(gan.d_optimizer, mesh)
        self.g_opt = ReadOnceOptimizer(gan.g_optimizer, mesh)
        # autograph=False: the step math is plain Python around ops
        # (gan.step_function.unconverted_if_own).
        self._d_fn = tf.function(self.d_update, autograph=False)
        self._g_fn = tf.function(self.g_update, autograph=False)
        # Its own function: it reads G's weights, which the G function writes.
        self._ema_fn = tf.function(self._ema_update, autograph=False)
        self._sample_fn = None

    @property
    def step(self):
        """GAN steps taken (the G optimizer's update count, kept on the host)."""
        return self.g_opt.updates

    def _rows(self, gb):
        return tf.range(gb)

    def d_update(self, real, labels, step, k, t, lr):
        """D update k of a step on the global batch real [GB, ...] (traced by _d_fn)."""
        gb = tf.shape(real)[0]
        grads, share, _ = self.step_math.d_grads(real, labels, self._rows(gb), gb, step, k)
        self.d_opt.apply(grads, t, lr)
        return share

    def g_update(self, gb, step, t, lr):
        """The G update of a step on a global batch of gb (traced by _g_fn)."""
        grads, share, _ = self.step_math.g_grads(self._rows(gb), gb, step)
        self.g_opt.apply(grads, t, lr)
        return share

    def _ema_update(self, step):
        self.gan.ema.update(self.gan.generator, step)

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
        """One GAN step: `batches` is a list of d_steps (real, labels) pairs of mesh
        DTensors (`batch`). Returns (last D loss, G loss) as floats."""
        d_steps = self.gan.d_steps
        if len(batches) != d_steps:
            raise ValueError(f"{len(batches)} batches for d_steps={d_steps}")
        step = self.step
        step_t = tf.constant(step, tf.int64)
        for k, (real, labels) in enumerate(batches):
            n = self.d_opt.updates
            d_loss = self._d_fn(real, labels, step_t, k, tf.constant(n + 1, tf.float32),
                                tf.constant(self.d_opt.lr(n), tf.float32))
            self.d_opt.count(n + 1)  # Between functions: no read after write.
        gb = int(batches[0][0].shape[0])
        g_loss = self._g_fn(tf.constant(gb), step_t, tf.constant(step + 1, tf.float32),
                            tf.constant(self.g_opt.lr(step), tf.float32))
        self.g_opt.count(step + 1)
        if self.gan.ema is not None:  # As GanStep.g_update: the step counted after it.
            self._ema_fn(tf.constant(step + 1, tf.int64))
        losses = float(tensors.gather(d_loss)), float(tensors.gather(g_loss))
        if not np.all(np.isfinite(losses)):
            raise errors.NonFiniteError(f"non-finite loss at step {step + 1} on the mesh: "
                                        f"d_loss={losses[0]}, g_loss={losses[1]}")
        return losses


class _Rate:
    """An optimizer as `callbacks.Summaries` reads it: `learning_rate` of the next update."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    @property
    def learning_rate(self):
        return self._optimizer.lr()


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
        self.g_optimizer, self.d_optimizer = _Rate(trainer.g_opt), _Rate(trainer.d_opt)
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
