import numpy as np
from PIL import Image

from tf_gan_scale import images


def test_grid_places_images_row_major_with_padding():
    x = np.stack([np.full((2, 3, 1), v) for v in (-1.0, 1.0, 0.0)])
    g = images.grid(x, cols=2, pad=1)
    assert g.shape == (2 * 3 + 1, 2 * 4 + 1, 1) and g.dtype == np.uint8
    assert (g[1:3, 1:4] == 0).all() and (g[1:3, 5:8] == 255).all() and (g[4:6, 1:4] == 128).all()
    assert (g[0] == 0).all()  # Padding.


def test_render_and_write(tmp_path):
    pts = np.random.default_rng(0).standard_normal((50, 2))
    path = tmp_path / "s.png"
    images.write_png(str(path), images.render(pts, reference=pts))
    assert Image.open(path).size == (512, 512)
