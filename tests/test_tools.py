import json

import pytest

from conftest import run_cmd


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


def test_benchmark_bad_input():
    proc = run_cmd(["tools/benchmark.py", "--config=experiments/digits.py", "--synthetic=a,b"])
    assert proc.returncode == 2 and "error: --synthetic must be H,W,C" in proc.stderr
