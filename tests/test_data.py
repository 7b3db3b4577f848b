import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from tf_gan_scale import data, errors


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
                                                 "embedded, folder, npz, tfds, toy"):
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
