"""The Triton operator against the fp64 reference, on CPU through Triton's interpreter
(about 40 ms per program: the grids here stay at a few programs) and on a GPU."""
import pytest
import torch

import source_kernels as sk
from source_kernels import reference
from source_kernels.backward import default_fp32_grad_accum, msda_backward
from source_kernels.inputs import make_inputs, preset_inputs
from source_kernels.testing import MSDA_OUTPUT_AXES, assert_close_explained

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Error allowed, relative to the largest magnitude of the fp64 reference.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}
GRAD_TOLERANCE = {torch.float32: 5e-5, torch.float16: 1e-2, torch.bfloat16: 6e-2,
                  torch.float64: 1e-12}
ARG_NAMES = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
             "attention_weights")

SHAPES = {
    "one level": [[6, 5]],
    "several levels": [[7, 9], [4, 5], [2, 3]],
    "non-square and 1x1": [[3, 8], [5, 2], [1, 1]],
}


def inputs(batch=1, queries=5, heads=2, channels=8, shapes=((4, 5), (2, 3)), points=2,
           dtype=torch.float32, device=DEVICE, **kw):
    return make_inputs(batch, queries, heads, channels, [list(s) for s in shapes], points,
                       dtype=dtype, device=device, **kw)


def fp64_reference(args, grad_output=None):
    """Forward (and the three gradients) of the grid_sample reference in fp64 on the CPU."""
    ref = {k: v.detach().cpu().double() if v.is_floating_point() else v.cpu()
           for k, v in args.items()}
    for k in ("value", "sampling_locations", "attention_weights"):
        ref[k].requires_grad_(True)
    out = reference.msda_grid_sample(**ref)
    if grad_output is None:
        return out.detach(), None
    out.backward(grad_output.detach().cpu().double())
    grads = tuple(ref[k].grad for k in ("value", "sampling_locations", "attention_weights"))
    return out.detach(), grads


def assert_scaled_close(got, expected, tolerance, what, axes=None, ignore=None):
    scale = max(expected.abs().max().item(), 1e-6)
    got = got.detach().cpu().double()
    if ignore is not None:
        got = torch.where(ignore, expected, got)
    assert_close_explained(got, expected, atol=tolerance * scale, rtol=0.0, axes=axes,
                           what=what)


def on_a_pixel_boundary(args, margin=1e-3):
    """(B, Q, M, L, K, 2) mask of the points whose pixel coordinate x*W - 0.5 or y*H - 0.5
    lies within ``margin`` of an integer.  There the location gradient jumps (another pair of
    corners takes over), and rounding of the input dtype may land on either side."""
    loc = args["sampling_locations"].detach().cpu().double()
    sizes = args["value_spatial_shapes"].cpu().flip(-1).double()           # (L, 2) as (W, H)
    pixel = loc * sizes[:, None, :] - 0.5
    near = ((pixel - pixel.round()).abs() < margin).any(-1, keepdim=True)
    return near.expand_as(loc)


def check_forward_and_backward(args, dtype, fp32_grad_accum=None):
    out = sk.multi_scale_deformable_attn(**args, fp32_grad_accum=fp32_grad_accum)
    assert out.dtype == dtype
    grad_output = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(
        device=out.device, dtype=dtype)
    expected, grads = fp64_reference(args, grad_output)
    assert_scaled_close(out, expected, TOLERANCE[dtype], "forward", MSDA_OUTPUT_AXES)
    out.backward(grad_output)
    names = ("grad_value", "grad_sampling_locations", "grad_attention_weights")
    keys = ("value", "sampling_locations", "attention_weights")
    kinks = on_a_pixel_boundary(args)
    for name, key, grad in zip(names, keys, grads):
        assert args[key].grad is not None, f"{name} missing"
        assert args[key].grad.dtype == dtype
        ignore = kinks if key == "sampling_locations" else None
        assert_scaled_close(args[key].grad, grad, GRAD_TOLERANCE[dtype], name, ignore=ignore)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_forward_and_gradients_match_fp64(dtype, shape_name):
    args = inputs(shapes=SHAPES[shape_name], dtype=dtype, outside=0.1, requires_grad=True,
                  seed=hash(shape_name) % 1000)
    check_forward_and_backward(args, dtype)


