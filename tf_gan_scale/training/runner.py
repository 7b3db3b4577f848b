"""run(config, workdir, strategy): one training run with Keras `fit`, resumable.

Under a tf.distribute strategy (one device, mirrored replicas, workers, TPU) or a
placement of G and D on two devices. Only the chief (worker 0) writes the workdir
(`workdir.py` lists what it holds); other workers keep their checkpoints in a temporary
directory that is removed when they finish. Everything that can fail on user input
happens in `prepare.prepare`, before the first write.
"""

import math
import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from tf_gan_scale import data, distribute
from tf_gan_scale.cluster import rank_log
from tf_gan_scale.training import build, callbacks, checkpoints, prepare, record, run_lock


def run(config, workdir, strategy, *, tfds_data_dir=None, verbose="auto", allowed_changes=()):
    """Trains (or resumes) to config.train.num_steps generator steps. A resume may change
    the recorded config's math only in `allowed_changes` (record.check).

    Returns:
        The GAN model after training.
    """
    # One run per workdir (run_lock.py): the chief holds it from before the workdir is
    # read to the end of the run, however it ends; the other workers follow its decision.
    with run_lock.Claim(workdir, chief=distribute.is_chief(strategy),
                        agree=run_lock.across_workers(strategy)) as claim:
        return _run(config, workdir, strategy, claim.acquire, tfds_data_dir, verbose,
                    allowed_changes)


def _run(config, workdir, strategy, claim, tfds_data_dir, verbose, allowed_changes):
    t = config.train
    p = prepare.prepare_run(config, workdir, num_replicas=strategy.num_replicas_in_sync,
                        scope=strategy.scope(), placement_spec=build.placement_of(config),
                        tfds_data_dir=tfds_data_dir, allowed_changes=allowed_changes,
                        claim=claim)
    model, source, start = p.model, p.source, p.start
    checkpoints.agree(strategy, start, workdir)  # Every worker resumes the same step.
    model.steps_per_execution = build.steps_per_execution(config, start)  # Before any step.
    chief = distribute.is_chief(strategy)
    score = None
    if config.get("eval") is not None and config.eval.every > 0:
        score = prepare.make_scorer(config, model, source, strategy, chief=chief)
    # --- nothing above wrote to the workdir (but run.lock, removed at any exit) --------
    rank_log.open_file(workdir)  # In a cluster: logs/<task>.log, from every task.
    logging.info("%s at step %d of %d; %d replicas, global batch %d, data %s (%d examples), "
                 "%d steps per call", f"resumed {p.restored}" if p.restored else "starting",
                 start, t.num_steps, strategy.num_replicas_in_sync, t.global_batch_size,
                 source.name, source.num_examples, model.steps_per_execution)
    if chief:  # Before any checkpoint manager: damaged files out of its rotation.
        checkpoints.set_aside(os.path.join(workdir, "checkpoints"), p.damaged, p.restored)
    if start >= t.num_steps:
        logging.info("already at step %d >= num_steps %d; nothing to do", start, t.num_steps)
        return model
    # Only the chief writes the workdir. Saving a checkpoint is a step every worker takes
    # together, so the others save into a private temporary directory, removed at the end.
    out_dir = workdir if chief else tempfile.mkdtemp(prefix="tf_gan_scale_worker_")
    try:
        _train(model, config, source, p.input, strategy, p.checkpoint, out_dir, chief,
               start, verbose, score, workdir, p.segments)
    finally:
        if not chief:
            shutil.rmtree(out_dir, ignore_errors=True)
    return model


def _first_images(source, num):
    """The first `num` examples of an in-memory image source, [N, H, W, C] in [-1, 1]
    (None for vectors or streamed sources): the real grid TensorBoard shows."""
    if source.arrays is None or len(source.shape) != 3:
        return None
    return data.sources.to_float(source.arrays["x"][:num]).numpy()


def callbacks_for(config, source, strategy, checkpoint, out_dir, chief, start, verbose,
               score=None, workdir=None, manager_fn=checkpoints.Manager,
               segments=None):
    """The run's callbacks: stop, checkpoints, preemption; on the chief samples,
    TensorBoard and the progress line; scores on every worker. The chief writes the
    record (run.json) first, with `segments` (prepare.Prepared's).

    strategy: what Preemption reads of the cluster (its `cluster_resolver`, if any).
    manager_fn(checkpoint, directory, max_to_keep): the checkpoint managers' type."""
    t = config.train
    os.makedirs(out_dir, exist_ok=True)
    manager = manager_fn(checkpoint, os.path.join(out_dir, "checkpoints"),
                         max_to_keep=t.keep_checkpoints)
    cbs = [callbacks.StopAtStep(t.num_steps), callbacks.Checkpoint(manager, t.checkpoint_every),
           callbacks.Preemption(strategy, manager)]
    writer = None
    if chief:
        record.write(out_dir, config, source.shape, source, segments=segments)
        writer = tf.summary.create_file_writer(os.path.join(out_dir, "logs"))
        reference = None
        if source.arrays is not None and len(source.shape) == 1 and source.shape[0] == 2:
            reference = source.arrays["x"][:2000]
        cbs += [callbacks.Samples(os.path.join(out_dir, "samples"), t.sample_every,
                                  seed=config.seed, writer=writer, reference=reference),
                callbacks.Summaries(writer, t.log_every, t.global_batch_size,
                                    real=_first_images(source, 64))]
    if score is not None:  # On every worker: scoring runs collectives.
        cbs.append(callbacks.Evaluate(
            config.eval.every, score, writer=writer,
            path=os.path.join(out_dir, "metrics.jsonl") if chief else None,
            history=os.path.join(workdir, "metrics.jsonl"),
            best=config.eval.best, best_manager=manager_fn(
                checkpoint, os.path.join(out_dir, "checkpoints", "best"), max_to_keep=1)))
    # Keras "epochs" are blocks of log_every steps. Keras' bar would show every block as
    # log_every steps (also a short last one or a resumed first one): ours counts steps.
    if chief and verbose:
        cbs.append(callbacks.Progress(start, t.num_steps, t.log_every,
                                      verbose=1 if verbose == "auto" else verbose))
    return cbs


def _train(model, config, source, input_fn, strategy, checkpoint, out_dir, chief, start,
           verbose, score=None, workdir=None, segments=None):
    t = config.train
    cbs = callbacks_for(config, source, strategy, checkpoint, out_dir, chief, start, verbose,
                     score, workdir, segments=segments)
    per_epoch = t.log_every
    first_epoch = start // per_epoch
    last_epoch = math.ceil(t.num_steps / per_epoch)
    model.fit(data.distribute(input_fn, strategy), initial_epoch=first_epoch, epochs=last_epoch,
              steps_per_epoch=per_epoch, callbacks=cbs, verbose=0, shuffle=False)
    logging.info("finished at step %d", int(model.step.numpy()))
