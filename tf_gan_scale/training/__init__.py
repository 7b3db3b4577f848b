"""Training runs: preparing one (writes nothing), running it, its workdir and callbacks.

    build.py      the GAN of a config: networks, optimizers, compile
    prepare.py    validate -> data -> build -> restore -> input pipeline (writes nothing)
    run.py        the `fit` runner (tf.distribute strategies, placements)
    mesh_runner.py   the DTensor mesh runner
    workdir.py    what a run directory holds; run.json; restoring checkpoints
    callbacks.py  checkpoints, preemption, samples, TensorBoard, scores, progress

    model = training.run(config, workdir, strategy)
"""

from tf_gan_scale.training.build import (build_gan, build_networks, make_optimizer,
                                         model_options, num_classes, placement_of,
                                         steps_per_execution)
from tf_gan_scale.training.prepare import make_scorer, prepare_run, validate
from tf_gan_scale.training.runner import run
from tf_gan_scale.training.workdir import RUN_FILE, cache_dir, load_run, restore, write_run

__all__ = ["RUN_FILE", "build_gan", "build_networks", "cache_dir", "load_run",
           "make_optimizer", "make_scorer", "model_options", "num_classes", "placement_of",
           "prepare_run", "restore", "run", "steps_per_execution", "validate", "write_run"]
