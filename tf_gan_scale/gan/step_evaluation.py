"""The GAN's held-out losses: `evaluate`, one batch at a time, on one replica.

`GAN.test_step` (through `GanStep.evaluate`) runs it inside `strategy.run`. The losses are
global means per example over the evaluation so far, the same on every replica and
topology: fake example i of an evaluation is keyed by (seed, i) alone, and a last partial
batch may split unevenly over the replicas.
"""

import tensorflow as tf

from tf_gan_scale import latents, replica
from tf_gan_scale.architectures.calls import call_generator
from tf_gan_scale.gan.step_inputs import unpack


def evaluate(data, offset=0, fid=None, *, inputs, sampler, loss_fn, trackers):
    """Global-mean losses on one held-out batch, both networks in inference mode.

    Args:
        data: a real batch as in `GanStep.train` (labels unused); the global batch may
            split unevenly over replicas (a last partial batch): rows are placed by
            `replica.global_rows_uneven`.
        offset: int32 scalar, evaluation examples before this batch. Fake example i
            of an evaluation comes from latents (and a conditional one's class label)
            keyed by (seed, i) alone (`latents.EVAL_PHASE`), so the result depends on
            neither batch size nor topology. The fakes come from `sampler`.
        fid: a `metrics.scoring.FidStreams` to feed (real, fake), or None.
        inputs: the step's `StepInputs` (seed, latent size, fake labels, D's logits).
        sampler: the generator to evaluate (`GanStep.sampler`: the EMA one if any).
        loss_fn: the step's loss (`losses.get`, with label smoothing if any).
        trackers: {name: keras.metrics.Mean} holding "d_loss" and "g_loss".

    Returns:
        {"d_loss", "g_loss": running global means over the evaluation so far (the
        adversarial losses; a gradient penalty is not part of them: it needs D in
        training mode), "examples": int32 global rows of this batch}.
    Collectives: one gather of row counts, one all-reduce of the two loss sums.
    """
    real, real_labels = unpack(data)
    b = tf.shape(real)[0]
    rows, n = replica.global_rows_uneven(b)
    z = latents.rows_normal(latents.key(inputs.seed, latents.SAMPLE_STEP,
                                        latents.EVAL_PHASE), offset + rows,
                            [inputs.latent_dim])
    fake_labels = inputs.fake_labels(latents.SAMPLE_STEP, latents.EVAL_PHASE, offset + rows)
    if inputs.config.paired and inputs.num_classes:  # Fake i takes real i's label, as
        fake_labels = real_labels                     # in training (losses.PAIRED).

    def local_sums():
        fake = call_generator(sampler, z, fake_labels, training=False)
        logits = inputs.discriminate(tf.concat([real, fake], 0),
                                     tf.concat([real_labels, fake_labels], 0),
                                     training=False)
        out = loss_fn(real_logits=logits[:b], fake_logits=logits[b:])
        if fid is not None:
            fid.update(real, fake)
        return tf.stack([tf.reduce_sum(out.d), tf.reduce_sum(out.g)])

    # A replica can get no rows of a last partial batch (1 row over 2 replicas), and
    # convolutions fail on empty batches on CPU: it contributes zero sums. The
    # collectives stay outside the branch, so every replica runs them.
    sums = tf.cond(b > 0, local_sums, lambda: tf.zeros([2]))
    # Sums over the global batch, divided once by its size: the per-example mean, as
    # in training, also when the replicas hold different numbers of rows.
    sums = [sums[0], sums[1]]
    ctx = tf.distribute.get_replica_context()
    if ctx is not None and ctx.num_replicas_in_sync > 1:
        sums = ctx.all_reduce(tf.distribute.ReduceOp.SUM, sums)
    count = tf.cast(n, tf.float32)
    # Weighted by the batch's rows: the running mean is per example over the set.
    d_mean, g_mean = trackers["d_loss"], trackers["g_loss"]
    d_mean.update_state(sums[0] / count, sample_weight=count)
    g_mean.update_state(sums[1] / count, sample_weight=count)
    return {"d_loss": d_mean.result(), "g_loss": g_mean.result(), "examples": n}
