"""Writes generator samples from the latest checkpoint of a training run.

    python tools/sample.py --workdir=DIR --num_samples=64 --seed=0 --output=samples.png
    python tools/sample.py --workdir=DIR --class_id=3 --truncation=0.5 --output=threes.png

Output: `.npy` holds the raw outputs in data space (NHWC images in [-1, 1], or [N, D]
vectors); `.png` a grid (images) or scatter (2D vectors). Prints one JSON line:
{"step": STEP, "checkpoint": PATH, "output": PATH, "num_samples": N}.
Same seed => same latents (tf_gan_scale.latents.fixed) => same samples.
A run trained with an EMA generator (config.train.ema.decay > 0) is sampled from its EMA
weights (--noema: the raw generator). A conditional model samples class --class_id, or
without it one class per grid row (row k: class k). --truncation=t draws latents from a
normal truncated to [-t, t] (the truncation trick: fidelity for variety); for a StyleGAN2
run it is psi in (0, 1], w = w_avg + psi (w - w_avg) (StyleGAN's trick).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tf_gan_scale import cli, errors  # noqa: E402

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_integer("num_samples", 64, "Number of samples.")
flags.DEFINE_integer("seed", 0, "Latent seed.")
flags.DEFINE_string("output", None, "Output file: .npy or .png.")
flags.DEFINE_integer("class_id", None, "Class of every sample (conditional models); "
                     "unset: one class per grid row.")
flags.DEFINE_float("truncation", None, "Truncate latents to [-t, t] (t > 0); StyleGAN2: "
                   "psi in (0, 1] in w space.")
flags.DEFINE_bool("ema", True, "Sample the EMA generator when the run has one.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import numpy as np
    from tf_gan_scale.artifacts import sampling
    if not FLAGS.workdir or not FLAGS.output:
        raise errors.ConfigError("--workdir and --output are required")
    ext = os.path.splitext(FLAGS.output)[1].lower()
    if ext not in (".npy", ".png"):
        raise errors.ConfigError(
            f"--output must end in .npy or .png; Received: {FLAGS.output!r}")
    if FLAGS.num_samples < 1:
        raise errors.ConfigError(f"--num_samples must be >= 1; Received: {FLAGS.num_samples}")
    samples, step, path, cols = sampling.from_workdir(
        FLAGS.workdir, FLAGS.num_samples, FLAGS.seed, class_id=FLAGS.class_id,
        truncation=FLAGS.truncation, ema=FLAGS.ema)
    sampling.write(FLAGS.output, samples, cols)
    print(json.dumps({"step": step, "checkpoint": path, "output": FLAGS.output,
                      "num_samples": int(np.shape(samples)[0])}))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
