"""The device mesh of a model-parallel run: "batch:B,model:M" -> a DTensor mesh.

Axis "batch" splits examples (data parallelism: B copies of every replicated weight),
axis "model" splits sharded weights (each device holds 1/M of them). B x M must equal
the number of devices of the run (GPUs, TPU cores, or logical CPUs), over all its
processes.

Several processes (hosts) form one mesh as DTensor clients, one per host, each with the
same number of local devices (`initialize`). DTensor reads its cluster from DTENSOR_JOBS
("host:port,host:port", client i listens on entry i), DTENSOR_CLIENT_ID, DTENSOR_NUM_CLIENTS
and DTENSOR_JOB_NAME; where those are unset, `client_env_from` derives them from the
cluster TF_CONFIG or a Slurm job step describes, so `tools/launch_local.py`, the Slurm
script and the Kubernetes manifests start a mesh run as they start a multi-worker one.
Client 0 is the chief: it alone writes the workdir.
"""

import json
import os

from tf_gan_scale import errors

AXES = ("batch", "model")
BATCH, MODEL = AXES


def parse(spec):
    """"batch:B,model:M" (either axis may be left out: size 1) -> {"batch": B, "model": M}.

    Raises ConfigError naming the bad part and the valid form.
    """
    form = "valid: batch:B,model:M with B, M >= 1 (e.g. batch:2,model:2)"
    dims = errors.named_ints("--mesh", spec, AXES, "axis", "size", form)
    for name, size in dims.items():
        if size < 1:
            raise errors.ConfigError(f"--mesh={spec!r}: axis {name!r} has size {size}; {form}")
    return {axis: dims.get(axis, 1) for axis in AXES}


def fitting(num_devices):
    """Every "batch:B,model:M" with B x M = num_devices (what an error proposes)."""
    return [f"batch:{num_devices // m},model:{m}"
            for m in range(1, num_devices + 1) if num_devices % m == 0]


def check(dims, num_devices, device_type="CPU"):
    """Raises ConfigError unless the mesh uses exactly the `num_devices` devices."""
    size = dims[BATCH] * dims[MODEL]
    if size != num_devices:
        raise errors.ConfigError(
            f"--mesh=batch:{dims[BATCH]},model:{dims[MODEL]} needs {size} devices, the run "
            f"has {num_devices} {device_type}; meshes that fit: "
            f"{', '.join(fitting(num_devices))}")


def device_type(physical=False):
    """The accelerator a mesh is built on: TPU, else GPU, else (logical) CPU. physical:
    from the physical devices, which can be listed before TensorFlow initializes (the
    logical ones initialize it)."""
    import tensorflow as tf
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
    import tensorflow as tf
    from tensorflow.experimental import dtensor
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

JOB = "worker"  # DTensor's job name for the clients (DTENSOR_JOB_NAME).


def client_env(hosts, index):
    """The DTENSOR_* variables of client `index` of the clients at `hosts` ["host:port"]."""
    return {"DTENSOR_JOBS": ",".join(hosts), "DTENSOR_CLIENT_ID": str(int(index)),
            "DTENSOR_NUM_CLIENTS": str(len(hosts)), "DTENSOR_JOB_NAME": JOB}


def _check_dtensor_env(env):
    jobs = [h for h in env["DTENSOR_JOBS"].split(",") if h.strip()]
    # DTensor takes a missing client id for 0: every process would be the chief.
    raw_id = env.get("DTENSOR_CLIENT_ID", "0" if len(jobs) == 1 else None)
    raw_n = env.get("DTENSOR_NUM_CLIENTS")
    try:
        cid, n = int(raw_id), int(raw_n) if raw_n else len(jobs)
        ok = all(":" in h for h in jobs) and n == len(jobs) and 0 <= cid < n
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise errors.ConfigError(
            f"bad DTensor cluster: DTENSOR_JOBS={env['DTENSOR_JOBS']!r}, DTENSOR_CLIENT_ID="
            f"{raw_id!r}, DTENSOR_NUM_CLIENTS={raw_n!r}; valid: DTENSOR_JOBS=host:port,"
            f"host:port,... with DTENSOR_CLIENT_ID in 0..N-1 and DTENSOR_NUM_CLIENTS=N "
            f"(its number of entries) or unset")


