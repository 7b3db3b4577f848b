"""Feature extractors: each kind against a direct run of the network it wraps (the frozen
graph through a TF1 session, the Keras model called as is), the spec / file / shape
errors as one-line ConfigErrors, and one device vs the 2-replica `mirrored2` strategy.
Nothing is downloaded: InceptionV3 runs with random or locally saved weights."""

import contextlib
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale.errors import ConfigError
from tf_gan_scale.metrics import extractors, frozen_graph


def images(shape, n=3, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n,) + tuple(shape)).astype("float32")


def assert_one_line(error, *fragments):
    text = str(error.value)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, text


# ---- fid_inception: a small graph with the names of classify_image_graph_def.pb --------

GRAPH_DIM, GRAPH_CLASSES = 8, 5


def old_batch_norm(graph_def, name, inputs, scale):
    """Turns the Identity `name` into the pre-2016 BatchNormWithGlobalNormalization op the
    real file uses (TF no longer builds it: only a GraphDef can hold it)."""
    node = next(n for n in graph_def.node if n.name == name)
    node.op = "BatchNormWithGlobalNormalization"
    del node.input[:]
    node.input.extend(inputs)
    node.attr["variance_epsilon"].f = 1e-3
    node.attr["scale_after_normalization"].b = scale


def write_inception_like_graph(path, prefix=""):
    """A batch-1, GraphDef-version-8 TF1 graph shaped like TTUR's file: JPEG decoder ->
    'ExpandDims' [1, H, W, 3] in [0, 255] -> resize + (x - 128) / 128 -> conv -> old batch
    norms -> 'pool_3' [1, 1, 1, D] -> 'pool_3/_reshape' [1, D] -> 'softmax/logits/MatMul'
    -> bias -> 'softmax'."""
    rng = np.random.default_rng(7)
    const = lambda *shape: tf.constant(rng.normal(size=shape).astype("float32"))  # noqa: E731
    graph = tf.Graph()
    scope = tf.compat.v1.name_scope(prefix) if prefix else contextlib.nullcontext()
    with graph.as_default(), scope:
        contents = tf.compat.v1.placeholder(tf.string, [], name="DecodeJpeg/contents")
        pixels = tf.cast(tf.io.decode_jpeg(contents, channels=3, name="DecodeJpeg"),
                         tf.float32, name="Cast")
        x = tf.expand_dims(pixels, 0, name="ExpandDims")
        x = tf.compat.v1.image.resize_bilinear(x, tf.constant([11, 11]), name="ResizeBilinear")
        x = tf.multiply(tf.subtract(x, 128.0, name="Sub"), 1 / 128, name="Mul")
        x = tf.nn.conv2d(x, const(3, 3, 3, GRAPH_DIM), 2, "VALID", name="conv")
        stats = [const(GRAPH_DIM), tf.abs(const(GRAPH_DIM)), const(GRAPH_DIM), const(GRAPH_DIM)]
        x = tf.nn.relu(tf.identity(x, name="conv/batchnorm"))
        x = tf.identity(x, name="conv/batchnorm_1")
        pool = tf.nn.avg_pool2d(x, 5, 1, "VALID", name="pool_3")
        flat = tf.reshape(pool, [1, GRAPH_DIM], name="pool_3/_reshape")
        w = tf.constant(rng.normal(size=(GRAPH_DIM, GRAPH_CLASSES)).astype("float32"),
                        name="softmax/weights")
        logits = tf.nn.bias_add(tf.matmul(flat, w, name="softmax/logits/MatMul"),
                                tf.constant(rng.normal(size=GRAPH_CLASSES).astype("float32")),
                                name="softmax/logits")
        tf.nn.softmax(logits, name="softmax")
    graph_def = graph.as_graph_def()
    p, names = prefix + "/" if prefix else "", [t.op.name for t in stats]
    old_batch_norm(graph_def, p + "conv/batchnorm", [p + "conv"] + names, scale=True)
    old_batch_norm(graph_def, p + "conv/batchnorm_1", [p + "Relu"] + names, scale=False)
    graph_def.versions.producer = 8  # as old as the real file: TF1 sessions run it as is
    with open(path, "wb") as f:
        f.write(graph_def.SerializeToString())
    return str(path)


def run_graph_directly(path, pixels, prefix=""):
    """improved-gan's way: one image at a time into ExpandDims:0 (batch 1, as stored);
    probs = softmax(pool_3 @ softmax weights), no bias."""
    graph_def = tf.compat.v1.GraphDef()
    with open(path, "rb") as f:
        graph_def.ParseFromString(f.read())
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    feats, probs = [], []
    with tf.compat.v1.Session(graph=graph) as sess:
        for image in pixels:
            pool, logits = sess.run([prefix + "pool_3:0", prefix + "softmax/logits/MatMul:0"],
                                    {prefix + "ExpandDims:0": image[None]})
            feats.append(pool.reshape(-1))
            e = np.exp(logits[0] - logits[0].max())
            probs.append(e / e.sum())
    return np.array(feats), np.array(probs)


