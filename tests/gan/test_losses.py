import math

import numpy as np
import pytest

from tf_gan_scale import errors
from tf_gan_scale.gan import losses

REAL = np.array([2.0, -1.0, 0.0], np.float32)
FAKE = np.array([-0.5, 1.5, 0.0], np.float32)


def sp(x):
    return math.log1p(math.exp(x))


# Hand-computed per-example values (d, g) for REAL/FAKE above.
EXPECTED = {
    "non_saturating": ([sp(-2) + sp(-0.5), sp(1) + sp(1.5), 2 * sp(0)],
                       [sp(0.5), sp(-1.5), sp(0)]),
    "minimax": ([sp(-2) + sp(-0.5), sp(1) + sp(1.5), 2 * sp(0)],
                [-sp(-0.5), -sp(1.5), -sp(0)]),
    "hinge": ([0 + 0.5, 2 + 2.5, 1 + 1], [0.5, -1.5, 0.0]),
    "wasserstein": ([-2.5, 2.5, 0.0], [0.5, -1.5, 0.0]),
    "least_squares": ([0.5 * (1 + 0.25), 0.5 * (4 + 2.25), 0.5 * 1],
                      [0.5 * 2.25, 0.5 * 0.25, 0.5]),
    # Paired by row: real - fake = (2.5, -2.5, 0).
    "rpgan": ([sp(-2.5), sp(2.5), sp(0)], [sp(2.5), sp(-2.5), sp(0)]),
}


def test_every_registered_loss_has_hand_computed_values():
    assert set(losses.LOSSES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_loss_values(name):
    out = losses.get(name)(real_logits=REAL, fake_logits=FAKE)
    d, g = EXPECTED[name]
    np.testing.assert_allclose(out.d.numpy(), d, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.g.numpy(), g, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_loss_contract_per_example_and_keyword_only(name):
    fn = losses.get(name)
    out = fn(real_logits=REAL[:, None], fake_logits=FAKE[:, None])  # [B, 1] logits too
    assert out.d.shape == (3,) and out.g.shape == (3,)
    with pytest.raises(TypeError):
        fn(REAL, FAKE)  # Positional use could swap real and fake.


def test_unknown_loss_names_valid_choices():
    with pytest.raises(errors.ConfigError, match="unknown loss 'hinj'; valid: hinge, "):
        losses.get("hinj")
