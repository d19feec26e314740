"""Checks of lab 02 (tensors are pointers), visible and hidden alike: strides and flat offsets,
MSDA on flat memory, int32 wrap-around and the first batch that overflows.

A visible check passes a shown ``seed``; a hidden check draws a fresh one.  Expected values
exist only when the check judges (``common.expect``); a wrong answer is compared with the usual
mistakes and the matching one is named.

``check_msda_flat`` first runs the isolation probes (``_operator.probes``: one term of
the forward switched on at a time) and stops at the first that goes wrong; an exception raised
by the student's msda_flat is reported as the check's message.
"""
from __future__ import annotations

import torch

from source_kernels.inputs import make_inputs, pyramid_shapes

from .common import Raised, attempt, forbid_references, fresh_generator, judging
from .guard import guarded  # noqa: F401  (the notebook's demo cells: check.guarded(...))
from .demo import is_output, raised as _raised  # noqa: F401  (is_output: the demo cells)

INT32_MAX = 2 ** 31 - 1
VALUE_ROW = "the value-row offset is ((b*S + start + r*W + c)*M + m)*D"


def _tag(gen, seed):
    return f"seed {seed}" if seed is not None else f"hidden check, seed {gen.initial_seed()}"


def _passed(text):
    if judging():
        from . import diagnose
        diagnose.passed(text)


def _int(result, what, name):
    """``int(result)``, or the check's message when the student's call raised or returned
    something that is not an integer."""
    if isinstance(result, Raised):
        raise _raised(what, name, result)
    try:
        return int(result)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        raise AssertionError(f"{what}: expected an int, got {type(result).__name__}") from None


# ---------------------------------------------------------------------- 1. strides, offsets
def check_contiguous_strides(contiguous_strides, seed=None):
    """Strides of contiguous tensors of 1 to 6 dimensions, sizes of 1 included, and the
    encoder preset's value (2, 22223, 8, 32)."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    shapes = [(5,), (3, 4), (2, 6, 2, 3), (3, 1, 5), (2, 22223, 8, 32)]
    shapes += [tuple(int(s) for s in torch.randint(1, 7, (n,), generator=gen)) for n in (2, 4, 6)]
    with forbid_references(contiguous_strides):
        got = [attempt(contiguous_strides, shape) for shape in shapes]
    if not judging():
        return
    for shape, strides in zip(shapes, got):
        expected = tuple(torch.empty(shape, device="meta").stride())   # no memory allocated
        what = f"contiguous_strides{shape} ({tag})"
        if isinstance(strides, Raised):
            raise _raised(what, "contiguous_strides", strides)
        try:
            strides = tuple(int(s) for s in strides)
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"{what}: expected a tuple of {len(shape)} ints, got "
                                 f"{strides!r:.200}") from None
        if strides == expected:
            continue
        hint = "stride[-1] = 1 and stride[k] = stride[k + 1] * shape[k + 1]"
        column_major = [1]
        for n in shape[:-1]:
            column_major.append(column_major[-1] * n)
        if strides == tuple(column_major) and len(shape) > 1:
            hint = ("these are column-major strides (the first index moving fastest); a "
                    "contiguous torch tensor is row-major: the last index moves fastest")
        elif strides == tuple(int(torch.tensor(shape[k:]).prod()) for k in range(len(shape))):
            hint = ("stride[k] is the product of the sizes *after* axis k, not from axis k on "
                    "(the last stride is 1)")
        raise AssertionError(f"contiguous_strides{shape} ({tag}): expected {expected}, got "
                             f"{strides}\nHint: {hint}")
    _passed(f"contiguous_strides: {len(shapes)} shapes, 1 to 6 dimensions ({tag})")


def check_flat_offset(flat_offset, seed=None):
    """Offsets of random indices in views of a tensor whose elements hold their own offsets:
    the base, a permutation, a strided slice, a transpose."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    base = torch.arange(2 * 6 * 2 * 3).reshape(2, 6, 2, 3)
    views = [("base", base), ("base.permute(0, 2, 1, 3)", base.permute(0, 2, 1, 3)),
             ("base[1, 2:]", base[1, 2:]), ("base[:, ::2, 1]", base[:, ::2, 1]),
             ("base.transpose(0, 3)", base.transpose(0, 3))]
    asked = []
    for name, view in views:
        for _ in range(8):
            index = tuple(int(torch.randint(0, n, (1,), generator=gen)) for n in view.shape)
            asked.append((name, view, index))
    with forbid_references(flat_offset):
        got = [attempt(flat_offset, index, view.stride()) for _, view, index in asked]
    if not judging():
        return
    for (name, view, index), offset in zip(asked, got):
        expected = int(view[index]) - view.storage_offset()     # base holds its own offsets
        offset = _int(offset, f"flat_offset of {name}{list(index)} with strides "
                              f"{view.stride()} ({tag})", "flat_offset")
        if offset == expected:
            continue
        hint = "offset = sum(index[k] * strides[k])"
        contiguous = sum(i * s for i, s in zip(index, view.contiguous().stride()))
        if int(offset) == contiguous and view.stride() != view.contiguous().stride():
            hint = ("you computed the offset of a contiguous tensor of this shape: use the "
                    "strides you are given, which this view does not share")
        elif int(offset) == sum(i * s for i, s in zip(index, reversed(view.stride()))):
            hint = ("the strides come in the same order as the index: index[k] goes with "
                    "strides[k], not with the strides reversed")
        raise AssertionError(f"flat_offset of {name}{list(index)} with strides {view.stride()} "
                             f"({tag}): expected {expected}, got {int(offset)}\nHint: {hint}")
    _passed(f"flat_offset: {len(asked)} indices in {len(views)} views (permuted, sliced, "
            f"transposed) ({tag})")


