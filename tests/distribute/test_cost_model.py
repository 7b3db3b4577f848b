"""All-reduce cost model: exact message sizes for the tutorial DCGAN, the ring formula,
and the model axis of a DTensor mesh (bytes by hand on a tiny model, M=1 = data
parallelism)."""

import collections
import contextlib
import os
import runpy

import keras
import pytest

from conftest import REPO, run_cmd, run_in_process
from tf_gan_scale import architectures, data
from tf_gan_scale.distribute import cost_model
from tf_gan_scale import training
from tf_gan_scale.layers import SyncBatchNormalization


@pytest.fixture(scope="module")
def dcgan_models():
    return architectures.build("dcgan", data_shape=(28, 28, 1), latent_dim=100)


@pytest.fixture(scope="module")
def dcgan(dcgan_models):
    g, d = dcgan_models
    return cost_model.network_costs(g, d, (28, 28, 1), 100)


def test_dcgan_messages(dcgan):
    # The tutorial's G: BN after Dense(7*7*256) and after the 128- and 64-filter convs.
    assert dcgan["g_bn_channels"] == [12544, 128, 64] and dcgan["d_bn_channels"] == []
    assert (dcgan["g_params"], dcgan["d_params"]) == (2_305_472, 212_865)  # Trainable.
    msgs = cost_model.step_messages(dcgan, d_steps=2)
    assert msgs["gradients"] == [4 * 212_865] * 2 + [4 * 2_305_472]
    # G's BN runs forward in each of the 2 D updates, forward + backward in the G update.
    # Statistics in float64: 8 bytes per value.
    assert sorted(msgs["batch_norm"]) == sorted([8 * (2 * c + 1)
                                                 for c in (12544, 128, 64)] * 4)


def test_bn_channels_inside_conditional_batch_norm():
    # BigGAN's cBN holds its SyncBatchNormalization as a sub-layer (and has no moving
    # statistics itself). Each G block normalizes its input and its middle (block 1: 8
    # in, 8 out; block 2: 8 in, 4 out), then one plain BN of 4 before the output conv.
    g, d = architectures.build("biggan", data_shape=(16, 16, 3), latent_dim=12, ch=4,
                               g_channels=(2, 1), d_channels=(1, 2), hier=True)
    assert cost_model._bn_channels(g) == [8, 8, 8, 4, 4]
    assert cost_model._bn_channels(d) == []


def test_forward_flops_of_a_dense_layer():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    assert cost_model.forward_flops(model, [3]) == 2 * 3 * 4 + 4  # MatMul + bias.


def test_forward_flops_of_a_conditional_network():
    # [x, labels] inputs (a conditional G or D, as the benchmark's mesh rows build them):
    # a one-hot of 3 classes concatenated to x, then the Dense: the label adds 3 inputs.
    x, y = keras.Input((3,)), keras.Input((), dtype="int32")
    out = keras.layers.Dense(4)(keras.layers.Concatenate()(
        [x, keras.layers.CategoryEncoding(3, output_mode="one_hot")(y)]))
    model = keras.Model([x, y], out)
    assert cost_model.forward_flops(model, [3]) == 2 * 6 * 4 + 4


def test_ring_time_formula():
    # 2(N-1) latency steps + 2(N-1)/N of the message over the link.
    t = cost_model.ring_time_s([1e6], 4, gbit_per_s=8, latency_s=1e-5)
    assert t == pytest.approx(6 * 1e-5 + 1.5 * 1e6 / 1e9)
    assert cost_model.ring_time_s([1e6], 1, 8, 1e-5) == 0.0


def test_efficiency_falls_with_replicas_and_rises_with_bandwidth(dcgan):
    def eff(n, bw, sync=True):
        return cost_model.efficiency(
            dcgan, replicas=n, per_replica_batch=256, gbit_per_s=bw, latency_s=2e-5,
            flops_per_s=2e13, sync_bn=sync)

    assert eff(8, 100) > eff(64, 100) > eff(256, 100)
    assert eff(8, 10) < eff(8, 100) < eff(8, 400)
    assert eff(64, 100, sync=False) > eff(64, 100)


