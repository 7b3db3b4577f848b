"""Data sources, selected by a `KIND:ARGUMENT` string (`config.data.source`).

  tfds:NAME[:SPLIT][@SIZE]  a TensorFlow Datasets dataset ("image" feature, optional
                      "label"); honours --tfds_data_dir; SPLIT defaults to "train". @SIZE
                      (e.g. tfds:imagenet2012@128) center-crops every image to a square
                      and resizes it to SIZE x SIZE (area-antialiased bilinear, rounded to
                      uint8), as BigGAN's ImageNet preprocessing; needed for datasets of
                      variable image size.
  npz:PATH            an np.savez archive: array `x` or `images`, optional `y` or `labels`.
                      uint8 is scaled to [-1, 1]; [N, H, W] gets a channel axis; float
                      arrays are used as is (see the checks below).
  folder:PATH         image files (png/jpg/jpeg/bmp/gif), all one size, either all at the
                      root (label 0) or all in class sub-folders (label: sorted sub-folder
                      index). Names starting with "." are skipped.
  arrayrecord:DIR     a dataset prepared by tools/prepare_data.py (ArrayRecord shards of
                      uint8 pixels + labels, dataset.json): random access, any size.
  toy:grid25|ring8    2D mixtures of Gaussians from PacGAN (Lin et al. 2018).
  embedded:digits     scikit-learn's 1,797 handwritten digits (8x8, ships inside the
                      package, so it needs no network): the default.

Three kinds of access (data/pipeline.py turns each into per-worker batches):
  - in memory (`arrays`): npz, toy, embedded, folders and TFDS datasets up to
    IN_MEMORY_BYTES of pixels;
  - random access (`read`): prepared ArrayRecord directories, TFDS datasets built as
    ArrayRecord, larger folders (one file per example);
  - streams (`stream`): TFDS datasets built as TFRecord and larger than memory; they
    cannot seek, so their order depends on the number of workers (docs/data.md).
The first two give every global row its example (topology-independent, O(1) resume).

Bad input fails at load time, before training, with one ConfigError naming the file/value:
  - npz: a .npy file (np.save) or any non-zip file; object arrays (never unpickled).
  - float examples: NaN or inf (count, first bad example); images [N, H, W(, C)] outside
    [-1, 1] +- RANGE_TOLERANCE, e.g. 0..255 (vectors [N, D] are unbounded; images with
    min >= 0 only log a warning: probably [0, 1]). Labels must be whole numbers.
  - folder: root images next to sub-folders holding images; sizes that differ; files PIL
    cannot open or verify() (catches cut PNGs). In-memory folders then decode every file,
    naming the first that fails (e.g. a cut JPEG/GIF/BMP). Streamed ones (over
    IN_MEMORY_BYTES, read file by file) are only verified, as a full decode pass would
    cost as much as an epoch: a JPEG/GIF/BMP corrupt past its header fails in training,
    with TF's error (tools/prepare_data.py decodes every file once, up front).
  - folder, mixed grey/RGB/RGBA files (GIF counts as RGB): converted, with a warning naming
    a file of each kind, to the widest kind present: grey is replicated to RGB, missing
    alpha is opaque (255); nothing is dropped.
"""

import dataclasses
import os
import re
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from tf_gan_scale import errors
from tf_gan_scale.data import prepared

DEFAULT_SOURCE = "embedded:digits"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
TOY_NUM_EXAMPLES = 100_000  # PacGAN's training-set size for the 2D mixtures.
RANGE_TOLERANCE = 0.01  # Float images may exceed [-1, 1] by rounding; 0..255 is far out.


