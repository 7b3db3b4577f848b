"""A domain classifier for scoring MNIST-like data: trained on a labelled source, saved as .keras.

    python tools/train_classifier.py --config=experiments/digits.py --output=/tmp/digits.keras

FID / KID / IS / precision-recall on 8x8 digits or MNIST mean little with Inception
features; a small classifier of the domain is the usual extractor. The saved model is its
contract (the metrics' `PATH.keras` extractor relies on it):
  - a functional keras.Model of standard layers (keras.models.load_model needs nothing
    custom; `model.input`, `model.output` and every layer's `.output` are defined);
  - input: images float32 in [-1, 1], NHWC with the data's shape, e.g. [None, 8, 8, 1];
  - last layer `Dense(num_classes, activation="softmax")` named "probs" (IS reads it);
  - the layer before it, `Dense(128, activation="relu")` named "features", is the feature
    layer (FID, KID, PR read `model.get_layer("features").output` = `model.layers[-2]`).

The network (`build`): [Conv3x3 ReLU, MaxPool2] with 32 then 64 filters, more 64-filter
blocks while a side is over 7 (28x28 stops at 7x7, 8x8 goes to 2x2), Dropout(0.25),
Flatten, the feature layer, the softmax. Adam, sparse cross-entropy, a fixed number of
steps of batch `batch_size`, examples drawn by a seeded full shuffle per epoch.

Held-out split (`held_out_mask`): example i is held out iff index_shuffle(i; seed) <
round(fraction * N), a stateless permutation of [0, N): exactly that many examples, fixed
by the seed alone, and never trained on. Streamed sources (over data.sources.
IN_MEMORY_BYTES of pixels) use the same rule on their example positions, and shuffle with
a pipeline.SHUFFLE_BUFFER buffer (a stream sorted by class trains worse).

What the default command reaches, and in what time: docs/evaluation.md.

Deterministic given the seed on one device: weights, dropout and order follow
keras.utils.set_random_seed(seed) and the seeded shuffles.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from tf_gan_scale import data, errors, keras_files

DEFAULT_STEPS = 1000
DEFAULT_BATCH_SIZE = 64
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_HELD_OUT_FRACTION = 0.1
FEATURE_DIM = 128
_SPLIT_SALT = 0x5EED  # Keys the held-out permutation apart from other uses of the seed.
_LABELLED = ("embedded:digits, tfds:mnist, npz:PATH with an array 'y' or 'labels', "
             "folder:PATH with one sub-folder per class")


def check_output(path):
    """Raises ConfigError unless `path` is a new file name ending in .keras."""
    keras_files.check_new(path)


def _check_args(steps, held_out_fraction, batch_size):
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise errors.ConfigError(f"--steps must be an integer >= 1; Received: steps={steps!r}")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise errors.ConfigError(f"--batch_size must be an integer >= 1; Received: "
                                 f"batch_size={batch_size!r}")
    if not 0 < held_out_fraction < 1:
        raise errors.ConfigError(f"--held_out_fraction must be in (0, 1); Received: "
                                 f"held_out_fraction={held_out_fraction!r}")


def _check_source(source):
    if source.num_classes < 2:
        raise errors.ConfigError(
            f"data source {source.name!r} has no labels (1 class); a classifier needs a "
            f"labelled source; valid: {_LABELLED}")
    if len(source.shape) != 3 or min(source.shape[:2]) < 4:
        raise errors.ConfigError(
            f"data source {source.name!r} has examples of shape {source.shape}; a classifier "
            f"needs images [H, W, C] with H, W >= 4; valid: {_LABELLED}")


def held_out_mask(num_examples, held_out_fraction, seed):
    """bool [N]: True for the round(fraction * N) held-out examples, a function of the seed.

    Example i is held out iff its place in a stateless random permutation of [0, N) keyed
    by the seed is below the count, so the count is exact and the split never changes.
    """
    n = int(num_examples)
    k = int(round(held_out_fraction * n))
    if not 0 < k < n:
        raise errors.ConfigError(
            f"--held_out_fraction={held_out_fraction} holds out {k} of {n} examples; "
            f"need at least 1 held out and 1 to train on")
    key = tf.constant([int(seed), _SPLIT_SALT], tf.int64)
    place = tf.random.experimental.index_shuffle(tf.range(n, dtype=tf.int64), key, n - 1)
    return place.numpy() < k


def build(shape, num_classes):
    """The classifier: images [B, *shape] in [-1, 1] -> class probabilities [B, num_classes].

    Args:
        shape: (H, W, C), H and W >= 4.
        num_classes: int >= 2.

    Returns:
        An uncompiled functional keras.Model; `layers[-2]` ("features") is the feature
        layer, `layers[-1]` ("probs") the softmax.
    """
    filters, side = [32, 64], min(shape[:2]) // 4
    while side > 7:  # Larger images: more blocks, so the feature layer stays small.
        filters.append(64)
        side //= 2
    layers = []
    for i, f in enumerate(filters):
        layers += [keras.layers.Conv2D(f, 3, padding="same", activation="relu", name=f"conv{i}"),
                   keras.layers.MaxPooling2D(2, name=f"pool{i}")]
    layers += [keras.layers.Dropout(0.25, name="dropout"),
               keras.layers.Flatten(name="flatten"),
               keras.layers.Dense(FEATURE_DIM, activation="relu", name="features"),
               keras.layers.Dense(num_classes, activation="softmax", name="probs")]
    images = keras.Input(tuple(shape), dtype="float32", name="images")
    x = images
    for layer in layers:
        x = layer(x)
    # Functional, not Sequential: a Keras 3 Sequential has no `model.input` / `.output`.
    return keras.Model(images, x, name="domain_classifier")


def _batches_where(source, mask, batch_size=1024):
    """Yields (x float32 [b, *shape] in [-1, 1], labels int32 [b]) of the examples where
    mask, in order, a batch at a time (a streamed source is never held in memory)."""
    if source.arrays is not None:
        index = np.flatnonzero(mask)
        for i in range(0, len(index), batch_size):
            rows = index[i:i + batch_size]
            yield (data.sources.to_float(tf.constant(source.arrays["x"][rows])).numpy(),
                   source.arrays["label"][rows])
        return
    for batch in _stream_where(source, mask).batch(batch_size).as_numpy_iterator():
        yield batch["x"], batch["label"]


def _stream_where(source, mask):
    """The examples (in model space) of a source not in memory whose position i has
    mask[i], in stored order (read by index, or a stream's one-part order)."""
    keep = tf.constant(np.append(mask, False))  # Positions past N (none expected): out.
    last = len(mask)
    return (data.sources.examples(source).enumerate()
            .filter(lambda i, ex: tf.gather(keep, tf.minimum(i, last)))
            .map(lambda i, ex: {"x": data.sources.to_float(ex["x"]), "label": ex["label"]}))


def _train_dataset(source, train_mask, batch_size, seed):
    """Endless batches (x, label) of the training examples, in a seeded order."""
    if source.arrays is not None:  # Full shuffle: folders are stored sorted by class.
        ds = tf.data.Dataset.from_tensor_slices(
            (source.arrays["x"][train_mask], source.arrays["label"][train_mask]))
        ds = ds.shuffle(int(train_mask.sum()), seed=seed, reshuffle_each_iteration=True)
        ds = ds.repeat().batch(batch_size)
        ds = ds.map(lambda x, y: (data.sources.to_float(x), y))
    else:
        ds = _stream_where(source, train_mask).map(lambda ex: (ex["x"], ex["label"]))
        ds = ds.shuffle(data.pipeline.SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True)
        ds = ds.repeat().batch(batch_size)
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def accuracy(model, batches):
    """Fraction of the examples in `batches` ((x, labels) pairs) whose most probable class
    is their label."""
    correct = total = 0
    for x, labels in batches:
        probs = model.predict_on_batch(x)
        correct += int(np.sum(np.argmax(probs, axis=-1) == labels))
        total += len(labels)
    return correct / total


def fit(source, *, steps=DEFAULT_STEPS, held_out_fraction=DEFAULT_HELD_OUT_FRACTION, seed=0,
        batch_size=DEFAULT_BATCH_SIZE, learning_rate=DEFAULT_LEARNING_RATE):
    """Trains a classifier on `source` (a data.Source) and scores it on its held-out part.

    Returns:
        (model, info): the trained keras.Model (see `build`) and a dict
        {"accuracy", "held_out", "num_classes", "train_examples", "steps", "source"}.

    Raises:
        ConfigError: an unlabelled or non-image source, or bad steps / fraction / batch.
    """
    _check_args(steps, held_out_fraction, batch_size)
    _check_source(source)
    held_out = held_out_mask(source.num_examples, held_out_fraction, seed)
    keras.utils.set_random_seed(seed)  # Weights and dropout masks.
    model = build(source.shape, source.num_classes)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(_train_dataset(source, ~held_out, batch_size, seed), epochs=1,
              steps_per_epoch=int(steps), shuffle=False, verbose=0)
    score = accuracy(model, _batches_where(source, held_out))
    return model, {"accuracy": score, "held_out": int(held_out.sum()),
                   "num_classes": int(source.num_classes),
                   "train_examples": int((~held_out).sum()), "steps": int(steps),
                   "source": source.name}


def save(model, output):
    """Writes `model` to the new file `output` (.keras) without ever overwriting one
    (`keras_files.save_new`)."""
    keras_files.save_new(model, output)


def train(source_spec, output, *, steps=DEFAULT_STEPS,
          held_out_fraction=DEFAULT_HELD_OUT_FRACTION, seed=0, batch_size=DEFAULT_BATCH_SIZE,
          learning_rate=DEFAULT_LEARNING_RATE, tfds_data_dir=None):
    """Loads `source_spec` (e.g. "embedded:digits"), trains (`fit`), saves to `output`.

    Bad input raises ConfigError before anything is written. Returns the JSON line's dict:
    {"output", "accuracy", "held_out", "num_classes", "train_examples", "steps", "source"}.
    """
    check_output(output)
    _check_args(steps, held_out_fraction, batch_size)
    source = data.load(source_spec, tfds_data_dir=tfds_data_dir)
    model, info = fit(source, steps=steps, held_out_fraction=held_out_fraction, seed=seed,
                      batch_size=batch_size, learning_rate=learning_rate)
    save(model, output)
    return {"output": os.fspath(output), **info}
