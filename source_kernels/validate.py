"""Input validation: bad input gets an error that names the argument, never a wrong answer.

Shape, dtype and device checks cost nothing on the device.  The checks on the *contents* of
``value_spatial_shapes`` and ``value_level_start_index`` (positive sizes, S equal to the sum
of H*W, start offsets equal to the running sum) need their values on the host: free when
those tensors live on the CPU; for GPU tensors one small copy, remembered per tensor object
and version so that a model calling the op in every layer with the same shapes pays it once,
and skipped while a CUDA graph is being captured (a copy to the host is not allowed then).
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["validate_inputs", "FLOAT_DTYPES"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_DTYPES = (torch.int32, torch.int64)
_checked_contents: dict = {}


def _require_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _require_rank(name, t, rank, layout):
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape "
                         f"{tuple(t.shape)}")


def _require_size(name, t, axis, expected, meaning):
    if t.shape[axis] != expected:
        raise ValueError(f"{name} has size {t.shape[axis]} on axis {axis} ({meaning}); "
                         f"expected {expected} (shape {tuple(t.shape)})")


def _check_contents(spatial_shapes, level_start_index, total):
    shapes = spatial_shapes.tolist()
    starts = level_start_index.tolist()
    running = 0
    for lvl, ((height, width), start) in enumerate(zip(shapes, starts)):
        if height <= 0 or width <= 0:
            raise ValueError(f"value_spatial_shapes[{lvl}] = ({height}, {width}): every level "
                             "needs a positive height and width")
        if start != running:
            raise ValueError(f"value_level_start_index[{lvl}] = {start}, but levels before it "
                             f"hold {running} rows: expected {running}")
        running += height * width
    if running != total:
        raise ValueError(f"value has S = {total} rows but value_spatial_shapes describe "
                         f"sum(H*W) = {running}")


def _contents_already_checked(spatial_shapes, level_start_index, total):
    key = (id(spatial_shapes), spatial_shapes._version, id(level_start_index),
           level_start_index._version, total)
    refs = _checked_contents.get(key)
    return refs is not None and refs[0]() is spatial_shapes and refs[1]() is level_start_index


def _remember_contents(spatial_shapes, level_start_index, total):
    if len(_checked_contents) > 256:
        _checked_contents.clear()
    key = (id(spatial_shapes), spatial_shapes._version, id(level_start_index),
           level_start_index._version, total)
    _checked_contents[key] = (weakref.ref(spatial_shapes), weakref.ref(level_start_index))


def validate_inputs(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                    attention_weights, im2col_step=64, *, check_contents=True):
    """Check the operator's arguments; raise TypeError/ValueError naming the culprit.

    Shapes: value (B, S, M, D); value_spatial_shapes (L, 2) integer; value_level_start_index
    (L,) integer; sampling_locations (B, Q, M, L, K, 2); attention_weights (B, Q, M, L, K).
    value, sampling_locations and attention_weights share one floating dtype; all five
    tensors share one device.
    """
    names = ("value", "value_spatial_shapes", "value_level_start_index",
             "sampling_locations", "attention_weights")
    tensors = (value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights)
    for name, t in zip(names, tensors):
        _require_tensor(name, t)
    for name, t in ((names[0], value), (names[3], sampling_locations),
                    (names[4], attention_weights)):
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a floating tensor (float16, bfloat16, float32 or "
                            f"float64), got {t.dtype}")
    for name, t in ((names[3], sampling_locations), (names[4], attention_weights)):
        if t.dtype != value.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but value has {value.dtype}: pass "
                            "all three floating tensors in one dtype")
    for name, t in ((names[1], value_spatial_shapes), (names[2], value_level_start_index)):
        if t.dtype not in _INT_DTYPES:
            raise TypeError(f"{name} must be an int64 (or int32) tensor, got {t.dtype}")
    for name, t in zip(names[1:], tensors[1:]):
        if t.device != value.device:
            raise ValueError(f"{name} is on {t.device} but value is on {value.device}: "
                             "all inputs must be on one device")
    if isinstance(im2col_step, bool) or not isinstance(im2col_step, int) or im2col_step <= 0:
        raise ValueError(f"im2col_step must be a positive int, got {im2col_step!r}")

    _require_rank("value", value, 4, "(B, S, M, D)")
    _require_rank("value_spatial_shapes", value_spatial_shapes, 2, "(L, 2)")
    _require_rank("value_level_start_index", value_level_start_index, 1, "(L,)")
    _require_rank("sampling_locations", sampling_locations, 6, "(B, Q, M, L, K, 2)")
    _require_rank("attention_weights", attention_weights, 5, "(B, Q, M, L, K)")

    batch, total, heads, channels = value.shape
    levels = value_spatial_shapes.shape[0]
    _require_size("value_spatial_shapes", value_spatial_shapes, 1, 2, "(H, W) per level")
    if levels == 0:
        raise ValueError("value_spatial_shapes describes no level: L must be at least 1")
    if channels == 0 or heads == 0:
        raise ValueError(f"value needs at least one head and one channel, got shape "
                         f"{tuple(value.shape)}")
    _require_size("value_level_start_index", value_level_start_index, 0, levels, "L levels")
    _require_size("sampling_locations", sampling_locations, 0, batch, "B, from value")
    _require_size("sampling_locations", sampling_locations, 2, heads, "M heads, from value")
    _require_size("sampling_locations", sampling_locations, 3, levels,
                  "L levels, from value_spatial_shapes")
    _require_size("sampling_locations", sampling_locations, 5, 2, "(x, y)")
    queries, points = sampling_locations.shape[1], sampling_locations.shape[4]
    if points == 0:
        raise ValueError("sampling_locations has K = 0 points per level: K must be at least 1")
    expected = (batch, queries, heads, levels, points)
    if tuple(attention_weights.shape) != expected:
        raise ValueError(f"attention_weights must have shape (B, Q, M, L, K) = {expected} "
                         f"from value and sampling_locations, got "
                         f"{tuple(attention_weights.shape)}")

    if not check_contents:
        return
    if value.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if _contents_already_checked(value_spatial_shapes, value_level_start_index, total):
        return
    _check_contents(value_spatial_shapes, value_level_start_index, total)
    _remember_contents(value_spatial_shapes, value_level_start_index, total)
