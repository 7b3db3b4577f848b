"""Data: sources (where examples come from) and the pipeline (how they become batches).

    source = data.load("tfds:mnist")          # or npz:PATH, arrayrecord:DIR, toy:grid25, ...
    dataset = data.make_dataset(source, global_batch_size=256, seed=0)   # global batches
    dist = data.distribute(data.input_fn(source, global_batch_size=256, seed=0), strategy)

Every element is a dict {"x": float32 [*shape], "label": int32 []}: images in [-1, 1]
NHWC, vectors as they are; labels flow through the pipeline for conditional models.
"""

from tf_gan_scale.data.pipeline import (Split, check_batch_size, distribute, input_fn,
                                        make_dataset)
from tf_gan_scale.data.sources import DEFAULT_SOURCE, SOURCES, Source, from_arrays, load

__all__ = ["DEFAULT_SOURCE", "SOURCES", "Source", "Split", "check_batch_size", "distribute",
           "from_arrays", "input_fn", "load", "make_dataset"]
