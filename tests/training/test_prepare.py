"""training.prepare_run: a restored run's input reads on exactly where the run stopped."""

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import configs, data
from tf_gan_scale.training import prepare


@pytest.mark.parametrize("d_steps, loss", [(2, "non_saturating"), (1, "rpgan")])
def test_a_restored_run_reads_on_after_d_steps_global_batches_per_step(tmp_path, d_steps,
                                                                     loss):
    # Each G step consumes d_steps global batches (one per D update), plus G's own with a
    # paired loss (R3GAN's): a run restored at step 3 with 2 batches per step must start
    # at global batch 6 of the uninterrupted stream, not at 3 (a run with one batch per
    # step, as the end-to-end resume test's, cannot tell).
    c = configs.base()
    c.model = ml_collections.ConfigDict({"name": "mlp", "latent_dim": 2, "hidden": (8, 8)})
    c.data.source, c.train.d_steps, c.train.global_batch_size = "toy:grid25", d_steps, 16
    c.train.loss = loss
    first = prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    assert first.start == 0 and first.restored is None
    first.model.step.assign(3)
    tf.train.CheckpointManager(first.checkpoint, str(tmp_path / "checkpoints"), 1).save(
        checkpoint_number=3)
    again = prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    assert again.start == 3 and again.restored.endswith("ckpt-3")
    straight = list(data.make_dataset(again.source, global_batch_size=16, seed=c.seed)
                    .take(8).as_numpy_iterator())
    resumed = list(again.input().take(2).as_numpy_iterator())
    for want, got in zip(straight[6:], resumed):
        np.testing.assert_array_equal(got["x"], want["x"])
    assert not np.array_equal(resumed[0]["x"], straight[3]["x"])
