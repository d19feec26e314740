"""The operator as users call it: mmcv's autograd Function, a plain function, custom ops.

- ``MultiScaleDeformableAttnFunction.apply(value, value_spatial_shapes,
  value_level_start_index, sampling_locations, attention_weights, im2col_step)`` has the
  signature and semantics of mmcv's op, so it drops into Deformable DETR, DINO or
  Mask2Former code.  ``im2col_step`` is accepted for compatibility and checked, but no batch
  has to be divisible by it: the kernels process the whole batch in one launch.
  ``value_level_start_index`` may be None: it is then computed from the shapes.
- ``multi_scale_deformable_attn(...)`` is the plain function form, with the
  ``fp32_grad_accum`` switch of the backward and the ``mixed_precision`` switch (a 16-bit
  value with fp32 locations and weights, as autocast leaves them).
- Under ``torch.compile`` both route to custom ops that ``torch.compile(fullgraph=True)``
  takes without a graph break: on a GPU those of ``source_kernels.traced``, whose Triton
  kernels the compiler launches itself; in the CPU interpreter ``torch.ops.source_kernels.
  msda``, an opaque custom op with a fake implementation and a registered backward.

Eager calls take the shortest host path there is: the checks, the launch plan and the
compiled kernel of an argument signature (each tensor's shape, dtype, device and, for value,
strides) are found once and kept in a ``_Call``; a later call with that signature allocates
its outputs and launches the kernel with the tensors' addresses, and nothing else
(``source_kernels.launch.BoundLaunch``).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from .backward import (BACKWARD_PLAN, BWD_BLOCK_Q, BWD_NUM_WARPS, backward_launch,
                       default_fp32_grad_accum, grad_value_buffer, msda_backward)
from .forward import FORWARD_PLAN, choose, choose_launch, forward_launch, msda_forward
from .launch import bind, hooks_active, interpreting, launch
from .validate import (_as_kernels_take, check_signature, checked_shapes, level_starts,
                       validate_inputs)

__all__ = ["MultiScaleDeformableAttnFunction", "multi_scale_deformable_attn", "msda",
           "forget_launches"]

# What torch.compile routes to on a GPU: "traced" (source_kernels.traced, kernels visible to
# the compiler) or "opaque" (the custom op below, called as a black box).
COMPILED_OP = "traced"


def _prepare(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """int64 shape tensors (the starts computed when None) and contiguous parameters, as the
    kernels expect (value may keep any strides with contiguous channels)."""
    shapes, starts = _as_kernels_take(spatial_shapes, level_start_index)
    return (value, shapes, starts, sampling_locations.contiguous(),
            attention_weights.contiguous())


def _current_device():
    return torch.cuda.current_device()


class _Call:
    """One argument signature, checked once: its output's shape, the plans' kernels, and
    the bound launches of the forward and of the backward (one per accumulation choice)."""
    __slots__ = ("out_shape", "dtype", "device", "total", "levels", "copy_value",
                 "copy_params", "forward_plan", "forward_bound", "backward_plan",
                 "backward_bound", "empty", "shapes_seen", "mixed_precision")

    def __init__(self, value, sampling_locations, attention_weights, mixed_precision=False):
        batch, total, heads, channels = value.shape
        queries = sampling_locations.shape[1]
        self.out_shape = (batch, queries, heads * channels)
        self.dtype = value.dtype
        self.device = value.device
        self.total = total
        self.levels = sampling_locations.shape[3]
        self.mixed_precision = mixed_precision
        self.shapes_seen = {}
        self.copy_value = value.stride(3) != 1
        self.copy_params = not (sampling_locations.is_contiguous()
                                and attention_weights.is_contiguous())
        self.empty = value.numel() == 0 or sampling_locations.numel() == 0
        plain = value.contiguous() if self.copy_value else value
        self.forward_plan = choose(FORWARD_PLAN, plain, queries, None, None, None)
        self.backward_plan = choose_launch(BACKWARD_PLAN, plain, queries, None, None, None,
                                           BWD_BLOCK_Q, BWD_NUM_WARPS)
        self.forward_bound = None
        self.backward_bound = {}

    def inputs(self, value, shapes, starts, loc, attn):
        """The tensors as the kernels take them: the shape tensors checked (signature and
        contents, once per pair of tensor objects and versions), int64, starts computed
        when None; value and the parameters copied where their layout needs it."""
        key = (id(shapes), shapes._version, id(starts),
               None if starts is None else starts._version)
        seen = self.shapes_seen.get(key)
        if (seen is not None and seen[0]() is shapes
                and (starts is None or seen[1]() is starts)):
            shapes, starts = seen[2], seen[3]
        else:
            shapes, starts = self._check_shapes(key, value, shapes, starts, loc, attn)
        if self.copy_value:
            value = value.contiguous()
        if self.copy_params:
            loc = loc.contiguous()
            attn = attn.contiguous()
        return value, shapes, starts, loc, attn

    def _check_shapes(self, key, value, shapes, starts, loc, attn):
        check_signature(value, shapes, starts, loc, attn, mixed_precision=self.mixed_precision)
        checked = checked_shapes(shapes, starts, self.total)
        if not (shapes.is_cuda and torch.cuda.is_current_stream_capturing()):
            if len(self.shapes_seen) > 64:
                self.shapes_seen.clear()
            self.shapes_seen[key] = (weakref.ref(shapes),
                                     None if starts is None else weakref.ref(starts), *checked)
        return checked

    def forward(self, value, shapes, starts, loc, attn):
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        bound = self.forward_bound
        if bound is not None and not hooks_active() and _current_device() == bound.device:
            p0, p1, p2 = value.data_ptr(), shapes.data_ptr(), starts.data_ptr()
            p3, p4, p5 = loc.data_ptr(), attn.data_ptr(), out.data_ptr()
            if not (p0 | p1 | p2 | p3 | p4 | p5) & 15:
                bound(p0, p1, p2, p3, p4, p5)
                return out
        if self.empty:
            return msda_forward(value, shapes, starts, loc, attn)
        kernel, block, warps = self.forward_plan
        launch_args = forward_launch(kernel, block, value, shapes, starts, loc, attn, out)
        bound = _launch_or_bind(launch_args, warps)
        if bound is not None:
            self.forward_bound = bound
        return out

    def backward(self, grad_output, value, shapes, starts, loc, attn, fp32_grad_accum):
        if not grad_output.is_contiguous():
            grad_output = grad_output.contiguous()
        if fp32_grad_accum is None:
            fp32_grad_accum = default_fp32_grad_accum(self.dtype, self.device)
        if self.empty:
            return msda_backward(grad_output, value, shapes, starts, loc, attn,
                                 fp32_grad_accum=fp32_grad_accum)
        grad_value = grad_value_buffer(value, fp32_grad_accum)
        grad_loc = torch.empty_like(loc)
        grad_attn = torch.empty_like(attn)
        bound = self.backward_bound.get(fp32_grad_accum)
        done = False
        if bound is not None and not hooks_active() and _current_device() == bound.device:
            p0, p1, p2 = grad_output.data_ptr(), value.data_ptr(), shapes.data_ptr()
            p3, p4, p5 = starts.data_ptr(), loc.data_ptr(), attn.data_ptr()
            p6, p7, p8 = grad_value.data_ptr(), grad_loc.data_ptr(), grad_attn.data_ptr()
            if not (p0 | p1 | p2 | p3 | p4 | p5 | p6 | p7 | p8) & 15:
                bound(p0, p1, p2, p3, p4, p5, p6, p7, p8)
                done = True
        if not done:
            if value.dtype == torch.bfloat16 and interpreting() and not fp32_grad_accum:
                raise ValueError("fp32_grad_accum=False with bf16 needs a GPU: Triton's "
                                 "interpreter has no bf16 atomic add")
            kernel, block, warps = self.backward_plan
            launch_args = backward_launch(kernel, block, grad_output, value, shapes, starts,
                                          loc, attn, grad_value, grad_loc, grad_attn)
            bound = _launch_or_bind(launch_args, warps)
            if bound is not None:
                self.backward_bound[fp32_grad_accum] = bound
        if grad_value.dtype != self.dtype:
            grad_value = grad_value.to(self.dtype)
        if not grad_value.is_contiguous():
            grad_value = grad_value.contiguous()
        return grad_value, grad_loc, grad_attn


def _launch_or_bind(launch_args, num_warps):
    """Launch through Triton's own path; a BoundLaunch for the next calls where one can be
    made (a CUDA device, compiled kernels, no launch hook), else None."""
    fn, grid, args, constexprs = launch_args
    tensor = args[0] if isinstance(args[0], torch.Tensor) else args[1]
    if not tensor.is_cuda or interpreting() or hooks_active():
        launch(fn, grid, args, constexprs, num_warps)
        return None
    if tensor.get_device() != _current_device():
        with torch.cuda.device(tensor.device):
            return bind(fn, grid, args, constexprs, num_warps)
    return bind(fn, grid, args, constexprs, num_warps)


_calls: dict = {}


def forget_launches() -> None:
    """Drop every remembered signature (after FORWARD_PLAN or BACKWARD_PLAN change)."""
    _calls.clear()


def _call_for(value, shapes, starts, loc, attn, im2col_step, mixed_precision=False):
    """The _Call of these arguments' signature, after the signature checks (on a miss).

    The key holds what the checks and the launch depend on for value, sampling_locations
    and attention_weights; the shape tensors are checked per tensor object (``_Call.
    inputs``), since a model passes the same two to every layer."""
    try:
        key = (value.shape, value.stride(), value.dtype, value.device, loc.shape, loc.dtype,
               loc.device, loc.is_contiguous(), attn.shape, attn.dtype, attn.device,
               attn.is_contiguous(), im2col_step, mixed_precision)
    except AttributeError:                          # not tensors: the checks say which
        key = None
    else:
        call = _calls.get(key)
        if call is not None:
            return call
    check_signature(value, shapes, starts, loc, attn, im2col_step, mixed_precision)
    call = _Call(value, loc, attn, mixed_precision)
    if key is not None and type(im2col_step) is int:
        if len(_calls) > 256:
            _calls.clear()
        _calls[key] = call
    return call


class _ValidatedMSDA(torch.autograd.Function):
    """The autograd Function of the eager path (inputs checked through ``_call_for``)."""

    @staticmethod
    def forward(ctx, value, value_spatial_shapes, value_level_start_index, sampling_locations,
                attention_weights, im2col_step=64, fp32_grad_accum=None, call=None):
        if torch.compiler.is_compiling():
            ctx.call = None
            tensors = _compiled_inputs(value, value_spatial_shapes, value_level_start_index,
                                       sampling_locations, attention_weights, im2col_step,
                                       fp32_grad_accum)
            ctx.save_for_backward(*tensors)
            return _compiled_forward(*tensors)
        if call is None:
            call = _call_for(value, value_spatial_shapes, value_level_start_index,
                             sampling_locations, attention_weights, im2col_step)
        tensors = call.inputs(value, value_spatial_shapes, value_level_start_index,
                              sampling_locations, attention_weights)
        ctx.save_for_backward(*tensors)
        ctx.call = call
        ctx.fp32_grad_accum = fp32_grad_accum
        return call.forward(*tensors)

    @staticmethod
    def backward(ctx, grad_output):
        if torch.is_grad_enabled():
            return _not_twice_differentiable(ctx, grad_output)
        value, shapes, starts, loc, attn = ctx.saved_tensors
        if ctx.call is None:
            grad_value, grad_loc, grad_attn = _compiled_backward(grad_output, value, shapes,
                                                                 starts, loc, attn)
        else:
            grad_value, grad_loc, grad_attn = ctx.call.backward(
                grad_output, value, shapes, starts, loc, attn, ctx.fp32_grad_accum)
        return grad_value, None, None, grad_loc, grad_attn, None, None, None


@torch.autograd.function.once_differentiable
def _not_twice_differentiable(ctx, grad_output):
    """The backward when the graph of the backward is being recorded (create_graph=True):
    the gradients are computed, and differentiating them again raises."""
    with torch.no_grad():
        return _ValidatedMSDA.backward(ctx, grad_output)


class MultiScaleDeformableAttnFunction(_ValidatedMSDA):
    """mmcv-compatible autograd Function running the Triton kernels (validates its inputs)."""


# Function.apply without its Python wrapper (which only matters under functorch transforms).
_apply = super(torch.autograd.Function, _ValidatedMSDA).apply


# ----------------------------------------------------------------------------------------
# Under torch.compile.
# ----------------------------------------------------------------------------------------

def _compiled_inputs(value, shapes, starts, loc, attn, im2col_step, fp32_grad_accum,
                     mixed_precision=False):
    """Checks that need no host copy, and the tensors as the ops take them."""
    validate_inputs(value, shapes, starts, loc, attn, im2col_step, check_contents=False,
                    mixed_precision=mixed_precision)
    if fp32_grad_accum is not None:
        raise ValueError("fp32_grad_accum cannot be set under torch.compile; the default for "
                         "the device is used")
    shapes = shapes.to(torch.int64).contiguous()
    starts = level_starts(shapes) if starts is None else starts.to(torch.int64).contiguous()
    return value, shapes, starts, loc.contiguous(), attn.contiguous()


def _compiled_forward(value, shapes, starts, loc, attn):
    from .traced import kernels_visible, msda_traced
    if COMPILED_OP == "traced" and kernels_visible(value):
        return msda_traced(value, shapes, starts, loc, attn)
    return msda(value, shapes, starts, loc, attn)


def _compiled_backward(grad_output, value, shapes, starts, loc, attn):
    from .traced import kernels_visible, msda_traced_backward
    if COMPILED_OP == "traced" and kernels_visible(value):
        return msda_traced_backward(grad_output, value, shapes, starts, loc, attn)
    return msda_backward_op(grad_output, value, shapes, starts, loc, attn, -1)


@torch.library.custom_op("source_kernels::msda", mutates_args=())
def msda(value: torch.Tensor, value_spatial_shapes: torch.Tensor,
         value_level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
         attention_weights: torch.Tensor) -> torch.Tensor:
    """MSDA forward as an opaque custom op (inputs already validated and contiguous)."""
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


# ----------------------------------------------------------------------------------------
# The function form.
# ----------------------------------------------------------------------------------------

def multi_scale_deformable_attn(value, value_spatial_shapes, value_level_start_index,
                                sampling_locations, attention_weights, im2col_step=64,
                                fp32_grad_accum: Optional[bool] = None,
                                mixed_precision: bool = False):
    """Multi-scale deformable attention: (B, S, M, D) values -> (B, Q, M*D) outputs.

    Arguments as ``MultiScaleDeformableAttnFunction.apply`` (``value_level_start_index``
    may be None); ``fp32_grad_accum`` chooses an fp32 buffer for grad_value's atomics
    (default: on for bf16 without native bf16 atomics).  ``mixed_precision=True`` lets a
    float16 or bfloat16 value take float32 sampling_locations and attention_weights (what
    autocast leaves a model with; the kernels compute in fp32 either way): the output and
    grad_value come in value's dtype, the other gradients in fp32, and value is neither
    copied nor widened.  Without it the three dtypes must match, as in mmcv.
    """
    if torch.compiler.is_compiling():
        tensors = _compiled_inputs(value, value_spatial_shapes, value_level_start_index,
                                   sampling_locations, attention_weights, im2col_step,
                                   fp32_grad_accum, mixed_precision)
        return _compiled_forward(*tensors)
    call = _call_for(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                     attention_weights, im2col_step, mixed_precision)
    if not (torch.is_grad_enabled() and (value.requires_grad or sampling_locations.requires_grad
                                         or attention_weights.requires_grad)):
        # Inference: no autograd node to build, straight to the kernel.
        return call.forward(*call.inputs(value, value_spatial_shapes, value_level_start_index,
                                         sampling_locations, attention_weights))
    if torch._C._are_functorch_transforms_active():
        return _ValidatedMSDA.apply(value, value_spatial_shapes, value_level_start_index,
                                    sampling_locations, attention_weights, im2col_step,
                                    fp32_grad_accum, call)
    return _apply(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                  attention_weights, im2col_step, fp32_grad_accum, call)
