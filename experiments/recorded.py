"""The config a run directory recorded (its run.json): resume or fine-tune a run without
its config file, e.g. a snapshot brought in by tools/import_stylegan2.py.

    python -m tf_gan_scale.main --config=experiments/recorded.py:DIR --workdir=DIR \
        [--config.train.num_steps=N] [--config.data.source=... --allow_changes=data.source]

The latest segment's config (training/record.py); a change of its math is refused on
resume unless --allow_changes names it, as for any run.
"""

from tf_gan_scale.training import record


def get_config(workdir):
    config, _, _ = record.load(workdir)
    return config