def client_env_from(env=None):
    """The DTENSOR_* variables this process lacks to join its mesh ({} for one process).

    DTENSOR_JOBS set: checked and kept ({}). Else a cluster of more than one task in
    TF_CONFIG (tasks in order: chief, then workers; this task's position is its client
    id) or a Slurm job step (clusters.slurm_cluster: the task's rank) becomes one client
    per task at that task's address. ConfigError (one line) for a bad description.
    """
    env = os.environ if env is None else env
    if env.get("DTENSOR_JOBS"):
        _check_dtensor_env(env)
        return {}
    from tf_gan_scale import distribute
    num, source = distribute.cluster_from_env(env)
    if source == "tf_config":
        cfg = json.loads(env["TF_CONFIG"])
        order = [(kind, i) for kind in ("chief", "worker")
                 for i in range(len(cfg["cluster"].get(kind, ())))]
        me = (cfg["task"]["type"], int(cfg["task"]["index"]))
        if me not in order or len(order) != num:
            raise errors.ConfigError(
                f"--mesh with TF_CONFIG {env['TF_CONFIG']!r}: only chief and worker tasks "
                f"can be DTensor clients; valid: a cluster of chief / worker tasks")
        return client_env([cfg["cluster"][k][i] for k, i in order], order.index(me))
    if source == "slurm":
        from tf_gan_scale import clusters
        cluster, rank = clusters.slurm_cluster(env)
        return client_env(cluster["worker"], rank)
    return {}


def initialize(num_cpu_devices=None):
    """Starts this process's part of the mesh: the DTENSOR_* variables (client_env_from)
    into os.environ, then `dtensor.initialize_accelerator_system`. Must run before any
    other TensorFlow op, like MultiWorkerMirroredStrategy. With several clients each
    gets a gRPC server at its DTENSOR_JOBS address and the coordination service (on
    client 0) heartbeats them: a lost client fails the others' collectives with an error
    naming it (TensorFlow's default timeout) instead of a hang.

    Args:
        num_cpu_devices: logical CPU devices per process (the CPU's devices when there is
            no accelerator); None: as configured.

    Returns:
        The device type ("CPU", "GPU" or "TPU").
    """
    from tensorflow.experimental import dtensor
    os.environ.update(client_env_from(os.environ))
    kind = device_type(physical=True)
    if num_cpu_devices is not None and num_cpu_devices < 1:
        raise errors.ConfigError(f"--num_cpu_devices must be >= 1; Received: "
                                 f"{num_cpu_devices}")
    return dtensor.initialize_accelerator_system(kind, num_logical_cpu_devices=num_cpu_devices)


def clients():
    """(client id, number of clients) of this process's mesh ((0, 1) for one process)."""
    from tensorflow.experimental import dtensor
    return dtensor.client_id(), dtensor.num_clients()


def cluster():
    """The DTensor clients as `callbacks.Preemption` and `distribute.abort_message` read
    a strategy: an object whose `cluster_resolver` is a SimpleClusterResolver of the
    clients (None for one process). The preemption handler agrees on its step through
    the coordination service DTensor starts, as it does for multi-worker runs."""
    import types
    import tensorflow as tf
    from tensorflow.experimental import dtensor
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
    import tensorflow as tf
    from tensorflow.experimental import dtensor
    return dtensor.pack([tf.constant([[v]], tf.float64) for v in values],
                        dtensor.Layout([BATCH, MODEL], mesh))


def spread(mesh, value):
    """(min, max) over the clients of the number `value` each one holds. A collective:
    every client calls it at the same point."""
    import tensorflow as tf
    from tf_gan_scale.parallel import layouts
    x = _on_every_device(mesh, [value] * len(mesh.local_devices()))
    return float(layouts.gather(tf.reduce_min(x))), float(layouts.gather(tf.reduce_max(x)))


def from_chief(mesh, value):
    """Client 0's `value` (a number), on every client. A collective, as `spread`."""
    import tensorflow as tf
    from tf_gan_scale.parallel import layouts
    n = len(mesh.local_devices())
    mine = [float(value)] + [0.0] * (n - 1) if clients()[0] == 0 else [0.0] * n
    return float(layouts.gather(tf.reduce_sum(_on_every_device(mesh, mine))))
