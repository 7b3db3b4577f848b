"""Cross-replica batch norm in the user's own Keras models.

`keras.layers.BatchNormalization` normalizes with each replica's LOCAL batch, so a GAN
written in plain Keras (the keras.io DCGAN) trains differently on N replicas than on one
device, silently. `sync_batch_norm(model)` returns a copy in which every such layer is a
`layers.SyncBatchNormalization` (statistics over the global batch, one all-reduce per layer
and pass) with the same config, weights and moving statistics:

    model, converted, unconvertible = convert.sync_batch_norm(model)

`GAN(..., sync_batch_norm="auto")` calls this on both networks under a multi-replica
strategy (`for_gan`). Only Sequential and Functional models can be rebuilt; a subclassed
model is returned unchanged, its batch-statistics layers listed as unconvertible.
"""

import keras
import tensorflow as tf
from absl import logging
from keras.src.models.functional import Functional  # Public only as keras.Model(inputs, ...).

from tf_gan_scale.layers.sync_batch_norm import SyncBatchNormalization

MODES = ("auto", True, False)


def _rebuildable(model):
    """True for Sequential and Functional models (clone_model can rebuild those)."""
    if isinstance(model, keras.Sequential):
        return type(model) is keras.Sequential
    return type(model) is Functional


def _last_axis(layer):
    """Whether a BatchNormalization layer normalizes the last axis (channels last)."""
    axis = layer.axis
    if axis == -1:
        return True
    shape = getattr(layer, "_build_shapes_dict", None) or {}
    shape = next(iter(shape.values()), None)
    if shape is None:  # Unbuilt with an explicit positive axis: cannot tell, so no.
        return False
    return axis == len(shape) - 1


def _verdict(layer):
    """(kind, reason) of a layer: kind "convert", "skip" or "unconvertible"."""
    if isinstance(layer, SyncBatchNormalization):
        return "skip", "already cross-replica"
    if type(layer) is keras.layers.BatchNormalization:
        if layer.renorm:
            return "unconvertible", "renorm=True (not supported by SyncBatchNormalization)"
        if not _last_axis(layer):
            return "unconvertible", f"axis={layer.axis} is not the last axis (channels last)"
        if layer.synchronized:
            return "skip", "already synchronized=True (Keras' synchronized batch norm)"
        return "convert", ""
    if isinstance(layer, keras.layers.BatchNormalization):
        if layer.synchronized:
            return "skip", "synchronized=True"
        return "unconvertible", (f"{type(layer).__name__} subclasses BatchNormalization "
                                 f"(per-replica batch statistics)")
    if getattr(layer, "synchronized", None) is False:
        return "unconvertible", (f"{type(layer).__name__} has synchronized=False "
                                 f"(per-replica batch statistics)")
    return "skip", ""


def _describe(path, layer, reason):
    return f"{path}{layer.name} ({type(layer).__name__}): {reason}"


def _walk(layer, path=""):
    """(path, sublayer) for every layer inside `layer`, at any depth (models and custom
    layers alike)."""
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        yield path, sub
        yield from _walk(sub, f"{path}{sub.name}/")


def _unconvertible(layer, path, why):
    """Descriptions of the layers inside `layer` that keep per-replica batch statistics
    (plain BatchNormalization included, since its container cannot be rebuilt: `why`)."""
    found = []
    for p, sub in _walk(layer, path):
        kind, reason = _verdict(sub)
        if kind != "skip":
            found.append(_describe(p, sub, reason or why))
    return found


def _convert(model, path, state):
    """A rebuilt copy of a Sequential/Functional `model` (no weights copied yet)."""

    def clone_layer(layer):
        if isinstance(layer, keras.Model):
            if _rebuildable(layer):
                return _convert(layer, f"{path}{layer.name}/", state)
            # A subclassed model nested in a graph model: share it unchanged.
            state["unconvertible"] += _unconvertible(
                layer, f"{path}{layer.name}/", "inside a subclassed model")
            return layer
        kind, reason = _verdict(layer)
        if kind == "convert":
            state["converted"] += 1
            return SyncBatchNormalization.from_config(layer.get_config())
        if kind == "unconvertible":
            state["unconvertible"].append(_describe(path, layer, reason))
        # Batch norm inside a custom layer cannot be replaced from outside.
        state["unconvertible"] += _unconvertible(
            layer, f"{path}{layer.name}/", f"inside custom layer {type(layer).__name__}")
        try:
            return layer.__class__.from_config(layer.get_config())
        except Exception:  # noqa: BLE001 (a custom layer without a working get_config)
            return layer  # Shared with the original model, weights and all.

    return keras.models.clone_model(model, clone_function=clone_layer)


