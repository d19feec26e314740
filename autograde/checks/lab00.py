"""Checks of lab 00 (the idea): deformable attention, the cross-attention layer and the
multi-scale layer, in plain PyTorch.

Each check serves the visible cell (a shown ``seed=``) and the hidden one (the grader's seed).
It runs the student's code on every case first; only when it judges does it compute the
expected values (the chips of this lab, with the same random weights) and, on a mismatch, the
outputs of the usual wrong versions of the stage (a swapped axis, a missing division, the
softmax over the wrong axis...): the one that equals the student's output is named.
"""
from __future__ import annotations

import torch

from source_kernels.inputs import level_start_index

from .common import Raised, attempt, forbid_references, fresh_generator, judging, show

TOL = dict(atol=1e-10, rtol=1e-8)
OUT_AXES = ("batch", "query", "channel")


def _chips():
    from source_kernels.chips import lab00
    return lab00


def _msda(*args):
    from source_kernels.reference import msda_grid_sample
    return msda_grid_sample(*args)


def _random_weights(gen, embed_dim, samples):
    """A state dict for the layers' four linear maps (their names and shapes are given in the
    lab), random everywhere so that offsets and weights depend on the query: ``samples`` is
    M*K for the cross-attention layer, M*L*K for the multi-scale one."""
    shapes = {"value_proj": (embed_dim, embed_dim), "sampling_offsets": (2 * samples, embed_dim),
              "attention_weights": (samples, embed_dim), "output_proj": (embed_dim, embed_dim)}
    state = {}
    for name, (rows, cols) in shapes.items():
        state[f"{name}.weight"] = torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 0.3
        state[f"{name}.bias"] = torch.randn(rows, generator=gen, dtype=torch.float64) * 0.3
    return state


def _raised(got: Raised) -> str:
    """What a student's call raised, with the line of their code that raised it: "NameError
    (in sampling, at `x = heads * 2`): name 'heads' is not defined"."""
    from .demo import where          # judging only: the grading kernel never holds a Raised
    return f"{type(got.exc).__name__}{where(got.exc)}: {got.exc}"


def _raised_hint(got: Raised) -> str:
    """The hint for an exception of the student's own code: what a NameError means, else
    where to look (the line named above raised it)."""
    if isinstance(got.exc, NameError) and getattr(got.exc, "name", None):
        return (f"`{got.exc.name}` has no value when that line runs: nothing assigned or "
                "imported it before (check its spelling, and that it is set earlier in the "
                "function or imported above)")
    return ("no usual mistake of this layer raises this; the line named above raised it: "
            "print the shapes of what it uses on the check's inputs (the sizes are in the "
            "first line)")


def _same(got, expected):
    return isinstance(got, torch.Tensor) and got.shape == expected.shape and \
        torch.allclose(got.detach().double(), expected.double(), **TOL)


def _compare(got, expected, what, axes, variants, fallback):
    """Raise AssertionError when ``got`` differs from ``expected``: the shape, or the worst
    element, then the hint of the first variant (hint, output) that ``got`` equals (or, when
    ``variants`` gives a hint as a string, that hint)."""
    from source_kernels.testing import explain_mismatch

    if isinstance(got, Raised):
        raise AssertionError(f"{what}: raised {_raised(got)}\nHint: {fallback}")
    if got is None:
        raise AssertionError(f"{what}: expected a torch.Tensor, got None\nHint: the function "
                             "returned None: a `return` is missing (the last line computes the "
                             "result without returning it, or a path through the function ends "
                             "without one), or what it returns is None")
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    message = explain_mismatch(got.detach(), expected, axes=axes, what=what, **TOL)
    if message is None:
        return
    if got.shape != expected.shape:
        names = "(" + ", ".join(a if a != "x/y" else "2" for a in axes) + ")"
        raise AssertionError(f"{message}\nHint: the result is {names} = "
                             f"{tuple(expected.shape)}; {fallback}")
    found = variants()
    hint = found if isinstance(found, str) or found is None else \
        next((text for text, output in found if _same(got, output)), None)
    raise AssertionError(f"{message}\nHint: {hint or fallback}")


