"""Kubernetes: one headless Service and one Pod per worker, each Pod with its own
TF_CONFIG naming the others by stable DNS names (`NAME-worker-I.NAME`);
`tools/k8s_manifest.py` prints it. Imports no TensorFlow."""

import json

from tf_gan_scale import errors
from tf_gan_scale.cluster.env import DEFAULT_PORT


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