@dataclasses.dataclass(frozen=True)
class Source:
    """A data source: in-memory arrays, a random-access reader, or a stream (exactly one).

    Raw examples are {"x": uint8 [*shape] pixels or float32 [*shape] (used as is),
    "label": int32 []}; `to_float` maps them to model space after batching (so shuffle
    buffers hold uint8).

    Attributes:
        name: the spec it was loaded from.
        num_examples: int.
        shape: example shape, e.g. (H, W, C) or (D,).
        num_classes: number of labels (1 when unlabeled).
        arrays: {"x": [N, *shape], "label": int32 [N]} numpy arrays (maybe memory-mapped).
        read: random access without holding the data: read(indices int64 [n] tensor) ->
            raw examples {"x": [n, *shape], "label": int32 [n]} in TF ops (one batched
            read per call: call it per per-replica batch, never per example).
        stream: for sources that cannot seek: stream(num_shards, index) -> an unbatched
            tf.data.Dataset of raw examples, the index-th of num_shards disjoint parts
            that together cover the data once (a plain Dataset is split with `shard`).
    """
    name: str
    num_examples: int
    shape: tuple
    num_classes: int
    arrays: dict = None
    read: Any = None
    stream: Any = None

    def reader(self):
        """read(indices) for in-memory and random-access sources; None for streams."""
        if self.read is not None:
            return self.read
        if self.arrays is None:
            return None
        x, labels = self.arrays["x"], self.arrays["label"]
        dtype = tf.uint8 if x.dtype == np.uint8 else tf.float32

        def read(indices):
            # A numpy gather (one call per batch) instead of tf.constant(x): no second
            # copy of the array in the graph.
            got_x, got_label = tf.numpy_function(
                lambda i: (x[i], labels[i]), [indices], [dtype, tf.int32], stateful=False)
            got_x.set_shape([None, *self.shape])
            got_label.set_shape([None])
            return {"x": got_x, "label": got_label}
        return read

    def shard(self, num_shards, index):
        """The stream's index-th of num_shards parts (streams only)."""
        if isinstance(self.stream, tf.data.Dataset):
            return self.stream.shard(num_shards, index)
        return self.stream(num_shards, index)


def examples(source, num=None):
    """The first `num` (default all) raw examples of `source` in stored order, unbatched.
    For a stream, its one-part order."""
    num = source.num_examples if num is None else num
    if source.arrays is not None:
        return tf.data.Dataset.from_tensor_slices(
            {"x": source.arrays["x"][:num], "label": source.arrays["label"][:num]})
    if source.read is not None:
        read = source.read
        ds = tf.data.Dataset.range(num).batch(256).map(read, deterministic=True)
        return ds.unbatch()
    return source.shard(1, 0).take(num)


# Sources up to this many bytes of raw pixels are held in memory (exact, cheap shuffling);
# the environment variable sets another limit (more RAM; 0 makes every TFDS TFRecord
# build stream, as the tests of streamed resume do).
IN_MEMORY_BYTES = int(os.environ.get("TF_GAN_SCALE_IN_MEMORY_BYTES", 2 ** 30))


def to_float(x):
    """Raw examples to model space: uint8 pixels -> [-1, 1] float32; floats as they are."""
    if x.dtype == tf.uint8:
        return tf.cast(x, tf.float32) / 127.5 - 1.0
    return tf.cast(x, tf.float32)


def from_arrays(name, x, labels):
    """Source from in-memory arrays: x [N, ...] (uint8 or float), labels [N] or None.

    Float x must be finite, and in [-1, 1] if images [N, H, W(, C)] (else ConfigError).
    """
    x = np.asarray(x)
    if x.ndim == 3:  # [N, H, W] grayscale -> [N, H, W, 1]
        x = x[..., None]
    if not (np.issubdtype(x.dtype, np.floating) or x.dtype == np.uint8):
        raise errors.ConfigError(
            f"{name}: examples must be uint8 or float; Received: dtype={x.dtype}")
    if x.ndim < 2 or len(x) == 0:
        raise errors.ConfigError(f"{name}: need a non-empty array [N, ...]; Received: "
                                 f"shape={x.shape}")
    if x.dtype != np.uint8:
        with np.errstate(over="ignore"):  # Overflow to inf is reported as non-finite.
            x = _checked_floats(name, x.astype(np.float32, copy=False))
    labels = np.zeros(len(x), np.int32) if labels is None else _checked_labels(name, labels)
    if len(labels) != len(x):
        raise errors.ConfigError(f"{name}: {len(labels)} labels for {len(x)} examples")
    return Source(name, len(x), tuple(x.shape[1:]), int(labels.max()) + 1,
                  arrays={"x": x, "label": labels})


