"""Chips of lab 08 (concurrent writes): a racy scatter, the atomic fix, the backward kernel.

- ``scatter_add_naive_kernel`` / ``scatter_add_naive(base, index, values)``: ``out[index[i]]
  += values[i]`` written as load, add, store.  Two lanes with the same index read the same old
  value and one write overwrites the other: updates are lost.
- ``lost_updates(index, block)``: how many updates the naive scatter loses when each program
  handles ``block`` consecutive indices and programs run one after another (Triton's
  interpreter): inside a program only one update per distinct index survives.
- ``scatter_add_atomic_kernel`` / ``scatter_add_atomic(base, index, values)``: the same with
  ``tl.atomic_add``: every update lands, whatever the duplicates and the programs.
- ``msda_backward_kernel``, ``msda_backward(...)``: the course's backward kernel (grad_value
  by atomics) and its launcher (``source_kernels.backward``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import source_kernels  # noqa: F401  (the interpreter switch)
from source_kernels.backward import _msda_backward_kernel as msda_backward_kernel
from source_kernels.backward import msda_backward

__all__ = ["scatter_add_naive_kernel", "scatter_add_naive", "lost_updates",
           "scatter_add_atomic_kernel", "scatter_add_atomic", "msda_backward_kernel",
           "msda_backward"]


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


def lost_updates(index, block):
    """Updates the naive scatter loses when the programs (``block`` indices each) run one after
    another: per program, the number of indices minus the number of distinct ones."""
    index = torch.as_tensor(index).reshape(-1)
    return sum(int(chunk.numel() - torch.unique(chunk).numel())
               for chunk in index.split(block))
