"""Comparisons that say exactly what is wrong: used by the tests, the labs' visible checks
and the hidden checks alike."""
from __future__ import annotations

import torch

__all__ = ["explain_mismatch", "assert_close_explained", "MSDA_OUTPUT_AXES"]

MSDA_OUTPUT_AXES = ("batch", "query", "channel")


def explain_mismatch(got, expected, *, atol, rtol, axes=None, what="result"):
    """Return None when ``got`` matches ``expected`` within atol + rtol*|expected|, else a
    message naming the shape problem or the worst element (its index by axis name, the
    expected and the actual value, the difference and the tolerance) and how many differ."""
    got = torch.as_tensor(got)
    expected = torch.as_tensor(expected)
    if tuple(got.shape) != tuple(expected.shape):
        return f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    if got.dtype != expected.dtype and not (got.is_floating_point() and expected.is_floating_point()):
        return f"{what}: expected dtype {expected.dtype}, got {got.dtype}"
    g = got.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if g.numel() == 0:
        return None
    nan_mismatch = torch.isnan(g) != torch.isnan(e)
    diff = (g - e).abs().nan_to_num(nan=0.0)
    diff = torch.where(nan_mismatch, torch.full_like(diff, float("inf")), diff)
    allowed = atol + rtol * e.abs().nan_to_num(nan=0.0)
    bad = diff > allowed
    if not bad.any():
        return None
    excess = torch.where(bad, diff - allowed, torch.zeros_like(diff))
    flat = int(excess.reshape(-1).argmax())
    index = torch.unravel_index(torch.tensor(flat), g.shape)
    index = [int(i) for i in index]
    names = axes if axes is not None and len(axes) == len(index) else [f"dim{i}" for i in range(len(index))]
    where = ", ".join(f"{n} {i}" for n, i in zip(names, index))
    return (f"{what}: at {where}: expected {e[tuple(index)].item():.6g}, got "
            f"{g[tuple(index)].item():.6g} (|diff| {diff[tuple(index)].item():.3g}, tolerance "
            f"{allowed[tuple(index)].item():.3g}); {int(bad.sum())} of {bad.numel()} elements differ")


def assert_close_explained(got, expected, *, atol=1e-5, rtol=1e-5, axes=None, what="result",
                           hint=None):
    """Raise AssertionError with ``explain_mismatch``'s message (and an optional hint)."""
    message = explain_mismatch(got, expected, atol=atol, rtol=rtol, axes=axes, what=what)
    if message is not None:
        raise AssertionError(message + (f"\nHint: {hint}" if hint else ""))
