"""StepInputs: what a GAN step feeds G and D, every draw keyed by the global row.

The real batch (`unpack`, `batch_rows`); the fakes' class labels (`fake_labels`); G's images
(`fakes`: one call of G, or a style generator's mapping with style mixing, `styles`, then
its synthesis, `synthesize`); what D sees of any image (`d_inputs`: DiffAugment or ADA,
then instance noise) and D's logits (`discriminate`). Every random draw is a function of
(seed, step, phase, global row) from `latents`, so N replicas match one device and a
resume is exact. `GanStep` (step.py) owns one and offers these methods to the engines.
"""

import tensorflow as tf

from tf_gan_scale import latents
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.architectures.calls import call_generator
from tf_gan_scale.gan import ada_pipes
from tf_gan_scale.gan import augment as augment_lib
from tf_gan_scale.gan.step_config import ADA_PIPES


def unpack(batch, need_labels=False):
    """Real images and labels from a batch: a dict {"x"|"image", "label"}, an (x, y) tuple,
    or a bare tensor. Returns (x [B, ...] float32, labels [B] int32: zeros when the batch
    has none, unless need_labels: then ValueError)."""
    if isinstance(batch, dict):
        x = batch["x"] if "x" in batch else batch["image"]
        labels = batch.get("label")
    elif isinstance(batch, (tuple, list)):
        x, labels = batch[0], (batch[1] if len(batch) > 1 else None)
    else:
        x, labels = batch, None
    x = tf.cast(x, tf.float32)
    if labels is None:
        if need_labels:  # A conditional GAN would train every real example as class 0.
            raise ValueError("a conditional GAN (num_classes > 0) needs labelled batches: "
                             "{'x': images, 'label': labels} or (images, labels)")
        labels = tf.zeros([tf.shape(x)[0]], tf.int32)
    return x, tf.cast(labels, tf.int32)


def batch_rows(x):
    """The rows of x [B, ...]: B as a Python int when the shape says it, else a tensor.
    Static where it can be: a DTensor mesh cannot lay out `tf.range` of a size computed
    at run time ("Shared RangeOp is not supported yet"), and the global rows of a batch
    are such a range (`replica.global_rows`)."""
    return x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]


