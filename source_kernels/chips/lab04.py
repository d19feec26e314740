"""Chips of lab 04 (hello Triton): four small kernels, each with its host wrapper.

Import ``source_kernels`` before this module on a machine without a GPU: it switches Triton
to its CPU interpreter, which has to happen before ``@triton.jit`` runs.

Graded code may call these chips in lab 05 (``bilinear_sample_triton``) only; in lab 04 itself
and in every other lab a graded function that calls one fails its check (book/labs.md, the
chips your graded code may call).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import source_kernels  # noqa: F401  (the interpreter switch)

__all__ = ["add_kernel", "vector_add", "copy_tile_kernel", "copy_2d", "gather_rows_kernel",
           "gather_rows", "bilinear_kernel", "bilinear_sample_triton"]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)                          # which block of BLOCK elements
    offs = pid * BLOCK + tl.arange(0, BLOCK)        # the element indices of this block
    mask = offs < n                                 # the last block may stick out
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def vector_add(x, y, block=128):
    """x, y: (N,) tensors of one dtype and device.  Returns x + y, computed by add_kernel."""
    assert x.shape == y.shape and x.dim() == 1
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), block),)
    add_kernel[grid](x, y, out, x.numel(), BLOCK=block)
    return out


@triton.jit
def copy_tile_kernel(src_ptr, dst_ptr, rows, cols,
                     src_stride_r, src_stride_c, dst_stride_r, dst_stride_c,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_r = tl.program_id(0)                        # which tile row
    pid_c = tl.program_id(1)                        # which tile column
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r < rows)[:, None] & (offs_c < cols)[None, :]
    # element (r, c) of a strided 2-D tensor sits at r * stride_r + c * stride_c
    src = src_ptr + offs_r[:, None] * src_stride_r + offs_c[None, :] * src_stride_c
    dst = dst_ptr + offs_r[:, None] * dst_stride_r + offs_c[None, :] * dst_stride_c
    tl.store(dst, tl.load(src, mask=mask), mask=mask)


def copy_2d(src, block_r=16, block_c=16):
    """src: (R, C) tensor with any strides (a transposed view, a slice).  Returns a
    contiguous (R, C) copy, made by copy_tile_kernel."""
    assert src.dim() == 2
    rows, cols = src.shape
    dst = torch.empty((rows, cols), dtype=src.dtype, device=src.device)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    copy_tile_kernel[grid](src, dst, rows, cols, src.stride(0), src.stride(1),
                           dst.stride(0), dst.stride(1), BLOCK_R=block_r, BLOCK_C=block_c)
    return dst


@triton.jit
def gather_rows_kernel(table_ptr, index_ptr, out_ptr, n_index, n_rows, D,
                       BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    offs_i = pid * BLOCK_I + tl.arange(0, BLOCK_I)  # which output rows
    mask_i = offs_i < n_index
    offs_d = tl.arange(0, BLOCK_D)                  # channels: the fast axis (wide)
    mask_d = offs_d < D
    idx = tl.load(index_ptr + offs_i, mask=mask_i, other=-1)       # int64 row numbers
    valid = mask_i & (idx >= 0) & (idx < n_rows)    # out-of-range rows read as zero
    src = table_ptr + idx[:, None] * D + offs_d[None, :]
    rows = tl.load(src, mask=valid[:, None] & mask_d[None, :], other=0.0)
    dst = out_ptr + offs_i[:, None] * D + offs_d[None, :]
    tl.store(dst, rows, mask=mask_i[:, None] & mask_d[None, :])


def gather_rows(table, index, block_i=16):
    """table: (R, D) contiguous; index: (N,) int64.  Returns (N, D): row index[i] of table,
    or zeros where index[i] is outside [0, R)."""
    table = table.contiguous()
    index = index.to(torch.int64).contiguous()
    n_rows, channels = table.shape
    out = torch.empty((index.numel(), channels), dtype=table.dtype, device=table.device)
    grid = (triton.cdiv(index.numel(), block_i),)
    gather_rows_kernel[grid](table, index, out, index.numel(), n_rows, channels,
                             BLOCK_I=block_i, BLOCK_D=triton.next_power_of_2(channels))
    return out


@triton.jit
def bilinear_kernel(image_ptr, loc_ptr, out_ptr, N, H, W, D,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # which sampling points
    mask_n = offs_n < N
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    loc_x = tl.load(loc_ptr + 2 * offs_n, mask=mask_n, other=0.0).to(tl.float32)
    loc_y = tl.load(loc_ptr + 2 * offs_n + 1, mask=mask_n, other=0.0).to(tl.float32)
    x_im = loc_x * W - 0.5                          # align_corners=False
    y_im = loc_y * H - 0.5
    x0f = tl.floor(x_im)
    y0f = tl.floor(y_im)
    dx = x_im - x0f
    dy = y_im - y0f
    # clamp to [-2, size + 1] before the int cast, so that a location far outside cannot
    # overflow int32; comparisons, as lab 05 teaches: a NaN fails both tests and becomes -2
    # (tl.maximum/tl.minimum let NaN through in the interpreter)
    x0f = tl.where(x0f > -2.0, x0f, -2.0)
    x0f = tl.where(x0f < W + 1.0, x0f, W + 1.0)
    y0f = tl.where(y0f > -2.0, y0f, -2.0)
    y0f = tl.where(y0f < H + 1.0, y0f, H + 1.0)
    x0 = x0f.to(tl.int32)
    y0 = y0f.to(tl.int32)
    acc = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    for corner in tl.static_range(4):
        row = y0 + corner // 2                      # corners (y0,x0) (y0,x1) (y1,x0) (y1,x1)
        col = x0 + corner % 2
        wy = dy if corner // 2 == 1 else 1 - dy
        wx = dx if corner % 2 == 1 else 1 - dx
        inside = mask_n & (row >= 0) & (row < H) & (col >= 0) & (col < W)
        ptrs = image_ptr + ((row * W + col).to(tl.int64) * D)[:, None] + offs_d[None, :]
        v = tl.load(ptrs, mask=inside[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        acc += (wy * wx)[:, None] * v
    dst = out_ptr + (offs_n * D)[:, None] + offs_d[None, :]
    tl.store(dst, acc, mask=mask_n[:, None] & mask_d[None, :])


def bilinear_sample_triton(image, locations, block_n=16):
    """image: (H, W, D) float; locations: (N, 2) float, (x, y) in [0, 1].  Returns (N, D)
    float32: the bilinear samples (zero padding, align_corners=False)."""
    image = image.contiguous()
    locations = locations.contiguous()
    height, width, channels = image.shape
    n = locations.shape[0]
    out = torch.empty((n, channels), dtype=torch.float32, device=image.device)
    grid = (triton.cdiv(n, block_n),)
    bilinear_kernel[grid](image, locations, out, n, height, width, channels,
                          BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(channels))
    return out