def _checked_floats(name, x):
    """x float32 [N, ...] -> x; raises on NaN/inf, and on images outside [-1, 1]."""
    finite = np.isfinite(x)  # After the float32 cast, so float64 overflow counts too.
    if not finite.all():
        first = int(np.argmin(finite.reshape(len(x), -1).all(axis=1)))
        bad = x[first][~finite[first]].flat[0]
        raise errors.ConfigError(
            f"{name}: {finite.size - np.count_nonzero(finite)} non-finite values (NaN or inf) "
            f"in the examples; the first is in example {first} ({bad}); fix or drop them")
    if x.ndim == 4:  # Images: the generator's tanh output lives in [-1, 1]. Vectors: any.
        lo, hi = float(x.min()), float(x.max())
        if lo < -1 - RANGE_TOLERANCE or hi > 1 + RANGE_TOLERANCE:
            raise errors.ConfigError(
                f"{name}: float images must be in [-1, 1]; Received: min={lo:g}, max={hi:g}; "
                f"pass uint8 pixels (0..255) or scale to [-1, 1]")
        if lo >= 0:
            logging.warning("%s: float images span [%g, %g], not [-1, 1]; if they are in "
                            "[0, 1], pass x * 2 - 1", name, lo, hi)
    return x


def _checked_labels(name, labels):
    """labels [N] (any shape with N elements), integer or whole floats -> int32 [N]."""
    labels = np.asarray(labels).reshape(-1)
    if labels.dtype.kind not in "biuf":  # bool, int, uint, float.
        raise errors.ConfigError(f"{name}: labels must be integers; Received: "
                                 f"dtype={labels.dtype}")
    if labels.dtype.kind == "f":  # int32 casts would make NaN -2**31, 2.5 2.
        wrong = ~np.isfinite(labels) | (labels != np.round(labels))
        if wrong.any():
            i = int(np.argmax(wrong))
            raise errors.ConfigError(f"{name}: labels must be integers; Received: "
                                     f"label[{i}]={labels[i]}")
    return labels.astype(np.int32)


