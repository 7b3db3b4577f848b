"""tools/prepare_data.py and the `arrayrecord:DIR` source it feeds (in this process)."""

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import run_in_process
from tf_gan_scale import data, errors
from tf_gan_scale.data import prepared

from data.test_data import write_image_folder
from data.test_input import assembled, global_batches, worker_batches


def write_class_folder(root, sizes=None):
    """2 classes x 5 RGB images 12x12 (or `sizes` [(h, w)] per image, class a first)."""
    rng = np.random.default_rng(1)
    for i in range(10):
        d = root / ("a" if i < 5 else "b")
        d.mkdir(parents=True, exist_ok=True)
        h, w = sizes[i] if sizes else (12, 12)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def prepare(*args):
    return run_in_process(["tools/prepare_data.py", *map(str, args)])


@pytest.fixture(scope="module")
def folder_and_prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    folder = write_class_folder(root / "images")
    out = prepare(f"--source=folder:{folder}", f"--out={root / 'ar'}", "--num_shards=3")
    assert out.returncode == 0, out.stderr
    return folder, root / "ar", json.loads(out.stdout.strip().splitlines()[-1])


def test_prepared_folder_trains_on_the_same_pixels_and_labels(folder_and_prepared):
    folder, ar, printed = folder_and_prepared
    assert printed["num_examples"] == 10 and printed["num_shards"] == 3
    a, b = data.load(f"folder:{folder}"), data.load(f"arrayrecord:{ar}")
    assert (b.num_examples, b.shape, b.num_classes) == (10, (12, 12, 3), 2)
    meta = json.loads((ar / "dataset.json").read_text())
    assert meta["class_names"] == ["a", "b"] and meta["content_hash"] == printed["content_hash"]
    want = global_batches(a, 4, 6, seed=3)  # Across epochs of 10.
    got = assembled(worker_batches(b, 2, 2, 6, 4, seed=3), 2, 2)
    for x, y in zip(want, got):
        np.testing.assert_array_equal(x["x"], y["x"])
        np.testing.assert_array_equal(x["label"], y["label"])


def test_preparing_again_gives_the_same_hash_and_never_overwrites(folder_and_prepared, tmp_path):
    folder, ar, printed = folder_and_prepared
    again = prepare(f"--source=folder:{folder}", f"--out={tmp_path / 'ar2'}", "--num_shards=3")
    assert json.loads(again.stdout.strip())["content_hash"] == printed["content_hash"]
    before = {f: os.path.getmtime(ar / f) for f in os.listdir(ar)}
    out = prepare(f"--source=folder:{folder}", f"--out={ar}")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert f"--out='{ar}' exists; valid: a new directory" in out.stderr
    assert {f: os.path.getmtime(ar / f) for f in os.listdir(ar)} == before


def test_a_truncated_image_fails_preparation_by_name_and_leaves_nothing(tmp_path):
    write_image_folder(tmp_path / "d", 6, bad=4, ext="jpg")
    out = prepare(f"--source=folder:{tmp_path / 'd'}", f"--out={tmp_path / 'ar'}")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert f"cannot decode image '{tmp_path / 'd' / '04.jpg'}'" in out.stderr
    assert sorted(os.listdir(tmp_path)) == ["d"]  # No output, no temporary directory.


def test_resolution_crops_and_resizes_mixed_sizes(tmp_path):
    folder = write_class_folder(tmp_path / "d", sizes=[(12 + i, 20 - i) for i in range(10)])
    assert prepare(f"--source=folder:{folder}", f"--out={tmp_path / 'x'}").returncode == 2
    out = prepare(f"--source=folder:{folder}", f"--out={tmp_path / 'ar'}", "--resolution=8")
    assert out.returncode == 0, out.stderr
    s = data.load(f"arrayrecord:{tmp_path / 'ar'}")
    assert s.shape == (8, 8, 3)
    first = np.asarray(Image.open(folder / "a" / "0.png"))  # 12x20: the middle 12x12.
    want = data.sources.center_crop_resize(first, 8).numpy()
    got = data.sources.examples(s, 1).get_single_element()["x"].numpy()
    np.testing.assert_array_equal(got, want)


