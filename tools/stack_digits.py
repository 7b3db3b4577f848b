"""Stacked MNIST (VEEGAN, PacGAN, R3GAN's mode-collapse benchmark) from a labelled digit npz.

    python tools/stack_digits.py --source=/work/data/mnist_train.npz --num=50000 \
        --output=/work/data/stacked_train.npz
    python tools/stack_digits.py --source=/work/data/mnist_train_heldout.npz --num=10000 \
        --seed=1 --output=/work/data/stacked_heldout.npz
    python tools/evaluate.py --workdir=DIR --extractor=stacked:mnist_classifier.keras \
        --metrics=fid,classes --reference=npz:/work/data/stacked_heldout.npz

Each example stacks C digits drawn at random (np.random.default_rng(seed), independently,
with replacement) as the C channels of one image: x uint8 [N, H, W, C], label y = the
digits read as a base-K number, channel 0 first (y = 100 d0 + 10 d1 + d2 for 3 channels of
MNIST: 1,000 modes). `--extractor=stacked:PATH.keras` scores with the same convention
(metrics/extractors.py), so "classes" reports the modes covered (class_modes) and the KL of
their frequencies to uniform (class_kl). Written atomically; an existing --output is refused.
Prints one JSON line: {"output", "num_examples", "shape", "num_classes", "modes_present"}.
Bad input (a missing file, images that are not one channel, no labels) is one `error:`
line, exit 2.
"""

import json
import os
import sys

from absl import flags

from tf_gan_scale import cli, errors, images

flags.DEFINE_string("source", None, "An npz of one-channel digits: x [N, H, W, 1], y [N].")
flags.DEFINE_integer("num", 50_000, "Stacked examples to write.")
flags.DEFINE_integer("channels", 3, "Digits per example (Stacked MNIST: 3).")
flags.DEFINE_integer("seed", 0, "Seeds which digits are stacked.")
flags.DEFINE_string("output", None, "The .npz file to write (must not exist).")
FLAGS = flags.FLAGS


def stack(x, y, num, channels, seed):
    """(x uint8 [num, H, W, channels], y int32 [num]) from digits x [N, H, W, 1], y [N] in
    [0, K): example j stacks digits idx[j, 0..C-1], idx ~ uniform (seed); its label is
    sum_c y[idx[j, c]] * K^(C-1-c)."""
    import numpy as np
    k = int(y.max()) + 1
    idx = np.random.default_rng(seed).integers(0, len(x), size=(num, channels))
    images = np.concatenate([x[idx[:, c]] for c in range(channels)], axis=-1)
    labels = np.zeros(num, np.int64)
    for c in range(channels):
        labels = labels * k + y[idx[:, c]]
    return images, labels.astype(np.int32), k ** channels


def main(argv):
    del argv
    import numpy as np
    if not FLAGS.source or not FLAGS.output:
        raise errors.ConfigError("--source and --output are required")
    if not FLAGS.output.endswith(".npz"):
        raise errors.ConfigError(f"--output must end in .npz; Received: {FLAGS.output!r}")
    if os.path.exists(FLAGS.output):
        raise errors.ConfigError(f"--output {FLAGS.output!r} exists; not overwritten")
    if FLAGS.num < 1 or FLAGS.channels < 1:
        raise errors.ConfigError(f"--num and --channels must be >= 1; Received: "
                                 f"num={FLAGS.num}, channels={FLAGS.channels}")
    try:
        with np.load(FLAGS.source) as data:
            x, y = data["x"], data["y"]
    except (OSError, ValueError, KeyError) as e:
        raise errors.ConfigError(f"cannot read --source {FLAGS.source!r} as an npz with x "
                                 f"and y: {type(e).__name__}: {e}") from None
    if x.ndim != 4 or x.shape[-1] != 1 or x.dtype != np.uint8 or y.shape != (len(x),):
        raise errors.ConfigError(f"--source must hold x uint8 [N, H, W, 1] and y [N]; "
                                 f"Received: x {x.dtype} {list(x.shape)}, y {list(y.shape)}")
    stacked, labels, num_classes = stack(x, y.astype(np.int64), FLAGS.num, FLAGS.channels,
                                        FLAGS.seed)
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    images.write_npz(FLAGS.output, stacked, labels)
    print(json.dumps({"output": FLAGS.output, "num_examples": int(len(stacked)),
                      "shape": list(stacked.shape[1:]), "num_classes": int(num_classes),
                      "modes_present": int(len(np.unique(labels)))}))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
