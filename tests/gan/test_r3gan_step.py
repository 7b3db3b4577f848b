"""R3GAN's step math (issue 50): the relativistic paired loss with G's own real rows, R1 +
R2 taken on D's clean inputs through the augmentation in D's main pass, its lazy and
finite-difference options, and the penalty weight's cosine schedule.

Replica equivalence is checked here in-process, the way a replica computes it: the
gradients of a global batch of 16 rows equal the sum of the gradients of its two halves
(rows 0-7 and 8-15, each dividing by the global 16), with every random draw keyed by the
global row. tests/helpers/equivalence_run.py's "rpgan" case trains the same on one
device, 2 workers x 2 replicas (default tier) and 4 replicas (slow).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import architectures, errors, latents
from tf_gan_scale.gan import GAN, StepConfig, losses, penalties

GB = 16


def tiny(**knobs):
    """A tiny DCGAN without normalization (R1/R2 need per-example gradients), compiled
    with plain SGD and the given step knobs."""
    keras.utils.set_random_seed(0)
    g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=8, d_dropout=0.0,
                               d_norm="none", g_norm="none", g_channels=(16, 8, 4),
                               d_channels=(4, 8))
    model = GAN(g, d, 8, seed=5)
    model.compile(g_optimizer=keras.optimizers.SGD(0.1),
                  d_optimizer=keras.optimizers.SGD(0.1), **knobs)
    return model


def tiny_conditional():
    """A tiny class-conditional (3 classes) StyleGAN2 compiled with the paired loss."""
    keras.utils.set_random_seed(0)
    g, d = architectures.build("stylegan2", data_shape=(8, 8, 1), latent_dim=8,
                               num_classes=3, w_dim=8, mapping_layers=2, fmaps=1 / 256,
                               channel_max=8, mbstd_group=1)
    model = GAN(g, d, 8, seed=5, num_classes=3)
    model.compile(g_optimizer=keras.optimizers.SGD(0.1),
                  d_optimizer=keras.optimizers.SGD(0.1), loss="rpgan")
    return model


REAL = tf.random.stateless_uniform([GB, 8, 8, 1], seed=[1, 2], minval=-1.0, maxval=1.0)
G_REAL = tf.random.stateless_uniform([GB, 8, 8, 1], seed=[3, 4], minval=-1.0, maxval=1.0)
LABELS = tf.zeros([GB], tf.int32)
STEP = tf.constant(0, tf.int64)
R3 = dict(loss="rpgan", penalty="r1_r2", penalty_weight=0.5)


def rows(start, stop):
    return tf.range(start, stop, dtype=tf.int32)


def max_diff(a, b):
    """max |a - b| over a list of gradients, relative to their largest entry."""
    a, b = [tf.convert_to_tensor(x) for x in a], [tf.convert_to_tensor(x) for x in b]
    scale = max(float(tf.reduce_max(tf.abs(x))) for x in a)
    return max(float(tf.reduce_max(tf.abs(x - y))) for x, y in zip(a, b)) / scale


def d_halves(gs, **kw):
    """(D's gradients of the global batch, the sum of its two halves' gradients)."""
    full = gs.d_grads(REAL, LABELS, rows(0, GB), GB, STEP, 0, **kw)[0]
    halves = [gs.d_grads(REAL[i:i + 8], LABELS[i:i + 8], rows(i, i + 8), GB, STEP, 0,
                         **kw)[0] for i in (0, 8)]
    return full, [x + y for x, y in zip(*halves)]


# ---- the loss ------------------------------------------------------------------------

def test_rpgan_pairs_by_row_and_only_it_is_paired():
    real, fake = tf.constant([2.0, -1.0]), tf.constant([-0.5, 1.5])
    out = losses.relativistic(real_logits=real, fake_logits=fake)
    np.testing.assert_allclose(out.d, np.log1p(np.exp(-(real - fake).numpy())), rtol=1e-6)
    np.testing.assert_allclose(out.g, np.log1p(np.exp(-(fake - real).numpy())), rtol=1e-6)
    # Swapping the reals' order changes every term: the pairing is by row.
    swapped = losses.relativistic(real_logits=real[::-1], fake_logits=fake)
    assert not np.allclose(swapped.d, out.d)
    assert StepConfig(loss="rpgan").paired and StepConfig(loss=losses.relativistic).paired
    assert not any(StepConfig(loss=n).paired for n in losses.LOSSES if n != "rpgan")
    assert StepConfig(loss="rpgan").batches_per_step == 2
    assert StepConfig(loss="rpgan", d_steps=2).batches_per_step == 3
    assert StepConfig(loss="hinge", d_steps=2).batches_per_step == 2


def test_g_reads_its_own_real_rows_and_halves_add_up():
    gs = tiny(**R3).gan_step

    def g(real, r, gb=GB):
        return gs.g_grads(r, gb, STEP, real=real, real_labels=LABELS[:len(r)])

    full, share, _ = g(G_REAL, rows(0, GB))
    halves = [g(G_REAL[i:i + 8], rows(i, i + 8)) for i in (0, 8)]
    summed = [x + y for x, y in zip(halves[0][0], halves[1][0])]
    assert max_diff(full, summed) < 1e-5
    np.testing.assert_allclose(float(share), float(halves[0][1] + halves[1][1]), rtol=1e-6)
    # G's loss reads D's logits of the reals: other reals, another gradient.
    other = g(REAL, rows(0, GB))[0]
    assert max_diff(full, other) > 1e-2


def test_the_step_feeds_g_the_last_batch():
    model = tiny(**R3)
    before = [w.numpy() for w in model.generator.weights]
    out = model.gan_step.train(({"x": REAL}, {"x": G_REAL}))
    moved = [w.numpy() - b for w, b in zip(model.generator.weights, before)]
    twin = tiny(**R3)
    twin_out = twin.gan_step.train(({"x": REAL}, {"x": REAL}))
    # D's update read the first batch only; G's the second.
    np.testing.assert_allclose(float(out["d_loss"]), float(twin_out["d_loss"]), rtol=1e-6)
    other = [w.numpy() - b for w, b in zip(twin.generator.weights, before)]
    assert max_diff(moved, other) > 1e-2


# ---- R1 + R2 on the clean inputs -----------------------------------------------------

def test_r1_r2_in_pass_is_the_standalone_penalty_without_augmentation():
    model = tiny(**R3)
    d = model.discriminator
    x = tf.concat([REAL[:4], G_REAL[:4]], 0)
    up = penalties.UpdatePenalty(config=StepConfig(**R3), seed=0, discriminate=None)
    logits, pen = up.in_pass(lambda im, r, lab: d(im), x, rows(0, 8), LABELS[:8], STEP,
                             0, GB)
    assert pen.shape == [4] and logits.shape[0] == 8
    alone = penalties.r1_r2(d, real=x[:4], fake=x[4:], noise=None)
    np.testing.assert_allclose(pen.numpy(), 0.5 * alone.numpy(), rtol=1e-5)


def test_the_penalty_is_taken_before_the_augmentation():
    """With A(x) = 2x, the gradient of D(A(x)) wrt x is 2 D'(2x): the penalty on the
    clean input is 4x the penalty on what D saw."""
    d = tiny(**R3).discriminator
    x = tf.concat([REAL[:4], G_REAL[:4]], 0)
    up = penalties.UpdatePenalty(config=StepConfig(**R3), seed=0, discriminate=None)
    _, pen = up.in_pass(lambda im, r, lab: d(2.0 * im), x, rows(0, 8), LABELS[:8], STEP,
                        0, GB)
    seen = penalties.r1_r2(d, real=2.0 * x[:4], fake=2.0 * x[4:], noise=None)
    np.testing.assert_allclose(pen.numpy(), 4.0 * 0.5 * seen.numpy(), rtol=1e-5)


@pytest.mark.parametrize("knobs", [
    {}, {"augment": "r3gan", "ada_p": 0.5, "ada_interval": 0},
    {"penalty_fd_sigma": 0.01}, {"accumulation_steps": 2}],
    ids=["exact", "through_augmentation", "finite_difference", "accumulation"])
def test_d_gradients_of_the_global_batch_are_the_sum_of_its_halves(knobs):
    gs = tiny(**R3, **knobs).gan_step
    full, summed = d_halves(gs)
    # Float32 rounding: ~1e-7; the finite difference divides it by sigma (measured 5e-6).
    assert max_diff(full, summed) < (3e-5 if "penalty_fd_sigma" in knobs else 2e-6)
    # A 2x scale error (a half divided by its own 8 rows) is far outside it.
    assert max_diff(full, [2 * g for g in summed]) > 0.5


def test_the_finite_difference_estimates_the_exact_penalty():
    d = tiny(**R3).discriminator
    x = tf.concat([REAL[:4], G_REAL[:4]], 0)
    fwd = lambda im, r, lab: d(im)  # noqa: E731
    exact = penalties.UpdatePenalty(config=StepConfig(**R3), seed=0, discriminate=None)
    approx = penalties.UpdatePenalty(config=StepConfig(**R3, penalty_fd_sigma=1e-3), seed=0,
                                     discriminate=None)
    want = exact.in_pass(fwd, x, rows(0, 8), LABELS[:8], STEP, 0, GB)[1].numpy()
    draw = tf.function(lambda k: approx.in_pass(fwd, x, rows(0, 8), LABELS[:8], STEP, k,
                                                GB)[1])
    draws = np.stack([draw(tf.constant(k)).numpy() for k in range(200)])
    assert draws.shape == (200, 4)
    # One draw is (grad_r . e)^2 + (grad_f . e')^2: a relative std of at most sqrt(2)
    # (one chi-square with 1 degree of freedom), so the mean of 200 draws has one of at
    # most 0.1 and 35% is 3.5 of them (the draws are keyed: deterministic); a factor-2
    # error would miss by 100%.
    np.testing.assert_allclose(draws.mean(0), want, rtol=0.35)
    assert np.all(np.abs(draws.mean(0) / want - 1) < 0.35)
    assert draws.std(0).min() > 0.1 * want.min()  # A draw, not the exact value.


def test_a_lazy_penalty_is_every_kth_update_at_k_times_the_weight():
    model = tiny(**R3, penalty_every=2)
    every = tiny(**R3).gan_step
    gs = model.gan_step
    up = gs.update_penalty
    x = tf.concat([REAL[:4], G_REAL[:4]], 0)
    fwd = lambda im, r, lab: model.discriminator(im)  # noqa: E731
    base = every.update_penalty.in_pass(fwd, x, rows(0, 8), LABELS[:8], STEP, 0, GB)[1]
    due = up.in_pass(fwd, x, rows(0, 8), LABELS[:8], tf.constant(2, tf.int64), 0, GB)[1]
    off = up.in_pass(fwd, x, rows(0, 8), LABELS[:8], tf.constant(3, tf.int64), 0, GB)[1]
    np.testing.assert_allclose(due.numpy(), 2 * base.numpy(), rtol=1e-6)
    assert not np.any(off.numpy())
    # The caller's Python decision gives the same (a mesh cannot run the cond).
    np.testing.assert_allclose(
        up.in_pass(fwd, x, rows(0, 8), LABELS[:8], STEP, 0, GB, due=True)[1].numpy(),
        due.numpy(), rtol=1e-6)


def test_the_penalty_weight_follows_its_cosine_schedule():
    cfg = StepConfig(**R3, cosine={"images": 64, "penalty_weight": (0.5, 0.05)})
    up = penalties.UpdatePenalty(config=cfg, seed=0, discriminate=None)
    got = [float(up.weight(s, GB)) for s in (0, 2, 4, 9)]
    np.testing.assert_allclose(got, [0.5, 0.275, 0.05, 0.05], rtol=1e-6)
    assert float(penalties.UpdatePenalty(config=StepConfig(**R3), seed=0,
                                         discriminate=None).weight(3, GB)) == 0.5


# ---- refusals -------------------------------------------------------------------------

@pytest.mark.parametrize("knobs, words", [
    ({"penalty": "r1", "penalty_fd_sigma": 0.1}, "penalty_fd_sigma=0.1"),
    ({"penalty": "r1_r2", "lazy_phases": True}, "lazy_phases=False"),
    ({"penalty_fd_sigma": -1.0}, "penalty_fd_sigma must be"),
    ({"cosine": {"images": 0, "penalty_weight": (1.0, 0.1)}}, "cosine.images=0"),
    ({"cosine": {"images": 10, "gamma": (1.0, 0.1)}}, "cosine.gamma is not"),
    ({"cosine": {"images": 10, "penalty_weight": 0.5}}, "penalty_weight must be"),
    ({"penalty": "none", "cosine": {"images": 10, "penalty_weight": (1.0, 0.1)}},
     "penalty='none'"),
    ({"penalty": "r1", "lazy_phases": True,
      "cosine": {"images": 10, "penalty_weight": (1.0, 0.1)}}, "lazy_phases=True"),
])
def test_bad_knobs_are_one_line_errors(knobs, words):
    with pytest.raises(errors.ConfigError, match=words.replace("(", r"\(")):
        StepConfig(**{**R3, **knobs}).validate()


def test_r1_r2_refuses_batch_norm_in_d_and_engines_not_tested():
    keras.utils.set_random_seed(0)
    _, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=8, d_norm="batch",
                               d_channels=(4, 8))
    with pytest.raises(errors.ConfigError, match="batch norm"):
        StepConfig(**R3).validate(discriminator=d)
    # Tested equal to one device on replicas, a mesh (tests/parallel/test_parallel_step.py)
    # and placement (test_parallel_placement.py); a pipeline runs neither.
    for engine in ("replicas", "mesh", "placement"):
        assert StepConfig(**R3).unsupported(engine) == [], engine
    refused = " ".join(StepConfig(**R3).unsupported("pipeline"))
    assert "loss='rpgan'" in refused and "penalty='r1_r2'" in refused
    # Not in those tests: two D updates per paired step, the finite difference.
    for knobs, words in (({"d_steps": 2}, "loss='rpgan' with d_steps=2"),
                         ({"penalty_fd_sigma": 0.01}, "penalty_fd_sigma=0.01")):
        assert StepConfig(**{**R3, **knobs}).unsupported("replicas") == []
        assert words in " ".join(StepConfig(**{**R3, **knobs}).unsupported("mesh"))


def test_a_paired_fake_takes_its_real_rows_label():
    """R3GAN calls G with the real batch's labels in both updates (Trainer.py:15,30)."""
    model = tiny_conditional()
    gs = model.gan_step
    seen = []
    fakes = gs.inputs.fakes

    def spy(z, labels, *args, **kwargs):
        seen.append(labels.numpy())
        return fakes(z, labels, *args, **kwargs)

    gs.inputs.fakes = spy
    labels = tf.constant([2, 0, 1, 2], tf.int32)
    gs.d_grads(REAL[:4], labels, rows(0, 4), 4, STEP, 0)
    gs.g_grads(rows(0, 4), 4, STEP, real=G_REAL[:4], real_labels=labels)
    np.testing.assert_array_equal(seen, [labels.numpy()] * 2)
    # An unpaired loss draws the fakes' labels instead.
    model.compile(g_optimizer=keras.optimizers.SGD(0.1),
                  d_optimizer=keras.optimizers.SGD(0.1), loss="non_saturating")
    model.gan_step.inputs.fakes = spy
    model.gan_step.d_grads(REAL[:4], labels, rows(0, 4), 4, STEP, 0)
    assert not np.array_equal(seen[-1], labels.numpy())


