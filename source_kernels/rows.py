"""Row-blocked MSDA kernels: a program takes BLOCK_R rows of the flat (batch, query, head) axis.

The loop and tiled kernels give each program queries of one (batch, head) pair, on a grid of
(query blocks, B * M).  At the decoder's size that grid is thousands of one-warp programs,
and ``results/decoder_limits_h200.json`` shows an empty kernel on it already costing 6.4 us
of the 11 us forward: the launch of programs, not the gathers, is what the small problems
pay for.  Here the rows ``r = (b * Q + q) * M + m`` are numbered as the parameters and the
output lie in memory, so a block of rows reads one contiguous run of locations and weights
and writes one contiguous run of output, and a program can take several queries with all
their heads: fewer, fuller programs.

Compile-time switches, each a candidate for the launch sweep (``source_kernels.bench``):

- ``CHUNK``: samples per step.  L * K takes every (level, point) sample of a row at once
  (the tiled kernels' schedule), K one level at a time, 1 one sample at a time (the loop
  kernels' schedule, fewest registers);
- ``HEAD_MAJOR``: number the rows (batch, head, query) instead, so that a block holds
  neighbouring queries of one head, which share corner rows when locations are local (the
  loop kernels' order);
- ``WIDE``: int64 element offsets; int32 when every offset fits (fewer instructions per
  corner), which the host decides from the tensors' sizes;
- ``PERSISTENT`` (forward): a grid of a few programs per SM, each walking blocks
  ``pid, pid + programs, ...`` and loading the next block's locations and weights before
  it gathers the current block's corners.

Same arguments as the other kernels plus ROWS = B * Q * M; arithmetic in fp32 (fp64 for
fp64 inputs), the sampling convention of ``sampling.pixel_corners``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .sampling import pixel_corners

__all__ = ["_msda_forward_rows_kernel", "_msda_backward_rows_kernel"]


@triton.jit
def _row_layout(block, ROWS, Q, M, stride_b, stride_m,
                BLOCK_R: tl.constexpr, HEAD_MAJOR: tl.constexpr, WIDE: tl.constexpr):
    """For the rows of one block: the parameter row (b * Q + q) * M + m of each, its mask,
    and the element offset of value[b, 0, m, 0]."""
    offs_r = block * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < ROWS
    if HEAD_MAJOR:                                   # r = (b * M + m) * Q + q
        q = offs_r % Q
        bm = offs_r // Q
        m = bm % M
        b = bm // M
        param_row = (b * Q + q) * M + m
    else:                                            # r = (b * Q + q) * M + m
        m = offs_r % M
        b = offs_r // (Q * M)
        param_row = offs_r
    if WIDE:
        base = b.to(tl.int64) * stride_b + m.to(tl.int64) * stride_m
        param_row = param_row.to(tl.int64)
    else:
        base = b * stride_b + m * stride_m
    return param_row, mask_r, base


@triton.jit
def _load_samples(shapes_ptr, starts_ptr, loc_ptr, attn_ptr, param_row, mask_r, first,
                  L: tl.constexpr, K: tl.constexpr, N_PAD: tl.constexpr,
                  CHUNK: tl.constexpr, ACC, LOAD_PARAMS: tl.constexpr = True):
    """Samples first .. first + CHUNK - 1 of each row: (BLOCK_R, N_PAD) flat parameter
    index, mask, the level's width, height and start, and (unless LOAD_PARAMS is false,
    when the caller has them) the locations and the weights."""
    offs_n = first + tl.arange(0, N_PAD)              # sample = level * K + point
    mask_n = (offs_n < first + CHUNK) & (offs_n < L * K)
    level = offs_n // K
    height = tl.load(shapes_ptr + 2 * level, mask=mask_n, other=1).to(tl.int32)
    width = tl.load(shapes_ptr + 2 * level + 1, mask=mask_n, other=1).to(tl.int32)
    start = tl.load(starts_ptr + level, mask=mask_n, other=0)
    p = param_row[:, None] * (L * K) + offs_n[None, :]
    mask_p = mask_r[:, None] & mask_n[None, :]
    loc_x = tl.zeros(p.shape, ACC)
    loc_y = tl.zeros(p.shape, ACC)
    weight = tl.zeros(p.shape, ACC)
    if LOAD_PARAMS:
        loc_x = tl.load(loc_ptr + 2 * p, mask=mask_p, other=0.0).to(ACC)
        loc_y = tl.load(loc_ptr + 2 * p + 1, mask=mask_p, other=0.0).to(ACC)
        weight = tl.load(attn_ptr + p, mask=mask_p, other=0.0).to(ACC)
    return p, mask_p, width[None, :], height[None, :], start[None, :], loc_x, loc_y, weight


@triton.jit
def _corner(base, start, row, col, width, inside, mask_p, offs_d, mask_d, stride_s,
            WIDE: tl.constexpr):
    """Element offsets (BLOCK_R, N_PAD, BLOCK_D) of one corner's value rows, and their mask
    (row in range, sample in range and inside its map, channel < D)."""
    if WIDE:
        s = start + (row * width + col).to(tl.int64)
    else:
        s = start.to(tl.int32) + row * width + col
    offsets = (base[:, None] + s * stride_s)[:, :, None] + offs_d[None, None, :]
    mask = (mask_p & inside)[:, :, None] & mask_d[None, None, :]
    return offsets, mask


@triton.jit
def _load_chunk(loc_ptr, attn_ptr, param_row, mask_r, first, L: tl.constexpr,
                K: tl.constexpr, N_PAD: tl.constexpr, CHUNK: tl.constexpr, ACC):
    """Locations and weights (BLOCK_R, N_PAD) of samples first .. first + CHUNK - 1."""
    offs_n = first + tl.arange(0, N_PAD)
    mask_n = (offs_n < first + CHUNK) & (offs_n < L * K)
    p = param_row[:, None] * (L * K) + offs_n[None, :]
    mask_p = mask_r[:, None] & mask_n[None, :]
    loc_x = tl.load(loc_ptr + 2 * p, mask=mask_p, other=0.0).to(ACC)
    loc_y = tl.load(loc_ptr + 2 * p + 1, mask=mask_p, other=0.0).to(ACC)
    weight = tl.load(attn_ptr + p, mask=mask_p, other=0.0).to(ACC)
    return loc_x, loc_y, weight


@triton.jit
def _forward_block(value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
                   stride_b, stride_s, stride_m, Q, M, D, ROWS, block,
                   first_x, first_y, first_weight,
                   L: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, N_PAD: tl.constexpr,
                   HEAD_MAJOR: tl.constexpr, WIDE: tl.constexpr, ACC):
    """out[rows of this block] = sum over samples of weight * bilinear(value); the first
    chunk's locations and weights come ready (loaded ahead by the caller)."""
    param_row, mask_r, base = _row_layout(block, ROWS, Q, M, stride_b, stride_m, BLOCK_R,
                                          HEAD_MAJOR, WIDE)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=ACC)
    for step in tl.static_range(0, L * K, CHUNK):
        p, mask_p, width, height, start, loc_x, loc_y, weight = _load_samples(
            shapes_ptr, starts_ptr, loc_ptr, attn_ptr, param_row, mask_r, step, L, K, N_PAD,
            CHUNK, ACC, step > 0)
        if step == 0:
            loc_x = first_x
            loc_y = first_y
            weight = first_weight
        x0, y0, dx, dy, in_x0, in_x1, in_y0, in_y1 = pixel_corners(loc_x, loc_y, width,
                                                                  height)
        off, msk = _corner(base, start, y0, x0, width, in_y0 & in_x0, mask_p, offs_d,
                           mask_d, stride_s, WIDE)
        v00 = tl.load(value_ptr + off, mask=msk, other=0.0).to(ACC)
        off, msk = _corner(base, start, y0, x0 + 1, width, in_y0 & in_x1, mask_p, offs_d,
                           mask_d, stride_s, WIDE)
        v01 = tl.load(value_ptr + off, mask=msk, other=0.0).to(ACC)
        off, msk = _corner(base, start, y0 + 1, x0, width, in_y1 & in_x0, mask_p, offs_d,
                           mask_d, stride_s, WIDE)
        v10 = tl.load(value_ptr + off, mask=msk, other=0.0).to(ACC)
        off, msk = _corner(base, start, y0 + 1, x0 + 1, width, in_y1 & in_x1, mask_p,
                           offs_d, mask_d, stride_s, WIDE)
        v11 = tl.load(value_ptr + off, mask=msk, other=0.0).to(ACC)
        a00 = (weight * (1 - dy) * (1 - dx))[:, :, None]
        a01 = (weight * (1 - dy) * dx)[:, :, None]
        a10 = (weight * dy * (1 - dx))[:, :, None]
        a11 = (weight * dy * dx)[:, :, None]
        acc += tl.sum(a00 * v00 + a01 * v01 + a10 * v10 + a11 * v11, axis=1)
    out_ptrs = out_ptr + (param_row * D)[:, None] + offs_d[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_r[:, None] & mask_d[None, :])


