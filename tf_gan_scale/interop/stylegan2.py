"""An official StyleGAN2-ADA snapshot's networks as this package's StyleGAN2.

    objects = torch_pickle.load("network-snapshot-000200.pkl")
    model = stylegan2.model_config(objects)      # config.model keys, from the init kwargs
    g, d = architectures.build("stylegan2", data_shape=..., ...)   # that config
    stylegan2.assign(g, objects["G_ema"], "G")  # every weight, or a ConfigError
    stylegan2.assign(d, objects["D"], "D")

The official networks (NVlabs/stylegan2-ada-pytorch, training/networks.py) and ours
compute the same functions (tests/interop/test_stylegan2_import.py checks every part
against the official code's outputs); their weights differ only in layout:
  - convolution weights [O, I, kh, kw] (NCHW) -> [kh, kw, I, O] (NHWC);
  - fully connected weights [out, in] -> [in, out] (the equalized-lr gain is applied at
    run time in both, so stored values are the same);
  - G's learned constant [C, 4, 4] -> [4, 4, C]; noise_const [R, R] -> [R, R, 1];
  - D's epilogue fc reads the flattened 4x4 map: official rows (c, h, w), ours (h, w, c);
  - labels: official one-hot c [B, c_dim], ours integer classes [B] (c_dim classes).
The [1, 3, 3, 1] resample filters (buffers) are not weights here: each is checked to be
that filter, and any other is refused.
"""

import os
import re
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tf_gan_scale import configs, errors, training
from tf_gan_scale.interop import torch_pickle
from tf_gan_scale.training import checkpoints, record

# The init kwargs this package reproduces, and the value each must have (official
# defaults and train.py's choices) where it has no knob for it.
FIXED_G = {"synthesis_kwargs.architecture": "skip", "mapping_kwargs.embed_features": None,
           "mapping_kwargs.layer_features": None, "mapping_kwargs.activation": "lrelu",
           "synthesis_kwargs.resample_filter": [1, 3, 3, 1],
           "synthesis_kwargs.channels_last": None}
FIXED_D = {"cmap_dim": None, "block_kwargs.activation": "lrelu",
           "epilogue_kwargs.mbstd_num_channels": 1, "mapping_kwargs.num_layers": None,
           "block_kwargs.resample_filter": [1, 3, 3, 1]}
FILTER = np.outer([1, 3, 3, 1], [1, 3, 3, 1]) / 64.0


def _get(kwargs, dotted):
    value = kwargs
    for key in dotted.split("."):
        value = (value or {}).get(key) if isinstance(value, dict) else None
    return value


def _refuse(net, key, value, valid):
    raise errors.ConfigError(f"the snapshot's {net} has {key}={value!r}, which this package "
                             f"cannot express; valid: {valid}")


