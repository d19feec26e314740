"""Input validation: bad input gets an error that names the argument, never a wrong answer.

Shape, dtype and device checks cost nothing on the device.  The checks on the *contents* of
``value_spatial_shapes`` and ``value_level_start_index`` (positive sizes, S equal to the sum
of H*W, start offsets equal to the running sum) need their values on the host: free when
those tensors live on the CPU; for GPU tensors one small copy, remembered per tensor object
and version so that a model calling the op in every layer with the same shapes pays it once,
and skipped while a CUDA graph is being captured (a copy to the host is not allowed then).
"""
from __future__ import annotations

import os
import weakref

import torch

__all__ = ["validate_inputs", "FLOAT_DTYPES", "DtypeMismatchError", "level_starts",
           "checked_shapes"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int32, torch.int64)
_checked_contents: dict = {}    # (ids, versions, S) -> (weakrefs, int64 shapes and starts)
_valid_signatures: dict = {}     # (shape, dtype, device) of each argument, found valid once


class DtypeMismatchError(TypeError, ValueError):
    """value, sampling_locations and attention_weights in different floating dtypes.  A
    TypeError, as every dtype error here, and a ValueError, as mmcv-style test suites
    expect of a mismatch."""


def _require_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_contents(spatial_shapes, level_start_index, total):
    """Positive sizes, S = sum(H*W), and (when given) starts equal to the running sums."""
    shapes = spatial_shapes.tolist()
    starts = level_start_index.tolist() if level_start_index is not None else None
    running = 0
    for lvl, (height, width) in enumerate(shapes):
        if height <= 0 or width <= 0:
            raise ValueError(f"value_spatial_shapes[{lvl}] = ({height}, {width}): every level "
                             "needs a positive height and width")
        if starts is not None and starts[lvl] != running:
            raise ValueError(f"value_level_start_index[{lvl}] = {starts[lvl]}, but levels "
                             f"before it hold {running} rows: expected {running}")
        running += height * width
    if running != total:
        raise ValueError(f"value has S = {total} rows but value_spatial_shapes describe "
                         f"sum(H*W) = {running}")


def level_starts(spatial_shapes: torch.Tensor) -> torch.Tensor:
    """(L,) int64 offsets of each level inside S, from (L, 2) (H, W): what
    value_level_start_index holds, computed on the shapes' device (no host copy)."""
    sizes = spatial_shapes.to(torch.int64).prod(dim=1)
    return torch.cumsum(sizes, 0) - sizes


def _shapes_key(spatial_shapes, level_start_index, total):
    if level_start_index is None:
        return (id(spatial_shapes), spatial_shapes._version, None, None, total)
    return (id(spatial_shapes), spatial_shapes._version, id(level_start_index),
            level_start_index._version, total)


def _contents_already_checked(spatial_shapes, level_start_index, total):
    """The remembered entry (weakrefs, int64 shapes, int64 starts) of this pair of tensor
    objects at their present versions, or None."""
    entry = _checked_contents.get(_shapes_key(spatial_shapes, level_start_index, total))
    if (entry is not None and entry[0]() is spatial_shapes
            and (level_start_index is None or entry[1]() is level_start_index)):
        return entry
    return None


def _as_kernels_take(spatial_shapes, level_start_index):
    """int64 contiguous shapes and starts (computed from the shapes when None)."""
    shapes = spatial_shapes
    if shapes.dtype is not torch.int64 or not shapes.is_contiguous():
        shapes = shapes.to(torch.int64).contiguous()
    if level_start_index is None:
        return shapes, level_starts(shapes)
    starts = level_start_index
    if starts.dtype is not torch.int64 or not starts.is_contiguous():
        starts = starts.to(torch.int64).contiguous()
    return shapes, starts


def _remember_contents(spatial_shapes, level_start_index, total):
    if len(_checked_contents) > 256:
        _checked_contents.clear()
    entry = (weakref.ref(spatial_shapes),
             None if level_start_index is None else weakref.ref(level_start_index),
             *_as_kernels_take(spatial_shapes, level_start_index))
    _checked_contents[_shapes_key(spatial_shapes, level_start_index, total)] = entry
    return entry


def checked_shapes(spatial_shapes, level_start_index, total):
    """(spatial_shapes, level_start_index) as the kernels take them: contents checked
    against S = ``total`` (see above), int64 and contiguous, the starts computed from the
    shapes when ``level_start_index`` is None.  Remembered per pair of tensor objects and
    versions, so a model that passes the same tensors to every layer pays the check, the
    conversion and the host copy once; while a CUDA graph is being captured nothing is
    copied to the host (the contents check is skipped) and nothing is remembered."""
    entry = _contents_already_checked(spatial_shapes, level_start_index, total)
    if entry is None:
        if spatial_shapes.is_cuda and torch.cuda.is_current_stream_capturing():
            return _as_kernels_take(spatial_shapes, level_start_index)
        _check_contents(spatial_shapes, level_start_index, total)
        entry = _remember_contents(spatial_shapes, level_start_index, total)
    return entry[2], entry[3]


