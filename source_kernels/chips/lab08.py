"""Chips of lab 08 (concurrent writes): a corner-hit histogram with a race and with atomics,
the number of updates the race loses, the backward kernel.

The histogram counts, for every pixel of one H x W map, how many bilinear samples read it as
one of their four corners: the write pattern of ``grad_value`` in the backward pass, with +1
in place of a gradient.

- ``corner_hits_racy_kernel``: one program takes ``BLOCK`` samples; for each corner in the
  order 00, 01, 10, 11 it loads the counts of the pixels that corner hits, adds 1 and stores
  them back (one load and one store per corner, masked to the lanes whose corner lies on the
  map).  Lanes of one store that hit the same pixel read the same old count, and one store
  wins: updates are lost.
- ``corner_hits_kernel``: the same with ``tl.atomic_add``: every update lands.
- ``corner_pixels``, ``racy_stores``, ``count_hits``, ``corner_hits``, ``corner_hits_racy``,
  ``lost_updates``: the same in PyTorch: the corners of each sample, the pixels each store of
  the racy kernel writes, counts with atomics or with the race, the exact histogram, the
  histogram the racy kernel leaves when programs run one after another (Triton's
  interpreter), and how many updates it loses there.
- ``scatter_add_naive`` / ``scatter_add_atomic``: a plain scatter-add of one value per lane,
  load-add-store and atomic (``scripts/gpu/lab08_race.py`` times them on a GPU).
- ``msda_backward_kernel``, ``msda_backward(...)``: the course's backward kernel (grad_value
  by atomics) and its launcher (``source_kernels.backward``).

Graded code may call these chips in lab 10 (all of them) only; in lab 08 itself and in every
other lab a graded function that calls one fails its check (book/labs.md, the chips your graded
code may call).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import source_kernels  # noqa: F401  (the interpreter switch)
from source_kernels.backward import _msda_backward_kernel as msda_backward_kernel
from source_kernels.backward import msda_backward

__all__ = ["corner_hits_racy_kernel", "corner_hits_kernel", "corner_hits_racy_launch",
           "corner_hits_launch", "corner_pixels", "racy_stores", "count_hits", "corner_hits",
           "corner_hits_racy", "lost_updates", "scatter_add_naive_kernel", "scatter_add_naive",
           "scatter_add_atomic_kernel", "scatter_add_atomic", "msda_backward_kernel",
           "msda_backward"]


@triton.jit
def _corner(loc_ptr, offs, mask, H, W, corner: tl.constexpr):
    """Pixel (r * W + c) of corner ``corner`` (00, 01, 10, 11 as 0..3) of the samples ``offs``
    (loc: (n, 2) as x, y), and whether it lies on the map."""
    x_im = tl.load(loc_ptr + 2 * offs, mask=mask, other=0.0) * W - 0.5
    y_im = tl.load(loc_ptr + 2 * offs + 1, mask=mask, other=0.0) * H - 0.5
    r = tl.floor(y_im).to(tl.int32) + corner // 2
    c = tl.floor(x_im).to(tl.int32) + corner % 2
    return r * W + c, mask & (r >= 0) & (r < H) & (c >= 0) & (c < W)


@triton.jit
def corner_hits_racy_kernel(loc_ptr, hits_ptr, n, H, W, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for corner in tl.static_range(4):
        pixel, on_map = _corner(loc_ptr, offs, offs < n, H, W, corner)
        count = tl.load(hits_ptr + pixel, mask=on_map, other=0)     # lanes of one pixel
        tl.store(hits_ptr + pixel, count + 1, mask=on_map)           # ... one store wins


@triton.jit
def corner_hits_kernel(loc_ptr, hits_ptr, n, H, W, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for corner in tl.static_range(4):
        pixel, on_map = _corner(loc_ptr, offs, offs < n, H, W, corner)
        tl.atomic_add(hits_ptr + pixel, on_map.to(tl.int32), mask=on_map)


def _launch_hits(kernel, locations, height, width, block):
    locations = locations.to(torch.float32).contiguous()
    hits = torch.zeros(height * width, dtype=torch.int32, device=locations.device)
    n = locations.shape[0]
    if n:
        kernel[(triton.cdiv(n, block),)](locations, hits, n, height, width, BLOCK=block)
    return hits


def corner_hits_racy_launch(locations, height, width, block=16):
    """locations (n, 2) float32 as (x, y) in [0, 1]; returns the (H*W,) int32 counts that
    ``corner_hits_racy_kernel`` leaves, ``block`` samples per program."""
    return _launch_hits(corner_hits_racy_kernel, locations, height, width, block)


def corner_hits_launch(locations, height, width, block=16):
    """As ``corner_hits_racy_launch``, through the atomic ``corner_hits_kernel``."""
    return _launch_hits(corner_hits_kernel, locations, height, width, block)


def corner_pixels(locations, height, width):
    """(rows, cols, on_map), each (n, 4): the pixel of corners 00, 01, 10, 11 of every sample
    (row y0 + i, column x0 + j for corner ij) and whether it lies on the map."""
    loc = locations.detach().to("cpu", torch.float64)
    x0 = torch.floor(loc[:, 0] * width - 0.5).long()
    y0 = torch.floor(loc[:, 1] * height - 0.5).long()
    rows = torch.stack([y0, y0, y0 + 1, y0 + 1], dim=1)
    cols = torch.stack([x0, x0 + 1, x0, x0 + 1], dim=1)
    on_map = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    return rows, cols, on_map


def racy_stores(pixels, hit, block, per_corner=True):
    """The pixels each store of the racy kernel writes, one tensor per store, in launch order.
    pixels, hit: (n, 4); programs of ``block`` samples; ``per_corner``: one store per corner
    (else one store of all four)."""
    for start in range(0, pixels.shape[0], block):
        chunk, chunk_hit = pixels[start:start + block], hit[start:start + block]
        if per_corner:
            for corner in range(pixels.shape[1]):
                yield chunk[:, corner][chunk_hit[:, corner]]
        else:
            yield chunk[chunk_hit]


def count_hits(pixels, hit, size, block=None, per_corner=True):
    """(size,) int64 counts of ``pixels`` (n, 4, values in [0, size)) where ``hit``.  With
    ``block`` None every hit counts (atomic adds); else what the racy kernel leaves when its
    programs of ``block`` samples run one after another: one update per store and distinct
    pixel (``per_corner``: a store per corner, else one for all four)."""
    if block is None:
        return torch.bincount(pixels[hit], minlength=size)
    hits = torch.zeros(size, dtype=torch.int64)
    for pixels_stored in racy_stores(pixels, hit, block, per_corner):
        hits[torch.unique(pixels_stored)] += 1
    return hits


def corner_hits(locations, height, width):
    """(H*W,) int64: how many corners of the samples land on each pixel."""
    rows, cols, on_map = corner_pixels(locations, height, width)
    return count_hits(rows * width + cols, on_map, height * width)


def corner_hits_racy(locations, height, width, block):
    """(H*W,) int64: what the racy kernel leaves when its programs (``block`` samples each)
    run one after another."""
    rows, cols, on_map = corner_pixels(locations, height, width)
    return count_hits(rows * width + cols, on_map, height * width, block)


def lost_updates(locations, height, width, block):
    """Updates the racy kernel loses when its programs run one after another: per program and
    corner, the lanes whose corner is on the map minus the distinct pixels they hit."""
    _, _, on_map = corner_pixels(locations, height, width)
    return int(on_map.sum()) - int(corner_hits_racy(locations, height, width, block).sum())


@triton.jit
def scatter_add_naive_kernel(out_ptr, index_ptr, values_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(index_ptr + offs, mask=mask, other=0)
    vals = tl.load(values_ptr + offs, mask=mask, other=0.0)
    old = tl.load(out_ptr + idx, mask=mask, other=0.0)     # lanes with one idx read one value
    tl.store(out_ptr + idx, old + vals, mask=mask)         # ... and one store wins


@triton.jit
def scatter_add_atomic_kernel(out_ptr, index_ptr, values_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(index_ptr + offs, mask=mask, other=0)
    vals = tl.load(values_ptr + offs, mask=mask, other=0.0)
    tl.atomic_add(out_ptr + idx, vals, mask=mask)          # read-modify-write as one operation


def _launch(kernel, base, index, values, block):
    out = base.clone().contiguous()
    index = index.to(torch.int64).contiguous()
    values = values.to(out.dtype).contiguous()
    n = index.numel()
    if n:
        kernel[(triton.cdiv(n, block),)](out, index, values, n, BLOCK=block)
    return out


def scatter_add_naive(base, index, values, block=64):
    """base (R,) float; index (N,) int64 in [0, R); values (N,) float.  Returns a copy of base
    with values[i] added at index[i] by load-add-store: updates with duplicate indices get lost."""
    return _launch(scatter_add_naive_kernel, base, index, values, block)


def scatter_add_atomic(base, index, values, block=64):
    """As ``scatter_add_naive``, with ``tl.atomic_add``: equals base.index_add(0, index, values)
    up to the order of the additions."""
    return _launch(scatter_add_atomic_kernel, base, index, values, block)