@pytest.mark.parametrize("channels", [1, 3, 24, 30, 32, 64, 71, 96])
def test_channel_counts(channels):
    args = inputs(channels=channels, heads=1, queries=4, requires_grad=True, seed=channels)
    check_forward_and_backward(args, torch.float32)


@pytest.mark.parametrize("heads,points", [(1, 1), (1, 4), (3, 1)])
def test_single_head_and_single_point(heads, points):
    args = inputs(heads=heads, points=points, queries=7, requires_grad=True)
    check_forward_and_backward(args, torch.float32)


def test_local_locations_share_corners():
    """Neighbouring queries hitting the same corners: the atomics must add every share."""
    args = inputs(queries=16, heads=1, shapes=[[3, 3]], points=4, distribution="local",
                  sigma_pixels=0.3, requires_grad=True)
    check_forward_and_backward(args, torch.float32)


@pytest.mark.parametrize("accum", [True, False])
def test_fp16_with_and_without_fp32_accumulation(accum):
    args = inputs(dtype=torch.float16, requires_grad=True, distribution="local")
    check_forward_and_backward(args, torch.float16, fp32_grad_accum=accum)


def test_locations_on_the_edges_and_outside():
    """x, y exactly 0, 0.5 and 1, and beyond the map on every side (zeros contribute)."""
    args = inputs(queries=6, heads=1, shapes=[[4, 6], [1, 1]], points=4, requires_grad=False)
    edges = torch.tensor([0.0, 0.5, 1.0, -0.3, 1.7, -5.0, 4.0, 0.999999])
    loc = args["sampling_locations"]
    flat = loc.detach().reshape(-1, 2)
    generator = torch.Generator().manual_seed(3)
    index = torch.randint(0, len(edges), flat.shape, generator=generator)
    args["sampling_locations"] = edges[index].reshape(loc.shape).to(loc.device).requires_grad_()
    for key in ("value", "attention_weights"):
        args[key].requires_grad_()
    check_forward_and_backward(args, torch.float32)


def test_far_outside_locations_give_zero():
    args = inputs(queries=3, heads=1)
    args["sampling_locations"] = torch.full_like(args["sampling_locations"], 1e9)
    assert sk.multi_scale_deformable_attn(**args).abs().max().item() == 0.0
    args["sampling_locations"] = torch.full_like(args["sampling_locations"], -1e9)
    assert sk.multi_scale_deformable_attn(**args).abs().max().item() == 0.0


def test_gradcheck_fp64():
    args = inputs(dtype=torch.float64, queries=3, heads=2, channels=3,
                  shapes=[[3, 4], [1, 1]], points=2, outside=0.2)
    shapes, starts = args["value_spatial_shapes"], args["value_level_start_index"]

    def op(value, loc, attn):
        return sk.MultiScaleDeformableAttnFunction.apply(value, shapes, starts, loc, attn, 64)

    leaves = tuple(args[k].detach().requires_grad_() for k in
                   ("value", "sampling_locations", "attention_weights"))
    # On a GPU the atomics add grad_value in a different order each run: allow that much.
    assert torch.autograd.gradcheck(op, leaves, eps=1e-6, atol=1e-7, fast_mode=True,
                                    nondet_tol=1e-12 if DEVICE == "cuda" else 0.0)


def test_mmcv_signature_and_im2col_step_that_does_not_divide_batch():
    args = inputs(batch=3, queries=4, heads=1)
    expected, _ = fp64_reference(args)
    out = sk.MultiScaleDeformableAttnFunction.apply(*(args[k] for k in ARG_NAMES), 2)
    assert out.shape == (3, 4, 8)
    assert_scaled_close(out, expected, TOLERANCE[torch.float32], "forward", MSDA_OUTPUT_AXES)


def test_non_contiguous_inputs():
    args = inputs(queries=4, heads=2, channels=4, requires_grad=False)
    expected, _ = fp64_reference(args)
    value = args["value"].transpose(2, 3).contiguous().transpose(2, 3)       # strided view
    loc = torch.stack([args["sampling_locations"]] * 2, dim=2)[:, :, 0]       # strided view
    attn = torch.stack([args["attention_weights"]] * 2, dim=-1)[..., 1]       # strided view
    assert not value.is_contiguous() and not loc.is_contiguous() and not attn.is_contiguous()
    out = sk.multi_scale_deformable_attn(value, args["value_spatial_shapes"],
                                         args["value_level_start_index"], loc, attn)
    assert_scaled_close(out, expected, TOLERANCE[torch.float32], "forward", MSDA_OUTPUT_AXES)