def _signature(value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights, im2col_step):
    """Each argument's shape, dtype and device (None where an argument is not a tensor or
    an int, or under torch.compile): what the signature checks depend on."""
    tensor = torch.Tensor
    if not (isinstance(value, tensor) and isinstance(value_spatial_shapes, tensor)
            and isinstance(sampling_locations, tensor) and isinstance(attention_weights, tensor)
            and type(im2col_step) is int and not torch.compiler.is_compiling()):
        return None
    if value_level_start_index is None:
        starts = None
    elif isinstance(value_level_start_index, tensor):
        starts = (value_level_start_index.shape, value_level_start_index.dtype,
                  value_level_start_index.device)
    else:
        return None
    return (value.shape, value.dtype, value.device, value_spatial_shapes.shape,
            value_spatial_shapes.dtype, value_spatial_shapes.device, starts,
            sampling_locations.shape, sampling_locations.dtype, sampling_locations.device,
            attention_weights.shape, attention_weights.dtype, attention_weights.device,
            im2col_step)


def check_signature(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                    attention_weights, im2col_step=64, mixed_precision=False):
    """The shape, dtype and device checks (no contents), remembered per signature (and
    per ``mixed_precision``, which lets a 16-bit value take fp32 locations and weights)."""
    signature = _signature(value, value_spatial_shapes, value_level_start_index,
                           sampling_locations, attention_weights, im2col_step)
    if signature is not None and mixed_precision:
        signature = signature + ("mixed",)
    if signature is not None and value.device.type == "cpu":
        # CPU tensors are valid only with the interpreter on, which is read at call time
        signature = signature + (os.environ.get("TRITON_INTERPRET", "0"),)
    if signature is None or signature not in _valid_signatures:
        _check_signature(value, value_spatial_shapes, value_level_start_index,
                         sampling_locations, attention_weights, im2col_step, mixed_precision)
        if signature is not None:
            if len(_valid_signatures) > 256:
                _valid_signatures.clear()
            _valid_signatures[signature] = True


def validate_inputs(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                    attention_weights, im2col_step=64, *, check_contents=True,
                    mixed_precision=False):
    """Check the operator's arguments; raise TypeError/ValueError naming the culprit.

    Shapes: value (B, S, M, D); value_spatial_shapes (L, 2) integer; value_level_start_index
    (L,) integer, or None (then computed from the shapes); sampling_locations
    (B, Q, M, L, K, 2); attention_weights (B, Q, M, L, K).  value, sampling_locations and
    attention_weights share one floating dtype (with ``mixed_precision``, a float16 or
    bfloat16 value may also take float32 sampling_locations and attention_weights, as
    autocast leaves them); all tensors share one device.  Every eager
    call of the operator pays for this, so a signature (each argument's shape, dtype and
    device) found valid once is remembered and its checks are skipped next time; the
    contents check has its own memory (see above).
    """
    check_signature(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                    attention_weights, im2col_step, mixed_precision)
    total = value.shape[1]
    if not check_contents or torch.compiler.is_compiling():
        return
    if value.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if _contents_already_checked(value_spatial_shapes, value_level_start_index, total):
        return
    _check_contents(value_spatial_shapes, value_level_start_index, total)
    _remember_contents(value_spatial_shapes, value_level_start_index, total)


