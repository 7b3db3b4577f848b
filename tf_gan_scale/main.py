"""The training binary.

    python -m tf_gan_scale.main --config=experiments/digits.py --workdir=DIR \
        [--strategy=auto|one_device|mirrored|multi_worker_mirrored|tpu] \
        [--num_cpu_devices=N] [--num_gpus=N] [--tpu=NAME] [--config.train.num_steps=...] \
        [--collective=auto|ring|nccl] [--cluster_resolver=tf_config|slurm] [--peer_timeout_s=S] \
        [--startup_timeout_s=S]
    python -m tf_gan_scale.main --config=... --workdir=DIR --mesh=batch:B,model:M \
        [--num_cpu_devices=N]     # model / hybrid parallelism on a DTensor mesh
    python -m tf_gan_scale.main --config=... --workdir=DIR --placement=g:0,d:1 \
        [--num_cpu_devices=2]     # G and D on two devices of one process

One --config file per run (a second one is bad input); --strategy=auto trains on every task
of a cluster described by TF_CONFIG or a Slurm job step (see distribute.py).
ParameterServerStrategy (--strategy=parameter_server, or a TF_CONFIG with ps tasks) is
refused as bad input, with the reason (docs/multi_worker.md). --mesh (or
config.parallel.mesh) trains on a DTensor mesh instead (tf_gan_scale/parallel/): of
this process's devices, or of every process of a cluster that DTENSOR_JOBS, TF_CONFIG or a
Slurm job step describes (one DTensor client each); it excludes the tf.distribute flags. Checkpoints are the same
either way: a run resumes on the other.

Re-running the same command on the same workdir resumes from the latest checkpoint. A
resume whose config changes the math of those checkpoints (model, seed, loss, optimizers,
batch, data, precision, ...) is refused naming each key and both values, unless
--allow_changes names it: then run.json records the change as a new segment
(training/record.py); run length and cadences change freely. While another run uses the
workdir, a run exits 2 with one line naming it (training/run_lock.py).
Bad input exits with status 2 and one line on stderr. SIGTERM saves a checkpoint (on every
worker, at one step) and exits 143; a lost multi-worker peer exits 1 with one line naming it,
and other unavailable/aborted/deadline errors (storage, input) exit 1 with
`error: ErrorType: first line`. A NaN or inf global loss or gradient stops the run with
exit 1 and one line naming the step and the network; the latest checkpoint stays the last
good one. A latest checkpoint that cannot be read (truncated, missing, corrupt files) is
passed over for the newest readable one with one warning line, its files kept in
checkpoints/damaged/; none readable exits 2; a checkpoint that does not read back right
after its save exits 1 with one line (training/checkpoints.py). A cluster (workers or
DTensor clients) that does not form within
--startup_timeout_s exits 1 with one line naming the tasks that did not connect; SIGTERM or
SIGINT while waiting for it exits 143 at once. Either way nothing is written.
In a cluster each task's log lines start with its name ("[worker 1] ", "[client 1] ") and,
once its input is validated, also go to WORKDIR/logs/<task>.log; the lost-peer and
non-finite lines name the file with the failing task's last lines (cluster/rank_log.py).
"""

import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tf_gan_scale import perf  # noqa: E402

perf.tune_malloc()  # Before TensorFlow allocates anything; see perf.py.

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

import tensorflow as tf  # noqa: E402

from tf_gan_scale import cli, distribute, errors  # noqa: E402
from tf_gan_scale.cluster import env as cluster_env  # noqa: E402
from tf_gan_scale.cluster import mesh_spec, rank_log, startup  # noqa: E402
from tf_gan_scale.cluster.launch import PREEMPTED_EXIT_CODE  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "ml_collections config file, e.g. experiments/digits.py.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory: checkpoints, samples, logs.")
flags.DEFINE_string("strategy", "auto", f"One of {', '.join(distribute.STRATEGIES)}.")
flags.DEFINE_integer("num_gpus", None, "Use the first N local GPUs (default: all).")
flags.DEFINE_integer("num_cpu_devices", None, "Split the CPU into N logical devices.")
flags.DEFINE_string("tpu", None, "TPU name, 'local' or grpc://HOST:PORT (--strategy=tpu).")
flags.DEFINE_string("collective", "auto", "Multi-worker all-reduce: "
                    f"{', '.join(distribute.COLLECTIVES)} (auto: NCCL with GPUs, else RING).")
