"""The device mesh of a model-parallel run: "batch:B,model:M" -> a DTensor mesh.

Axis "batch" splits examples (data parallelism: B copies of every replicated weight),
axis "model" splits sharded weights (each device holds 1/M of them). B x M must equal
the number of devices of the run (GPUs, TPU cores, or logical CPUs), over all its
processes.

Several processes (hosts) form one mesh as DTensor clients, one per host, each with the
same number of local devices (`initialize`). DTensor reads its cluster from DTENSOR_JOBS
("host:port,host:port", client i listens on entry i), DTENSOR_CLIENT_ID, DTENSOR_NUM_CLIENTS
and DTENSOR_JOB_NAME; where those are unset, `client_env_from` derives them from the
cluster TF_CONFIG or a Slurm job step describes (cluster/env.py), so `tools/launch_local.py`, the Slurm
script and the Kubernetes manifests start a mesh run as they start a multi-worker one.
Client 0 is the chief: it alone writes the workdir.
"""

import os
import types

import tensorflow as tf
from tensorflow.experimental import dtensor

from tf_gan_scale import errors, parallel
from tf_gan_scale.cluster import env
from tf_gan_scale.cluster import startup
from tf_gan_scale.cluster.mesh_spec import BATCH, MODEL, check
from tf_gan_scale.distribute import strategies
from tf_gan_scale.parallel import tensors


def device_type(physical=False):
    """The accelerator a mesh is built on: TPU, else GPU, else (logical) CPU. physical:
    from the physical devices, which can be listed before TensorFlow initializes (the
    logical ones initialize it)."""
    listed = tf.config.list_physical_devices if physical else tf.config.list_logical_devices
    for kind in ("TPU", "GPU"):
        if listed(kind):
            return kind
    return "CPU"


def make(dims, kind=None):
    """A DTensor mesh ("batch", "model") of the run's devices of `kind` (default:
    `device_type()`): this process's, or every client's (`initialize`) when there are
    several; checked against their number first. Devices are numbered client by client
    and "model" is the faster-varying axis, so when M divides a client's devices each
    model row (the axis with activation collectives every layer) stays inside a host.

    Returns:
        dtensor.Mesh with dim_size("batch") = B and dim_size("model") = M.
    """
    kind = kind or device_type()
    axes = [(BATCH, dims[BATCH]), (MODEL, dims[MODEL])]
    if clients()[1] > 1:
        check(dims, dtensor.num_global_devices(kind),
              f"{kind} ({clients()[1]} processes x {dtensor.num_local_devices(kind)})")
        return dtensor.create_distributed_mesh(axes, device_type=kind)
    devices = [d.name for d in tf.config.list_logical_devices(kind)]
    check(dims, len(devices), kind)
    return dtensor.create_mesh(axes, devices=devices, device_type=kind)


# ---- several processes: DTensor clients ----------------------------------------------

def initialize(num_cpu_devices=None, startup_timeout_s=startup.DEFAULT_TIMEOUT_S):
    """Starts this process's part of the mesh: the DTENSOR_* variables (client_env_from)
    into os.environ, then `dtensor.initialize_accelerator_system`. Must run before any
    other TensorFlow op, like MultiWorkerMirroredStrategy. With several clients each
    gets a gRPC server at its DTENSOR_JOBS address and the coordination service (on
    client 0) heartbeats them: a lost client fails the others' collectives with an error
    naming it (TensorFlow's default timeout) instead of a hang. The clients first wait
    for each other with a deadline, as multi-worker tasks do
    (`distribute.strategies.join_cluster`): a client that never comes, or a SIGTERM
    during the wait, ends it with one line (startup.StartupTimeout / Interrupted).

    Args:
        num_cpu_devices: logical CPU devices per process (the CPU's devices when there is
            no accelerator); None: as configured.
        startup_timeout_s: how long to wait for the other clients.

    Returns:
        The device type ("CPU", "GPU" or "TPU").
    """
    os.environ.update(env.client_env_from(os.environ))
    parallel.combine_all_reduces()  # Before the DTensor device exists (parallel/__init__).
    kind = device_type(physical=True)
    if num_cpu_devices is not None and num_cpu_devices < 1:
        raise errors.ConfigError(f"--num_cpu_devices must be >= 1; Received: "
                                 f"{num_cpu_devices}")
    startup.check_timeout(startup_timeout_s)
    create = lambda: dtensor.initialize_accelerator_system(  # noqa: E731
        kind, num_logical_cpu_devices=num_cpu_devices)
    jobs = [h for h in os.environ.get("DTENSOR_JOBS", "").split(",") if h.strip()]
    if len(jobs) < 2:
        return create()
    tasks = [(f"client {i}", address) for i, address in enumerate(jobs)]
    job = os.environ.get("DTENSOR_JOB_NAME", env.JOB)  # TensorFlow's name of the clients.
    return strategies.join_cluster(tasks, int(os.environ["DTENSOR_CLIENT_ID"]),
                                   startup_timeout_s, create,
                                   tf_names=[f"{job} {i}" for i in range(len(jobs))])


def clients():
    """(client id, number of clients) of this process's mesh ((0, 1) for one process)."""
    return dtensor.client_id(), dtensor.num_clients()


def cluster():
    """The DTensor clients as `callbacks.Preemption` and `distribute.abort_message` read
    a strategy: an object whose `cluster_resolver` is a SimpleClusterResolver of the
    clients (None for one process). The preemption handler agrees on its step through
    the coordination service DTensor starts, as it does for multi-worker runs."""
    cid, n = clients()
    resolver = None
    if n > 1:
        job = dtensor.job_name()
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({job: os.environ["DTENSOR_JOBS"].split(",")}),
            task_type=job, task_id=cid, rpc_layer="grpc")
    return types.SimpleNamespace(cluster_resolver=resolver)


def _on_every_device(mesh, values):
    """A float64 [B, M] DTensor split over both axes: this client's devices hold `values`
    (one per local device, mesh.local_devices() order)."""
    return dtensor.pack([tf.constant([[v]], tf.float64) for v in values],
                        dtensor.Layout([BATCH, MODEL], mesh))


def spread(mesh, value):
    """(min, max) over the clients of the number `value` each one holds. A collective:
    every client calls it at the same point."""
    x = _on_every_device(mesh, [value] * len(mesh.local_devices()))
    return float(tensors.gather(tf.reduce_min(x))), float(tensors.gather(tf.reduce_max(x)))


def from_chief(mesh, value):
    """Client 0's `value` (a number), on every client. A collective, as `spread`."""
    n = len(mesh.local_devices())
    mine = [float(value)] + [0.0] * (n - 1) if clients()[0] == 0 else [0.0] * n
    return float(tensors.gather(tf.reduce_sum(_on_every_device(mesh, mine))))
