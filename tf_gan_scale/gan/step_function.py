"""The traced step loop around `strategy.run`: what `GAN.make_train_function` and
`GAN.make_test_function` return.

GAN owns this loop rather than Keras: Keras 3's own loop cannot run a GAN under
multi-worker strategies (its scalar-log reduction, steps_per_execution > 1: see
docs/notes/keras3_distribute.md), and a GAN needs two optimizers anyway. Per call it runs
`steps_per_execution` GAN steps, each pulling `batches_per_step` batches from the distributed
iterator, checks before the step what can be checked on this worker (an even split, the
accumulation split: nothing is updated when it fails) and turns the step's verdicts into
one-line errors after it, before any callback runs.
"""

import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.gan import checks
from tf_gan_scale.gan.step import NONFINITE, NONFINITE_D, NONFINITE_G, UNEVEN, phase_due

_OWN = "_tf_gan_scale_own_step"


def own_step(method):
    """Marks a GAN method as the framework's own step (traced without autograph)."""
    setattr(method, _OWN, True)
    return method


def unconverted_if_own(model, name):
    """model.NAME, marked for autograph to leave alone if it is GAN's own.

    The step math is plain Python around TF ops: no Python `if`/`for` on a tensor, so
    autograph would change nothing in its graph, yet converting its ~90 functions costs
    seconds of CPU at every start of a process (docs/testing.md). What it calls runs
    unconverted too, a callable loss or penalty included, as Keras 3 runs every train_step
    (its trainer's `one_step_on_data` is `do_not_convert`): a Python `if` on a tensor
    there fails when traced, and `print` prints once, at trace time (use tf.cond,
    tf.print). A subclass's own train_step / test_step is still converted (with what it
    calls), as before."""
    method = getattr(model, name)
    if getattr(getattr(type(model), name), _OWN, False):
        return tf.autograph.experimental.do_not_convert(method)
    return method