flags.DEFINE_string("cluster_resolver", "tf_config", "Multi-worker cluster from: "
                    f"{', '.join(distribute.CLUSTER_RESOLVERS)}.")
flags.DEFINE_float("peer_timeout_s", None, "Multi-worker: a worker silent this long is lost "
                   "and the others fail naming it (default: TensorFlow's, about 10 s).")
flags.DEFINE_float("startup_timeout_s", startup.DEFAULT_TIMEOUT_S, "Several workers or "
                   "DTensor clients: how long each waits for the others to start; then it "
                   "exits naming the tasks that did not connect.")
flags.DEFINE_string("tfds_data_dir", None, "TensorFlow Datasets data directory.")
flags.DEFINE_string("mesh", None, "batch:B,model:M: train on a DTensor mesh of B x M devices "
                    "(weights split over 'model'); overrides config.parallel.mesh.")
flags.DEFINE_string("placement", None, "g:I,d:J: G on device I, D on device J of this "
                    "process; or stages:K[,recompute:1]: G and D each in K pipeline stages "
                    "on devices 0..K-1, GPipe schedule (micro-batches: "
                    "config.train.accumulation_steps); overrides config.parallel.placement.")
flags.DEFINE_list("allow_changes", [], "On resume: config keys whose new value is intended "
                  "although it changes the math of the checkpoints (e.g. seed,train.d_"
                  "optimizer.learning_rate; 'all': every key); recorded in run.json.")
FLAGS = flags.FLAGS

# Flags of the tf.distribute path: meaningless on a mesh, so given with one they are an error.
_STRATEGY_FLAGS = ("strategy", "num_gpus", "tpu", "collective", "cluster_resolver",
                   "peer_timeout_s")


def _check_alone(what, spec):
    """One-line ConfigError if a mesh or placement run got a tf.distribute flag."""
    given = [f"--{name}={FLAGS[name].value}" for name in _STRATEGY_FLAGS if FLAGS[name].present]
    if given:
        raise errors.ConfigError(f"--{what}={spec} cannot be combined with {', '.join(given)}; "
                                 f"valid: --{what} (with --num_cpu_devices) or those flags")


def main(argv):
    del argv
    config = cli.config_value(_CONFIG)
    if config is None or not FLAGS.workdir:
        raise errors.ConfigError("--config and --workdir are required, e.g. "
                                 "--config=experiments/digits.py --workdir=/tmp/digits")
    logging.set_verbosity(logging.INFO)
    startup.check_timeout(FLAGS.startup_timeout_s)  # Also where no cluster waits: a typo.
    spec = FLAGS.mesh or (config.get("parallel") or {}).get("mesh", "")
    # In a cluster every line carries this task's name, and from the end of validation
    # on also goes to WORKDIR/logs/<task>.log (cluster/rank_log.py); one process: as is.
    with rank_log.started(cluster_env.task_name(mesh=bool(spec))):
        _run(config, spec)