@pytest.mark.parametrize("batch,queries", [(0, 4), (2, 0)])
def test_empty_batch_or_queries(batch, queries):
    args = inputs(batch=batch, queries=queries, requires_grad=True)
    out = sk.multi_scale_deformable_attn(**args)
    assert out.shape == (batch, queries, 2 * 8)
    out.sum().backward()
    assert args["value"].grad.abs().sum().item() == 0.0
    assert args["sampling_locations"].grad.shape == args["sampling_locations"].shape


def test_default_fp32_grad_accum():
    assert default_fp32_grad_accum(torch.float32, "cpu") is False
    assert default_fp32_grad_accum(torch.float16, "cpu") is False
    assert default_fp32_grad_accum(torch.bfloat16, "cpu") is True     # interpreter: no bf16 atomics


# ---------------------------------------------------------------------------- bad inputs

def _bad(change):
    args = inputs(batch=2, queries=3, heads=2, channels=4, shapes=[[3, 4], [2, 2]], points=2)
    change(args)
    return args


BAD_INPUTS = {
    "value rank": (lambda a: a.update(value=a["value"][0]), ValueError, "value must have 4"),
    "value integer": (lambda a: a.update(value=a["value"].long()), TypeError, "value must be a floating"),
    "value boolean": (lambda a: a.update(value=a["value"] > 0), TypeError, "value must be a floating"),
    "S not sum of H*W": (lambda a: a.update(value=a["value"][:, :-1]), ValueError, "sum(H*W)"),
    "start index inconsistent": (lambda a: a.update(value_level_start_index=torch.tensor(
        [0, 11], device=DEVICE)), ValueError, "value_level_start_index[1]"),
    "start index wrong length": (lambda a: a.update(value_level_start_index=torch.tensor(
        [0], device=DEVICE)), ValueError, "value_level_start_index has size"),
    "zero level size": (lambda a: a.update(value_spatial_shapes=torch.tensor(
        [[3, 4], [0, 2]], device=DEVICE)), ValueError, "positive height and width"),
    "negative level size": (lambda a: a.update(value_spatial_shapes=torch.tensor(
        [[3, 4], [-2, -2]], device=DEVICE)), ValueError, "positive height and width"),
    "shapes float": (lambda a: a.update(value_spatial_shapes=a["value_spatial_shapes"].float()),
                     TypeError, "value_spatial_shapes must be an int64"),
    "shapes wrong columns": (lambda a: a.update(value_spatial_shapes=a["value_spatial_shapes"][:, :1]),
                             ValueError, "value_spatial_shapes has size 1"),
    "locations rank": (lambda a: a.update(sampling_locations=a["sampling_locations"][..., 0]),
                       ValueError, "sampling_locations must have 6"),
    "locations batch": (lambda a: a.update(sampling_locations=a["sampling_locations"][:1]),
                        ValueError, "sampling_locations has size 1 on axis 0"),
    "locations levels": (lambda a: a.update(sampling_locations=a["sampling_locations"][:, :, :, :1]),
                         ValueError, "sampling_locations has size 1 on axis 3"),
    "locations xyz": (lambda a: a.update(sampling_locations=torch.cat(
        [a["sampling_locations"], a["sampling_locations"][..., :1]], -1)), ValueError, "(x, y)"),
    "weights shape": (lambda a: a.update(attention_weights=a["attention_weights"][..., :1]),
                      ValueError, "attention_weights must have shape"),
    "mixed dtypes": (lambda a: a.update(attention_weights=a["attention_weights"].double()),
                     TypeError, "attention_weights has dtype torch.float64"),
    "weights integer": (lambda a: a.update(attention_weights=a["attention_weights"].int()),
                        TypeError, "attention_weights must be a floating"),
    "locations not a tensor": (lambda a: a.update(sampling_locations=[0.5, 0.5]), TypeError,
                               "sampling_locations must be a torch.Tensor"),
    "shapes on another device": (lambda a: a.update(value_spatial_shapes=a["value_spatial_shapes"].to(
        "meta")), ValueError, "value_spatial_shapes is on meta"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_the_argument(case):
    change, error, message = BAD_INPUTS[case]
    args = _bad(change)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace("*", r"\*")):
        sk.multi_scale_deformable_attn(**args)


def test_bad_im2col_step():
    args = _bad(lambda a: None)
    with pytest.raises(ValueError, match="im2col_step"):
        sk.MultiScaleDeformableAttnFunction.apply(*(args[k] for k in ARG_NAMES), 0)


def test_shape_contents_are_checked_again_after_an_in_place_change():
    args = _bad(lambda a: None)
    sk.multi_scale_deformable_attn(**args)
    args["value_spatial_shapes"][1, 0] = 3            # now sum(H*W) no longer matches S
    with pytest.raises(ValueError, match="sum"):
        sk.multi_scale_deformable_attn(**args)


def test_level_start_index_may_be_none():
    """As the seed course's operator allows: the starts are computed from the shapes, for
    the function and for the autograd Function, forward and backward."""
    args = inputs(batch=2, queries=4, heads=2, shapes=[[3, 4], [2, 2]], requires_grad=True)
    grad_output = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(4))
    expected, grads = fp64_reference(args, grad_output)
    for form in ("function", "apply"):
        leaves = {k: args[k].detach().clone().requires_grad_()
                  for k in ("value", "sampling_locations", "attention_weights")}
        if form == "function":
            out = sk.multi_scale_deformable_attn(leaves["value"], args["value_spatial_shapes"],
                                                 None, leaves["sampling_locations"],
                                                 leaves["attention_weights"])
        else:
            out = sk.MultiScaleDeformableAttnFunction.apply(
                leaves["value"], args["value_spatial_shapes"], None,
                leaves["sampling_locations"], leaves["attention_weights"], 64)
        assert_scaled_close(out, expected, TOLERANCE[torch.float32], f"{form} forward",
                            MSDA_OUTPUT_AXES)
        out.backward(grad_output.to(out.device))
        for key, grad in zip(("value", "sampling_locations", "attention_weights"), grads):
            assert_scaled_close(leaves[key].grad, grad, GRAD_TOLERANCE[torch.float32],
                                f"{form} grad of {key}",
                                ignore=on_a_pixel_boundary(args)
                                if key == "sampling_locations" else None)