@pytest.mark.parametrize("prefix", ["", "FID_Inception_Net/"])
@pytest.mark.parametrize("channels", [3, 1])
def test_fid_inception_matches_the_graph_run_directly(tmp_path, prefix, channels):
    path = write_inception_like_graph(tmp_path / "g.pb", prefix.rstrip("/"))
    data_shape = (17, 13, channels)
    extractor = extractors.get(f"fid_inception:{path}", data_shape)
    assert (extractor.name, extractor.feature_dim, extractor.num_classes) == (
        f"fid_inception:{os.path.abspath(path)}", GRAPH_DIM, GRAPH_CLASSES)
    x = images(data_shape)
    # [-1, 1] -> TTUR's float pixel values [0, 255]; grey repeated to RGB.
    pixels = np.repeat((x + 1) * 127.5, 3 // channels, axis=-1)
    want_feats, want_probs = run_graph_directly(path, pixels, prefix)
    eager = extractor(x)
    traced = tf.function(extractor)(tf.constant(x))  # static batch 3 through batch-1 file
    for out in (eager, traced):
        assert set(out) == {"features", "probs"}
        np.testing.assert_allclose(out["features"], want_feats, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["probs"], want_probs, rtol=1e-5, atol=1e-7)


def test_frozen_graph_modernize_clears_devices_and_old_batch_norms(tmp_path):
    graph_def = frozen_graph.read(write_inception_like_graph(tmp_path / "g.pb"))
    graph_def.node[0].device = "/job:worker/task:3/device:CPU:0"  # pinned by its exporter
    new = frozen_graph.modernize(graph_def)
    assert {n.device for n in new.node} == {""}
    ops = [n.op for n in new.node]
    assert "BatchNormWithGlobalNormalization" not in ops
    # scale=True: eps, v+eps, rsqrt, *gamma, x-m, *, +beta; scale=False: one Mul fewer.
    assert len(new.node) == len(graph_def.node) - 2 + 7 + 6


def test_fid_inception_bad_files(tmp_path):
    with pytest.raises(ConfigError) as e:
        extractors.get(f"fid_inception:{tmp_path}/none.pb", (8, 8, 3))
    assert_one_line(e, "none.pb", "not found", "inception-2015-12-05.tgz")
    (tmp_path / "junk.pb").write_bytes(b"\xff\xfe not a protobuf at all")
    with pytest.raises(ConfigError) as e:
        extractors.get(f"fid_inception:{tmp_path}/junk.pb", (8, 8, 3))
    assert_one_line(e, "junk.pb", "not a GraphDef")
    graph = tf.Graph()  # a valid GraphDef with other names
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="input")
        tf.reduce_mean(x, axis=[1, 2], name="features")
    (tmp_path / "other.pb").write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(ConfigError) as e:
        extractors.get(f"fid_inception:{tmp_path}/other.pb", (8, 8, 3))
    assert_one_line(e, "other.pb", "'ExpandDims:0'", "'pool_3:0'", "FID_Inception_Net/")
    good = write_inception_like_graph(tmp_path / "g.pb")
    with pytest.raises(ConfigError) as e:
        extractors.get(f"fid_inception:{good}", (8, 8, 2))
    assert_one_line(e, "1 or 3 channels", "(8, 8, 2)")


# ---- PATH.keras -------------------------------------------------------------------------

def save_model(path, head, shape=(8, 8, 1)):
    """A tiny classifier; head: 'dense_softmax', 'softmax_layer' or None (features only)."""
    x = inputs = keras.Input(shape)
    x = keras.layers.Conv2D(4, 3, activation="relu")(x)
    x = keras.layers.BatchNormalization()(x)  # inference mode must use moving statistics
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(6, activation="tanh", name="penultimate")(x)
    if head == "dense_softmax":
        x = keras.layers.Dense(4, activation="softmax")(x)
    elif head == "softmax_layer":
        x = keras.layers.Softmax()(keras.layers.Dense(4)(x))
    model = keras.Model(inputs, x)
    bn = model.layers[2]
    bn.moving_mean.assign(np.full(4, 0.3, "float32"))  # not the batch statistics
    model.save(path)
    return model