class StepInputs:
    """The inputs of G and D in a GAN step, on one replica.

    Args:
        generator / discriminator: the Keras networks (conditional when num_classes > 0).
        config: a validated `StepConfig` (augment, instance_noise, style_mixing,
            pl_batch_shrink are read here).
        latent_dim, seed, num_classes: as `GAN`'s.
        ada_p: with augment "ada" or "r3gan" (ADA_PIPES), the pipe's probability p (float32
            scalar variable), else None.

    Attributes: `style` (mapping, synthesis) of a style generator, else None; `chunk`, its
    virtual chunk of global rows (D's minibatch-std chunk), which keys the per-chunk draws.
    """

    def __init__(self, *, generator, discriminator, config, latent_dim, seed, num_classes,
                 ada_p=None):
        self.generator, self.discriminator = generator, discriminator
        self.config = config
        self.latent_dim, self.seed, self.num_classes = latent_dim, seed, num_classes
        self.ada_p = ada_p
        # A style generator runs as its two networks (mixing, path length); its
        # virtual chunk (D's minibatch-std chunk) keys the per-chunk draws.
        self.style = (stylegan2.parts(generator) if stylegan2.is_style_generator(generator)
                      else None)
        self.chunk = stylegan2.mbstd_chunk(discriminator) or max(
            1, int(config.pl_batch_shrink))

    def discriminate(self, x, labels, training):
        """D's logits [B] float32 for x [B, ...] with class labels [B] (ignored if
        unconditional)."""
        if self.num_classes:
            logits = self.discriminator([x, labels], training=training)
        else:
            logits = self.discriminator(x, training=training)
        return tf.cast(logits, tf.float32)  # Losses in float32 (precision.py).

    def fake_labels(self, step, phase, rows):
        """Labels int32 [len(rows)] of the fakes of latents phase `phase` (zeros when
        unconditional): uniform over the classes, one draw per global row."""
        if not self.num_classes:
            return tf.zeros(tf.shape(rows)[:1], tf.int32)
        return latents.rows_labels(latents.key(self.seed, step, latents.LABEL_PHASE + phase),
                                   rows, self.num_classes)

    def d_inputs(self, x, rows, step, phase):
        """What D sees of images x [L, ...] with global rows [L]: DiffAugment or an
        AugmentPipe (ada_pipes.PIPES: "ada", "r3gan"), then instance noise. Every draw is
        per example (keyed by the global row) and drawn afresh per update (phase), so N
        replicas match one device and resume is exact."""
        c = self.config
        if c.augment in ADA_PIPES:
            x = ada_pipes.augment(
                x, tf.convert_to_tensor(self.ada_p),
                latents.key(self.seed, step, latents.AUGMENT_PHASE + phase), rows, c.augment)
        elif c.augment:
            x = augment_lib.augment(
                x, c.augment, latents.key(self.seed, step, latents.AUGMENT_PHASE + phase), rows)
        if c.instance_noise:
            std = tf.constant(float(c.instance_noise))
            if c.instance_noise_steps:  # Linear annealing to 0.
                done = tf.cast(step, tf.float32) / float(c.instance_noise_steps)
                std = std * tf.maximum(0.0, 1.0 - done)
            noise = latents.rows_normal(latents.key(self.seed, step, latents.NOISE_PHASE + phase),
                                        rows, list(x.shape[1:]))
            x = x + std * noise
        return x

    def fakes(self, z, labels, rows, step, phase, training=True):
        """G's images [m, ...] float32 for latents z [m, latent_dim] and labels [m] of the
        global rows `rows` [m], in latents phase `phase`. Also returns w [m, w_dim] of a
        style generator (else None), for its w_avg. Layers that draw per example (a
        style generator's noise inputs, dropout) see `rows`."""
        if self.style is None:
            with latents.example_rows(rows):
                return call_generator(self.generator, z, labels, training=training), None
        ws, w = self.styles(z, labels, rows, step, phase, training)
        return self.synthesize(ws, rows, training), w

    def styles(self, z, labels, rows, step, phase, training=True):
        """A style generator's per-layer styles ws [m, num_ws, w_dim] and w [m, w_dim].

        Style mixing (StyleGAN2, training/loss.py:StyleGAN2Loss.run_G): with probability
        style_mixing the layers from a cut-off uniform in [1, num_ws - 1] on take the
        w of a second latent. The official code draws one cut-off per GPU and
        accumulation round, so its result depends on the GPU count; here the cut-off is
        one draw per CHUNK of global rows (D's minibatch-std chunk, the official
        per-GPU batch), keyed by (seed, step, phase, chunk), and the second latent one
        per row: the same on every topology."""
        mapping, synthesis = self.style
        w = self._map(mapping, z, labels, training)
        num_ws = stylegan2.num_ws_of(synthesis)
        ws = tf.tile(w[:, None, :], [1, num_ws, 1])
        if not (training and self.config.style_mixing):
            return ws, w
        chunks = tf.cast(rows, tf.int64) // self.chunk
        u = latents.rows_uniform(latents.key(self.seed, step, latents.MIX_PHASE + phase),
                                 chunks, [2])
        cutoff = tf.minimum(1 + tf.cast(u[:, 1] * (num_ws - 1), tf.int32), num_ws - 1)
        cutoff = tf.where(u[:, 0] < float(self.config.style_mixing), cutoff, num_ws)
        z2 = latents.rows_normal(
            latents.key(self.seed, step, latents.MIX_LATENT_PHASE + phase), rows,
            [self.latent_dim])
        w2 = self._map(mapping, z2, labels, training)
        keep = tf.range(num_ws)[None, :] < cutoff[:, None]  # [m, num_ws]
        return tf.where(keep[..., None], ws, w2[:, None, :]), w

    def _map(self, mapping, z, labels, training):
        out = mapping([z, labels] if self.num_classes else z, training=training)
        return tf.cast(out, tf.float32)

    def synthesize(self, ws, rows, training=True):
        """A style generator's images [m, ...] float32 from styles ws [m, num_ws, w_dim];
        its noise inputs are drawn for the global rows `rows`."""
        with latents.example_rows(rows):
            return tf.cast(self.style[1](ws, training=training), tf.float32)
