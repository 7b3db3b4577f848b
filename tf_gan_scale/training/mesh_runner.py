"""run(config, workdir, dims): a training run on a DTensor mesh, in one process or as one
of several DTensor clients (mesh.initialize), resumable like training.run.

The same config, data order, checkpoints and workdir as training.run, so a run moves
between a mesh and tf.distribute by resuming. G's and D's weights are split by the layout
policy (layouts.py, config.parallel.layouts); each step is MeshTrainer's; samples and
scores come from a host copy of G (step.HostView).

Several clients: every client runs this same loop on the same global batches, each
reading only the rows of its own devices (MeshTrainer.batches); what communicates
(steps, checkpoints, the host copy of G) runs on all clients in the same order. Client 0
is the chief and alone writes the workdir: run.json, samples, TensorBoard, metrics and the
checkpoint index. A checkpoint is one DTensor save that every client takes part in (each
writes the shards it holds, the chief merges them), so the workdir must be one shared
directory, as for multi-worker runs (it is read back by every client on resume).
"""

import os

import tensorflow as tf
from absl import logging

from tf_gan_scale import errors
from tf_gan_scale.cluster import rank_log
from tf_gan_scale.gan import StepConfig
from tf_gan_scale.parallel import layouts
from tf_gan_scale.parallel import mesh as mesh_lib
from tf_gan_scale.parallel import step as step_lib
from tf_gan_scale.training import build, callbacks, checkpoints, prepare
from tf_gan_scale.training import run_lock, runner


def check_config(config):
    """What the mesh cannot run yet, from the config alone (before data is read): one
    ConfigError naming every such setting: the step's knobs whose StepConfig metadata
    leaves the mesh out, per-replica batch norm. MeshTrainer checks the built GAN
    again."""
    t, m = config.train, config.model
    bad = StepConfig.from_train(t).unsupported("mesh")
    # Batch norm on a mesh is over the global batch (DTensor's SPMD moments), or over
    # groups of batch shards (sync_bn_group_size; MeshTrainer). Keras' per-replica
    # BatchNormalization has no replicas to be local to: sync_bn_group_size=1 is the
    # per-shard statistics.
    if not m.get("sync_bn", True):
        bad.append(f"config.model.sync_bn={m.get('sync_bn', True)} (per-shard statistics: "
                   f"sync_bn_group_size=1)")
    step_lib.refuse(bad)


class SharedCheckpoints:
    """A non-chief client's side of a tf.train.CheckpointManager: `save` writes this
    client's shards of the checkpoint the chief saves at the same step and path (a
    DTensor save is collective), and records nothing (the chief keeps the index and
    removes old checkpoints)."""

    def __init__(self, checkpoint, directory, max_to_keep=None):
        del max_to_keep  # The chief's manager keeps count.
        self.checkpoint, self.directory = checkpoint, directory
        self.latest_checkpoint = None

    def save(self, checkpoint_number):
        path = os.path.join(self.directory, f"ckpt-{int(checkpoint_number)}")
        self.latest_checkpoint = self.checkpoint.write(path)
        return self.latest_checkpoint


class SyncHost(callbacks.Every):
    """Refreshes the host copy of G (`HostView.sampler`, a gather over the mesh) at the
    steps the chief's sample grids do: on a client that draws none, so that every client
    takes part in the same gathers."""

    at_end = True

    def fire(self, step, logs):
        self.model.sampler  # noqa: B018 -- the read is the refresh.


def _chiefs_best(score, mesh, key):
    """`score` whose scores[key] is the chief's on every client."""
    def agreed():
        scores = score()
        scores[key] = mesh_lib.from_chief(mesh, scores[key])
        return scores

    return agreed


def callbacks_for(config, source, mesh, checkpoint, workdir, start, verbose, score=None,
                  segments=None):
    """training.run's callbacks for this client of a mesh run: the chief's write the workdir
    and record checkpoints; another client's write its shards of the same checkpoints
    (SharedCheckpoints) and refresh G's host copy where the chief's grids do (SyncHost),
    so every client takes part in every collective, in the same order. The best
    checkpoint is chosen by the chief's score on every client (mesh.from_chief): scores
    computed apart could differ (another kernel order) and only some clients would save."""
    chief = mesh_lib.clients()[0] == 0
    if score is not None and config.eval.best:
        score = _chiefs_best(score, mesh, config.eval.best)
    cbs = runner.callbacks_for(
        config, source, mesh_lib.cluster(), checkpoint, workdir, chief, start, verbose,
        score, workdir, manager_fn=checkpoints.Manager if chief else SharedCheckpoints,
        segments=segments)
    if not chief:  # The chief's sample grids refresh the host copy of G at these steps.
        cbs.append(SyncHost(config.train.sample_every))
    return cbs