def center_crop_resize(image, size):
    """uint8 [H, W, C] -> uint8 [size, size, C]: the central square, resized with
    antialiasing (BigGAN / BigGAN-PyTorch's ImageNet preprocessing)."""
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    side = tf.minimum(h, w)
    image = tf.image.crop_to_bounding_box(image, (h - side) // 2, (w - side) // 2, side, side)
    image = tf.image.resize(image, [size, size], antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)


def _tfds(arg, tfds_data_dir=None):
    import tensorflow_datasets as tfds  # Heavy import, only when asked for.
    arg_spec, _, size = arg.partition("@")
    name, _, split = arg_spec.partition(":")
    split = split or "train"
    if size and not (size.isdigit() and int(size) >= 1):
        raise errors.ConfigError(f"tfds:{arg}: the size after '@' must be an integer >= 1; "
                                 f"Received: {size!r}")
    rows = ds = None
    try:
        info = tfds.builder(name, data_dir=tfds_data_dir).info
        if str(info.file_format).lower().endswith("array_record"):
            # Random access: images stay encoded until a batch is read (_tfds_reader).
            rows = tfds.data_source(name, split=split, data_dir=tfds_data_dir,
                                    download=False,
                                    decoders={"image": tfds.decode.SkipDecoding()})
        else:
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
    if size:
        size = int(size)
        shape = (size, size, shape[-1])
    if size and ds is not None:
        ds = ds.map(lambda ex: dict(ex, image=center_crop_resize(ex["image"], size)),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if None in shape:
        raise errors.ConfigError(f"TFDS dataset {name!r} has variable image size {shape}; "
                                 f"valid: tfds:{arg_spec}@SIZE (center crop + resize), or "
                                 f"an npz/folder source")
    if rows is not None:
        source = Source(f"tfds:{arg}", len(rows), shape, num_classes,
                        read=_tfds_reader(rows, shape, has_label, size))
        if len(rows) * int(np.prod(shape)) > IN_MEMORY_BYTES:
            return source
        batch = next(iter(examples(source).batch(len(rows))))
        return dataclasses.replace(from_arrays(source.name, batch["x"].numpy(),
                                               batch["label"].numpy()),
                                   num_classes=num_classes)
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
    def stream(num_shards, index):
        # Each part is a contiguous 1/num_shards of the split's examples (any number of
        # parts, also more than files): a worker reads only its part.
        part = tfds.even_splits(split, num_shards)[index]
        part_ds = tfds.load(name, split=part, data_dir=tfds_data_dir, shuffle_files=False)
        return part_ds.map(lambda ex: _raw_tfds(ex, has_label, size),
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    return Source(f"tfds:{arg}", num_examples, shape, num_classes, stream=stream)


def _raw_tfds(ex, has_label, size):
    """A TFDS example -> a raw example {"x": uint8 [H, W, C], "label": int32 []}."""
    image = center_crop_resize(ex["image"], size) if size else ex["image"]
    label = tf.cast(ex["label"], tf.int32) if has_label else tf.constant(0, tf.int32)
    return {"x": image, "label": label}


def _tfds_reader(rows, shape, has_label, size):
    """read(indices) over a TFDS ArrayRecord data source whose images stay encoded."""
    channels = shape[-1]

    def fetch(indices):
        got = rows.__getitems__(indices.tolist())
        labels = [ex["label"] if has_label else 0 for ex in got]
        return (np.array([ex["image"] for ex in got], dtype=object),
                np.array(labels, np.int32))

    def decode(encoded):
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        return center_crop_resize(image, size) if size else tf.ensure_shape(image, shape)

    def read(indices):
        encoded, labels = tf.numpy_function(fetch, [indices], [tf.string, tf.int32],
                                            stateful=False)
        x = tf.map_fn(decode, encoded, fn_output_signature=tf.TensorSpec(shape, tf.uint8))
        labels.set_shape([None])
        return {"x": x, "label": labels}
    return read


def _npz(path, tfds_data_dir=None):
    del tfds_data_dir
    if not os.path.isfile(path):
        raise errors.ConfigError(f"npz file not found: {path!r}")
    with open(path, "rb") as f:
        magic = f.read(6)
    if not magic.startswith(b"PK"):  # np.load would return a .npy's array, or unpickle.
        what = "a .npy array file" if magic == b"\x93NUMPY" else "another kind of file"
        raise errors.ConfigError(f"npz file {path!r} is {what}, not an .npz archive; make "
                                 f"one with np.savez(path, x=array)")
    try:
        arrays = np.load(path)  # allow_pickle=False: loading data never runs code.
    except Exception as e:
        raise errors.ConfigError(f"cannot read npz file {path!r}: {e}") from None
    with arrays:
        keys = list(arrays.keys())
        xk = next((k for k in ("x", "images") if k in keys), None)
        if xk is None:
            raise errors.ConfigError(f"npz file {path!r} has no array 'x' or 'images'; "
                                     f"arrays: {', '.join(keys) or 'none'}")
        yk = next((k for k in ("y", "labels") if k in keys), None)
        x = _npz_array(path, arrays, xk)
        y = _npz_array(path, arrays, yk) if yk else None
    return from_arrays(f"npz:{path}", x, y)


def _npz_array(path, arrays, key):
    """arrays[key] as an ndarray; object arrays (need pickle) and bad members: ConfigError."""
    try:
        return arrays[key]
    except Exception as e:  # Object arrays: "cannot be loaded when allow_pickle=False".
        dtype = None
        try:  # The member's .npy header (np.savez writes version 1.0) names the dtype.
            with arrays.zip.open(key + ".npy") as f:
                if np.lib.format.read_magic(f) == (1, 0):
                    dtype = np.lib.format.read_array_header_1_0(f)[2]
        except Exception:
            pass
        if dtype is not None and not dtype.hasobject:  # A damaged member, not objects.
            message = f"cannot read array {key!r}: {e}"
        else:
            message = (f"array {key!r} has dtype={dtype or 'object'} (Python objects, e.g. "
                       f"ragged arrays of different shapes), which is never unpickled; save one "
                       f"numeric array, e.g. np.savez(path, {key}=np.stack(list_of_arrays))")
        raise errors.ConfigError(f"npz file {path!r}: {message}") from None


# PIL mode -> channels kept by decoding: grey modes 1 (an "LA" alpha is dropped), RGBA 4,
# anything else (RGB, palette "P", CMYK, YCbCr) 3.
_MODE_CHANNELS = {"1": 1, "L": 1, "LA": 1, "I": 1, "I;16": 1, "I;16B": 1, "I;16L": 1,
                  "F": 1, "RGBA": 4}
_KINDS = {1: "grey", 3: "RGB", 4: "RGBA"}


def _images_in(directory):
    return [os.path.join(directory, f) for f in sorted(os.listdir(directory))
            if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".")
            and os.path.isfile(os.path.join(directory, f))]


def _folder_files(path):
    """(files [N], labels [N], num_classes) of an image folder; see the module docstring."""
    subdirs = sorted(d for d in os.listdir(path)
                     if not d.startswith(".") and os.path.isdir(os.path.join(path, d)))
    root = _images_in(path)
    classes = [_images_in(os.path.join(path, d)) for d in subdirs]
    if root and any(classes):  # Root files would silently share label 0 with a class.
        shown = ", ".join(subdirs[:3]) + (", ..." if len(subdirs) > 3 else "")
        raise errors.ConfigError(
            f"image folder {path!r} has images at its root (e.g. {os.path.basename(root[0])!r}) "
            f"next to class sub-folders ({shown}); move the root images into a sub-folder, "
            f"or remove the sub-folders")
    if root:  # Sub-folders holding no images are not classes.
        return root, [0] * len(root), 1
    files = [f for fs in classes for f in fs]
    labels = [label for label, fs in enumerate(classes) for _ in fs]
    return files, labels, max(len(subdirs), 1)


def _to_channels(img, channels):
    """uint8 [H, W, c] as decoded (c: 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA) -> [H, W, channels].

    Grey is replicated to RGB; alpha is kept for 4 channels, opaque (255) when missing.
    channels == 1 only when every file is grey (a grey file decoded as RGB has R = G = B).
    """
    if channels == 1:
        return img[..., :1]
    c = tf.shape(img)[-1]
    rgb = tf.gather(img, tf.where(c < 3, [0, 0, 0], [0, 1, 2]), axis=-1)
    if channels == 3:
        return rgb
    return tf.concat([rgb, tf.where(c % 2 == 0, img[..., -1:], tf.constant(255, tf.uint8))], -1)


def scan_folder(path, *, any_size=False):
    """Lists and checks an image folder (see the module docstring): every header is read
    up front so a stray file fails now, by name. verify() also reads a PNG's chunks and
    checksums (a cut PNG fails), but not JPEG/GIF/BMP pixel data.

    Returns (files [N], labels [N], num_classes, shape (H, W, C)); with `any_size`
    (images to be resized) sizes may differ and shape is (None, None, C)."""
    from PIL import Image  # Only image folders need Pillow.
    if not os.path.isdir(path):
        raise errors.ConfigError(f"image folder not found: {path!r}")
    files, labels, num_classes = _folder_files(path)
    if not files:
        raise errors.ConfigError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in {path!r}")
    size, kinds = None, {}  # kinds: channels -> [number of files, first file].
    for f in files:
        try:
            with Image.open(f) as im:
                s, c = (im.height, im.width), _MODE_CHANNELS.get(im.mode, 3)
                im.verify()
        except Exception as e:
            raise errors.ConfigError(f"cannot read image {f!r}: {e}") from None
        kinds.setdefault(c, [0, f])[0] += 1
        if size is None:
            size = s
        elif s != size and not any_size:
            raise errors.ConfigError(f"image {f!r} is {s[0]}x{s[1]}, the first image "
                                     f"{files[0]!r} is {size[0]}x{size[1]}; all must match")
    shape = (None, None) if any_size else size
    shape += (max(kinds),)  # The widest kind: the conversion loses nothing.
    if len(kinds) > 1:
        logging.warning("folder:%s mixes %s images; all are converted to %s", path, ", ".join(
            f"{_KINDS[c]} ({n}, e.g. {f!r})" for c, (n, f) in sorted(kinds.items())),
            _KINDS[shape[2]])
    return files, labels, num_classes, shape


def decode_file(f, shape):
    """An image file's path (string tensor) -> uint8 [*shape], channels converted."""
    img = tf.io.decode_image(tf.io.read_file(f), expand_animations=False)
    img = _to_channels(img, shape[2])
    img.set_shape(shape)
    return img


def decode_error(e):
    """The first line of a decode OpError, without TensorFlow's frames."""
    return re.sub(r"\{\{.*?\}\}\s*|.*Iterator::\S+: |\s*\[Op:.*", "",
                  e.message.strip().splitlines()[0])


def _folder(path, tfds_data_dir=None):
    del tfds_data_dir
    files, labels, num_classes, shape = scan_folder(path)

    def decode(f, label):
        return {"x": decode_file(f, shape), "label": label}

    ds = tf.data.Dataset.from_tensor_slices((files, np.array(labels, np.int32)))
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    name = f"folder:{path}"
    if len(files) * int(np.prod(shape)) <= IN_MEMORY_BYTES:
        xs = []
        try:
            for ex in ds.as_numpy_iterator():
                xs.append(ex["x"])
        except tf.errors.OpError as e:  # In order (deterministic): the next file failed.
            raise errors.ConfigError(
                f"cannot decode image {files[len(xs)]!r}: {decode_error(e)}") from None
        source = from_arrays(name, np.stack(xs), np.array(labels, np.int32))
        return dataclasses.replace(source, num_classes=num_classes)
    file_names = tf.constant(files)
    file_labels = tf.constant(np.array(labels, np.int32))

    def read(indices):  # One file per row, read and decoded in TF ops.
        x = tf.map_fn(lambda f: decode_file(f, shape), tf.gather(file_names, indices),
                      fn_output_signature=tf.TensorSpec(shape, tf.uint8))
        return {"x": x, "label": tf.gather(file_labels, indices)}
    return Source(name, len(files), shape, num_classes, read=read)


def toy_centers(kind):
    """(centers float64 [M, 2], std) of the toy mixture `kind` (grid25, ring8): the one
    place for these constants (the toy source and tf_gan_scale.toy_metrics read them)."""
    if kind == "grid25":  # 25 modes at (-4 + 2i, -4 + 2j), std 0.05.
        g = np.arange(-4, 5, 2, dtype=np.float64)
        return np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2), 0.05
    if kind == "ring8":  # 8 modes on the unit circle, std 0.01.
        a = 2 * np.pi * np.arange(8) / 8
        return np.stack([np.cos(a), np.sin(a)], -1), 0.01
    raise errors.ConfigError(f"unknown toy dataset {kind!r}; valid: grid25, ring8")


def _toy(kind, tfds_data_dir=None):
    del tfds_data_dir
    centers, std = toy_centers(kind)
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


def _arrayrecord(path, tfds_data_dir=None):
    del tfds_data_dir
    meta = prepared.read_meta(path)
    return Source(f"arrayrecord:{path}", meta["num_examples"], tuple(meta["shape"]),
                  max(int(meta["num_classes"]), 1), read=prepared.reader(path, meta))


SOURCES = {"tfds": _tfds, "npz": _npz, "folder": _folder, "arrayrecord": _arrayrecord,
           "toy": _toy, "embedded": _embedded}


def load(spec, *, tfds_data_dir=None):
    """Loads a Source from a `KIND:ARGUMENT` string; bad specs raise ConfigError."""
    kind, sep, arg = str(spec).partition(":")
    loader = errors.choose("data source kind", kind, SOURCES)
    if not sep or not arg:
        raise errors.ConfigError(f"data source {spec!r} needs an argument: {kind}:...")
    return loader(arg, tfds_data_dir=tfds_data_dir)