def test_held_out_losses_pair_fakes_with_the_reals_labels(monkeypatch):
    from tf_gan_scale.gan import step_evaluation
    model = tiny_conditional()
    seen = []
    call = step_evaluation.call_generator

    def spy(sampler, z, labels, **kwargs):
        seen.append(labels.numpy())
        return call(sampler, z, labels, **kwargs)

    monkeypatch.setattr(step_evaluation, "call_generator", spy)
    labels = tf.constant([2, 0, 1, 2], tf.int32)
    out = model.gan_step.evaluate({"x": REAL[:4], "label": labels})
    np.testing.assert_array_equal(seen[-1], labels.numpy())
    assert np.isfinite(float(out["g_loss"]))


def test_the_steps_penalty_is_the_gradient_through_its_augmentation():
    """The step's own D pass (not a stand-in forward): the penalty is ||d D(A(x)) / d x||^2
    at the clean x, not D's input gradient at what it saw, A(x) (with p = 1 the pipe's
    geometry, colour and cutout all change the gradient)."""
    gs = tiny(**R3, augment="r3gan", ada_p=1.0, ada_interval=0).gan_step
    got = []
    in_pass = gs.update_penalty.in_pass

    def spy(forward, clean, both_rows, labels, *args, **kwargs):
        out = in_pass(forward, clean, both_rows, labels, *args, **kwargs)
        got.append((clean, both_rows, labels, out[1]))
        return out

    gs.update_penalty.in_pass = spy
    gs.d_grads(REAL[:8], LABELS[:8], rows(0, 8), GB, STEP, 0)
    (clean, both_rows, labels, pen), = got
    np.testing.assert_array_equal(both_rows.numpy(), np.r_[0:8, GB:GB + 8])

    def sq(at_seen):
        x = tf.identity(clean)
        with tf.GradientTape() as tape:
            tape.watch(x)
            seen = gs.d_inputs(x, both_rows, STEP, 0)
            if at_seen:
                tape.watch(seen)
            with latents.example_rows(both_rows):
                total = tf.reduce_sum(gs.discriminate(seen, labels, training=True))
        grad = tape.gradient(total, seen if at_seen else x)
        s = tf.reduce_sum(tf.square(grad), [1, 2, 3])
        return (0.5 * (s[:8] + s[8:])).numpy()

    np.testing.assert_allclose(pen.numpy(), sq(False), rtol=1e-4)
    assert not np.allclose(pen.numpy(), sq(True), rtol=1e-2)  # What D saw: another.


