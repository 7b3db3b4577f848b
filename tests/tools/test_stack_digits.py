"""tools/stack_digits.py: Stacked MNIST from a labelled digit npz (in this process)."""

import json

import numpy as np

from conftest import run_in_process
from tf_gan_scale import data


def digits(path, n=12, size=6):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(n, size, size, 1)).astype(np.uint8)
    y = np.arange(n) % 10
    np.savez(path, x=x, y=y)
    return x, y


def test_each_channel_is_a_digit_and_the_label_reads_them_in_order(tmp_path):
    x, y = digits(tmp_path / "d.npz")
    out = tmp_path / "s.npz"
    proc = run_in_process(["tools/stack_digits.py", f"--source={tmp_path / 'd.npz'}",
                           "--num=400", f"--output={out}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["num_classes"] == 1000 and line["shape"] == [6, 6, 3]
    with np.load(out) as s:
        sx, sy = s["x"], s["y"]
    assert sx.shape == (400, 6, 6, 3) and sx.dtype == np.uint8
    # Every channel is one of the source digits, and the label is its class, channel 0
    # the hundreds.
    by_image = {x[i].tobytes(): y[i] for i in range(len(x))}
    for j in range(0, 400, 37):
        classes = [by_image[sx[j, ..., c:c + 1].tobytes()] for c in range(3)]
        assert sy[j] == 100 * classes[0] + 10 * classes[1] + classes[2]
    assert line["modes_present"] == len(np.unique(sy)) > 250  # 400 draws over 1,000.
    source = data.load(f"npz:{out}")
    assert source.shape == (6, 6, 3)


def test_bad_input_is_one_line_and_nothing_is_overwritten(tmp_path):
    out = tmp_path / "s.npz"
    out.write_bytes(b"keep")
    digits(tmp_path / "d.npz")
    proc = run_in_process(["tools/stack_digits.py", f"--source={tmp_path / 'd.npz'}",
                           f"--output={out}"])
    assert proc.returncode == 2 and "exists; not overwritten" in proc.stderr
    assert out.read_bytes() == b"keep"
    np.savez(tmp_path / "rgb.npz", x=np.zeros((2, 4, 4, 3), np.uint8), y=np.zeros(2))
    proc = run_in_process(["tools/stack_digits.py", f"--source={tmp_path / 'rgb.npz'}",
                           f"--output={tmp_path / 'n.npz'}"])
    assert proc.returncode == 2 and "x uint8 [N, H, W, 1]" in proc.stderr
    assert "[2, 4, 4, 3]" in proc.stderr
