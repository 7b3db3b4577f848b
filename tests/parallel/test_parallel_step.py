"""parallel.step.MeshTrainer: one device == a DTensor mesh, weights after 10 steps.

The reference is the production one-device step (`GAN.train_step`, Keras SGD / Adam);
the mesh run starts from the same weights and sees the same global batches. DCGAN runs
with batch norm in G and D and dropout 0.3 in D.

Tolerance: float32 rounding. Measured max |w - w_ref| over every case here (1x2, 2x1,
2x2, 1x4 meshes; SGD and Adam; DCGAN and MLP): 1.2e-7 .. 3.4e-7. TOL = 1e-5 (the
tf.distribute equivalence tests' SGD tolerance) leaves 30x headroom, and what breaks a
guarantee must miss it by 100x: a learning rate off by 2 (what a gradient scaled by 2 does
to SGD) and D and G fused in one function with DTensor's all-reduce combining pass on (the
read-after-write hazard: G trained against the stale D; the same fused step with the pass
off, the framework's setting, equals one device).

Each case is its own control (mesh_helpers.equivalence): after the run, the mesh copy is
restored from a checkpoint taken before its first step and trained again through the same
traced step with its learning rates doubled; `check` asserts that run misses by 100x.
(Issue 22: the controls were separate runs, each tracing a reference and a mesh step.)
"""

import json
import os

import numpy as np
import pytest

from conftest import run_cmd
from helpers.mesh_helpers import equivalence

TOL = 1e-5
# SNGAN's residual networks (spectral norm, 10 SGD steps) round more on some CPUs:
# measured on an AMD EPYC without AVX-512 (2026-12-06), deterministic run to run: 1.2e-5
# (2x1, accumulation 4) and 2.2e-5 (2x2, every convolution split), where the machine the
# numbers above come from stayed under 1e-5. TOL_RESNET = 1e-4 leaves 4.5x headroom; a
# doubled learning rate misses it by 400x (3.9e-2 on 1x2 WGAN-GP, 4.0e-2 and 4.7e-2 on 2x1
# with accumulation, after 3 and 10 steps). Issue 49 re-measured it here (2026-12-07):
# SNGAN with every convolution split, 10 SGD steps, 4.2e-7 (1x2) and 3.0e-7 (2x2); the
# one-device float32 run itself is 8.7e-7 from the same run in float64. It stays 1e-4:
# what reaches 2.2e-5 on the EPYC is float32 kernel order (tap-sum convolutions vs
# oneDNN's, whose blocking depends on the CPU's vector width) amplified through spectral
# norm, not math: in float64 the 1x2 case agrees to 8.0e-16 (2x2: 1.3e-9, all of it the
# float32 softplus of the non-saturating loss, which rounds a device's half of the rows
# differently from the whole batch (presumably Eigen's vector vs scalar paths); with
# hinge, whose gradient is +-1/GB exactly, 3.9e-16 on 2x2 after 10 steps). Exactness is the float64 test's (F64_TOL below), not this tolerance's.
TOL_RESNET = 1e-4


def tol(arch):
    return TOL_RESNET if arch == "resnet" else TOL


@pytest.mark.slow  # ~12 s each: two GANs traced, 10 steps on each.
@pytest.mark.parametrize("spec, arch, optimizer, d_steps, convs", [
    ("batch:1,model:2", "dcgan", "sgd", 1, False),
    ("batch:2,model:1", "dcgan", "sgd", 1, False),
    ("batch:1,model:2", "mlp", "sgd", 1, False),
    # Adam's DCGAN has no D batch norm: D's convolutions see the stacked [real; fake]
    # directly (the conv-input constraint), split over examples.
    ("batch:2,model:1", "dcgan", "adam", 1, False),
    # Two D updates per step: their phases k and Adam's update count t = step * 2 + k + 1
    # (Adam on the 1x2 mesh: this case; with one D update: the 2x1 case above).
    ("batch:1,model:2", "dcgan", "adam", 2, False),
    # Every convolution split on its output channels, computed by taps (parallel/conv.py):
    # G's transposed convolutions of 8 and 4 channels, D's of 4 and 8.
    ("batch:1,model:2", "dcgan", "sgd", 1, True),
    # The Keras optimizers themselves, with the options the data-parallel path has: each
    # slot split like its weight, clipping on the global gradients.
    ("batch:1,model:2", "dcgan", "sgd:momentum=0.9,nesterov=True", 1, False),
    ("batch:1,model:2", "dcgan", "adamw:weight_decay=0.01,clipnorm=0.05", 1, False),
    ("batch:2,model:1", "dcgan", "rmsprop:momentum=0.5,global_clipnorm=0.1", 1, False),
])
def test_mesh_equals_one_device(spec, arch, optimizer, d_steps, convs):
    out = equivalence(spec, arch, optimizer, steps=10, d_steps=d_steps, convs=convs)
    check_split(out, arch, convs)
    check(out, 10)


