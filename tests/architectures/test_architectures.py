import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.tiny_gan import NUM_CLASSES, SHAPES, SMALL
from tf_gan_scale import architectures, errors
from tf_gan_scale.layers import ReplicaDropout

# Every family, over several data shapes it must support.


def test_every_architecture_has_shapes_to_test():
    assert set(architectures.ARCHITECTURES) == set(SHAPES)


def cases():
    for name in sorted(SHAPES):
        for shape in SHAPES[name]:
            yield name, shape, 0
            if architectures.conditional(name):
                yield name, shape, NUM_CLASSES


@pytest.mark.parametrize("name,shape,num_classes", list(cases()))
def test_contract(name, shape, num_classes):
    g, d = architectures.build(name, data_shape=shape, latent_dim=7, num_classes=num_classes,
                               **SMALL[name])
    z = tf.constant(np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32))
    labels = tf.constant([0, 1, 2, 0, 1], tf.int32)
    # Conditional models (and only they) take [inputs, labels int32 [B]].
    assert len(g.inputs) == len(d.inputs) == (2 if num_classes else 1)
    g_in = [z, labels] if num_classes else z
    x = g(g_in, training=True).numpy()
    assert x.shape == (5,) + shape
    if len(shape) == 3 and name not in ("stylegan2", "r3gan"):  # tanh (these: linear).
        assert np.all(np.abs(x) <= 1.0)
    d_in = [tf.constant(x), labels] if num_classes else x
    assert d(d_in, training=True).shape == (5, 1)
    # get_config round trip: same architecture, and with the same weights, same outputs.
    for model, inp in ((g, g_in), (d, d_in)):
        clone = model.__class__.from_config(model.get_config())
        clone.set_weights(model.get_weights())
        np.testing.assert_allclose(clone(inp, training=False), model(inp, training=False),
                                   atol=1e-6)


def test_conditional_families_and_num_classes():
    assert [n for n in sorted(architectures.ARCHITECTURES) if architectures.conditional(n)] \
        == ["biggan", "r3gan", "stylegan2"]
    # num_classes comes from the data source, not config.model: never an option.
    assert all("num_classes" not in architectures.options(n) for n in architectures.ARCHITECTURES)
    with pytest.raises(errors.ConfigError) as info:
        architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=4, num_classes=10)
    assert str(info.value) == (
        "architecture 'dcgan' is unconditional; conditional architectures: biggan, r3gan, "
        "stylegan2 "
        "(config.model.conditional=True needs one of them)")
    # 0 and None (a source without labels) build the unconditional model.
    for num_classes in (0, None):
        g, _ = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=4,
                                   num_classes=num_classes, g_channels=(4, 4, 4), d_channels=(4, 4))
        assert len(g.inputs) == 1
    with pytest.raises(errors.ConfigError,
                       match=r"num_classes must be an int >= 0; Received: num_classes=-1"):
        architectures.build("biggan", data_shape=(32, 32, 3), latent_dim=8, num_classes=-1)


def test_dcgan_28x28_is_the_tensorflow_tutorial_model():
    g, d = architectures.build("dcgan", data_shape=(28, 28, 1), latent_dim=100)
    # Parameter counts printed by model.summary() in the TensorFlow DCGAN tutorial.
    assert g.count_params() == 2_330_944
    # + one int64 call counter per ReplicaDropout (non-trainable, for resumable masks).
    assert d.count_params() == 212_865 + 2
    assert sum(int(np.prod(w.shape)) for w in d.trainable_weights) == 212_865
    assert [type(layer).__name__ for layer in g.layers] == [
        "Dense", "SyncBatchNormalization", "LeakyReLU", "Reshape",
        "Conv2DTranspose", "SyncBatchNormalization", "LeakyReLU",
        "Conv2DTranspose", "SyncBatchNormalization", "LeakyReLU", "Conv2DTranspose"]
    assert [type(layer).__name__ for layer in d.layers] == [
        "Conv2D", "LeakyReLU", "ReplicaDropout", "Conv2D", "LeakyReLU", "ReplicaDropout",
        "Flatten", "Dense"]
    convs = [layer for layer in g.layers if isinstance(layer, keras.layers.Conv2DTranspose)]
    assert [(c.filters, c.kernel_size, c.strides, c.use_bias) for c in convs] == [
        (128, (5, 5), (1, 1), False), (64, (5, 5), (2, 2), False), (1, (5, 5), (2, 2), False)]
    assert convs[-1].get_config()["activation"] == "tanh"
    assert all(layer.rate == 0.3 for layer in d.layers if isinstance(layer, ReplicaDropout))
    assert all(layer.synchronized for layer in g.layers
               if isinstance(layer, keras.layers.BatchNormalization))
    assert g.layers[2].negative_slope == 0.3  # Keras' LeakyReLU default, as in the tutorial.


def test_unknown_names_and_options_fail_loudly():
    with pytest.raises(errors.ConfigError,
                       match="unknown architecture 'stylegan'; valid: biggan, dcgan, mlp, r3gan, "
                             "resnet, stylegan2"):
        architectures.build("stylegan", data_shape=(8, 8, 1), latent_dim=4)
    with pytest.raises(errors.ConfigError, match="unknown option 'dropout' for architecture 'dcgan'"):
        architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=4, dropout=0.1)
    with pytest.raises(errors.ConfigError, match=r"Received: data_shape=\(10, 10, 1\)"):
        architectures.build("dcgan", data_shape=(10, 10, 1), latent_dim=4)
    with pytest.raises(errors.ConfigError, match="unknown norm 'layer'"):
        architectures.build("mlp", data_shape=(2,), latent_dim=4, g_norm="layer")


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_weight_is_in_a_tensorflow_checkpoint(name, tmp_path):
    # Training saves with tf.train.Checkpoint, whose object graph does not look inside
    # Keras' lists of sublayers: a weight missing there is silently not restored (the
    # EMA copy of a StyleGAN2 generator lost its mapping and synthesis layers on resume).
    classes = NUM_CLASSES if architectures.conditional(name) else 0
    g, d = architectures.build(name, data_shape=SHAPES[name][0], latent_dim=7,
                               num_classes=classes, **SMALL[name])
    path = tf.train.Checkpoint(g=g, d=d).write(str(tmp_path / "ckpt"))
    saved = [k for k in tf.train.load_checkpoint(path).get_variable_to_shape_map()
             if k.endswith("VARIABLE_VALUE")]
    assert len(saved) == len(g.weights) + len(d.weights), name
