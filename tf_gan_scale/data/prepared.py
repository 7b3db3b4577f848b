"""Prepared datasets: ArrayRecord shards of raw uint8 pixels + labels, and their JSON.

`tools/prepare_data.py` writes one; the source `arrayrecord:DIR` reads it. Like
BigGAN-PyTorch's pre-resized HDF5 (make_hdf5.py) and StyleGAN2-ADA's dataset_tool.py,
preparation decodes (and center-crops / resizes) every image once, so training reads
fixed-size records by index: any row of any epoch in one read, on any number of workers
(the input pipeline computes which example each global row is), no decoding at all.

DIR/
  dataset.json                  FORMAT, num_examples, shape, num_classes, class_names,
                                source, shards [{file, num_examples, bytes, sha256}],
                                content_hash (sha256 of the shards' sha256s, in order)
  data-00000-of-0000S.array_record   records 0..n0-1, then the next shard, ...

A record is int32 label (little-endian) followed by the H*W*C pixel bytes, written with
group_size 1 (a random read decompresses one record, not a group). Shard s holds a
contiguous run of examples, so global index i is the i-th record over the shards in order.
"""

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tf_gan_scale import errors

FORMAT = "tf_gan_scale.arrayrecord/1"
META = "dataset.json"
_LABEL_BYTES = 4
# Hashes are re-checked at load time up to this many bytes of shards (cheap); larger
# datasets check sizes and counts at load and hashes with `prepare_data.py --verify`.
VERIFY_HASH_BYTES = 2 ** 30


def shard_name(index, count):
    return f"data-{index:05d}-of-{count:05d}.array_record"


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_hash(shard_hashes):
    return hashlib.sha256("".join(shard_hashes).encode()).hexdigest()


