"""Prepares a dataset for training at scale: ArrayRecord shards of uint8 pixels + labels.

    python tools/prepare_data.py --source=folder:/data/imagenet/train --resolution=128 \
        --out=/data/imagenet128
    python -m tf_gan_scale.main --config=experiments/biggan_imagenet128.py --workdir=DIR \
        --config.data.source=arrayrecord:/data/imagenet128
    python tools/prepare_data.py --verify=/data/imagenet128     # re-hash every shard

--source is any image source of the framework (folder:PATH, npz:PATH with uint8 images,
tfds:NAME[:SPLIT][@SIZE]); --resolution center-crops every image to a square and resizes
it (area-antialiased, BigGAN's ImageNet preprocessing; folders of mixed sizes need it).
Every image is decoded once here, so a bad file fails now, named, not in training. The
output (tf_gan_scale/data/prepared.py describes it) is deterministic (the same input gives
the same content hash), written into a temporary directory and renamed at the end, and an
existing --out is never overwritten. Prints one JSON line: {"out", "num_examples", "shape",
"num_classes", "num_shards", "content_hash"}. Bad input: one `error:` line, exit 2.

Training reads it by index (`arrayrecord:DIR`): the same example order on any number of
workers, each worker reading only its rows, and resume at any step without reading.
"""

import json
import math
import sys

from absl import flags

from tf_gan_scale import cli, errors

flags.DEFINE_string("source", None, "The data source to prepare: folder:PATH, npz:PATH, "
                    "tfds:NAME[:SPLIT][@SIZE].")
flags.DEFINE_string("out", None, "The directory to write (must not exist).")
flags.DEFINE_integer("resolution", 0, "Center-crop to a square and resize to this size "
                     "(0: keep the source's size, which must be one size).")
flags.DEFINE_integer("num_shards", 0, "Shards to write (0: about SHARD_BYTES each).")
flags.DEFINE_string("tfds_data_dir", None, "TFDS data directory for tfds: sources.")
flags.DEFINE_string("verify", None, "Instead: check a prepared directory (every shard's "
                    "size and sha256, the counts) and print its description.")
FLAGS = flags.FLAGS

SHARD_BYTES = 256 * 2 ** 20
_CHUNK = 256  # Examples per write batch.


def _folder_examples(path, resolution):
    """(count, shape, num_classes, class_names, iterator of (x [n, ...], labels [n])) of
    an image folder, every file decoded (a failure names the file)."""
    import os

    import numpy as np
    import tensorflow as tf

    from tf_gan_scale.data import sources
    files, labels, num_classes, shape = sources.scan_folder(path, any_size=bool(resolution))
    if resolution:
        shape = (resolution, resolution, shape[2])

    def decode(f):
        img = sources.decode_file(f, (None, None, shape[2]))
        return sources.center_crop_resize(img, resolution) if resolution else img

    def chunks():
        ds = tf.data.Dataset.from_tensor_slices(files).map(
            decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        xs, done = [], 0
        try:
            for x in ds.as_numpy_iterator():
                xs.append(x)
                if len(xs) == _CHUNK:
                    yield np.stack(xs), np.array(labels[done:done + len(xs)])
                    done, xs = done + len(xs), []
        except tf.errors.OpError as e:  # In order (deterministic): the next file failed.
            raise errors.ConfigError(f"cannot decode image {files[done + len(xs)]!r}: "
                                     f"{sources.decode_error(e)}") from None
        if xs:
            yield np.stack(xs), np.array(labels[done:])

    # Label i is the i-th sorted sub-folder (sources._folder_files), images or not.
    subdirs = sorted(d for d in os.listdir(path)
                     if not d.startswith(".") and os.path.isdir(os.path.join(path, d)))
    names = subdirs if num_classes > 1 else []
    return len(files), shape, num_classes, names, chunks()


def _source_examples(spec, resolution, tfds_data_dir):
    """As _folder_examples, for any other source of uint8 images."""
    import numpy as np
    import tensorflow as tf

    from tf_gan_scale import data
    from tf_gan_scale.data import sources
    source = data.load(spec, tfds_data_dir=tfds_data_dir)
    ds = sources.examples(source)
    if ds.element_spec["x"].dtype != tf.uint8 or len(source.shape) != 3:
        raise errors.ConfigError(f"--source={spec} has {ds.element_spec['x'].dtype.name} "
                                 f"examples of shape {source.shape}; valid: uint8 images "
                                 f"[H, W, C] (folder:, npz: of uint8, tfds:)")
    shape = source.shape
    if resolution:
        shape = (resolution, resolution, shape[2])
        ds = ds.map(lambda e: {"x": sources.center_crop_resize(e["x"], resolution),
                               "label": e["label"]}, deterministic=True)
    batches = ((b["x"], b["label"]) for b in ds.batch(_CHUNK).as_numpy_iterator())
    del np
    return source.num_examples, shape, source.num_classes, [], batches


def main(argv):
    del argv
    from tf_gan_scale.data import prepared
    if FLAGS.verify:
        meta = prepared.read_meta(FLAGS.verify, verify_hashes=True)
        print(json.dumps({k: meta[k] for k in ("num_examples", "shape", "num_classes",
                                               "content_hash")} | {"verified": FLAGS.verify}))
        return
    if not FLAGS.source or not FLAGS.out:
        raise errors.ConfigError("--source and --out are required (or --verify=DIR)")
    if FLAGS.resolution < 0:
        raise errors.ConfigError(f"--resolution={FLAGS.resolution} must be >= 0")
    if FLAGS.num_shards < 0:
        raise errors.ConfigError(f"--num_shards={FLAGS.num_shards} must be >= 0")
    import os
    if os.path.exists(FLAGS.out):  # Before any decoding: nothing is overwritten.
        raise errors.ConfigError(f"--out={FLAGS.out!r} exists; valid: a new directory "
                                 f"(a prepared dataset is never overwritten)")
    kind, _, arg = FLAGS.source.partition(":")
    if kind == "folder":
        count, shape, classes, names, batches = _folder_examples(arg, FLAGS.resolution)
    else:
        count, shape, classes, names, batches = _source_examples(
            FLAGS.source, FLAGS.resolution, FLAGS.tfds_data_dir)
    shards = FLAGS.num_shards or max(1, math.ceil(count * math.prod(shape) / SHARD_BYTES))
    meta = prepared.write(FLAGS.out, batches, num_examples=count, shape=shape,
                          num_classes=classes, class_names=names, source=FLAGS.source,
                          num_shards=min(shards, count))
    print(json.dumps({"out": FLAGS.out, "num_examples": count, "shape": list(shape),
                      "num_classes": classes, "num_shards": len(meta["shards"]),
                      "content_hash": meta["content_hash"]}))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