def test_dtype_mismatch_is_a_value_error_naming_the_dtypes():
    """mmcv-style suites expect a ValueError that mentions the dtypes (and this package's
    own callers a TypeError): the error is both."""
    args = _bad(lambda a: a.update(sampling_locations=a["sampling_locations"].double()))
    with pytest.raises(ValueError, match="dtypes"):
        sk.multi_scale_deformable_attn(**args)
    with pytest.raises(TypeError, match="sampling_locations has dtype torch.float64"):
        sk.multi_scale_deformable_attn(**args)


def check_mixed_precision(args, dtype, fn=sk.multi_scale_deformable_attn):
    """``fn(..., mixed_precision=True)`` on args with value turned ``dtype`` (fp32
    locations and weights) against the fp64 reference on the same values; returns the
    output and the three gradients."""
    args["value"] = args["value"].detach().to(dtype).requires_grad_()
    batch, queries = args["sampling_locations"].shape[:2]
    channels = args["value"].shape[2] * args["value"].shape[3]
    grad_output = torch.randn(batch, queries, channels,
                              generator=torch.Generator().manual_seed(5)).to(dtype)
    expected, grads = fp64_reference(args, grad_output)
    out = fn(*(args[k] for k in ARG_NAMES), mixed_precision=True)
    assert out.dtype == dtype
    assert_scaled_close(out, expected, TOLERANCE[dtype], "mixed forward", MSDA_OUTPUT_AXES)
    out.backward(grad_output.to(out.device))
    got = [args[k].grad for k in ("value", "sampling_locations", "attention_weights")]
    assert [g.dtype for g in got] == [dtype, torch.float32, torch.float32]
    # The arithmetic is fp32 throughout: location and weight gradients to fp32 tolerance.
    assert_scaled_close(got[0], grads[0], GRAD_TOLERANCE[dtype], "grad of value")
    assert_scaled_close(got[1], grads[1], GRAD_TOLERANCE[torch.float32],
                        "grad of sampling_locations", ignore=on_a_pixel_boundary(args))
    assert_scaled_close(got[2], grads[2], GRAD_TOLERANCE[torch.float32],
                        "grad of attention_weights")
    return [out.detach()] + [g.clone() for g in got]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_takes_fp32_locations_and_weights(dtype):
    """mixed_precision=True: a 16-bit value with fp32 locations and weights, as autocast
    leaves a model, runs without widening value; the output and grad_value come in value's
    dtype, the location and weight gradients in fp32, all matching the fp64 reference."""
    args = inputs(batch=2, queries=4, heads=2, shapes=[[3, 4], [2, 2]], requires_grad=True)
    check_mixed_precision(args, dtype)


