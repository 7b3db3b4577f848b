"""The tiny DCGAN on the embedded digits that many in-process tests train: 8x8 images,
batch norm in G and D, seed 5; `make` builds and compiles it under a strategy."""

import keras

from tf_gan_scale import architectures, data, gan, latents

LATENT = 8
GB = 16


def make(strategy, *, d_steps=1, sync_bn=True, d_norm="batch", spe=1, loss="non_saturating",
         sgd=False, **opt):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                                   d_dropout=0.0, sync_bn=sync_bn, d_norm=d_norm,
                                   g_channels=(16, 8, 4), d_channels=(4, 8))
        model = gan.GAN(g, d, LATENT, seed=5,
                        sync_batch_norm="auto" if sync_bn else False)
        optimizer = ((lambda: keras.optimizers.SGD(0.05, **opt)) if sgd else
                     (lambda: keras.optimizers.Adam(1e-3, beta_1=0.5, **opt)))
        model.compile(g_optimizer=optimizer(), d_optimizer=optimizer(), loss=loss,
                      d_steps=d_steps, steps_per_execution=spe)
    return model


def digits():
    return data.make_dataset(data.load("embedded:digits"), global_batch_size=GB, seed=0)


def fit(model, strategy, steps):
    return model.fit(strategy.experimental_distribute_dataset(digits()), epochs=1,
                     steps_per_epoch=steps, verbose=0).history


def samples(model):
    return model.generator(latents.fixed(9, 8, LATENT), training=False).numpy()


# Each architecture family at small widths and the data shapes tests build it for.
SHAPES = {"mlp": [(2,), (5,)], "dcgan": [(8, 8, 1), (28, 28, 1), (12, 16, 3)],
          "resnet": [(8, 8, 1), (16, 16, 3), (12, 16, 3), (32, 32, 3)],
          "biggan": [(32, 32, 3), (64, 64, 1)],
          "stylegan2": [(8, 8, 1), (16, 16, 3)],
          "r3gan": [(16, 16, 3)]}
SMALL = {"mlp": {"hidden": (16, 16)},
         "dcgan": {"g_channels": (16, 8, 4), "d_channels": (4, 8), "d_norm": "batch"},
         "resnet": {"g_channels": (8, 8), "d_channels": (8, 8), "d_downsample": 2},
         # Self-attention at 16x16 is in G and D at both sizes (round trip covers it).
         "biggan": {"ch": 4, "attention": 16},
         # Minibatch-std groups of 5: the contract test's batch.
         "stylegan2": {"w_dim": 8, "mapping_layers": 2, "fmaps": 1 / 256, "channel_max": 8,
                       "mbstd_group": 5},
         # One width per stage 4..16; G's last / D's first stage follow the policy.
         "r3gan": {"widths": (16, 16, 8), "blocks": 1, "cardinality": (4, 4, 2),
                   "bf16_stages": 1}}
NUM_CLASSES = 3  # Conditional families are also tested with labels.
