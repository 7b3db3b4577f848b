"""TFDS sources past memory, on real TFDS builds this test writes (store_as_tfds_dataset,
3 shards): a TFRecord build streams, each worker its own part; an ArrayRecord build is
read by index, like a prepared directory."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tf_gan_scale import data, errors
from tf_gan_scale.data import pipeline, sources

from data.test_input import assembled, context, global_batches, worker_batches

NUM = 45  # Example i: 8x8x1 pixels all equal to i, label i % 5.


def _build(data_dir, name, file_format):
    x = np.repeat(np.arange(NUM, dtype=np.uint8), 64).reshape(NUM, 8, 8, 1)
    features = tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(8, 8, 1)),
        "label": tfds.features.ClassLabel(num_classes=5)})
    tfds.dataset_builders.store_as_tfds_dataset(
        name=name, version="1.0.0", features=features, data_dir=data_dir,
        split_datasets={"train": tf.data.Dataset.from_tensor_slices(
            {"image": x, "label": np.arange(NUM) % 5})},
        file_format=file_format, disable_shuffling=True,
        download_config=tfds.download.DownloadConfig(num_shards=3))


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tfds"))
    _build(d, "tiny_stream", "tfrecord")
    _build(d, "tiny_random", "array_record")
    return d


@pytest.fixture
def past_memory(monkeypatch):
    monkeypatch.setattr(sources, "IN_MEMORY_BYTES", 0)


def ids(batch):
    return batch["x"].reshape(len(batch["x"]), -1)[:, 0]  # Example i has pixels (i/127.5-1).


def test_stream_parts_are_disjoint_cover_the_split_and_hold_uint8(tfds_dir, past_memory):
    s = data.load("tfds:tiny_stream", tfds_data_dir=tfds_dir)
    assert s.stream is not None and s.read is None and s.num_examples == NUM
    for workers in (1, 2, 4):  # 4 parts of 3 files: even splits, not file sharding.
        parts = [[int(e["x"][0, 0, 0]) for e in s.shard(workers, w).as_numpy_iterator()]
                 for w in range(workers)]
        assert sorted(sum(parts, [])) == list(range(NUM)), parts
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert s.shard(2, 0).element_spec["x"].dtype == tf.uint8  # The shuffle buffer's.


def test_stream_workers_read_their_parts_and_resume_exactly_on_the_same_topology(
        tfds_dir, past_memory):
    s = data.load("tfds:tiny_stream", tfds_data_dir=tfds_dir)
    full = worker_batches(s, 2, 4, 12, 8, seed=1)  # 2 workers x 2 replicas, batch 8.
    resumed = worker_batches(s, 2, 4, 5, 8, seed=1, start_batch=7)
    for w in range(2):
        seen = {int(round((v + 1) * 127.5)) for step in full[w] for b in step for v in ids(b)}
        part = {int(e["x"][0, 0, 0]) for e in s.shard(2, w).as_numpy_iterator()}
        assert seen <= part  # Only its own part.
        for want, got in zip(full[w][7:], resumed[w]):
            np.testing.assert_array_equal(want[0]["x"], got[0]["x"])
            np.testing.assert_array_equal(want[1]["label"], got[1]["label"])


def test_a_stream_resume_past_the_skip_limit_reseeds_and_says_so(
        tfds_dir, past_memory, monkeypatch, caplog):
    monkeypatch.setattr(pipeline, "STREAM_SKIP_LIMIT", 10)
    s = data.load("tfds:tiny_stream", tfds_data_dir=tfds_dir)
    with caplog.at_level("INFO"):
        data.make_dataset(s, global_batch_size=4, seed=1, start_batch=7,
                          input_context=context(2, 1, 2))
    assert "re-seeds its shuffle at batch 7 instead of skipping 14 examples" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        data.make_dataset(s, global_batch_size=4, seed=1, start_batch=2,
                          input_context=context(2, 1, 2))
    assert "skips its 4 consumed examples (exact if the run had 2 workers x 1 replicas)" in caplog.text


def test_a_stream_too_small_for_its_workers_is_one_line(tfds_dir, past_memory):
    s = data.load("tfds:tiny_stream", tfds_data_dir=tfds_dir)
    # 64 workers of one replica each: a global batch of at least 64 > 45 examples.
    with pytest.raises(errors.ConfigError, match=r"global batch 64 must be in \[1, 45\], "
                                                 r"the size of tfds:tiny_stream"):
        data.make_dataset(s, global_batch_size=64, seed=0, input_context=context(64, 3, 64))


def test_an_array_record_build_is_read_by_index_like_memory(tfds_dir, past_memory,
                                                            monkeypatch):
    s = data.load("tfds:tiny_random", tfds_data_dir=tfds_dir)
    assert s.read is not None and s.stream is None and s.num_classes == 5
    monkeypatch.undo()
    in_memory = data.load("tfds:tiny_random", tfds_data_dir=tfds_dir)
    assert in_memory.arrays is not None
    want = global_batches(in_memory, 6, 10, seed=2)  # Across an epoch (45 examples).
    got = assembled(worker_batches(s, 3, 3, 10, 6, seed=2), 3, 3)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["label"], b["label"])


def test_a_stream_whose_parts_cannot_hold_their_own_rows_is_one_line(tfds_dir, past_memory):
    # A mesh batch:1 over 2 clients: both hold the same rows, which a stream cannot give.
    s = data.load("tfds:tiny_stream", tfds_data_dir=tfds_dir)
    with pytest.raises(errors.ConfigError, match=r"is a stream: each of the 2 workers .* "
                                                 r"splits into 1 parts; valid: a prepared"):
        data.make_dataset(s, global_batch_size=4, seed=0,
                          split=pipeline.Split(1, (0,), num_parts=2, part=1))
