"""Image files out: PNG grids and 2D scatter plots (pillow), npz image sources."""

import math
import os

import numpy as np
from PIL import Image, ImageDraw


def to_uint8(images):
    """[-1, 1] float images [N, H, W, C] -> uint8 [N, H, W, C]."""
    return np.clip(np.rint((np.asarray(images) + 1.0) * 127.5), 0, 255).astype(np.uint8)


def grid(images, *, cols=None, scale=1, pad=1):
    """Tiles [N, H, W, C] images in [-1, 1] into one uint8 [rows*(H+pad)+pad, ..., C] array."""
    x = to_uint8(images)
    n, h, w, c = x.shape
    cols = cols or int(math.ceil(math.sqrt(n)))
    rows = int(math.ceil(n / cols))
    out = np.zeros((rows * (h + pad) + pad, cols * (w + pad) + pad, c), np.uint8)
    for i in range(n):
        r, k = divmod(i, cols)
        out[pad + r * (h + pad):pad + r * (h + pad) + h,
            pad + k * (w + pad):pad + k * (w + pad) + w] = x[i]
    if scale > 1:
        out = out.repeat(scale, 0).repeat(scale, 1)
    return out


def scatter(points, *, reference=None, size=512, extent=None):
    """Renders [N, 2] points (red) over optional reference points (grey): uint8 [S, S, 3]."""
    points = np.asarray(points, np.float64)
    allpts = points if reference is None else np.concatenate([points, reference])
    lim = extent or float(np.max(np.abs(allpts[np.isfinite(allpts)]), initial=1.0)) * 1.1
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)

    def px(p):
        return (p + lim) / (2 * lim) * (size - 1)

    for pts, color in ((reference, (170, 170, 170)), (points, (200, 30, 30))):
        if pts is None:
            continue
        for x, y in px(pts[np.all(np.isfinite(pts), 1)]):
            draw.ellipse([x - 1.5, size - 1 - y - 1.5, x + 1.5, size - 1 - y + 1.5], fill=color)
    return np.asarray(img)


def class_rows(num_samples, num_classes):
    """(labels int32 [num_samples], columns) of a class-per-row grid of a conditional
    model: row k holds class k; columns = ceil(N / num_classes) (the last row may be
    short; N a multiple of num_classes shows every class, fewer rows when N is smaller)."""
    cols = max(1, -(-num_samples // num_classes))
    return np.minimum(np.arange(num_samples) // cols, num_classes - 1).astype(np.int32), cols


def render(samples, reference=None, cols=None):
    """A picture of generator samples: a grid for images [N,H,W,C] (`cols` columns, default
    square), a scatter for [N,2]."""
    samples = np.asarray(samples)
    if samples.ndim == 4:
        return grid(samples, cols=cols, scale=max(1, 64 // samples.shape[1]))
    if samples.ndim == 2 and samples.shape[1] == 2:
        return scatter(samples, reference=reference)
    raise ValueError(f"cannot render samples of shape {samples.shape}; need [N,H,W,C] or [N,2]")


def write_png(path, array):
    """Writes a uint8 [H, W, C] array as PNG atomically (temp file, then rename)."""
    array = np.asarray(array)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    tmp = f"{path}.tmp.png"
    Image.fromarray(array).save(tmp)
    os.replace(tmp, path)


def write_npz(path, x, y):
    """Writes an `npz:PATH` data source (x uint8 [N, H, W, C], y int [N]) atomically: a
    temporary file next to `path` ("....tmp.npz"), then a rename."""
    tmp = path[:-len(".npz")] + ".tmp.npz"
    np.savez(tmp, x=x, y=y)
    os.replace(tmp, path)
