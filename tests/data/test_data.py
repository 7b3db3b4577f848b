import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from conftest import run_in_process
from tf_gan_scale import data, errors
from tf_gan_scale.data import sources


def batches(ds, n):
    return [{k: v.numpy() for k, v in b.items()} for b in ds.take(n)]


def test_embedded_digits():
    s = data.load("embedded:digits")
    assert (s.num_examples, s.shape, s.num_classes) == (1797, (8, 8, 1), 10)
    b = batches(data.make_dataset(s, global_batch_size=32, seed=0), 1)[0]
    assert b["x"].shape == (32, 8, 8, 1) and b["x"].dtype == np.float32
    assert b["x"].min() == -1.0 and b["x"].max() <= 1.0


def test_npz_uint8_gets_channel_axis_and_scaling(tmp_path):
    x = np.zeros((6, 4, 4), np.uint8)
    x[0] = 255
    path = tmp_path / "d.npz"
    np.savez(path, images=x, labels=np.arange(6))
    s = data.load(f"npz:{path}")
    assert s.shape == (4, 4, 1) and s.num_classes == 6
    b = batches(data.make_dataset(s, global_batch_size=6, seed=0), 1)[0]
    order = b["label"]
    np.testing.assert_array_equal(np.sort(order), np.arange(6))  # One epoch: each once.
    np.testing.assert_array_equal(b["x"][order == 0], 1.0)
    np.testing.assert_array_equal(b["x"][order != 0], -1.0)


def test_npz_float_used_as_is(tmp_path):
    x = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float64) * 7
    np.savez(tmp_path / "v.npz", x=x)
    s = data.load(f"npz:{tmp_path / 'v.npz'}")
    got = batches(data.make_dataset(s, global_batch_size=10, seed=0), 1)[0]["x"]
    np.testing.assert_allclose(np.sort(got, axis=0), np.sort(x, axis=0).astype(np.float32))


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "bad.npz", pixels=np.zeros((2, 2)))
    with pytest.raises(errors.ConfigError, match="no array 'x' or 'images'; arrays: pixels"):
        data.load(f"npz:{tmp_path / 'bad.npz'}")
    with pytest.raises(errors.ConfigError, match="npz file not found"):
        data.load(f"npz:{tmp_path / 'missing.npz'}")


def test_npz_that_is_a_npy_file_or_not_a_zip(tmp_path):
    path = tmp_path / "d.npz"
    with open(path, "wb") as f:  # np.save(f, ...) keeps the name; np.save(path) adds .npy.
        np.save(f, np.zeros((4, 2), np.float32))
    with pytest.raises(errors.ConfigError, match=r"d\.npz' is a \.npy array file, not an \.npz "
                                                 r"archive; make one with np\.savez\(path, x=ar"):
        data.load(f"npz:{path}")
    path.write_text("x,y\n1,2\n")
    with pytest.raises(errors.ConfigError, match=r"d\.npz' is another kind of file, not an "
                                                 r"\.npz archive; make one with np\.savez"):
        data.load(f"npz:{path}")


@pytest.mark.parametrize("key", ["x", "labels"])
def test_npz_object_arrays_are_named_never_unpickled(tmp_path, key):
    ragged = np.empty(2, dtype=object)
    ragged[:] = [np.zeros((4, 4)), np.zeros((5, 4))]
    arrays = {"x": np.zeros((2, 4, 4), np.uint8), "labels": np.arange(2), key: ragged}
    np.savez(tmp_path / "r.npz", **arrays)
    with pytest.raises(errors.ConfigError, match=f"r\\.npz': array '{key}' has dtype=object "
                                                 r"\(Python objects, e\.g\. ragged arrays"):
        data.load(f"npz:{tmp_path / 'r.npz'}")


def test_non_finite_floats_are_counted_and_located(tmp_path):
    x = np.zeros((6, 3))
    x[2, 1], x[4, 0], x[5, 2] = np.nan, -np.inf, 1e300  # 1e300 overflows float32 to inf.
    np.savez(tmp_path / "v.npz", x=x)
    with pytest.raises(errors.ConfigError, match=r"npz:.*v\.npz: 3 non-finite values \(NaN or "
                                                 r"inf\) in the examples; the first is in "
                                                 r"example 2 \(nan\); fix or drop them"):
        data.load(f"npz:{tmp_path / 'v.npz'}")
    images = np.zeros((3, 2, 2, 1), np.float32)
    images[1, 0, 1, 0] = np.inf
    with pytest.raises(errors.ConfigError, match=r"^mem: 1 non-finite .* example 1 \(inf\)"):
        data.from_arrays("mem", images, None)


