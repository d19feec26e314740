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

from .backward import msda_backward
from .forward import msda_forward
from .launch import interpreting

__all__ = ["msda_traced", "msda_traced_backward", "kernels_visible"]


def kernels_visible(value: torch.Tensor) -> bool:
    """Whether the compiled path can hand the kernels to the compiler: a CUDA tensor and
    compiled (not interpreted) kernels."""
    return value.is_cuda and not interpreting()


def _hand_to_compiler(fn, grid, args, constexprs, num_warps):
    """Launch through ``wrap_triton``: under torch.compile, a node of the graph."""
    launcher = fn if interpreting() else wrap_triton(fn)
    launcher[grid](*args, **constexprs, num_warps=num_warps)


@triton_op("source_kernels::msda_traced", mutates_args=())
def msda_traced(value: torch.Tensor, value_spatial_shapes: torch.Tensor,
                value_level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
                attention_weights: torch.Tensor) -> torch.Tensor:
    """MSDA forward (inputs validated; int64 shapes and starts; contiguous locations and
    weights) with the kernel of FORWARD_PLAN."""
    return msda_forward(value, value_spatial_shapes, value_level_start_index,
                        sampling_locations, attention_weights, launcher=_hand_to_compiler)


@triton_op("source_kernels::msda_traced_backward", mutates_args=())
def msda_traced_backward(grad_output: torch.Tensor, value: torch.Tensor,
                         value_spatial_shapes: torch.Tensor,
                         value_level_start_index: torch.Tensor,
                         sampling_locations: torch.Tensor, attention_weights: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three gradients, with the kernel of BACKWARD_PLAN and the device's default for
    the fp32 accumulation buffer."""
    return msda_backward(grad_output.contiguous(), value, value_spatial_shapes,
                         value_level_start_index, sampling_locations, attention_weights,
                         launcher=_hand_to_compiler)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_output):
    value, shapes, starts, loc, attn = ctx.saved_tensors
    grad_value, grad_loc, grad_attn = msda_traced_backward(grad_output, value, shapes, starts,
                                                           loc, attn)
    return grad_value, None, None, grad_loc, grad_attn


msda_traced.register_autograd(_backward, setup_context=_setup_context)