def test_mixed_precision_is_asked_for_and_nothing_else_mixes():
    """Without mixed_precision the dtypes must match (mmcv), also right after a mixed call
    of the same signature; with it, only a 16-bit value with fp32 locations and weights."""
    args = _bad(lambda a: a.update(value=a["value"].to(torch.bfloat16)))
    sk.multi_scale_deformable_attn(**args, mixed_precision=True)
    with pytest.raises(ValueError, match="dtypes"):
        sk.multi_scale_deformable_attn(**args)
    with pytest.raises(ValueError, match="dtypes"):
        sk.MultiScaleDeformableAttnFunction.apply(*(args[k] for k in ARG_NAMES), 64)
    half_weights = dict(args, attention_weights=args["attention_weights"].to(torch.bfloat16))
    with pytest.raises(TypeError, match="attention_weights has dtype torch.bfloat16 but "
                                        "sampling_locations has float32"):
        sk.multi_scale_deformable_attn(**half_weights, mixed_precision=True)
    wide_value = _bad(lambda a: a.update(sampling_locations=a["sampling_locations"].half()))
    with pytest.raises(ValueError, match="dtypes"):
        sk.multi_scale_deformable_attn(**wide_value, mixed_precision=True)


def test_bad_shape_tensors_after_a_valid_call_are_still_refused():
    """The checks of one argument signature are remembered; the shape tensors are checked
    per tensor object, so new ones with the same value, locations and weights are checked."""
    args = _bad(lambda a: None)
    sk.multi_scale_deformable_attn(**args)
    shapes, starts = args["value_spatial_shapes"], args["value_level_start_index"]
    for change, error, message in (
            (dict(value_spatial_shapes=shapes.float()), TypeError, "value_spatial_shapes"),
            (dict(value_level_start_index=starts[:1]), ValueError, "value_level_start_index"),
            (dict(value_level_start_index=starts + 1), ValueError, "value_level_start_index"),
            (dict(value_spatial_shapes=shapes.flip(0).contiguous()), ValueError, "start")):
        with pytest.raises(error, match=message):
            sk.multi_scale_deformable_attn(**dict(args, **change))


def test_int32_shapes_and_repeated_calls_agree():
    """int32 shape tensors (converted once and remembered) and repeated calls of one
    signature give the first call's result."""
    args = inputs(queries=4, heads=2, channels=4)
    first = sk.multi_scale_deformable_attn(**args)
    narrow = dict(args, value_spatial_shapes=args["value_spatial_shapes"].int(),
                  value_level_start_index=args["value_level_start_index"].int())
    for _ in range(2):
        assert torch.equal(sk.multi_scale_deformable_attn(**narrow), first)
        assert torch.equal(sk.multi_scale_deformable_attn(**args), first)


# ---------------------------------------------------------------------------- custom op

def test_custom_op_passes_opcheck():
    args = inputs(queries=3, heads=1, channels=4)
    torch.library.opcheck(torch.ops.source_kernels.msda.default,
                          tuple(args[k] for k in ARG_NAMES))


@pytest.mark.slow
def test_torch_compile_fullgraph():
    args = inputs(queries=3, heads=1, channels=4, requires_grad=True)
    compiled = torch.compile(sk.multi_scale_deformable_attn, fullgraph=True)
    out = compiled(*(args[k] for k in ARG_NAMES))
    expected, _ = fp64_reference(args)
    assert_scaled_close(out, expected, TOLERANCE[torch.float32], "compiled forward")
    out.sum().backward()
    assert args["value"].grad is not None and args["value"].grad.abs().sum() > 0


