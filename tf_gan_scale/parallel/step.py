"""The GAN step on a DTensor mesh: D and G updates as SEPARATE functions, a read-once
optimizer, the same losses, latents and batch-norm statistics as one device.

Why it looks like this (MODEL_PARALLEL_NOTES, each trap reproduced there):
- A DTensor program is written for the GLOBAL batch: the step calls the one-device code
  of `gan.GAN` (`_d_grads`, `_g_grads`) on all GB rows, with rows 0..GB-1, and DTensor
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

import numpy as np
import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.parallel import layouts

OPTIMIZERS = ("sgd", "adam")


class ReadOnceOptimizer:
    """SGD or Adam over (possibly sharded) DVariables: each variable and slot is read
    once and written once per update, the update number t comes in as an argument.

    Args:
        name: "sgd" or "adam".
        variables: the Keras variables it updates (their DVariables must exist: build
            after `layouts.shard`).
        learning_rate, beta_1, beta_2, epsilon: as Keras' SGD / Adam (constant rate).
    """

    def __init__(self, name, variables, learning_rate, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-7):
        from tensorflow.experimental import dtensor
        if name not in OPTIMIZERS:
            raise errors.ConfigError(f"optimizer {name!r} on a mesh; valid: "
                                     f"{', '.join(OPTIMIZERS)}")
        self.name, self.variables = name, list(variables)
        self.lr, self.b1, self.b2, self.eps = (float(learning_rate), float(beta_1),
                                               float(beta_2), float(epsilon))
        self.slots = []
        if name == "adam":
            for v in self.variables:
                lay = dtensor.fetch_layout(v._value)
                zeros = dtensor.call_with_layout(tf.zeros, lay, v.shape, v.dtype)
                # m and v with the weight's layout: a split weight's moments are split too.
                self.slots.append((dtensor.DVariable(zeros, name=f"{v.name}_m"),
                                   dtensor.DVariable(tf.identity(zeros), name=f"{v.name}_v")))

    def apply(self, grads, t):
        """Updates with `grads` (global gradients, the variables' layouts); t: float32
        scalar, the 1-based update number (Adam's bias correction)."""
        for i, (v, g) in enumerate(zip(self.variables, grads)):
            if g is None:
                continue
            w = v._value.read_value()
            if self.name == "sgd":
                v._value.assign(w - self.lr * g)
                continue
            m_var, v_var = self.slots[i]
            m = self.b1 * m_var.read_value() + (1 - self.b1) * g
            s = self.b2 * v_var.read_value() + (1 - self.b2) * tf.square(g)
            # Keras' Adam: lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(s) + eps).
            rate = self.lr * tf.sqrt(1 - tf.pow(self.b2, t)) / (1 - tf.pow(self.b1, t))
            v._value.assign(w - rate * m / (tf.sqrt(s) + self.eps))
            m_var.assign(m)
            v_var.assign(s)


def optimizer_from_config(cfg, variables):
    """ReadOnceOptimizer from a config.train.{d,g}_optimizer dict."""
    cfg = dict(cfg)
    name = cfg.pop("name", None)
    known = {"learning_rate", "beta_1", "beta_2", "epsilon"}
    if set(cfg) - known:
        raise errors.ConfigError(f"optimizer options {sorted(set(cfg) - known)} are not "
                                 f"supported on a mesh; valid: {', '.join(sorted(known))}")
    return ReadOnceOptimizer(name, variables, **cfg)


class MeshTrainer:
    """Trains `gan` (a compiled `gan.GAN`) on `mesh`. Tested unconditional, with d_steps
    1 and 2, batch norm and dropout; conditional models run the same code, untested here.

    The networks' weights are moved onto the mesh by `weight_plan` (layouts.plan). One
    call of `train_step(real, labels)` is one GAN step: d_steps D updates, then one G
    update, each in its own tf.function.

    Args:
        gan: gan.GAN, compiled (its loss, seeds and d_steps are used; its optimizers are
            replaced by read-once ones from `d_optimizer` / `g_optimizer` configs).
        mesh: dtensor.Mesh with axes ("batch", "model").
        weight_plan: {weight path: spec} (layouts.plan).
        d_optimizer / g_optimizer: {"name": "sgd" | "adam", "learning_rate": ...}.

    Not yet on a mesh (a ConfigError, not a silently different run): gradient
    accumulation, mixed_float16 loss scaling, gradient penalties (D called twice in one
    function: its stateful layers would hit the read-after-write trap), LeCam, the EMA
    generator, and resuming (the optimizer moments are not checkpointed yet).
    """

    def __init__(self, gan, mesh, weight_plan, d_optimizer, g_optimizer):
        import keras
        unsupported = {
            "accumulation_steps": gan.accumulation_steps != 1,
            "precision=mixed_float16 (loss scaling)": isinstance(
                gan.g_optimizer, keras.optimizers.LossScaleOptimizer),
            "penalty": gan.penalty_fn is not None,
            "lecam_weight": bool(gan.lecam_weight),
            "ema": gan.ema is not None,
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise errors.ConfigError(f"not supported on a mesh yet: {', '.join(bad)}; "
                                     f"valid: run them with a tf.distribute strategy")
        self.gan, self.mesh = gan, mesh
        gan._mesh = mesh  # GAN._join then stacks [real; fake] (no concat on a split axis).
        layouts.shard((gan.generator, gan.discriminator), mesh, weight_plan)
        self.d_opt = optimizer_from_config(d_optimizer, gan.discriminator.trainable_variables)
        self.g_opt = optimizer_from_config(g_optimizer, gan.generator.trainable_variables)
        self.step = 0
        self._d_fn = tf.function(self._d_update)
        self._g_fn = tf.function(self._g_update)

    def _rows(self, gb):
        return tf.range(gb)

    def _d_update(self, real, labels, step, k, t):
        gb = tf.shape(real)[0]
        grads, share, _ = self.gan._d_grads(real, labels, self._rows(gb), gb, step, k)
        self.d_opt.apply(grads, t)
        return share

    def _g_update(self, gb, step, t):
        grads, share = self.gan._g_grads(self._rows(gb), gb, step)
        self.g_opt.apply(grads, t)
        return share

    def batch(self, real, labels=None):
        """Host arrays [GB, ...] (and labels [GB]) -> DTensors split over "batch"."""
        def put(x, dtype):
            x = tf.convert_to_tensor(x, dtype)
            return layouts.to_mesh(x, self.mesh, ("batch",) + (None,) * (x.shape.rank - 1))

        if labels is None:
            labels = np.zeros([np.shape(real)[0]], np.int32)
        return put(real, tf.float32), put(labels, tf.int32)

    def train_step(self, batches):
        """One GAN step: `batches` is a list of d_steps (real, labels) pairs of mesh
        DTensors (`batch`). Returns (last D loss, G loss) as floats."""
        d_steps = self.gan.d_steps
        if len(batches) != d_steps:
            raise ValueError(f"{len(batches)} batches for d_steps={d_steps}")
        step = tf.constant(self.step, tf.int64)
        for k, (real, labels) in enumerate(batches):
            t = tf.constant(self.step * d_steps + k + 1, tf.float32)
            d_loss = self._d_fn(real, labels, step, k, t)
        gb = int(batches[0][0].shape[0])
        g_loss = self._g_fn(tf.constant(gb), step, tf.constant(self.step + 1, tf.float32))
        self.step += 1
        losses = float(layouts.gather(d_loss)), float(layouts.gather(g_loss))
        if not np.all(np.isfinite(losses)):
            raise errors.NonFiniteError(f"non-finite loss at step {self.step} on the mesh: "
                                        f"d_loss={losses[0]}, g_loss={losses[1]}")
        return losses
