"""All-reduce cost model: exact message sizes for the tutorial DCGAN, the ring formula."""

import keras
import pytest

from conftest import run_cmd
from tf_gan_scale import architectures, cost_model


@pytest.fixture(scope="module")
def dcgan():
    g, d = architectures.build("dcgan", data_shape=(28, 28, 1), latent_dim=100)
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


def test_forward_flops_of_a_dense_layer():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    assert cost_model.forward_flops(model, [3]) == 2 * 3 * 4 + 4  # MatMul + bias.


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


def test_tool_prints_the_table():
    proc = run_cmd(["tools/allreduce_cost.py", "--config=experiments/gauss2d.py"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 10", "| 25", "| 100", "| 400"]


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