# ---------------------------------------------------------------------- 2. MSDA, flat
def _call_flat(msda_flat, inputs, what="msda_flat"):
    """The student's msda_flat on flat private copies; an exception it raises becomes the
    check's message, not the notebook's traceback."""
    value, shapes, starts, loc, attn = inputs.values()
    batch, total, heads, channels = value.shape
    _, queries, _, levels, points, _ = loc.shape
    sizes = dict(B=batch, S=total, M=heads, D=channels, Q=queries, L=levels, K=points)
    try:
        return msda_flat(value.reshape(-1).clone(), loc.reshape(-1).clone(),
                         attn.reshape(-1).clone(), sizes, shapes.tolist(), starts.tolist())
    except AssertionError:
        raise
    except Exception as exc:                                        # noqa: BLE001
        text = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        hint = "run it on this input yourself and look at the line the traceback names"
        if isinstance(exc, (IndexError, RuntimeError)) and ("index" in text or "size" in text):
            hint = (f"an offset went past a flat tensor (value has B*S*M*D = "
                    f"{value.numel()} elements, the locations {loc.numel()}, the weights "
                    f"{attn.numel()}): {VALUE_ROW}, the location of sample p is at 2p and "
                    "2p + 1, its weight at p, and only corners with 0 <= r < H, 0 <= c < W "
                    "are read")
        raise AssertionError(f"{what}: your msda_flat raised {type(exc).__name__}: {text}"
                             f"\nHint: {hint}") from None


