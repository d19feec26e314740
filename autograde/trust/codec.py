"""Values in and out of the grading kernel as plain JSON (never pickle).

The grading kernel sends the grader what a student's function returned; the grader decodes it
in its own process.  Everything the kernel sends is untrusted, so decoding only builds
tensors, numbers, strings and containers, with a size cap, and never runs code.

Encoded forms: JSON scalars as themselves; ``{"$t": "tuple"|"list", "v": [...]}``;
``{"$t": "dict", "k": [...], "v": [...]}`` (keys encoded too); ``{"$t": "tensor", "dtype",
"shape", "device", "grad", "b64"}`` (raw little-endian bytes); ``{"$t": "float", "v":
"nan"|"inf"|"-inf"}``; ``{"$t": "dtype"|"size"|"slice"|"complex", ...}``; anything else is
``{"$t": "opaque", "type": name}``, which decodes to an :class:`Opaque` placeholder.
"""
from __future__ import annotations

import base64
import math

__all__ = ["encode", "decode", "Opaque", "DecodeError", "encoded_size"]

# dtype name -> (torch attribute, numpy-compatible element size, bit-cast storage dtype)
_DTYPES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8, "complex128": 16,
}
_MAX_DEPTH = 64


class DecodeError(ValueError):
    """The kernel sent something that is not a valid encoded value."""


class Opaque:
    """Stands for a value the kernel could not encode (an object of another type)."""

    def __init__(self, type_name: str):
        self.type_name = str(type_name)[:200]

    def __repr__(self):
        return f"<unencodable {self.type_name}>"


def _torch():
    import torch
    return torch


