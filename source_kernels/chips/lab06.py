"""Chips of lab 06 (make it fast): the narrow forward kernel and a small autotuner.

- ``msda_forward_narrow_kernel`` / ``msda_forward_narrow(...)``: the forward with the *narrow*
  mapping of lab 03's paper GPU: every lane of a program owns one query and the program walks
  the channels one at a time, so each gather instruction reads one element from each of
  ``BLOCK_Q`` different value rows (far apart in memory).  The course's kernel
  (``source_kernels.forward``, chip of lab 05) is the *wide* one: a (BLOCK_Q, BLOCK_D) tile
  whose lanes read neighbouring channels of one row.  Both compute the same numbers.
- ``tune(candidates, run, measure, expected, repeats=5)``: try every launch configuration,
  reject those whose output is wrong (or that fail), time the rest and keep the fastest median.

Import ``source_kernels`` before this module on a machine without a GPU; importing this
module does it for you.

Graded code may call these chips in no lab: they answer lab 06, and a graded function that
calls one fails its check (book/labs.md, the chips your graded code may call).
"""
from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl

import source_kernels  # noqa: F401  (the interpreter switch)

__all__ = ["msda_forward_narrow_kernel", "msda_forward_narrow", "tune"]


@triton.jit
def msda_forward_narrow_kernel(value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
                               S, Q, M, D, L: tl.constexpr, K: tl.constexpr,
                               BLOCK_Q: tl.constexpr, ACC_DTYPE: tl.constexpr):
    pid_q = tl.program_id(0)                        # which block of queries
    pid_bm = tl.program_id(1)                       # which (batch, head)
    b = pid_bm // M
    m = pid_bm % M
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < Q
    bqm = (b.to(tl.int64) * Q + offs_q) * M + m     # (BLOCK_Q,) row of (b, q, m)
    value_bm = value_ptr + (b.to(tl.int64) * S * M + m) * D
    for d in range(D):                              # the program walks the channels
        acc = tl.zeros((BLOCK_Q,), dtype=ACC_DTYPE)
        for l in tl.static_range(L):
            height = tl.load(shapes_ptr + 2 * l).to(tl.int32)
            width = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)
            start = tl.load(starts_ptr + l)
            for k in tl.static_range(K):
                p = bqm * (L * K) + (l * K + k)
                x_im = tl.load(loc_ptr + 2 * p, mask=mask_q, other=0.0).to(ACC_DTYPE) * width - 0.5
                y_im = tl.load(loc_ptr + 2 * p + 1, mask=mask_q, other=0.0).to(ACC_DTYPE) * height - 0.5
                a = tl.load(attn_ptr + p, mask=mask_q, other=0.0).to(ACC_DTYPE)
                x0f = tl.floor(x_im)
                y0f = tl.floor(y_im)
                dx = x_im - x0f
                dy = y_im - y0f
                x0 = tl.minimum(tl.maximum(x0f, -2.0), width + 1.0).to(tl.int32)
                y0 = tl.minimum(tl.maximum(y0f, -2.0), height + 1.0).to(tl.int32)
                for corner in tl.static_range(4):
                    row = y0 + corner // 2
                    col = x0 + corner % 2
                    w = (dy if corner // 2 == 1 else 1 - dy) * (dx if corner % 2 == 1 else 1 - dx)
                    inside = mask_q & (row >= 0) & (row < height) & (col >= 0) & (col < width)
                    s = start + (row * width + col).to(tl.int64)
                    # one element per lane, from BLOCK_Q different rows: the narrow gather
                    v = tl.load(value_bm + s * (M * D) + d, mask=inside, other=0.0).to(ACC_DTYPE)
                    acc += a * w * v
        tl.store(out_ptr + bqm * D + d, acc.to(out_ptr.dtype.element_ty), mask=mask_q)


def msda_forward_narrow(value, spatial_shapes, level_start_index, sampling_locations,
                        attention_weights, block_q=32, num_warps=4):
    """The forward through ``msda_forward_narrow_kernel``.  Arguments as the operator's
    (value (B, S, M, D); spatial_shapes (L, 2) int64; level_start_index (L,) int64;
    sampling_locations (B, Q, M, L, K, 2); attention_weights (B, Q, M, L, K)), one device and
    floating dtype.  Returns (B, Q, M*D) in the dtype of value."""
    value = value.contiguous()
    sampling_locations = sampling_locations.contiguous()
    attention_weights = attention_weights.contiguous()
    batch, total, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    out = value.new_empty(batch, queries, heads * channels)
    if out.numel() == 0:
        return out
    acc = tl.float64 if value.dtype == torch.float64 else tl.float32
    grid = (triton.cdiv(queries, block_q), batch * heads)
    msda_forward_narrow_kernel[grid](
        value, spatial_shapes.to(torch.int64).contiguous(),
        level_start_index.to(torch.int64).contiguous(), sampling_locations, attention_weights,
        out, total, queries, heads, channels, L=levels, K=points, BLOCK_Q=block_q,
        ACC_DTYPE=acc, num_warps=num_warps)
    return out


def tune(candidates, run, measure, expected, repeats=5, atol=1e-5, rtol=1e-5):
    """A minimal autotuner.

    candidates  list of launch configurations (any hashable values, e.g. (block_q, num_warps))
    run         run(config) -> output tensor; the first call of a config also compiles it
    measure     measure(config) -> seconds taken by one call (already compiled)
    expected    the correct output tensor
    Returns (best, medians): medians[config] is the median of ``repeats`` measurements, or
    None for a config whose run raised or whose output differs from ``expected``
    (torch.allclose with atol, rtol; shape and dtype must match).  best is the config with the
    smallest median (the earliest in ``candidates`` on a tie).  Raises RuntimeError when no
    config is correct.
    """
    medians = {}
    for config in candidates:
        try:
            out = run(config)                        # warm-up: compiles, and gives the output
        except Exception:                            # noqa: BLE001  (e.g. out of resources)
            medians[config] = None
            continue
        if (not isinstance(out, torch.Tensor) or out.shape != expected.shape
                or out.dtype != expected.dtype
                or not torch.allclose(out, expected, atol=atol, rtol=rtol)):
            medians[config] = None                   # fast but wrong never wins
            continue
        medians[config] = statistics.median(measure(config) for _ in range(repeats))
    timed = [(t, i, c) for i, (c, t) in enumerate(medians.items()) if t is not None]
    if not timed:
        raise RuntimeError("no candidate configuration produced the expected output")
    best = min(timed)[2]
    return best, medians