def check(out, steps, arch=None):
    """The mesh run took `steps` steps to the one-device weights (within tol(arch)) and
    losses, and its control (the same run, learning rates doubled) misses by 100x."""
    assert out["step"] == steps
    assert out["max_diff"] < tol(arch), out
    assert out["control"]["max_diff"] > 100 * tol(arch), out["control"]
    np.testing.assert_allclose(*out["d_loss"], rtol=1e-5)
    np.testing.assert_allclose(*out["g_loss"], rtol=1e-5)


# The residual and conditional models (SNGAN; BigGAN with its shared embedding,
# hierarchical z, conditional batch norm, self-attention, spectral norm in G and D and a
# projection D): average pooling by strided slices, GlobalAveragePooling2D's output
# constrained, embedding gradients made dense, G's shared embedding and cBN gain / bias
# kept whole (layouts.KEEP_WHOLE). With every convolution the model axis divides split:
# on 1x2 and 2x2 (below: each with a penalty or LeCam, 1x2; four_device_runs, 2x2), and
# on 2x1 (SNGAN with lazy R1 and with accumulation below; BigGAN here). Issue 22 merged
# the plain 1x2 cases and SNGAN's plain 2x1 into those, which run the same step plus a
# term.
SPLIT_CONVS = {"dcgan": 4, "resnet": 14, "biggan": 12}


def check_split(out, arch, convs):
    """Every convolution the model axis divides is split (convs) or none is; BigGAN's
    shared embedding and cBN stay whole."""
    assert out["split_convs"] == (SPLIT_CONVS[arch] if convs else 0), out["split_convs"]
    if arch == "biggan" and convs:
        assert not any("shared" in p or "conditional_batch" in p for p in out["split"]), out
        assert sum(p.startswith("discriminator/") and "dense" in p for p in out["split"]) == 2


@pytest.mark.slow  # ~20 s.
def test_the_conditional_biggan_on_a_batch_split_mesh_equals_one_device():
    out = equivalence("batch:2,model:1", "biggan", "sgd", steps=10)
    check_split(out, "biggan", False)
    check(out, 10, "biggan")


# StyleGAN2 (mapping, modulated convolutions, per-row noise, FIR resampling, toRGB skips;
# residual D with minibatch std over chunks of global rows). The mesh resamples by
# strided slices (layers.stylegan.slice_resampling; one device: a depthwise convolution),
# which differ by float32 summation order alone: 1.2e-7 on one device after 10 steps.
# On 1x2 every convolution the model axis divides is split (G's modulated ones, also the
# upsampling one; D's equalized ones, also the downsampling ones and the 1x1 skip), and
# computed by taps (layer.taps), and so are the mapping network's and D's epilogue's
# equalized Dense kernels; the toRGBs' 1 output channel and the style affines stay whole.
# The class-conditional variant adds a label embedding to G's mapping and a mapping of
# the label to D's projection (both split on 1x2: 22 kernels, the unconditional model's
# 12 among them). Issue 22 dropped the unconditional model's plain cases (1x2 with every
# convolution split, 2x1; ~27 CPU-s): this case splits the same convolutions, and the
# lazy-phase cases below run the unconditional model on both meshes, the phases on top
# of the same main updates.
@pytest.mark.slow  # ~25 s.
def test_the_conditional_stylegan2_with_every_convolution_split_equals_one_device():
    out = equivalence("batch:1,model:2", "stylegan2_cond", "sgd", steps=10, convs=True)
    split = set(out["split"])
    assert len(split) == 22, out["split"]
    assert {"generator/mapping/embed/kernel", "discriminator/mapping/embed/kernel"} <= split
    assert {"generator/synthesis/b8_conv0/kernel", "generator/mapping/fc0/kernel",
            "discriminator/b8_conv1/kernel", "discriminator/b4_fc/kernel"} <= split, split
    assert not any("affine" in p or "torgb" in p for p in split), split
    check(out, 10)


# What the data-parallel step adds to the loss and the update, on the mesh: a penalty
# (double backprop through D's spectral norm: layers.SpectralNormalization has no cond),
# a lazy one (its schedule decided on the host: DTensor cannot run the cond), LeCam's
# anchors (replicated state), accumulation (strided micro-batches of a batch-split
# tensor; G's batch norm makes a skipped micro-batching visible).
R1_LAZY = (("penalty", "r1"), ("penalty_weight", 1.0), ("penalty_every", 2))
ADA = (("augment", "ada"), ("ada_p", 0.5), ("ada_interval", 1), ("ada_kimg", 0.05))
REGULARIZED_CASES = [  # (mesh, arch, convs, config.train settings)
    ("batch:1,model:2", "resnet", True, (("penalty", "wgan_gp"), ("penalty_weight", 1.0))),
    ("batch:2,model:1", "resnet", False, R1_LAZY),
    ("batch:1,model:2", "biggan", True, (("lecam_weight", 0.1),)),
    ("batch:2,model:1", "resnet", False, (("accumulation_steps", 4),)),
    # StyleGAN2-ADA's pipeline at p 0.5 on examples split over the batch axis (per-row
    # draws keyed by global row), p adjusted every step by 0.16 (a fast ada_kimg) from
    # the sign statistic summed over the whole batch.
    ("batch:2,model:1", "dcgan", False, ADA),
]


