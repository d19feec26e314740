"""Hidden checks of lab 00 (the idea): the three layers on fresh random inputs and weights."""
from __future__ import annotations

import torch

from source_kernels.chips import lab00 as chips
from source_kernels.inputs import level_start_index
from source_kernels.testing import assert_close_explained

from .common import forbid_references, fresh_generator

TOL = dict(atol=1e-10, rtol=1e-8)


def _randomise(module, generator):
    """Random weights everywhere, so that offsets and weights depend on the query."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator,
                                        dtype=parameter.dtype) * 0.3)
    return module


def check_deformable_attention(deformable_attention):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for batch, height, width, channels, queries, points in ((2, 5, 7, 3, 4, 3), (1, 1, 4, 2, 3, 1)):
        feature = torch.randn(batch, height, width, channels, generator=gen, dtype=torch.float64)
        # some locations a little outside the map, where zero padding matters
        loc = torch.rand(batch, queries, points, 2, generator=gen, dtype=torch.float64) * 1.3 - 0.15
        attn = torch.rand(batch, queries, points, generator=gen, dtype=torch.float64)
        expected = chips.deformable_attention(feature, loc, attn)
        with forbid_references(deformable_attention):
            got = deformable_attention(feature.clone(), loc.clone(), attn.clone())
        assert_close_explained(got, expected, axes=("batch", "query", "channel"), **TOL,
                               what=f"deformable_attention on a {height}x{width} map "
                                    f"(hidden check, seed {seed})")


def check_cross_attention(layer_class):
    gen = fresh_generator()
    seed = gen.initial_seed()
    embed_dim, heads, points = 12, 3, 2
    reference = _randomise(chips.DeformableCrossAttention(embed_dim, heads, points).double(), gen)
    student = layer_class(embed_dim, heads, points).double()
    student.load_state_dict(reference.state_dict())
    batch, queries, height, width = 2, 5, 4, 6
    query = torch.randn(batch, queries, embed_dim, generator=gen, dtype=torch.float64)
    ref_points = torch.rand(batch, queries, 2, generator=gen, dtype=torch.float64)
    memory = torch.randn(batch, height * width, embed_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        expected = reference(query, ref_points, memory, (height, width))
        with forbid_references(layer_class.forward):
            got = student(query, ref_points, memory, (height, width))
    assert_close_explained(got, expected, axes=("batch", "query", "channel"), **TOL,
                           what=f"DeformableCrossAttention with random weights "
                                f"(hidden check, seed {seed})",
                           hint="offsets are in pixels: divide by (W, H) before adding them "
                                "to the reference point; softmax over the K points of a head")


def check_msdeform_attn(layer_class):
    gen = fresh_generator()
    seed = gen.initial_seed()
    embed_dim, heads, levels, points = 8, 2, 3, 2
    reference = _randomise(chips.MSDeformAttn(embed_dim, heads, levels, points).double(), gen)
    student = layer_class(embed_dim, heads, levels, points).double()
    student.load_state_dict(reference.state_dict())
    shapes = torch.tensor([[5, 6], [3, 3], [1, 2]])
    starts = level_start_index(shapes)
    total = int(shapes.prod(1).sum())
    batch, queries = 2, 4
    query = torch.randn(batch, queries, embed_dim, generator=gen, dtype=torch.float64)
    ref_points = torch.rand(batch, queries, 2, generator=gen, dtype=torch.float64)
    memory = torch.randn(batch, total, embed_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        exp_loc, exp_attn = reference.sampling(query, ref_points, shapes)
        expected = reference(query, ref_points, memory, shapes, starts)
        with forbid_references(layer_class.forward, layer_class.sampling):
            got_loc, got_attn = student.sampling(query, ref_points, shapes)
            got = student(query, ref_points, memory, shapes, starts)
    what = f"(hidden check, seed {seed})"
    assert_close_explained(got_loc, exp_loc, **TOL,
                           axes=("batch", "query", "head", "level", "point", "xy"),
                           what=f"MSDeformAttn.sampling locations {what}",
                           hint="level l's offsets are divided by (W_l, H_l) of that level")
    assert_close_explained(got_attn, exp_attn, **TOL,
                           axes=("batch", "query", "head", "level", "point"),
                           what=f"MSDeformAttn.sampling attention weights {what}",
                           hint="the softmax runs over all L*K samples of a head, not per level")
    assert_close_explained(got, expected, **TOL, axes=("batch", "query", "channel"),
                           what=f"MSDeformAttn output {what}")