def test_npz_prepares_to_the_same_examples(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (7, 4, 4, 1), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(7) % 3)
    out = prepare(f"--source=npz:{tmp_path / 'd.npz'}", f"--out={tmp_path / 'ar'}")
    assert out.returncode == 0, out.stderr
    s = data.load(f"arrayrecord:{tmp_path / 'ar'}")
    got = data.sources.examples(s).batch(7).get_single_element()
    np.testing.assert_array_equal(got["x"].numpy(), x)
    np.testing.assert_array_equal(got["label"].numpy(), np.arange(7) % 3)
    bad = prepare("--source=toy:ring8", f"--out={tmp_path / 'toy'}")
    assert bad.returncode == 2 and "has float32 examples of shape (2,); valid: uint8" in bad.stderr


def broken(folder_and_prepared, tmp_path, how):
    """A copy of the prepared directory, broken `how`."""
    _, ar, _ = folder_and_prepared
    d = tmp_path / "broken"
    shutil.copytree(ar, d)
    meta = json.loads((d / "dataset.json").read_text())
    shard = d / meta["shards"][1]["file"]
    if how == "missing shard":
        shard.unlink()
    elif how == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif how == "flipped byte":
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        shard.write_bytes(bytes(raw))
    elif how == "bad json":
        (d / "dataset.json").write_text("{not json")
    elif how == "no json":
        (d / "dataset.json").unlink()
    elif how == "wrong count":
        meta["num_examples"] = 11
        (d / "dataset.json").write_text(json.dumps(meta))
    elif how == "edited hash":  # A hand-edited dataset.json (or one of another dataset).
        meta["content_hash"] = "0" * 64
        (d / "dataset.json").write_text(json.dumps(meta))
    return d, shard


@pytest.mark.parametrize("how,message", [
    ("missing shard", "shard '{shard}' of '{d}' is missing (3 shards listed in dataset.json)"),
    ("truncated shard", "shard '{shard}' has"),
    ("flipped byte", "shard '{shard}' does not match its sha256 in dataset.json"),
    ("bad json", "cannot read '{d}/dataset.json'"),
    ("no json", "'{d}' has no dataset.json; valid: a directory written by tools/prepare_data"),
    ("wrong count", "the shards hold 10 examples, num_examples says 11"),
    ("edited hash", "'{d}/dataset.json': content_hash does not match the shards' hashes; "
                    "prepare the dataset again"),
    ("no directory", "prepared dataset not found: '{d}'; make one with tools/prepare_data.py")])
def test_a_broken_prepared_directory_is_one_line_exit_2_before_the_workdir(
        folder_and_prepared, tmp_path, how, message):
    if how == "no directory":
        d, shard = tmp_path / "nowhere", None
    else:
        d, shard = broken(folder_and_prepared, tmp_path, how)
    with pytest.raises(errors.ConfigError) as e:
        data.load(f"arrayrecord:{d}")
    assert message.format(d=d, shard=shard) in str(e.value)
    workdir = tmp_path / "run"
    out = run_in_process(["-m", "tf_gan_scale.main", "--config=experiments/digits.py",
                          f"--workdir={workdir}", f"--config.data.source=arrayrecord:{d}"])
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert message.format(d=d, shard=shard) in out.stderr
    assert not workdir.exists()


def test_verify_rehashes_a_large_dataset_that_loading_only_sizes(
        folder_and_prepared, tmp_path, monkeypatch):
    d, _ = broken(folder_and_prepared, tmp_path, "flipped byte")
    with monkeypatch.context() as m:
        m.setattr(prepared, "VERIFY_HASH_BYTES", 10)  # As if it were large:
        m.setattr(prepared, "_sha256", None)  # loading checks sizes and counts only.
        with pytest.raises(errors.ConfigError, match="cannot open the shards of .*--verify="):
            data.load(f"arrayrecord:{d}")  # The flip hit a block header here.
    out = prepare(f"--verify={d}")
    assert out.returncode == 2 and "does not match its sha256" in out.stderr
    good = prepare(f"--verify={folder_and_prepared[1]}")
    assert good.returncode == 0 and json.loads(good.stdout)["num_examples"] == 10
