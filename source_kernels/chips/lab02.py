"""Chips of lab 02 (tensors are pointers): MSDA on flat 1-D memory, and int32 arithmetic.

A contiguous tensor is one run of memory plus a rule that turns an index into an offset:
``offset = sum(index[i] * stride[i])`` with ``stride[-1] = 1`` and
``stride[i] = stride[i + 1] * shape[i + 1]``.  A kernel sees nothing else.

Graded code may call these chips in lab 03 (``contiguous_strides``, ``flat_offset``) only; in
lab 02 itself and in every other lab a graded function that calls one fails its check
(book/labs.md, the chips your graded code may call).
"""
from __future__ import annotations

import math

import torch

from source_kernels.reference import pixel_coordinate

__all__ = ["INT32_MAX", "contiguous_strides", "flat_offset", "msda_flat", "int32_wrap",
           "first_overflowing_batch"]

INT32_MAX = 2 ** 31 - 1


def contiguous_strides(shape):
    """Strides, in elements, of a contiguous (row-major) tensor of ``shape`` (tuple of ints)."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def flat_offset(index, strides):
    """The element offset of ``index`` (tuple of ints) in memory laid out with ``strides``."""
    return sum(i * s for i, s in zip(index, strides))


def msda_flat(value_flat, loc_flat, attn_flat, sizes, spatial_shapes, level_start_index):
    """MSDA reading only 1-D tensors through offsets computed by hand.

    value_flat  (B*S*M*D,)       float, the contiguous (B, S, M, D) value
    loc_flat    (B*Q*M*L*K*2,)   float, the contiguous (B, Q, M, L, K, 2) locations, (x, y)
    attn_flat   (B*Q*M*L*K,)     float, the contiguous (B, Q, M, L, K) attention weights
    sizes       dict of ints with keys "B", "S", "M", "D", "Q", "L", "K"
    spatial_shapes     list of L (H, W) int pairs
    level_start_index  list of L ints
    returns     (B*Q*M*D,) in the dtype of ``value_flat``: the contiguous (B, Q, M*D) output
    """
    B, S, M, D = sizes["B"], sizes["S"], sizes["M"], sizes["D"]
    Q, L, K = sizes["Q"], sizes["L"], sizes["K"]
    out = torch.zeros(B * Q * M * D, dtype=torch.float64)
    value = value_flat.double()
    for b in range(B):
        for q in range(Q):
            for m in range(M):
                out_start = ((b * Q + q) * M + m) * D          # out[b, q, m, 0]
                acc = torch.zeros(D, dtype=torch.float64)
                for lvl in range(L):
                    height, width = spatial_shapes[lvl]
                    start = level_start_index[lvl]
                    for k in range(K):
                        p = (((b * Q + q) * M + m) * L + lvl) * K + k
                        x = float(loc_flat[2 * p])
                        y = float(loc_flat[2 * p + 1])
                        weight = float(attn_flat[p])
                        x_im = pixel_coordinate(x, width)
                        y_im = pixel_coordinate(y, height)
                        x0, y0 = math.floor(x_im), math.floor(y_im)
                        dx, dy = x_im - x0, y_im - y0
                        for row, col, w in ((y0, x0, (1 - dy) * (1 - dx)),
                                            (y0, x0 + 1, (1 - dy) * dx),
                                            (y0 + 1, x0, dy * (1 - dx)),
                                            (y0 + 1, x0 + 1, dy * dx)):
                            if 0 <= row < height and 0 <= col < width:
                                s = start + row * width + col
                                row_start = ((b * S + s) * M + m) * D   # value[b, s, m, 0]
                                acc += weight * w * value[row_start:row_start + D]
                out[out_start:out_start + D] = acc
    return out.to(value_flat.dtype)


def int32_wrap(n: int) -> int:
    """What a signed 32-bit integer holds after an arithmetic result ``n``: two's
    complement keeps the low 32 bits, so n wraps into [-2**31, 2**31 - 1]."""
    return (n + 2 ** 31) % 2 ** 32 - 2 ** 31


def first_overflowing_batch(spatial_shapes, heads: int, channels: int) -> int:
    """The smallest batch B whose largest flat value index, B*S*M*D - 1, exceeds 2**31 - 1
    (S = sum of H*W over the levels in ``spatial_shapes``, a list of (H, W) pairs or an
    (L, 2) tensor)."""
    shapes = spatial_shapes.tolist() if isinstance(spatial_shapes, torch.Tensor) else spatial_shapes
    per_batch = sum(int(h) * int(w) for h, w in shapes) * heads * channels
    # B * per_batch - 1 > INT32_MAX  <=>  B * per_batch > 2**31
    return 2 ** 31 // per_batch + 1
