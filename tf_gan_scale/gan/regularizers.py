"""Regularizers that are not (only) per-example: BigGAN's orthogonal regularization of the
weights, and LeCam regularization of D's outputs against moving anchors.

Cross-replica rule for a term that is NOT a mean over examples (`orthogonal`): each
replica adds `term / num_replicas` to its loss (`replica.num_replicas()`). Gradients are
SUMMED across replicas (`replica.apply_global_gradients`), and every replica computes the
same term from the same (mirrored) weights, so the sum of the N shares' gradients is the
gradient of the term added once, as on one device. (Adding it in full on each replica
would apply it N times; adding it on replica 0 only works too but keeps the replicas'
graphs different.)
"""

import tensorflow as tf


def orthogonal(weights):
    """BigGAN's orthogonal regularization (Brock et al. 2018, "Large Scale GAN Training
    for High Fidelity Natural Image Synthesis", sec. 3.1), a float32 scalar:

        1/2 * sum over weights of || W W^T * (1 - I) ||_F^2

    with W the weight as a matrix with one row per OUTPUT unit: Keras kernels are
    [..., in, out] (Dense [in, out], Conv2D [kh, kw, in, out]), so W is the kernel
    reshaped to [-1, out] and transposed, [out, fan_in]. That is BigGAN-PyTorch's
    `param.view(param.shape[0], -1)` of a PyTorch weight [out, in, ...] up to the order
    of the columns, which W W^T does not see. Weights of rank < 2 (biases, gains) are
    skipped, as there.

    The factor 1/2 makes the gradient exactly the update BigGAN-PyTorch's `utils.ortho`
    adds to the gradient (github.com/ajbrock/BigGAN-PyTorch, utils.py):
        d/dW = 2 (W W^T * (1 - I)) W,
    so `strength * orthogonal(weights)` added to the G loss reproduces `ortho(G,
    strength, ...)` (BigGAN: strength 1e-4 via --G_ortho). The last axis is the one taken
    as rows, so for Conv2DTranspose (kernel [kh, kw, out, in]) the rows are the INPUT
    channels, which is also what `ortho` does with a PyTorch ConvTranspose2d weight
    [in, out, kh, kw].

    Which variables (the trainer's choice): G's kernels of rank >= 2 (`v.shape.rank >= 2`
    over G's trainable variables), EXCLUDING the shared class embedding, as
    BigGAN-PyTorch's train_fns.py does (`blacklist=[param for param in
    G.shared.parameters()]`: "Don't ortho reg shared, it makes no sense"). With spectral
    normalization, pass the raw kernel variables (BigGAN-PyTorch regularizes the stored,
    unnormalized weight). BigGAN applies it to G only (--D_ortho exists, default 0).

    NOT per-example: it is added ONCE to the global loss, so on each replica add
    `strength * orthogonal(weights) / num_replicas`; the cross-replica sum of gradients
    is then the one-device gradient (module docstring). It does not depend on the batch.

    Args:
        weights: iterable of variables or tensors (any float dtype; computed in float32).
    Returns:
        float32 scalar (0 when no weight has rank >= 2).
    """
    total = tf.constant(0.0, tf.float32)
    for w in weights:
        w = tf.convert_to_tensor(w)  # Also Keras variables and NumPy arrays.
        if w.shape.rank is None or w.shape.rank < 2:
            continue
        w = tf.cast(w, tf.float32)
        m = tf.transpose(tf.reshape(w, [-1, w.shape[-1]]))  # [out, fan_in]
        gram = tf.matmul(m, m, transpose_b=True)  # [out, out]
        off = gram * (1.0 - tf.eye(tf.shape(gram)[0], dtype=gram.dtype))
        total += tf.reduce_sum(tf.square(off))
    return 0.5 * total


def _flat_logits(logits, what):
    logits = tf.convert_to_tensor(logits)
    rank = logits.shape.rank
    if rank not in (1, 2) or (rank == 2 and logits.shape[1] not in (1, None)):
        raise ValueError(f"lecam: {what} must be [B] or [B, 1], got shape {logits.shape}")
    return tf.cast(tf.reshape(logits, [-1]), tf.float32)


def lecam(real_logits, fake_logits, anchor_real, anchor_fake):
    """Per-example LeCam regularization (Tseng et al. 2021, "Regularizing Generative
    Adversarial Networks under Limited Data", CVPR), float32 [B]:

        relu(D(real_i) - anchor_fake)^2 + relu(anchor_real - D(fake_i))^2

    whose batch mean is the official loss (github.com/google/lecam-gan,
    biggan_cifar/losses.py `lecam_reg` and stylegan2/lecam_loss.py `lecamreg`):
        mean(relu(D(real) - ema.D_fake)^2) + mean(relu(ema.D_real - D(fake))^2)
    i.e. real outputs are pulled down towards the moving average of the FAKE outputs and
    fake outputs up towards the moving average of the REAL outputs, one-sided.

    Pairs real example i with fake example i: both batches must have the same size (the
    mean of a sum of two equal-length means). Add `weight * lecam(...)` to D's
    per-example loss before the single global reduction (`replica.global_mean`). The
    official scripts use weight 0.3 for BigGAN on CIFAR (--LC 0.3) and 1e-6 (CIFAR) or
    3e-7 (FFHQ) for StyleGAN2 (--lecam).

    Args:
        real_logits, fake_logits: D's outputs [B] or [B, 1] on real and fake images.
        anchor_real, anchor_fake: float scalars, moving averages of D's mean output on
            real and fake images (`update_anchor`); treated as constants (stop_gradient),
            as in the official code (Python floats / stop_gradient there).
    """
    real = _flat_logits(real_logits, "real_logits")
    fake = _flat_logits(fake_logits, "fake_logits")
    anchor_real = tf.stop_gradient(tf.cast(anchor_real, tf.float32))
    anchor_fake = tf.stop_gradient(tf.cast(anchor_fake, tf.float32))
    return tf.square(tf.nn.relu(real - anchor_fake)) + tf.square(tf.nn.relu(anchor_real - fake))


def update_anchor(anchor, value, decay=0.99):
    """Exponential moving average step (pure): decay * anchor + (1 - decay) * value.

    `value` is D's mean output over the GLOBAL batch (real or fake) this step: all-reduce
    the replicas' sums and divide by the global batch, so every replica holds the same
    anchor, the one a single device would. The official code updates the anchors with the
    current batch BEFORE computing the regularizer (BigGAN: `loss_hinge_dis` then
    `lecam_reg`; StyleGAN2: `assign_moving_average` then the loss). Its defaults differ
    by code base: StyleGAN2 (TensorFlow) decay 0.99 from 0 with zero-debiasing; BigGAN
    CIFAR `ema_losses(init=1000., decay=0.9, start_itr=1000)`: decay 0 (anchor = the
    current mean) for the first 1000 iterations, during which the regularizer is off.
    A trainer can reproduce either by choosing `decay` per step.
    """
    decay = tf.cast(decay, tf.float32)
    return decay * tf.cast(anchor, tf.float32) + (1.0 - decay) * tf.cast(value, tf.float32)