def dense_params(widths):
    """Trainable parameters of a stack of Dense layers (kernel + bias) of these widths."""
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


# In this process (no TensorFlow start), and once as the real tool.
@pytest.mark.parametrize("run", [run_in_process, pytest.param(run_cmd, marks=pytest.mark.slow)],
                         ids=["in_process", "subprocess"])
def test_tool_prints_the_table(run):
    proc = run(["tools/allreduce_cost.py", "--config=experiments/gauss2d.py"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 10", "| 25", "| 100", "| 400"]
    # gauss2d: 3 x 256 MLPs (no normalization: no BN all-reduces), 2-d latent and data,
    # d_steps 1. Parameters by hand.
    g_params = dense_params([2, 256, 256, 256, 2])
    d_params = dense_params([2, 256, 256, 256, 1])
    assert (g_params, d_params) == (132_866, 132_609)
    assert f"- parameters: G {g_params:,}, D {d_params:,};" in out
    # FLOPs: the library's, of the same networks built here.
    config = runpy.run_path(os.path.join(REPO, "experiments", "gauss2d.py"))["get_config"]()
    shape = data.load(config.data.source).shape
    g, d = architectures.build(config.model.name, data_shape=shape,
                               latent_dim=config.model.latent_dim,
                               **training.model_options(config))
    g_flops = cost_model.forward_flops(g, [config.model.latent_dim])
    d_flops = cost_model.forward_flops(d, list(shape))
    assert g_flops >= 2 * (g_params - (3 * 256 + 2))  # At least 2 per kernel entry.
    assert f"forward FLOPs/example: G {g_flops:,}, D {d_flops:,}" in out
    grads = [4 * d_params, 4 * g_params]  # float32 gradients: one D update, one G update.
    assert (f"gradients 2 all-reduces, {sum(grads) / 1e6:.3f} MB; cross-replica BN 0 "
            f"all-reduces, 0.00 kB") in out
    # Every cell by hand: a ring all-reduce of S bytes over N replicas takes 2(N-1) steps
    # of 20 us plus 2(N-1)/N S over the link; compute is 32 examples x (D update g + 6d,
    # G update 3g + 2d) FLOPs at 50 TFLOP/s; efficiency = compute / (compute + comm).
    compute = 32 * (4 * g_flops + 8 * d_flops) / 50e12
    ms, eff = {}, {}
    for row in rows:
        bw, *rest = cells(row)
        for n, (t, e) in zip((8, 64, 256), zip(rest[::2], rest[1::2])):
            comm = sum(2 * (n - 1) * 20e-6 + 2 * (n - 1) / n * size / (int(bw) * 1e9 / 8)
                       for size in grads)
            assert float(t) == pytest.approx(comm * 1e3, abs=0.006), (bw, n, t)
            sync, local = e.rstrip(")").split(" (")
            assert sync == local, (bw, n, e)  # No BN: local BN changes nothing.
            assert float(sync.rstrip("%")) / 100 == pytest.approx(
                compute / (compute + comm), abs=6e-4), (bw, n, e)
            ms[int(bw), n], eff[int(bw), n] = float(t), float(sync.rstrip("%"))
    # More bandwidth: faster all-reduces and higher efficiency; more replicas: the reverse.
    for n in (8, 64, 256):
        assert [ms[bw, n] for bw in (10, 25, 100, 400)] == sorted(
            ms[bw, n] for bw in (10, 25, 100, 400))[::-1]
    assert ms[10, 8] < ms[10, 64] < ms[10, 256]
    assert eff[10, 8] > eff[10, 256] and eff[400, 8] > eff[10, 8]


# Round numbers for hand computation: 4 replicas on an 8 Gbit/s link (1e9 bytes/s),
# 10 us per ring step, so one all-reduce of S bytes takes 6e-5 + 1.5 S / 1e9 s.
TOY = {"g_params": 250_000, "d_params": 125_000, "g_bn_channels": [100],
       "d_bn_channels": [], "g_flops": 1_000_000, "d_flops": 1_000_000}
LINK = {"replicas": 4, "gbit_per_s": 8, "latency_s": 1e-5, "per_replica_batch": 32}
D_GRAD = 6e-5 + 1.5 * 500_000 / 1e9   # 4 B x 125k: 8.1e-4 s.
G_GRAD = 6e-5 + 1.5 * 1_000_000 / 1e9  # 4 B x 250k: 1.56e-3 s.
BN = 6e-5 + 1.5 * 8 * 201 / 1e9        # 100 channels, float64: 6.2412e-5 s.


def toy_time(flops_per_s=1e12, **levers):
    return cost_model.step_time(TOY, flops_per_s=flops_per_s, **LINK, **levers)


def test_step_time_today_matches_efficiency():
    t = toy_time()
    # 32 examples x (D update g + 6d = 7e6, G update 3g + 2d = 5e6) at 1e12 FLOP/s.
    assert t["compute_s"] == pytest.approx(3.84e-4)
    assert t["grad_comm_s"] == pytest.approx(D_GRAD + G_GRAD) == pytest.approx(2.37e-3)
    assert t["bn_comm_s"] == pytest.approx(3 * BN)  # G's BN: d_steps + 2 passes.
    assert t["step_s"] == pytest.approx(3.84e-4 + 2.37e-3 + 3 * BN)
    assert t["examples"] == 128
    assert cost_model.efficiency(TOY, flops_per_s=1e12, **LINK) == pytest.approx(
        3.84e-4 / t["step_s"])


def test_accumulation_divides_gradient_comm_per_example():
    one, four = toy_time(), toy_time(accumulation_steps=4)
    msgs = cost_model.step_messages(TOY, accumulation_steps=4)
    assert msgs["gradients"] == [500_000, 1_000_000]  # Once per update, as with K=1.
    assert len(msgs["batch_norm"]) == 12               # 3 BN passes x 4 micro-batches.
    assert four["grad_comm_s"] == pytest.approx(one["grad_comm_s"])
    assert four["examples"] == 512
    assert four["grad_comm_s_per_example"] == pytest.approx(one["grad_comm_s_per_example"] / 4)
    assert four["grad_comm_s_per_example"] == pytest.approx(2.37e-3 / 512)
    assert four["compute_s"] == pytest.approx(4 * 3.84e-4)
    assert four["bn_comm_s"] == pytest.approx(12 * BN)
    assert four["step_s"] == pytest.approx(1.536e-3 + 2.37e-3 + 12 * BN)
    assert four["efficiency"] > one["efficiency"]
    with pytest.raises(ValueError, match="accumulation_steps"):
        toy_time(accumulation_steps=0)


def test_bf16_gradients_halve_the_bytes():
    msgs = cost_model.step_messages(TOY, grad_bytes_per_param=2)
    assert msgs["gradients"] == [250_000, 500_000]
    t = toy_time(grad_bytes_per_param=2)
    assert t["grad_comm_s"] == pytest.approx(2 * 6e-5 + 1.5 * 750_000 / 1e9)


def test_overlap_hides_all_but_the_last_pack():
    # 2 packs per update: D's 500 kB as 2 x 250 kB (4.35e-4 s each), G's 1 MB as
    # 2 x 500 kB (8.1e-4 s each).
    d_pack, g_pack = 6e-5 + 1.5 * 250_000 / 1e9, 6e-5 + 1.5 * 500_000 / 1e9
    # Compute-bound (1e10 FLOP/s): D update 2.24e-2 s, backward window 32 x 4d = 1.28e-2;
    # G update 1.6e-2 s, window 32 x (2g + d) = 9.6e-3. Only the last packs show.
    slow = toy_time(flops_per_s=1e10, packs=2, overlap=True)
    assert slow["step_s"] == pytest.approx(2.24e-2 + d_pack + 1.6e-2 + g_pack + 3 * BN)
    assert toy_time(flops_per_s=1e10, packs=2)["step_s"] == pytest.approx(
        3.84e-2 + 2 * d_pack + 2 * g_pack + 3 * BN)
    # Communication-bound (1e12): windows 1.28e-4 (D) and 9.6e-5 (G) are hidden whole.
    fast = toy_time(packs=2, overlap=True)
    assert fast["step_s"] == pytest.approx(
        3.84e-4 - 1.28e-4 - 9.6e-5 + 2 * d_pack + 2 * g_pack + 3 * BN)
    assert fast["grad_comm_s"] == pytest.approx(2 * d_pack + 2 * g_pack)


def test_overlap_never_makes_a_step_slower():
    for n in (2, 8, 256):
        for flops in (1e9, 1e12, 1e15):
            for k in (1, 4):
                for packs in (1, 2, 16):
                    args = {"replicas": n, "per_replica_batch": 32, "gbit_per_s": 10,
                            "latency_s": 2e-5, "flops_per_s": flops,
                            "accumulation_steps": k, "packs": packs}
                    plain = cost_model.step_time(TOY, **args)["step_s"]
                    over = cost_model.step_time(TOY, overlap=True, **args)["step_s"]
                    assert over <= plain * (1 + 1e-12)
                    if packs == 1:  # One all-reduce after the backward: nothing to hide.
                        assert over == pytest.approx(plain)


# ---- The model axis (cost_model.mesh_*) ---------------------------------------------

def tiny_pair():
    """G: z[4] -> Dense 8 (no bias) -> BN -> Reshape [2, 2, 2] -> Conv 1x1 (1 filter).
    D: x[2, 2, 1] -> Flatten -> Dense 6 -> LeakyReLU -> Dense 1. At model=2: G's Dense
    [4, 8] and D's Dense [4, 6] column-parallel, D's Dense [6, 1] row-parallel."""
    dense = keras.layers.Dense
    g = keras.Sequential([keras.Input((4,)), dense(8, use_bias=False, name="g8"),
                          SyncBatchNormalization(), keras.layers.Reshape((2, 2, 2)),
                          keras.layers.Conv2D(1, 1, use_bias=False)], name="generator")
    d = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
                          dense(6, name="d6"), keras.layers.LeakyReLU(),
                          dense(1, name="d1")], name="discriminator")
    return g, d