@pytest.mark.parametrize("shape", [(4, 5, 5, 3), (4, 5, 5)])
def test_float_images_must_be_in_minus_one_one(tmp_path, shape):
    x = np.linspace(0, 255, np.prod(shape)).reshape(shape)
    np.savez(tmp_path / "f.npz", x=x)
    with pytest.raises(errors.ConfigError, match=r"f\.npz: float images must be in \[-1, 1\]; "
                                                 r"Received: min=0, max=255; pass uint8 pixels "
                                                 r"\(0\.\.255\) or scale to \[-1, 1\]$"):
        data.load(f"npz:{tmp_path / 'f.npz'}")
    # Rounding-level overshoot is fine; vectors [N, D] are not bounded (toy:grid25: +-4).
    data.from_arrays("ok", np.full((2, 3, 3, 1), 1.005, np.float32), None)
    assert data.from_arrays("vec", x.reshape(len(x), -1), None).shape == (np.prod(shape[1:]),)


def test_float_images_in_zero_one_load_with_a_warning(caplog):
    x = np.linspace(0, 1, 2 * 3 * 3).reshape(2, 3, 3, 1)
    with caplog.at_level(logging.WARNING):
        s = data.from_arrays("unit", x, None)
    assert s.shape == (3, 3, 1)
    assert "unit: float images span [0, 1], not [-1, 1]; if they are in [0, 1], pass " \
           "x * 2 - 1" in caplog.text


@pytest.mark.parametrize("labels,bad", [([0, 1.5, 2], "label[1]=1.5"),
                                        ([0, np.nan, 2], "label[1]=nan"),
                                        (["a", "b", "c"], "dtype=<U1")])
def test_labels_must_be_whole_numbers(labels, bad):
    with pytest.raises(errors.ConfigError,
                       match=r"^lab: labels must be integers; Received: " + re.escape(bad) + "$"):
        data.from_arrays("lab", np.zeros((3, 2), np.float32), np.array(labels))


def write_image_folder(root, n, bad=None, ext="png"):
    """n 64x64 RGB images 00.EXT.. in root; image `bad` cut to half its bytes (past the
    header, so PIL opens it)."""
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        path = root / f"{i:02d}.{ext}"
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
        if i == bad:
            path.write_bytes(path.read_bytes()[:os.path.getsize(path) // 2])


@pytest.mark.parametrize("ext,streamed,message", [
    ("png", False, "cannot read image '{}': Truncated File Read"),  # PIL verify()
    ("png", True, "cannot read image '{}': Truncated File Read"),
    ("jpg", False, "cannot decode image '{}': jpeg::Uncompress failed. Invalid JPEG data"),
    ("gif", False, "cannot decode image '{}': Invalid GIF data"),  # TensorFlow's decode
    ("bmp", False, "cannot decode image '{}': Input size should match")],
    ids=["png", "png-streamed", "jpg", "gif", "bmp"])
def test_truncated_image_is_named_at_load_time(tmp_path, monkeypatch, ext, streamed, message):
    if streamed:
        monkeypatch.setattr(sources, "IN_MEMORY_BYTES", 0)
    write_image_folder(tmp_path / "d", 12, bad=7, ext=ext)
    with pytest.raises(errors.ConfigError) as e:
        data.load(f"folder:{tmp_path / 'd'}")
    assert str(e.value).startswith(message.format(tmp_path / "d" / f"07.{ext}")), e.value
    assert "\n" not in str(e.value)


def test_a_folder_past_memory_reads_files_by_index_like_the_in_memory_one(tmp_path, monkeypatch):
    write_image_folder(tmp_path, 4)
    want = data.load(f"folder:{tmp_path}")
    monkeypatch.setattr(sources, "IN_MEMORY_BYTES", 0)
    s = data.load(f"folder:{tmp_path}")
    assert s.arrays is None and s.read is not None and s.shape == (64, 64, 3)
    got = s.read(tf.constant([3, 0, 2], tf.int64))
    np.testing.assert_array_equal(got["x"].numpy(), want.arrays["x"][[3, 0, 2]])
    np.testing.assert_array_equal(got["label"].numpy(), want.arrays["label"][[3, 0, 2]])
    for a, b in zip(batches(data.make_dataset(s, global_batch_size=2, seed=3), 4),
                    batches(data.make_dataset(want, global_batch_size=2, seed=3), 4)):
        np.testing.assert_array_equal(a["x"], b["x"])


def test_folder_mixing_grey_rgb_rgba_converts_to_the_widest(tmp_path, caplog):
    grey = np.full((4, 4), 10, np.uint8)
    rgb = np.stack([grey, grey + 10, grey + 20], -1)
    Image.fromarray(grey).save(tmp_path / "a_grey.png")
    Image.fromarray(grey).save(tmp_path / "b_grey.bmp")
    Image.fromarray(rgb).save(tmp_path / "c_rgb.gif")  # Palette ("P"): counts as RGB.
    with caplog.at_level(logging.WARNING):
        s = data.load(f"folder:{tmp_path}")
    assert s.shape == (4, 4, 3)
    x = s.arrays["x"]
    np.testing.assert_array_equal(x[:2], 10)  # Grey replicated to R, G, B.
    np.testing.assert_array_equal(x[2], rgb)
    assert (f"folder:{tmp_path} mixes grey (2, e.g. '{tmp_path}/a_grey.png'), RGB (1, e.g. "
            f"'{tmp_path}/c_rgb.gif') images; all are converted to RGB") in caplog.text

    Image.fromarray(np.dstack([rgb, np.full((4, 4), 7, np.uint8)])).save(tmp_path / "d.png")
    x = data.load(f"folder:{tmp_path}").arrays["x"]
    assert x.shape == (4, 4, 4, 4)
    np.testing.assert_array_equal(x[:3, ..., 3], 255)  # No alpha: opaque.
    np.testing.assert_array_equal(x[:2, ..., :3], 10)
    np.testing.assert_array_equal(x[2, ..., :3], rgb)
    np.testing.assert_array_equal(x[3], np.dstack([rgb, np.full((4, 4), 7)]))


def test_folder_of_grey_bmp_and_png_stays_grey(tmp_path):
    grey = np.arange(16, dtype=np.uint8).reshape(4, 4) * 9
    for ext in ("bmp", "png"):  # Grey BMP: TensorFlow refuses decode_image(channels=1).
        Image.fromarray(grey).save(tmp_path / f"g.{ext}")
    s = data.load(f"folder:{tmp_path}")
    assert s.shape == (4, 4, 1)
    np.testing.assert_array_equal(s.arrays["x"], np.stack([grey[..., None]] * 2))


def test_folder_rejects_root_images_next_to_class_subfolders(tmp_path):
    for d in ("cat", "dog"):
        (tmp_path / d).mkdir()
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / d / "0.png")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "r.png")
    with pytest.raises(errors.ConfigError, match=r"has images at its root \(e\.g\. 'r\.png'\) "
                                                 r"next to class sub-folders \(cat, dog\); move "
                                                 r"the root images into a sub-folder, or remove "
                                                 r"the sub-folders$"):
        data.load(f"folder:{tmp_path}")


