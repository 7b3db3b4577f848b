"""Cross-replica arithmetic: the single place where losses meet the replica count.

Gradients are SUMMED across replicas (`apply_global_gradients`; Keras 3 optimizers do
the same inside `apply_gradients`). A per-replica loss must therefore be
the replica's share of the global mean: sum of its per-example losses divided by the
*global* batch size. Summed over replicas that is exactly the loss a single device would
compute on the whole global batch, so gradients match too.
"""

import contextlib
import threading

import keras
import tensorflow as tf


def num_replicas():
    """Replicas in sync (all workers), from either replica or cross-replica context."""
    ctx = tf.distribute.get_replica_context()
    if ctx is not None:
        return ctx.num_replicas_in_sync
    return tf.distribute.get_strategy().num_replicas_in_sync


def replica_id():
    """This replica's index in [0, num_replicas) across all workers (0 outside a strategy)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        return 0
    return ctx.replica_id_in_sync_group


def any_worker(strategy, flag):
    """Whether the host bool `flag` is True on any worker of `strategy`, known on every
    worker: a decision one task makes (a cache miss, a refusal) that all must follow. One
    all-reduce across workers; none where this process holds every replica (they share
    its flag) or under the default strategy. A collective: every worker calls it at the
    same point."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # The default strategy ("unsupported"): one process.
        return bool(flag)
    if len(devices) == strategy.num_replicas_in_sync:
        return bool(flag)
    value = tf.constant(float(flag))

    @tf.function(autograph=False)
    def reduce():
        # A sum over every replica of every worker: > 0 iff some worker's flag is set.
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, value))

    return float(strategy.experimental_local_results(reduce())[0]) > 0


def global_batch_size(per_replica_batch):
    """Global batch from a per-replica batch size (batches are split evenly: drop_remainder)."""
    return per_replica_batch * num_replicas()


def global_mean(per_example, global_batch):
    """This replica's share of the global-batch mean of `per_example` ([B] -> scalar).

    Divides by the global batch exactly once; the optimizer's cross-replica SUM of
    gradients then yields the gradient of the true global mean.
    """
    per_example = tf.convert_to_tensor(per_example)
    return tf.reduce_sum(per_example) / tf.cast(global_batch, per_example.dtype)


def _layout():
    """(workers, replicas per worker) of the current strategy; (1, 1) outside one."""
    ctx = tf.distribute.get_replica_context()
    strategy = tf.distribute.get_strategy()
    n = num_replicas()
    if ctx is None or n == 1:
        return 1, 1
    if isinstance(strategy, tf.distribute.TPUStrategy):
        # worker_devices lists every core of every host, but the input pipeline shards per
        # host as MultiWorkerMirroredStrategy shards per worker: hosts are the workers
        # here. (By reading TensorFlow's input code; no TPU to test on.)
        hosts = strategy.extended.num_hosts
        return hosts, n // hosts
    local = len(strategy.extended.worker_devices)
    return n // local, local


def global_rows(per_replica_batch):
    """Global indices [per_replica_batch] (int32) of the rows of its global batch that the
    input pipeline hands this replica.

    `experimental_distribute_dataset` rebatches each global batch of B*N rows into N
    chunks of B rows and gives worker w every W-th chunk (auto-sharding by data), and its
    k-th local replica (replica id w*K + k) the k-th of them: chunk k*W + w. With one
    worker that is chunk r for replica r; with 2 workers x 2 replicas, worker 0's
    replicas hold rows [0:B] and [2B:3B]. Latents, penalty noise and dropout masks use
    these indices, so the example paired with row i of the real batch is the one a
    single device pairs with it (tests/integration/test_equivalence.py checks it with 2 workers x 2
    replicas against the pipeline's real rows).
    """
    workers, local = _layout()
    r = tf.cast(replica_id(), tf.int32)
    chunk = (r % local) * workers + r // local
    b = tf.cast(per_replica_batch, tf.int32)
    return chunk * b + tf.range(b)


