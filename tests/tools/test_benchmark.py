"""tools/benchmark.py --input_only: the input pipeline alone against the train step."""

import json

import numpy as np
import pytest

from conftest import TINY, run_cmd, run_in_process
from tf_gan_scale import data, perf

KEYS = {"config", "source", "strategy", "replicas", "global_batch", "d_steps",
        "steps_per_execution", "batches_per_call", "pipeline_batches_per_sec",
        "pipeline_images_per_sec", "pipeline_timed_batches", "train_steps_per_sec",
        "train_batches_per_sec", "step_time_s", "input_headroom", "all_step_times_s",
        "all_pipeline_batches_per_sec", "rows_read_per_batch", "resume_first_batch_s",
        "peak_rss_mb"}


def test_time_input_pipeline_pulls_k_batches_per_call(one_device):
    # Labels = example index, so the next batch after the timed ones says how many were
    # pulled: 2 warm-up + 3 timed calls of 4 batches = 20 (min_seconds=0: exactly 3).
    n, gb = 40, 2
    source = data.from_arrays("counting", np.zeros([n, 2], np.float32), np.arange(n))
    dataset = data.make_dataset(source, global_batch_size=gb, seed=3)
    iterator = iter(data.distribute(dataset, one_device))
    out = perf.time_input_pipeline(iterator, one_device, batches_per_call=4,
                                   warmup_calls=2, min_calls=3, min_seconds=0.0)
    assert out["batches"] == 12
    assert out["batches_per_sec"] == pytest.approx(12 / out["seconds"])
    expected = list(dataset.take(21))[20]["label"].numpy()
    np.testing.assert_array_equal(next(iterator)["label"].numpy(), expected)


def run_input_only(extra):
    proc = run_cmd(["tools/benchmark.py", *TINY, "--input_only", "--strategy=one_device",
                    "--steps=3", "--warmup=1", "--repeats=1", f"--input_seconds={INPUT_SECONDS}",
                    *extra])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result) == KEYS
    return result


INPUT_SECONDS = 0.2


def check_numbers(result, *, source, d_steps=1):
    # The configuration asked for: TINY (digits.py, global batch 32, one step per call) on
    # one device, --repeats=1 (one timed run of each).
    assert (result["config"], result["strategy"], result["replicas"]) == (
        "digits.py", "one_device", 1)
    assert result["source"] == source and result["global_batch"] == 32
    assert result["steps_per_execution"] == 1
    assert result["batches_per_call"] == d_steps and result["d_steps"] == d_steps
    assert len(result["all_step_times_s"]) == len(result["all_pipeline_batches_per_sec"]) == 1
    assert result["step_time_s"] == pytest.approx(result["all_step_times_s"][0], abs=1e-4)
    assert result["pipeline_batches_per_sec"] == pytest.approx(
        result["all_pipeline_batches_per_sec"][0])
    # One worker reads the global batch per batch it pulls (prefetch past the timed
    # window adds a little); no resume positions were asked for.
    assert 32 <= result["rows_read_per_batch"] < 1.5 * 32
    assert result["resume_first_batch_s"] == {} and result["peak_rss_mb"] > 0
    # The report rounds (images/s to 1 decimal, batches/s to 2, ratios to 2-3): the abs
    # bounds below are half a unit of the rounding, so a slow machine's small rates pass.
    # At least --steps calls of batches_per_call batches were timed, for at least
    # --input_seconds (a lower bound: a loaded machine only makes the time longer).
    assert result["pipeline_timed_batches"] >= 3 * d_steps
    assert result["pipeline_timed_batches"] % d_steps == 0
    assert (result["pipeline_timed_batches"] / result["pipeline_batches_per_sec"]
            >= INPUT_SECONDS * (1 - 1e-2))
    assert result["pipeline_images_per_sec"] == pytest.approx(
        32 * result["pipeline_batches_per_sec"], rel=1e-3, abs=0.25)  # 32 x round(., 2)
    assert result["train_steps_per_sec"] == pytest.approx(1 / result["step_time_s"], rel=1e-3,
                                                                   abs=5e-4)
    assert result["train_batches_per_sec"] == pytest.approx(
        d_steps * result["train_steps_per_sec"], rel=1e-3, abs=1e-3 * d_steps)
    # Batches produced per batch consumed.
    assert result["input_headroom"] == pytest.approx(
        result["pipeline_batches_per_sec"] / result["train_batches_per_sec"],
        rel=1e-2, abs=0.01)


@pytest.mark.slow
def test_input_only_embedded():
    result = run_input_only([])
    check_numbers(result, source="embedded:digits")
    # d_steps 1: the headroom is pipeline batches/s over train steps/s.
    assert result["input_headroom"] == pytest.approx(
        result["pipeline_batches_per_sec"] / result["train_steps_per_sec"], rel=1e-2, abs=0.01)