def test_folder_skips_hidden_entries_and_imageless_subfolders(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "r.png")
    (tmp_path / "._r.png").write_bytes(b"macOS resource fork, not an image")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / ".ipynb_checkpoints" / "r.png")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a class")
    s = data.load(f"folder:{tmp_path}")
    assert (s.num_examples, s.num_classes) == (1, 1)


def test_bad_data_is_one_error_line_exit_2_and_no_workdir(tmp_path):
    # The binary in this process (conftest.run_in_process, on one device): it fails
    # loading the data, before any model is built.
    np.savez(tmp_path / "p.npz", x=np.full((8, 8, 8, 1), 255.0))
    workdir = tmp_path / "run"
    proc = run_in_process(["-m", "tf_gan_scale.main", "--config=experiments/digits.py",
                           f"--workdir={workdir}", "--strategy=one_device",
                           f"--config.data.source=npz:{tmp_path / 'p.npz'}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: npz:{tmp_path / 'p.npz'}: float images must be in [-1, 1]; "
                     f"Received: min=255, max=255; pass uint8 pixels (0..255) or scale to "
                     f"[-1, 1]"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not workdir.exists()


def test_folder_with_class_subfolders(tmp_path):
    for label, cls in enumerate(["cat", "dog"]):
        (tmp_path / cls).mkdir()
        for i in range(3):
            Image.fromarray(np.full((4, 4, 3), 255 * label, np.uint8)).save(
                tmp_path / cls / f"{i}.png")
    s = data.load(f"folder:{tmp_path}")
    assert (s.num_examples, s.shape, s.num_classes) == (6, (4, 4, 3), 2)
    b = batches(data.make_dataset(s, global_batch_size=6, seed=1), 1)[0]
    for x, label in zip(b["x"], b["label"]):
        np.testing.assert_array_equal(x, 1.0 if label == 1 else -1.0)


def test_folder_rejects_mixed_sizes_by_name(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(np.zeros((5, 4), np.uint8)).save(tmp_path / "b.png")
    with pytest.raises(errors.ConfigError, match=r"b\.png' is 5x4"):
        data.load(f"folder:{tmp_path}")


@pytest.mark.parametrize("kind,modes,std", [("grid25", 25, 0.05), ("ring8", 8, 0.01)])
def test_toy_mixtures(kind, modes, std):
    s = data.load(f"toy:{kind}")
    x, label = s.arrays["x"], s.arrays["label"]
    assert s.shape == (2,) and s.num_classes == modes
    centers = np.stack([x[label == m].mean(0) for m in range(modes)])
    if kind == "grid25":
        expected = np.stack(np.meshgrid(*[np.arange(-4, 5, 2)] * 2, indexing="ij"), -1)
        np.testing.assert_allclose(centers, expected.reshape(-1, 2), atol=0.01)
    else:
        np.testing.assert_allclose(np.linalg.norm(centers, axis=1), 1.0, atol=0.01)
    np.testing.assert_allclose((x - centers[label]).std(), std, rtol=0.05)


def test_tfds_through_mock_data():
    with tfds.testing.mock_data(num_examples=20):
        s = data.load("tfds:mnist:test")
    assert (s.num_examples, s.shape, s.num_classes) == (20, (28, 28, 1), 10)
    b = batches(data.make_dataset(s, global_batch_size=8, seed=0), 2)
    assert b[0]["x"].shape == (8, 28, 28, 1)
    assert -1.0 <= b[0]["x"].min() and b[0]["x"].max() <= 1.0


def test_bad_sources():
    with pytest.raises(errors.ConfigError, match="unknown data source kind 'hub'; valid: "
                                                 "arrayrecord, embedded, folder, npz, tfds, toy"):
        data.load("hub:x")
    with pytest.raises(errors.ConfigError, match="valid: grid25, ring8"):
        data.load("toy:grid9")
    with pytest.raises(errors.ConfigError, match="unknown TFDS dataset 'no_such_dataset'"):
        data.load("tfds:no_such_dataset")


def test_order_is_a_function_of_seed_and_every_epoch_a_permutation():
    s = data.load("toy:ring8")
    s = data.Source("small", 100, s.shape, s.num_classes,
                    arrays={"x": s.arrays["x"][:100], "label": np.arange(100, dtype=np.int32)})
    a = batches(data.make_dataset(s, global_batch_size=30, seed=3), 7)
    b = batches(data.make_dataset(s, global_batch_size=30, seed=3), 7)
    c = batches(data.make_dataset(s, global_batch_size=30, seed=4), 7)
    labels = np.concatenate([x["label"] for x in a])
    np.testing.assert_array_equal(labels, np.concatenate([x["label"] for x in b]))
    assert not np.array_equal(labels, np.concatenate([x["label"] for x in c]))
    for epoch in range(2):  # Epochs are permutations, and different ones.
        np.testing.assert_array_equal(np.sort(labels[epoch * 100:(epoch + 1) * 100]),
                                      np.arange(100))
    assert not np.array_equal(labels[:100], labels[100:200])


def test_order_is_the_documented_index_shuffle_across_epochs():
    # The pipeline shuffles whole batches in one raw op; example i must still be
    # index_shuffle(i % n, [seed, i // n], n - 1), TensorFlow's public per-index form
    # (the order checkpoints and resumed runs rely on), also in a batch that straddles
    # an epoch boundary (batch 3 holds examples 90..119 of a 100-example epoch).
    n, seed = 100, 5
    s = data.Source("small", n, (2,), 1, arrays={
        "x": np.zeros((n, 2), np.float32), "label": np.arange(n, dtype=np.int32)})
    got = np.concatenate([b["label"] for b in batches(
        data.make_dataset(s, global_batch_size=30, seed=seed, start_batch=1), 4)])
    want = [int(tf.random.experimental.index_shuffle(
        i % n, tf.constant([seed, i // n], tf.int64), n - 1)) for i in range(30, 150)]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("streamed", [False, True])
def test_resume_position_gives_the_same_batches(streamed):
    s = data.load("toy:grid25")
    n = 50
    x, labels = s.arrays["x"][:n], np.arange(n, dtype=np.int32)
    if streamed:
        s = data.Source("stream", n, s.shape, 1, stream=tf.data.Dataset.from_tensor_slices(
            {"x": x, "label": labels}))
    else:
        s = data.Source("mem", n, s.shape, 1, arrays={"x": x, "label": labels})
    full = batches(data.make_dataset(s, global_batch_size=16, seed=0), 9)
    resumed = batches(data.make_dataset(s, global_batch_size=16, seed=0, start_batch=5), 4)
    for want, got in zip(full[5:], resumed):
        np.testing.assert_array_equal(want["label"], got["label"])
        np.testing.assert_array_equal(want["x"], got["x"])


def test_global_batch_bounds():
    s = data.load("embedded:digits")
    with pytest.raises(errors.ConfigError, match="global batch 5000 must be in"):
        data.make_dataset(s, global_batch_size=5000, seed=0)
