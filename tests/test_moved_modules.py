"""Module paths of release 0.1 still import (until 0.3), with a DeprecationWarning that
names the new place, and give the same objects (tf_gan_scale/__init__.py, _MOVED)."""

import importlib
import sys

import pytest

import tf_gan_scale

NEW_HOME = {  # An old path, a name in it, and the module that name lives in now.
    "tf_gan_scale.train_lib": ("build_gan", "tf_gan_scale.training.build"),
    "tf_gan_scale.losses": ("hinge", "tf_gan_scale.gan.losses"),
    "tf_gan_scale.evaluation": ("FidStreams", "tf_gan_scale.metrics.scoring"),
    "tf_gan_scale.callbacks": ("Preemption", "tf_gan_scale.training.callbacks"),
    "tf_gan_scale.clusters": ("kubernetes_manifest", "tf_gan_scale.cluster.kubernetes"),
    "tf_gan_scale.launch": ("launch", "tf_gan_scale.cluster.launch"),
    "tf_gan_scale.parallel.training": ("run", "tf_gan_scale.training.mesh_runner"),
}


def test_every_moved_module_names_a_real_new_home():
    for old, targets in tf_gan_scale._MOVED.items():  # noqa: SLF001
        assert old not in sys.modules or sys.modules[old] is not None
        for target in targets:
            importlib.import_module(target)


@pytest.mark.parametrize("old", sorted(NEW_HOME))
def test_an_old_path_imports_with_a_warning_naming_the_new_one(old):
    name, home = NEW_HOME[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to .*{home.rsplit('.', 1)[0]}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(home), name)
    # `from tf_gan_scale import train_lib`-style access reaches the same module.
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is module