# ---------------------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("distribution", ["uniform", "local"])
def test_gpu_decoder_preset(dtype, distribution):
    args = preset_inputs("decoder", distribution=distribution, dtype=dtype, device="cuda",
                         requires_grad=True)
    check_forward_and_backward(args, dtype)


@pytest.mark.gpu
def test_gpu_mixed_precision_decoder_preset():
    """bf16 values with fp32 locations and weights on the decoder preset, eagerly and
    under torch.compile(fullgraph=True) (the kernels the compiler launches itself)."""
    eager = check_mixed_precision(preset_inputs("decoder", dtype=torch.float32, device="cuda",
                                                requires_grad=True), torch.bfloat16)
    torch.compiler.reset()
    compiled = torch.compile(sk.multi_scale_deformable_attn, fullgraph=True)
    got = check_mixed_precision(preset_inputs("decoder", dtype=torch.float32, device="cuda",
                                              requires_grad=True), torch.bfloat16, compiled)
    torch.compiler.reset()
    torch.testing.assert_close(got[0], eager[0])


@pytest.mark.gpu
@pytest.mark.parametrize("accum", [True, False])
def test_gpu_bf16_both_accumulation_paths(accum):
    args = inputs(batch=2, queries=200, heads=4, channels=32, shapes=[[20, 30], [10, 15]],
                  points=4, dtype=torch.bfloat16, device="cuda", distribution="local",
                  requires_grad=True)
    check_forward_and_backward(args, torch.bfloat16, fp32_grad_accum=accum)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["encoder", "decoder-b32"])
def test_gpu_large_presets_forward(name):
    args = preset_inputs(name, dtype=torch.float32, device="cuda")
    out = sk.multi_scale_deformable_attn(**args)
    expected = reference.msda_grid_sample(**{k: v.double() if v.is_floating_point() else v
                                             for k, v in args.items()})
    assert_scaled_close(out, expected, TOLERANCE[torch.float32], f"{name} forward",
                        MSDA_OUTPUT_AXES)


@pytest.mark.gpu
def test_gpu_forward_is_deterministic():
    args = preset_inputs("encoder", distribution="local", dtype=torch.bfloat16, device="cuda")
    first = sk.multi_scale_deformable_attn(**args)
    for _ in range(3):
        assert torch.equal(sk.multi_scale_deformable_attn(**args), first)


@pytest.mark.gpu
def test_gpu_backward_run_to_run_spread_is_small():
    """Atomics add in a different order each run: grad_value varies within rounding."""
    args = preset_inputs("decoder", distribution="local", dtype=torch.float32, device="cuda",
                         requires_grad=True)
    grads = []
    for _ in range(3):
        args["value"].grad = None
        sk.multi_scale_deformable_attn(**args).sum().backward()
        grads.append(args["value"].grad.clone())
    scale = grads[0].abs().max().item()
    for g in grads[1:]:
        assert (g - grads[0]).abs().max().item() <= 1e-5 * scale


@pytest.mark.gpu
def test_gpu_flat_index_beyond_int32():
    """value with more than 2**31 elements: the last level's rows sit past 2**31."""
    heads, channels = 1, 8192
    shapes = torch.tensor([[512, 512], [1, 1]], device="cuda")
    total = 512 * 512 + 1
    assert total * heads * channels > 2 ** 31
    value = torch.zeros(1, total, heads, channels, device="cuda", dtype=torch.bfloat16)
    value[0, -1] = 1.0                                 # the 1x1 level, at flat index > 2**31
    value[0, 0] = 2.0
    starts = torch.tensor([0, 512 * 512], device="cuda")
    loc = torch.full((1, 2, heads, 2, 1, 2), 0.5, device="cuda", dtype=torch.bfloat16)
    loc[0, 0, 0, 0, 0] = torch.tensor([0.5 / 512, 0.5 / 512])     # centre of pixel (0, 0)
    attn = torch.ones(1, 2, heads, 2, 1, device="cuda", dtype=torch.bfloat16)
    out = sk.multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    # query 0: level 0 at pixel (0, 0) gives 2, level 1 (1x1, centre) gives 1
    assert out[0, 0].float().unique().tolist() == [3.0]
    assert out[0, 1, :].float().unique().tolist() == [1.0]


