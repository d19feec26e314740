"""Hidden checks of lab 01 (the spec): corner weights, one bilinear sample, naive MSDA."""
from __future__ import annotations

import math

import torch

from source_kernels import reference
from source_kernels.inputs import make_inputs
from source_kernels.testing import assert_close_explained, explain_mismatch

from .common import forbid_references, fresh_generator

CORNERS = ("(y0, x0) top-left", "(y0, x1) top-right", "(y1, x0) bottom-left",
           "(y1, x1) bottom-right")


def check_corner_weights(bilinear_corner_weights):
    gen = fresh_generator()
    seed = gen.initial_seed()
    points = (torch.rand(40, 2, generator=gen, dtype=torch.float64) * 12 - 3).tolist()
    points += [[2.0, 3.0], [-0.5, -0.5], [0.0, 4.75], [-1.25, 0.5]]   # integers, negatives
    for x_im, y_im in points:
        expected = reference.bilinear_corner_weights(x_im, y_im)
        with forbid_references(bilinear_corner_weights):
            got = bilinear_corner_weights(x_im, y_im)
        got = list(got)
        if len(got) != 4:
            raise AssertionError(f"at pixel coordinate ({x_im:.4f}, {y_im:.4f}): expected 4 "
                                 f"corners, got {len(got)} (hidden check, seed {seed})")
        for name, (row, col, weight), (erow, ecol, eweight) in zip(CORNERS, got, expected):
            if (int(row), int(col)) != (erow, ecol):
                raise AssertionError(
                    f"corner {name} of pixel coordinate ({x_im:.4f}, {y_im:.4f}): expected "
                    f"(row, col) = ({erow}, {ecol}), got ({row}, {col}) (hidden check, "
                    f"seed {seed}). Use math.floor, not int(): int() rounds -0.5 up to 0.")
            if not math.isclose(float(weight), eweight, rel_tol=1e-9, abs_tol=1e-12):
                raise AssertionError(
                    f"corner {name} of pixel coordinate ({x_im:.4f}, {y_im:.4f}): expected "
                    f"weight {eweight:.6f}, got {float(weight):.6f} (hidden check, seed {seed})")


def check_bilinear_sample(bilinear_sample_naive):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for height, width, channels in ((4, 6, 3), (1, 3, 2), (5, 1, 1)):
        image = torch.randn(height, width, channels, generator=gen, dtype=torch.float64)
        points = (torch.rand(12, 2, generator=gen, dtype=torch.float64) * 1.4 - 0.2).tolist()
        points += [[0.0, 0.0], [1.0, 1.0], [0.5 / width, 0.5 / height]]   # edges, a centre
        for x, y in points:
            expected = reference.bilinear_sample_naive(image, x, y)
            with forbid_references(bilinear_sample_naive):
                got = bilinear_sample_naive(image.clone(), x, y)
            message = explain_mismatch(got, expected, atol=1e-12, rtol=1e-9, axes=("channel",),
                                       what=f"sample of a {height}x{width} map at (x, y) = "
                                            f"({x:.4f}, {y:.4f})")
            if message is not None:
                raise AssertionError(message + f" (hidden check, seed {seed})")


def check_msda_naive(msda_naive):
    gen = fresh_generator()
    seed = gen.initial_seed()
    cases = (dict(batch=2, queries=3, heads=2, channels=3, spatial_shapes=[[4, 5], [2, 3], [1, 1]],
                  points=2, dtype=torch.float64),
             dict(batch=1, queries=2, heads=1, channels=2, spatial_shapes=[[3, 2]], points=3,
                  dtype=torch.float32))
    for case in cases:
        inputs = make_inputs(case["batch"], case["queries"], case["heads"], case["channels"],
                             case["spatial_shapes"], case["points"], dtype=case["dtype"],
                             seed=int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen)),
                             outside=0.1)
        expected = reference.msda_naive(*inputs.values())
        with forbid_references(msda_naive):
            got = msda_naive(*(t.clone() for t in inputs.values()))
        if isinstance(got, torch.Tensor) and got.dtype != expected.dtype:
            raise AssertionError(f"msda_naive: expected the dtype of value ({expected.dtype}), "
                                 f"got {got.dtype} (hidden check, seed {seed})")
        tol = dict(atol=1e-10, rtol=1e-8) if case["dtype"] == torch.float64 else \
            dict(atol=1e-5, rtol=1e-5)
        assert_close_explained(got, expected, axes=("batch", "query", "head*D + channel"),
                               what=f"msda_naive with {len(case['spatial_shapes'])} level(s) "
                                    f"(hidden check, seed {seed})", **tol)