MESH = {"batch": 2, "model": 2}


@pytest.fixture(scope="module")
def tiny():
    g, d = tiny_pair()
    return cost_model.mesh_network_costs(g, d, (2, 2, 1), 4, MESH)


def check_tiny_messages(costs):
    """The tiny pair on batch:2,model:2, 3 examples per device, d_steps 1, by hand."""
    msgs = cost_model.mesh_step_messages(costs, MESH, per_device_batch=3)
    # Trainable parameters: G 32 (kernel, split) + 16 (BN) + 2 (conv) = 50; one device
    # holds 32 / 2 + 18 = 34. D: 24 + 6 (Dense 6, kernel split) + 6 + 1 (Dense 1, kernel
    # split) = 37; one device: 12 + 6 + 3 + 1 = 22. Gradients: 4 bytes each, over "batch".
    assert msgs["gradients"] == [4 * 22, 4 * 34]
    # G's BN normalizes the split output of Dense 8: 4 channels per device, 2C + 1
    # float64 values, in 3 passes (D update forward; G update forward + backward).
    assert msgs["batch_norm"] == [8 * (2 * 4 + 1)] * 3
    # All-gathers over "model", float32 [examples, features]: G's Dense 8 output in the D
    # update (3 fakes) and the G update (3), D's Dense 6 output on 3 real + 3 fake in the
    # D update and on 3 fakes in the G update.
    assert msgs["model_gather"] == [4 * 3 * 8, 4 * 6 * 6, 4 * 3 * 8, 4 * 3 * 6]
    # All-reduces over "model": Dense 1's partial sums (6 then 3 examples), and in the G
    # update the gradient w.r.t. D's input (the fakes, [3, 4]) through the column-parallel
    # Dense 6. Not in the D update (the images need no gradient there), never for G's
    # Dense (z needs none).
    assert msgs["model_all_reduce"] == [4 * 6 * 1, 4 * 3 * 1, 4 * 3 * 4]
    total = cost_model.mesh_step_bytes(costs, MESH, 3)
    assert total["messages"] == {"gradients": 224, "batch_norm": 216,
                                 "model_gather": 408, "model_all_reduce": 84}
    # Ring shares over 2 devices: all-reduce 2 (N-1)/N = 1, all-gather (N-1)/N = 1/2.
    assert total["sent"] == {"gradients": 224, "batch_norm": 216, "model_gather": 204,
                             "model_all_reduce": 84}


