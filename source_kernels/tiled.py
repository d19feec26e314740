"""Sample-tiled MSDA kernels: every (level, point) sample of a block of queries in one tile.

The loop kernels of ``forward.py`` and ``backward.py`` walk the L*K samples of their block of
queries with ``tl.static_range``: the loop is unrolled, and how many samples' gathers a thread
issues before it uses the first is left to the compiler's scheduler, which must hold every
load in flight in registers.  These variants put the samples on an axis of the tile, a
(BLOCK_Q, LK_PAD, BLOCK_D) tile with channels still the fast axis (LK_PAD: L*K rounded up to
a power of two, the padding samples masked).  Each corner is then one load of BLOCK_Q * L * K
value rows, spread over the program's threads, and the four corner loads do not depend on
each other, so the gathers of every sample are requested together.  The per-level sizes
become small vectors indexed by each sample's level.

The launch plans (``forward.FORWARD_PLAN``, ``backward.BACKWARD_PLAN``) choose between these
kernels and the loop ones per regime and element size; the tiled forward serves small,
latency-bound calls (the decoder preset) with one query per program, where a program's whole
gather should be in flight at once.  Same arguments, same results, same sampling convention
(``sampling.pixel_corners``) as the loop kernels.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .sampling import corner_tile_3d, pixel_corners

__all__ = ["_msda_forward_tiled_kernel", "_msda_backward_tiled_kernel"]


@triton.jit
def _sample_grid(shapes_ptr, starts_ptr, loc_ptr, attn_ptr, bqm, mask_q,
                 L: tl.constexpr, K: tl.constexpr, LK_PAD: tl.constexpr,
                 ACC_DTYPE: tl.constexpr):
    """Per-sample parameters of a block of queries: flat parameter index p (BLOCK_Q, LK_PAD),
    its mask, the level's width, height and start per sample, and the weights and
    locations."""
    offs_lk = tl.arange(0, LK_PAD)                     # sample = level * K + point
    mask_lk = offs_lk < L * K
    level = offs_lk // K
    height = tl.load(shapes_ptr + 2 * level, mask=mask_lk, other=1).to(tl.int32)
    width = tl.load(shapes_ptr + 2 * level + 1, mask=mask_lk, other=1).to(tl.int32)
    start = tl.load(starts_ptr + level, mask=mask_lk, other=0)
    p = bqm[:, None] * (L * K) + offs_lk[None, :]     # (BLOCK_Q, LK_PAD), int64
    mask_p = mask_q[:, None] & mask_lk[None, :]
    loc_x = tl.load(loc_ptr + 2 * p, mask=mask_p, other=0.0).to(ACC_DTYPE)
    loc_y = tl.load(loc_ptr + 2 * p + 1, mask=mask_p, other=0.0).to(ACC_DTYPE)
    weight = tl.load(attn_ptr + p, mask=mask_p, other=0.0).to(ACC_DTYPE)
    return p, mask_p, width[None, :], height[None, :], start[None, :], loc_x, loc_y, weight


@triton.jit
def _msda_forward_tiled_kernel(
    value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
    stride_b, stride_s, stride_m, Q, M, D,
    L: tl.constexpr, K: tl.constexpr, LK_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, ACC_DTYPE: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_bm = tl.program_id(1)
    b = pid_bm // M
    m = pid_bm % M
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < Q
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    bqm = (b.to(tl.int64) * Q + offs_q) * M + m
    value_bm = value_ptr + b.to(tl.int64) * stride_b + m.to(tl.int64) * stride_m

    p, mask_p, width, height, start, loc_x, loc_y, weight = _sample_grid(
        shapes_ptr, starts_ptr, loc_ptr, attn_ptr, bqm, mask_q, L, K, LK_PAD, ACC_DTYPE)
    x0, y0, dx, dy, in_x0, in_x1, in_y0, in_y1 = pixel_corners(loc_x, loc_y, width, height)

    # Four gathers of (BLOCK_Q, L*K, BLOCK_D): every sample's corner rows requested at once.
    off, msk = corner_tile_3d(start, y0, x0, width, in_y0 & in_x0, mask_p, offs_d, mask_d,
                              stride_s)
    v00 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)
    off, msk = corner_tile_3d(start, y0, x0 + 1, width, in_y0 & in_x1, mask_p, offs_d,
                              mask_d, stride_s)
    v01 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)
    off, msk = corner_tile_3d(start, y0 + 1, x0, width, in_y1 & in_x0, mask_p, offs_d,
                              mask_d, stride_s)
    v10 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)
    off, msk = corner_tile_3d(start, y0 + 1, x0 + 1, width, in_y1 & in_x1, mask_p, offs_d,
                              mask_d, stride_s)
    v11 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)

    # Bilinear weights times attention weight, per sample; then sum over the samples.
    a00 = (weight * (1 - dy) * (1 - dx))[:, :, None]
    a01 = (weight * (1 - dy) * dx)[:, :, None]
    a10 = (weight * dy * (1 - dx))[:, :, None]
    a11 = (weight * dy * dx)[:, :, None]
    out = tl.sum(a00 * v00 + a01 * v01 + a10 * v10 + a11 * v11, axis=1)   # (BLOCK_Q, BLOCK_D)

    out_ptrs = out_ptr + (bqm * D)[:, None] + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty),
             mask=mask_q[:, None] & mask_d[None, :])


@triton.jit
def _gather_dot_scatter_3d(value_bm, grad_value_bm, offsets, mask, g3, scale, ACC_DTYPE):
    """One corner for every sample: <g, v> per (query, sample), and scale * g scattered."""
    v = tl.load(value_bm + offsets, mask=mask, other=0.0).to(ACC_DTYPE)
    tl.atomic_add(grad_value_bm + offsets,
                  (scale[:, :, None] * g3).to(grad_value_bm.dtype.element_ty), mask=mask,
                  sem="relaxed")
    return tl.sum(g3 * v, axis=2)


@triton.jit
def _msda_backward_tiled_kernel(
    grad_out_ptr, value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr,
    grad_value_ptr, grad_loc_ptr, grad_attn_ptr,
    stride_b, stride_s, stride_m, Q, M, D,
    L: tl.constexpr, K: tl.constexpr, LK_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, ACC_DTYPE: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_bm = tl.program_id(1)
    b = pid_bm // M
    m = pid_bm % M
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < Q
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    bqm = (b.to(tl.int64) * Q + offs_q) * M + m
    bm_offset = b.to(tl.int64) * stride_b + m.to(tl.int64) * stride_m
    value_bm = value_ptr + bm_offset
    grad_value_bm = grad_value_ptr + bm_offset

    g = tl.load(grad_out_ptr + (bqm * D)[:, None] + offs_d[None, :],
                mask=mask_q[:, None] & mask_d[None, :], other=0.0).to(ACC_DTYPE)
    g3 = g[:, None, :]                                  # the same g for every sample

    # _sample_grid's loads, written out here: torch.compile's analysis of which arguments a
    # kernel writes follows write addresses back through helper calls to every pointer
    # passed to them, and would take the parameters for outputs.
    offs_lk = tl.arange(0, LK_PAD)
    mask_lk = offs_lk < L * K
    level = offs_lk // K
    height = tl.load(shapes_ptr + 2 * level, mask=mask_lk, other=1).to(tl.int32)[None, :]
    width = tl.load(shapes_ptr + 2 * level + 1, mask=mask_lk, other=1).to(tl.int32)[None, :]
    start = tl.load(starts_ptr + level, mask=mask_lk, other=0)[None, :]
    p = bqm[:, None] * (L * K) + offs_lk[None, :]
    mask_p = mask_q[:, None] & mask_lk[None, :]
    loc_x = tl.load(loc_ptr + 2 * p, mask=mask_p, other=0.0).to(ACC_DTYPE)
    loc_y = tl.load(loc_ptr + 2 * p + 1, mask=mask_p, other=0.0).to(ACC_DTYPE)
    weight = tl.load(attn_ptr + p, mask=mask_p, other=0.0).to(ACC_DTYPE)
    x0, y0, dx, dy, in_x0, in_x1, in_y0, in_y1 = pixel_corners(loc_x, loc_y, width, height)
    w00 = (1 - dy) * (1 - dx)
    w01 = (1 - dy) * dx
    w10 = dy * (1 - dx)
    w11 = dy * dx

    off, msk = corner_tile_3d(start, y0, x0, width, in_y0 & in_x0, mask_p, offs_d, mask_d,
                              stride_s)
    gv00 = _gather_dot_scatter_3d(value_bm, grad_value_bm, off, msk, g3, weight * w00,
                                  ACC_DTYPE)
    off, msk = corner_tile_3d(start, y0, x0 + 1, width, in_y0 & in_x1, mask_p, offs_d,
                              mask_d, stride_s)
    gv01 = _gather_dot_scatter_3d(value_bm, grad_value_bm, off, msk, g3, weight * w01,
                                  ACC_DTYPE)
    off, msk = corner_tile_3d(start, y0 + 1, x0, width, in_y1 & in_x0, mask_p, offs_d,
                              mask_d, stride_s)
    gv10 = _gather_dot_scatter_3d(value_bm, grad_value_bm, off, msk, g3, weight * w10,
                                  ACC_DTYPE)
    off, msk = corner_tile_3d(start, y0 + 1, x0 + 1, width, in_y1 & in_x1, mask_p, offs_d,
                              mask_d, stride_s)
    gv11 = _gather_dot_scatter_3d(value_bm, grad_value_bm, off, msk, g3, weight * w11,
                                  ACC_DTYPE)

    grad_weight = w00 * gv00 + w01 * gv01 + w10 * gv10 + w11 * gv11
    grad_x = weight * width * ((1 - dy) * (gv01 - gv00) + dy * (gv11 - gv10))
    grad_y = weight * height * ((1 - dx) * (gv10 - gv00) + dx * (gv11 - gv01))
    tl.store(grad_attn_ptr + p, grad_weight.to(grad_attn_ptr.dtype.element_ty), mask=mask_p)
    tl.store(grad_loc_ptr + 2 * p, grad_x.to(grad_loc_ptr.dtype.element_ty), mask=mask_p)
    tl.store(grad_loc_ptr + 2 * p + 1, grad_y.to(grad_loc_ptr.dtype.element_ty), mask=mask_p)
