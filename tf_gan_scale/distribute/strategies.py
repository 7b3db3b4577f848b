"""Strategies by name: the only module that knows strategy and cluster-resolver names.

    configure_cpu_devices(4)          # before TensorFlow initializes its devices
    strategy = make_strategy("mirrored")

Names (`--strategy`):
  auto                   multi_worker_mirrored when the environment describes a cluster of
                         more than one task (TF_CONFIG, or a Slurm step: then with the slurm
                         resolver; see cluster.env.cluster_from_env), else mirrored when more than one
                         local device (GPUs or logical CPUs), else one_device.
  one_device             the first GPU, else CPU:0. Refused inside a multi-task cluster.
  mirrored               all (or --num_gpus) local GPUs, else all logical CPU devices.
                         Refused inside a multi-task cluster.
  multi_worker_mirrored  one replica per device on every worker of the cluster
                         (--cluster_resolver: TF_CONFIG or Slurm); collective all-reduce,
                         --collective=auto (NCCL with GPUs, else RING) | ring | nccl.
  tpu                    TPUStrategy through TPUClusterResolver(--tpu).
  parameter_server       refused (also `auto` and every other name under a TF_CONFIG with
                         `ps` tasks), with one line saying why: refuse_parameter_server.

Multi-worker failure detection: every worker heartbeats to the coordination service
(on worker 0); a worker silent for --peer_timeout_s (e.g. killed) aborts the collectives
on all others with an error naming it, instead of a hang; abort_message() turns it into
one line naming the lost worker (errors of the same types from storage or the input
pipeline keep their own first line).

Multi-worker start-up has a deadline (--startup_timeout_s): every task first waits for its
peers in Python (cluster/startup.py: SIGTERM / SIGINT end the wait, exit 143), then joins
TensorFlow's cluster with the time left as the registration deadline (join_cluster);
a cluster that does not form ends with one line naming the tasks that did not connect.
"""

import contextlib
import os
import re
import socket

from absl import logging
import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import collective_all_reduce_strategy as cars
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context

from tf_gan_scale import errors
from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import startup

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker_mirrored", "tpu")
CLUSTER_RESOLVERS = ("tf_config", "slurm")
COLLECTIVES = ("auto", "ring", "nccl")
TPU_CONNECT_TIMEOUT_S = 30
PARAMETER_SERVER = "parameter_server"  # A name that is refused, not one of STRATEGIES.


def refuse_parameter_server(what):
    """The ConfigError for a ParameterServerStrategy run (`what`: the flag or cluster
    that asked for one): the one place that says why (docs/multi_worker.md,
    "ParameterServerStrategy"). Its workers run steps a ClusterCoordinator schedules
    asynchronously against variables on the ps tasks: G and D are updated from gradients
    of stale weights, each worker's batch on its own with its own batch-norm
    statistics, so the result is no longer one device's on the global batch."""
    return errors.ConfigError(
        f"{what}: ParameterServerStrategy is not supported: its workers update G and D "
        f"asynchronously, each on its own batch with its own batch-norm statistics, so "
        f"training is no longer what one device trains on the global batch; use "
        f"--strategy=multi_worker_mirrored (synchronous, chief and worker tasks only) or a "
        f"DTensor mesh (--mesh=batch:B,model:M)")


def configure_cpu_devices(num):
    """Splits the physical CPU into `num` logical devices (CPU:0..CPU:num-1).

    Must run before TensorFlow initializes its devices (before any op). Calling it again
    with the same count is a no-op; a different count after initialization raises.
    """
    if num is None:
        return
    if num < 1:
        raise errors.ConfigError(f"--num_cpu_devices must be >= 1; Received: {num}")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current and len(current) == num:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num)])
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        raise errors.ConfigError(
            f"cannot split the CPU into {num} devices: TensorFlow already initialized "
            f"{have}; configure devices before any TensorFlow op") from None