@pytest.mark.slow  # ~20-45 s each.
@pytest.mark.parametrize("spec, arch, convs, train", REGULARIZED_CASES,
                         ids=lambda c: c if isinstance(c, str) else None)
def test_regularized_steps_on_a_mesh_equal_one_device(spec, arch, convs, train):
    out = equivalence(spec, arch, "sgd", steps=10, convs=convs, train=train)
    check_split(out, arch, convs)
    check(out, 10, arch)
    for name, (ref, mesh) in out["state"].items():  # Counts and p: equal, not close.
        np.testing.assert_allclose(mesh, ref, rtol=0 if "ada" in name else 1e-5,
                                   atol=0 if "ada" in name else tol(arch), err_msg=name)
    if train == ADA:  # p moved every step (the controller ran), as on one device.
        assert abs(out["state"]["ada_p"][0] - 0.5) > 0.1, out["state"]


@pytest.mark.slow  # ~15-60 s each.
@pytest.mark.parametrize("arch", ["dcgan", "biggan"])
def test_group_batch_norm_on_a_mesh_equals_the_shards_as_replicas(arch):
    # sync_bn_group_size=1 on a batch-split 2x1 mesh: each shard's rows normalized apart,
    # as 2 replicas with group size 1 (one device with 2 row groups, virtual_groups).
    # BigGAN's are conditional batch norms (their inner SyncBatchNormalization).
    group = (("model.sync_bn_group_size", 1),)
    out = equivalence("batch:2,model:1", arch, "sgd", steps=10 if arch == "dcgan" else 4,
                      train=group)
    check(out, 10 if arch == "dcgan" else 4)
    if arch == "dcgan":  # The control: the same mesh run against full-batch statistics.
        out = equivalence("batch:2,model:1", arch, "sgd", steps=10, train=group,
                          grouped_reference=False, control=None)
        assert out["max_diff"] > 100 * TOL, out


# StyleGAN2's lazy phases on a mesh: after the main D and G updates, R1 as its own D
# update (every penalty_every steps) and path length as its own G update (every pl_every
# steps, pl_mean updated from the global path-length batch), then the EMA, with style
# mixing on. The mesh decides the schedule on the host (DTensor cannot run the cond
# around them), one trace per pattern: over 8 steps R1 runs at 0, 2, 4, 6 and path
# length at 0, 3, 6, so all four patterns run. The reference is the model's own step
# loop (step_function: GAN.train_step alone runs no phase). Measured on 2x1 and 1x2:
# weights 2.4e-7, EMA 6.0e-8, pl_mean equal; the mesh skipping R1 misses by 2.4e-3, skipping
# path length by 3.0 (pl_mean stays 0), a doubled learning rate by 2.9e-2.
STYLEGAN2_PHASES = (("lazy_phases", True), ("penalty", "r1"), ("penalty_weight", 1.0),
                    ("penalty_every", 2), ("pl_weight", 2.0), ("pl_every", 3),
                    ("style_mixing", 0.9))


@pytest.mark.slow  # ~30-45 s each (one device, then four traces of the mesh step).
@pytest.mark.parametrize("spec, ema", [("batch:2,model:1", True), ("batch:1,model:2", False)])
def test_stylegan2_lazy_phases_on_a_mesh_equal_one_device(spec, ema):
    out = equivalence(spec, "stylegan2", "sgd", steps=8, ema=ema, train=STYLEGAN2_PHASES)
    check(out, 8)
    ref, mesh = out["state"]["pl_mean"]
    assert ref > 1e-3, out  # Path length ran (pl_mean starts at 0).
    np.testing.assert_allclose(mesh, ref, rtol=1e-5, atol=TOL)
    if ema:  # The EMA after the phases (GanStep.end_of_step).
        assert out["ema_diff"] < TOL, out


# R3GAN's step on a mesh (the conditional r3gan: learned basis, 1-3-1 blocks with a
# grouped 3x3 of 2 groups, [1,3,3,1] resampling, D's depthwise basis conv by taps,
# projection): the paired loss (G's update reads its own real batch, a second global
# batch per step), R1 + R2 by double backprop through the un-augmented [real; fake] in
# D's main pass. On 1x2 every convolution split, the grouped ones in whole groups (one
# group per device: computed from the device's own channels), through R3GAN's pipe at p
# 0.5 (draws keyed by global row); on 2x1 with 2 micro-batches (each micro-batch's pairs
# and penalties, averaged over the global batch). Measured after 10 steps: 1.8e-7 on
# both; a doubled learning rate misses by 1.3e-2 and 1.5e-2.
R3GAN_STEP = (("loss", "rpgan"), ("penalty", "r1_r2"), ("penalty_weight", 1.0))
R3GAN_CASES = [
    ("batch:1,model:2", True, R3GAN_STEP + (("augment", "r3gan"), ("ada_p", 0.5),
                                            ("ada_interval", 0))),
    ("batch:2,model:1", False, R3GAN_STEP + (("accumulation_steps", 2),)),
]