def model_config(objects):
    """config.model keys of the snapshot's G and D (their init kwargs), or a ConfigError
    naming the first setting this package cannot express.

    Args:
        objects: torch_pickle.load of a snapshot: {"G", "D", "G_ema", ...}.
    Returns:
        {"name": "stylegan2", "latent_dim", "conditional", "w_dim", "mapping_layers",
         "fmaps", "channel_max", "mbstd_group", "d_architecture", "conv_clamp",
         "num_fp16_res", "mapping_lr_mul", "w_avg_beta", "d_freeze_layers"} and
        "resolution",
        "img_channels", "num_classes" (the data's, for the caller).
    """
    for name in ("G", "D", "G_ema"):
        if name not in objects or getattr(objects[name], "class_name", None) != (
                "Discriminator" if name == "D" else "Generator"):
            raise errors.ConfigError(f"the snapshot has no official {name!r} network; valid: "
                                     f"a network-snapshot-XXXXXX.pkl of StyleGAN2-ADA")
    g, d = objects["G"].init_kwargs, objects["D"].init_kwargs
    for net, kwargs, fixed in (("G", g, FIXED_G), ("D", d, FIXED_D)):
        for key, want in fixed.items():
            value = _get(kwargs, key)
            if value is not None and value != want and not (
                    isinstance(value, (list, tuple)) and list(value) == want):
                _refuse(net, key, value, repr(want))
    synthesis, mapping = g.get("synthesis_kwargs", {}), g.get("mapping_kwargs", {})
    base, cmax = synthesis.get("channel_base", 32768), synthesis.get("channel_max", 512)
    fp16, clamp = synthesis.get("num_fp16_res", 0), synthesis.get("conv_clamp")
    for key, value, want in (("channel_base", d.get("channel_base", 32768), base),
                             ("channel_max", d.get("channel_max", 512), cmax),
                             ("num_fp16_res", d.get("num_fp16_res", 0), fp16),
                             ("conv_clamp", d.get("conv_clamp"), clamp),
                             ("c_dim", d.get("c_dim", 0), g.get("c_dim", 0)),
                             ("img_resolution", d.get("img_resolution"), g["img_resolution"])):
        if value != want:
            _refuse("D", key, value, f"G's {key} {want!r} (one value for both networks)")
    architecture = d.get("architecture", "resnet")
    if architecture not in ("resnet", "orig"):
        _refuse("D", "architecture", architecture, "'resnet' or 'orig'")
    return {
        "name": "stylegan2", "latent_dim": int(g["z_dim"]),
        "conditional": bool(g.get("c_dim", 0)), "w_dim": int(g["w_dim"]),
        "mapping_layers": int(mapping.get("num_layers", 8)), "fmaps": base / 32768,
        "channel_max": int(cmax),
        "mbstd_group": int(_get(d, "epilogue_kwargs.mbstd_group_size") or 4),
        "d_architecture": architecture, "conv_clamp": float(clamp) if clamp else 0.0,
        "num_fp16_res": int(fp16),
        "mapping_lr_mul": float(mapping.get("lr_multiplier", 0.01)),
        "w_avg_beta": float(mapping.get("w_avg_beta", 0.995)),
        "d_freeze_layers": int(_get(d, "block_kwargs.freeze_layers") or 0),
        "resolution": int(g["img_resolution"]), "img_channels": int(g["img_channels"]),
        "num_classes": int(g.get("c_dim", 0))}


def _ours(name, kind):
    """Our weight path for official parameter `name` of network `kind` ("G" / "D")."""
    parts = name.split(".")
    leaf = {"weight": "kernel"}.get(parts[-1], parts[-1])
    if parts[0] == "mapping":
        return "/".join(parts[:-1] + [leaf])
    if kind == "G":  # synthesis.b8.conv0.affine.weight -> synthesis/b8_conv0/affine/kernel
        if parts[1:] == ["b4", "const"]:
            return "synthesis/const"
        return "/".join(["synthesis", f"{parts[1]}_{parts[2]}"] + parts[3:-1] + [leaf])
    return "/".join([f"{parts[0]}_{parts[1]}"] + parts[2:-1] + [leaf])  # b16.conv0.bias


def _layout(name, value, kind):
    """An official tensor in our layout (module docstring)."""
    value = np.asarray(value, np.float32) if value.dtype != np.float64 else value
    if name.endswith("const") and kind == "G" and value.ndim == 3:
        return value.transpose(1, 2, 0)
    if name.endswith("noise_const"):
        return value[..., None]
    if name.endswith("weight") and value.ndim == 4:
        return value.transpose(2, 3, 1, 0)
    if name.endswith("weight") and value.ndim == 2:
        if kind == "D" and name == "b4.fc.weight":  # Rows (c, h, w) -> (h, w, c).
            out, flat = value.shape
            c = flat // 16
            return value.reshape(out, c, 4, 4).transpose(2, 3, 1, 0).reshape(flat, out)
        return value.T
    return value


