"""Writes tests/data/gan_v0_1.keras and gan_v0_1_expected.npz with the code of release
0.1.0 before the package was reorganized (issue 23): a conditional BigGAN-class GAN with
the settings a `.keras` file must carry (EMA, LeCam anchors, hinge loss, R1, d_steps 2,
DiffAugment, label smoothing off, Adam with its own betas), trained 2 steps. The files are
committed; tests/test_keras_file_compat.py loads them with today's code. Kept to show
how they were made (it needs the old module paths):

    git checkout <a commit before the reorganization> && python tests/data/make_v0_1_keras.py
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main():
    import keras
    import tensorflow as tf
    from tf_gan_scale import architectures, data, gan, latents
    keras.utils.set_random_seed(0)
    g, d = architectures.build("biggan", data_shape=(16, 16, 1), latent_dim=8,
                               num_classes=10, ch=2, g_channels=(2, 2), d_channels=(1, 2),
                               attention=8, shared_dim=4)
    model = gan.GAN(g, d, 8, seed=11, num_classes=10, ema_decay=0.9, ema_start=1,
                    ema_warmup=1)
    model.compile(g_optimizer=keras.optimizers.Adam(2e-3, beta_1=0.3),
                  d_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.4, beta_2=0.9),
                  loss="hinge", d_steps=2, penalty="r1", penalty_weight=0.5,
                  augment="translation", lecam_weight=0.3, lecam_decay=0.9,
                  ortho_weight=1e-3, instance_noise=0.05, instance_noise_steps=10)
    digits = data.load("embedded:digits").arrays
    x = np.repeat(np.repeat(digits["x"], 2, axis=1), 2, axis=2)
    source = data.from_arrays("digits16", x, digits["label"])
    model.fit(data.make_dataset(source, global_batch_size=8, seed=0), epochs=1,
              steps_per_epoch=2, verbose=0)
    model.save(os.path.join(HERE, "gan_v0_1.keras"))
    z = latents.fixed(3, 6, 8).numpy()
    labels = np.arange(6, dtype=np.int32)
    np.savez(os.path.join(HERE, "gan_v0_1_expected.npz"), z=z, labels=labels,
             samples=model([tf.constant(z), tf.constant(labels)]).numpy(),
             generator=model.generator([z, labels], training=False).numpy(),
             lecam_anchors=model.lecam_anchors.numpy(), step=int(model.step.numpy()))


if __name__ == "__main__":
    main()
