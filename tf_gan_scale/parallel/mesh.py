"""The device mesh of a model-parallel run: "batch:B,model:M" -> a DTensor mesh.

Axis "batch" splits examples (data parallelism: B copies of every replicated weight),
axis "model" splits sharded weights (each device holds 1/M of them). B x M must equal
the number of devices of the run (GPUs, TPU cores, or logical CPUs).
"""

from tf_gan_scale import errors

AXES = ("batch", "model")
BATCH, MODEL = AXES


def parse(spec):
    """"batch:B,model:M" (either axis may be left out: size 1) -> {"batch": B, "model": M}.

    Raises ConfigError naming the bad part and the valid form.
    """
    form = "valid: batch:B,model:M with B, M >= 1 (e.g. batch:2,model:2)"
    dims = {}
    for part in str(spec).split(","):
        name, sep, size = part.strip().partition(":")
        if not sep or name not in AXES or name in dims:
            why = ("repeated axis" if name in dims else
                   f"unknown axis {name!r}" if sep else f"no size in {part.strip()!r}")
            raise errors.ConfigError(f"--mesh={spec!r}: {why}; {form}")
        try:
            dims[name] = int(size)
        except ValueError:
            raise errors.ConfigError(f"--mesh={spec!r}: size {size!r} of axis {name!r} is "
                                     f"not an integer; {form}") from None
        if dims[name] < 1:
            raise errors.ConfigError(f"--mesh={spec!r}: axis {name!r} has size "
                                     f"{dims[name]}; {form}")
    return {axis: dims.get(axis, 1) for axis in AXES}


def fitting(num_devices):
    """Every "batch:B,model:M" with B x M = num_devices (what an error proposes)."""
    return [f"batch:{num_devices // m},model:{m}"
            for m in range(1, num_devices + 1) if num_devices % m == 0]


def check(dims, num_devices, device_type="CPU"):
    """Raises ConfigError unless the mesh uses exactly the `num_devices` devices."""
    size = dims[BATCH] * dims[MODEL]
    if size != num_devices:
        raise errors.ConfigError(
            f"--mesh=batch:{dims[BATCH]},model:{dims[MODEL]} needs {size} devices, the run "
            f"has {num_devices} {device_type}; meshes that fit: "
            f"{', '.join(fitting(num_devices))}")


def device_type():
    """The accelerator a mesh is built on: TPU, else GPU, else (logical) CPU."""
    import tensorflow as tf
    for kind in ("TPU", "GPU"):
        if tf.config.list_logical_devices(kind):
            return kind
    return "CPU"


def make(dims, kind=None):
    """A DTensor mesh ("batch", "model") of this process's devices of `kind` (default:
    `device_type()`); checked against their number first.

    Returns:
        dtensor.Mesh with dim_size("batch") = B and dim_size("model") = M.
    """
    import tensorflow as tf
    from tensorflow.experimental import dtensor
    kind = kind or device_type()
    devices = [d.name for d in tf.config.list_logical_devices(kind)]
    check(dims, len(devices), kind)
    return dtensor.create_mesh([(BATCH, dims[BATCH]), (MODEL, dims[MODEL])],
                               devices=devices, device_type=kind)