def check_msda_flat(msda_flat, seed=None):
    """One sample; heads that interleave; three levels, batch 2, locations outside."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    cases = [("one sample", (1, 1, 1, 2, [[3, 4]], 1), 0.05),
             ("2 heads, 2 points", (1, 2, 2, 3, [[3, 4]], 2), 0.05),
             ("3 levels, 2 heads, batch 2", (2, 3, 2, 3, [[4, 5], [2, 3], [1, 2]], 2), 0.1)]
    from ._operator import probes
    results = []
    probe_list = probes(gen)
    with forbid_references(msda_flat):
        probed = [_call_flat(msda_flat, args, f"msda_flat, probe: {label} ({tag})")
                  for label, _, args in probe_list]
        for description, shape, outside in cases:
            inputs = make_inputs(*shape, dtype=torch.float64, outside=outside,
                                 seed=int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen)))
            results.append((description, inputs,
                            _call_flat(msda_flat, inputs, f"msda_flat, {description} ({tag})")))
    if not judging():
        return
    from . import diagnose
    shaped = []
    for (_, _, args), got in zip(probe_list, probed):
        value, loc = args["value"], args["sampling_locations"]
        size = value.shape[0] * loc.shape[1] * value.shape[2] * value.shape[3]
        if isinstance(got, torch.Tensor) and got.dim() == 1 and got.numel() == size:
            got = got.reshape(value.shape[0], loc.shape[1], -1)
        shaped.append(got)
    found = diagnose.locate(shaped, probe_list, 1e-10)
    if found is not None:
        message = found[1]
        if message.endswith(diagnose.ROW_STRIDE_H):
            message = f"{message}: {VALUE_ROW}"
        raise AssertionError(f"msda_flat ({tag}), {message}")
    for description, inputs, got in results:
        _judge_flat(description, inputs, got, tag)
    _passed(f"msda_flat: {len(probe_list)} probes (one term at a time), then "
            f"{'; '.join(c[0] for c in cases)}: all match lab 01's spec ({tag})")


def _judge_flat(description, inputs, got, tag):
    from source_kernels import reference

    from . import diagnose
    what = f"msda_flat, {description} ({tag})"
    value, _, _, loc, _ = inputs.values()
    batch, _, heads, channels = value.shape
    queries = loc.shape[1]
    if not isinstance(got, torch.Tensor) or got.dim() != 1 or \
            got.numel() != batch * queries * heads * channels:
        raise AssertionError(f"{what}: expected a flat output of B*Q*M*D = "
                             f"{batch * queries * heads * channels} elements, got "
                             f"{getattr(got, 'shape', type(got).__name__)}")
    expected = reference.msda_naive(*inputs.values())
    got = got.reshape(expected.shape)
    message = diagnose.output_mismatch(got, expected, 1e-10, what, heads)
    if message is None:
        return
    hint = _flat_variant(got, inputs) or diagnose.output_hint(
        got.double(), inputs, 1e-10, diagnose.worst_index(got, expected)) or \
        (f"{VALUE_ROW}; the location of sample p is at 2p and 2p + 1, its weight at p; the "
         "output row of (b, q, m) starts at ((b*Q + q)*M + m)*D")
    if hint == diagnose.ROW_STRIDE_H:
        hint = f"{hint}: {VALUE_ROW}"
    raise AssertionError(f"{message}\nHint: {hint}")


def _flat_variant(got, inputs):
    """Mistakes of flat indexing that read the right memory the wrong way: the heads before
    the rows in value, (k, l) instead of (l, k) in the sample index p."""
    from . import diagnose
    value, shapes, starts, loc, attn = inputs.values()
    batch, total, heads, channels = value.shape
    _, queries, _, levels, points, _ = loc.shape
    heads_first = value.reshape(-1).reshape(batch, heads, total, channels).transpose(1, 2)
    k_major_loc = loc.reshape(-1).reshape(batch, queries, heads, points, levels, 2).transpose(3, 4)
    k_major_attn = attn.reshape(-1).reshape(batch, queries, heads, points, levels).transpose(3, 4)
    variants = [
        ((heads_first, shapes, starts, loc, attn),
         "value is (B, S, M, D): the rows come before the heads, so value[b, s, m, :] starts at "
         "((b*S + s)*M + m)*D, not ((b*M + m)*S + s)*D"),
        ((value, shapes, starts, k_major_loc, k_major_attn),
         "the sample index is p = (((b*Q + q)*M + m)*L + l)*K + k: levels before points"),
    ]
    for args, hint in variants:
        if levels * points > 1 or args[0] is not value:
            variant = diagnose.sample(*args)
            if bool(((got.double() - variant).abs() <= 1e-10).all()):
                return hint
    return None


# ---------------------------------------------------------------------- 3. int32
def check_int32_wrap(int32_wrap, seed=None):
    """What a signed 32-bit register holds after a result n: the edges of the int32 range,
    products torch computes in int32, and random 41-bit numbers."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    values = [0, 5, -7, INT32_MAX, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 32, 3 * 2 ** 32 + 11,
              65536 * 32768, -65536 * 32769, 46341 * 46341, 378 * 5689088]
    values += [int(v) for v in torch.randint(-2 ** 40, 2 ** 40, (16,), generator=gen)]
    with forbid_references(int32_wrap):
        got = [attempt(int32_wrap, n) for n in values]
    if not judging():
        return
    for n, result in zip(values, got):
        # what torch stores when it narrows to int32: the low 32 bits, two's complement
        expected = int(torch.tensor(n % 2 ** 32, dtype=torch.int64).to(torch.int32))
        result = _int(result, f"int32_wrap({n}) ({tag})", "int32_wrap")
        if result == expected:
            continue
        hint = "keep the low 32 bits and read them as two's complement: (n + 2**31) % 2**32 - 2**31"
        if int(result) == n % 2 ** 32:
            hint = ("n % 2**32 is the unsigned reading of the low 32 bits; a signed int32 reads "
                    "2**31 and above as negative: subtract 2**32 from those")
        elif int(result) == max(-2 ** 31, min(INT32_MAX, n)):
            hint = ("that is saturation (clamping to the range); integer arithmetic does not "
                    "saturate, it wraps around")
        raise AssertionError(f"int32_wrap({n}) ({tag}): expected {expected}, got {int(result)}"
                             f"\nHint: {hint}")
    _passed(f"int32_wrap: {len(values)} results, edges of the int32 range included ({tag})")