def assign(net, official, kind):
    """Sets every weight of our `net` (a StyleGAN2 G or D built with `model_config`'s
    keys) from the official network `official` (a torch_pickle.Persistent), in place.

    ConfigError, before anything is assigned, when a tensor has no counterpart, a
    counterpart is missing, a shape differs or a resample filter is not [1, 3, 3, 1]."""
    state = torch_pickle.state_dict(official)
    ours = {w.path.split("/", 1)[1] if w.path.startswith(net.name + "/") else w.path: w
            for w in net.weights}
    values, used = {}, set()
    for name, value in state.items():
        if name.endswith("resample_filter"):
            if value.shape != (4, 4) or not np.allclose(value, FILTER):
                raise errors.ConfigError(f"{kind}'s {name} is not the [1, 3, 3, 1] filter; "
                                         f"valid: the official default")
            continue
        path = _ours(name, kind)
        weight = ours.get(path)
        if weight is None:
            raise errors.ConfigError(f"{kind}'s {name} {tuple(value.shape)} has no weight "
                                     f"here ({path}); valid: a snapshot of the config "
                                     f"model_config derives")
        array = _layout(name, value, kind)
        if tuple(array.shape) != tuple(weight.shape):
            raise errors.ConfigError(f"{kind}'s {name} {tuple(value.shape)} -> "
                                     f"{tuple(array.shape)} does not fit {path} "
                                     f"{tuple(weight.shape)}")
        values[path] = array
        used.add(path)
    missing = sorted(p for p in ours if p not in used and not re.search(r"(^|/)calls$", p))
    if missing:
        raise errors.ConfigError(f"{kind} weights with no official tensor: "
                                 f"{', '.join(missing)}")
    for path, array in values.items():
        ours[path].assign(array.astype(ours[path].dtype))


def config_for(objects, preset="paper256", data_source=None):
    """The run config of a snapshot: StyleGAN2-ADA preset `preset` (configs.stylegan2:
    the training recipe the snapshot is to continue or be fine-tuned with) with the
    snapshot's networks (`model_config`) and data `data_source` (default: the preset's).
    Returns (config, data_shape, num_classes)."""
    model = dict(model_config(objects))
    shape = (model.pop("resolution"),) * 2 + (model.pop("img_channels"),)
    classes = model.pop("num_classes")
    config = configs.stylegan2(preset)
    chunk = config.model.mbstd_chunk  # The preset's per-GPU batch, a multiple of the
    if chunk % model["mbstd_group"]:  # snapshot's group, or the group alone.
        chunk = model["mbstd_group"]
    config.model.update({**model, "mbstd_chunk": chunk})
    if data_source:
        config.data.source = data_source
    return config, shape, classes


def import_snapshot(path, workdir, preset="paper256", data_source=None, freezed=None):
    """Writes `workdir`, a run of this package that holds the snapshot at `path`: its
    record (run.json: `config_for`'s config) and checkpoint 0 with G, D and the EMA
    generator (the snapshot's G_ema) and ADA's p (its augment pipe's), optimizers fresh
    (a snapshot holds none). Sampling, evaluation, export and training (resume or
    fine-tuning, `--config.data.source=...`) then read it as any run.

    freezed: Freeze-D's layer count for training on from it (the official --freezed;
    default: the snapshot's D's own freeze_layers).

    Nothing is written unless all of it is: the run is assembled in a directory beside
    `workdir` and renamed onto it; a workdir that exists and is not empty is refused.
    Returns {"workdir", "step" (0), "ada_p" (None without an augment pipe), "model" (the
    recorded config.model), "data_shape", "num_classes"}."""
    if os.path.isdir(workdir) and os.listdir(workdir):
        raise errors.ConfigError(f"--workdir={workdir} is not empty; valid: a new directory "
                                 f"(an import never writes over a run)")
    objects = torch_pickle.load(path)
    config, shape, classes = config_for(objects, preset, data_source)
    if freezed is not None:
        config.model.d_freeze_layers = freezed
    gan = training.build_gan(config, shape, classes)
    assign(gan.generator, objects["G"], "G")
    assign(gan.discriminator, objects["D"], "D")
    assign(gan.ema.model, objects["G_ema"], "G")
    p = None
    pipe = objects.get("augment_pipe")
    if pipe is not None and getattr(gan, "ada_p", None) is not None:
        p = float(np.asarray(torch_pickle.state_dict(pipe)["p"]))
        gan.ada_p.assign(p)
    parent = os.path.dirname(os.path.abspath(workdir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".import-", dir=parent)  # Its own, beside workdir.
    try:
        record.write(staging, config, shape, num_classes=classes)
        manager = checkpoints.Manager(tf.train.Checkpoint(**gan.checkpoint_items()),
                                      os.path.join(staging, "checkpoints"), max_to_keep=None)
        manager.save(checkpoint_number=0)
        if os.path.isdir(workdir):
            os.rmdir(workdir)  # Empty (checked above).
        os.rename(staging, workdir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"workdir": workdir, "step": 0, "ada_p": p,
            "model": {k: config.model[k] for k in sorted(config.model)},
            "data_shape": list(shape), "num_classes": classes}