def _copy_weights(source, target):
    """Copies weights layer by layer, matching layers by order (nested models recursively)."""
    if len(source.layers) != len(target.layers):
        raise RuntimeError(f"cloned model {target.name} has {len(target.layers)} layers, "
                           f"the original {len(source.layers)}")
    for old, new in zip(source.layers, target.layers):
        if old is new:
            continue  # Shared unchanged (a nested subclassed model).
        if isinstance(old, keras.Model) and _rebuildable(old):
            _copy_weights(old, new)
        else:
            new.set_weights(old.get_weights())


def sync_batch_norm(model, *, name=None):
    """Replaces per-replica batch norm in `model` by `SyncBatchNormalization`.

    Every `keras.layers.BatchNormalization` (exact class, channels last, renorm off) of a
    Sequential or Functional model, nested Sequential/Functional sub-models included,
    becomes a `SyncBatchNormalization` with the same config, weights and moving
    statistics; every other layer is cloned with its weights. Create the result under the
    strategy scope the model will train in (variables are created where this runs).

    Args:
        model: a keras.Model. Build it first if its weights matter (they are copied).
        name: optional name of the returned model (default: the original's).

    Returns:
        (model, converted, unconvertible): the new model (the SAME object when nothing was
        converted), the number of layers replaced, and descriptions
        "path/name (Class): reason" of layers that keep per-replica batch statistics:
        renorm or non-last-axis BatchNormalization, BatchNormalization subclasses, layers
        with `synchronized=False`, and any batch norm inside a custom layer or a
        subclassed model (which cannot be rebuilt and is returned unchanged). A layer
        that cannot be cloned from its config is shared with the original model.
    """
    if not _rebuildable(model):
        return model, 0, _unconvertible(
            model, "", "model is not Sequential or Functional, so its layers cannot be "
            "replaced")
    state = {"converted": 0, "unconvertible": []}
    new = _convert(model, "", state)
    if not state["converted"]:
        return model, 0, state["unconvertible"]
    if model.built and not new.built:
        new.build(model.input_shape)
    _copy_weights(model, new)
    if name is not None:
        new.name = name
    return new, state["converted"], state["unconvertible"]


def for_gan(generator, discriminator, mode="auto"):
    """Applies `sync_batch_norm` to both networks of a GAN as `mode` says; logs what it did.

    Args:
        generator, discriminator: built keras models.
        mode: "auto" converts under a strategy with more than one replica in sync (call
            inside `strategy.scope()`), True always, False never.

    Returns:
        (generator, discriminator), converted or unchanged.
    """
    if not any(mode is m for m in MODES) and mode != "auto":
        raise ValueError(f"sync_batch_norm must be 'auto', True or False; "
                         f"Received: sync_batch_norm={mode!r}")
    if mode is False or (mode == "auto"
                         and tf.distribute.get_strategy().num_replicas_in_sync <= 1):
        return generator, discriminator
    generator, g_count, g_bad = sync_batch_norm(generator)
    discriminator, d_count, d_bad = sync_batch_norm(discriminator)
    if g_count or d_count:
        logging.info("converted %d/%d BatchNormalization layers of generator/discriminator "
                     "to SyncBatchNormalization (cross-replica statistics); pass "
                     "sync_batch_norm=False to keep them per replica", g_count, d_count)
    for network, bad in (("generator", g_bad), ("discriminator", d_bad)):
        for description in bad:
            logging.warning("%s layer %s keeps per-replica batch statistics: N replicas "
                            "will not train like one device", network, description)
    return generator, discriminator
