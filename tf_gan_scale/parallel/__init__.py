"""Model and hybrid parallelism on a DTensor mesh ("batch" x "model" axes).

tf.distribute (distribute.py) copies every weight to every replica; here weights themselves
are split over the mesh's "model" axis while the "batch" axis splits examples. The two
engines never meet inside one step (docs/notes/dtensor.md: `strategy.run` cannot touch a
DVariable).

  mesh.py     parse and check "batch:B,model:M", build the DTensor mesh
  layouts.py  the layout policy (by layer type, regex overrides per weight path) and the
              sharding of built Keras models (each device holds 1/M of a sharded weight)
  step.py     MeshTrainer: the GAN step on the mesh (one function, the Keras optimizers),
              equal to one device

Importing this package switches off DTensor's all-reduce combining pass in this process
(`combine_all_reduces`): it is the read-after-write hazard of docs/model_parallel.md.
"""

import os

# DTensor's MLIR pass that merges independent all-reduces of a function into one may move
# a collective past a later read of a variable the function wrote earlier: the read then
# returns the OLD value (probed: Adam's second moment read before its own update, G's
# update seeing D before D's update in one function: 8e-2 off one device after 10 SGD
# steps, 1.5e-7 with the pass off). TensorFlow reads the variable once, when the process's
# DTensor device is created (DTensorMlirPassRunner), so it must be set before any DTensor
# call: every use of DTensor in the framework (main, mesh clients, the benchmark, tests)
# imports this package first, and `mesh.initialize` sets it again. Forced, not defaulted:
# a user's exported 1 would silently bring the hazard back. COMBINE_OPT_IN=1 keeps the
# pass on (only the test and the benchmark that show what it costs use it).
COMBINE_VAR = "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION"
COMBINE_OPT_IN = "TF_GAN_SCALE_DTENSOR_COMBINE"


def combine_all_reduces():
    """Sets COMBINE_VAR for this process ("0" unless COMBINE_OPT_IN is "1"); returns
    whether the combining pass is on."""
    on = os.environ.get(COMBINE_OPT_IN) == "1"
    os.environ[COMBINE_VAR] = "1" if on else "0"
    return on


combine_all_reduces()

