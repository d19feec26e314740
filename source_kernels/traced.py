"""The operator as ``torch.compile`` sees it: custom ops whose kernels the compiler launches.

``torch.ops.source_kernels.msda_traced`` and ``msda_traced_backward`` are
``torch.library.triton_op`` operators: their bodies allocate the outputs and launch the
plan's kernel through ``torch.library.wrap_triton``, so that under ``torch.compile`` the
graph holds the Triton kernels themselves, which Inductor compiles and launches from its own
generated code (no Python of this package per call, and graphs that CUDA graphs can
capture whole).  In eager mode they run their bodies like any custom op.

In Triton's CPU interpreter a kernel is not a compilable object, so on a machine without a
GPU the compiled path takes the opaque custom op of ``source_kernels.op`` instead (a fake
implementation plus a registered backward; ``torch.compile`` calls it as a black box).
"""
from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from .backward import (BACKWARD_PLAN, BWD_BLOCK_Q, BWD_NUM_WARPS, backward_launch,
                       default_fp32_grad_accum, grad_value_buffer)
from .forward import FORWARD_PLAN, choose, choose_launch, forward_launch
from .launch import interpreting

__all__ = ["msda_traced", "msda_traced_backward", "kernels_visible"]


def kernels_visible(value: torch.Tensor) -> bool:
    """Whether the compiled path can hand the kernels to the compiler: a CUDA tensor and
    compiled (not interpreted) kernels."""
    return value.is_cuda and not interpreting()


def _launcher(fn):
    return fn if interpreting() else wrap_triton(fn)


@triton_op("source_kernels::msda_traced", mutates_args=())
def msda_traced(value: torch.Tensor, value_spatial_shapes: torch.Tensor,
                value_level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
                attention_weights: torch.Tensor) -> torch.Tensor:
    """MSDA forward (inputs validated; int64 shapes and starts; contiguous locations and
    weights) with the kernel of FORWARD_PLAN."""
    batch, _, heads, channels = value.shape
    queries = sampling_locations.shape[1]
    out = value.new_empty(batch, queries, heads * channels)
    if out.numel() == 0:
        return out
    if value.stride(3) != 1:
        value = value.contiguous()
    kernel, block, warps = choose(FORWARD_PLAN, value, queries, None, None, None)
    fn, grid, args, constexprs = forward_launch(kernel, block, value, value_spatial_shapes,
                                                value_level_start_index, sampling_locations,
                                                attention_weights, out)
    _launcher(fn)[grid](*args, **constexprs, num_warps=warps)
    return out


@triton_op("source_kernels::msda_traced_backward", mutates_args=())
def msda_traced_backward(grad_output: torch.Tensor, value: torch.Tensor,
                         value_spatial_shapes: torch.Tensor,
                         value_level_start_index: torch.Tensor,
                         sampling_locations: torch.Tensor, attention_weights: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three gradients, with the kernel of BACKWARD_PLAN and the device's default for
    the fp32 accumulation buffer."""
    grad_output = grad_output.contiguous()
    if value.stride(3) != 1:
        value = value.contiguous()
    accum = default_fp32_grad_accum(value.dtype, value.device)
    grad_value = grad_value_buffer(value, accum)
    grad_loc = torch.empty_like(sampling_locations)
    grad_attn = torch.empty_like(attention_weights)
    if grad_attn.numel() > 0 and value.numel() > 0:
        kernel, block, warps = choose_launch(BACKWARD_PLAN, value, sampling_locations.shape[1],
                                             None, None, None, BWD_BLOCK_Q, BWD_NUM_WARPS)
        fn, grid, args, constexprs = backward_launch(
            kernel, block, grad_output, value, value_spatial_shapes, value_level_start_index,
            sampling_locations, attention_weights, grad_value, grad_loc, grad_attn)
        _launcher(fn)[grid](*args, **constexprs, num_warps=warps)
    elif grad_attn.numel() > 0:
        grad_loc.zero_()
        grad_attn.zero_()
    return grad_value.to(value.dtype).contiguous(), grad_loc, grad_attn


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_output):
    value, shapes, starts, loc, attn = ctx.saved_tensors
    grad_value, grad_loc, grad_attn = msda_traced_backward(grad_output, value, shapes, starts,
                                                           loc, attn)
    return grad_value, None, None, grad_loc, grad_attn


msda_traced.register_autograd(_backward, setup_context=_setup_context)
