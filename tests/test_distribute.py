import json

import pytest
import tensorflow as tf

from tf_gan_scale import distribute, errors


def test_strategy_names():
    assert isinstance(distribute.make_strategy("one_device"), tf.distribute.OneDeviceStrategy)
    # conftest made 2 logical CPUs, so auto picks mirrored over both.
    auto = distribute.make_strategy("auto")
    assert isinstance(auto, tf.distribute.MirroredStrategy)
    assert auto.num_replicas_in_sync == 2
    with pytest.raises(errors.ConfigError, match="unknown strategy 'gpu'; valid: auto, mirrored, "
                                                 "multi_worker_mirrored, one_device, tpu"):
        distribute.make_strategy("gpu")


def test_gpu_and_tpu_flags_fail_clearly_here():
    with pytest.raises(errors.ConfigError, match="--num_gpus=2 but this machine has no GPU"):
        distribute.make_strategy("mirrored", num_gpus=2)
    with pytest.raises(errors.ConfigError, match="--strategy=tpu needs --tpu="):
        distribute.make_strategy("tpu")


def test_cpu_devices_cannot_change_after_initialization():
    distribute.configure_cpu_devices(2)  # Same count: fine.
    with pytest.raises(errors.ConfigError, match="cannot split the CPU into 3 devices"):
        distribute.configure_cpu_devices(3)
    with pytest.raises(errors.ConfigError, match="must be >= 1"):
        distribute.configure_cpu_devices(0)


@pytest.mark.parametrize("raw", [
    "not json",
    json.dumps({"cluster": {"worker": ["localhost:1"]}}),
    json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}}),
    json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "ps", "index": 0}}),
])
def test_bad_tf_config_is_named(monkeypatch, raw):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(errors.ConfigError, match="bad TF_CONFIG"):
        distribute.make_strategy("multi_worker_mirrored")


def test_single_host_is_chief(one_device):
    assert distribute.is_chief(one_device)