def test_the_steps_d_loss_adds_the_in_pass_penalty():
    """D's loss share is the RpGAN term plus the penalty in_pass returned, both over the
    global batch: without the penalty it is the same model's loss with penalty="none"."""
    gs = tiny(**R3).gan_step
    plain = tiny(loss="rpgan").gan_step
    got = []
    in_pass = gs.update_penalty.in_pass

    def spy(*args, **kwargs):
        out = in_pass(*args, **kwargs)
        got.append(out[1])
        return out

    gs.update_penalty.in_pass = spy
    share = float(gs.d_grads(REAL[:8], LABELS[:8], rows(0, 8), GB, STEP, 0)[1])
    base = float(plain.d_grads(REAL[:8], LABELS[:8], rows(0, 8), GB, STEP, 0)[1])
    (pen,) = got
    assert float(tf.reduce_min(pen)) > 0
    np.testing.assert_allclose(share - base, float(tf.reduce_sum(pen)) / GB, rtol=1e-4)


def test_g_augments_its_reals_and_fakes_apart():
    """G's D pass keys the augmentation as D's update: reals by their rows, fakes by rows
    offset by the global batch (official: D(Augment(real)), D(Augment(fake)) apart)."""
    gs = tiny(**R3, augment="r3gan", ada_p=0.5, ada_interval=0).gan_step
    seen = []
    d_inputs = gs.d_inputs

    def spy(x, r, step, phase):
        seen.append((r.numpy(), int(phase)))
        return d_inputs(x, r, step, phase)

    gs.d_inputs = spy
    gs.g_grads(rows(4, 8), GB, STEP, real=G_REAL[:4], real_labels=LABELS[:4])
    ((got, phase),) = seen
    np.testing.assert_array_equal(got, np.r_[4:8, GB + 4:GB + 8])
    assert phase == latents.G_PHASE