@pytest.mark.slow  # ~35 s and ~15 s.
@pytest.mark.parametrize("spec, convs, train", R3GAN_CASES,
                         ids=lambda c: c if isinstance(c, str) else None)
def test_r3gan_on_a_mesh_equals_one_device(spec, convs, train):
    out = equivalence(spec, "r3gan_cond", "sgd", steps=10, convs=convs, train=train)
    check(out, 10)
    grouped = {p for p in out["split"] if p.endswith("_conv2/kernel")}  # The 3x3s.
    assert len(grouped) == (4 if convs else 0), out["split"]
    assert out["split_convs"] == (12 if convs else 0), out["split"]


# Mixed precision: both runs compute in the same policy, so they differ by its rounding
# alone, which grows quickly in 16-bit activations. The measure is relative: |w_mesh -
# w_ref| / |w_ref - w_start| over trainable weights (1 = off by the whole update). Measured
# after 2 SGD steps of SNGAN: bf16 4.8e-2 on 2x1, 4.6e-2 on 1x2 (every conv split);
# float16 2.9e-2 on 1x2 (float32: 1e-6). On an AMD EPYC without AVX-512 (2026-12-06;
# bfloat16 emulated differently, deterministic run to run): bf16 0.103 on 2x1, 8.6e-2 on
# 1x2. REL_16 = 0.15 is 1.5x the largest; a doubled learning rate misses by 4.7-5.2x
# (0.71 and 0.79 in bf16 on the two machines, 0.68 in float32): a 16-bit run on a mesh is
# checked to its rounding, not to float32's orders of magnitude.
REL_16 = 0.15
# (Issue 22 dropped bf16 on 1x2: float16 on 1x2 runs the same split layouts, bf16 on
# 2x1 the same policy.)
MIXED_CASES = [("batch:2,model:1", "mixed_bfloat16"), ("batch:1,model:2", "mixed_float16")]


@pytest.mark.slow  # ~10 s each.
@pytest.mark.parametrize("spec, precision", MIXED_CASES)
def test_mixed_precision_on_a_mesh_equals_one_device_to_its_rounding(spec, precision):
    out = equivalence(spec, "resnet", "sgd", steps=2, convs=spec.endswith("2"),
                      train=(("precision", precision),))
    assert out["relative_diff"] < REL_16, out
    # The control: the same run, learning rates doubled (measured 0.71 and 0.79 in bf16).
    assert out["control"]["relative_diff"] > 4 * REL_16, out["control"]
    np.testing.assert_allclose(*out["d_loss"], rtol=2e-2)


@pytest.mark.slow
def test_the_ema_generator_on_a_mesh_equals_one_device():
    # decay 0.8 after a 2-step copy, ramped over 3 steps (mesh_helpers.config): the EMA
    # weights of both runs, updated in the mesh's own EMA function after G's.
    # control=1.0: the control's restart (the checkpoint before the first step, then
    # the same steps) is exact, bit for bit, EMA included: what the other cases' 2x
    # controls start from.
    out = equivalence("batch:1,model:2", "dcgan", "sgd", steps=10, ema=True, control=1.0)
    assert out["max_diff"] < TOL and out["ema_diff"] < TOL, out
    assert (out["control"]["max_diff"], out["control"]["ema_diff"]) == (
        out["max_diff"], out["ema_diff"]), out


def test_the_combining_pass_is_off_unless_opted_in(monkeypatch):
    # The product's side of the test below (which turns the pass on itself): forced off,
    # also over a user's exported 1; only COMBINE_OPT_IN=1 keeps it on. In-process: the
    # mesh equivalence runs that would catch it otherwise are all in the slow tier.
    from tf_gan_scale import parallel
    monkeypatch.delenv(parallel.COMBINE_OPT_IN, raising=False)
    monkeypatch.setenv(parallel.COMBINE_VAR, "1")
    assert parallel.combine_all_reduces() is False
    assert os.environ[parallel.COMBINE_VAR] == "0"
    monkeypatch.setenv(parallel.COMBINE_OPT_IN, "1")
    assert parallel.combine_all_reduces() is True
    assert os.environ[parallel.COMBINE_VAR] == "1"


