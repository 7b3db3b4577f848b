"""PacGAN's mode-collapse metrics for a run trained on a 2D toy mixture (toy:grid25, toy:ring8).

    python tools/toy_metrics.py --workdir=DIR [--num_samples=2500] [--seed=0] \
        [--checkpoint=DIR/checkpoints/ckpt-N] [--noema]

Draws --num_samples samples (PacGAN: 2,500) from the generator of the run's latest checkpoint
(or --checkpoint; its EMA weights if the run keeps an EMA, config.train.ema.decay > 0, unless
--noema), in inference mode, from the fixed latents of --seed (sample i depends on
(seed, i) only, as in tools/sample.py), and scores them against the run's mixture
(tf_gan_scale.toy_metrics.mode_metrics): a sample is high quality within 3 standard
deviations of its nearest mode, a mode is captured if a high-quality sample is nearest to
it, reverse KL = KL(mode distribution of the high-quality samples || uniform), in nats.
Prints one JSON line: {"step", "checkpoint", "modes", "num_modes", "high_quality" (a
fraction), "reverse_kl" (null if no sample is high quality), "num_samples"}.
A run whose data source is not toy:* fails with one line (exit 2).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tf_gan_scale import cli, errors  # noqa: E402

flags.DEFINE_string("workdir", None, "Training run directory (trained on a toy:* source).")
flags.DEFINE_integer("num_samples", 2500, "Generator samples (PacGAN: 2,500).")
flags.DEFINE_integer("seed", 0, "Latent seed: sample i comes from (seed, i).")
flags.DEFINE_string("checkpoint", None, "A checkpoint path (default: the latest in workdir).")
flags.DEFINE_bool("ema", True, "Score the EMA generator when the run has one.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if not FLAGS.workdir:
        raise errors.ConfigError("--workdir is required")
    if FLAGS.num_samples < 1:
        raise errors.ConfigError(f"--num_samples must be >= 1; Received: {FLAGS.num_samples}")
    from tf_gan_scale import gan, latents
    from tf_gan_scale.artifacts import sampling
    from tf_gan_scale.metrics import toy
    from tf_gan_scale import training
    from tf_gan_scale.data import sources
    spec = training.load_run(FLAGS.workdir)[0].data.source
    kind, _, name = str(spec).partition(":")
    if kind != "toy":
        raise errors.ConfigError(
            f"run {FLAGS.workdir!r} was trained on {spec!r}, not a toy:* source; the mode "
            f"metrics need toy:grid25 or toy:ring8")
    centers, std = sources.toy_centers(name)
    generator, latent_dim, step, path = sampling.load_generator(
        FLAGS.workdir, checkpoint=FLAGS.checkpoint, ema=FLAGS.ema)
    z = latents.fixed(FLAGS.seed, FLAGS.num_samples, latent_dim)
    samples = gan.generate(generator, z).numpy()
    scores = toy.mode_metrics(samples, centers, std)
    print(json.dumps({"step": step, "checkpoint": path, "modes": scores["modes"],
                      "num_modes": len(centers), "high_quality": scores["high_quality"],
                      "reverse_kl": scores["reverse_kl"], "num_samples": len(samples)}))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