def global_rows_uneven(per_replica_batch):
    """`global_rows` for batches that may split unevenly over the replicas (the last,
    partial batch of a finite evaluation set): every replica's row count is gathered
    (ONE collective), and a replica's rows start after all chunks the pipeline orders
    before its own (chunk k*W + w, as in `global_rows`).

    Returns (rows [per_replica_batch] int32, global batch: int32 scalar, the same on
    every replica). For evaluation, not for the training step: there batches split
    evenly (checked) and `global_rows` needs no collective. Checked against the
    pipeline's real rows on one worker (tests/gan/test_gan.py); for several workers the
    chunk order of a partial batch follows TensorFlow's rebatching (by reading, untested).
    """
    b = tf.cast(per_replica_batch, tf.int32)
    ctx = tf.distribute.get_replica_context()
    n = num_replicas()
    if ctx is None or n == 1:
        return tf.range(b), b
    sizes = ctx.all_gather(tf.reshape(b, [1]), axis=0)  # [n], in replica-id order.
    workers, local = _layout()
    ids = tf.range(n)
    chunk = (ids % local) * workers + ids // local  # The chunk each replica holds.
    mine = tf.gather(chunk, tf.cast(replica_id(), tf.int32))
    offset = tf.reduce_sum(tf.where(chunk < mine, sizes, 0))
    return offset + tf.range(b), tf.reduce_sum(sizes)


