"""Scores the generator of a training run's latest checkpoint: FID, KID, IS, precision/recall.

    python tools/evaluate.py --workdir=DIR --extractor=digits_classifier.keras \
        [--checkpoint=DIR/checkpoints/best/ckpt-N] [--metrics=fid,kid,is,pr,classes] \
        [--num_samples=10000] [--seed=0] [--batch_size=256] [--samples=FILE.npy] \
        [--reference=SOURCE] [--allow_rank_deficient] \
        [--strategy=auto|one_device|mirrored|multi_worker_mirrored] [--num_cpu_devices=N]

--extractor: inception_v3 (weights from the Keras cache or --extractor_weights=PATH),
fid_inception:PATH.pb (the frozen graph of the original FID code: numbers comparable with
papers) or PATH.keras (e.g. from tools/train_classifier.py). Real data: the first
--num_real examples (default: as many as --num_samples; -1: all of them, StyleGAN's
"full") of the run's data source (or of --reference=SOURCE, any data source spec); a
request for more than the source holds is one error line; their statistics are cached in --cache_dir (default
~/.cache/tf_gan_scale/reference). Fake example i comes from latents (seed, i), so one
device, N replicas and N workers score the same examples. --samples=FILE.npy scores an
array of images in [-1, 1] instead (from any framework; --workdir is then optional).
A run with an EMA generator is scored by its EMA weights (--noema: the raw ones); a
conditional one with a uniform class label per fake, keyed by (seed, i). `classes` (class
balance: "class_tv", the total variation between the fakes' predicted-class histogram and
the real labels', "class_histogram", "class_modes" and "class_kl", Stacked MNIST's modes
covered and KL to uniform) needs a classifier of the data's classes (--extractor=
stacked:PATH.keras runs a one-channel classifier on each channel: 1,000 classes for 3).
Images are quantized to uint8 levels before extraction. Prints one JSON line: {"step",
"checkpoint", "extractor", "num_samples" (generated), "num_real", "fid", "kid", "kid_std", "is", "is_std",
"precision", "recall", "class_tv", "class_histogram", "class_modes", "class_kl"} (the
requested ones) and the same scores, with their extractor, on one line of stderr.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tf_gan_scale import cli, errors  # noqa: E402

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_string("checkpoint", None, "A checkpoint path (default: the latest in workdir).")
flags.DEFINE_bool("ema", True, "Score the EMA generator when the run has one (--noema: the "
                  "raw generator).")
flags.DEFINE_string("samples", None, "Score this .npy array of images in [-1, 1] instead.")
flags.DEFINE_string("reference", None, "Real data source spec (default: the run's).")
flags.DEFINE_bool("allow_rank_deficient", False, "Allow FID from fewer samples than "
                  "feature dimensions.")
flags.DEFINE_string("extractor", None, "inception_v3 | fid_inception:PATH.pb | PATH.keras")
flags.DEFINE_string("extractor_weights", None, "inception_v3 weights file.")
flags.DEFINE_string("metrics", "fid", "Comma-separated: fid, kid, is, pr, classes "
                    "(class balance: needs a classifier of the data's classes).")
flags.DEFINE_integer("num_samples", 10000, "Generated examples.")
flags.DEFINE_integer("num_real", 0, "Real examples: 0 as many as --num_samples, -1 every one "
                     "(StyleGAN's fid50k_full: --num_samples=50000 --num_real=-1).")
flags.DEFINE_integer("seed", 0, "Latent seed: fake example i comes from (seed, i).")
flags.DEFINE_integer("batch_size", 256, "Global evaluation batch.")
flags.DEFINE_string("cache_dir", "", "Reference statistics cache directory.")
flags.DEFINE_string("strategy", "auto", "auto, one_device, mirrored, multi_worker_mirrored.")
flags.DEFINE_integer("num_cpu_devices", None, "Split the CPU into N logical devices.")
flags.DEFINE_string("tfds_data_dir", None, "TensorFlow Datasets data directory.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if not (FLAGS.workdir or FLAGS.samples) or not FLAGS.extractor:
        raise errors.ConfigError("--workdir (or --samples) and --extractor are required, "
                                 "e.g. --extractor=digits_classifier.keras")
    if FLAGS.samples and not (FLAGS.workdir or FLAGS.reference):
        raise errors.ConfigError("--samples needs --reference=SOURCE (or a --workdir whose "
                                 "source is the reference)")
    from tf_gan_scale import distribute
    distribute.configure_cpu_devices(FLAGS.num_cpu_devices)
    strategy = distribute.make_strategy(FLAGS.strategy, num_cpu_devices=FLAGS.num_cpu_devices)
    from tf_gan_scale import data
    from tf_gan_scale.metrics import scoring
    from tf_gan_scale.artifacts import sampling
    from tf_gan_scale import training
    from tf_gan_scale.metrics import extractors
    names = scoring.check_metrics(FLAGS.metrics)
    if FLAGS.num_samples < 2 or FLAGS.batch_size < 1:
        raise errors.ConfigError(f"--num_samples must be >= 2 and --batch_size >= 1; "
                                 f"Received: {FLAGS.num_samples}, {FLAGS.batch_size}")
    spec = FLAGS.reference or training.load_run(FLAGS.workdir)[0].data.source
    source = data.load(spec, tfds_data_dir=FLAGS.tfds_data_dir)
    samples = generator = latent_dim = step = path = None
    if FLAGS.samples:
        import numpy as np
        try:
            samples = np.load(FLAGS.samples)
        except (OSError, ValueError) as e:
            raise errors.ConfigError(f"cannot read --samples={FLAGS.samples!r}: "
                                     f"{str(e).splitlines()[0]}") from None
        scoring.check_samples(samples, source)
    with strategy.scope():
        if samples is None:
            generator, latent_dim, step, path = sampling.load_generator(
                FLAGS.workdir, checkpoint=FLAGS.checkpoint, ema=FLAGS.ema)
        extractor = extractors.get(FLAGS.extractor, source.shape,
                                   weights=FLAGS.extractor_weights)
    scores = scoring.evaluate(
        generator, latent_dim, source, extractor, strategy, num_samples=FLAGS.num_samples,
        seed=FLAGS.seed, metrics=names, batch_size=FLAGS.batch_size, samples=samples,
        allow_rank_deficient=FLAGS.allow_rank_deficient,
        cache_dir=training.cache_dir(FLAGS.cache_dir),
        write_cache=distribute.is_chief(strategy),
        num_classes=getattr(generator, "num_classes", 0), num_real=FLAGS.num_real)
    print(f"step {step}: {scoring.format_scores(scores)}", file=sys.stderr)
    print(json.dumps({"step": step, "checkpoint": path, **scores}))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
