"""DTensor: a strided slice with a new axis (None) whose index does not name every
dimension (x[None], x[:, None], x[None, ...]) crashes layout propagation (SIGSEGV, or an
error whose text is garbage memory). Full-rank forms work."""
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from tensorflow.experimental import dtensor
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
mesh = dtensor.create_mesh([("batch", 2)], device_type="CPU")
x0 = tf.reshape(tf.range(96.0), [2, 4, 4, 3]); x = dtensor.copy_to_mesh(x0, dtensor.Layout.replicated(mesh, 4))
x = dtensor.relayout(x, dtensor.Layout(["batch", "unsharded", "unsharded", "unsharded"], mesh))
form = sys.argv[1]
fn = {"x[None]": lambda x: x[None],
      "x[:, None]": lambda x: x[:, None],
      "x[None, ...]": lambda x: x[None, ...],
      "x[None, :, :, :, :]": lambda x: x[None, :, :, :, :],
      "tf.expand_dims(x, 0)": lambda x: tf.expand_dims(x, 0),
      "x[..., None]": lambda x: x[..., None], "x[..., 1]": lambda x: x[..., 1], "x[1]": lambda x: x[1]}[form]
y = tf.function(fn)(x)
import numpy as np; from tensorflow.experimental import dtensor as dt
full = dt.relayout(y, dt.Layout.replicated(mesh, y.shape.rank)).numpy()
print(form, "OK", y.shape, dtensor.fetch_layout(y).sharding_specs, "equal:", np.array_equal(full, fn(x0).numpy()))