@pytest.mark.parametrize("head", ["dense_softmax", "softmax_layer", None])
def test_keras_file_features_and_probs_equal_direct_calls(tmp_path, head):
    path = str(tmp_path / "clf.keras")
    model = save_model(path, head)
    extractor = extractors.get(path, (8, 8, 1))
    assert extractors.get(f"keras:{path}", (8, 8, 1)).name == f"keras:{path}" == extractor.name
    x = images((8, 8, 1))
    out = tf.function(extractor)(tf.constant(x))
    if head is None:
        assert (extractor.feature_dim, extractor.num_classes) == (6, None)
        assert set(out) == {"features"}
        np.testing.assert_allclose(out["features"], model(x, training=False), rtol=1e-6)
        return
    assert (extractor.feature_dim, extractor.num_classes) == (6, 4)
    penultimate = keras.Model(model.input, model.get_layer("penultimate").output)
    np.testing.assert_allclose(out["features"], penultimate(x, training=False), rtol=1e-6)
    np.testing.assert_allclose(out["probs"], model(x, training=False), rtol=1e-6)


def test_keras_file_errors(tmp_path):
    path = str(tmp_path / "clf.keras")
    save_model(path, "dense_softmax")
    with pytest.raises(ConfigError) as e:
        extractors.get(path, (16, 16, 1))
    assert_one_line(e, path, "(8, 8, 1)", "(16, 16, 1)")
    with pytest.raises(ConfigError) as e:
        extractors.get(str(tmp_path / "none.keras"), (8, 8, 1))
    assert_one_line(e, "none.keras", "not found")
    (tmp_path / "junk.keras").write_bytes(b"not a zip")
    with pytest.raises(ConfigError) as e:
        extractors.get(str(tmp_path / "junk.keras"), (8, 8, 1))
    assert_one_line(e, "junk.keras", "cannot load")
    maps = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3)])
    maps.save(tmp_path / "maps.keras")  # [N, 6, 6, 2]: not features
    with pytest.raises(ConfigError) as e:
        extractors.get(str(tmp_path / "maps.keras"), (8, 8, 1))
    assert_one_line(e, "maps.keras", "(None, 6, 6, 2)", "features [N, D]")
    extractor = extractors.get(path, (8, 8, 1))
    with pytest.raises(ConfigError) as e:
        extractor(images((8, 8, 3)))
    assert_one_line(e, "[B, 8, 8, 1]", "[3, 8, 8, 3]")


def test_stacked_runs_the_classifier_per_channel_and_joins_the_classes(tmp_path):
    # Stacked MNIST's protocol: channel c's class is the c-th digit of the mode, channel 0
    # the most significant; features side by side.
    path = str(tmp_path / "clf.keras")
    model = save_model(path, "dense_softmax")  # 4 classes -> 4^3 = 64 modes.
    extractor = extractors.get(f"stacked:{path}", (8, 8, 3))
    assert (extractor.feature_dim, extractor.num_classes) == (18, 64)
    assert extractor.name == f"stacked:{path}"
    x = images((8, 8, 3))
    out = tf.function(extractor)(tf.constant(x))
    per = [model(x[..., c:c + 1], training=False).numpy() for c in range(3)]
    joint = np.einsum("ba,bd,bc->badc", per[0], per[1], per[2]).reshape(len(x), 64)
    np.testing.assert_allclose(out["probs"], joint, rtol=1e-5)
    modes = per[0].argmax(1) * 16 + per[1].argmax(1) * 4 + per[2].argmax(1)
    np.testing.assert_array_equal(np.argmax(out["probs"], 1), modes)
    penultimate = keras.Model(model.input, model.get_layer("penultimate").output)
    np.testing.assert_allclose(
        out["features"],
        np.concatenate([penultimate(x[..., c:c + 1], training=False) for c in range(3)], 1),
        rtol=1e-6)
    save_model(str(tmp_path / "features.keras"), None)
    with pytest.raises(ConfigError) as e:
        extractors.get(f"stacked:{tmp_path / 'features.keras'}", (8, 8, 3))
    assert_one_line(e, "features.keras", "needs a classifier")


def test_unknown_specs_and_misplaced_weights(tmp_path):
    for spec in ["inception", "fid_inception:", "keras:", "stacked:", "model.h5", ""]:
        with pytest.raises(ConfigError) as e:
            extractors.get(spec, (8, 8, 3))
        assert_one_line(e, f"unknown extractor {spec!r}", *extractors.KINDS)
    with pytest.raises(ConfigError) as e:
        extractors.get("x.keras", (8, 8, 3), weights="w.h5")
    assert_one_line(e, "only applies to inception_v3", "'w.h5'")
    with pytest.raises(ConfigError) as e:
        extractors.get("inception_v3", (8, 8))
    assert_one_line(e, "(H, W, C)", "(8, 8)")