@triton.jit
def _msda_forward_rows_kernel(
    value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
    stride_b, stride_s, stride_m, Q, M, D, ROWS,
    L: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr, N_PAD: tl.constexpr, HEAD_MAJOR: tl.constexpr,
    WIDE: tl.constexpr, PERSISTENT: tl.constexpr,
):
    # fp64 arithmetic for fp64 tensors, fp32 for every other dtype
    ACC: tl.constexpr = tl.float64 if value_ptr.dtype.element_ty == tl.float64 else tl.float32
    pid = tl.program_id(0)
    param_row, mask_r, _ = _row_layout(pid, ROWS, Q, M, stride_b, stride_m, BLOCK_R,
                                       HEAD_MAJOR, WIDE)
    loc_x, loc_y, weight = _load_chunk(loc_ptr, attn_ptr, param_row, mask_r, 0, L, K, N_PAD,
                                       CHUNK, ACC)
    if PERSISTENT:
        # Blocks pid, pid + programs, ...: the next block's first locations and weights
        # are requested before the current block's corners are gathered.
        programs = tl.num_programs(0)
        for block in range(pid, tl.cdiv(ROWS, BLOCK_R), programs):
            param_row, mask_r, _ = _row_layout(block + programs, ROWS, Q, M, stride_b,
                                               stride_m, BLOCK_R, HEAD_MAJOR, WIDE)
            next_x, next_y, next_weight = _load_chunk(loc_ptr, attn_ptr, param_row, mask_r,
                                                      0, L, K, N_PAD, CHUNK, ACC)
            _forward_block(value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
                           stride_b, stride_s, stride_m, Q, M, D, ROWS, block,
                           loc_x, loc_y, weight, L, K, BLOCK_R, BLOCK_D, CHUNK, N_PAD,
                           HEAD_MAJOR, WIDE, ACC)
            loc_x = next_x
            loc_y = next_y
            weight = next_weight
    else:
        _forward_block(value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
                       stride_b, stride_s, stride_m, Q, M, D, ROWS, pid, loc_x, loc_y, weight,
                       L, K, BLOCK_R, BLOCK_D, CHUNK, N_PAD, HEAD_MAJOR, WIDE, ACC)