@pytest.mark.gpu
def test_gpu_launch_follows_the_inputs_device():
    """The launch runs on the inputs' device, whatever device is current."""
    last = torch.cuda.device_count() - 1
    args = inputs(batch=2, queries=50, heads=2, channels=32, device=f"cuda:{last}",
                  requires_grad=True)
    with torch.cuda.device(0):
        check_forward_and_backward(args, torch.float32)


@pytest.mark.gpu
def test_gpu_cpu_inputs_get_a_clear_error():
    """With a GPU the kernels are compiled for it: CPU tensors are refused by name."""
    with pytest.raises(ValueError, match="value is on the CPU"):
        sk.multi_scale_deformable_attn(**inputs(device="cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_second_device_matches_first():
    results = []
    for device in ("cuda:0", "cuda:1"):
        args = inputs(batch=2, queries=100, heads=4, channels=32, device=device,
                      requires_grad=True, seed=5)
        with torch.cuda.device(0):
            out = sk.multi_scale_deformable_attn(**args)
            out.sum().backward()
        results.append([out.cpu(), args["value"].grad.cpu(), args["sampling_locations"].grad.cpu()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_inputs_on_two_devices_are_refused():
    args = inputs(device="cuda:0")
    args["attention_weights"] = args["attention_weights"].to("cuda:1")
    with pytest.raises(ValueError, match="attention_weights is on cuda:1"):
        sk.multi_scale_deformable_attn(**args)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    args = preset_inputs("decoder", dtype=torch.bfloat16, device="cuda")
    eager = sk.multi_scale_deformable_attn(**args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sk.multi_scale_deformable_attn(**args)          # warm-up: compile outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sk.multi_scale_deformable_attn(**args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


# ---------------------------------------------------------------------------- both kernels

@pytest.mark.parametrize("kernel", ["loop", "tiled"])
@pytest.mark.parametrize("block_q", [1, 4, 16])
def test_loop_and_tiled_kernels_match_fp64(kernel, block_q):
    """Both kernel variants, forward and backward, whatever the plan picks for the op."""
    from source_kernels.forward import msda_forward
    args = inputs(batch=2, queries=9, heads=2, channels=5, shapes=[[4, 3], [2, 5], [1, 1]],
                  points=3, outside=0.2, seed=block_q)
    ordered = [args[k] for k in ARG_NAMES]
    grad_output = torch.randn(2, 9, 10, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    expected, grads = fp64_reference(args, grad_output)
    out = msda_forward(*ordered, kernel=kernel, block_q=block_q)
    assert_scaled_close(out, expected, TOLERANCE[torch.float32], f"{kernel} forward",
                        MSDA_OUTPUT_AXES)
    got = msda_backward(grad_output, *ordered, kernel=kernel, block_q=block_q)
    kinks = on_a_pixel_boundary(args)
    for name, g, e in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"),
                          got, grads):
        assert_scaled_close(g, e, GRAD_TOLERANCE[torch.float32], f"{kernel} {name}",
                            ignore=kinks if name == "grad_sampling_locations" else None)


@pytest.mark.parametrize("kernel,block", [("rows", 4), ("rows-persistent", 8),
                                          ("rows-level-hm", 16), ("rows-sample", 16)])
def test_row_kernels_match_fp64(kernel, block):
    """The row-blocked kernels (rows.py), each schedule, forward and backward: rows of
    several batches and heads in one block, samples outside the maps, D not a power of 2."""
    from source_kernels.forward import msda_forward
    args = inputs(batch=2, queries=9, heads=2, channels=5, shapes=[[4, 3], [2, 5], [1, 1]],
                  points=3, outside=0.2, seed=block)
    ordered = [args[k] for k in ARG_NAMES]
    grad_output = torch.randn(2, 9, 10, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    expected, grads = fp64_reference(args, grad_output)
    out = msda_forward(*ordered, kernel=kernel, block_q=block, num_warps=1)
    assert_scaled_close(out, expected, TOLERANCE[torch.float32], f"{kernel} forward",
                        MSDA_OUTPUT_AXES)
    got = msda_backward(grad_output, *ordered, kernel=kernel.replace("-persistent", ""),
                        block_q=block, num_warps=1)
    kinks = on_a_pixel_boundary(args)
    for name, g, e in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"),
                          got, grads):
        assert_scaled_close(g, e, GRAD_TOLERANCE[torch.float32], f"{kernel} {name}",
                            ignore=kinks if name == "grad_sampling_locations" else None)