def _local_devices(num_gpus=None):
    """Devices for in-process replication: GPUs (first num_gpus) if any, else logical CPUs."""
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus:
        if num_gpus is not None:
            if not 1 <= num_gpus <= len(gpus):
                raise errors.ConfigError(
                    f"--num_gpus={num_gpus} but this machine has {len(gpus)} GPU(s)")
            gpus = gpus[:num_gpus]
        return gpus
    if num_gpus:
        raise errors.ConfigError(f"--num_gpus={num_gpus} but this machine has no GPU; "
                                 f"use --num_cpu_devices for CPU replicas")
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def choose_strategy(name, cluster_resolver="tf_config", env=None):
    """The (strategy, cluster resolver) names to create for `--strategy=name`.

    Reads only environment variables (MultiWorkerMirroredStrategy must be created before
    any other TensorFlow op). In a cluster of more than one task, `auto` becomes
    multi_worker_mirrored with the resolver of what describes the cluster, and the
    single-process strategies raise ConfigError: every task would train alone on its own
    data and write the same workdir. ParameterServerStrategy, by name or by `ps` tasks in
    TF_CONFIG, raises ConfigError (refuse_parameter_server). Otherwise the names are
    returned unchanged.
    """
    if name == PARAMETER_SERVER:
        raise refuse_parameter_server(f"--strategy={name}")
    num_ps = cluster_env.parameter_servers(env)
    if num_ps:  # MWMS would fail on the ps job with TensorFlow's own error.
        raise refuse_parameter_server(
            f"TF_CONFIG describes a parameter-server cluster ({num_ps} ps "
            f"task{'s' if num_ps > 1 else ''}; --strategy={name})")
    num_tasks, source = cluster_env.cluster_from_env(env)
    if source is None:
        return name, cluster_resolver
    env = os.environ if env is None else env
    cluster = (f"TF_CONFIG describes a cluster of {num_tasks} tasks" if source == "tf_config"
               else f"this Slurm job step has {num_tasks} tasks (SLURM_STEP_TASKS_PER_NODE="
                    f"{env['SLURM_STEP_TASKS_PER_NODE']!r})")
    if name == "auto":
        return "multi_worker_mirrored", source
    if name in ("one_device", "mirrored"):
        raise errors.ConfigError(
            f"--strategy={name} trains in one process, but {cluster}: each task would train "
            f"alone and write the same workdir; use --strategy=multi_worker_mirrored (or auto)")
    if name == "multi_worker_mirrored" and source == "slurm" and cluster_resolver == "tf_config":
        # MWMS would find no cluster in TF_CONFIG and run every Slurm task as its own.
        raise errors.ConfigError(
            f"--cluster_resolver=tf_config finds no cluster in TF_CONFIG, but {cluster}; "
            f"use --cluster_resolver=slurm (or --strategy=auto)")
    return name, cluster_resolver


def make_strategy(name="auto", *, num_gpus=None, tpu=None, collective="auto",
                  cluster_resolver="tf_config", peer_timeout_s=None, num_cpu_devices=None,
                  startup_timeout_s=startup.DEFAULT_TIMEOUT_S):
    """Creates the strategy `name` (see module docstring); bad input raises ConfigError.

    Multi-worker only: `collective` (COLLECTIVES), `cluster_resolver` (CLUSTER_RESOLVERS),
    `peer_timeout_s` (seconds without heartbeat before a worker counts as lost; None keeps
    TensorFlow's default), `num_cpu_devices` (CPU replicas per worker when there is no
    GPU; configure_cpu_devices must have split the CPU) and `startup_timeout_s` (how long
    to wait for the other tasks: see join_cluster).
    """
    if name != PARAMETER_SERVER:  # Refused by choose_strategy, with its reason.
        errors.choose("strategy", name, {s: s for s in STRATEGIES})
    errors.choose("collective", collective, {c: c for c in COLLECTIVES})
    errors.choose("cluster resolver", cluster_resolver, {r: r for r in CLUSTER_RESOLVERS})
    if name != "tpu":
        name, cluster_resolver = choose_strategy(name, cluster_resolver)
    if name == "auto":
        name = "mirrored" if len(_local_devices(num_gpus)) > 1 else "one_device"
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(_local_devices(num_gpus)[0])
    if name == "mirrored":
        # On CPU, MirroredStrategy's default reduces through one device; that is what
        # logical CPU devices share anyway.
        return tf.distribute.MirroredStrategy(_local_devices(num_gpus))
    if name == "multi_worker_mirrored":
        return _multi_worker_strategy(collective, cluster_resolver, peer_timeout_s,
                                      num_cpu_devices or 1, startup_timeout_s)
    return _tpu_strategy(tpu)


def slurm_resolver(environ, *, num_gpus):
    """SimpleClusterResolver for this Slurm task (cluster.env.slurm_cluster: TensorFlow's
    own SlurmClusterResolver fails on CPU-only nodes); `num_gpus` GPUs on this node (may
    be 0)."""
    cluster, rank = cluster_env.slurm_cluster(environ)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="worker", task_id=rank, rpc_layer="grpc",
        num_accelerators={"GPU": int(num_gpus)})