@triton.jit
def _dot_and_scatter(value_ptr, grad_value_ptr, offsets, mask, g3, scale, ACC):
    """One corner of every sample of the chunk: <g, v> per (row, sample), and scale * g
    added into grad_value's rows (atomics: other programs add into the same rows)."""
    v = tl.load(value_ptr + offsets, mask=mask, other=0.0).to(ACC)
    tl.atomic_add(grad_value_ptr + offsets,
                  (scale[:, :, None] * g3).to(grad_value_ptr.dtype.element_ty), mask=mask,
                  sem="relaxed")
    return tl.sum(g3 * v, axis=2)


@triton.jit
def _msda_backward_rows_kernel(
    grad_out_ptr, value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr,
    grad_value_ptr, grad_loc_ptr, grad_attn_ptr,
    stride_b, stride_s, stride_m, Q, M, D, ROWS,
    L: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr, N_PAD: tl.constexpr, HEAD_MAJOR: tl.constexpr,
    WIDE: tl.constexpr,
):
    # fp64 arithmetic for fp64 tensors, fp32 for every other dtype
    ACC: tl.constexpr = tl.float64 if value_ptr.dtype.element_ty == tl.float64 else tl.float32
    param_row, mask_r, base = _row_layout(tl.program_id(0), ROWS, Q, M, stride_b, stride_m,
                                          BLOCK_R, HEAD_MAJOR, WIDE)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    g = tl.load(grad_out_ptr + (param_row * D)[:, None] + offs_d[None, :],
                mask=mask_r[:, None] & mask_d[None, :], other=0.0).to(ACC)
    g3 = g[:, None, :]
    for step in tl.static_range(0, L * K, CHUNK):
        # The loads stay in this body rather than in a helper: torch.compile's analysis of
        # which arguments a kernel writes follows write addresses back through helper calls
        # to every pointer passed to them, and would take the parameters for outputs.
        offs_n = step + tl.arange(0, N_PAD)
        mask_n = (offs_n < step + CHUNK) & (offs_n < L * K)
        level = offs_n // K
        height = tl.load(shapes_ptr + 2 * level, mask=mask_n, other=1).to(tl.int32)[None, :]
        width = tl.load(shapes_ptr + 2 * level + 1, mask=mask_n, other=1).to(tl.int32)[None, :]
        start = tl.load(starts_ptr + level, mask=mask_n, other=0)[None, :]
        p = param_row[:, None] * (L * K) + offs_n[None, :]
        mask_p = mask_r[:, None] & mask_n[None, :]
        loc_x = tl.load(loc_ptr + 2 * p, mask=mask_p, other=0.0).to(ACC)
        loc_y = tl.load(loc_ptr + 2 * p + 1, mask=mask_p, other=0.0).to(ACC)
        weight = tl.load(attn_ptr + p, mask=mask_p, other=0.0).to(ACC)
        x0, y0, dx, dy, in_x0, in_x1, in_y0, in_y1 = pixel_corners(loc_x, loc_y, width,
                                                                  height)
        w00 = (1 - dy) * (1 - dx)
        w01 = (1 - dy) * dx
        w10 = dy * (1 - dx)
        w11 = dy * dx
        off, msk = _corner(base, start, y0, x0, width, in_y0 & in_x0, mask_p, offs_d, mask_d,
                           stride_s, WIDE)
        gv00 = _dot_and_scatter(value_ptr, grad_value_ptr, off, msk, g3, weight * w00, ACC)
        off, msk = _corner(base, start, y0, x0 + 1, width, in_y0 & in_x1, mask_p, offs_d,
                           mask_d, stride_s, WIDE)
        gv01 = _dot_and_scatter(value_ptr, grad_value_ptr, off, msk, g3, weight * w01, ACC)
        off, msk = _corner(base, start, y0 + 1, x0, width, in_y1 & in_x0, mask_p, offs_d,
                           mask_d, stride_s, WIDE)
        gv10 = _dot_and_scatter(value_ptr, grad_value_ptr, off, msk, g3, weight * w10, ACC)
        off, msk = _corner(base, start, y0 + 1, x0 + 1, width, in_y1 & in_x1, mask_p, offs_d,
                           mask_d, stride_s, WIDE)
        gv11 = _dot_and_scatter(value_ptr, grad_value_ptr, off, msk, g3, weight * w11, ACC)
        grad_weight = w00 * gv00 + w01 * gv01 + w10 * gv10 + w11 * gv11
        grad_x = weight * width * ((1 - dy) * (gv01 - gv00) + dy * (gv11 - gv10))
        grad_y = weight * height * ((1 - dx) * (gv10 - gv00) + dx * (gv11 - gv01))
        tl.store(grad_attn_ptr + p, grad_weight.to(grad_attn_ptr.dtype.element_ty),
                 mask=mask_p)
        tl.store(grad_loc_ptr + 2 * p, grad_x.to(grad_loc_ptr.dtype.element_ty), mask=mask_p)
        tl.store(grad_loc_ptr + 2 * p + 1, grad_y.to(grad_loc_ptr.dtype.element_ty),
                 mask=mask_p)
