"""AdaController: ADA's p and its statistic during training (StyleGAN2-ADA, Karras 2020).

The augmentation pipeline and the formula for the new p are ada.py's; this module holds
the step's bookkeeping around them: every D pass adds its GLOBAL sum of sign(D(real)) to
the statistic (`record`; the sum rides on the pass's gradient all-reduce, so it costs no
collective of its own), and at the start of a step due for it p moves and the statistic
restarts (`adjust`). An integer sum and one formula: p is the same on every topology,
and p, the statistic and the step are checkpointed (by `GAN`), so a resume is exact.
Kept apart from ada.py (the pipeline, 600 lines) so each reads on its own.

With a schedule config.train.cosine.ada_p (R3GAN, training_loop.py:313-314) there is no
controller: at the start of every step p is set to the schedule's value at the images
seen before it (step x global batch), a function of the step alone (ada_interval is 0).
"""

import tensorflow as tf

from tf_gan_scale.gan import ada as ada_lib


class AdaController:
    """ADA's p controller of a GAN step, on one replica.

    Args:
        config: a validated `StepConfig` (ada_interval, ada_target, ada_kimg are read).
        state: (p float32 scalar, [sum of sign(D(real)), count] float32 [2]) variables.
    """

    def __init__(self, *, config, state):
        self.config = config
        self.p, self.stats = state
        self.schedule = config.schedule("ada_p")  # R3GAN's cosine, or None.

    def record(self, sign_sum, count):
        """Adds a D pass's GLOBAL sum of sign(D(real)) over `count` reals to ADA's
        statistic (an integer sum: exactly the same on every topology)."""
        stats = self.stats
        stats.assign(stats + tf.stack([sign_sum, tf.cast(count, tf.float32)]))

    def adjust(self, step, gb):
        """ADA's controller (training_loop.py, "Execute ADA heuristic"): every
        ada_interval steps, p += sign(r_t - target) x gb x interval / (ada_kimg x 1000),
        p >= 0, with r_t the mean sign of D(real) over the reals of the Dmain and Dreg
        passes since the last adjustment; then the statistic restarts. Runs at the start
        of step t for the steps before it (the official runs after step t - 1: the same
        order), with a global batch of gb rows."""
        c = self.config
        if self.schedule is not None:  # R3GAN: p from the schedule, every step.
            self.p.assign(self.schedule.at(step, gb))
            return
        if not c.ada_interval:
            return
        p, stats = self.p, self.stats
        due = tf.logical_and(step > 0, tf.equal(step % c.ada_interval, 0))
        due = tf.logical_and(due, stats[1] > 0)
        new = ada_lib.adjust_p(p, stats[0], stats[1], gb, c.ada_interval,
                               float(c.ada_target), float(c.ada_kimg))
        p.assign(tf.where(due, new, p))
        # An elementwise condition: a scalar one selecting between [2] tensors crashes a
        # DTensor step (a segmentation fault, TF 2.21); the values are the same.
        stats.assign(tf.where(tf.fill([2], due), tf.zeros([2]), stats))