# ------------------------------------------------------------------ stage 1
def _attention_cases(gen):
    """(what, feature, sampling_locations, attention_weights), float64."""
    feature = torch.arange(12, dtype=torch.float64).reshape(1, 2, 2, 3)
    cases = [("two samples at the centres of pixels (row 0, col 0) and (row 0, col 1) of a "
              "2 x 2 map, weights 0.5 and 0.5", feature,
              torch.tensor([[[[0.25, 0.25], [0.75, 0.25]]]], dtype=torch.float64),
              torch.tensor([[[0.5, 0.5]]], dtype=torch.float64))]
    for batch, height, width, channels, queries, points in ((2, 5, 7, 3, 4, 3),
                                                            (1, 1, 4, 2, 3, 1)):
        feature = torch.randn(batch, height, width, channels, generator=gen, dtype=torch.float64)
        # some locations a little outside the map, where zero padding matters
        loc = torch.rand(batch, queries, points, 2, generator=gen, dtype=torch.float64) \
            * 1.3 - 0.15
        attn = torch.rand(batch, queries, points, generator=gen, dtype=torch.float64)
        cases.append((f"a random {height} x {width} map, {queries} queries of {points} points, "
                      "some locations outside", feature, loc, attn))
    return cases


def _attention_variants(feature, loc, attn):
    """(hint, output) of the usual wrong versions of deformable_attention."""
    import torch.nn.functional as F

    def run(image=None, grid=None, align=False, padding="zeros", weights=attn):
        image = feature.permute(0, 3, 1, 2) if image is None else image
        grid = 2 * loc - 1 if grid is None else grid
        sampled = F.grid_sample(image, grid, mode="bilinear", padding_mode=padding,
                                align_corners=align)
        return (sampled * weights[:, None]).sum(-1).transpose(1, 2)

    yield ("you pass align_corners=True: this course's convention is align_corners=False, "
           "which puts the centre of pixel j at (j + 0.5) / W", run(align=True))
    yield ("grid_sample wants coordinates in [-1, 1]: pass 2 * p - 1, not p", run(grid=loc))
    yield ("x and y are swapped: the last axis of the locations is (x, y), x along the width, "
           "and grid_sample reads it in that order; or the image's height and width are "
           "swapped: feature is (B, H, W, D) and permute(0, 3, 1, 2) gives (B, D, H, W)",
           run(grid=(2 * loc - 1).flip(-1)))
    yield ("pixels outside the map count as zero: padding_mode=\"zeros\"",
           run(padding="border"))
    yield ("each sample is multiplied by its attention weight before the sum over the K points",
           run(weights=torch.ones_like(attn)))
    yield ("sum over the K points with the weights; do not average them",
           run(weights=attn / attn.shape[-1]))


