"""Scoring runs end to end: config.eval during training and tools/evaluate.py on one
device, 2 replicas and 2 local workers (which must agree), with a .keras extractor."""

import glob
import json
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY, run_cmd

pytestmark = pytest.mark.slow
METRICS = "fid,kid,is,pr"
N = 40


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory):
    """(workdir, extractor path, cache dir) of a 4-step run scored every 2 steps."""
    root = tmp_path_factory.mktemp("eval")
    keras.utils.set_random_seed(0)
    classifier = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10, activation="softmax")])
    extractor = str(root / "classifier.keras")
    classifier.save(extractor)
    workdir, cache = root / "run", root / "cache"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY,
                    "--config.train.num_steps=4", "--config.eval.every=2",
                    f"--config.eval.extractor={extractor}", f"--config.eval.metrics={METRICS}",
                    f"--config.eval.num_samples={N}", "--config.eval.batch_size=16",
                    f"--config.eval.cache_dir={cache}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir, extractor, cache


def evaluate(workdir, extractor, cache, *extra, launcher=None):
    args = ["tools/evaluate.py", f"--workdir={workdir}", f"--extractor={extractor}",
            f"--metrics={METRICS}", f"--num_samples={N}", "--batch_size=16",
            f"--cache_dir={cache}", *extra]
    if launcher:
        args = ["tools/launch_local.py", "--num_workers=2", "--", sys.executable, *args,
                "--strategy=multi_worker_mirrored"]
    proc = run_cmd(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if '"fid"' in line]
    if launcher:  # Every worker prints its scores: prefixed "[worker i] ".
        return [json.loads(line.split("] ", 1)[1]) for line in lines]
    assert len(lines) == 1, proc.stdout
    assert f"extractor keras:{extractor}" in proc.stderr or extractor in proc.stderr
    return json.loads(lines[0])


def close(a, b, rtol=1e-6):
    for key in ("fid", "kid", "kid_std", "is", "is_std", "precision", "recall"):
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=1e-9, err_msg=key)


def test_training_scores_every_k_steps_with_the_extractor_named(scored_run):
    workdir, extractor, cache = scored_run
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4]
    for line in lines:
        assert extractor in line["extractor"] and line["num_samples"] == N
        assert line["fid"] > 0 and 0 <= line["precision"] <= 1 and line["is"] >= 1
    assert lines[0]["fid"] != lines[1]["fid"]
    # The best step by FID is kept outside the rotation.
    best = min(lines, key=lambda line: line["fid"])["step"]
    assert tf.train.latest_checkpoint(str(workdir / "checkpoints" / "best")).endswith(
        f"ckpt-{best}")
    assert len(glob.glob(str(cache / "reference-*.npz"))) == 1  # Computed once, reused.
    tags = set()
    for path in glob.glob(str(workdir / "logs" / "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    assert {"eval/fid", "eval/kid", "eval/is", "eval/precision", "eval/recall"} <= tags


def test_one_device_two_replicas_and_two_workers_score_the_same(scored_run):
    workdir, extractor, cache = scored_run
    one = evaluate(workdir, extractor, cache, "--strategy=one_device")
    assert one["step"] == 4
    # The last training-time score was of the same weights: the checkpoint's.
    last = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
    close(one, last)
    close(evaluate(workdir, extractor, cache, "--strategy=mirrored", "--num_cpu_devices=2"),
          one)
    workers = evaluate(workdir, extractor, cache, launcher=True)
    assert len(workers) == 2
    for scores in workers:
        close(scores, one)
    # Any checkpoint (here the best one) and an array of images score on the same terms.
    best = tf.train.latest_checkpoint(str(workdir / "checkpoints" / "best"))
    assert evaluate(workdir, extractor, cache, "--strategy=one_device",
                    f"--checkpoint={best}")["checkpoint"] == best
    samples = workdir.parent / "samples.npy"
    proc = run_cmd(["tools/sample.py", f"--workdir={workdir}", f"--num_samples={N}",
                    f"--output={samples}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    from_array = evaluate("", extractor, cache, f"--samples={samples}",
                          "--reference=embedded:digits", "--strategy=one_device")
    # tools/sample.py draws latents.fixed(0, N): the fakes evaluate generates for seed 0.
    close(from_array, one)
    # Other fakes (latent seed 1; the 4-step generator barely depends on z) miss by
    # 1e-4 relative, 100x the tolerance: the comparison can fail.
    other = evaluate(workdir, extractor, cache, "--strategy=one_device", "--seed=1")
    assert abs(other["fid"] - one["fid"]) > 100 * 1e-6 * one["fid"]


def test_bad_input_is_one_line_exit_2(scored_run, tmp_path):
    workdir, extractor, cache = scored_run
    cases = [
        ([f"--workdir={workdir}"], "--workdir (or --samples) and --extractor are required"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--checkpoint=/no/ckpt-3"],
         "no checkpoint '/no/ckpt-3'"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--num_samples=8"],
         "FID from 8 samples of 16-d features"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--metrics=fid,fdi"],
         "unknown metric 'fdi'"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--num_samples=100000"],
         "more than the 1797 examples"),
        ([f"--workdir={tmp_path}", f"--extractor={extractor}"], "no training run"),
        ([f"--workdir={workdir}", f"--extractor={tmp_path / 'none.keras'}"], "none.keras"),
    ]
    for args, message in cases:
        proc = run_cmd(["tools/evaluate.py", *args])
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1], (args, lines[-2:])
    # A training config asking for scores without an extractor fails before training.
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={tmp_path / 'run'}", *TINY,
                    "--config.eval.every=2"])
    assert proc.returncode == 2 and "needs config.eval.extractor" in proc.stderr
    assert not (tmp_path / "run").exists()
