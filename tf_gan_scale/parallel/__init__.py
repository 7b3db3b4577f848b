"""Model and hybrid parallelism on a DTensor mesh ("batch" x "model" axes).

tf.distribute (distribute.py) copies every weight to every replica; here weights themselves
are split over the mesh's "model" axis while the "batch" axis splits examples. The two
engines never meet inside one step (docs/notes/dtensor.md: `strategy.run` cannot touch a
DVariable).

  mesh.py     parse and check "batch:B,model:M", build the DTensor mesh
  layouts.py  the layout policy (by layer type, regex overrides per weight path) and the
              sharding of built Keras models (each device holds 1/M of a sharded weight)
  step.py     MeshTrainer: the GAN step on the mesh (separate D and G functions,
              read-once optimizers), equal to one device
"""
