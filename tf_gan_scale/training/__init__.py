"""Training runs: preparing one (writes nothing), running it, its workdir and callbacks.

    build.py      the GAN of a config: networks, optimizers, compile
    prepare.py    validate -> data -> build -> restore -> input pipeline (writes nothing)
    run.py        the `fit` runner (tf.distribute strategies, placements)
    mesh_runner.py   the DTensor mesh runner
    workdir.py    what a run directory holds; restoring checkpoints
    checkpoints.py   the newest readable checkpoint, damaged ones set aside, checked saves
    record.py     run.json: the config of the checkpoints, segment by segment; resume checks
    callbacks.py  checkpoints, preemption, samples, TensorBoard, scores, progress
    run_lock.py   one run per workdir: run.lock, held by the chief while a run runs

    model = training.run(config, workdir, strategy)
"""

from tf_gan_scale.training.build import (build_gan, build_networks, make_optimizer,
                                         model_options, num_classes, placement_of,
                                         steps_per_execution)
from tf_gan_scale.training.prepare import make_scorer, prepare_run, validate
from tf_gan_scale.training.runner import run
from tf_gan_scale.training.record import RUN_FILE
from tf_gan_scale.training.record import load as load_run
from tf_gan_scale.training.record import write as write_run
from tf_gan_scale.training.workdir import cache_dir, restore

__all__ = ["RUN_FILE", "build_gan", "build_networks", "cache_dir", "load_run",
           "make_optimizer", "make_scorer", "model_options", "num_classes", "placement_of",
           "prepare_run", "restore", "run", "steps_per_execution", "validate", "write_run"]
