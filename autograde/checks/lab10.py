"""Hidden checks of lab 10 (ship it): input validation, the autograd Function and the plain
operator.  The graded code builds on the chips of labs 05 and 08 (the forward and backward
launchers), so those stay usable; the course's own wrapper and validation do not."""
from __future__ import annotations

import contextlib
import re
import sys

import torch

from autograde import recording
from source_kernels.validate import validate_inputs

from . import _operator as op
from .common import forbid_references, fresh_generator

# the forward and backward launchers (chips of labs 05 and 08) and the helpers they use
KERNEL_MODULES = ("source_kernels.forward", "source_kernels.backward", "source_kernels.sampling",
                  "source_kernels.tiled", "source_kernels.launch")
ARGS = op.ARG_NAMES


def _valid(gen, dtype=torch.float32, batch=2):
    return op.inputs(gen, batch, 3, 2, 4, [[3, 4], [2, 2]], 2, dtype=dtype)


def _bad_cases(gen):
    """(description, culprit argument, arguments as a dict incl. im2col_step)."""
    def case(description, culprit, **change):
        args = dict(_valid(gen), im2col_step=64)
        for key, fn in change.items():
            args[key] = fn(args)
        return description, culprit, args

    dev = op.device()
    yield case("value with 3 dimensions", "value", value=lambda a: a["value"][0])
    yield case("integer value", "value", value=lambda a: a["value"].long())
    yield case("S is not the sum of H*W", "value", value=lambda a: a["value"][:, :-1])
    yield case("level start index inconsistent", "value_level_start_index",
               value_level_start_index=lambda a: torch.tensor([0, 11], device=dev))
    yield case("level start index of the wrong length", "value_level_start_index",
               value_level_start_index=lambda a: torch.tensor([0], device=dev))
    yield case("a level of height 0", "value_spatial_shapes",
               value_spatial_shapes=lambda a: torch.tensor([[3, 4], [0, 2]], device=dev))
    yield case("float spatial shapes", "value_spatial_shapes",
               value_spatial_shapes=lambda a: a["value_spatial_shapes"].float())
    yield case("spatial shapes with one column", "value_spatial_shapes",
               value_spatial_shapes=lambda a: a["value_spatial_shapes"][:, :1])
    yield case("locations with 5 dimensions", "sampling_locations",
               sampling_locations=lambda a: a["sampling_locations"][..., 0])
    yield case("locations of another batch size", "sampling_locations",
               sampling_locations=lambda a: a["sampling_locations"][:1])
    yield case("locations with another number of heads", "sampling_locations",
               sampling_locations=lambda a: a["sampling_locations"][:, :, :1])
    yield case("locations with 3 coordinates", "sampling_locations",
               sampling_locations=lambda a: torch.cat([a["sampling_locations"],
                                                       a["sampling_locations"][..., :1]], -1))
    yield case("weights of the wrong shape", "attention_weights",
               attention_weights=lambda a: a["attention_weights"][..., :1])
    yield case("weights in float64, the rest in float32", "attention_weights",
               attention_weights=lambda a: a["attention_weights"].double())
    yield case("locations given as a list", "sampling_locations",
               sampling_locations=lambda a: [0.5, 0.5])
    # (a tensor on another device is left to the visible check and the test suite: on a
    # machine without a GPU the only other device is "meta", which a recorded call cannot
    # snapshot)
    yield case("im2col_step = 0", "im2col_step", im2col_step=lambda a: 0)


def _good_cases(gen):
    base = dict(_valid(gen), im2col_step=64)
    yield "valid inputs", base
    yield "an empty batch", dict(_valid(gen, batch=0), im2col_step=64)
    yield "int32 shapes and start index", dict(
        base, value_spatial_shapes=base["value_spatial_shapes"].int(),
        value_level_start_index=base["value_level_start_index"].int())
    yield "a batch of 2 with im2col_step 3", dict(base, im2col_step=3)
    yield "non-contiguous value", dict(base, value=base["value"].transpose(2, 3)
                                       .contiguous().transpose(2, 3))


def _expected_error(args):
    try:
        validate_inputs(*(args[k] for k in ARGS), args["im2col_step"])
    except (TypeError, ValueError) as exc:
        return type(exc)
    raise RuntimeError("internal: a bad case that validate_inputs accepts")


def _names(culprit):
    return re.compile(rf"(?<![\w.]){re.escape(culprit)}(?![\w])")