def run(config, workdir, dims, *, tfds_data_dir=None, verbose="auto", allowed_changes=()):
    """Trains (or resumes) to config.train.num_steps on a mesh of dims {"batch": B,
    "model": M} over this process's devices, or every client's (mesh.initialize). A
    resume may change the recorded config's math only in `allowed_changes`.

    Returns:
        The MeshTrainer after training.
    """
    mesh = mesh_lib.make(dims)  # First: a mesh that does not fit the devices.
    # One run per workdir (run_lock.py), as training.run: client 0 holds it from before
    # the workdir is read to the end of the run; a collective tells the others.
    with run_lock.Claim(workdir, chief=mesh_lib.clients()[0] == 0,
                        agree=lambda refused: mesh_lib.from_chief(mesh, refused) > 0) as claim:
        return _run(config, workdir, dims, mesh, claim.acquire, tfds_data_dir, verbose,
                    allowed_changes)


def _run(config, workdir, dims, mesh, claim, tfds_data_dir, verbose, allowed_changes):
    t = config.train
    client, num_clients = mesh_lib.clients()
    chief = client == 0
    # The global batch splits over "batch". Built with no strategy (the default one):
    # nothing is mirrored; restored into plain variables, then moved onto the mesh, so a
    # checkpoint is the same whichever topology wrote it.
    p = prepare.prepare_run(config, workdir, num_replicas=dims[mesh_lib.BATCH],
                        check=check_config, tfds_data_dir=tfds_data_dir,
                        allowed_changes=allowed_changes, claim=claim)
    model, source, start, restored = p.model, p.source, p.start, p.restored
    strategy = tf.distribute.get_strategy()
    low, high = mesh_lib.spread(mesh, start)  # Every client must resume the same run.
    if low != high:
        raise errors.ConfigError(
            f"the clients restored different steps ({int(low)} to {int(high)}; client "
            f"{client}: {start}) from --workdir={workdir}; valid: one directory that every "
            f"client shares (NFS, a volume claim, gs://)")
    nets = (model.generator, model.discriminator)
    plan = layouts.plan(nets, dims, tuple(tuple(o) for o in config.parallel.layouts))
    trainer = step_lib.MeshTrainer(model, mesh, plan)
    host_g, _ = build.build_networks(config, source.shape, model.num_classes)
    view = step_lib.HostView(trainer, host_g)
    score = None
    if config.get("eval") is not None and config.eval.every > 0:
        score = prepare.make_scorer(config, view, source, strategy, chief=chief)
    # --- nothing above wrote to the workdir (but run.lock, removed at any exit) --------
    rank_log.open_file(workdir)  # In a cluster: logs/<task>.log, from every task.
    split = sum(any(spec) for spec in plan.values())
    logging.info("%s at step %d of %d; mesh batch:%d,model:%d (%s, %d process%s), %d of "
                 "%d weights split, global batch %d, data %s (%d examples)",
                 f"resumed {restored}" if restored else "starting", start, t.num_steps,
                 dims[mesh_lib.BATCH], dims[mesh_lib.MODEL], mesh.device_type(),
                 num_clients, "es" if num_clients > 1 else "", split, len(plan),
                 t.global_batch_size, source.name, source.num_examples)
    if chief:  # Before any checkpoint manager: damaged files out of its rotation.
        checkpoints.set_aside(os.path.join(workdir, "checkpoints"), p.damaged, restored)
    if start >= t.num_steps:
        logging.info("already at step %d >= num_steps %d; nothing to do", start, t.num_steps)
        return trainer
    cbs = callbacks_for(config, source, mesh, p.checkpoint, workdir, start, verbose, score,
                        p.segments)
    for cb in cbs:
        cb.set_model(view)
    for cb in cbs:
        cb.on_train_begin()
    batches = trainer.batches(p.input)
    # One GAN step per iteration (d_steps global batches, then G's own with a paired
    # loss); the callbacks see each step, as Keras' fit with one step per call.
    while trainer.step < t.num_steps and not view.stop_training:
        feed = [next(batches) for _ in range(trainer.gan.step_config.batches_per_step)]
        d_loss, g_loss = trainer.train_step(feed)
        for cb in cbs:
            cb.on_train_batch_end(trainer.step - 1, {"d_loss": d_loss, "g_loss": g_loss})
    for cb in cbs:
        cb.on_train_end()
    logging.info("finished at step %d", trainer.step)
    return trainer