def write(out_dir, batches, *, num_examples, shape, num_classes, class_names=(), source="",
          num_shards=1):
    """Writes a prepared dataset; `out_dir` must not exist yet (nothing is overwritten).

    Args:
        batches: iterable of (x uint8 [n, *shape], labels int [n]) in dataset order,
            num_examples rows in all.
        num_shards: shards of contiguous examples (sizes differ by at most one).
    Returns:
        The dataset.json dict. Written into a temporary sibling directory, renamed to
        `out_dir` at the end: an interrupted preparation leaves no partial dataset.
    """
    from array_record.python import array_record_module  # Only preparing writes shards.
    if os.path.exists(out_dir):
        raise errors.ConfigError(f"--out={out_dir!r} exists; valid: a new directory "
                                 f"(a prepared dataset is never overwritten)")
    if not 1 <= num_shards <= max(num_examples, 1):
        raise errors.ConfigError(f"--num_shards={num_shards} must be in [1, {num_examples}] "
                                 f"(the number of examples)")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".preparing-", dir=parent)
    try:
        bounds = [num_examples * s // num_shards for s in range(num_shards + 1)]
        shards, written, writer, shard = [], 0, None, -1
        record_bytes = int(np.prod(shape))
        for x, labels in batches:
            x = np.ascontiguousarray(x, np.uint8)
            if tuple(x.shape[1:]) != tuple(shape):
                raise errors.ConfigError(f"example {written} has shape {x.shape[1:]}, the "
                                         f"dataset {tuple(shape)}")
            labels = np.asarray(labels).astype("<i4")
            if written + len(x) > num_examples:
                raise errors.ConfigError(f"the source gave more than the {num_examples} "
                                         f"examples its count says")
            for i in range(len(x)):
                while written >= bounds[shard + 1]:  # Next shard.
                    if writer is not None:
                        writer.close()
                    shard += 1
                    path = os.path.join(tmp, shard_name(shard, num_shards))
                    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
                    shards.append({"file": shard_name(shard, num_shards),
                                   "num_examples": bounds[shard + 1] - bounds[shard]})
                assert x[i].size == record_bytes
                writer.write(labels[i].tobytes() + x[i].tobytes())
                written += 1
        if writer is not None:
            writer.close()
        if written != num_examples:
            raise errors.ConfigError(f"the source gave {written} examples, its count says "
                                     f"{num_examples}")
        for s in shards:
            path = os.path.join(tmp, s["file"])
            s["bytes"], s["sha256"] = os.path.getsize(path), _sha256(path)
        meta = {"format": FORMAT, "num_examples": num_examples, "shape": list(shape),
                "num_classes": num_classes, "class_names": list(class_names),
                "source": source, "shards": shards,
                "content_hash": content_hash([s["sha256"] for s in shards])}
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(meta, f, indent=1)
        os.rename(tmp, out_dir)  # Fails (nothing lost) if out_dir appeared meanwhile.
        return meta
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_meta(path, *, verify_hashes=None):
    """dataset.json of a prepared directory, checked against the shards on disk: every
    problem is one ConfigError naming the directory or file and what would fit.

    verify_hashes: re-hash every shard (None: when the shards total at most
    VERIFY_HASH_BYTES)."""
    meta_path = os.path.join(path, META)
    if not os.path.isdir(path):
        raise errors.ConfigError(f"prepared dataset not found: {path!r}; make one with "
                                 f"tools/prepare_data.py --out={path}")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise errors.ConfigError(f"{path!r} has no {META}; valid: a directory written by "
                                 f"tools/prepare_data.py") from None
    except (OSError, ValueError) as e:
        raise errors.ConfigError(f"cannot read {meta_path!r}: {e}") from None
    keys = ("format", "num_examples", "shape", "num_classes", "shards", "content_hash")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or any(
            k not in meta for k in keys):
        raise errors.ConfigError(f"{meta_path!r} is not a {FORMAT} description (keys: "
                                 f"{', '.join(keys)}); rewrite it with tools/prepare_data.py")
    shards = meta["shards"]
    if not isinstance(shards, list) or not all(
            isinstance(s, dict) and {"file", "num_examples", "bytes", "sha256"} <= set(s)
            for s in shards):
        raise errors.ConfigError(f"{meta_path!r}: every shard needs file, num_examples, "
                                 f"bytes and sha256; rewrite it with tools/prepare_data.py")
    total = sum(s["bytes"] for s in shards)
    if sum(s["num_examples"] for s in shards) != meta["num_examples"]:
        raise errors.ConfigError(f"{meta_path!r}: the shards hold "
                                 f"{sum(s['num_examples'] for s in shards)} examples, "
                                 f"num_examples says {meta['num_examples']}")
    check = total <= VERIFY_HASH_BYTES if verify_hashes is None else verify_hashes
    for s in shards:
        shard = os.path.join(path, s["file"])
        if not os.path.isfile(shard):
            raise errors.ConfigError(f"shard {shard!r} of {path!r} is missing ({len(shards)} "
                                     f"shards listed in {META})")
        if os.path.getsize(shard) != s["bytes"]:
            raise errors.ConfigError(f"shard {shard!r} has {os.path.getsize(shard)} bytes, "
                                     f"{META} says {s['bytes']}: truncated or replaced")
        if check and _sha256(shard) != s["sha256"]:
            raise errors.ConfigError(f"shard {shard!r} does not match its sha256 in {META} "
                                     f"(content hash {meta['content_hash'][:12]}...): "
                                     f"corrupt or replaced; prepare the dataset again")
    if content_hash([s["sha256"] for s in shards]) != meta["content_hash"]:
        raise errors.ConfigError(f"{meta_path!r}: content_hash does not match the shards' "
                                 f"hashes; prepare the dataset again")
    return meta


def reader(path, meta):
    """read(indices) for a prepared directory (see sources.Source.read)."""
    from array_record.python import array_record_data_source  # Only prepared data needs it.

    try:
        rows = array_record_data_source.ArrayRecordDataSource(
            [os.path.join(path, s["file"]) for s in meta["shards"]])
    except (RuntimeError, ValueError, OSError) as e:  # A damaged shard (unhashed: large).
        raise errors.ConfigError(f"cannot open the shards of {path!r}: "
                                 f"{str(e).strip().splitlines()[0]}; check them with "
                                 f"tools/prepare_data.py --verify={path}") from None
    shape = tuple(meta["shape"])
    width = _LABEL_BYTES + int(np.prod(shape))

    def fetch(indices):
        # ONE read for the batch; the records are fixed-width, so the whole batch is
        # one [n, width] uint8 array with no Python loop over pixels.
        got = b"".join(rows.__getitems__(indices.tolist()))
        if len(got) != len(indices) * width:
            raise ValueError(f"{path}: records are not {width} bytes; prepare it again")
        return np.frombuffer(got, np.uint8).reshape(len(indices), width)

    def read(indices):
        raw = tf.numpy_function(fetch, [indices], tf.uint8, stateful=False)
        labels = tf.bitcast(tf.reshape(raw[:, :_LABEL_BYTES], [-1, _LABEL_BYTES]), tf.int32)
        x = tf.reshape(raw[:, _LABEL_BYTES:], [-1, *shape])
        return {"x": x, "label": tf.reshape(labels, [-1])}
    return read
