"""The progress display: one bar per block of log_every steps, each with its real size."""

import re
import types

import pytest
import tensorflow as tf

from tf_gan_scale.training import callbacks


def shown(capsys, start, num_steps, every, steps):
    """(headers, finished bars "done/total") printed for a run that reports `steps`."""
    model = types.SimpleNamespace(step=tf.Variable(start, dtype=tf.int64))
    progress = callbacks.Progress(start, num_steps, every, verbose=2)  # One line per block.
    progress.set_model(model)
    progress.on_train_begin()
    for batch, step in enumerate(steps):
        model.step.assign(step)
        progress.on_train_batch_end(batch, {"d_loss": 0.5, "g_loss": 1.5})
    progress.on_train_end()
    out = capsys.readouterr().out
    return (re.findall(r"^Steps (\d+-\d+) of \d+$", out, re.M),
            re.findall(r"^\s*(\d+/\d+) - ", out, re.M))


@pytest.mark.parametrize("start, num_steps, every, k, blocks", [
    (0, 20, 100, 1, ["1-20"]),                          # Shorter than log_every.
    (150, 320, 100, 1, ["151-200", "201-300", "301-320"]),  # Resumed mid-block, short end.
    (0, 200, 100, 1, ["1-100", "101-200"]),
    (150, 320, 100, 10, ["151-200", "201-300", "301-320"]),  # steps_per_execution=10.
])
def test_each_block_shows_its_real_size(capsys, start, num_steps, every, k, blocks):
    headers, bars = shown(capsys, start, num_steps, every, range(start + k, num_steps + 1, k))
    assert headers == blocks
    sizes = [int(b) - int(a) + 1 for a, b in (h.split("-") for h in blocks)]
    assert bars == [f"{n}/{n}" for n in sizes]


def test_an_execution_crossing_blocks_finishes_each(monkeypatch):
    # One batch end can report a step two blocks on; both blocks are shown finished.
    # (A fake Progbar records the calls; keras.utils.Progbar is what runs for real.)
    calls = []

    class Bar:
        def __init__(self, target, **kwargs):
            self.target = target

        def update(self, current, values=None, finalize=None):
            calls.append((self.target, current, finalize))

    monkeypatch.setattr(callbacks.keras.utils, "Progbar", Bar)
    progress = callbacks.Progress(0, 30, 10)
    progress.set_model(types.SimpleNamespace(step=tf.Variable(0, dtype=tf.int64)))
    for step in (5, 25, 30):
        progress.model.step.assign(step)
        progress.on_train_batch_end(0, {})
    progress.on_train_end()
    assert calls == [(10, 5, False), (10, 10, True), (10, 10, True), (10, 5, False),
                     (10, 10, True)]


def test_a_run_stopped_inside_a_block_ends_its_line_where_it_stood(capsys):
    headers, bars = shown(capsys, 0, 100, 50, range(1, 31))
    assert headers == ["1-50"] and bars == ["30/50"]
