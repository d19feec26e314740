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
# tiled._msda_forward_tiled_kernel (all samples of a query in one tile); "rows..." are the
# row-blocked kernels of rows.py (see ``rows_options``), whose BLOCK_Q counts rows of the flat
# (batch, query, head) axis.  Small problems are bound by memory latency, large ones by the
# rate of gathers.
FORWARD_PLAN = {
    ("small", 2): ("tiled", 1, 1), ("small", 4): ("rows", 2, 1), ("small", 8): ("loop", 16, 4),
    ("medium", 2): ("tiled", 1, 1), ("medium", 4): ("rows", 2, 1), ("medium", 8): ("loop", 16, 4),
    ("large", 2): ("rows-sample-hm", 32, 4), ("large", 4): ("rows-sample-hm", 16, 2), ("large", 8): ("loop", 8, 4),
}
SMALL_ROWS = 2 ** 14          # B*Q*M up to which a call counts as "small" (the decoder's 9,600)
LARGE_ROWS = 2 ** 17          # B*Q*M above which a call counts as "large"


def regime(batch: int, queries: int, heads: int) -> str:
    """"small" (a decoder), "medium" (a decoder with a large batch) or "large" (an encoder):
    by the number B*Q*M of (batch, query, head) rows."""
    rows = batch * queries * heads
    return "large" if rows > LARGE_ROWS else "medium" if rows > SMALL_ROWS else "small"


def planned(plan: dict, batch: int, queries: int, heads: int, element_size: int):
    """The (kernel, BLOCK_Q, num_warps) a plan gives a problem; an element size the plan
    has no entry for takes the entry of the next smaller one (fp64 that of fp32)."""
    size = element_size
    name = regime(batch, queries, heads)
    if not any(r == name for r, _ in plan):
        name = "small"                       # a plan without this regime: the small one's
    while (name, size) not in plan and size > 1:
        size //= 2
    return plan[(name, size)]


def head_major(value: torch.Tensor) -> torch.Tensor:
    """A (B, S, M, D) view of a head-major (B, M, S, D) copy of value: neighbouring pixels of
    one head become neighbouring rows, so a corner pair (x0, x1) sits in one 128-byte line."""
    return value.transpose(1, 2).contiguous().transpose(1, 2)


def msda_forward(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights, *, block_q=None, num_warps=None, kernel=None,
                 launcher=launch):
    """Launch the forward kernel on validated inputs.

    value (B, S, M, D) with contiguous channels (any other strides: pass ``head_major(value)``
    for the head-major layout); spatial_shapes (L, 2) int64; level_start_index (L,) int64;
    sampling_locations (B, Q, M, L, K, 2) and attention_weights (B, Q, M, L, K) contiguous;
    all on one device, value/locations/weights in one floating dtype.  Returns (B, Q, M*D).
    ``kernel`` is "loop", "tiled" or a "rows" variant (``rows_options``); with neither it
    nor ``block_q`` given, FORWARD_PLAN decides; with only ``block_q`` given, the loop kernel
    runs with it.  ``launcher(kernel, grid, args, constexprs, num_warps)`` launches it
    (``launch.launch``; ``source_kernels.traced`` passes one that hands the kernel to
    torch.compile).
    """
    batch, _, heads, channels = value.shape
    queries = sampling_locations.shape[1]
    out = value.new_empty(batch, queries, heads * channels)
    if out.numel() == 0:
        return out
    if value.stride(3) != 1:
        value = value.contiguous()
    kernel, block_q, num_warps = choose(FORWARD_PLAN, value, queries, kernel, block_q,
                                        num_warps)
    fn, grid, args, constexprs = forward_launch(kernel, block_q, value, spatial_shapes,
                                                level_start_index, sampling_locations,
                                                attention_weights, out)
    launcher(fn, grid, args, constexprs, num_warps)
    return out


def choose(plan, value, queries, kernel, block_q, num_warps):
    """(kernel, BLOCK_Q, num_warps) of a forward call: the plan's where nothing is asked
    for, the loop kernel at ``forward_config`` where only part is."""
    cfg_q, cfg_warps = forward_config(value.shape[3], value.dtype)
    return choose_launch(plan, value, queries, kernel, block_q, num_warps, cfg_q, cfg_warps)


