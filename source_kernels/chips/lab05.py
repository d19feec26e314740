"""Chips of lab 05 (forward, correct): the course's forward kernel and its launcher, and the
lab's four helpers.

- ``msda_forward_kernel``: the ``@triton.jit`` forward kernel, one program per ``BLOCK_Q``
  queries of one (batch, head), wide over channels (``source_kernels.forward``);
- ``msda_forward(value, spatial_shapes, level_start_index, sampling_locations,
  attention_weights)``: its launcher on validated, contiguous inputs, (B, Q, M*D);
- ``forward_config(channels, dtype)``: the launch configuration (BLOCK_Q, num_warps) it uses;
- the lab's ``@triton.jit`` helpers, which a kernel of lab 06 or lab 10 may call:
  ``corner_coordinate(loc, size)`` -> (first corner, clamped to [-2, size + 1], int32; the
  fraction past it), ``level_row(start, r, c, H, W)`` -> start + r*W + c,
  ``value_offset(b, s, m, S, M, D)`` -> ((b*S + s)*M + m)*D in int64, and
  ``sample_level(value_ptr, b, m, S, M, D, start, H, W, x, y, mask_q, offs_d, mask_d)`` ->
  the (BLOCK_Q, BLOCK_D) bilinear samples of one level.

Import ``source_kernels`` before this module on a machine without a GPU (it switches Triton to
its interpreter); importing this module does it for you.

Graded code may call these chips in lab 06 (all of them), lab 10 (all of them) only; in lab 05
itself and in every other lab a graded function that calls one fails its check (book/labs.md,
the chips your graded code may call).
"""
import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)
from source_kernels.forward import _msda_forward_kernel as msda_forward_kernel
from source_kernels.forward import forward_config, msda_forward

import triton
import triton.language as tl

__all__ = ["msda_forward_kernel", "msda_forward", "forward_config", "corner_coordinate",
           "level_row", "value_offset", "sample_level"]


@triton.jit
def corner_coordinate(loc, size):
    """loc: a block of normalised coordinates, float32 or float64; size: W or H, int32.
    Returns (first, frac): floor(loc * size - 0.5) clamped to [-2, size + 1] as int32, and
    the pixel coordinate minus its floor (the weight of the second corner)."""
    x_im = loc * size - 0.5                        # align_corners=False
    first = tl.floor(x_im)
    frac = x_im - first
    first = tl.where(first > -2.0, first, -2.0)    # comparisons: NaN becomes -2
    first = tl.where(first < size + 1.0, first, size + 1.0)
    return first.to(tl.int32), frac


@triton.jit
def level_row(start, r, c, H, W):
    """The row of S that holds pixel (r, c) of a level whose first row is ``start``."""
    return start + r * W + c


@triton.jit
def value_offset(b, s, m, S, M, D):
    """The flat element offset of value[b, s, m, 0] in a contiguous (B, S, M, D) tensor, in
    int64 whatever the integer types of the arguments."""
    return ((b.to(tl.int64) * S + s) * M + m) * D


@triton.jit
def sample_level(value_ptr, b, m, S, M, D, start, H, W, x, y, mask_q, offs_d, mask_d):
    """The (BLOCK_Q, BLOCK_D) bilinear samples, in the dtype of x, of one level of head m of
    batch element b at the locations (x, y) of a block of queries; zero padding."""
    x0, dx = corner_coordinate(x, W)
    y0, dy = corner_coordinate(y, H)
    tile = tl.zeros((x.shape[0], offs_d.shape[0]), dtype=x.dtype)
    for corner in tl.static_range(4):              # (y0,x0) (y0,x1) (y1,x0) (y1,x1)
        r = y0 + corner // 2
        c = x0 + corner % 2
        w = (dy if corner // 2 == 1 else 1 - dy) * (dx if corner % 2 == 1 else 1 - dx)
        inside = mask_q & (r >= 0) & (r < H) & (c >= 0) & (c < W)
        row = value_offset(b, level_row(start, r, c, H, W), m, S, M, D)
        v = tl.load(value_ptr + row[:, None] + offs_d[None, :],
                    mask=inside[:, None] & mask_d[None, :], other=0.0)
        tile += w[:, None] * v.to(x.dtype)
    return tile