@pytest.mark.slow
def test_the_combining_pass_brings_the_stale_read_back():
    # The mesh step is ONE function: G's update reads the D weights D's update just
    # wrote, and Keras' optimizers read their counters and slots after writing them.
    # That is exact only with DTensor's all-reduce combining pass off (what
    # tf_gan_scale.parallel sets). The control, in a child process (TensorFlow reads the
    # variable once, when a process's DTensor device is made): the opt-in turns the pass
    # back on, and the first equivalence case must miss by orders of magnitude. If a
    # TensorFlow upgrade fixes the pass, this fails, and the forced setting can go.
    from tf_gan_scale import parallel
    case = [["batch:1,model:2", "dcgan", "sgd", 10, False]]
    proc = run_cmd(["tests/helpers/mesh_helpers.py", "2", json.dumps(case)], timeout=600,
                   env={parallel.COMBINE_OPT_IN: "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["combine"] and out["max_diff"] > 100 * TOL, out


@pytest.mark.parametrize("setting, message", [
    ({"jit_compile": True}, "config.train.jit_compile=True"),
])
def test_settings_the_mesh_cannot_run_yet_are_refused(setting, message):
    import keras

    from tf_gan_scale import architectures, errors, gan as gan_lib
    from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib
    g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=6,
                               g_channels=(8, 6, 4), d_channels=(4, 6))
    model = gan_lib.GAN(g, d, latent_dim=6)
    model.compile(d_optimizer=keras.optimizers.SGD(), g_optimizer=keras.optimizers.SGD(),
                  **setting)
    dims = {"batch": 1, "model": 2}
    with pytest.raises(errors.ConfigError, match=f"not supported on a mesh yet: {message}"):
        step_lib.MeshTrainer(model, mesh_lib.make(dims, "CPU"), layouts.plan((g, d), dims))


def test_the_stylegan2_presets_are_accepted_on_a_mesh():
    # The config check (before any data is read): a preset's float16 blocks, lazy phases
    # (R1 every 16 steps), ADA, gradient cleaning, path length and mixing all run on a
    # mesh; what it still refuses is named (XLA here).
    from tf_gan_scale import configs, errors
    from tf_gan_scale.training import mesh_runner
    config = configs.stylegan2("cifar")
    assert config.train.lazy_phases and config.model.num_fp16_res == 4
    config.train.pl_weight, config.train.style_mixing = 2.0, 0.9
    mesh_runner.check_config(config)
    config.train.jit_compile = "true"
    with pytest.raises(errors.ConfigError, match=r"^not supported on a mesh yet: "
                                                 r"config.train.jit_compile='true' \(XLA "):
        mesh_runner.check_config(config)


def test_the_r3gan_presets_are_accepted_on_a_mesh():
    # R3GAN as published (rpgan, r1_r2, its pipe and cosine schedules, bfloat16 stages)
    # passes the mesh's config check; a pipeline still refuses its loss and penalty.
    from tf_gan_scale import configs, errors
    from tf_gan_scale.gan.step_config import StepConfig
    from tf_gan_scale.training import mesh_runner
    for preset in ("cifar10", "imagenet64"):
        mesh_runner.check_config(configs.r3gan(preset))
    refused = StepConfig.from_train(configs.r3gan("cifar10").train).unsupported("pipeline")
    assert [r.split(" (")[0] for r in refused] == [
        "config.train.penalty='r1_r2'", "config.train.loss='rpgan'",
        "config.train.augment='r3gan'"], refused
    del errors


@pytest.mark.slow  # ~1 min: one device, then the mesh, then its control.
def test_float16_style_blocks_on_a_mesh_equal_one_device_to_their_rounding():
    # StyleGAN2-ADA's per-block float16 (the last block here; unscaled, conv clamp 256,
    # gradients cleaned) with its lazy phases: both runs compute the same float16 blocks,
    # so they differ by float16 rounding (measured relative 2.9e-2 on 2x1 and 1x2); a
    # doubled learning rate 0.95.
    half = STYLEGAN2_PHASES + (("model.num_fp16_res", 1), ("model.conv_clamp", 256.0),
                               ("grad_nan_to_num", True))
    out = equivalence("batch:2,model:1", "stylegan2", "sgd", steps=8, train=half)
    assert out["relative_diff"] < REL_16, out
    assert out["control"]["relative_diff"] > 5 * REL_16, out["control"]


def test_layers_dtensor_cannot_run_are_refused_before_anything_moves():
    # Average pooling runs on a mesh as strided slices (DTensor cannot expand AvgPool's
    # gradient, "tf.AvgPoolGrad op does not implement layout propagation"), channels
    # last: a channels-first pool is one line instead, before any weight moves.
    import keras

    from tf_gan_scale import architectures, errors, gan as gan_lib
    from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib
    g, d = architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=4,
                               g_channels=(8, 8), d_channels=(8, 8, 8), d_downsample=2)
    pools = [layer for layer in d._flatten_layers()
             if isinstance(layer, keras.layers.AveragePooling2D)]
    pools[0].data_format = "channels_first"
    model = gan_lib.GAN(g, d, latent_dim=4)
    model.compile(d_optimizer=keras.optimizers.SGD(), g_optimizer=keras.optimizers.SGD())
    dims = {"batch": 1, "model": 2}
    with pytest.raises(errors.ConfigError, match=r"not supported on a mesh yet: "
                                                 r"AveragePooling2D with data_format="
                                                 r"'channels_first' in discriminator; "):
        step_lib.MeshTrainer(model, mesh_lib.make(dims, "CPU"), layouts.plan((g, d), dims))
    from tensorflow.experimental import dtensor
    assert not any(isinstance(w._value, dtensor.DVariable) for w in g.weights + d.weights)
    # A depthwise convolution runs by taps (conv.depthwise_conv2d: DTensor cannot expand
    # its filter gradient), written without dilation: R3GAN's D basis dilated is refused.
    g, d = architectures.build("r3gan", data_shape=(8, 8, 1), latent_dim=4, widths=(8, 8),
                               blocks=1, cardinality=2)
    d.get_layer("d4_basis").dilation_rate = (2, 2)
    model = gan_lib.GAN(g, d, latent_dim=4)
    model.compile(d_optimizer=keras.optimizers.SGD(), g_optimizer=keras.optimizers.SGD())
    with pytest.raises(errors.ConfigError, match=r"not supported on a mesh yet: "
                                                 r"DepthwiseConv2D with dilation_rate=\(2, 2\) "
                                                 r"in discriminator; "):
        step_lib.MeshTrainer(model, mesh_lib.make(dims, "CPU"), layouts.plan((g, d), dims))


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("pool, strides, shape", [(2, 2, (2, 8, 8, 3)), (3, 2, (1, 9, 7, 2)),
                                                  ((2, 3), (1, 2), (2, 6, 9, 1))])
