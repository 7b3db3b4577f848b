"""tf_gan_scale.plot and tools/plot.py: scalars and scores of a run -> one PNG of curves.

No training: each test writes event files (tf.summary) and a metrics.jsonl itself.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import run_cmd, run_in_process
from tf_gan_scale import errors
from tf_gan_scale.artifacts import plot

# float32-exact values: what a scalar summary stores is what read_scalars must return.
D_LOSS = {3: 0.5, 7: 1.25, 20: -2.0}
G_LOSS = {3: 4.0, 7: 3.5, 20: 0.125}
EXTRA = {"d_grad_norm": {3: 2.0, 20: 1.5}, "g_learning_rate": {3: 0.25, 20: 0.125},
         "steps_per_sec": {3: 8.0, 20: 9.0}, "eval/fid": {20: 7.0}}
A, B = "keras:/abs/digits_classifier.keras", "inception_v3"
METRICS = [  # Two extractors; this project's nested format and the flat one.
    {"step": 10, "extractor": A, "num_samples": 100, "fid": 30.0,
     "kid": {"mean": 0.04, "std": 0.01}, "is": {"mean": 5.0, "std": 0.5},
     "precision": 0.5, "recall": 0.25},
    {"step": 10, "extractor": B, "num_samples": 200, "fid": 90.0, "kid": 0.08,
     "kid_std": 0.02},
    {"step": 20, "extractor": A, "num_samples": 100, "fid": 20.0,
     "kid": {"mean": 0.02, "std": 0.01}, "is": {"mean": 6.0, "std": 0.5},
     "precision": 0.75, "recall": 0.5, "checkpoint": "/w/checkpoints/ckpt-20"},
    {"step": 20, "extractor": B, "num_samples": 200, "fid": 60.0, "kid": 0.05,
     "kid_std": 0.02},
]


def write_events(logdir, tables, stamp=None):
    """Writes {tag: {step: value}} as scalar summaries (plus an image summary, which is not
    a scalar) to one event file in logdir; with `stamp`, names the file as if it had been
    created at that unix time (event files are ordered by it)."""
    before = set(os.listdir(logdir)) if os.path.isdir(logdir) else set()
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        for tag, by_step in tables.items():
            for step, value in by_step.items():
                tf.summary.scalar(tag, value, step=step)
        tf.summary.image("real_images", tf.zeros([1, 4, 4, 1]), step=0)
    writer.close()
    (name,) = set(os.listdir(logdir)) - before
    if stamp is not None:
        parts = name.split(".")
        parts[3] = str(stamp)
        os.rename(os.path.join(logdir, name), os.path.join(logdir, ".".join(parts)))
        name = ".".join(parts)
    return os.path.join(logdir, name)


def write_metrics(workdir, records, name="metrics.jsonl"):
    with open(os.path.join(workdir, name), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


@pytest.fixture
def run_dir(tmp_path):
    """A workdir with losses, other scalars and scores from two extractors."""
    write_events(tmp_path / "logs", {"d_loss": D_LOSS, "g_loss": G_LOSS, **EXTRA})
    write_metrics(tmp_path, METRICS)
    return tmp_path


def as_lists(scalars):
    return {tag: (steps.tolist(), values.tolist()) for tag, (steps, values) in scalars.items()}


def test_read_scalars_returns_exactly_the_written_steps_and_values(tmp_path):
    write_events(tmp_path / "logs", {"d_loss": D_LOSS, "g_loss": G_LOSS})
    write_events(tmp_path / "logs" / "validation", {"d_loss": {5: 1.5}})
    got = plot.read_scalars(tmp_path)
    assert as_lists(got) == {"d_loss": ([3, 7, 20], [0.5, 1.25, -2.0]),
                             "g_loss": ([3, 7, 20], [4.0, 3.5, 0.125]),
                             "validation/d_loss": ([5], [1.5])}
    assert got["d_loss"][0].dtype == np.int64 and got["d_loss"][1].dtype == np.float64


def test_read_scalars_of_a_resumed_run_keeps_the_later_value_of_a_step(tmp_path):
    # The resumed run's file (created later: larger stamp in its name) is written first
    # here, so the order files were written in can't stand in for their order by name.
    write_events(tmp_path / "logs", {"d_loss": {20: 9.0, 25: 8.0}}, stamp=2000)
    write_events(tmp_path / "logs", {"d_loss": D_LOSS}, stamp=1000)
    assert as_lists(plot.read_scalars(tmp_path)) == {
        "d_loss": ([3, 7, 20, 25], [0.5, 1.25, 9.0, 8.0])}


def test_read_scalars_of_a_truncated_file_keeps_the_events_before_the_damage(tmp_path):
    path = write_events(tmp_path / "logs", {"d_loss": D_LOSS})
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-5])  # The image summary, the last record, is cut.
    assert as_lists(plot.read_scalars(tmp_path)) == {"d_loss": ([3, 7, 20], [0.5, 1.25, -2.0])}


def test_read_metrics_flattens_both_formats_in_file_order(tmp_path):
    assert plot.read_metrics(tmp_path) == []
    write_metrics(tmp_path, METRICS[:2] + [{"step": 30}], name="eval.jsonl")
    with open(tmp_path / "eval.jsonl", "a") as f:
        f.write("\n")  # A blank line is not an error.
    assert plot.read_metrics(tmp_path) == [
        {"step": 10, "extractor": A, "num_samples": 100, "fid": 30.0, "kid": 0.04,
         "kid_std": 0.01, "is": 5.0, "is_std": 0.5, "precision": 0.5, "recall": 0.25},
        {"step": 10, "extractor": B, "num_samples": 200, "fid": 90.0, "kid": 0.08,
         "kid_std": 0.02},
        {"step": 30, "extractor": "unknown extractor", "num_samples": None}]
    write_metrics(tmp_path, METRICS[3:])  # metrics.jsonl is read before eval.jsonl.
    assert [r["step"] for r in plot.read_metrics(tmp_path)] == [20]


@pytest.mark.parametrize("bad, message", [
    ('{"step": 30, "fid": 1', "line 3: not JSON"),
    ('[30, 1.0]', "line 3: not a JSON object"),
    ('{"fid": 1.0}', "line 3: 'step' must be an integer >= 0; Received: None"),
    ('{"step": "30"}', "line 3: 'step' must be an integer >= 0; Received: '30'"),
])
def test_read_metrics_rejects_a_corrupt_line_by_its_number(tmp_path, bad, message):
    write_metrics(tmp_path, METRICS[:2])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(bad + "\n")
    with pytest.raises(errors.ConfigError, match="metrics.jsonl, " + message):
        plot.read_metrics(tmp_path)


def test_curves_draws_every_series_in_a_png_that_is_not_blank(run_dir, tmp_path):
    output = tmp_path / "out" / "curves.png"
    output.parent.mkdir()
    output.write_bytes(b"an older plot")  # Overwriting a plot is fine.
    result = plot.curves(str(run_dir), str(output))
    assert output.stat().st_mode & 0o777 == 0o644  # plot.write_png: not mkstemp's 0600.
    fid = [f"fid [{A}, 100 samples]", f"fid [{B}, 200 samples]"]
    assert result == {
        "output": str(output), "steps": [3, 20],
        "series": ["d_loss", "g_loss", *sorted(fid),
                   f"kid [{B}, 200 samples]", f"kid [{A}, 100 samples]",
                   f"is [{A}, 100 samples]", f"precision [{A}, 100 samples]",
                   f"recall [{A}, 100 samples]",
                   "d_grad_norm", "g_learning_rate", "steps_per_sec"]}
    assert os.listdir(output.parent) == ["curves.png"]  # No temporary file left behind.
    with Image.open(output) as image:
        assert image.format == "PNG" and image.width >= 1000 and image.height >= 1500
        rgb = np.asarray(image.convert("RGB")).reshape(-1, 3)
    # Matplotlib's first two line colours (C0, C1) are drawn, over many pixels each.
    for colour in ((31, 119, 180), (255, 127, 14)):
        assert np.all(rgb == colour, axis=1).sum() > 500, colour
    assert len(np.unique(rgb, axis=0)) > 50


def test_curves_of_only_losses_or_only_scores(tmp_path):
    (tmp_path / "a").mkdir()
    write_events(tmp_path / "a" / "logs", {"d_loss": D_LOSS, "g_loss": G_LOSS})
    only_losses = plot.curves(str(tmp_path / "a"), str(tmp_path / "a.png"))
    assert only_losses["series"] == ["d_loss", "g_loss"] and only_losses["steps"] == [3, 20]
    (tmp_path / "b").mkdir()
    write_metrics(tmp_path / "b", METRICS[1::2], name="eval.jsonl")
    only_scores = plot.curves(str(tmp_path / "b"), str(tmp_path / "b.png"))
    assert only_scores["series"] == [f"fid [{B}, 200 samples]", f"kid [{B}, 200 samples]"]
    assert only_scores["steps"] == [10, 20]
    # Without a metrics file, the eval/ scalars are plotted as they are.
    write_events(tmp_path / "b" / "logs", {"eval/fid": {20: 7.0}})
    os.remove(tmp_path / "b" / "eval.jsonl")
    assert plot.curves(str(tmp_path / "b"), str(tmp_path / "b.png"))["series"] == ["eval/fid"]


def bad_inputs(run_dir, tmp_path):
    """(workdir, output, message) of each kind of bad input."""
    (tmp_path / "empty" / "logs").mkdir(parents=True)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    write_metrics(corrupt, METRICS)
    with open(corrupt / "metrics.jsonl", "a") as f:
        f.write('{"step": 30, "fid"\n')
    png = str(tmp_path / "x.png")
    return [(str(tmp_path / "missing"), png, "is not a directory"),
            (str(tmp_path / "empty"), png, "nothing to plot"),
            (str(run_dir), str(tmp_path / "x.jpg"), "must end in .png"),
            (str(run_dir), str(tmp_path / "no_such_dir" / "x.png"), "does not exist"),
            (str(corrupt), png, "metrics.jsonl, line 5: not JSON")]


def test_curves_bad_input_raises_and_writes_nothing(run_dir, tmp_path):
    for workdir, output, message in bad_inputs(run_dir, tmp_path):
        with pytest.raises(errors.ConfigError, match=message):
            plot.curves(workdir, output)
        assert not os.path.exists(output), output


@pytest.mark.slow
def test_tool_prints_one_json_line(run_dir, tmp_path):
    output = str(tmp_path / "curves.png")
    proc = run_cmd(["tools/plot.py", f"--workdir={run_dir}", f"--output={output}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == plot.curves(str(run_dir), str(tmp_path / "again.png")) | {
        "output": output}
    with Image.open(output) as image:
        assert image.format == "PNG"


def assert_tool_bad(proc, output, message):
    errors_ = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and proc.stdout == "", (message, proc.stderr[-2000:])
    assert len(errors_) == 1 and message in errors_[0], errors_
    assert "Traceback" not in proc.stderr and not os.path.exists(output)


def test_tool_bad_input_is_one_error_line_and_exit_2(run_dir, tmp_path):
    # In this process (conftest.run_in_process): no process start per case.
    for workdir, output, message in bad_inputs(run_dir, tmp_path):
        proc = run_in_process(["tools/plot.py", f"--workdir={workdir}", f"--output={output}"])
        assert_tool_bad(proc, output, message)
    proc = run_in_process(["tools/plot.py", f"--workdir={run_dir}"])
    assert proc.returncode == 2 and "error: --workdir and --output are required" in proc.stderr


@pytest.mark.slow
def test_the_real_tool_exits_2_on_bad_input(run_dir, tmp_path):
    workdir, output, message = bad_inputs(run_dir, tmp_path)[4]
    proc = run_cmd(["tools/plot.py", f"--workdir={workdir}", f"--output={output}"])
    assert_tool_bad(proc, output, message)