def _first_overflowing(shapes, heads, channels):
    per_batch = sum(int(h) * int(w) for h, w in shapes) * heads * channels
    return 2 ** 31 // per_batch + 1, per_batch


def check_first_overflowing_batch(first_overflowing_batch, seed=None):
    """The 800 x 1333 pyramid and twice its resolution with 8 heads of 32 channels, sizes
    whose per-batch count divides 2**31, and random pyramids."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    cases = [(pyramid_shapes().tolist(), 8, 32), (pyramid_shapes(1600, 2666).tolist(), 8, 32),
             ([[64, 64]], 1, 256), ([[1024, 1024]], 2, 1024)]
    for _ in range(4):
        height = int(torch.randint(200, 3000, (1,), generator=gen))
        width = int(torch.randint(200, 3000, (1,), generator=gen))
        cases.append((pyramid_shapes(height, width).tolist(),
                      int(torch.randint(1, 17, (1,), generator=gen)),
                      int(torch.randint(1, 65, (1,), generator=gen))))
    with forbid_references(first_overflowing_batch):
        got = [attempt(first_overflowing_batch, [list(s) for s in shapes], heads, channels)
               for shapes, heads, channels in cases]
    if not judging():
        return
    for (shapes, heads, channels), batch in zip(cases, got):
        expected, per_batch = _first_overflowing(shapes, heads, channels)
        batch = _int(batch, f"first_overflowing_batch with levels {shapes}, M = {heads}, "
                            f"D = {channels} ({tag})", "first_overflowing_batch")
        if batch == expected:
            continue
        if batch == expected - 1:
            hint = (f"at B = {batch} the largest index is {batch * per_batch - 1}, which still "
                    "fits: B*S*M*D - 1 > 2**31 - 1 means B*S*M*D > 2**31, so B = 2**31 // "
                    "(S*M*D) + 1")
        elif batch == expected + 1:
            hint = (f"B = {batch - 1} already overflows (its largest index is "
                    f"{(batch - 1) * per_batch - 1}): the first overflowing B is one less")
        else:
            hint = "S is the sum of H*W over the levels; per batch element there are S*M*D elements"
        raise AssertionError(
            f"first_overflowing_batch with levels {shapes}, M = {heads}, D = {channels} "
            f"({per_batch} value elements per batch element) ({tag}): expected {expected}, got "
            f"{batch}\nHint: {hint}")
    _passed(f"first_overflowing_batch: {len(cases)} pyramids ({tag})")