def test_the_finite_difference_goes_through_the_same_augmentation():
    """With p = 1 the step's FD penalty is ((f(x + s e) - f(x)) / s)^2 per half, f = D o A
    with the SAME draws of A at x and x + s e: the directional derivative grad f . e."""
    sigma = 1e-3
    gs = tiny(**R3, augment="r3gan", ada_p=1.0, ada_interval=0,
              penalty_fd_sigma=sigma).gan_step
    got = []
    in_pass = gs.update_penalty.in_pass

    def spy(forward, clean, both_rows, labels, *args, **kwargs):
        out = in_pass(forward, clean, both_rows, labels, *args, **kwargs)
        got.append((forward, clean, both_rows, labels, out[1]))
        return out

    gs.update_penalty.in_pass = spy
    gs.d_grads(REAL[:8], LABELS[:8], rows(0, 8), GB, STEP, 0)
    (forward, clean, both_rows, labels, pen), = got
    e = latents.rows_normal(latents.key(gs.update_penalty.seed, STEP, latents.PENALTY_PHASE),
                            both_rows, list(clean.shape[1:]))
    x = tf.identity(clean)
    with tf.GradientTape() as tape:
        tape.watch(x)
        total = tf.reduce_sum(forward(x, both_rows, labels))
    directional = tf.reduce_sum(tape.gradient(total, x) * e, [1, 2, 3])
    sq = tf.square(directional).numpy()
    # Float32 differences and D's kinks: 3% measured; perturbed copies augmented with
    # other draws would miss by orders of magnitude (a difference of O(1) / sigma).
    np.testing.assert_allclose(pen.numpy(), 0.5 * (sq[:8] + sq[8:]), rtol=0.25)