def check_deformable_attention(deformable_attention, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _attention_cases(gen)
    with forbid_references(deformable_attention):
        results = [attempt(deformable_attention, f.clone(), l.clone(), a.clone())
                   for _, f, l, a in cases]
    if not judging():
        return
    chips = _chips()

    def diagnosis():
        """The mistake whose output equals the student's on every case."""
        per_case = [list(_attention_variants(f, l, a)) for _, f, l, a in cases]
        return next((per_case[0][j][0] for j in range(len(per_case[0]))
                     if all(_same(r, v[j][1]) for r, v in zip(results, per_case))), None)

    for (what, feature, loc, attn), got in zip(cases, results):
        expected = chips.deformable_attention(feature, loc, attn)
        _compare(got, expected, f"deformable_attention, {what} (seed {seed})", OUT_AXES,
                 diagnosis,
                 "grid_sample(image (B, D, H, W), grid 2 * p - 1 of shape (B, Q, K, 2), "
                 "bilinear, zeros, align_corners=False) returns (B, D, Q, K): weight by "
                 "attention_weights[:, None], sum over K, and put the channels last")
    show(f"deformable_attention: the hand-made case and {len(cases) - 1} random ones "
         f"(seed {seed}) match the course's grid_sample version")


# ------------------------------------------------------------------ stage 2
def _cross_variant(layer, query, ref, memory, shape, *, scale="wh", softmax="points",
                   value_view="hw", heads="blocks", offsets_view="mk", weights_view="mk",
                   value_proj=True, output_proj=True):
    """The layer's output computed through the reference operator (one level), with one
    usual mistake switched on: the offsets divided by another scale, the softmax over another
    axis, the memory or the heads laid out differently, a projection left out."""
    batch, queries, channels = query.shape
    height, width = shape
    m, k = layer.heads, layer.points
    value = layer.value_proj(memory) if value_proj else memory
    if heads == "blocks":
        value = value.view(batch, height * width, m, channels // m)
    else:                                           # channel c of head m at c * M + m
        value = value.view(batch, height * width, channels // m, m).transpose(2, 3)
    raw_offsets = layer.sampling_offsets(query)
    offsets = raw_offsets.view(batch, queries, m, k, 2) if offsets_view == "mk" else \
        raw_offsets.view(batch, queries, k, m, 2).transpose(2, 3)
    logits = layer.attention_weights(query)
    logits = logits.view(batch, queries, m, k) if weights_view == "mk" else \
        logits.view(batch, queries, k, m).transpose(2, 3)
    if softmax == "points":
        weights = logits.softmax(-1)
    elif softmax == "heads":
        weights = logits.softmax(-2)
    elif softmax == "all":
        weights = logits.reshape(batch, queries, -1).softmax(-1).view(batch, queries, m, k)
    else:
        weights = logits
    divide = {"wh": [width, height], "hw": [height, width], "none": [1, 1]}[scale]
    loc = ref[:, :, None, None, :] + offsets / torch.tensor(divide, dtype=query.dtype)
    spatial = torch.tensor([[height, width]] if value_view == "hw" else [[width, height]])
    out = _msda(value.contiguous(), spatial, torch.tensor([0]), loc[:, :, :, None],
                weights[:, :, :, None])
    return layer.output_proj(out) if output_proj else out


CROSS_MISTAKES = [
    ("offsets are in pixels: divide (dx, dy) by (W, H) before adding them to the reference "
     "point", dict(scale="none")),
    ("x goes with the width: divide the offsets by (W, H), not (H, W)", dict(scale="hw")),
    ("the softmax runs over the K points of each head (the last axis of (B, Q, M, K)), not "
     "over the heads", dict(softmax="heads")),
    ("one softmax per head, over its K points: not one over all M*K samples of a query",
     dict(softmax="all")),
    ("the attention weights go through a softmax over the K points of each head",
     dict(softmax="none")),
    ("memory is row-major (row, column): view the projected memory as (B, H, W, M, D), not "
     "(B, W, H, M, D)", dict(value_view="wh")),
    ("head m owns channels m*D:(m+1)*D: view the projected memory as (..., M, D), not "
     "(..., D, M)", dict(heads="interleaved")),
    ("sampling_offsets gives (M, K, 2) per query: view it as (B, Q, M, K, 2)",
     dict(offsets_view="km")),
    ("attention_weights gives (M, K) per query: view it as (B, Q, M, K)",
     dict(weights_view="km")),
    ("apply value_proj to the memory before sampling", dict(value_proj=False)),
    ("apply output_proj to the concatenated heads", dict(output_proj=False)),
]


def check_cross_attention(layer_class, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    embed_dim, heads, points = 12, 3, 2
    state = _random_weights(gen, embed_dim, heads * points)
    student = layer_class(embed_dim, heads, points).double()
    student.load_state_dict(state)
    batch, queries, height, width = 2, 5, 4, 6
    query = torch.randn(batch, queries, embed_dim, generator=gen, dtype=torch.float64)
    ref_points = torch.rand(batch, queries, 2, generator=gen, dtype=torch.float64)
    memory = torch.randn(batch, height * width, embed_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad(), forbid_references(layer_class.forward):
        got = attempt(student, query, ref_points, memory, (height, width))
    if not judging():
        return
    reference = _chips().DeformableCrossAttention(embed_dim, heads, points).double()
    reference.load_state_dict(state)
    with torch.no_grad():
        expected = reference(query, ref_points, memory, (height, width))

        def variants():
            for hint, mistake in CROSS_MISTAKES:
                yield hint, _cross_variant(reference, query, ref_points, memory,
                                           (height, width), **mistake)
        _compare(got, expected, f"DeformableCrossAttention, {heads} heads of {points} points "
                 f"on a {height} x {width} map, random weights (seed {seed})", OUT_AXES,
                 variants, "compare with the steps above: value_proj, the offsets in pixels "
                 "divided by (W, H), a softmax over each head's K points, one "
                 "deformable_attention per head on its channels, output_proj")
    show(f"DeformableCrossAttention: {heads} heads of {points} points, random weights "
         f"(seed {seed}): output matches")


# ------------------------------------------------------------------ stage 3
def _sampling_variants(layer, query, ref, shapes):
    """(hint, (locations, weights)) of the usual wrong versions of MSDeformAttn.sampling."""
    batch, queries, _ = query.shape
    m, levels, k = layer.heads, layer.levels, layer.points
    offsets = layer.sampling_offsets(query).view(batch, queries, m, levels, k, 2)
    logits = layer.attention_weights(query).view(batch, queries, m, levels * k)
    weights = logits.softmax(-1).view(batch, queries, m, levels, k)
    wh = shapes.flip(-1).to(query.dtype)

    def at(divide):
        return ref[:, :, None, None, None, :] + offsets / divide[:, None, :]

    per_level = logits.view(batch, queries, m, levels, k).softmax(-1)
    yield ("one softmax over all L*K samples of a head, not one per level",
           (at(wh), per_level))
    yield ("level l's offsets are pixels of level l: divide them by (W_l, H_l) of that level, "
           "not by the first level's", (at(wh[:1].expand(levels, 2)), weights))
    yield ("x goes with the width: spatial_shapes rows are (H, W), so divide by "
           "spatial_shapes.flip(-1), (W, H)", (at(shapes.to(query.dtype)), weights))
    yield ("offsets are in pixels: divide them by (W_l, H_l) before adding them to the "
           "reference point", (at(torch.ones_like(wh)), weights))


def _forward_variants(layer, memory, shapes, starts, loc, attn):
    """(hint, output) of the usual wrong versions of MSDeformAttn.forward, on the reference's
    sampling."""
    batch, total, channels = memory.shape
    m = layer.heads
    value = layer.value_proj(memory).view(batch, total, m, -1)

    def out(v=value, s=shapes, st=starts, a=attn, project=True):
        combined = _msda(v.contiguous(), s, st, loc, a)
        return layer.output_proj(combined) if project else combined

    yield ("level l is row-major (H_l, W_l): view its rows as (B, H_l, W_l, M, D), not "
           "(B, W_l, H_l, M, D)", out(s=shapes.flip(-1)))
    yield ("level l starts at row level_start_index[l] of the memory: "
           "memory[:, start_l : start_l + H_l*W_l]", out(st=torch.zeros_like(starts)))
    yield ("sum the levels, do not average them: the weights already sum to 1 over L*K",
           out(a=attn / shapes.shape[0]))
    last = attn.clone()
    last[..., -1, :] = 0
    yield ("every level counts: the loop over levels misses the last one", out(a=last))
    yield ("head m owns channels m*D:(m+1)*D of the projected memory, (B, S, M, D)",
           out(v=layer.value_proj(memory).view(batch, total, -1, m).transpose(2, 3)))
    yield ("apply value_proj to the memory before sampling",
           out(v=memory.view(batch, total, m, -1)))
    yield ("apply output_proj to the combined heads", out(project=False))


def check_msdeform_attn(layer_class, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    embed_dim, heads, levels, points = 8, 2, 3, 2
    state = _random_weights(gen, embed_dim, heads * levels * points)
    student = layer_class(embed_dim, heads, levels, points).double()
    student.load_state_dict(state)
    shapes = torch.tensor([[5, 6], [3, 4], [1, 2]])
    starts = level_start_index(shapes)
    total = int(shapes.prod(1).sum())
    batch, queries = 2, 4
    query = torch.randn(batch, queries, embed_dim, generator=gen, dtype=torch.float64)
    ref_points = torch.rand(batch, queries, 2, generator=gen, dtype=torch.float64)
    memory = torch.randn(batch, total, embed_dim, generator=gen, dtype=torch.float64)
    with torch.no_grad(), forbid_references(layer_class.forward, layer_class.sampling):
        sampled = attempt(student.sampling, query, ref_points, shapes)
        got = attempt(student, query, ref_points, memory, shapes, starts)
    if not judging():
        return
    reference = _chips().MSDeformAttn(embed_dim, heads, levels, points).double()
    reference.load_state_dict(state)
    where = f"levels (5, 6), (3, 4), (1, 2), random weights (seed {seed})"
    with torch.no_grad():
        exp_loc, exp_attn = reference.sampling(query, ref_points, shapes)
        if isinstance(sampled, Raised):
            raise AssertionError(f"MSDeformAttn.sampling, {where}: raised {_raised(sampled)}"
                                 f"\nHint: {_raised_hint(sampled)}")
        if not (isinstance(sampled, tuple) and len(sampled) == 2):
            raise AssertionError(f"MSDeformAttn.sampling, {where}: expected a pair "
                                 f"(sampling_locations, attention_weights), got {sampled!r}")
        variants = list(_sampling_variants(reference, query, ref_points, shapes))
        _compare(sampled[0], exp_loc, f"MSDeformAttn.sampling locations, {where}",
                 ("batch", "query", "head", "level", "point", "x/y"),
                 lambda: [(h, v[0]) for h, v in variants],
                 "location = reference point + offset / (W_l, H_l), offsets viewed as "
                 "(B, Q, M, L, K, 2)")
        _compare(sampled[1], exp_attn, f"MSDeformAttn.sampling attention weights, {where}",
                 ("batch", "query", "head", "level", "point"),
                 lambda: [(h, v[1]) for h, v in variants],
                 "one softmax over the L*K samples of each head, viewed as (B, Q, M, L, K)")
        expected = reference(query, ref_points, memory, shapes, starts)
        _compare(got, expected, f"MSDeformAttn.forward, {where}", OUT_AXES,
                 lambda: _forward_variants(reference, memory, shapes, starts, exp_loc,
                                           exp_attn),
                 "value_proj, then for every level and head a deformable_attention on that "
                 "level's rows and that head's channels, summed over levels, heads "
                 "concatenated, then output_proj")
    show(f"MSDeformAttn: sampling (locations, weights) and forward on 3 levels, random "
         f"weights (seed {seed}): all match")
