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
    eff = lambda n, bw, sync=True: cost_model.efficiency(
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
