"""Grouped 2-D convolution (ResNeXt's cardinality; R3GAN's 3x3 block conv) that trains
on every device, with gradients of any order.

    y = GroupedConv2D(1536, groups=96)(x)       # x [B, H, W, 1536] -> y [B, H, W, 1536]

TensorFlow's grouped Conv2D trains only on GPU (cuDNN): on CPU, TF 2.21 runs its forward
but its gradient raises "Gradients for grouped convolutions are not supported on CPU"
(older builds fail the forward too: "Generic conv implementation does not support grouped
convolutions"), and its backward is reported broken on TPU. So the same grouped
convolution is written four ways (IMPLEMENTATIONS, equal up to float rounding:
tests/layers/test_grouped_conv.py), three of them compositions of ops differentiable to
any order on any device, so R1/R2 penalties can differentiate D's input gradient again:

  native       tf.nn.conv2d with the grouped filter [k, k, Cin/G, Cout] (cuDNN; GPU only)
  split        G per-group convolutions of [.., Cin/G] -> [.., Cout/G], concatenated
  einsum       im2col of the k*k shifted slices, one batched matmul over the groups
  block_diag   one dense convolution with the block-diagonal [k, k, Cin, Cout] kernel
               (G times the multiply-adds: only for small layers)

`implementation="auto"` picks `native` when a GPU is visible (cuDNN's grouped kernel: not
measured on a GPU here) and AUTO_CPU otherwise (CPU, and TPU by the same choice: XLA's
grouped conv backward is the reported failure), the fastest forward + backward measured
on a 2-core CPU at R3GAN's shapes (docs/performance.md, "Grouped convolution").
"""

import keras
import tensorflow as tf

IMPLEMENTATIONS = ("native", "split", "einsum", "block_diag")
AUTO_CPU = "split"  # Measured fastest on CPU: docs/performance.md.


def _shifted(x, k):
    """The k*k 'same'-padded shifts of x [B, H, W, C] -> [B, H, W, k*k, C] (im2col)."""
    r = k // 2
    xp = tf.pad(x, [[0, 0], [r, r], [r, r], [0, 0]])
    h, w = tf.shape(x)[1], tf.shape(x)[2]
    return tf.stack([xp[:, i:i + h, j:j + w, :] for i in range(k) for j in range(k)], axis=3)


def native(x, kernel, groups):
    """cuDNN's grouped conv: TF infers the groups from Cin / kernel's input depth."""
    del groups
    return tf.nn.conv2d(x, kernel, strides=1, padding="SAME")


def split(x, kernel, groups):
    """G convolutions of Cin/G -> Cout/G channels, concatenated in group order."""
    xs = tf.split(x, groups, axis=-1)
    ks = tf.split(kernel, groups, axis=-1)
    return tf.concat([tf.nn.conv2d(a, b, strides=1, padding="SAME")
                      for a, b in zip(xs, ks)], axis=-1)


def einsum(x, kernel, groups):
    """im2col: patches [B, H, W, k*k, G, Cin/G] times kernel [k*k, Cin/G, G, Cout/G]."""
    k, _, cin_g, cout = kernel.shape
    s = tf.shape(x)
    patches = tf.reshape(_shifted(x, k), [s[0], s[1], s[2], k * k, groups, cin_g])
    kern = tf.reshape(kernel, [k * k, cin_g, groups, cout // groups])
    y = tf.einsum("bhwkgc,kcgo->bhwgo", patches, kern)
    return tf.reshape(y, [s[0], s[1], s[2], cout])


def block_diag(x, kernel, groups):
    """The dense [k, k, Cin, Cout] kernel whose group-g block is group g's kernel."""
    k, _, cin_g, cout = kernel.shape
    kern = tf.reshape(kernel, [k, k, cin_g, groups, cout // groups])
    eye = tf.eye(groups, dtype=kernel.dtype)
    dense = tf.einsum("hwcgo,fg->hwfcgo", kern, eye)  # f: the input channels' group.
    dense = tf.reshape(dense, [k, k, groups * cin_g, cout])
    return tf.nn.conv2d(x, dense, strides=1, padding="SAME")


FUNCTIONS = {"native": native, "split": split, "einsum": einsum, "block_diag": block_diag}


def resolve(implementation):
    """The implementation "auto" means on this process's devices (see module docstring);
    any other name checked against IMPLEMENTATIONS."""
    if implementation == "auto":
        return "native" if tf.config.list_logical_devices("GPU") else AUTO_CPU
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown grouped conv implementation {implementation!r}; valid: "
                         f"auto, {', '.join(IMPLEMENTATIONS)}")
    return implementation


def grouped_conv2d(x, kernel, groups, implementation="auto"):
    """x [B, H, W, Cin], kernel [k, k, Cin/groups, Cout] -> [B, H, W, Cout], stride 1,
    'same' padding; output channel o sees input group o // (Cout / groups)."""
    return FUNCTIONS[resolve(implementation)](x, kernel, int(groups))


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class GroupedConv2D(keras.layers.Layer):
    """Grouped conv, stride 1, 'same', no bias: [B, H, W, Cin] -> [B, H, W, filters].

    The kernel variable has Keras Conv2D(groups=)'s shape [k, k, Cin/groups, filters]
    (PyTorch's [filters, Cin/groups, k, k] transposed (2, 3, 1, 0)).

    Args:
        filters: output channels, divisible by groups.
        groups: the cardinality; Cin must be divisible by it.
        kernel_size: odd int (3).
        implementation: "auto" or one of IMPLEMENTATIONS (module docstring); resolved
            when the layer is called, so a model saved on a CPU runs natively on a GPU.
        kernel_initializer: Keras initializer (R3GAN: N(0, gain / sqrt(k*k*Cin/groups))).
        **kwargs: base Layer arguments (name, dtype).
    """

    def __init__(self, filters, *, groups, kernel_size=3, implementation="auto",
                 kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.filters, self.groups, self.kernel_size = int(filters), int(groups), int(kernel_size)
        self.implementation = implementation
        resolve(implementation)  # Fails now on a bad name.
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        if self.groups < 1 or self.filters % self.groups:
            raise ValueError(f"filters must be divisible by groups >= 1; Received: "
                             f"filters={filters}, groups={groups}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd; Received: kernel_size={kernel_size}")

    def build(self, input_shape):
        cin = int(input_shape[-1])
        if cin % self.groups:
            raise ValueError(f"input channels {cin} not divisible by groups={self.groups}")
        k = self.kernel_size
        self.kernel = self.add_weight(name="kernel", shape=(k, k, cin // self.groups,
                                                            self.filters),
                                      initializer=self.kernel_initializer)

    def call(self, x):
        kernel = tf.cast(self.kernel, self.compute_dtype)
        return grouped_conv2d(x, kernel, self.groups, self.implementation)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.filters,)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "groups": self.groups,
                "kernel_size": self.kernel_size, "implementation": self.implementation,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}
