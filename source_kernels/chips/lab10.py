"""Chips of lab 10 (ship it): the operator as users call it, re-exported.

- ``validate_inputs(value, value_spatial_shapes, value_level_start_index,
  sampling_locations, attention_weights, im2col_step=64)``: raises TypeError/ValueError
  naming the argument (``source_kernels.validate``);
- ``MultiScaleDeformableAttnFunction``: the autograd Function with mmcv's signature;
- ``multi_scale_deformable_attn(...)``: the plain-function form with ``fp32_grad_accum``
  (both ``source_kernels.op``).

Graded code may call these chips in no lab: they answer lab 10, and a graded function that
calls one fails its check (book/labs.md, the chips your graded code may call).
"""
import source_kernels  # noqa: F401  (the interpreter switch)
from source_kernels.op import MultiScaleDeformableAttnFunction, multi_scale_deformable_attn
from source_kernels.validate import validate_inputs

__all__ = ["validate_inputs", "MultiScaleDeformableAttnFunction", "multi_scale_deformable_attn"]
