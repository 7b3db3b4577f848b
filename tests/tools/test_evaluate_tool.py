"""Scoring runs end to end: config.eval during training and tools/evaluate.py on one
device, 2 replicas and 2 local workers (which must agree), with a .keras extractor.

The end-to-end runs start real processes (slow tier); the bad-input cases run the tool
and the binary in this process (conftest.run_in_process), with a few real processes for
the exit code end to end."""

import glob
import json
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, TINY, run_cmd, run_cmds, run_in_process
from tf_gan_scale.metrics import scoring

METRICS = "fid,kid,is,pr"
N = 40


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A .keras digits extractor (untrained): 16-d features, 10 classes."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10, activation="softmax")])
    path = str(tmp_path_factory.mktemp("extractor") / "classifier.keras")
    model.save(path)
    return path


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory, classifier):
    """(workdir, extractor path, cache dir) of a 4-step run scored every 2 steps."""
    root = tmp_path_factory.mktemp("eval")
    extractor = classifier
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
    scores = json.loads(lines[0])
    # The same scores on one line of stderr, each with the extractor that computed it.
    summary = f"step {scores['step']}: {scoring.format_scores(scores)}"
    assert summary in proc.stderr.splitlines(), proc.stderr[-2000:]
    assert summary.endswith(f" [extractor keras:{extractor}, {N} samples]"), summary
    return scores


def close(a, b, rtol=1e-6):
    for key in ("fid", "kid", "kid_std", "is", "is_std", "precision", "recall"):
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=1e-9, err_msg=key)


@pytest.mark.slow
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


@pytest.mark.slow
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


def bad_cases(workdir, extractor, tmp_path):
    """(tools/evaluate.py arguments, the message of its one error line): bad input that
    fails before any score is computed."""
    rgb = tmp_path / "rgb.npz"  # 8x8 RGB images: another shape than the run's grey ones.
    np.savez(rgb, x=np.zeros((50, 8, 8, 3), np.uint8))
    return [
        ([f"--workdir={workdir}"], "--workdir (or --samples) and --extractor are required"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--checkpoint=/no/ckpt-3"],
         "no checkpoint '/no/ckpt-3'"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--num_samples=8"],
         "FID from 8 samples of 16-d features"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--metrics=fid,fdi"],
         "unknown metric 'fdi'"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--num_samples=100000"],
         "asks for 100000 real examples but embedded:digits has 1797"),
        ([f"--workdir={tmp_path}", f"--extractor={extractor}"], "no training run"),
        ([f"--workdir={workdir}", f"--extractor={tmp_path / 'none.keras'}"], "none.keras"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--metrics=pr",
          "--num_samples=3"], "need num_samples > 3"),
        ([f"--workdir={workdir}", f"--extractor={extractor}", "--reference=npz:" +
          str(rgb)], "takes images (8, 8, 1), the data has shape (8, 8, 3)"),
    ]


def assert_one_error_line(proc, message, args):
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, (args, proc.stderr[-2000:])
    assert len(errors) == 1 and message in errors[0], (args, errors)
    assert proc.stderr.strip().splitlines()[-1] == errors[0], (args, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, args


def test_bad_input_is_one_line_exit_2(tiny_run, classifier, tmp_path):
    # In this process under --strategy=one_device (the default, auto, would make a second
    # MirroredStrategy here: see conftest); the cache in tmp_path (nothing is written).
    cache = f"--cache_dir={tmp_path / 'cache'}"
    for args, message in bad_cases(tiny_run, classifier, tmp_path):
        proc = run_in_process(["tools/evaluate.py", *args, "--strategy=one_device", cache])
        assert_one_error_line(proc, message, args)
    assert not (tmp_path / "cache").exists()
    # Training configs that cannot be scored fail before training, leaving no workdir.
    for extra, message in [
            ([f"--config.eval.extractor={classifier}", "--config.eval.num_samples=8"],
             "FID from 8 samples of 16-d features"),
            # Asking for scores without an extractor.
            ([], "needs config.eval.extractor")]:
        proc = run_in_process(["-m", "tf_gan_scale.main", f"--workdir={tmp_path / 'run'}",
                               *TINY, "--strategy=one_device", "--config.eval.every=2",
                               *extra])
        assert_one_error_line(proc, message, extra)
        assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_bad_input_exit_2_end_to_end(tiny_run, classifier, tmp_path):
    # The real tool: one case that fails before any TensorFlow setup, one after its
    # (auto) strategy and the run's config are loaded.
    cases = [bad_cases(tiny_run, classifier, tmp_path)[i] for i in (0, 1)]
    procs = run_cmds([["tools/evaluate.py", *args] for args, _ in cases])
    for (args, message), proc in zip(cases, procs):
        assert_one_error_line(proc, message, args)


@pytest.mark.slow
def test_workers_that_disagree_about_the_cache_all_recompute(scored_run, tmp_path):
    # Worker 0 finds cached reference statistics, worker 1 (another machine's cache) does
    # not: both must take the same path (computing runs collectives), and score right.
    workdir, extractor, cache = scored_run
    one = evaluate(workdir, extractor, cache, "--strategy=one_device")
    for index in (0, 1):
        (tmp_path / str(index)).mkdir()
    for f in cache.glob("reference-*.npz"):
        (tmp_path / "0" / f.name).write_bytes(f.read_bytes())
    wrapper = tmp_path / "per_worker_cache.py"
    wrapper.write_text(
        "import json, os, sys\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        f"sys.argv = sys.argv + ['--cache_dir={tmp_path}/' + str(index)]\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        f"exec(compile(open({str(REPO)!r} + '/tools/evaluate.py').read(), 'evaluate.py', "
        "'exec'), {'__name__': '__main__'})\n")
    proc = run_cmd(["tools/launch_local.py", "--num_workers=2", "--", sys.executable,
                    str(wrapper), f"--workdir={workdir}", f"--extractor={extractor}",
                    f"--metrics={METRICS}", f"--num_samples={N}", "--batch_size=16",
                    "--strategy=multi_worker_mirrored"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = [json.loads(line.split("] ", 1)[1]) for line in proc.stdout.splitlines()
             if '"fid"' in line]
    assert len(lines) == 2
    for scores in lines:
        close(scores, one)
