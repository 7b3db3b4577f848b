"""A tiny DCGAN on the embedded digits with plain SGD, dropout and batch norm in G and D:
the config of the binary-level equivalence tests (tests/integration/test_multi_worker.py).

Plain SGD so a wrong gradient scale changes the weights (Adam would divide it away);
dropout on, so per-example masks are exercised across workers.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.data.source = "embedded:digits"
    c.model.latent_dim = 16
    c.model.g_channels = (32, 16, 8)
    c.model.d_channels = (8, 16)
    c.model.d_norm = "batch"
    c.model.d_dropout = 0.3
    c.seed = 1
    c.train.num_steps = 10
    c.train.global_batch_size = 32
    c.train.g_optimizer.name = c.train.d_optimizer.name = "sgd"
    c.train.g_optimizer.learning_rate = c.train.d_optimizer.learning_rate = 0.05
    c.train.log_every = c.train.sample_every = c.train.checkpoint_every = 5
    return c
