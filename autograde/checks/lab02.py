"""Hidden checks of lab 02 (tensors are pointers)."""
from __future__ import annotations

import torch

from source_kernels import reference
from source_kernels.chips import lab02 as chips
from source_kernels.inputs import make_inputs, pyramid_shapes
from source_kernels.testing import assert_close_explained

from .common import forbid_references, fresh_generator


def check_contiguous_strides(contiguous_strides):
    gen = fresh_generator()
    seed = gen.initial_seed()
    shapes = [tuple(int(s) for s in torch.randint(1, 7, (n,), generator=gen)) for n in (1, 2, 4, 6)]
    shapes += [(3, 1, 5), (2, 22223, 8, 32)]
    for shape in shapes:
        expected = torch.empty(shape, device="meta").stride()     # no memory allocated
        with forbid_references(contiguous_strides):
            got = tuple(int(s) for s in contiguous_strides(shape))
        if got != tuple(expected):
            raise AssertionError(f"strides of a contiguous tensor of shape {shape}: expected "
                                 f"{tuple(expected)}, got {got} (hidden check, seed {seed})")


def check_flat_offset(flat_offset):
    gen = fresh_generator()
    seed = gen.initial_seed()
    base = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    for view in (base, base.permute(2, 0, 3, 1), base[:, 1:, ::2], base.transpose(0, 3)):
        for _ in range(10):
            index = tuple(int(torch.randint(0, n, (1,), generator=gen)) for n in view.shape)
            expected = int(view[index])             # base holds each element's own offset
            with forbid_references(flat_offset):
                got = int(flat_offset(index, view.stride()))
            got += view.storage_offset()
            if got != expected:
                raise AssertionError(
                    f"index {index} of a view with shape {tuple(view.shape)} and strides "
                    f"{view.stride()}: expected offset {expected - view.storage_offset()}, got "
                    f"{got - view.storage_offset()} (hidden check, seed {seed})")


def check_msda_flat(msda_flat):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for batch, queries, heads, channels, shapes, points in (
            (2, 3, 2, 3, [[3, 4], [2, 2]], 2), (1, 2, 3, 1, [[2, 5], [1, 3], [2, 1]], 1)):
        inputs = make_inputs(batch, queries, heads, channels, shapes, points, dtype=torch.float64,
                             seed=int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen)),
                             outside=0.1)
        expected = reference.msda_naive(*inputs.values())
        value, _, _, loc, attn = inputs.values()
        sizes = {"B": batch, "S": value.shape[1], "M": heads, "D": channels, "Q": queries,
                 "L": len(shapes), "K": points}
        starts = inputs["value_level_start_index"].tolist()
        with forbid_references(msda_flat):
            got = msda_flat(value.reshape(-1).clone(), loc.reshape(-1).clone(),
                            attn.reshape(-1).clone(), dict(sizes), [list(s) for s in shapes],
                            list(starts))
        if not isinstance(got, torch.Tensor) or got.dim() != 1:
            raise AssertionError("msda_flat must return a 1-D tensor of B*Q*M*D elements, got "
                                 f"{getattr(got, 'shape', type(got))} (hidden check, seed {seed})")
        assert_close_explained(got, expected.reshape(-1), atol=1e-10, rtol=1e-8,
                               axes=("flat output offset",),
                               what=f"msda_flat (hidden check, seed {seed})",
                               hint="output offset of (b, q, m, d) is ((b*Q + q)*M + m)*D + d")


def check_int32_wrap(int32_wrap):
    gen = fresh_generator()
    seed = gen.initial_seed()
    values = [0, 5, -7, 2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 32, 3 * 2 ** 32 + 11]
    values += [int(v) for v in torch.randint(-2 ** 40, 2 ** 40, (20,), generator=gen)]
    for n in values:
        # what torch stores when it narrows to int32: the low 32 bits, two's complement
        expected = int(torch.tensor(n % 2 ** 32, dtype=torch.int64).to(torch.int32))
        with forbid_references(int32_wrap):
            got = int(int32_wrap(n))
        if got != expected:
            raise AssertionError(f"int32_wrap({n}): expected {expected}, got {got} "
                                 f"(hidden check, seed {seed})")


def check_first_overflowing_batch(first_overflowing_batch):
    gen = fresh_generator()
    seed = gen.initial_seed()
    cases = [(pyramid_shapes(), 8, 32), (pyramid_shapes(1600, 2666), 8, 32)]
    for _ in range(4):
        height = int(torch.randint(200, 3000, (1,), generator=gen))
        width = int(torch.randint(200, 3000, (1,), generator=gen))
        heads = int(torch.randint(1, 17, (1,), generator=gen))
        channels = int(torch.randint(1, 65, (1,), generator=gen))
        cases.append((pyramid_shapes(height, width), heads, channels))
    for shapes, heads, channels in cases:
        expected = chips.first_overflowing_batch(shapes, heads, channels)
        shape_list = [[int(h), int(w)] for h, w in shapes.tolist()]
        with forbid_references(first_overflowing_batch):
            got = int(first_overflowing_batch(shape_list, heads, channels))
        if got != expected:
            per_batch = sum(h * w for h, w in shape_list) * heads * channels
            raise AssertionError(
                f"levels {shape_list}, M={heads}, D={channels} ({per_batch} value elements per "
                f"batch): expected {expected}, got {got}; at B={got} the largest flat index is "
                f"{got * per_batch - 1} (hidden check, seed {seed})")
