"""Try a multi-worker run on one box: N local workers on free loopback ports.

    python tools/launch_local.py --num_workers=2 [--devices_per_worker=K] \
        [--max_restarts=R] [--grace_s=30] -- \
        python -m tf_gan_scale.main --strategy=multi_worker_mirrored \
            --config=experiments/digits.py --workdir=/tmp/digits_mw

Every worker gets its TF_CONFIG; logs stream prefixed `[worker i]` (`[client i]` with
--mesh: the names the binary gives its own lines, which are not prefixed twice); Ctrl-C/SIGTERM go to
all workers (each saves a preemption checkpoint and exits 143); if any worker fails, all
are ended and the launcher exits non-zero, after restarting the group up to
--max_restarts times (the training command resumes from its latest checkpoint).
With --devices_per_worker=K each worker gets K GPUs (CUDA_VISIBLE_DEVICES) or, on CPU,
`--num_cpu_devices=K` appended to its command. See tf_gan_scale/cluster/launch.py.

A DTensor mesh over all workers (model / hybrid parallelism, one DTensor client per
worker; B x M = workers x devices per worker):

    python tools/launch_local.py --num_workers=2 --mesh=batch:1,model:2 -- \
        python -m tf_gan_scale.main --config=experiments/digits.py --workdir=/tmp/digits_mc
"""

import sys

from absl import flags

from tf_gan_scale import cli, errors
from tf_gan_scale.cluster import launch

flags.DEFINE_integer("num_workers", None, "Number of worker processes.")
flags.DEFINE_integer("devices_per_worker", 1, "GPUs (or logical CPUs) per worker.")
flags.DEFINE_integer("max_restarts", 0, "Restart the whole group this many times on failure.")
flags.DEFINE_float("grace_s", 30.0, "Seconds workers get to exit before SIGKILL.")
flags.DEFINE_string("mesh", None, "batch:B,model:M: start the workers as DTensor clients "
                    "of one mesh (DTENSOR_* instead of TF_CONFIG; --mesh added to the command).")
FLAGS = flags.FLAGS


def main(argv):
    cmd = argv[1:]
    if not cmd:
        raise errors.ConfigError("no command: put it after `--`, e.g. tools/launch_local.py "
                                 "--num_workers=2 -- python -m tf_gan_scale.main ...")
    if FLAGS.num_workers is None:
        raise errors.ConfigError("--num_workers is required (>= 1)")
    if FLAGS.max_restarts < 0:
        raise errors.ConfigError(f"--max_restarts must be >= 0; Received: {FLAGS.max_restarts}")
    num_gpus = launch.num_local_gpus()
    try:  # Bad counts fail here, on one line, before any worker starts.
        launch.worker_commands(cmd, FLAGS.num_workers, FLAGS.devices_per_worker, num_gpus,
                               ports=[0] * FLAGS.num_workers, mesh=FLAGS.mesh)
    except ValueError as e:
        raise errors.ConfigError(str(e)) from None
    sys.exit(launch.launch(cmd, FLAGS.num_workers, devices_per_worker=FLAGS.devices_per_worker,
                           max_restarts=FLAGS.max_restarts, grace_s=FLAGS.grace_s,
                           num_gpus=num_gpus, mesh=FLAGS.mesh))


if __name__ == "__main__":
    cli.run(main, positional=True)
