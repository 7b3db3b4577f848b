import json

import pytest

from conftest import run_cmd, run_in_process


@pytest.mark.slow
def test_benchmark_prints_one_json_line():
    proc = run_cmd(["tools/benchmark.py", "--config=experiments/digits.py", "--steps=2",
                    "--warmup=1", "--strategy=mirrored", "--num_cpu_devices=2",
                    "--config.train.global_batch_size=16"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2 and result["global_batch"] == 16
    assert result["images_per_sec"] > 0 and result["baseline_plain_keras"]["images_per_sec"] > 0
    assert result["speed_vs_baseline"] > 0


# Fails before any model is built (on one device, --strategy's default): in this process
# (conftest.run_in_process, no process start); once more by the real tool (slow).
@pytest.mark.parametrize("run", [run_in_process,
                                 pytest.param(run_cmd, marks=pytest.mark.slow)],
                         ids=["in_process", "subprocess"])
def test_benchmark_bad_input(run):
    proc = run(["tools/benchmark.py", "--config=experiments/digits.py", "--synthetic=a,b"])
    assert proc.returncode == 2 and "error: --synthetic must be H,W,C" in proc.stderr