def _multi_worker_strategy(collective, resolver_name, peer_timeout_s, cpus_per_worker,
                           startup_timeout_s):
    startup.check_timeout(startup_timeout_s)
    # Physical, not logical, devices: listing logical ones initializes the runtime, after
    # which collective ops can no longer be configured.
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    if collective == "auto":
        collective = "nccl" if num_gpus else "ring"
    if collective == "nccl" and not num_gpus:
        raise errors.ConfigError("--collective=nccl needs GPUs and this worker has none; "
                                 "valid here: auto, ring")
    if peer_timeout_s is not None and peer_timeout_s <= 0:
        raise errors.ConfigError(f"--peer_timeout_s must be > 0; Received: {peer_timeout_s}")
    if resolver_name == "slurm":
        resolver = slurm_resolver(os.environ, num_gpus=num_gpus)
    else:
        cluster_env.check_tf_config()
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    impl = {"ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}[collective]
    options = tf.distribute.experimental.CommunicationOptions(implementation=impl)

    def create():
        with _cpu_replicas_per_worker(cpus_per_worker if not num_gpus else 1):
            return tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver, communication_options=options)

    # The coordinated tasks (chief, workers); without a cluster (no TF_CONFIG) MWMS runs
    # as one worker: all local devices, nothing to wait for.
    tasks = [(f"{job} {i}", spec.task_address(job, i)) for job in ("chief", "worker")
             if job in spec.jobs for i in range(spec.num_tasks(job))]
    names = [name for name, _ in tasks]
    me = f"{resolver.task_type} {resolver.task_id}"
    if len(tasks) < 2 or me not in names:
        return create()
    _configure_coordination(spec, peer_timeout_s)
    return join_cluster(tasks, names.index(me), startup_timeout_s, create)


def _configure_coordination(spec, peer_timeout_s):
    """Configures the coordination service before MWMS starts it: MWMS configures it only
    if nobody did, with TensorFlow's default heartbeat timeout; this is the same
    configuration with --peer_timeout_s (a worker silent this long is lost; None: the
    default)."""
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in ("chief", "worker") if job in spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=int(peer_timeout_s * 1000) if peer_timeout_s else 0,
        coordinated_jobs=jobs)


REGISTER_CAP_S = 60.0


def join_cluster(tasks, me, timeout_s, create, tf_names=None):
    """create() (what starts TensorFlow's cluster: MultiWorkerMirroredStrategy, DTensor's
    initialize_accelerator_system) once every task answers (startup.wait_for_peers), with
    the deadline's remaining time as TensorFlow's registration deadline, at most
    REGISTER_CAP_S: every task has answered by then, so registering is a matter of
    seconds, and during it TensorFlow's own SIGTERM handler holds the signal (a SIGTERM
    then acts after registration fails, or at the first step: a preemption checkpoint).

    Args:
        tasks: [(name, "host:port")] of the cluster's tasks; me: this task's index.
        tf_names: how TensorFlow names each task in its errors ("worker 3" for
            /job:worker/replica:0/task:3); default: the names of `tasks`.
    Raises:
        startup.StartupTimeout: the cluster did not form in time, naming whom it missed.
        startup.Interrupted: SIGTERM / SIGINT while waiting.
    """
    left = startup.wait_for_peers(tasks, me, timeout_s, log=logging.info)
    try:
        with register_deadline(min(left, REGISTER_CAP_S)):
            return create()
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
        # Every task answered, then one stopped before registering (or registration ran
        # past the deadline): TensorFlow names the tasks it missed as /job:J/.../task:N.
        message = str(getattr(e, "message", e))
        named = {f"{j} {n}" for j, n in re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)",
                                                   message)}
        missed = [f"{n} ({a})" for (n, a), t in zip(tasks, tf_names or [n for n, _ in tasks])
                  if t in named and n != tasks[me][0]]
        raise startup.StartupTimeout(
            f"the cluster did not form within --startup_timeout_s={float(timeout_s):g}: "
            f"every task answered, then TensorFlow's registration failed"
            f"{' waiting for ' + ', '.join(missed) if missed else ''} "
            f"(this is {tasks[me][0]} at {tasks[me][1]}): {first_cause(message)}") from None


@contextlib.contextmanager
def register_deadline(seconds):
    """Inside, TensorFlow's coordination service (configured by us for MWMS, or by
    DTensor's initialize_multi_client_cluster, which configures its own) waits at most
    `seconds` for every task to register, ALL tasks at one barrier: without it the leader
    (task 0) waited with no end for a task that never came (TF 2.21; a non-leader's
    registration RPC has a deadline of its own)."""
    def limit(config):
        config.cluster_register_timeout_in_ms = max(int(seconds * 1000), 1000)
        config.cluster_register_with_barrier = True

    cls = type(context.context())
    original = cls.configure_coordination_service

    def configure(self, *args, **kwargs):
        original(self, *args, **kwargs)
        limit(self._coordination_service_config)

    if context.context().coordination_service is not None:  # Configured already (MWMS).
        limit(context.context().coordination_service)
    cls.configure_coordination_service = configure
    try:
        yield
    finally:
        cls.configure_coordination_service = original


