"""training.validate: every numeric config key, checked before anything is read or written."""

import math

import ml_collections
import pytest

from tf_gan_scale import configs, errors
from tf_gan_scale import training


def mlp_config():
    c = configs.base()
    c.model = ml_collections.ConfigDict({"name": "mlp", "latent_dim": 2, "hidden": (8, 8)})
    return c


@pytest.mark.parametrize("key, value, valid", [
    ("train.num_steps", 0, "an integer >= 1"),
    ("train.global_batch_size", -4, "an integer >= 1"),
    ("train.d_steps", 0, "an integer >= 1"),
    ("train.steps_per_execution", -1, "an integer >= 0"),
    ("train.log_every", 0, "an integer >= 1"),
    ("train.log_every", -100, "an integer >= 1"),
    ("train.keep_checkpoints", 0, "an integer >= 1"),
    ("train.checkpoint_every", -1, "an integer >= 0"),
    ("train.sample_every", -500, "an integer >= 0"),
    ("train.penalty_weight", -0.5, "a finite number >= 0"),
    ("train.penalty_weight", math.inf, "a finite number >= 0"),
    ("train.penalty_weight", math.nan, "a finite number >= 0"),
    ("model.latent_dim", 0, "an integer >= 1"),
    ("model.d_dropout", 1.0, "a number in [0, 1)"),
    ("model.d_dropout", -0.1, "a number in [0, 1)"),
    ("train.g_optimizer.learning_rate", 0.0, "a finite number > 0"),
    ("train.d_optimizer.learning_rate", -1e-4, "a finite number > 0"),
    ("train.d_optimizer.learning_rate", math.nan, "a finite number > 0"),
    ("model.g_channels", (32, 0, 8), "a non-empty tuple of integers >= 1"),
    ("model.d_channels", (-8, 16), "a non-empty tuple of integers >= 1"),
    ("model.hidden", (), "a non-empty tuple of integers >= 1"),
])
def test_bad_number_names_key_value_and_range(key, value, valid):
    config = mlp_config() if key == "model.hidden" else configs.base()
    *path, name = key.split(".")
    node = config
    for part in path:
        node = node[part]
    node[name] = value
    with pytest.raises(errors.ConfigError) as e:
        training.validate(config, 1)
    message = str(e.value)
    assert message == f"config.{key} must be {valid}; Received: {value!r}"
    assert "\n" not in message


@pytest.mark.parametrize("key", ["checkpoint_every", "sample_every"])
def test_zero_means_only_at_the_end(key):
    config = configs.base()
    config.train[key] = 0
    training.validate(config, 1)  # Allowed: the periodic writes are off.


def test_defaults_and_edges_are_valid():
    for config in (configs.base(), mlp_config()):
        training.validate(config, 1)
    config = configs.base()
    config.model.d_dropout, config.train.penalty_weight = 0.0, 0.0
    config.train.num_steps = config.train.log_every = 1
    training.validate(config, 1)


@pytest.mark.parametrize("overrides, expected", [
    ({}, 10),  # base: 1000 steps, logs every 100, grids and checkpoints every 500.
    ({"train.num_steps": 3000, "train.checkpoint_every": 1000}, 10),
    ({"train.log_every": 5, "train.sample_every": 5, "train.num_steps": 10}, 5),
    ({"train.num_steps": 1005}, 5),
    ({"train.num_steps": 1001}, 1),
    ({"train.sample_every": 0, "train.checkpoint_every": 0, "train.num_steps": 30,
      "train.log_every": 30}, 10),
    ({"eval.every": 250, "train.num_steps": 3000}, 10),
    ({"eval.every": 25, "train.num_steps": 3000}, 5),
    ({"train.steps_per_execution": 3}, 3),  # Explicit: as given (validate checks it).
])
def test_auto_steps_per_execution_divides_every_interval(overrides, expected):
    config = configs.base()
    for key, value in overrides.items():
        section, leaf = key.split(".")
        config[section][leaf] = value
    assert training.steps_per_execution(config) == expected
    k = training.steps_per_execution(config)
    if not config.train.steps_per_execution:
        t = config.train
        for every in (t.num_steps, t.log_every, t.sample_every, t.checkpoint_every,
                      config.eval.every):
            assert every % k == 0


def test_auto_steps_per_execution_divides_the_resume_step():
    config = configs.base()
    config.train.num_steps, config.train.log_every = 10, 5
    config.train.sample_every = config.train.checkpoint_every = 5
    assert training.steps_per_execution(config) == 5
    assert training.steps_per_execution(config, start=6) == 1  # 6 -> 10 in steps of 1.
    assert training.steps_per_execution(config, start=5) == 5