def test_pooling_by_slices_is_keras_average_pooling(pool, strides, shape, padding):
    # Values and input gradients (the op DTensor cannot expand is the gradient).
    import keras
    import tensorflow as tf

    from tf_gan_scale.parallel import conv
    layer = keras.layers.AveragePooling2D(pool, strides, padding=padding)
    x = tf.constant(np.random.default_rng(0).standard_normal(shape), tf.float32)
    w = tf.constant(np.random.default_rng(1).standard_normal(layer(x).shape), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        want = layer(x)
        got = conv.avg_pool(x, layer.pool_size, layer.strides, padding)
        loss_want, loss_got = tf.reduce_sum(want * w), tf.reduce_sum(got * w)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
    np.testing.assert_allclose(tape.gradient(loss_got, x).numpy(),
                               tape.gradient(loss_want, x).numpy(), atol=1e-6)


def test_adam_moments_are_split_like_their_weights():
    import keras
    from tensorflow.experimental import dtensor

    from tf_gan_scale import architectures, gan as gan_lib
    from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib
    from tf_gan_scale.parallel import tensors
    g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=6,
                               g_channels=(8, 6, 4), d_channels=(4, 6))
    model = gan_lib.GAN(g, d, latent_dim=6)
    model.compile(d_optimizer=keras.optimizers.Adam(), g_optimizer=keras.optimizers.Adam())
    dims = {"batch": 1, "model": 2}
    plan = layouts.plan((g, d), dims)
    trainer = step_lib.MeshTrainer(model, mesh_lib.make(dims, "CPU"), plan)
    kernel = [w for w in g.trainable_variables if len(w.shape) == 2][0]  # [6, 32], split.
    i = g.trainable_variables.index(kernel)
    m, v = model.g_optimizer._momentums[i], model.g_optimizer._velocities[i]
    assert tensors.local_shapes(kernel) == [(6, 16), (6, 16)]
    # The Keras optimizer's own slots (what its checkpoint holds), split like the kernel.
    assert tensors.local_shapes(m) == tensors.local_shapes(v) == [(6, 16), (6, 16)]
    counter = model.g_optimizer.iterations._value.read_value()  # Replicated on the mesh.
    assert dtensor.fetch_layout(counter).mesh == trainer.mesh
    assert dtensor.fetch_layout(counter).is_fully_replicated()


def test_every_checkpoint_item_moves_onto_the_mesh():
    # MeshTrainer moves what GAN.checkpoint_items lists (step.by_kind), so a checkpointed
    # item cannot be left on the host: here G, D, both optimizers, the EMA copy of G and
    # LeCam's anchors, every variable of each.
    import keras
    from tensorflow.experimental import dtensor

    from tf_gan_scale import architectures, gan as gan_lib
    from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib
    g, d = architectures.build("mlp", data_shape=(2,), latent_dim=4, hidden=(8,))
    model = gan_lib.GAN(g, d, latent_dim=4, ema_decay=0.9)
    model.compile(d_optimizer=keras.optimizers.Adam(), g_optimizer=keras.optimizers.SGD(),
                  lecam_weight=0.1)
    items = model.checkpoint_items()
    assert {"ema_generator", "lecam_anchors"} <= set(items)
    dims = {"batch": 1, "model": 2}
    trainer = step_lib.MeshTrainer(model, mesh_lib.make(dims, "CPU"),
                                   layouts.plan((g, d), dims))
    for key, item in items.items():
        for v in getattr(item, "variables", [item]):
            assert dtensor.fetch_layout(v._value.read_value()).mesh == trainer.mesh, (key, v)