@tf.autograph.experimental.do_not_convert  # Plain Python around the ops; keep it so.
def apply_global_gradients(optimizer, grads, variables, riders=(), pack_bytes=0,
                           nan_to_num=False):
    """The gradient all-reduce of a step, for one network: ONE fused SUM of all its
    gradients (and of a few scalars riding along) across replicas and workers, then
    `optimizer.apply` on the global sums.

    Keras' TensorFlow optimizers would all-reduce inside `apply`, but only after their
    clipping (`clipnorm`, `global_clipnorm`, `clipvalue`) and, for `LossScaleOptimizer`,
    after its inf/NaN check, so both acted on one replica's local gradients (see
    docs/notes/keras3_distribute.md). Reducing first makes clipping and overflow checks see the
    same global gradients on every replica, as on one device; the optimizer's own
    all-reduce is switched off for this call (the gradients already are the sums). The
    riders (this replica's loss share, its example count) are summed in the same
    collective: logging the global loss and checking the batch split cost none.

    Args:
        optimizer: a Keras optimizer (or LossScaleOptimizer), built on `variables`.
        grads: list of this replica's gradients (None for unconnected variables).
        variables: the matching trainable variables.
        riders: scalars to sum across replicas in the same collective (cast to float32:
            one dtype keeps it one collective), e.g. the loss share and the row count.
        pack_bytes: 0 for one all-reduce of everything; else the gradients are all-reduced
            in packs of about this many bytes (`CommunicationOptions.bytes_per_pack`,
            honoured by MultiWorkerMirroredStrategy's collectives), last layers first:
            backpropagation produces their gradients first, and collectives are issued
            in list order, so the first packs can travel while earlier layers' gradients
            are still being computed. Still one logical reduction before the optimizer,
            its clipping and the finite check.
        nan_to_num: replace non-finite GLOBAL gradients (NaN -> 0, +-inf -> +-1e5) before
            the update, as StyleGAN2-ADA's training loop does (misc.nan_to_num after the
            all-reduce; its float16 blocks run without loss scaling). Identical on every
            replica, as it acts on the sums. Not with a LossScaleOptimizer (it would hide
            the overflows its scale is steered by: refused by `training.prepare`).
    Returns:
        (summed riders: list of float32 scalars, finite, norm, skipped), identical on
        every replica: `norm` is the global L2 norm of the (summed, unscaled) gradients,
        for logging. Without loss scaling, `finite` is True when the global gradients
        and riders are all finite and `skipped` is False. With a LossScaleOptimizer,
        non-finite global gradients are an overflow, not an error: the optimizer skips
        the update (on every replica, as it sees the global gradients) and halves its
        scale, `skipped` is True and `finite` True; `finite` is False only for finite
        gradients with non-finite riders (a loss the scaler cannot explain). A skipped
        update still advances the optimizer's `iterations` by one, as Keras 2's did, so
        the step counter (G's iterations), the data position and the latents of later
        steps do not depend on how many updates overflowed.
    Call in replica context (inside `strategy.run`) or without a strategy.
    """
    ctx = tf.distribute.get_replica_context()
    live = [i for i, g in enumerate(grads) if g is not None]
    extra = [tf.cast(r, tf.float32) for r in riders]
    if ctx is not None and ctx.num_replicas_in_sync > 1 and (live or extra):
        # A list all-reduces as one batch: packed into one collective by MWMS (or into
        # packs of pack_bytes, in reverse layer order: see Args).
        options = None
        if pack_bytes:
            live = live[::-1]
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=int(pack_bytes))
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                 [grads[i] for i in live] + extra, options=options)
        grads = list(grads)
        for i, g in zip(live, reduced):
            grads[i] = g
        extra = reduced[len(live):]
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if nan_to_num:
        grads = list(grads)
        for i in live:
            g = tf.where(tf.math.is_nan(grads[i]), tf.zeros_like(grads[i]), grads[i])
            grads[i] = tf.where(tf.math.is_inf(g), tf.sign(g) * tf.constant(1e5, g.dtype), g)
    # Global values, so every replica (and worker) reaches the same verdict.

    def all_finite(values):
        checks = [tf.reduce_all(tf.math.is_finite(v)) for v in values]
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)

    grads_finite = all_finite([grads[i] for i in live])  # What the scaler checks.
    riders_finite = all_finite(extra)
    if scaled:
        skipped = tf.logical_not(grads_finite)
        finite = tf.logical_or(riders_finite, skipped)
    else:
        skipped = tf.constant(False)
        finite = tf.logical_and(grads_finite, riders_finite)
    # The scale the gradients carry: read before `apply` may halve or double it.
    scale = tf.identity(tf.cast(optimizer.scale_loss(1.0), tf.float32)) if scaled else None
    with _already_reduced(getattr(optimizer, "inner_optimizer", optimizer)):
        optimizer.apply(grads, variables)
    if scaled:
        optimizer.iterations.assign_add(tf.cast(skipped, optimizer.iterations.dtype))
    # Global gradients, so the norm costs no collective (and is the same everywhere).
    norm = tf.linalg.global_norm([tf.cast(grads[i], tf.float32) for i in live]) if live \
        else tf.constant(0.0)
    if scaled:
        norm = norm / scale
    return list(extra), finite, norm, skipped


_PASSTHROUGH_LOCK = threading.Lock()
_PASSTHROUGH_USERS = {}


@contextlib.contextmanager
def _already_reduced(optimizer):
    """While tracing inside, `optimizer`'s all-reduce passes gradients through.

    `_all_reduce_sum_gradients` is where Keras' TensorFlow optimizer reduces. It is
    shadowed in the instance __dict__ (Keras' __setattr__ would track the value), and
    reference-counted: MirroredStrategy traces its replicas in parallel threads.
    """
    key = id(optimizer)
    with _PASSTHROUGH_LOCK:
        if not _PASSTHROUGH_USERS.get(key):
            vars(optimizer)["_all_reduce_sum_gradients"] = list
        _PASSTHROUGH_USERS[key] = _PASSTHROUGH_USERS.get(key, 0) + 1
    try:
        yield
    finally:
        with _PASSTHROUGH_LOCK:
            _PASSTHROUGH_USERS[key] -= 1
            if not _PASSTHROUGH_USERS[key]:
                del _PASSTHROUGH_USERS[key]
                vars(optimizer).pop("_all_reduce_sum_gradients")