# ---- inception_v3 -----------------------------------------------------------------------

def test_inception_v3_without_weights_fails_fast_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # empty cache
    monkeypatch.setenv(extractors.OFFLINE_ENV, "1")
    start = time.time()
    with pytest.raises(ConfigError) as e:
        extractors.get("inception_v3", (32, 32, 3))
    cached = os.path.join(str(tmp_path), "models", extractors.INCEPTION_V3_FILE)
    assert_one_line(e, "--extractor_weights=PATH", cached, "TF_GAN_SCALE_OFFLINE")
    # With a network that answers but a download that fails: caught, one line.
    monkeypatch.delenv(extractors.OFFLINE_ENV)
    monkeypatch.setattr(extractors, "_no_network_reason", lambda: None)

    def failing_download(*args, **kwargs):
        raise Exception("URL fetch failure on https://...: None -- [Errno -2] no DNS\nmore")
    monkeypatch.setattr(keras.utils, "get_file", failing_download)
    with pytest.raises(ConfigError) as e:
        extractors.get("inception_v3", (32, 32, 3))
    assert_one_line(e, "--extractor_weights=PATH", cached, "download failed: URL fetch")
    with pytest.raises(ConfigError) as e:
        extractors.get("inception_v3", (32, 32, 3), weights=str(tmp_path / "none.h5"))
    assert_one_line(e, "none.h5", "not found")
    assert time.time() - start < 5


@pytest.mark.slow
def test_inception_v3_shapes_and_weight_files(tmp_path, monkeypatch):
    """Random weights (no download): pool features [B, 2048] and 1000-way probs of the
    resized, grey-to-RGB input; then the same weights loaded from the keras cache, and a
    corrupt weights file."""
    monkeypatch.setenv(extractors.OFFLINE_ENV, "1")
    extractor = extractors._inception_v3_extractor((16, 16, 1), None)
    assert (extractor.name, extractor.feature_dim, extractor.num_classes) == (
        "inception_v3", 2048, 1000)
    x = images((16, 16, 1), n=2)
    out = tf.function(extractor)(tf.constant(x))
    assert out["features"].shape == (2, 2048) and out["probs"].shape == (2, 1000)
    np.testing.assert_allclose(np.sum(out["probs"], axis=1), 1.0, rtol=1e-5)
    # keras.applications names: "avg_pool" = GlobalAveragePooling2D, "predictions" = softmax.
    layers = extractor.model.get_layer
    reference = keras.Model(extractor.model.input, [layers("avg_pool").output,
                                                    layers("predictions").output])
    rgb = tf.image.resize(np.repeat(x, 3, axis=-1), [299, 299], method="bilinear")
    want = reference(rgb, training=False)
    np.testing.assert_allclose(out["features"], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["probs"], want[1], rtol=1e-4, atol=1e-7)
    # keras.applications' cache file name, in keras' legacy .h5 format (as downloaded).
    cached = tmp_path / "models" / extractors.INCEPTION_V3_FILE
    cached.parent.mkdir()
    extractor.model.save(cached)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    loaded = extractors.get("inception_v3", (16, 16, 1))  # found in the cache
    assert loaded.weights_path == str(cached)
    np.testing.assert_allclose(loaded(x)["features"], out["features"], rtol=1e-4, atol=1e-5)
    assert extractors._inception_v3_weights(str(cached)) == str(cached)  # weights=PATH
    (tmp_path / "bad.h5").write_bytes(b"corrupt")
    with pytest.raises(ConfigError) as e:
        extractors.get("inception_v3", (16, 16, 1), weights=str(tmp_path / "bad.h5"))
    assert_one_line(e, "cannot load InceptionV3 weights", "bad.h5")


# ---- distributed --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["keras", "fid_inception"])
def test_extractor_in_replica_context_matches_one_device(tmp_path, mirrored2, kind):
    if kind == "keras":
        spec, shape = str(tmp_path / "clf.keras"), (8, 8, 1)
        save_model(spec, "dense_softmax")
    else:
        spec, shape = f"fid_inception:{write_inception_like_graph(tmp_path / 'g.pb')}", (9, 9, 3)
    one_device = extractors.get(spec, shape)
    with mirrored2.scope():
        replicated = extractors.get(spec, shape)
    x = images(shape, n=4)
    dist = mirrored2.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(x).batch(4))

    @tf.function
    def step(batch):
        out = mirrored2.run(replicated, args=(batch,))  # 2 images per replica
        return {k: mirrored2.gather(v, axis=0) for k, v in out.items()}

    got = step(next(iter(dist)))
    want = one_device(x)
    assert set(got) == set(want) == {"features", "probs"}
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)