def test_a_checkpoint_item_no_mesh_can_hold_is_refused():
    import keras

    from tf_gan_scale.parallel import step as step_lib
    v = keras.Variable(0.0)
    assert step_lib.by_kind({"pl_mean": v}) == ([], [], [v])
    with pytest.raises(TypeError, match="checkpoint item 'extra' is a dict"):
        step_lib.by_kind({"pl_mean": v, "extra": {}})


def test_the_memory_report_counts_each_device_its_shards(monkeypatch):
    # The conditional BigGAN with Adam, every convolution split (threshold 0) on 1x2: a
    # device holds half of each split weight and of its two Adam slots, all of the rest.
    # tools/benchmark.py --memory_classes reports this for biggan_imagenet128.
    import numpy as np

    from helpers.mesh_helpers import config, data_of
    from tf_gan_scale import training
    from tf_gan_scale.parallel import layouts
    from tf_gan_scale.training import benchmark
    monkeypatch.setattr(layouts, "CONV_SPLIT_MIN_PARAMS", 0)
    c = config("biggan", "adam")
    shape, classes = data_of("biggan")
    gan = training.build_gan(c, shape, classes)
    plan = layouts.plan((gan.generator, gan.discriminator), {"batch": 1, "model": 2})
    whole = {layouts.weight_path(net, w): int(np.prod(w.shape)) * 4
             for net in (gan.generator, gan.discriminator) for w in net.weights}
    half = {p: b // 2 if any(plan[p]) else b for p, b in whole.items()}
    trainable = {layouts.weight_path(net, w)
                 for net in (gan.generator, gan.discriminator) for w in net.trainable_weights}
    report = benchmark.mesh_memory(c, shape, classes, "batch:1,model:2")
    assert report["split_weights"] == sum(any(s) for s in plan.values()) > 12
    assert report["one_device"]["weights"] == sum(whole.values())
    assert report["per_device"]["weights"] == [sum(half.values())] * 2
    # Adam: two slots per trainable weight, split like it; plus counters and the rate.
    counters = report["one_device"]["optimizer"] - 2 * sum(whole[p] for p in trainable)
    assert 0 < counters < 64
    assert report["per_device"]["optimizer"] == [
        2 * sum(half[p] for p in trainable) + counters] * 2


def test_keras_gradient_accumulation_is_refused():
    # Keras' own accumulation branches on a counter around the update (a cond DTensor
    # cannot expand over split weights); config.train.accumulation_steps is the
    # framework's.
    import keras

    from tf_gan_scale import architectures, errors, gan as gan_lib
    from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib
    g, d = architectures.build("mlp", data_shape=(2,), latent_dim=4, hidden=(8,))
    model = gan_lib.GAN(g, d, latent_dim=4)
    model.compile(d_optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2),
                  g_optimizer=keras.optimizers.SGD())
    dims = {"batch": 1, "model": 2}
    with pytest.raises(errors.ConfigError, match="not supported on a mesh yet: d_optimizer "
                                                 "gradient_accumulation_steps=2"):
        step_lib.MeshTrainer(model, mesh_lib.make(dims, "CPU"), layouts.plan((g, d), dims))


FOUR_DEVICE_CASES = [  # (mesh, arch, optimizer, convs)
    ("batch:2,model:2", "dcgan", "sgd", False),
    ("batch:1,model:4", "dcgan", "sgd", False),
    # Split convolutions with examples split too (G's last, of 1 output channel, stays
    # replicated). Issue 22 dropped DCGAN's 2x2 cases with Adam (its slots split like
    # their weights: 1x2 and 2x1 above, test_adam_moments_are_split_like_their_weights)
    # and with split convolutions (these two split every convolution on 2x2).
    ("batch:2,model:2", "resnet", "sgd", True),
    ("batch:2,model:2", "biggan", "sgd", True),
]


