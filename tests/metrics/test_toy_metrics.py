"""PacGAN's mode metrics (tf_gan_scale/metrics/toy.py) and tools/toy_metrics.py."""

import json
import math
import os
import runpy

import numpy as np
import pytest

from conftest import REPO, run_cmd, run_cmds, run_in_process
from tf_gan_scale import data
from tf_gan_scale.metrics import toy
from tf_gan_scale import training
from tf_gan_scale.data.sources import toy_centers

CENTERS, STD = toy_centers("grid25")


def metrics(samples):
    return toy.mode_metrics(samples, CENTERS, STD)


def test_the_grid_constants():
    assert CENTERS.shape == (25, 2) and STD == 0.05
    assert sorted(set(CENTERS[:, 0])) == [-4, -2, 0, 2, 4]
    ring, ring_std = toy_centers("ring8")
    assert ring.shape == (8, 2) and ring_std == 0.01
    np.testing.assert_allclose(np.linalg.norm(ring, axis=1), 1.0)


def test_every_sample_at_a_center_captures_all_modes():
    samples = np.repeat(CENTERS, 100, axis=0)  # 100 per mode: uniform.
    assert metrics(samples) == {"modes": 25, "high_quality": 1.0, "reverse_kl": 0.0}


def test_all_samples_on_one_mode():
    rng = np.random.default_rng(0)
    samples = CENTERS[7] + STD * 0.5 * rng.standard_normal((2500, 2))  # Within 3 std.
    m = metrics(samples)
    assert m["modes"] == 1 and m["high_quality"] == 1.0
    assert m["reverse_kl"] == pytest.approx(math.log(25))  # KL(point mass || uniform).


def test_high_quality_is_within_3_standard_deviations():
    direction = np.array([0.6, 0.8])  # A unit vector off the axes.
    far = CENTERS + 4 * STD * direction  # 4 std from every nearest center.
    assert metrics(far) == {"modes": 0, "high_quality": 0.0, "reverse_kl": None}
    near = CENTERS + 2.9 * STD * direction
    assert metrics(near)["high_quality"] == 1.0 and metrics(near)["modes"] == 25
    half = np.concatenate([far, near])
    assert metrics(half) == {"modes": 25, "high_quality": 0.5, "reverse_kl": 0.0}
    # Halfway between two modes: far from both.
    assert metrics(np.array([[1.0, 0.0]]))["high_quality"] == 0.0


def test_captured_needs_a_high_quality_sample_nearest_to_the_mode():
    # Mode 0 only gets a sample 4 std away: not captured; the rest get one each.
    samples = np.concatenate([CENTERS[:1] + [4 * STD, 0], CENTERS[1:]])
    m = metrics(samples)
    assert m["modes"] == 24 and m["high_quality"] == pytest.approx(24 / 25)


def test_reverse_kl_of_a_known_skew():
    # 3:1 over two modes: p = (3/4, 1/4), KL(p || uniform over 25) = sum p log(25 p).
    samples = np.concatenate([np.repeat(CENTERS[:1], 300, 0), np.repeat(CENTERS[1:2], 100, 0)])
    m = metrics(samples)
    expected = 0.75 * math.log(25 * 0.75) + 0.25 * math.log(25 * 0.25)
    assert m["modes"] == 2 and m["reverse_kl"] == pytest.approx(expected, rel=1e-12)
    # = log 25 - H(p): the entropy form of the same number.
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert m["reverse_kl"] == pytest.approx(math.log(25) - entropy, rel=1e-12)
    # Only high-quality samples count: adding far-off samples changes high_quality alone.
    more = metrics(np.concatenate([samples, np.full((400, 2), 10.0)]))
    assert more["reverse_kl"] == pytest.approx(expected) and more["high_quality"] == 0.5


def test_non_finite_samples_are_never_high_quality():
    samples = np.concatenate([CENTERS, [[np.nan, 0.0], [np.inf, np.inf]]])
    m = metrics(samples)
    assert m["modes"] == 25 and m["high_quality"] == pytest.approx(25 / 27)


def test_the_real_data_scores_like_a_perfect_generator():
    # Real examples: a 2D Gaussian is within 3 std with probability 1 - exp(-9/2) = 98.9%.
    x = data.load("toy:grid25").arrays["x"][:2500]
    m = metrics(x)
    assert m["modes"] == 25
    assert abs(m["high_quality"] - (1 - math.exp(-4.5))) < 0.01
    assert m["reverse_kl"] < 0.02


@pytest.mark.parametrize("samples,centers,std", [
    (np.zeros((3,)), CENTERS, STD), (np.zeros((3, 3)), CENTERS, STD),
    (np.zeros((0, 2)), CENTERS, STD), (np.zeros((3, 2)), CENTERS, 0.0)])
