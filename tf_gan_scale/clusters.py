"""Cluster specs from cluster managers: Slurm (in the job) and Kubernetes (manifests).

Slurm: TensorFlow's `SlurmClusterResolver` runs `nvidia-smi` and divides by the GPU count,
so it fails on CPU-only nodes (tensorflow#56894). `slurm_resolver` builds the same cluster
from the job's variables and hands a `SimpleClusterResolver` to the strategy, with the GPU
count measured on the node (0 is fine).

    SLURM_STEP_NODELIST   node[01-02]     hosts of this step (else SLURM_JOB_NODELIST)
    SLURM_STEP_TASKS_PER_NODE 2(x2)       tasks on each host (else SLURM_TASKS_PER_NODE)
    SLURM_PROCID          0..N-1          this task's rank = worker index
    TF_GAN_SCALE_PORT     8888            first port; the k-th task on a host uses PORT + k

Tasks are laid out on hosts in block order (srun's default distribution): the first
host's tasks are workers 0..t0-1, and so on.

Kubernetes: `kubernetes_manifest` returns one headless Service and one Pod per worker,
each Pod with its own TF_CONFIG naming the others by stable DNS names
(`NAME-worker-I.NAME`); `tools/k8s_manifest.py` prints it.
"""

import json

from tf_gan_scale import errors

DEFAULT_PORT = 8888


def _slurm_var(env, *names):
    for name in names:
        if env.get(name):
            return env[name]
    raise errors.ConfigError(f"--cluster_resolver=slurm: {names[0]} is not set; run inside "
                             f"a Slurm job step (srun), or use --cluster_resolver=tf_config")


def slurm_cluster(env):
    """(cluster dict {"worker": ["host:port", ...]}, task index) from Slurm variables."""
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as scr
    nodelist = _slurm_var(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    per_node = _slurm_var(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    try:
        hosts = scr.expand_hostlist(nodelist)
        counts = scr.expand_tasks_per_node(per_node)
        rank = int(_slurm_var(env, "SLURM_PROCID"))
        port = int(env.get("TF_GAN_SCALE_PORT", DEFAULT_PORT))
    except ValueError as e:
        raise errors.ConfigError(f"--cluster_resolver=slurm: bad Slurm variables ({e}); "
                                 f"expected e.g. SLURM_STEP_NODELIST='node[01-02]', "
                                 f"SLURM_STEP_TASKS_PER_NODE='2(x2)', SLURM_PROCID=0") from None
    if len(hosts) != len(counts):
        raise errors.ConfigError(
            f"--cluster_resolver=slurm: {len(hosts)} hosts in {nodelist!r} but "
            f"{len(counts)} entries in tasks-per-node {per_node!r}")
    workers = [f"{host}:{port + k}" for host, n in zip(hosts, counts) for k in range(n)]
    if not 0 <= rank < len(workers):
        raise errors.ConfigError(f"--cluster_resolver=slurm: SLURM_PROCID={rank} but the "
                                 f"step has {len(workers)} tasks (valid: 0..{len(workers) - 1})")
    return {"worker": workers}, rank


def slurm_resolver(env, *, num_gpus):
    """SimpleClusterResolver for this Slurm task; `num_gpus` GPUs on this node (may be 0)."""
    import tensorflow as tf
    cluster, rank = slurm_cluster(env)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="worker", task_id=rank, rpc_layer="grpc",
        num_accelerators={"GPU": int(num_gpus)})


def kubernetes_manifest(name, num_workers, image, command, *, port=DEFAULT_PORT,
                        namespace=None, gpus_per_worker=0, cpu=None, memory=None,
                        volume_claim=None, mount_path="/workdir"):
    """A Kubernetes `List` (dict): one headless Service + `num_workers` Pods.

    Args:
        name: job name (DNS label): pods are NAME-worker-I, the service NAME.
        num_workers: int >= 1.
        image: container image with this package installed.
        command: argv of every worker, e.g. ["python", "-m", "tf_gan_scale.main", ...].
        port: the port each worker listens on.
        namespace: optional namespace for every object.
        gpus_per_worker: `nvidia.com/gpu` limit per pod (0: none).
        cpu / memory: optional resource requests per pod (e.g. "4", "16Gi").
        volume_claim: optional PersistentVolumeClaim (ReadWriteMany) mounted at
            `mount_path` in every pod: the shared --workdir every worker restores from
            (or use a gs:// workdir instead).
    Returns:
        dict, apply with `kubectl apply -f` after dumping as JSON (valid YAML).
    """
    if num_workers < 1:
        raise errors.ConfigError(f"--num_workers must be >= 1; Received: {num_workers}")
    hosts = [f"{name}-worker-{i}.{name}:{port}" for i in range(num_workers)]
    meta = {"namespace": namespace} if namespace else {}
    labels = {"app": name}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, **meta, "labels": labels},
               # Headless: NAME-worker-I.NAME resolves to the pod with that hostname.
               "spec": {"clusterIP": "None", "selector": labels,
                        "publishNotReadyAddresses": True,
                        "ports": [{"name": "grpc", "port": port}]}}
    items = [service]
    for i in range(num_workers):
        resources = {}
        if gpus_per_worker:
            resources["limits"] = {"nvidia.com/gpu": int(gpus_per_worker)}
        requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
        if requests:
            resources["requests"] = requests
        container = {
            "name": "worker", "image": image, "command": list(command),
            "ports": [{"containerPort": port, "name": "grpc"}],
            "env": [{"name": "TF_CONFIG", "value": json.dumps(
                {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}})}]}
        if resources:
            container["resources"] = resources
        volumes = []
        if volume_claim:
            container["volumeMounts"] = [{"name": "workdir", "mountPath": mount_path}]
            volumes = [{"name": "workdir",
                        "persistentVolumeClaim": {"claimName": volume_claim}}]
        items.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-worker-{i}", **meta,
                         "labels": {**labels, "worker-index": str(i)}},
            "spec": {"hostname": f"{name}-worker-{i}", "subdomain": name,
                     # A lost worker fails the others within --peer_timeout_s; each pod
                     # then restarts in place and the group resumes from the latest
                     # checkpoint in the shared workdir (exit 143 after a preemption too).
                     "restartPolicy": "OnFailure", "containers": [container],
                     **({"volumes": volumes} if volumes else {})}})
    return {"apiVersion": "v1", "kind": "List", "items": items}
