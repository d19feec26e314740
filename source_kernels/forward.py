"""The MSDA forward: the loop kernel, its host wrapper and the launch plan.

One program of the loop kernel computes BLOCK_Q queries of one (batch, head) pair over all
D channels:

    out[b, q, m, :] = sum over levels l and points k of
                      attn[b, q, m, l, k] * bilinear(value[b, level l, m, :], loc[b, q, m, l, k])

The tile in registers is (BLOCK_Q, BLOCK_D) with channels the fast axis, so every corner
gather reads D contiguous elements of one value row (wide over channels: full sectors).
Locations and weights come through their own pointers, levels and points are unrolled with
``tl.static_range``, arithmetic is in fp32 (fp64 for fp64 inputs) whatever the input dtype,
and every flat offset that can pass 2**31 is computed in int64.

``msda_forward`` launches this kernel or the sample-tiled one of ``tiled.py``, as
``FORWARD_PLAN`` says for the call's regime (``regime``: small calls are bound by the latency
of their programs, large ones by the rate of gathers) and element size.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch, next_power_of_2
from .sampling import corner_tile, pixel_corners
from .tiled import _msda_forward_tiled_kernel

__all__ = ["msda_forward", "forward_config", "_msda_forward_kernel"]


@triton.jit
def _msda_forward_kernel(
    value_ptr,            # (B, S, M, D), channels contiguous (any other strides)
    shapes_ptr,           # (L, 2) int64: (H, W) per level
    starts_ptr,           # (L,) int64: first row of each level inside S
    loc_ptr,              # (B, Q, M, L, K, 2) contiguous, (x, y) in [0, 1]
    attn_ptr,             # (B, Q, M, L, K) contiguous
    out_ptr,              # (B, Q, M, D) contiguous == (B, Q, M*D)
    stride_b, stride_s, stride_m,   # value's strides in elements (channels: stride 1)
    Q, M, D,
    L: tl.constexpr, K: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, ACC_DTYPE: tl.constexpr,
):
    pid_q = tl.program_id(0)                       # which block of queries
    pid_bm = tl.program_id(1)                      # which (batch, head) pair
    b = pid_bm // M
    m = pid_bm % M

    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)   # query indices of this block
    mask_q = offs_q < Q
    offs_d = tl.arange(0, BLOCK_D)                     # channel indices (the fast axis)
    mask_d = offs_d < D

    # Row index of (b, q, m) in the (B, Q, M) grid of the parameters, in int64:
    # B*Q*M*L*K*2 passes 2**31 well before any single tensor is unusually large.
    bqm = (b.to(tl.int64) * Q + offs_q) * M + m        # (BLOCK_Q,)
    param_row = bqm * (L * K)                          # first (l, k) entry of each query
    # value[b, s, m, d] lives at b*stride_b + s*stride_s + m*stride_m + d
    value_bm = value_ptr + b.to(tl.int64) * stride_b + m.to(tl.int64) * stride_m

    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC_DTYPE)
    for l in tl.static_range(L):
        height = tl.load(shapes_ptr + 2 * l).to(tl.int32)
        width = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)
        start = tl.load(starts_ptr + l)                # int64
        for k in tl.static_range(K):
            p = param_row + (l * K + k)
            # Normalised location -> pixel coordinate (align_corners=False): x * W - 0.5
            loc_x = tl.load(loc_ptr + 2 * p, mask=mask_q, other=0.0).to(ACC_DTYPE)
            loc_y = tl.load(loc_ptr + 2 * p + 1, mask=mask_q, other=0.0).to(ACC_DTYPE)
            weight = tl.load(attn_ptr + p, mask=mask_q, other=0.0).to(ACC_DTYPE)
            x0, y0, dx, dy, in_x0, in_x1, in_y0, in_y1 = pixel_corners(loc_x, loc_y,
                                                                      width, height)
            # The four corners, each a (BLOCK_Q, BLOCK_D) gather of whole value rows.
            off, msk = corner_tile(start, y0, x0, width, in_y0 & in_x0, mask_q, offs_d,
                                   mask_d, stride_s)
            v00 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)
            off, msk = corner_tile(start, y0, x0 + 1, width, in_y0 & in_x1, mask_q, offs_d,
                                   mask_d, stride_s)
            v01 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)
            off, msk = corner_tile(start, y0 + 1, x0, width, in_y1 & in_x0, mask_q, offs_d,
                                   mask_d, stride_s)
            v10 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)
            off, msk = corner_tile(start, y0 + 1, x0 + 1, width, in_y1 & in_x1, mask_q,
                                   offs_d, mask_d, stride_s)
            v11 = tl.load(value_bm + off, mask=msk, other=0.0).to(ACC_DTYPE)
            # Bilinear blend, scaled by the attention weight.
            w00 = (1 - dy) * (1 - dx)
            w01 = (1 - dy) * dx
            w10 = dy * (1 - dx)
            w11 = dy * dx
            acc += weight[:, None] * (w00[:, None] * v00 + w01[:, None] * v01
                                      + w10[:, None] * v10 + w11[:, None] * v11)

    out_ptrs = out_ptr + (bqm * D)[:, None] + offs_d[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=mask_q[:, None] & mask_d[None, :])


def forward_config(channels: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK_Q, num_warps) of the loop kernel for a caller who names a kernel or a warp count
    but no BLOCK_Q (with neither, FORWARD_PLAN decides): 1024 // BLOCK_D queries, clamped to
    between 16 and 32, on 4 warps.  The tile holds at most 1024 accumulators up to D = 64, and
    16 * BLOCK_D above, where the floor of 16 queries wins.  On the first H200 sweep
    (results/sweep_first_look_h200.json, bf16, D = 32), 32 queries on 4 warps was fastest on
    the decoder preset and within 1% of the fastest on the encoder."""
    block_d = next_power_of_2(max(channels, 1))
    block_q = max(16, min(32, 1024 // block_d))
    return block_q, 4


# Launch plan for the operator, chosen by the H200 sweep that source_kernels.bench records in
# results/sweep_h200.json ("plan"): (kernel, BLOCK_Q, num_warps) per regime and element size.
# "loop" is _msda_forward_kernel above (samples one after another); "tiled" is
# tiled._msda_forward_tiled_kernel (all samples of a query in one tile).  Small problems are
# bound by memory latency, large ones by the rate of gathers.
FORWARD_PLAN = {
    ("small", 2): ("tiled", 1, 1), ("small", 4): ("tiled", 1, 1),
    ("large", 2): ("loop", 16, 2), ("large", 4): ("loop", 16, 4),
}
LARGE_ROWS = 2 ** 17          # B*Q*M above which a call counts as "large"


def regime(batch: int, queries: int, heads: int) -> str:
    """The launch plans' key: "large" for a call of more than LARGE_ROWS output rows
    (batch * queries * heads), "small" otherwise."""
    return "large" if batch * queries * heads > LARGE_ROWS else "small"


def head_major(value: torch.Tensor) -> torch.Tensor:
    """A (B, S, M, D) view of a head-major (B, M, S, D) copy of value: neighbouring pixels of
    one head become neighbouring rows, so a corner pair (x0, x1) sits in one 128-byte line."""
    return value.transpose(1, 2).contiguous().transpose(1, 2)


def msda_forward(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights, *, block_q=None, num_warps=None, kernel=None):
    """Launch the forward kernel on validated inputs.

    value (B, S, M, D) with contiguous channels (any other strides: pass ``head_major(value)``
    for the head-major layout); spatial_shapes (L, 2) int64; level_start_index (L,) int64;
    sampling_locations (B, Q, M, L, K, 2) and attention_weights (B, Q, M, L, K) contiguous;
    all on one device, value/locations/weights in one floating dtype.  Returns (B, Q, M*D).
    ``kernel`` is "loop" or "tiled"; with neither it nor ``block_q`` given, FORWARD_PLAN
    decides; with only ``block_q`` given, the loop kernel runs with it.
    """
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    out = value.new_empty(batch, queries, heads * channels)
    if out.numel() == 0:
        return out
    if value.stride(3) != 1:
        value = value.contiguous()
    if kernel is None and block_q is None:
        kernel, block_q, planned_warps = FORWARD_PLAN[(regime(batch, queries, heads),
                                                        min(value.element_size(), 4))]
        num_warps = num_warps or planned_warps
    kernel = kernel or "loop"
    cfg_q, cfg_warps = forward_config(channels, value.dtype)
    block_q = block_q or cfg_q
    num_warps = num_warps or cfg_warps
    args = (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            out, value.stride(0), value.stride(1), value.stride(2), queries, heads, channels)
    launch_variant(kernel, _msda_forward_kernel, _msda_forward_tiled_kernel, args,
                   value.dtype, batch, heads, queries, channels, levels, points, block_q,
                   num_warps)
    return out


def launch_variant(kernel, loop_kernel, tiled_kernel, args, dtype, batch, heads, queries,
                   channels, levels, points, block_q, num_warps):
    """Launch the "loop" or the "tiled" kernel of a pair (forward or backward) on a grid of
    (query blocks, batch * heads), with the compile-time sizes both take (the tiled one also
    the L*K sample axis padded to a power of two) and fp32 arithmetic (fp64 for fp64)."""
    grid = (cdiv(queries, block_q), batch * heads)
    constexprs = dict(L=levels, K=points, BLOCK_Q=block_q, BLOCK_D=next_power_of_2(channels),
                      ACC_DTYPE=tl.float64 if dtype == torch.float64 else tl.float32)
    if kernel == "tiled":
        constexprs["LK_PAD"] = next_power_of_2(levels * points)
        launch(tiled_kernel, grid, args, constexprs, num_warps)
    elif kernel == "loop":
        launch(loop_kernel, grid, args, constexprs, num_warps)
    else:
        raise ValueError(f"kernel must be 'loop' or 'tiled', got {kernel!r}")
