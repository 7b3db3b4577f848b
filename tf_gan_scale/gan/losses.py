"""GAN losses with one per-example contract.

Every loss is keyword-only, takes discriminator logits of shape [B] (or [B, 1]) and
returns `GanLoss(d=[B], g=[B])`, per example. Reduction over the global batch happens
once, in `replica.global_mean`, never here.

For D the real and fake terms are paired per example (example i of the real batch with
example i of the fake batch), so the mean over the batch equals the usual
E[real term] + E[fake term].
"""

import collections

import tensorflow as tf

from tf_gan_scale import errors

GanLoss = collections.namedtuple("GanLoss", ["d", "g"])


def _flat(logits):
    logits = tf.convert_to_tensor(logits)
    return tf.reshape(logits, [tf.shape(logits)[0]])


def non_saturating(*, real_logits, fake_logits):
    """Goodfellow et al. 2014, G maximizes log D(G(z)): g = softplus(-fake)."""
    real, fake = _flat(real_logits), _flat(fake_logits)
    # -log sigmoid(x) = softplus(-x); -log(1 - sigmoid(x)) = softplus(x).
    return GanLoss(d=tf.nn.softplus(-real) + tf.nn.softplus(fake), g=tf.nn.softplus(-fake))


def minimax(*, real_logits, fake_logits):
    """The original saddle-point objective: G minimizes log(1 - D(G(z))) = -softplus(fake)."""
    real, fake = _flat(real_logits), _flat(fake_logits)
    return GanLoss(d=tf.nn.softplus(-real) + tf.nn.softplus(fake), g=-tf.nn.softplus(fake))


def hinge(*, real_logits, fake_logits):
    """Lim & Ye 2017 / SAGAN / BigGAN: d = relu(1 - real) + relu(1 + fake), g = -fake."""
    real, fake = _flat(real_logits), _flat(fake_logits)
    return GanLoss(d=tf.nn.relu(1.0 - real) + tf.nn.relu(1.0 + fake), g=-fake)


def wasserstein(*, real_logits, fake_logits):
    """Arjovsky et al. 2017 critic loss: d = fake - real, g = -fake (pair with wgan_gp)."""
    real, fake = _flat(real_logits), _flat(fake_logits)
    return GanLoss(d=fake - real, g=-fake)


def least_squares(*, real_logits, fake_logits):
    """Mao et al. 2017 (a=0, b=1, c=1): d = ((real-1)^2 + fake^2)/2, g = (fake-1)^2/2."""
    real, fake = _flat(real_logits), _flat(fake_logits)
    return GanLoss(d=0.5 * (tf.square(real - 1.0) + tf.square(fake)),
                   g=0.5 * tf.square(fake - 1.0))


def relativistic(*, real_logits, fake_logits):
    """The relativistic paired loss, RpGAN (Jolicoeur-Martineau 2019; R3GAN, Huang et
    al. 2024, R3GAN/Trainer.py:14-44): real row i against fake row i,
    d = softplus(-(real - fake)), g = softplus(-(fake - real)).

    G's term reads D's logits of REAL rows too (`PAIRED`): the step feeds G's update its
    own real batch, and conditions fake i on real i's label (as the official code, which
    calls G with the real batch's labels)."""
    real, fake = _flat(real_logits), _flat(fake_logits)
    return GanLoss(d=tf.nn.softplus(fake - real), g=tf.nn.softplus(real - fake))


LOSSES = {
    "non_saturating": non_saturating,
    "minimax": minimax,
    "hinge": hinge,
    "wasserstein": wasserstein,
    "least_squares": least_squares,
    "rpgan": relativistic,
}


# Losses whose D term is a cross-entropy against targets 1 (real) and 0 (fake).
CROSS_ENTROPY = ("non_saturating", "minimax")

# Losses that pair real row i with fake row i in BOTH updates: G's term depends on D's
# logits of real rows, so G's update needs a real batch (`StepConfig.paired`).
PAIRED = ("rpgan",)


def smooth_real_labels(loss_fn, smoothing):
    """One-sided label smoothing (Salimans et al. 2016) of a cross-entropy loss: D's
    target for real examples is 1 - s instead of 1. The real term becomes
    (1 - s) softplus(-r) + s softplus(r) = softplus(-r) + s r; G's term is unchanged.
    """
    def smoothed(*, real_logits, fake_logits):
        out = loss_fn(real_logits=real_logits, fake_logits=fake_logits)
        return GanLoss(d=out.d + smoothing * _flat(real_logits), g=out.g)
    return smoothed


def get(name):
    """Loss function by name; unknown names raise ConfigError listing the valid ones."""
    if callable(name):
        return name
    return errors.choose("loss", name, LOSSES)