@pytest.mark.slow
def test_input_only_npz_two_d_steps(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(path, x=rng.integers(0, 256, (96, 8, 8, 1), dtype=np.uint8),
             y=rng.integers(0, 10, 96))
    result = run_input_only([f"--config.data.source=npz:{path}",
                             "--config.train.d_steps=2"])
    check_numbers(result, source=f"npz:{path}", d_steps=2)


@pytest.mark.slow
def test_mesh_and_placement_report_speed_and_the_parameters_each_device_holds():
    # TINY's G: Dense [16, 2*2*32 = 128] (column-parallel on model:2) and D's last Dense
    # [64, 1] (row-parallel): each device of batch:1,model:2 holds half of each kernel.
    proc = run_cmd(["tools/benchmark.py", *TINY, "--strategy=one_device", "--baseline=false",
                    "--num_cpu_devices=2", "--mesh=batch:1,model:2", "--mesh=batch:2,model:1",
                    "--placement=g:0,d:1", "--steps=2", "--warmup=1", "--repeats=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    full = result["params_per_device"]
    split, data = result["meshes"]["batch:1,model:2"], result["meshes"]["batch:2,model:1"]
    assert data["params_per_device"] == full and data["split_weights"] == 0
    assert split["split_weights"] == 2
    assert split["params_per_device"]["generator"] == full["generator"] - 16 * 128 // 2
    assert split["params_per_device"]["discriminator"] == full["discriminator"] - 64 // 2
    # The cost model's bytes per device and step: batch:1,model:2 all-reduces no gradients
    # over "batch" (one row) and gathers activations over "model"; batch:2,model:1 the
    # reverse. Its gradient tensors are 4 bytes x the split kernels' halves smaller (one
    # D update and one G update per step).
    s_bytes, d_bytes = split["bytes_per_device_step"], data["bytes_per_device_step"]
    assert s_bytes["sent"]["gradients"] == 0 and s_bytes["sent"]["model_gather"] > 0
    assert d_bytes["sent"]["model_gather"] == d_bytes["sent"]["model_all_reduce"] == 0
    assert d_bytes["sent"]["gradients"] == d_bytes["messages"]["gradients"] > 0  # 2(B-1)/B = 1
    assert d_bytes["messages"]["gradients"] - s_bytes["messages"]["gradients"] == \
        4 * (16 * 128 // 2 + 64 // 2)
    placed = result["placement"]
    assert placed["spec"] == "g:0,d:1"
    # Rows for exactly the runs asked for, each timed --repeats=1 times over --steps=2.
    assert set(result["meshes"]) == {"batch:1,model:2", "batch:2,model:1"}
    assert "baseline_plain_keras" not in result  # --baseline=false.
    assert (result["steps"], result["repeats"], result["global_batch"], result["d_steps"]) \
        == (2, 1, 32, 1)
    assert len(result["all_step_times_s"]) == 1
    step_time = result["step_time_s"]
    assert step_time == pytest.approx(result["all_step_times_s"][0], abs=1e-4)
    for run in (result, split, data, placed):
        assert len(run["all_step_times_s"]) == 1
        assert run["step_time_s"] == pytest.approx(run["all_step_times_s"][0], abs=1e-4)
        # Images/s: the global batch (d_steps 1) per step time. Both are reported rounded,
        # images/s to 1 decimal (half a unit), the step time to 5 (half a unit moves
        # 32 / t by at most 32 x 5e-6 / t^2): the bound is their sum (pytest.approx takes
        # the larger of rel and abs, so it must be one number).
        t = run["step_time_s"]
        assert run["images_per_sec"] == pytest.approx(
            32 / t, rel=0, abs=0.05 + 32 * 5e-6 / (t - 5e-6) ** 2 + 1e-9)
    for run in (split, data, placed):
        # The report rounds the ratio to 3 decimals: half a unit of the last one, besides
        # the step times' own rounding (a tiny mesh run can be ~0.005x one device).
        assert run["speed_vs_one_device"] == pytest.approx(step_time / run["step_time_s"],
                                                           rel=1e-2, abs=5e-4)


def test_mesh_with_a_setting_it_cannot_run_exits_2(monkeypatch):
    # In this process (its 2 CPU devices are the ones asked for): the config is refused
    # before any mesh exists. The tool's malloc tuning is for its own process, not this.
    monkeypatch.setattr(perf, "tune_malloc", lambda: False)
    proc = run_in_process(["tools/benchmark.py", *TINY, "--strategy=one_device",
                           "--baseline=false", "--num_cpu_devices=2",
                           "--mesh=batch:1,model:2", "--config.train.jit_compile=True"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1]
    assert "not supported on a mesh yet: config.train.jit_compile='True' (XLA " in errors[0]


@pytest.mark.slow  # Two runs of the tool in child processes, ~25 s each.
def test_mesh_combining_counts_each_settings_collectives():
    # The combining pass merges independent all-reduces: with it on (the opt-in, for
    # this comparison only) the step runs fewer collectives than with it off (the
    # framework's setting, exact). The counts come from DTensor's own MLIR of the step,
    # so the switch must have reached each child process. Measured 19 vs 7 here. Cold
    # starts: TensorFlow reads the logging settings of the MLIR dump when it loads.
    proc = run_cmd(["tools/benchmark.py", *TINY, "--num_cpu_devices=2",
                    "--mesh=batch:1,model:2", "--mesh_combining", "--steps=2", "--warmup=1",
                    "--repeats=1"], env={"TF_GAN_SCALE_COLD_START": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])["combining"]
    off, on = (out[s]["collectives_per_step"]["CollectiveReduceV2"] for s in ("off", "on"))
    assert off > on > 0, out
    assert len(out["off"]["step_time_s"]) == len(out["on"]["step_time_s"]) == 1
    assert out["off_vs_on_time"] == pytest.approx(
        out["off"]["best_step_time_s"] / out["on"]["best_step_time_s"], rel=1e-2)
