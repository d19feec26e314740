"""Chips of lab 09 (hardware detective): reading the atomics of the backward kernel's PTX.

- ``compile_ptx(kernel, arch, dtype, fp32_grad_accum=False)``, ``atomic_instructions(ptx)``,
  ``atomic_summary(ptx)``: from ``source_kernels.ptx`` (compile for sm_80 or sm_90 on a CPU,
  list the ``atom``/``red`` instructions);
- ``atomic_strategy(ptx)``: how the kernel's atomic adds are carried out, as one word;
- ``fp32_accum_default(dtype, capability)``: whether grad_value should be accumulated in an fp32
  buffer (the rule of ``source_kernels.backward.default_fp32_grad_accum``, for a given GPU);
- ``fp32_buffer_cost(value_shape, dtype)``: the bytes that buffer costs.

Graded code may call these chips in no lab: they answer lab 09, and a graded function that
calls one fails its check (book/labs.md, the chips your graded code may call).
"""
from __future__ import annotations

import torch

import source_kernels  # noqa: F401  (the interpreter switch)
from source_kernels.ptx import atomic_instructions, atomic_summary, compile_ptx

__all__ = ["compile_ptx", "atomic_instructions", "atomic_summary", "atomic_strategy",
           "fp32_accum_default", "fp32_buffer_cost", "STRATEGIES"]

STRATEGIES = ("cas-loop", "bf16-native", "fp16-native", "fp32", "none")


def atomic_strategy(ptx):
    """One of STRATEGIES: "cas-loop" when any atomic is a compare-and-swap (``.cas``), else
    "bf16-native" / "fp16-native" / "fp32" for an atomic add (``.add``) on that type (vector
    forms such as ``.v4.bf16`` or ``.bf16x2`` included), else "none"."""
    ops = atomic_instructions(ptx)
    parts = [set(op.split(".")) for op in ops]
    if any("cas" in p for p in parts):
        return "cas-loop"
    adds = [p for p in parts if "add" in p]
    for strategy, types in (("bf16-native", {"bf16", "bf16x2"}), ("fp16-native", {"f16", "f16x2"}),
                            ("fp32", {"f32"})):
        if any(p & types for p in adds):
            return strategy
    return "none"


def fp32_accum_default(dtype, capability):
    """dtype: the value's torch dtype; capability: (major, minor) of the GPU, or None for
    Triton's CPU interpreter.  True when grad_value should go through an fp32 buffer: bf16
    without a native bf16 atomic add (before sm_90, and in the interpreter)."""
    if dtype != torch.bfloat16:
        return False
    return capability is None or capability[0] < 9


def fp32_buffer_cost(value_shape, dtype):
    """value_shape (B, S, M, D); dtype of value.  Returns {"buffer_bytes": the fp32 buffer,
    "conversion_bytes": reading it and writing grad_value in dtype once}, both 0 when the dtype
    needs no buffer (fp32, fp64)."""
    numel = 1
    for size in value_shape:
        numel *= int(size)
    if dtype not in (torch.float16, torch.bfloat16):
        return {"buffer_bytes": 0, "conversion_bytes": 0}
    itemsize = torch.empty((), dtype=dtype).element_size()
    return {"buffer_bytes": 4 * numel, "conversion_bytes": (4 + itemsize) * numel}