def test_mesh_layers_of_a_tiny_pair(tiny):
    def rows(layers):
        return [(r["path"], r["kind"], r["in"], r["out"], r["input_grad"]) for r in layers]

    assert rows(tiny["g_layers"]) == [("generator/g8/kernel", "column", 4, 8, "never")]
    # D's first Dense reads the images (a gradient only in the G update), its second a
    # function of D's weights.
    assert rows(tiny["d_layers"]) == [("discriminator/d6/kernel", "column", 4, 6, "input"),
                                      ("discriminator/d1/kernel", "row", 6, 1, "weights")]
    assert tiny["g_bn_split"] == [True] and tiny["d_bn_split"] == []
    assert [r["flops"] for r in tiny["d_layers"]] == [2 * 4 * 6, 2 * 6 * 1]


def test_mesh_messages_by_hand(tiny):
    check_tiny_messages(tiny)


def test_forgetting_the_split_fails_the_hand_check(tiny, monkeypatch):
    # The same check against a cost model that all-reduces sharded gradients whole
    # (no / M): it must not pass.
    real = cost_model.mesh_device_costs

    def no_split(costs):
        out = real(costs)
        return {**out, "g_params": costs["g_params"], "d_params": costs["d_params"]}

    monkeypatch.setattr(cost_model, "mesh_device_costs", no_split)
    with pytest.raises(AssertionError):
        check_tiny_messages(tiny)


