"""The operator as users call it: mmcv's autograd Function, a plain function, a custom op.

- ``MultiScaleDeformableAttnFunction.apply(value, value_spatial_shapes,
  value_level_start_index, sampling_locations, attention_weights, im2col_step)`` has the
  signature and semantics of mmcv's op, so it drops into Deformable DETR, DINO or
  Mask2Former code.  ``im2col_step`` is accepted for compatibility and checked, but no batch
  has to be divisible by it: the kernels process the whole batch in one launch.
- ``multi_scale_deformable_attn(...)`` is the plain function form, with the
  ``fp32_grad_accum`` switch of the backward.
- ``torch.ops.source_kernels.msda`` is a ``torch.library`` custom op with a fake
  implementation and a registered backward, which ``torch.compile(fullgraph=True)`` takes
  without a graph break.  Eager calls go straight to the kernels (fewer microseconds of
  host dispatch); under ``torch.compile`` the function form routes through the custom op.
"""
from __future__ import annotations

from typing import Optional

import torch

from .backward import msda_backward
from .forward import msda_forward
from .validate import validate_inputs

__all__ = ["MultiScaleDeformableAttnFunction", "multi_scale_deformable_attn", "msda"]


def _prepare(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """int64 shape tensors and contiguous parameters, as the kernels expect (value may keep
    any strides with contiguous channels: the kernels index it through its strides)."""
    if spatial_shapes.dtype is not torch.int64:
        spatial_shapes = spatial_shapes.to(torch.int64)
    if level_start_index.dtype is not torch.int64:
        level_start_index = level_start_index.to(torch.int64)
    return (value, spatial_shapes.contiguous(), level_start_index.contiguous(),
            sampling_locations.contiguous(), attention_weights.contiguous())


class _ValidatedMSDA(torch.autograd.Function):
    """The autograd Function on inputs that were already validated."""

    @staticmethod
    def forward(ctx, value, value_spatial_shapes, value_level_start_index, sampling_locations,
                attention_weights, im2col_step=64, fp32_grad_accum=None):
        args = _prepare(value, value_spatial_shapes, value_level_start_index,
                        sampling_locations, attention_weights)
        ctx.save_for_backward(*args)
        ctx.fp32_grad_accum = fp32_grad_accum
        return msda_forward(*args)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        value, shapes, starts, loc, attn = ctx.saved_tensors
        grad_value, grad_loc, grad_attn = msda_backward(
            grad_output.contiguous(), value, shapes, starts, loc, attn,
            fp32_grad_accum=ctx.fp32_grad_accum)
        return grad_value, None, None, grad_loc, grad_attn, None, None


class MultiScaleDeformableAttnFunction(_ValidatedMSDA):
    """mmcv-compatible autograd Function running the Triton kernels (validates its inputs)."""

    @staticmethod
    def forward(ctx, value, value_spatial_shapes, value_level_start_index, sampling_locations,
                attention_weights, im2col_step=64, fp32_grad_accum=None):
        validate_inputs(value, value_spatial_shapes, value_level_start_index,
                        sampling_locations, attention_weights, im2col_step)
        return _ValidatedMSDA.forward(ctx, value, value_spatial_shapes,
                                      value_level_start_index, sampling_locations,
                                      attention_weights, im2col_step, fp32_grad_accum)


# ----------------------------------------------------------------------------------------
# The custom op: what torch.compile sees.
# ----------------------------------------------------------------------------------------

@torch.library.custom_op("source_kernels::msda", mutates_args=())
def msda(value: torch.Tensor, value_spatial_shapes: torch.Tensor,
         value_level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
         attention_weights: torch.Tensor) -> torch.Tensor:
    """MSDA forward as a custom op (inputs already validated and contiguous)."""
    return msda_forward(value, value_spatial_shapes, value_level_start_index,
                        sampling_locations, attention_weights)


@msda.register_fake
def _msda_fake(value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights):
    batch, _, heads, channels = value.shape
    queries = sampling_locations.shape[1]
    return value.new_empty(batch, queries, heads * channels)


@torch.library.custom_op("source_kernels::msda_backward", mutates_args=())
def msda_backward_op(grad_output: torch.Tensor, value: torch.Tensor,
                     value_spatial_shapes: torch.Tensor, value_level_start_index: torch.Tensor,
                     sampling_locations: torch.Tensor, attention_weights: torch.Tensor,
                     fp32_grad_accum: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MSDA backward as a custom op; fp32_grad_accum is -1 (default), 0 (off) or 1 (on)."""
    switch = None if fp32_grad_accum < 0 else bool(fp32_grad_accum)
    return msda_backward(grad_output.contiguous(), value, value_spatial_shapes,
                         value_level_start_index, sampling_locations, attention_weights,
                         fp32_grad_accum=switch)


@msda_backward_op.register_fake
def _msda_backward_fake(grad_output, value, value_spatial_shapes, value_level_start_index,
                        sampling_locations, attention_weights, fp32_grad_accum):
    return (torch.empty_like(value), torch.empty_like(sampling_locations),
            torch.empty_like(attention_weights))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _msda_op_backward(ctx, grad_output):
    value, shapes, starts, loc, attn = ctx.saved_tensors
    grad_value, grad_loc, grad_attn = msda_backward_op(grad_output, value, shapes, starts, loc,
                                                       attn, -1)
    return grad_value, None, None, grad_loc, grad_attn


msda.register_autograd(_msda_op_backward, setup_context=_setup_context)


def multi_scale_deformable_attn(value, value_spatial_shapes, value_level_start_index,
                                sampling_locations, attention_weights, im2col_step=64,
                                fp32_grad_accum: Optional[bool] = None):
    """Multi-scale deformable attention: (B, S, M, D) values -> (B, Q, M*D) outputs.

    Arguments as ``MultiScaleDeformableAttnFunction.apply``; ``fp32_grad_accum`` chooses an
    fp32 buffer for grad_value's atomics (default: on for bf16 without native bf16 atomics).
    """
    if torch.compiler.is_compiling():
        validate_inputs(value, value_spatial_shapes, value_level_start_index,
                        sampling_locations, attention_weights, im2col_step,
                        check_contents=False)
        if fp32_grad_accum is not None:
            raise ValueError("fp32_grad_accum cannot be set under torch.compile; the "
                             "default for the device is used")
        return msda(*_prepare(value, value_spatial_shapes, value_level_start_index,
                              sampling_locations, attention_weights))
    validate_inputs(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                    attention_weights, im2col_step)
    if not (torch.is_grad_enabled() and (value.requires_grad or sampling_locations.requires_grad
                                         or attention_weights.requires_grad)):
        # Inference: no autograd node to build, straight to the kernel.
        return msda_forward(*_prepare(value, value_spatial_shapes, value_level_start_index,
                                      sampling_locations, attention_weights))
    return _ValidatedMSDA.apply(value, value_spatial_shapes, value_level_start_index,
                                sampling_locations, attention_weights, im2col_step,
                                fp32_grad_accum)