def _check_signature(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                     attention_weights, im2col_step, mixed_precision=False):
    """The shape, dtype and device checks, each error naming its argument."""
    names = ("value", "value_spatial_shapes", "value_level_start_index",
             "sampling_locations", "attention_weights")
    tensors = (value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights)
    if value_level_start_index is None:          # computed from the shapes
        names = names[:2] + names[3:]
        tensors = tensors[:2] + tensors[3:]
    for name, t in zip(names, tensors):
        _require_tensor(name, t)
    dtype = value.dtype
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"value must be a floating tensor (float16, bfloat16, float32 or "
                        f"float64), got {dtype}")
    params_dtype = dtype
    if mixed_precision and dtype in _HALF_DTYPES and sampling_locations.dtype is torch.float32:
        params_dtype = torch.float32            # a 16-bit value with fp32 parameters
    for name, t in (("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if t.dtype is not params_dtype:
            if t.dtype not in FLOAT_DTYPES:
                raise TypeError(f"{name} must be a floating tensor (float16, bfloat16, "
                                f"float32 or float64), got {t.dtype}")
            if params_dtype is not dtype:
                raise DtypeMismatchError(f"{name} has dtype {t.dtype} but sampling_locations "
                                         f"has float32 and value {dtype}: with mixed "
                                         "precision the dtypes of sampling_locations and "
                                         "attention_weights must both be float32")
            raise DtypeMismatchError(f"{name} has dtype {t.dtype} but value has {dtype}: "
                                     "the dtypes of value, sampling_locations and "
                                     "attention_weights must match")
    for name, t in (("value_spatial_shapes", value_spatial_shapes),
                    ("value_level_start_index", value_level_start_index)):
        if t is not None and t.dtype not in _INT_DTYPES:
            raise TypeError(f"{name} must be an int64 (or int32) tensor, got {t.dtype}")
    device = value.device
    for name, t in zip(names[1:], tensors[1:]):
        other = t.device
        if other is not device and other != device:
            raise ValueError(f"{name} is on {other} but value is on {device}: "
                             "all inputs must be on one device")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise ValueError("value is on the CPU, but this process compiles the kernels for the "
                         "GPU (TRITON_INTERPRET is off): move the inputs to a CUDA device, or "
                         "set TRITON_INTERPRET=1 before importing source_kernels to run them "
                         "in Triton's interpreter")
    if isinstance(im2col_step, bool) or not isinstance(im2col_step, int) or im2col_step <= 0:
        raise ValueError(f"im2col_step must be a positive int, got {im2col_step!r}")

    value_shape = value.shape
    shapes_shape = value_spatial_shapes.shape
    starts_shape = (value_spatial_shapes.shape[0] if value_spatial_shapes.dim() == 2 else 0,) \
        if value_level_start_index is None else value_level_start_index.shape
    loc_shape = sampling_locations.shape
    attn_shape = attention_weights.shape
    for name, shape, rank, layout in (
            ("value", value_shape, 4, "(B, S, M, D)"),
            ("value_spatial_shapes", shapes_shape, 2, "(L, 2)"),
            ("value_level_start_index", starts_shape, 1, "(L,)"),
            ("sampling_locations", loc_shape, 6, "(B, Q, M, L, K, 2)"),
            ("attention_weights", attn_shape, 5, "(B, Q, M, L, K)")):
        if len(shape) != rank:
            raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape "
                             f"{tuple(shape)}")
    batch, total, heads, channels = value_shape
    levels = shapes_shape[0]
    queries, points = loc_shape[1], loc_shape[4]
    if (shapes_shape[1] != 2 or levels == 0 or channels == 0 or heads == 0 or points == 0
            or starts_shape[0] != levels
            or loc_shape[0] != batch or loc_shape[2] != heads or loc_shape[3] != levels
            or loc_shape[5] != 2
            or attn_shape != (batch, queries, heads, levels, points)):
        _explain_shape_error(value_shape, shapes_shape, starts_shape, loc_shape, attn_shape)


def _explain_shape_error(value_shape, shapes_shape, starts_shape, loc_shape, attn_shape):
    """The slow path: find the first inconsistent size and say which argument holds it."""
    batch, _, heads, channels = value_shape
    levels = shapes_shape[0]
    if shapes_shape[1] != 2:
        raise ValueError(f"value_spatial_shapes has size {shapes_shape[1]} on axis 1 "
                         f"((H, W) per level); expected 2 (shape {tuple(shapes_shape)})")
    if levels == 0:
        raise ValueError("value_spatial_shapes describes no level: L must be at least 1")
    if channels == 0 or heads == 0:
        raise ValueError(f"value needs at least one head and one channel, got shape "
                         f"{tuple(value_shape)}")
    checks = (
        ("value_level_start_index", starts_shape, 0, levels, "L levels"),
        ("sampling_locations", loc_shape, 0, batch, "B, from value"),
        ("sampling_locations", loc_shape, 2, heads, "M heads, from value"),
        ("sampling_locations", loc_shape, 3, levels, "L levels, from value_spatial_shapes"),
        ("sampling_locations", loc_shape, 5, 2, "(x, y)"),
    )
    for name, shape, axis, expected, meaning in checks:
        if shape[axis] != expected:
            raise ValueError(f"{name} has size {shape[axis]} on axis {axis} ({meaning}); "
                             f"expected {expected} (shape {tuple(shape)})")
    if loc_shape[4] == 0:
        raise ValueError("sampling_locations has K = 0 points per level: K must be at least 1")
    expected = (batch, loc_shape[1], heads, levels, loc_shape[4])
    raise ValueError(f"attention_weights must have shape (B, Q, M, L, K) = {expected} "
                     f"from value and sampling_locations, got {tuple(attn_shape)}")