def test_model_one_is_data_parallelism(dcgan_models, dcgan):
    g, d = dcgan_models
    costs = cost_model.mesh_network_costs(g, d, (28, 28, 1), 100, {"batch": 8, "model": 1},
                                          costs=dcgan)
    assert costs["g_layers"] == costs["d_layers"] == []
    msgs = cost_model.mesh_step_messages(costs, {"batch": 8, "model": 1}, 32, d_steps=2)
    assert msgs == {**cost_model.step_messages(dcgan, d_steps=2), "model_gather": [],
                    "model_all_reduce": []}
    link = {"gbit_per_s": 10, "latency_s": 2e-5, "flops_per_s": 5e13, "d_steps": 2}
    mesh = cost_model.mesh_step_time(costs, dims={"batch": 8, "model": 1},
                                     per_device_batch=32, **link)
    flat = cost_model.step_time(dcgan, replicas=8, per_replica_batch=32, **link)
    for key in flat:
        assert mesh[key] == pytest.approx(flat[key]), key
    assert mesh["model_comm_s"] == 0.0
    assert mesh["params_per_device"] == 2_305_472 + 212_865


def test_dcgan_on_a_model_axis(dcgan_models, dcgan):
    g, d = dcgan_models
    dims = {"batch": 4, "model": 2}
    costs = cost_model.mesh_network_costs(g, d, (28, 28, 1), 100, dims, costs=dcgan)
    # G's Dense [100, 7*7*256] is column-parallel, D's last Dense [6272, 1] row-parallel.
    assert [(r["kind"], r["in"], r["out"]) for r in costs["g_layers"] + costs["d_layers"]] \
        == [("column", 100, 12544), ("row", 6272, 1)]
    msgs = cost_model.mesh_step_messages(costs, dims, 64)
    assert msgs["gradients"] == [4 * (212_865 - 6272 // 2), 4 * (2_305_472 - 1_254_400 // 2)]
    assert sorted(msgs["batch_norm"]) == sorted([8 * (2 * c + 1) for c in (6272, 128, 64)] * 3)
    assert msgs["model_gather"] == [4 * 64 * 12544] * 2
    # Overrides reach the plan: G's Dense replicated, only D's is split.
    rep = cost_model.mesh_network_costs(g, d, (28, 28, 1), 100, dims,
                                        overrides=[("generator/dense", "-,-")], costs=dcgan)
    assert rep["g_layers"] == [] and rep["g_bn_split"] == [False, False, False]
    with pytest.raises(ValueError, match="model=2"):
        cost_model.mesh_step_messages(costs, {"batch": 2, "model": 4}, 64)


def test_ring_gather_formula():
    # (N-1) latency steps + (N-1)/N of the gathered tensor over the link.
    t = cost_model.ring_gather_time_s([1e6], 4, gbit_per_s=8, latency_s=1e-5)
    assert t == pytest.approx(3 * 1e-5 + 0.75 * 1e6 / 1e9)
    assert cost_model.ring_gather_time_s([1e6], 1, 8, 1e-5) == 0.0


# TOY with a column-parallel Dense [100, 1000] in G (200k FLOPs, 100k parameters) whose BN
# follows it, on batch:4,model:2 (8 devices), 32 examples per device.
TOY_MESH = {**TOY, "model_size": 2, "d_layers": [], "g_bn_split": [True], "d_bn_split": [],
            "g_layers": [{"path": "g/dense/kernel", "kind": "column", "in": 100, "out": 1000,
                          "params": 100_000, "in_values": 100, "out_values": 1000,
                          "positions": 1, "flops": 200_000, "input_grad": "never"}]}


def test_mesh_step_time_by_hand():
    dims = {"batch": 4, "model": 2}
    args = {"dims": dims, "per_device_batch": 32, "gbit_per_s": 8, "latency_s": 1e-5}
    t = cost_model.mesh_step_time(TOY_MESH, flops_per_s=1e12, **args)
    # One device: G 900k FLOPs (the Dense's 200k / 2), 200k parameters, BN of 50 channels.
    # 32 x (D update 0.9e6 + 6e6, G update 2.7e6 + 2e6) at 1e12 FLOP/s.
    assert t["compute_s"] == pytest.approx(32 * 11.6e6 / 1e12)
    # Over the 4 devices of "batch": 4 B x 125k (D), 4 B x 200k (G).
    assert t["grad_comm_s"] == pytest.approx(D_GRAD + 6e-5 + 1.5 * 800_000 / 1e9)
    assert t["bn_comm_s"] == pytest.approx(3 * (6e-5 + 1.5 * 8 * 101 / 1e9))
    # Over the 2 devices of "model": G's output gathered in 2 forward passes, 4 B x 32 x
    # 1000 each: 1 latency step + half of it over the link.
    gathers = 2 * (1e-5 + 128_000 / 2 / 1e9)
    assert t["model_comm_s"] == pytest.approx(gathers)
    assert t["step_s"] == pytest.approx(
        t["compute_s"] + t["grad_comm_s"] + t["bn_comm_s"] + gathers)
    assert t["examples"] == 128
    assert t["params_per_device"] == 200_000 + 125_000
    # Efficiency: one device's FLOPs for the global batch (12e6 per example) over 8.
    assert t["efficiency"] == pytest.approx(128 * 12e6 / 1e12 / 8 / t["step_s"])
    # A faster model-axis link (80 Gbit/s, 1 us) prices only the model axis.
    fast = cost_model.mesh_step_time(TOY_MESH, flops_per_s=1e12, model_gbit_per_s=80,
                                     model_latency_s=1e-6, **args)
    assert fast["model_comm_s"] == pytest.approx(2 * (1e-6 + 128_000 / 2 / 1e10))
    assert fast["step_s"] - fast["model_comm_s"] == pytest.approx(t["step_s"] - gathers)


@contextlib.contextmanager
def fresh_layer_names():
    """Keras' automatic layer names (dense, dense_1, ...) counted from 0 as in a fresh
    process, for a tool run in this one whose flags name layers; the counters resume
    afterwards."""
    from keras.src.backend.common import global_state
    saved = global_state.get_global_attribute("object_name_uids")
    global_state.set_global_attribute("object_name_uids", collections.defaultdict(int))
    try:
        yield
    finally:
        global_state.set_global_attribute("object_name_uids", saved)


def test_tool_prints_the_mesh_table():
    with fresh_layer_names():  # --layout names D's second Dense as the tool names it.
        proc = run_in_process(["tools/allreduce_cost.py", "--config=experiments/gauss2d.py",
                               "--mesh=batch:8,model:1", "--mesh=batch:4,model:2",
                               "--layout=discriminator/dense_5/kernel=-,-"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln.split(" | ") for ln in proc.stdout.splitlines() if ln.startswith("| batch")]
    assert [r[0] for r in rows] == ["| batch:8,model:1 (8)", "| batch:4,model:2 (8)"]
    assert [r[1] for r in rows] == ["256", "256"]  # 32 per device slot.
    assert [r[3] for r in rows] == ["32", "64"]  # Examples per device: 256 / batch.
    assert rows[0][7] == "0.00" and float(rows[1][7]) > 0  # Model-axis MB.
    # model:1 is data parallelism: every weight on every device, and the gradients of one
    # D and one G update (4 bytes per parameter, as in the table above) all-reduced.
    params = dense_params([2, 256, 256, 256, 2]) + dense_params([2, 256, 256, 256, 1])
    assert rows[0][2] == f"{params / 1e6:.2f}" and rows[0][5] == f"{4 * params / 1e6:.2f}"
    split = proc.stdout.split("split weights")[1].splitlines()[0]
    assert "discriminator/dense_4/kernel column [2, 256]" in split
    assert "discriminator/dense_5/kernel" not in split  # --layout replicated it.


def test_split_convolutions_by_hand(monkeypatch):
    # Every kernel split (the policy's size threshold at 0): G's Dense [4, 16] and
    # transposed conv [3, 3, out 2, in 4] (2x2 -> 4x4), D's conv [3, 3, in 2, out 4]
    # (4x4 -> 2x2) column-parallel, D's Dense [16, 1] row-parallel.
    from tf_gan_scale.parallel import layouts
    monkeypatch.setattr(layouts, "CONV_SPLIT_MIN_PARAMS", 0)
    layers = keras.layers
    g = keras.Sequential([keras.Input((4,)), layers.Dense(16, use_bias=False, name="g16"),
                          layers.Reshape((2, 2, 4)),
                          layers.Conv2DTranspose(2, 3, strides=2, padding="same",
                                                 use_bias=False, name="gt")], name="generator")
    d = keras.Sequential([keras.Input((4, 4, 2)),
                          layers.Conv2D(4, 3, strides=2, padding="same", name="dc"),
                          layers.Flatten(), layers.Dense(1, name="d1")], name="discriminator")
    costs = cost_model.mesh_network_costs(g, d, (4, 4, 2), 4, MESH)

    def rows(recs):
        return [(r["path"].split("/")[1], r["kind"], r["in"], r["out"], r["params"],
                 r["in_values"], r["out_values"], r["flops"], r["input_grad"]) for r in recs]

    # FLOPs: 2 x 9 taps x in x out per output position (conv: 2x2) or per input position
    # (transposed: 2x2).
    assert rows(costs["g_layers"]) == [("g16", "column", 4, 16, 64, 4, 16, 128, "never"),
                                       ("gt", "column", 4, 2, 72, 16, 32, 576, "weights")]
    assert rows(costs["d_layers"]) == [("dc", "column", 2, 4, 72, 32, 16, 576, "input"),
                                       ("d1", "row", 16, 1, 16, 16, 1, 32, "weights")]
    local = cost_model.mesh_device_costs(costs)
    assert (local["g_params"], local["d_params"]) == (136 // 2, 93 - 88 + 88 // 2)
    msgs = cost_model.mesh_step_messages(costs, MESH, per_device_batch=3)
    # D update: G forward gathers both outputs (3 x 16, 3 x 32), D forward on 6 gathers
    # the conv's 6 x 16 and all-reduces Dense 1's partial sums; G update: G forward, D
    # forward on 3, then the gradients w.r.t. D's conv input (3 x 32) and G's transposed
    # conv input (3 x 16) are all-reduced; G's Dense reads z (no input gradient).
    assert msgs["model_gather"] == [4 * 3 * 16, 4 * 3 * 32, 4 * 6 * 16,
                                    4 * 3 * 16, 4 * 3 * 32, 4 * 3 * 16]
    assert msgs["model_all_reduce"] == [4 * 6, 4 * 3, 4 * 3 * 32, 4 * 3 * 16]
