"""The MSDA backward kernel and its host wrapper: all three gradients in one pass.

For one sample (query q, head m, level l, point k) with weight a, location (x, y) and
corners c of bilinear weight w_c, the forward adds ``a * sum_c w_c * v_c`` to the output.
With g = grad_out[b, q, m, :] the chain rule gives (channel sums written as <., .>):

    grad_attn[q, m, l, k] = <g, sum_c w_c v_c>
    grad_value[corner c] += a * w_c * g                       (scattered: atomics)
    grad_x = a * W * <g, (1-dy)(v01 - v00) + dy (v11 - v10)>   (through x_im = x*W - 0.5)
    grad_y = a * H * <g, (1-dx)(v10 - v00) + dx (v11 - v01)>   (through y_im = y*H - 0.5)

Many queries sample the same value rows, so grad_value is accumulated with
``tl.atomic_add``.  bf16 atomics are native only from sm_90 (Hopper); before that they lower
to a compare-and-swap loop, so bf16 defaults to an fp32 accumulation buffer there
(``fp32_grad_accum``), converted to bf16 at the end.

This module holds the loop kernel (samples one after another); ``tiled.py`` holds the
sample-tiled one.  ``msda_backward`` launches the one ``BACKWARD_PLAN`` names for the call's
regime (``forward.regime``) and element size.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .forward import choose_launch, variant_launch
from .launch import interpreting, launch
from .sampling import corner_tile, pixel_corners
from .tiled import _msda_backward_tiled_kernel

__all__ = ["msda_backward", "default_fp32_grad_accum", "BWD_BLOCK_Q", "BWD_NUM_WARPS",
           "_msda_backward_kernel"]

# Fixed launch configuration of the loop kernel: on the first H200 sweep
# (results/sweep_first_look_h200.json, bf16, uniform locations) 16 queries on 4 warps was the
# fastest of nine on both the decoder (52 us) and the encoder preset (719 us).
# Why not @triton.autotune: the autotuner times each candidate by running the kernel several
# times on the real arguments, and every run *adds* into grad_value with atomics, so the
# result would hold the sum of all the trial runs.  Restoring the buffers between trials
# (reset_to_zero / restore_value) doubles the memory traffic of every timing and still
# measures contention of a zeroed buffer rather than of the real call; a one-off sweep gives
# the same answer without any of this, and keeps the first call free of a tuning pause.
BWD_BLOCK_Q = 16
BWD_NUM_WARPS = 4
# The operator's plan per regime and element size (see forward.FORWARD_PLAN): (kernel,
# BLOCK_Q, num_warps), fixed from the same sweep.
BACKWARD_PLAN = {
    ("small", 2): ("rows", 4, 4), ("small", 4): ("rows", 2, 1), ("small", 8): ("tiled", 1, 2),
    ("medium", 2): ("rows", 4, 4), ("medium", 4): ("rows", 2, 1), ("medium", 8): ("rows", 4, 4),
    ("large", 2): ("tiled", 1, 1), ("large", 4): ("tiled", 1, 2), ("large", 8): ("rows", 2, 2),
}


@triton.jit
def _msda_backward_kernel(
    grad_out_ptr,         # (B, Q, M, D) contiguous
    value_ptr,            # (B, S, M, D), channels contiguous (any other strides)
    shapes_ptr,           # (L, 2) int64
    starts_ptr,           # (L,) int64
    loc_ptr,              # (B, Q, M, L, K, 2) contiguous
    attn_ptr,             # (B, Q, M, L, K) contiguous
    grad_value_ptr,       # value's layout; value's dtype, or fp32 when accumulating in fp32
    grad_loc_ptr,         # (B, Q, M, L, K, 2), written once per element
    grad_attn_ptr,        # (B, Q, M, L, K), written once per element
    stride_b, stride_s, stride_m,   # value's strides in elements (channels: stride 1)
    Q, M, D,
    L: tl.constexpr, K: tl.constexpr,
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
    tile_mask = mask_q[:, None] & mask_d[None, :]

    bqm = (b.to(tl.int64) * Q + offs_q) * M + m
    param_row = bqm * (L * K)
    # value and grad_value share one layout: b*stride_b + s*stride_s + m*stride_m + d
    bm_offset = b.to(tl.int64) * stride_b + m.to(tl.int64) * stride_m
    value_bm = value_ptr + bm_offset
    grad_value_bm = grad_value_ptr + bm_offset

    # The upstream gradient of this tile, read once and reused for every sample.
    g = tl.load(grad_out_ptr + (bqm * D)[:, None] + offs_d[None, :], mask=tile_mask,
                other=0.0).to(ACC_DTYPE)

    for l in tl.static_range(L):
        height = tl.load(shapes_ptr + 2 * l).to(tl.int32)
        width = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)
        start = tl.load(starts_ptr + l)
        for k in tl.static_range(K):
            p = param_row + (l * K + k)
            loc_x = tl.load(loc_ptr + 2 * p, mask=mask_q, other=0.0).to(ACC_DTYPE)
            loc_y = tl.load(loc_ptr + 2 * p + 1, mask=mask_q, other=0.0).to(ACC_DTYPE)
            weight = tl.load(attn_ptr + p, mask=mask_q, other=0.0).to(ACC_DTYPE)
            x0, y0, dx, dy, in_x0, in_x1, in_y0, in_y1 = pixel_corners(loc_x, loc_y,
                                                                      width, height)
            w00 = (1 - dy) * (1 - dx)
            w01 = (1 - dy) * dx
            w10 = dy * (1 - dx)
            w11 = dy * dx
            # Per corner: gather v_c, take <g, v_c>, scatter a * w_c * g into grad_value.
            off, msk = corner_tile(start, y0, x0, width, in_y0 & in_x0, mask_q, offs_d,
                                   mask_d, stride_s)
            gv00 = _gather_dot_scatter(value_bm, grad_value_bm, off, msk, g, weight * w00,
                                       ACC_DTYPE)
            off, msk = corner_tile(start, y0, x0 + 1, width, in_y0 & in_x1, mask_q, offs_d,
                                   mask_d, stride_s)
            gv01 = _gather_dot_scatter(value_bm, grad_value_bm, off, msk, g, weight * w01,
                                       ACC_DTYPE)
            off, msk = corner_tile(start, y0 + 1, x0, width, in_y1 & in_x0, mask_q, offs_d,
                                   mask_d, stride_s)
            gv10 = _gather_dot_scatter(value_bm, grad_value_bm, off, msk, g, weight * w10,
                                       ACC_DTYPE)
            off, msk = corner_tile(start, y0 + 1, x0 + 1, width, in_y1 & in_x1, mask_q,
                                   offs_d, mask_d, stride_s)
            gv11 = _gather_dot_scatter(value_bm, grad_value_bm, off, msk, g, weight * w11,
                                       ACC_DTYPE)

            grad_weight = w00 * gv00 + w01 * gv01 + w10 * gv10 + w11 * gv11
            grad_x = weight * width * ((1 - dy) * (gv01 - gv00) + dy * (gv11 - gv10))
            grad_y = weight * height * ((1 - dx) * (gv10 - gv00) + dx * (gv11 - gv01))
            tl.store(grad_attn_ptr + p, grad_weight.to(grad_attn_ptr.dtype.element_ty),
                     mask=mask_q)
            tl.store(grad_loc_ptr + 2 * p, grad_x.to(grad_loc_ptr.dtype.element_ty),
                     mask=mask_q)
            tl.store(grad_loc_ptr + 2 * p + 1, grad_y.to(grad_loc_ptr.dtype.element_ty),
                     mask=mask_q)


@triton.jit
def _gather_dot_scatter(value_bm, grad_value_bm, offsets, mask, g, scale, ACC_DTYPE):
    """Read one corner's value rows, return <g, v> per query, and atomically add
    scale * g into the same rows of grad_value (in grad_value's own dtype)."""
    v = tl.load(value_bm + offsets, mask=mask, other=0.0).to(ACC_DTYPE)
    contribution = scale[:, None] * g
    tl.atomic_add(grad_value_bm + offsets,
                  contribution.to(grad_value_bm.dtype.element_ty), mask=mask, sem="relaxed")
    return tl.sum(g * v, axis=1)


_interpreting = interpreting
_capabilities: dict = {}


def default_fp32_grad_accum(dtype: torch.dtype, device) -> bool:
    """Whether grad_value is accumulated in an fp32 buffer by default.

    On for bf16 where there is no native bf16 atomic add: GPUs older than sm_90, and the
    CPU interpreter (which rejects bf16 atomics).  Off otherwise: fp32/fp64 need no buffer,
    fp16 atomics are native from sm_70, bf16 ones from sm_90.
    """
    if dtype != torch.bfloat16:
        return False
    device = torch.device(device)
    if device.type != "cuda" or interpreting():
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _capabilities:
        _capabilities[index] = torch.cuda.get_device_capability(index)
    return _capabilities[index][0] < 9


def grad_value_buffer(value, fp32_grad_accum):
    """A zeroed buffer for grad_value in value's own layout (the strides the kernel indexes
    both with), in fp32 when ``fp32_grad_accum`` and value is 16-bit."""
    accum_dtype = torch.float32 if (fp32_grad_accum and value.dtype in
                                    (torch.float16, torch.bfloat16)) else value.dtype
    if value.is_contiguous():
        return torch.zeros(value.shape, dtype=accum_dtype, device=value.device)
    order = sorted(range(4), key=lambda axis: -value.stride(axis))
    return torch.zeros([value.shape[a] for a in order], dtype=accum_dtype,
                       device=value.device).permute(*[order.index(a) for a in range(4)])


def backward_launch(kernel, block_q, grad_output, value, spatial_shapes, level_start_index,
                    sampling_locations, attention_weights, grad_value, grad_loc, grad_attn):
    """(kernel function, grid, runtime arguments, compile-time arguments) of one backward
    launch of the named variant (see ``forward.forward_launch``)."""
    from .rows import _msda_backward_rows_kernel
    tensors = (grad_output, value, spatial_shapes, level_start_index, sampling_locations,
               attention_weights, grad_value, grad_loc, grad_attn)
    return variant_launch(kernel, (_msda_backward_kernel, _msda_backward_tiled_kernel,
                                   _msda_backward_rows_kernel), tensors, value,
                          sampling_locations, block_q)


def msda_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                  attention_weights, *, fp32_grad_accum=None, block_q=None,
                  num_warps=None, kernel=None, launcher=launch):
    """Launch the backward kernel on validated inputs.

    grad_output (B, Q, M*D) and the forward's inputs (value with contiguous channels and any
    other strides; grad_value is accumulated in value's layout).  Returns (grad_value
    (B, S, M, D) contiguous, grad_sampling_locations (B, Q, M, L, K, 2),
    grad_attention_weights (B, Q, M, L, K)), each in the dtype of its input.
    ``fp32_grad_accum`` (default: ``default_fp32_grad_accum``) accumulates grad_value in an
    fp32 buffer instead of the value's dtype.  ``kernel`` ("loop", "tiled" or a "rows"
    variant), ``block_q`` and ``num_warps`` as for ``forward.msda_forward``: the loop kernel
    defaults to (BWD_BLOCK_Q, BWD_NUM_WARPS); with nothing given, BACKWARD_PLAN decides;
    ``launcher`` as for ``forward.msda_forward``.
    """
    if fp32_grad_accum is None:
        fp32_grad_accum = default_fp32_grad_accum(value.dtype, value.device)
    if value.dtype == torch.bfloat16 and interpreting() and not fp32_grad_accum:
        raise ValueError("fp32_grad_accum=False with bf16 needs a GPU: Triton's interpreter "
                         "has no bf16 atomic add")
    if value.stride(3) != 1:
        value = value.contiguous()
    grad_value = grad_value_buffer(value, fp32_grad_accum)
    grad_loc = torch.empty_like(sampling_locations)
    grad_attn = torch.empty_like(attention_weights)
    kernel, block_q, num_warps = choose_launch(
        BACKWARD_PLAN, value, sampling_locations.shape[1], kernel, block_q, num_warps,
        BWD_BLOCK_Q, BWD_NUM_WARPS)
    if grad_attn.numel() > 0 and value.numel() > 0:
        fn, grid, args, constexprs = backward_launch(
            kernel, block_q, grad_output.contiguous(), value, spatial_shapes,
            level_start_index, sampling_locations, attention_weights, grad_value, grad_loc,
            grad_attn)
        launcher(fn, grid, args, constexprs, num_warps)
    elif grad_attn.numel() > 0:
        grad_loc.zero_()
        grad_attn.zero_()
    if grad_value.dtype != value.dtype:
        grad_value = grad_value.to(value.dtype)
    if not grad_value.is_contiguous():
        grad_value = grad_value.contiguous()
    return grad_value, grad_loc, grad_attn