def encode(value, _depth=0):
    """Encode ``value`` (tensors, numbers, strings, containers) as JSON-ready data."""
    if _depth > _MAX_DEPTH:
        return {"$t": "opaque", "type": "nesting too deep"}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2 ** 63 else {"$t": "bigint", "v": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$t": "float", "v": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, complex):
        return {"$t": "complex", "re": encode(value.real), "im": encode(value.imag)}
    if isinstance(value, slice):
        return {"$t": "slice", "v": [encode(value.start, _depth + 1), encode(value.stop, _depth + 1),
                                     encode(value.step, _depth + 1)]}
    module = type(value).__module__ or ""
    if module.startswith("torch"):
        torch = _torch()
        if isinstance(value, torch.Tensor):
            return _encode_tensor(value)
        if isinstance(value, torch.dtype):
            return {"$t": "dtype", "v": str(value).replace("torch.", "")}
        if isinstance(value, torch.Size):
            return {"$t": "size", "v": [int(v) for v in value]}
        if isinstance(value, torch.device):
            return {"$t": "device", "v": str(value)}
    if module.startswith("numpy"):
        import numpy as np
        if isinstance(value, np.ndarray):
            return _encode_tensor(_torch().from_numpy(np.ascontiguousarray(value)), numpy=True)
        if isinstance(value, np.generic):
            return encode(value.item(), _depth + 1)
    if isinstance(value, tuple) and hasattr(value, "_fields"):     # a namedtuple: as a tuple
        return {"$t": "tuple", "v": [encode(v, _depth + 1) for v in value]}
    if isinstance(value, tuple):
        return {"$t": "tuple", "v": [encode(v, _depth + 1) for v in value]}
    if isinstance(value, list):
        return {"$t": "list", "v": [encode(v, _depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"$t": "dict", "k": [encode(k, _depth + 1) for k in value.keys()],
                "v": [encode(v, _depth + 1) for v in value.values()]}
    return {"$t": "opaque", "type": f"{module}.{type(value).__qualname__}"}


def _encode_tensor(t, numpy=False):
    torch = _torch()
    name = str(t.dtype).replace("torch.", "")
    if name not in _DTYPES:
        return {"$t": "opaque", "type": f"tensor of {name}"}
    device = t.device.type
    grad = bool(t.requires_grad)
    data = t.detach()
    if data.is_conj():
        data = data.resolve_conj()
    data = data.to("cpu").contiguous()
    if name == "bfloat16":
        raw = data.view(torch.int16).numpy().tobytes()
    elif name == "bool":
        raw = data.to(torch.uint8).numpy().tobytes()
    else:
        raw = data.numpy().tobytes()
    return {"$t": "ndarray" if numpy else "tensor", "dtype": name, "shape": list(data.shape),
            "device": device, "grad": grad, "b64": base64.b64encode(raw).decode("ascii")}


def encoded_size(obj) -> int:
    """An upper bound of the JSON size of an encoded value, in bytes (cheap)."""
    if isinstance(obj, dict):
        return sum(len(str(k)) + encoded_size(v) + 4 for k, v in obj.items())
    if isinstance(obj, list):
        return sum(encoded_size(v) + 1 for v in obj) + 2
    return len(str(obj)) + 2


def decode(obj, *, device_map=None, max_bytes=64 * 2 ** 20, _budget=None, _depth=0):
    """Decode what :func:`encode` produced.  Raises :class:`DecodeError` on anything else.

    ``device_map``: a function from the recorded device type ("cpu", "cuda") to the device to
    create the tensor on (default: CPU)."""
    if _budget is None:
        _budget = [max_bytes]
    if _depth > _MAX_DEPTH:
        raise DecodeError("nesting too deep")
    if obj is None or isinstance(obj, (bool, str, int, float)):
        if isinstance(obj, str):
            _spend(_budget, len(obj))
        return obj
    if isinstance(obj, list):                   # only inside containers; never top-level
        raise DecodeError("bare list")
    if not isinstance(obj, dict) or "$t" not in obj:
        raise DecodeError(f"not an encoded value: {type(obj).__name__}")
    kind = obj["$t"]
    sub = dict(device_map=device_map, max_bytes=max_bytes, _budget=_budget, _depth=_depth + 1)
    if kind in ("tuple", "list"):
        items = obj.get("v")
        if not isinstance(items, list):
            raise DecodeError("container without items")
        _spend(_budget, 8 * len(items))
        values = [decode(v, **sub) for v in items]
        return tuple(values) if kind == "tuple" else values
    if kind == "dict":
        keys, values = obj.get("k"), obj.get("v")
        if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
            raise DecodeError("malformed dict")
        out = {}
        for k, v in zip(keys, values):
            key = decode(k, **sub)
            try:
                hash(key)
            except TypeError:
                raise DecodeError("unhashable dict key") from None
            out[key] = decode(v, **sub)
        return out
    if kind == "float":
        v = obj.get("v")
        if v not in ("nan", "inf", "-inf"):
            raise DecodeError("bad float")
        return float(v)
    if kind == "bigint":
        v = str(obj.get("v", ""))
        if len(v) > 4000 or not v.lstrip("-").isdigit():
            raise DecodeError("bad integer")
        return int(v)
    if kind == "complex":
        return complex(_num(decode(obj.get("re"), **sub)), _num(decode(obj.get("im"), **sub)))
    if kind == "slice":
        parts = obj.get("v")
        if not isinstance(parts, list) or len(parts) != 3:
            raise DecodeError("bad slice")
        return slice(*(decode(p, **sub) for p in parts))
    if kind == "dtype":
        name = obj.get("v")
        if name not in _DTYPES:
            raise DecodeError(f"unknown dtype {name!r}")
        return getattr(_torch(), name)
    if kind == "size":
        v = obj.get("v")
        if not isinstance(v, list) or not all(isinstance(i, int) for i in v):
            raise DecodeError("bad size")
        return _torch().Size(v)
    if kind == "device":
        v = str(obj.get("v", "cpu"))
        return _torch().device(v.split(":")[0] if v.split(":")[0] in ("cpu", "cuda") else "cpu")
    if kind in ("tensor", "ndarray"):
        return _decode_tensor(obj, kind, device_map, _budget)
    if kind == "opaque":
        return Opaque(obj.get("type", "?"))
    raise DecodeError(f"unknown kind {kind!r}")


def _num(v):
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise DecodeError("bad number")
    return v


def _spend(budget, n):
    budget[0] -= n
    if budget[0] < 0:
        raise DecodeError("record too large")


def _decode_tensor(obj, kind, device_map, budget):
    torch = _torch()
    name = obj.get("dtype")
    shape = obj.get("shape")
    if name not in _DTYPES:
        raise DecodeError(f"unknown dtype {name!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape) \
            or len(shape) > 16:
        raise DecodeError("bad shape")
    count = 1
    for s in shape:
        count *= s
    nbytes = count * _DTYPES[name]
    b64 = obj.get("b64")
    if not isinstance(b64, str) or len(b64) > 4 * (nbytes // 3 + 2):
        raise DecodeError("tensor data does not match its shape")
    _spend(budget, nbytes)
    try:
        raw = base64.b64decode(b64.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise DecodeError("tensor data is not base64") from None
    if len(raw) != nbytes:
        raise DecodeError("tensor data does not match its shape")
    buffer = bytearray(raw)
    if name == "bfloat16":
        t = torch.frombuffer(buffer, dtype=torch.int16).view(torch.bfloat16) if count else \
            torch.empty(0, dtype=torch.bfloat16)
    elif name == "bool":
        t = torch.frombuffer(buffer, dtype=torch.uint8).to(torch.bool) if count else \
            torch.empty(0, dtype=torch.bool)
    else:
        dtype = getattr(torch, name)
        t = torch.frombuffer(buffer, dtype=dtype) if count else torch.empty(0, dtype=dtype)
    t = t.reshape(shape).clone()
    if kind == "ndarray":
        return t.numpy()
    device = device_map(obj.get("device", "cpu")) if device_map else "cpu"
    if str(device) != "cpu":
        t = t.to(device)
    if obj.get("grad") is True and t.is_floating_point():
        t.requires_grad_(True)
    return t
