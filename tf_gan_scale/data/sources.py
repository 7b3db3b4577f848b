"""Data sources, selected by a `KIND:ARGUMENT` string (`config.data.source`).

  tfds:NAME[:SPLIT]   a TensorFlow Datasets dataset ("image" feature, optional "label");
                      honours --tfds_data_dir; SPLIT defaults to "train".
  npz:PATH            array `x` or `images`, optional `y` or `labels`. uint8 is scaled to
                      [-1, 1]; [N, H, W] gets a channel axis; float arrays are used as is.
  folder:PATH         image files (png/jpg/jpeg/bmp/gif), all one size; files in
                      sub-folders get the sorted sub-folder index as label.
  toy:grid25|ring8    2D mixtures of Gaussians from PacGAN (Lin et al. 2018).
  embedded:digits     scikit-learn's 1,797 handwritten digits (8x8, ships inside the
                      package, so it needs no network): the default.

Sources that fit in memory keep raw arrays (the pipeline permutes indices exactly);
larger ones stream decoded examples {"x": float32 [*shape], "label": int32 []}.
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from tf_gan_scale import errors

DEFAULT_SOURCE = "embedded:digits"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
TOY_NUM_EXAMPLES = 100_000  # PacGAN's training-set size for the 2D mixtures.


@dataclasses.dataclass(frozen=True)
class Source:
    """A data source: either in-memory arrays (random access) or a decoded stream.

    Attributes:
        name: the spec it was loaded from.
        num_examples: int.
        shape: example shape, e.g. (H, W, C) or (D,).
        num_classes: number of labels (1 when unlabeled).
        arrays: {"x": uint8 [N, *shape] (raw pixels) or float32 [N, *shape] (used as is),
            "label": int32 [N]}, or None for streamed sources.
        stream: for sources too large for memory, an unbatched tf.data.Dataset of
            {"x": float32 [*shape], "label": int32 []}; None otherwise.
    """
    name: str
    num_examples: int
    shape: tuple
    num_classes: int
    arrays: dict = None
    stream: tf.data.Dataset = None


# Sources up to this many bytes of raw pixels are held in memory (exact, cheap shuffling).
IN_MEMORY_BYTES = 2 ** 30


def to_float(x):
    """Raw examples to model space: uint8 pixels -> [-1, 1] float32; floats as they are."""
    if x.dtype == tf.uint8:
        return tf.cast(x, tf.float32) / 127.5 - 1.0
    return tf.cast(x, tf.float32)


def from_arrays(name, x, labels):
    """Source from in-memory arrays: x [N, ...] (uint8 or float), labels [N] or None."""
    x = np.asarray(x)
    if x.ndim == 3:  # [N, H, W] grayscale -> [N, H, W, 1]
        x = x[..., None]
    if np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
    elif x.dtype != np.uint8:
        raise errors.ConfigError(
            f"{name}: examples must be uint8 or float; Received: dtype={x.dtype}")
    if x.ndim < 2 or len(x) == 0:
        raise errors.ConfigError(f"{name}: need a non-empty array [N, ...]; Received: "
                                 f"shape={x.shape}")
    if labels is None:
        labels = np.zeros(len(x), np.int32)
    labels = np.asarray(labels).astype(np.int32).reshape(-1)
    if len(labels) != len(x):
        raise errors.ConfigError(f"{name}: {len(labels)} labels for {len(x)} examples")
    return Source(name, len(x), tuple(x.shape[1:]), int(labels.max()) + 1,
                  arrays={"x": x, "label": labels})


def _tfds(arg, tfds_data_dir=None):
    import tensorflow_datasets as tfds  # Heavy import, only when asked for.
    name, _, split = arg.partition(":")
    split = split or "train"
    try:
        ds, info = tfds.load(name, split=split, data_dir=tfds_data_dir, with_info=True,
                             shuffle_files=False)
    except tfds.core.registered.DatasetNotFoundError:
        raise errors.ConfigError(
            f"unknown TFDS dataset {name!r}; valid: the names in tfds.list_builders()") from None
    except Exception as e:  # Missing data, no network, bad split: one line, not a trace.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise errors.ConfigError(
            f"cannot load TFDS dataset {name!r} split {split!r} "
            f"(data_dir={tfds_data_dir or 'default'}): {first}") from None
    features = info.features
    if "image" not in features:
        raise errors.ConfigError(f"TFDS dataset {name!r} has no 'image' feature; "
                                 f"features: {', '.join(features.keys())}")
    has_label = "label" in features
    num_classes = features["label"].num_classes if has_label else 1
    shape = tuple(features["image"].shape)
    if None in shape:
        raise errors.ConfigError(f"TFDS dataset {name!r} has variable image size {shape}; "
                                 f"resize it into an npz or folder source first")
    try:
        num_examples = info.splits[split].num_examples
    except (KeyError, ValueError):
        num_examples = 0
    if not num_examples:  # Mocked or unprepared info: count the dataset.
        num_examples = int(ds.cardinality().numpy())
        if num_examples < 0:
            num_examples = int(ds.reduce(0, lambda n, _: n + 1).numpy())

    if num_examples * int(np.prod(shape)) <= IN_MEMORY_BYTES:
        xs, ys = [], []
        for ex in tfds.as_numpy(ds.batch(4096)):
            xs.append(ex["image"])
            ys.append(ex["label"] if has_label else np.zeros(len(ex["image"]), np.int32))
        source = from_arrays(f"tfds:{arg}", np.concatenate(xs), np.concatenate(ys))
        return dataclasses.replace(source, num_classes=num_classes)

    def convert(ex):
        label = tf.cast(ex["label"], tf.int32) if has_label else tf.constant(0, tf.int32)
        return {"x": to_float(ex["image"]), "label": label}

    stream = ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return Source(f"tfds:{arg}", num_examples, shape, num_classes, stream=stream)


def _npz(path, tfds_data_dir=None):
    del tfds_data_dir
    if not os.path.isfile(path):
        raise errors.ConfigError(f"npz file not found: {path!r}")
    try:
        arrays = np.load(path)
    except Exception as e:
        raise errors.ConfigError(f"cannot read npz file {path!r}: {e}") from None
    keys = list(arrays.keys())
    xk = next((k for k in ("x", "images") if k in keys), None)
    if xk is None:
        raise errors.ConfigError(f"npz file {path!r} has no array 'x' or 'images'; "
                                 f"arrays: {', '.join(keys) or 'none'}")
    yk = next((k for k in ("y", "labels") if k in keys), None)
    return from_arrays(f"npz:{path}", arrays[xk], arrays[yk] if yk else None)


def _folder(path, tfds_data_dir=None):
    del tfds_data_dir
    from PIL import Image
    if not os.path.isdir(path):
        raise errors.ConfigError(f"image folder not found: {path!r}")
    files, labels = [], []
    subdirs = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    for label, sub in [(0, "")] + [(i, d) for i, d in enumerate(subdirs)]:
        directory = os.path.join(path, sub)
        for f in sorted(os.listdir(directory)):
            if f.lower().endswith(IMAGE_EXTENSIONS):
                files.append(os.path.join(directory, f))
                labels.append(label)
    if not files:
        raise errors.ConfigError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in {path!r}")
    # Check every header up front (cheap, no decoding) so a stray file fails now, by name.
    shape = None
    for f in files:
        try:
            with Image.open(f) as im:
                # Grayscale modes decode to 1 channel, RGBA to 4, anything else to RGB.
                s = (im.height, im.width, {"1": 1, "L": 1, "LA": 1, "RGBA": 4}.get(im.mode, 3))
        except Exception as e:
            raise errors.ConfigError(f"cannot read image {f!r}: {e}") from None
        if shape is None:
            shape = s
        elif s[:2] != shape[:2]:
            raise errors.ConfigError(f"image {f!r} is {s[0]}x{s[1]}, the first image "
                                     f"{files[0]!r} is {shape[0]}x{shape[1]}; all must match")
    channels = shape[2]

    def decode(f, label):
        img = tf.io.decode_image(tf.io.read_file(f), channels=channels, expand_animations=False)
        img.set_shape(shape)
        return {"x": img, "label": label}

    ds = tf.data.Dataset.from_tensor_slices((files, np.array(labels, np.int32)))
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    name, num_classes = f"folder:{path}", max(len(subdirs), 1)
    if len(files) * int(np.prod(shape)) <= IN_MEMORY_BYTES:
        x = np.stack([ex["x"] for ex in ds.as_numpy_iterator()])
        source = from_arrays(name, x, np.array(labels, np.int32))
        return dataclasses.replace(source, num_classes=num_classes)
    stream = ds.map(lambda ex: {"x": to_float(ex["x"]), "label": ex["label"]})
    return Source(name, len(files), shape, num_classes, stream=stream)


def _toy_centers(kind):
    if kind == "grid25":  # 25 modes at (-4 + 2i, -4 + 2j), std 0.05.
        g = np.arange(-4, 5, 2, dtype=np.float64)
        return np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2), 0.05
    if kind == "ring8":  # 8 modes on the unit circle, std 0.01.
        a = 2 * np.pi * np.arange(8) / 8
        return np.stack([np.cos(a), np.sin(a)], -1), 0.01
    raise errors.ConfigError(f"unknown toy dataset {kind!r}; valid: grid25, ring8")


def _toy(kind, tfds_data_dir=None):
    del tfds_data_dir
    centers, std = _toy_centers(kind)
    rng = np.random.default_rng(0)  # The dataset is fixed; its order follows config.seed.
    modes = rng.integers(len(centers), size=TOY_NUM_EXAMPLES)
    x = centers[modes] + std * rng.standard_normal((TOY_NUM_EXAMPLES, 2))
    return from_arrays(f"toy:{kind}", x.astype(np.float32), modes)


def _embedded(kind, tfds_data_dir=None):
    del tfds_data_dir
    if kind != "digits":
        raise errors.ConfigError(f"unknown embedded dataset {kind!r}; valid: digits")
    from sklearn.datasets import load_digits  # Ships the data inside the package.
    digits = load_digits()
    x = digits.images.astype(np.float32)[..., None] / 8.0 - 1.0  # 0..16 -> [-1, 1]
    return from_arrays("embedded:digits", x, digits.target)


SOURCES = {"tfds": _tfds, "npz": _npz, "folder": _folder, "toy": _toy, "embedded": _embedded}


def load(spec, *, tfds_data_dir=None):
    """Loads a Source from a `KIND:ARGUMENT` string; bad specs raise ConfigError."""
    kind, sep, arg = str(spec).partition(":")
    loader = errors.choose("data source kind", kind, SOURCES)
    if not sep or not arg:
        raise errors.ConfigError(f"data source {spec!r} needs an argument: {kind}:...")
    return loader(arg, tfds_data_dir=tfds_data_dir)