def test_bad_arguments(samples, centers, std):
    with pytest.raises(ValueError):
        toy.mode_metrics(samples, centers, std)


# --- the tool, end to end on a tiny trained run ---

TINY_GAUSS = ["--config=experiments/gauss2d.py", "--config.train.num_steps=20",
              "--config.train.steps_per_execution=1", "--config.train.log_every=10",
              "--config.train.checkpoint_every=10", "--config.train.sample_every=0",
              "--config.train.global_batch_size=64", "--config.model.hidden=(16,16)"]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("toy") / "run"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY_GAUSS])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir


def toy_tool(*args):
    return run_cmd(["tools/toy_metrics.py", *map(str, args)])


def last_json(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_tool_scores_the_generator_of_a_run(toy_run, tmp_path):
    result = last_json(toy_tool(f"--workdir={toy_run}", "--num_samples=300", "--seed=3"))
    assert set(result) == {"step", "checkpoint", "modes", "num_modes", "high_quality",
                           "reverse_kl", "num_samples"}
    assert result["step"] == 20 and result["checkpoint"].endswith("ckpt-20")
    assert result["num_modes"] == 25 and result["num_samples"] == 300
    assert 0 <= result["modes"] <= 25 and 0.0 <= result["high_quality"] <= 1.0
    # The same samples as tools/sample.py draws from the same seed, scored in-process.
    proc = run_cmd(["tools/sample.py", f"--workdir={toy_run}", "--num_samples=300",
                    "--seed=3", f"--output={tmp_path / 's.npy'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = metrics(np.load(tmp_path / "s.npy"))
    assert result["modes"] == expected["modes"]
    assert result["high_quality"] == pytest.approx(expected["high_quality"])
    assert (result["reverse_kl"] is None) == (expected["reverse_kl"] is None)
    if expected["reverse_kl"] is not None:
        assert result["reverse_kl"] == pytest.approx(expected["reverse_kl"])
    # --checkpoint picks an earlier one.
    first = last_json(toy_tool(f"--workdir={toy_run}", "--num_samples=10",
                               f"--checkpoint={toy_run}/checkpoints/ckpt-10"))
    assert first["step"] == 10 and first["num_samples"] == 10


def other_source_run(run, other):
    """`other`: a copy of `run`'s run.json that names a source other than toy:* (the
    generator is never loaded)."""
    other.mkdir()
    record = json.loads((run / "run.json").read_text())
    record["config"]["data"]["source"] = "embedded:digits"
    (other / "run.json").write_text(json.dumps(record))
    return other


def bad_cases(run, other, tmp_path):
    """(args, message) of each kind of bad input, for a toy run (no checkpoint ckpt-7)."""
    return [
        ([f"--workdir={other}"], "trained on 'embedded:digits', not a toy:* source"),
        ([f"--workdir={tmp_path / 'none'}"], "no training run in"),
        ([], "--workdir is required"),
        ([f"--workdir={run}", "--num_samples=0"], "--num_samples must be >= 1"),
        ([f"--workdir={run}", f"--checkpoint={run}/checkpoints/ckpt-7"], "no checkpoint"),
    ]


def assert_bad(cases, procs):
    for (args, message), proc in zip(cases, procs):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert lines[-1].startswith("error: ") and message in lines[-1], (args, lines[-1])
        assert len([l for l in lines if l.startswith("error:")]) == 1, (args, lines)
        assert "Traceback" not in proc.stderr, args


def test_tool_bad_input_is_one_line_exit_2(tmp_path):
    # In this process (conftest.run_in_process), on a run.json as the binary writes it for
    # TINY_GAUSS (training.write_run; no training): no process start per case.
    run = tmp_path / "run"
    run.mkdir()
    config = runpy.run_path(os.path.join(REPO, "experiments", "gauss2d.py"))["get_config"]()
    config.model.hidden = (16, 16)
    source = data.load(config.data.source)
    training.write_run(str(run), config, source.shape, source)
    other = other_source_run(run, tmp_path / "digits_run")
    cases = bad_cases(run, other, tmp_path)
    assert_bad(cases, [run_in_process(["tools/toy_metrics.py", *map(str, args)])
                       for args, _ in cases])
    assert sorted(os.listdir(other)) == ["run.json"] and os.listdir(run) == ["run.json"]


@pytest.mark.slow
def test_the_real_tool_exits_2_on_bad_input(toy_run, tmp_path):
    # The real run's run.json and checkpoints.
    other = other_source_run(toy_run, tmp_path / "digits_run")
    cases = [bad_cases(toy_run, other, tmp_path)[i] for i in (0, 4)]
    assert_bad(cases, run_cmds([["tools/toy_metrics.py", *map(str, args)]
                                for args, _ in cases]))
    assert sorted(os.listdir(other)) == ["run.json"]
