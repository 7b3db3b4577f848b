import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/wtsg"); sys.path.insert(0, "/work/wtsg/tests/helpers")
import numpy as np, tensorflow as tf
import mesh_helpers as mh
from tf_gan_scale import training
from tf_gan_scale.layers import stylegan as S
def run(slices, steps=10):
    c = mh.config("stylegan2", "sgd")
    tf.keras.utils.set_random_seed(0) if False else None
    gan = training.build_gan(c, (8, 8, 1), 0)
    return gan
ref, init, batches, _ = mh.reference("stylegan2", "sgd", 10)
c = mh.config("stylegan2", "sgd")
g2 = training.build_gan(c, (8, 8, 1), 0)
for net, w in zip([g2.generator, g2.discriminator], init):
    net.set_weights(w)
def step(feed):
    with S.slice_resampling():
        return g2.train_step(feed)
f = tf.function(step)
for xs in batches:
    x, y = xs[0]
    f({"x": tf.constant(x), "label": tf.constant(y)})
gap = max(float(np.abs(a.numpy().astype(np.float64) - b.numpy()).max())
          for n1, n2 in [(ref.generator, g2.generator), (ref.discriminator, g2.discriminator)]
          for a, b in zip(n1.weights, n2.weights))
print("one device, slices vs depthwise, 10 SGD steps: max weight gap", gap)