def test_the_step_loop_feeds_a_paired_step_its_batches_per_step(one_device):
    """model.fit pulls batches_per_step = d_steps + 1 batches per step for a paired loss
    (step_function): D's, then G's own."""
    from helpers.tiny_gan import fit  # tests/ is on sys.path
    with one_device.scope():
        model = tiny(**R3)
    seen = []
    train = model.gan_step.train

    def spy(data, *args, **kwargs):
        seen.append(tf.nest.map_structure(lambda t: tuple(t.shape), data))
        return train(data, *args, **kwargs)

    model.gan_step.train = spy
    fit(model, one_device, 2)
    assert seen and all(isinstance(s, tuple) and len(s) == 2 for s in seen), seen
    assert int(model.g_optimizer.iterations.numpy()) == 2


def test_g_micro_batches_pair_each_fake_with_its_own_real():
    """accumulation_steps = 2: G's micro-batches (strided rows) read the real rows of
    their fakes, so their summed gradients are the whole batch's."""
    gs = tiny(**R3, accumulation_steps=2).gan_step
    whole = gs.g_grads(rows(0, GB), GB, STEP, real=G_REAL, real_labels=LABELS)[0]
    summed, shares, _ = gs.g_micro_batches(rows(0, GB), GB, STEP, G_REAL, LABELS)
    assert len(shares) == 2
    assert max_diff(whole, summed) < 2e-6