def _run(config, spec):
    """Trains by --mesh (`spec`), --placement or a strategy (see the module docstring)."""
    parallel = config.get("parallel") or {}
    if FLAGS.placement is not None:
        if "placement" not in parallel:
            raise errors.ConfigError(f"--placement={FLAGS.placement}: this config has no "
                                     f"parallel.placement key; valid: a config built on "
                                     f"tf_gan_scale.configs.base()")
        config.parallel.placement = FLAGS.placement  # What run.json records.
    place = parallel.get("placement", "")
    if spec and place:
        raise errors.ConfigError(f"--mesh={spec} and --placement={place}: one of them; "
                                 f"valid: a mesh splits weights, a placement whole networks")
    if spec:  # A DTensor mesh instead of a tf.distribute strategy.
        # Here, not at the top: a strategy run never loads DTensor.
        from tf_gan_scale.parallel import mesh as mesh_lib
        _check_alone("mesh", spec)
        dims = mesh_spec.parse(spec)
        # Like MultiWorkerMirroredStrategy: before any other TensorFlow op. Joins the
        # other DTensor clients when DTENSOR_JOBS, TF_CONFIG or a Slurm step name some.
        with _cluster_startup():
            mesh_lib.initialize(FLAGS.num_cpu_devices, FLAGS.startup_timeout_s)
        from tf_gan_scale.training import mesh_runner  # Keras models: after DTensor starts.
        _train(lambda: mesh_runner.run(config, FLAGS.workdir, dims,
                                    tfds_data_dir=FLAGS.tfds_data_dir,
                                    allowed_changes=FLAGS.allow_changes), mesh_lib.cluster())
        return
    if place:  # G and D on two devices of this process, under no strategy.
        from tf_gan_scale.parallel import placement  # Keras models: after flags are read.
        _check_alone("placement", place)
        placement.check(place, 1, False)  # Bad specs first; the rest in training.validate.
        num_tasks, _ = distribute.cluster_from_env()
        if num_tasks > 1:
            raise errors.ConfigError(f"--placement={place} runs in one process, but the "
                                     f"environment describes a cluster of {num_tasks} tasks; "
                                     f"valid: one process, or --mesh / a strategy")
    distribute.configure_cpu_devices(FLAGS.num_cpu_devices)
    if place:
        strategy = tf.distribute.get_strategy()  # The default one: nothing mirrored.
    else:
        # MultiWorkerMirroredStrategy must exist before any other TensorFlow op runs.
        with _cluster_startup():
            strategy = distribute.make_strategy(
                FLAGS.strategy, num_gpus=FLAGS.num_gpus, tpu=FLAGS.tpu,
                collective=FLAGS.collective, cluster_resolver=FLAGS.cluster_resolver,
                peer_timeout_s=FLAGS.peer_timeout_s, num_cpu_devices=FLAGS.num_cpu_devices,
                startup_timeout_s=FLAGS.startup_timeout_s)
    from tf_gan_scale import training  # Imports Keras models: after the strategy exists.
    _train(lambda: training.run(config, FLAGS.workdir, strategy,
                                 tfds_data_dir=FLAGS.tfds_data_dir,
                                 allowed_changes=FLAGS.allow_changes), strategy)


@contextlib.contextmanager
def _cluster_startup():
    """Joining the cluster (cluster/startup.py): a cluster that did not form exits 1 with
    its one line, SIGTERM / SIGINT during the wait 143 (the code a preempted run exits
    with: restart me); nothing is written before either."""
    try:
        yield
    except startup.StartupTimeout as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except startup.Interrupted as e:
        print(e, file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_CODE)


def _train(train, strategy):
    """Runs train(); a lost peer or another unavailable / aborted / deadline error exits 1
    with one line (`strategy`: what names the peers, see distribute.abort_message)."""
    try:
        _stop_on_non_finite(train)
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.DeadlineExceededError) as e:
        # A lost peer aborts this worker's collectives with one of these types, but so can
        # storage or the input pipeline: only the former is reported as a lost peer.
        rank_log.error(distribute.abort_message(e, strategy, log_of=rank_log.peer_file))
        sys.exit(1)
    except errors.CheckpointError as e:  # A save that does not read back (storage).
        rank_log.error(e)
        sys.exit(1)


def _stop_on_non_finite(train):
    """Runs train(); a NaN / inf loss or gradient exits 1 with one line."""
    try:
        train()
    except errors.NonFiniteError as e:
        # Raised before the step's callbacks: no checkpoint holds the bad weights.
        latest = tf.train.latest_checkpoint(os.path.join(FLAGS.workdir, "checkpoints"))
        # Every task stops at the same step (the checks see global values); each names
        # the file with its own last lines.
        log = rank_log.current()
        rank_log.error(f"{e}; latest checkpoint: {latest or 'none'}"
                       + (f"; last lines: {log}" if log else ""))
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