def make_train_function(model):
    """model's train function: `steps_per_execution` GAN steps per call, each pulling
    `batches_per_step` batches from the distributed iterator and running `model.train_step` on
    every replica.

    It returns the running means of the loss trackers. They hold global losses on every
    replica, so they are read from the first local replica: no collective beyond the
    ones the step needs (Keras reduces the trackers once per epoch, for its logs). A step
    whose global loss or gradients, or G's or D's variables after it, are not finite
    raises errors.NonFiniteError after the call, before any callback (so no checkpoint of
    it) runs. Sets `model.step_function`, the traced loop (tests count its collectives).
    """
    strategy = model.distribute_strategy
    config = model.step_config
    # Batches per step: one per D update, plus G's own with a paired loss.
    per_step, accumulation = config.batches_per_step, config.accumulation_steps
    steps = int(model.steps_per_execution or 1)
    step_fn = unconverted_if_own(model, "train_step")
    lazy = []  # (phase function, interval) of StyleGAN2's regularization phases.
    if config.lazy_phases:
        gan_step = model.gan_step
        end_of_step = tf.autograph.experimental.do_not_convert(gan_step.end_of_step)
        lazy = [(tf.autograph.experimental.do_not_convert(phase), every)
                for phase, every in gan_step.lazy_phases()]
    # XLA compiles the per-replica step only: the iterator, the step loop and the
    # strategy's plumbing stay in the surrounding graph.
    if model.xla:
        step_fn = tf.function(step_fn, jit_compile=True)

    def one_step(iterator, first):
        """Runs one GAN step; returns (code, step) of the first non-finite one."""
        code, at = first
        before = tf.identity(model.step)
        batches = tuple(next(iterator) for _ in range(per_step))
        # The step's ops wait for the split check: nothing is updated when it fails.
        with tf.control_dependencies(
                checks.assert_even_split(strategy, batches)
                + checks.assert_accumulation_split(strategy, batches, accumulation)):
            out = strategy.run(step_fn, args=(batches if per_step > 1 else batches[0],))
        new = strategy.experimental_local_results(out[NONFINITE])[0]
        for phase, every in lazy:
            # StyleGAN2's lazy phases, after the main D and G updates of step `before`.
            # The branch is taken here, in cross-replica context, around strategy.run:
            # a tf.cond inside the replica function cannot hold the all-reduces
            # (MirroredStrategy's merge_call), and every worker takes the same branch.
            with tf.control_dependencies([new]):
                phase_code = tf.cond(
                    phase_due(before, every),
                    lambda phase=phase: strategy.experimental_local_results(strategy.run(
                        phase, args=(batches[0], before)))[0][NONFINITE],
                    lambda: tf.constant(0, tf.int32))
            new = tf.where(new > 0, new, phase_code)
        if lazy:  # Then the EMA, after every phase (GanStep.end_of_step).
            with tf.control_dependencies([new]):
                done = strategy.experimental_local_results(
                    strategy.run(end_of_step, args=(before,)))[0]
            new = tf.where(new > 0, new, done)
        fresh = tf.logical_and(code == 0, new > 0)
        return tf.where(fresh, new, code), tf.where(fresh, before, at)

    @tf.function
    def compiled(iterator):
        first = (tf.constant(0, tf.int32), tf.constant(-1, tf.int64))
        if steps == 1:
            first = one_step(iterator, first)
        else:
            for _ in tf.range(steps):
                first = one_step(iterator, first)
        logs = strategy.run(lambda: {m.name: m.result() for m in model.metrics})
        logs = {k: strategy.experimental_local_results(v)[0] for k, v in logs.items()}
        return logs, first

    def train_function(iterator):
        try:
            logs, (code, at) = compiled(iterator)
        except tf.errors.InvalidArgumentError as e:
            if checks.ACCUMULATION_TAG in e.message:
                # "assertion failed: [TAG] [16]": the rows follow the tag.
                rows = e.message.split(checks.ACCUMULATION_TAG)[1].split("[")[1]
                rows = rows.split("]")[0]
                raise errors.ConfigError(
                    f"accumulation_steps={accumulation} does not divide the per-replica "
                    f"batch of {rows} rows; valid: a divisor of {rows}") from None
            if checks.UNEVEN_TAG not in e.message:
                raise
            raise errors.UnevenBatchError(checks.uneven_message(
                strategy, "before generator step %d (nothing was updated)"
                % (int(model.step.numpy()) + 1))) from None
        if int(code) == UNEVEN:
            raise errors.UnevenBatchError(checks.uneven_message(
                strategy, f"in generator step {int(at) + 1} (its update used a wrong "
                f"global batch; nothing of it was saved)"))
        if int(code):
            network = {NONFINITE_D: "discriminator", NONFINITE_G: "generator"}[int(code)]
            raise errors.NonFiniteError(
                f"non-finite {network} loss, gradients or weights in generator step "
                f"{int(at) + 1}; training stopped before saving it")
        return logs

    model.step_function = compiled
    return train_function


def make_test_function(model):
    """model's test function: `steps_per_execution` evaluation batches per call (fewer at
    the end of the data), each through `model.test_step` on every replica; logs read on
    the first local replica (the values are global). `model.eval_offset` counts the
    evaluation examples seen in this `evaluate` call (GAN.evaluate resets it)."""
    strategy = model.distribute_strategy

    @tf.function
    def compiled(iterator, offset):
        out = strategy.run(unconverted_if_own(model, "test_step"),
                           args=(next(iterator), offset))
        return {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}

    def test_function(iterator):
        logs = None
        for _ in range(int(model.steps_per_execution or 1)):
            try:
                logs = compiled(iterator, tf.constant(model.eval_offset, tf.int32))
            except (tf.errors.OutOfRangeError, StopIteration):
                if logs is None:
                    raise  # Keras' loop ends the evaluation on it.
                break
            model.eval_offset += int(logs.pop("examples"))
        return logs

    return test_function