@contextlib.contextmanager
def _kernels_refuse():
    """The course's kernels raise instead of running: the arguments are invalid, and a kernel
    launched on them would read outside the tensors."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("msda_operator launched a kernel on arguments that validation "
                             "must reject: validate before any launch")

    kernels = {}
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(KERNEL_MODULES):
            for obj in list(vars(module).values()):
                if hasattr(obj, "run") and callable(getattr(obj, "fn", None)):
                    kernels[id(obj)] = obj
    kernels = list(kernels.values())
    for kernel in kernels:
        kernel.run = refuse
    try:
        yield
    finally:
        for kernel in kernels:
            kernel.__dict__.pop("run", None)


def _call_and_classify(fn, args, what, expected_type, culprit):
    with forbid_references(fn, allow=KERNEL_MODULES), _kernels_refuse():
        try:
            fn(*(args[k] for k in ARGS), args["im2col_step"])
        except (TypeError, ValueError) as exc:
            raised = exc
        else:
            raised = None
    if raised is None:
        raise AssertionError(f"{what}: expected {expected_type.__name__} naming "
                             f"{culprit!r}, but nothing was raised")
    if type(raised) is not expected_type:
        raise AssertionError(f"{what}: expected {expected_type.__name__}, got "
                             f"{type(raised).__name__}: {raised}. TypeError is for a wrong "
                             "type or dtype, ValueError for a wrong shape, size, value or "
                             "device.")
    if not _names(culprit).search(str(raised)):
        raise AssertionError(f"{what}: the message must name the argument {culprit!r}, "
                             f"got: {raised}")


def check_validation(validate):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for description, culprit, args in _bad_cases(gen):
        _call_and_classify(validate, args, f"validate with {description} (hidden check, seed "
                           f"{seed})", _expected_error(args), culprit)
    for description, args in _good_cases(gen):
        with forbid_references(validate, allow=KERNEL_MODULES):
            try:
                validate(*(args[k] for k in ARGS), args["im2col_step"])
            except (TypeError, ValueError) as exc:
                raise AssertionError(f"validate rejected {description}, which the operator "
                                     f"accepts: {type(exc).__name__}: {exc} (hidden check, seed "
                                     f"{seed})") from None


def _forward_backward(MSDAFunction, args, grad_output):
    """The student's Function forward (through apply) and backward (through autograd).
    While the grader replays a recorded run, the recorded results of the two methods stand in
    for them (there is no autograd graph to run then)."""
    values = [args[k] for k in ARGS]
    if recording.replaying():
        out = MSDAFunction.forward(None, *values, 64)
        grads = MSDAFunction.backward(None, grad_output)
        return out, (grads[0], grads[3], grads[4])
    leaves = [values[0].requires_grad_(), values[3].requires_grad_(),
              values[4].requires_grad_()]
    out = MSDAFunction.apply(*values, 64)
    grads = torch.autograd.grad(out, leaves, grad_output, allow_unused=True)
    return out, grads


def check_autograd(MSDAFunction):
    gen = fresh_generator()
    seed = gen.initial_seed()
    cases = [("fp32, 2 levels, locations up to 20% outside", op.inputs(
                 gen, 2, 5, 2, 4, [[3, 5], [2, 2]], 2, outside=0.2)),
             ("fp64, levels (2, 3) and (1, 1)", op.inputs(
                 gen, 1, 4, 1, 3, [[2, 3], [1, 1]], 2, dtype=torch.float64))]
    for description, args in cases:
        dtype = args["value"].dtype
        out_shape = (args["value"].shape[0], args["sampling_locations"].shape[1],
                     args["value"].shape[2] * args["value"].shape[3])
        grad_output = torch.randn(out_shape, generator=gen, dtype=dtype).to(args["value"].device)
        expected = op.forward_fp64(args)
        expected_grads = op.gradients_fp64(args, grad_output)
        with forbid_references(MSDAFunction.forward, MSDAFunction.backward,
                               allow=KERNEL_MODULES):
            out, grads = _forward_backward(MSDAFunction, args, grad_output)
        what = f"(hidden check, {description}, seed {seed})"
        op.assert_scaled(out, expected, dtype, f"MSDAFunction forward {what}",
                         op.MSDA_OUTPUT_AXES)
        names = ("grad_value", "grad_sampling_locations", "grad_attention_weights")
        axes = (op.VALUE_AXES, op.LOC_AXES, op.PARAM_AXES)
        for name, got, want, ax in zip(names, grads, expected_grads, axes):
            if got is None:
                raise AssertionError(f"MSDAFunction backward {what}: {name} is None; backward "
                                     "returns one gradient per input of forward, in order "
                                     "(None for the shapes, start index, im2col_step and "
                                     "fp32_grad_accum)")
            op.assert_scaled(got, want, dtype, f"MSDAFunction backward: {name} {what}", ax,
                             table=op.GRAD_TOLERANCE)


def check_operator(msda_operator):
    gen = fresh_generator()
    seed = gen.initial_seed()
    base = op.inputs(gen, 3, 4, 2, 4, [[3, 4], [1, 2]], 2, outside=0.1)
    strided = dict(base, value=base["value"].transpose(2, 3).contiguous().transpose(2, 3),
                   attention_weights=torch.stack([base["attention_weights"]] * 2, -1)[..., 1])
    half = {k: v.half() if v.is_floating_point() else v for k, v in base.items()}
    calls = [("keyword arguments with mmcv's names, batch 3 with im2col_step 2", base,
              dict(im2col_step=2)),
             ("non-contiguous value and attention_weights", strided, {}),
             ("fp16 inputs with fp32_grad_accum=True", half, dict(fp32_grad_accum=True))]
    for description, args, extra in calls:
        dtype = args["value"].dtype
        expected = op.forward_fp64(args)
        with forbid_references(msda_operator, allow=KERNEL_MODULES):
            got = msda_operator(**args, **extra)
        op.assert_scaled(got, expected, dtype, f"msda_operator with {description} (hidden "
                         f"check, seed {seed})", op.MSDA_OUTPUT_AXES)


def check_operator_validates(msda_operator):
    gen = fresh_generator()
    seed = gen.initial_seed()
    chosen = ("integer value", "S is not the sum of H*W", "locations of another batch size",
              "weights in float64, the rest in float32", "im2col_step = 0")
    for description, culprit, args in _bad_cases(gen):
        if description not in chosen:
            continue
        _call_and_classify(msda_operator, args, f"msda_operator with {description} (hidden "
                           f"check, seed {seed})", _expected_error(args), culprit)