@pytest.fixture(scope="module")
def four_device_runs():
    """Every 4-device case in ONE process of 4 logical CPUs (one TensorFlow start; the
    dcgan-sgd cases share their one-device reference run): {case: result}."""
    cases = [[spec, arch, opt, 10, convs] for spec, arch, opt, convs in FOUR_DEVICE_CASES]
    proc = run_cmd(["tests/helpers/mesh_helpers.py", "4", json.dumps(cases)], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()[-len(cases):]
    return dict(zip(FOUR_DEVICE_CASES, map(json.loads, lines)))


@pytest.mark.slow
@pytest.mark.parametrize("case", FOUR_DEVICE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_four_device_meshes_equal_one_device(four_device_runs, case):
    out = four_device_runs[case]
    check(out, 10, case[1])
    check_split(out, case[1], case[3])


def test_gradient_cleaning_acts_on_split_gradients_on_a_mesh():
    # StyleGAN2-ADA's cleaning (NaN -> 0, +-inf -> +-1e5) through the mesh's one
    # gradient reduction (the update GanStep.apply runs): a weight split over the model
    # axis, its gradient split the same way, each device cleaning its own half. Without
    # cleaning, the same gradient makes the update non-finite.
    import keras
    import tensorflow as tf

    from tf_gan_scale import replica
    from tf_gan_scale.parallel import mesh as mesh_lib, step as step_lib, tensors
    mesh = mesh_lib.make({"batch": 1, "model": 2}, "CPU")
    var = keras.Variable(np.zeros([4], np.float32))
    opt = keras.optimizers.SGD(1.0)
    opt.build([var])
    tensors.place(var, mesh, ("model",))
    step_lib.place_optimizer(opt, mesh)
    grad = tensors.to_mesh(np.array([np.nan, np.inf, -np.inf, 3.0], np.float32), mesh,
                           ("model",))

    @tf.function
    def update(clean):
        _, finite, _, _ = replica.apply_global_gradients(opt, [grad], [var],
                                                         nan_to_num=clean)
        return finite

    assert tensors.local_shapes(var) == [(2,), (2,)]
    assert bool(tensors.gather(update(True)))
    np.testing.assert_array_equal(tensors.gather(var), [0.0, -1e5, 1e5, -3.0])
    assert not bool(tensors.gather(update(False)))


# Issue 49: a float32 gap between a mesh and one device does not tell whether they
# compute the same thing. Their float32 arithmetic differs (split convolutions as sums
# over taps, average pooling by slices, reductions split over devices, where one device
# runs oneDNN's kernels: the two meshes share theirs, so they agree with each other
# better than with one device), and an unstable GAN step amplifies any difference: on
# MNIST's recipe at SGD 0.01 (hinge, logits up to ~800, losses in the hundreds) the
# one-device float32 run is itself 2.5e-5 away from the same run in float64 after 10
# steps, where 1 vs 2 intra-op threads (which leave those kernels' summation order
# alone) move it by 5e-7. In float64, rounding is ~1e-16 and the two engines agree to
# ~1e-13: a systematic difference (a stale read, another statistic or draw, a u vector
# updated twice) stands 1e6x above it. G's output and D's logits are still cast to
# float32 (calls.call_generator, StepInputs.discriminate): both engines round the same
# float64 values there. So the case uses the hinge loss, whose gradient (+-1/GB or 0) is
# exact in float32: a float32 softplus (non-saturating) rounds a device's half of the
# rows differently from the whole batch (3e-10 after one SNGAN step in float64, 2x1).
F64_TOL = 1e-12


@pytest.fixture
def float64(monkeypatch):
    """config.train settings that build and train the networks in float64 (a test-only
    precision: every layer's policy, the output layers' too; variables float64)."""
    from tf_gan_scale import precision
    from tf_gan_scale.architectures import biggan
    monkeypatch.setattr(precision, "PRECISIONS", precision.PRECISIONS + ("float64",))
    monkeypatch.setattr(biggan, "OUTPUT", "float64")
    return (("precision", "float64"),)


@pytest.mark.slow  # ~50 CPU-s (two float64 BigGANs traced): too much for the default tier.
def test_the_mnist_recipes_biggan_on_a_mesh_is_one_devices_math_in_float64(float64):
    # The recipe's parts (experiments/biggan_mnist.py) at the tiny size: spectral norm in G and
    # D (and its u updates), orthogonal init, hinge loss, shared embedding, hierarchical
    # z, conditional sync batch norm, every convolution the model axis divides split
    # (G's output one has 1 channel here), 3 SGD steps. Measured: max |difference|
    # 6.7e-16, its doubled learning rate 9.3e-2. A planted systematic error of 1e-7
    # relative in every split convolution (conv.conv2d's output x (1 + 1e-7)) gives
    # 2.7e-7 (2.7e5x F64_TOL); in float32 it gave 1.3e-6 after 10 steps, under TOL: the
    # float32 cases cannot see an error of float32's own size, this one can.
    out = equivalence("batch:1,model:2", "biggan", "sgd", steps=3, convs=True,
                      train=float64 + (("loss", "hinge"), ("model.init", "ortho"),
                                       ("model.hier", True)))
    assert out["step"] == 3
    assert out["max_diff"] < F64_TOL, out
    assert out["control"]["max_diff"] > 1e-2, out["control"]
