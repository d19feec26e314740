"""The spec and the vectorised reference of multi-scale deformable attention (MSDA).

Shapes used throughout the package:

- ``value``               (B, S, M, D), S = sum over levels of H_l * W_l
- ``value_spatial_shapes``     (L, 2) int64, row l = (H_l, W_l)
- ``value_level_start_index`` (L,) int64, the offset of level l inside S
- ``sampling_locations``  (B, Q, M, L, K, 2), last axis (x, y) normalised to [0, 1]
- ``attention_weights``   (B, Q, M, L, K)
- output                  (B, Q, M * D)

The sampling convention, stated once: bilinear interpolation with zero padding and
``align_corners=False``.  A normalised coordinate x in [0, 1] lands on the pixel coordinate
``x * W - 0.5``, so pixel centres sit at half-integers of the normalised grid scaled by W,
and any corner that falls outside the map contributes zero.  ``pixel_coordinate`` is the one
place this is written; every other implementation in the course answers to ``msda_naive``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "pixel_coordinate",
    "bilinear_corner_weights",
    "bilinear_sample_naive",
    "msda_naive",
    "msda_grid_sample",
]


def pixel_coordinate(normalised: float, size: int) -> float:
    """Map a normalised coordinate in [0, 1] to a pixel coordinate (align_corners=False)."""
    return normalised * size - 0.5


def bilinear_corner_weights(x_im: float, y_im: float):
    """The four corners around a pixel coordinate and their bilinear weights.

    Returns ``[(row, col, weight), ...]`` for the corners (y0, x0), (y0, x1), (y1, x0),
    (y1, x1), in that order, where x0 = floor(x_im) and dx = x_im - x0.  The weights sum to 1.
    """
    x0 = math.floor(x_im)
    y0 = math.floor(y_im)
    dx = x_im - x0
    dy = y_im - y0
    return [
        (y0, x0, (1 - dy) * (1 - dx)),
        (y0, x0 + 1, (1 - dy) * dx),
        (y0 + 1, x0, dy * (1 - dx)),
        (y0 + 1, x0 + 1, dy * dx),
    ]


def bilinear_sample_naive(image: torch.Tensor, x: float, y: float) -> torch.Tensor:
    """Sample one feature map at one normalised location, in plain Python.

    image: (H, W, D); x, y: normalised coordinates (floats).  Returns a (D,) tensor in the
    dtype of ``image``.  Corners outside the map count as zero.
    """
    height, width, channels = image.shape
    x_im = pixel_coordinate(x, width)
    y_im = pixel_coordinate(y, height)
    out = torch.zeros(channels, dtype=image.dtype)
    for row, col, weight in bilinear_corner_weights(x_im, y_im):
        if 0 <= row < height and 0 <= col < width:
            out = out + weight * image[row, col]
    return out


def msda_naive(value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights):
    """MSDA as plain loops over every index: slow, obvious, the ground truth.

    Arguments and result as in the module docstring.  Computes in float64 on the CPU and
    returns the result in the dtype of ``value``.  Meant for tiny tensors only.
    """
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    v = value.detach().double().cpu()
    loc = sampling_locations.detach().double().cpu()
    attn = attention_weights.detach().double().cpu()
    shapes = value_spatial_shapes.tolist()
    starts = value_level_start_index.tolist()
    out = torch.zeros(batch, queries, heads, channels, dtype=torch.float64)
    for b in range(batch):
        for q in range(queries):
            for m in range(heads):
                for lvl in range(levels):
                    height, width = shapes[lvl]
                    start = starts[lvl]
                    image = v[b, start:start + height * width, m].reshape(height, width, channels)
                    for k in range(points):
                        x, y = loc[b, q, m, lvl, k].tolist()
                        sample = bilinear_sample_naive(image, x, y)
                        out[b, q, m] += attn[b, q, m, lvl, k] * sample
    return out.reshape(batch, queries, heads * channels).to(value.dtype)


def msda_grid_sample(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                     attention_weights):
    """MSDA vectorised with ``torch.nn.functional.grid_sample``: the PyTorch reference.

    Differentiable in every floating input, runs on any device and dtype grid_sample takes.
    grid_sample wants coordinates in [-1, 1]; ``2 * loc - 1`` with ``align_corners=False``
    lands on exactly the pixel coordinate ``loc * W - 0.5`` of the spec.
    """
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    sizes = [int(h) * int(w) for h, w in value_spatial_shapes.tolist()]
    starts = [int(s) for s in value_level_start_index.tolist()]
    grids = 2 * sampling_locations - 1                       # (B, Q, M, L, K, 2)
    per_level = []
    for lvl, (height, width) in enumerate(value_spatial_shapes.tolist()):
        level_value = value[:, starts[lvl]:starts[lvl] + sizes[lvl]]   # (B, HW, M, D)
        # (B, HW, M, D) -> (B*M, D, H, W): one image of D channels per (batch, head)
        image = level_value.permute(0, 2, 3, 1).reshape(batch * heads, channels,
                                                         int(height), int(width))
        # (B, Q, M, K, 2) -> (B*M, Q, K, 2)
        grid = grids[:, :, :, lvl].transpose(1, 2).reshape(batch * heads, queries, points, 2)
        sampled = F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros",
                                align_corners=False)          # (B*M, D, Q, K)
        per_level.append(sampled)
    stacked = torch.stack(per_level, dim=-2)                  # (B*M, D, Q, L, K)
    weights = attention_weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels, points)
    out = (stacked * weights).sum(dim=(-1, -2))               # (B*M, D, Q)
    return out.reshape(batch, heads * channels, queries).transpose(1, 2).contiguous()