@contextlib.contextmanager
def _cpu_replicas_per_worker(num):
    """Makes MultiWorkerMirroredStrategy use CPU:0..num-1 of each worker as replicas.

    MWMS hard-codes one CPU replica per worker (`_initialize_local_devices`); with the CPU
    split into logical devices, this lets a CPU box test N workers x K replicas, the
    layout of N hosts with K GPUs each. Only used when asked for (num > 1).
    """
    if num <= 1:
        yield
        return
    ext = cars.CollectiveAllReduceExtended
    original = ext._initialize_local_devices

    def local_devices(self, cluster_resolver, worker_device):
        devices, kind = original(self, cluster_resolver, worker_device)
        if kind != "CPU":
            return devices, kind
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(num)), "CPU"

    ext._initialize_local_devices = local_devices
    try:
        yield
    finally:
        ext._initialize_local_devices = original


def _tpu_strategy(tpu):
    if not tpu:
        raise errors.ConfigError("--strategy=tpu needs --tpu=NAME|local|grpc://HOST:PORT")
    if tpu.startswith("grpc://"):
        # connect_to_cluster waits forever for an address nobody answers at.
        host, _, port = tpu[len("grpc://"):].rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=TPU_CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as e:
            raise errors.ConfigError(f"--strategy=tpu: no usable TPU at --tpu={tpu!r}: cannot "
                                     f"connect ({e}); expected grpc://HOST:PORT of a TPU "
                                     f"worker, a TPU name, or 'local'") from None
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu="" if tpu == "local" else tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as e:  # No TPU here: say so on one line.
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise errors.ConfigError(f"--strategy=tpu: no usable TPU at --tpu={tpu!r}: {first}") from None
    return tf.distribute.TPUStrategy(resolver)


# Task names in TensorFlow errors: "/job:worker/replica:0/task:1" (gRPC, coordination
# service) or "/job:worker/task:1" ("Error reported from ..."). "localhost" is the job of
# every single-process run's devices, never a peer.
_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
# The coordination service's words for a worker that stopped heartbeating (also when the
# message names only this worker, e.g. the service's leader lost it).
_HEARTBEAT_LOST = re.compile(r"tasks are unhealthy|heartbeat", re.IGNORECASE)
# Lines of a graph error that are not its cause: the header and the op's traceback.
_NOT_CAUSE = re.compile(r"^(Graph execution error:|Detected at node |File \"|\[\[)")


def lost_peers(message, strategy):
    """The other workers an error message says were lost, e.g.
    ["/job:worker/replica:0/task:1"] ("a peer" when it names none), or [] when it is not
    about a lost peer (always [] without a cluster: a single process has no peers).

    A lost peer is named by gRPC ("... from remote target /job:worker/replica:0/task:1"
    after "Connection reset by peer" or "Socket closed") or by the coordination service
    ("The following tasks are unhealthy (stopped sending heartbeats): /job:..."). The
    same error types also come from storage or input pipelines ("Unavailable: ...
    failed to connect" reading gs://), which name no other task.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().jobs:
        return []
    me = (resolver.task_type, str(resolver.task_id))
    peers = sorted({f"/job:{job}/replica:0/task:{task}" for job, task in _TASK.findall(message)
                    if job != "localhost" and (job, task) != me})
    if not peers and _HEARTBEAT_LOST.search(message):
        return ["a peer"]
    return peers


def first_cause(message):
    """The first line of an error message that says what happened (not its traceback)."""
    for line in message.splitlines():
        line = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", line).strip()
        if line and not _NOT_CAUSE.match(line):
            return line[:400]
    return ""


def abort_message(error, strategy, log_of=None):
    """One line for a tf.errors.OpError that ended training.

    log_of(job, index): the log file of the task TensorFlow names /job:JOB/.../task:INDEX
    (cluster.rank_log.peer_file), or None.

    Returns:
        "multi-worker run aborted, lost PEERS: CAUSE" when the error says other workers
        were lost (see lost_peers), followed by "; last lines: FILE" when `log_of` knows
        the lost task's log file; else "ErrorType: CAUSE" (the error's first line that is
        not traceback).
    """
    message = str(getattr(error, "message", error))
    cause = first_cause(message)
    peers = lost_peers(message, strategy)
    if peers:
        files = [log_of(job, int(index)) for peer in peers
                 for job, index in _TASK.findall(peer)] if log_of else []
        files = ", ".join(f for f in files if f)
        return (f"multi-worker run aborted, lost {' '.join(peers)}: {cause}"
                + (f"; last lines: {files}" if files else ""))
    return f"{type(error).__name__}: {cause or 'no message'}"


def is_chief(strategy):
    """True on the worker that writes the workdir (worker 0 / chief; always for one host)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict())
