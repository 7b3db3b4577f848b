"""Prints a Kubernetes manifest for a multi-worker run: a headless Service and one Pod per
worker, each with its own TF_CONFIG (JSON, which is valid YAML for `kubectl apply -f -`).

    python tools/k8s_manifest.py --name=dcgan --num_workers=4 --image=REGISTRY/tf_gan_scale \
        --gpus_per_worker=1 --volume_claim=runs -- \
        python -m tf_gan_scale.main --strategy=multi_worker_mirrored \
            --config=experiments/dcgan_mnist.py --workdir=/workdir/dcgan | kubectl apply -f -

Workers reach each other as NAME-worker-I.NAME:PORT. The --workdir must be shared (the
--volume_claim mounted at /workdir, or a gs:// path). Pods restart on failure; a lost
worker fails the others within --peer_timeout_s, so the group restarts and resumes from
the latest checkpoint. See tf_gan_scale/cluster/kubernetes.py.
"""

import json
import re

from absl import flags

from tf_gan_scale import cli, errors
from tf_gan_scale.cluster import kubernetes

flags.DEFINE_string("name", None, "Job name (a DNS label): pods NAME-worker-I.")
flags.DEFINE_integer("num_workers", None, "Number of worker pods.")
flags.DEFINE_string("image", None, "Container image with tf_gan_scale installed.")
flags.DEFINE_integer("port", kubernetes.DEFAULT_PORT, "Port each worker listens on.")
flags.DEFINE_string("namespace", None, "Namespace for every object.")
flags.DEFINE_integer("gpus_per_worker", 0, "nvidia.com/gpu per pod.")
flags.DEFINE_string("cpu", None, "CPU request per pod, e.g. 8.")
flags.DEFINE_string("memory", None, "Memory request per pod, e.g. 32Gi.")
flags.DEFINE_string("volume_claim", None, "PersistentVolumeClaim mounted at /workdir.")
FLAGS = flags.FLAGS

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")


def main(argv):
    cmd = argv[1:]
    if not cmd:
        raise errors.ConfigError("no command: put the worker command after `--`")
    if not FLAGS.name or not _DNS_LABEL.match(FLAGS.name):
        raise errors.ConfigError(f"--name must be a DNS label (lowercase letters, digits, "
                                 f"'-', at most 42 characters); Received: {FLAGS.name!r}")
    if not FLAGS.image:
        raise errors.ConfigError("--image is required")
    if FLAGS.num_workers is None:
        raise errors.ConfigError("--num_workers is required (>= 1)")
    manifest = kubernetes.kubernetes_manifest(
        FLAGS.name, FLAGS.num_workers, FLAGS.image, cmd, port=FLAGS.port,
        namespace=FLAGS.namespace, gpus_per_worker=FLAGS.gpus_per_worker, cpu=FLAGS.cpu,
        memory=FLAGS.memory, volume_claim=FLAGS.volume_claim)
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    cli.run(main, positional=True)