def choose_launch(plan, value, queries, kernel, block_q, num_warps, default_q, default_warps):
    """(kernel, BLOCK_Q, num_warps): the plan's where neither a kernel nor a block size is
    asked for, else the loop kernel with the defaults for what is not given."""
    if kernel is None and block_q is None:
        batch, _, heads, _ = value.shape
        kernel, block_q, planned_warps = planned(plan, batch, queries, heads,
                                                 value.element_size())
        num_warps = num_warps or planned_warps
    return kernel or "loop", block_q or default_q, num_warps or default_warps


def forward_launch(kernel, block_q, value, spatial_shapes, level_start_index,
                   sampling_locations, attention_weights, out):
    """(kernel function, grid, runtime arguments, compile-time arguments) of one forward
    launch of the named variant: what ``launch``, ``bind`` and ``torch.library.wrap_triton``
    take."""
    from .rows import _msda_forward_rows_kernel
    tensors = (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
               out)
    return variant_launch(kernel, (_msda_forward_kernel, _msda_forward_tiled_kernel,
                                   _msda_forward_rows_kernel), tensors, value,
                          sampling_locations, block_q, persistent_ok=True)


def rows_options(kernel: str) -> dict:
    """The compile-time switches of a "rows" variant named like "rows-level-hm":
    "rows" takes every sample of a row at once, "-level" one level, "-sample" one sample at
    a time; "-hm" numbers the rows head-major (neighbouring queries of one head together);
    "-persistent" (forward) walks blocks with a few programs per SM."""
    parts = kernel.split("-")
    if parts[0] != "rows" or any(p not in ("level", "sample", "hm", "persistent")
                                 for p in parts[1:]):
        raise ValueError(f"kernel must be 'loop', 'tiled' or a 'rows' variant such as "
                         f"'rows-level-hm', got {kernel!r}")
    return {"chunk": "level" if "level" in parts else "sample" if "sample" in parts else "all",
            "head_major": "hm" in parts, "persistent": "persistent" in parts}


# Programs per SM of a persistent launch, and the SM count (read once per device).
PERSISTENT_PROGRAMS_PER_SM = 4
_sm_counts: dict = {}


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_counts:
        _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sm_counts[index]


def wide_offsets(value, sampling_locations) -> bool:
    """Whether element offsets need int64: value's extent (with room for the corners that
    fall off a map, which are masked but still computed) or the parameters' size near 2**31."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()))
    return 4 * span >= 2 ** 31 or 2 * sampling_locations.numel() >= 2 ** 31


def variant_launch(kernel, kernels, tensors, value, sampling_locations, block_q, *,
                   persistent_ok=False):
    """The launch of the "loop", "tiled" or "rows" kernel of a triple (forward or backward:
    ``kernels``) on ``tensors`` (the kernel's pointer arguments).  Loop and tiled kernels
    run on a grid of (query blocks, batch * heads), rows kernels on blocks of the flat row
    axis; every kernel gets the compile-time sizes, fp32 arithmetic (fp64 for fp64)."""
    loop_kernel, tiled_kernel, rows_kernel = kernels
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    ints = (value.stride(0), value.stride(1), value.stride(2), queries, heads, channels)
    block_d = next_power_of_2(channels)
    if kernel in ("loop", "tiled"):
        grid = (cdiv(queries, block_q), batch * heads)
        constexprs = dict(L=levels, K=points, BLOCK_Q=block_q, BLOCK_D=block_d,
                          ACC_DTYPE=tl.float64 if value.dtype == torch.float64 else tl.float32)
        if kernel == "tiled":
            constexprs["LK_PAD"] = next_power_of_2(levels * points)
            return tiled_kernel, grid, tensors + ints, constexprs
        return loop_kernel, grid, tensors + ints, constexprs
    options = rows_options(kernel)
    rows = batch * queries * heads
    chunk = {"all": levels * points, "level": points, "sample": 1}[options["chunk"]]
    blocks = cdiv(rows, block_q)
    constexprs = dict(L=levels, K=points, BLOCK_R=block_q, BLOCK_D=block_d, CHUNK=chunk,
                      N_PAD=next_power_of_2(chunk), HEAD_MAJOR=options["head_major"],
                      WIDE=wide_offsets(value, sampling_locations))
    if persistent_ok:
        constexprs["PERSISTENT"] = options["persistent"]
        if options["persistent"]:
            blocks = min(blocks, PERSISTENT_PROGRAMS_PER_SM * _sm_count(value.device))
    elif options["persistent"]:
        raise ValueError(f"{kernel!r}: only the forward has a persistent variant")
    return rows_kernel, (blocks,), tensors + ints + (rows,), constexprs
