"""The pipeline on 4 logical CPUs vs one device, through Keras `fit` (a test helper).

    python tests/helpers/pipeline_run.py

Trains the SGD DCGAN of tests/helpers/sgd_config.py (batch norm in G and D, dropout; D
with 3 convolutions, so both networks have >= 4 kernels) for 10 steps of 4 micro-batches
with no placement, stages:2, stages:4 and stages:4,recompute:1, in one process with 4
logical CPUs, and prints {spec: max |weight - one device's weight|} as JSON, with
"lr_x2": the same for one device at twice the learning rate (the control).
tests/parallel/test_parallel_pipeline.py checks it. A separate process because the
pytest process has 2 logical CPUs (tests/conftest.py).
"""

import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from tf_gan_scale import distribute  # noqa: E402

SPECS = ("stages:2", "stages:4", "stages:4,recompute:1")


def config():
    spec = importlib.util.spec_from_file_location(
        "sgd_config", os.path.join(ROOT, "tests", "helpers", "sgd_config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.train.accumulation_steps, c.train.steps_per_execution = 4, 1
    c.model.d_channels = (8, 16, 16)
    return c


def trained(spec, steps=10, lr_scale=1.0):
    from tf_gan_scale import data, training
    c = config()
    for opt in (c.train.g_optimizer, c.train.d_optimizer):
        opt.learning_rate *= lr_scale
    source = data.load(c.data.source)
    gan = training.build_gan(c, source.shape, 0, spec)
    gan.fit(data.make_dataset(source, global_batch_size=c.train.global_batch_size, seed=0),
            steps_per_epoch=steps, epochs=1, verbose=0)
    return [w.numpy() for w in gan.generator.weights + gan.discriminator.weights]


def main():
    distribute.configure_cpu_devices(4)
    one = trained("")
    def gap(run):
        return max(float(np.max(np.abs(a - b))) for a, b in zip(run, one))

    # "lr_x2": one device with a doubled learning rate (a 2x gradient scale), the control.
    print(json.dumps({**{spec: gap(trained(spec)) for spec in SPECS},
                      "lr_x2": gap(trained("", lr_scale=2.0))}))


if __name__ == "__main__":
    main()
