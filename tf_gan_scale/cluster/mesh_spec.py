"""A device mesh written as "batch:B,model:M": parsed and checked against a device count
without TensorFlow (the launcher checks a --mesh before starting any worker).

Axis "batch" splits examples (data parallelism), axis "model" splits sharded weights;
B x M must equal the number of devices of the run, over all its processes
(`parallel.mesh` builds the DTensor mesh).
"""

from tf_gan_scale import errors

AXES = ("batch", "model")
BATCH, MODEL = AXES


def parse(spec):
    """"batch:B,model:M" (either axis may be left out: size 1) -> {"batch": B, "model": M}.

    Raises ConfigError naming the bad part and the valid form.
    """
    form = "valid: batch:B,model:M with B, M >= 1 (e.g. batch:2,model:2)"
    dims = errors.named_ints("--mesh", spec, AXES, "axis", "size", form)
    for name, size in dims.items():
        if size < 1:
            raise errors.ConfigError(f"--mesh={spec!r}: axis {name!r} has size {size}; {form}")
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
