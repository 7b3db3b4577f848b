"""Strategies by name: the only module that knows strategy and cluster-resolver names.

    configure_cpu_devices(4)          # before TensorFlow initializes its devices
    strategy = make_strategy("mirrored")

Names (`--strategy`):
  auto                   mirrored when more than one device (GPUs or logical CPUs), else
                         one_device.
  one_device             the first GPU, else CPU:0.
  mirrored               all (or --num_gpus) local GPUs, else all logical CPU devices.
  multi_worker_mirrored  one replica per device on every worker listed in TF_CONFIG;
                         collective all-reduce (RING on CPU).
  tpu                    TPUStrategy through TPUClusterResolver(--tpu).
"""

import json
import os

import tensorflow as tf

from tf_gan_scale import errors

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker_mirrored", "tpu")


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


def _check_tf_config():
    """Validates TF_CONFIG for multi-worker runs; returns the parsed dict (or None)."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        cluster, task = cfg["cluster"], cfg["task"]
        members = cluster[task["type"]]
        if not 0 <= int(task["index"]) < len(members):
            raise IndexError(task["index"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise errors.ConfigError(
            f"bad TF_CONFIG {raw!r} ({type(e).__name__}: {e}); expected "
            f'{{"cluster": {{"worker": ["host:port", ...]}}, '
            f'"task": {{"type": "worker", "index": I}}}}') from None
    return cfg


def make_strategy(name="auto", *, num_gpus=None, tpu=None):
    """Creates the strategy `name` (see module docstring); bad names raise ConfigError."""
    errors.choose("strategy", name, {s: s for s in STRATEGIES})
    if name == "auto":
        name = "mirrored" if len(_local_devices(num_gpus)) > 1 else "one_device"
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(_local_devices(num_gpus)[0])
    if name == "mirrored":
        # On CPU, MirroredStrategy's default reduces through one device; that is what
        # logical CPU devices share anyway.
        return tf.distribute.MirroredStrategy(_local_devices(num_gpus))
    if name == "multi_worker_mirrored":
        _check_tf_config()
        # Physical, not logical, devices: listing logical ones initializes the runtime,
        # after which collective ops can no longer be configured.
        comm = (tf.distribute.experimental.CommunicationImplementation.NCCL
                if tf.config.list_physical_devices("GPU")
                else tf.distribute.experimental.CommunicationImplementation.RING)
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=comm))
    return _tpu_strategy(tpu)


def _tpu_strategy(tpu):
    if not tpu:
        raise errors.ConfigError("--strategy=tpu needs --tpu=NAME|local|grpc://HOST:PORT")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu="" if tpu == "local" else tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as e:  # No TPU here: say so on one line.
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise errors.ConfigError(f"--strategy=tpu: no usable TPU at --tpu={tpu!r}: {first}") from None
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy):
    """True on the worker that writes the workdir (worker 0 / chief; always for one host)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict())
