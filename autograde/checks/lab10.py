"""Checks of lab 10 (ship it): input validation, the autograd Function and the plain operator.

Each check serves the visible cell (a shown ``seed=``) and the hidden one (the grader's seed).
The graded code builds on the chips of labs 05 and 08 (the forward and backward launchers), so
those stay usable; the course's own wrapper and validation do not.

The bad inputs are those of the operator test suite (``tests/test_operator.py``:
``BAD_INPUTS``, the same names, each with the fragment of the message the suite matches, and
``test_bad_im2col_step``), then the lab's own: a student who passes the visible check passes
the suite's bad-input tests.  The expected exception and its exact words come from the course's
validation, only when the check judges.

``MSDAFunction`` is called as autograd calls it (``forward(ctx, ...)``, then
``backward(ctx, grad_output)``) with a context that behaves as autograd's does for what the lab
uses: ``save_for_backward`` keeps tensors and their versions, and ``saved_tensors`` refuses a
tensor changed in place since (as autograd does).  So the grader's replay sees the same calls as
the notebook, and a Function that keeps its tensors as attributes of ``ctx`` is caught by what
that costs: nothing notices when an input changes between forward and backward.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys

import torch

from autograde import check_api

from . import _operator as op
from .common import (Raised, attempt, attempt_expecting, forbid_references, fresh_generator,
                     judging, show)

# the forward and backward launchers (chips of labs 05 and 08) and the helpers they use
KERNEL_MODULES = ("source_kernels.forward", "source_kernels.backward", "source_kernels.sampling",
                  "source_kernels.tiled", "source_kernels.rows", "source_kernels.launch")
ARGS = op.ARG_NAMES
GRAD_NAMES = ("grad_value", "grad_sampling_locations", "grad_attention_weights")


def _replace(**change):
    """A change of the valid arguments: each keyword maps an argument to fn(arguments)."""
    def apply(args):
        for key, fn in change.items():
            args[key] = fn(args)
    return apply


def _tensor(values):
    return lambda a: torch.tensor(values, device=a["value"].device)


# name -> (the argument the message names, the change, the words the message must hold).
# The first 19 are the suite's BAD_INPUTS (tests/test_operator.py), names and words as there.
BAD_INPUTS = {
    "value rank": ("value", _replace(value=lambda a: a["value"][0]), "value must have 4"),
    "value integer": ("value", _replace(value=lambda a: a["value"].long()),
                      "value must be a floating"),
    "value boolean": ("value", _replace(value=lambda a: a["value"] > 0),
                      "value must be a floating"),
    "S not sum of H*W": ("value", _replace(value=lambda a: a["value"][:, :-1]), "sum(H*W)"),
    "start index inconsistent": ("value_level_start_index",
                                 _replace(value_level_start_index=_tensor([0, 11])),
                                 "value_level_start_index[1]"),
    "start index wrong length": ("value_level_start_index",
                                 _replace(value_level_start_index=_tensor([0])),
                                 "value_level_start_index has size"),
    "zero level size": ("value_spatial_shapes",
                        _replace(value_spatial_shapes=_tensor([[3, 4], [0, 2]])),
                        "positive height and width"),
    "negative level size": ("value_spatial_shapes",
                            _replace(value_spatial_shapes=_tensor([[3, 4], [-2, -2]])),
                            "positive height and width"),
    "shapes float": ("value_spatial_shapes",
                     _replace(value_spatial_shapes=lambda a: a["value_spatial_shapes"].float()),
                     "value_spatial_shapes must be an int64"),
    "shapes wrong columns": ("value_spatial_shapes", _replace(
        value_spatial_shapes=lambda a: a["value_spatial_shapes"][:, :1]),
        "value_spatial_shapes has size 1"),
    "locations rank": ("sampling_locations", _replace(
        sampling_locations=lambda a: a["sampling_locations"][..., 0]),
        "sampling_locations must have 6"),
    "locations batch": ("sampling_locations", _replace(
        sampling_locations=lambda a: a["sampling_locations"][:1]),
        "sampling_locations has size 1 on axis 0"),
    "locations levels": ("sampling_locations", _replace(
        sampling_locations=lambda a: a["sampling_locations"][:, :, :, :1]),
        "sampling_locations has size 1 on axis 3"),
    "locations xyz": ("sampling_locations", _replace(
        sampling_locations=lambda a: torch.cat([a["sampling_locations"],
                                                a["sampling_locations"][..., :1]], -1)),
        "(x, y)"),
    "weights shape": ("attention_weights", _replace(
        attention_weights=lambda a: a["attention_weights"][..., :1]),
        "attention_weights must have shape"),
    "mixed dtypes": ("attention_weights", _replace(
        attention_weights=lambda a: a["attention_weights"].double()),
        "attention_weights has dtype torch.float64"),
    "weights integer": ("attention_weights", _replace(
        attention_weights=lambda a: a["attention_weights"].int()),
        "attention_weights must be a floating"),
    "locations not a tensor": ("sampling_locations",
                               _replace(sampling_locations=lambda a: [0.5, 0.5]),
                               "sampling_locations must be a torch.Tensor"),
    "shapes on another device": ("value_spatial_shapes", _replace(
        value_spatial_shapes=lambda a: a["value_spatial_shapes"].to("meta")),
        "value_spatial_shapes is on meta"),
    # the suite's test_bad_im2col_step, and the lab's own
    "im2col_step 0": ("im2col_step", _replace(im2col_step=lambda a: 0),
                      "im2col_step must be a positive int"),
    "im2col_step True": ("im2col_step", _replace(im2col_step=lambda a: True),
                         "im2col_step must be a positive int"),
    "im2col_step 64.0": ("im2col_step", _replace(im2col_step=lambda a: 64.0),
                         "im2col_step must be a positive int"),
    "value float16, the rest float32": ("sampling_locations", _replace(
        value=lambda a: a["value"].half()), "sampling_locations has dtype torch.float32"),
    "locations heads": ("sampling_locations", _replace(
        sampling_locations=lambda a: a["sampling_locations"][:, :, :1]),
        "sampling_locations has size 1 on axis 2 (M heads, from value)"),
    "no level": ("value_spatial_shapes", _replace(
        value_spatial_shapes=lambda a: a["value_spatial_shapes"][:0],
        value_level_start_index=lambda a: a["value_level_start_index"][:0]),
        "value_spatial_shapes describes no level"),
    "no channel": ("value", _replace(value=lambda a: a["value"][..., :0]),
                   "value needs at least one head and one channel"),
    "no point": ("sampling_locations", _replace(
        sampling_locations=lambda a: a["sampling_locations"][:, :, :, :, :0],
        attention_weights=lambda a: a["attention_weights"][..., :0]),
        "sampling_locations has K = 0 points per level"),
}
SUITE_CASES = tuple(list(BAD_INPUTS)[:19]) + ("im2col_step 0",)
# what a validate that lets a case through usually overlooked
NOT_CAUGHT = {
    "value boolean": "a bool tensor is not a floating tensor: accept only float16, bfloat16, "
                     "float32 and float64",
    "negative level size": "a level needs H > 0 and W > 0: test h <= 0 or w <= 0",
    "zero level size": "a level needs H > 0 and W > 0: test h <= 0 or w <= 0",
    "im2col_step True": "a bool is an int in Python (True == 1): test isinstance(im2col_step, "
                        "bool) first",
    "im2col_step 64.0": "a float is not an int, even 64.0: test isinstance(im2col_step, int)",
    "shapes on another device": "compare each tensor's device with value's",
    "locations xyz": "the last axis of sampling_locations holds (x, y): its size must be 2",
    "no level": "L = 0 levels is invalid: value_spatial_shapes needs at least one row",
    "no channel": "value needs M >= 1 heads and D >= 1 channels",
    "no point": "K = 0 points is invalid",
}
# a tensor on the meta device cannot be recorded while grading: the visible check tries it
NOT_WHILE_GRADING = ("shapes on another device",)
# Inputs this process cannot run the kernels on: CPU tensors while Triton compiles the kernels
# for the GPU.  The check turns the interpreter off for the length of the call, as it is on a
# GPU host, so that a CPU machine shows the case too (only validate runs: nothing is compiled).
# name -> (the argument the message names, the words the message must hold)
HOST_CASES = {"CPU inputs, kernels compiled for the GPU": ("value", "value is on the CPU")}
NOT_CAUGHT["CPU inputs, kernels compiled for the GPU"] = (
    "with TRITON_INTERPRET off (a GPU host) the kernels are compiled for the GPU and cannot "
    "read CPU tensors: read os.environ when validate is called and refuse CPU inputs then")


@contextlib.contextmanager
def _compiling_for_the_gpu():
    """TRITON_INTERPRET off while the block runs (validation reads it at call time)."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _host_cases(gen):
    """(name, culprit, arguments on the CPU, words) of HOST_CASES."""
    for name, (culprit, words) in HOST_CASES.items():
        args = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in _valid(gen).items()}
        yield name, culprit, args, words


def _valid(gen, dtype=torch.float32, batch=2, queries=3):
    return dict(op.inputs(gen, batch, queries, 2, 4, [[3, 4], [2, 2]], 2, dtype=dtype),
                im2col_step=64)


def _bad_cases(gen, names=None):
    """(name, culprit, arguments incl. im2col_step, words); every case draws its inputs, so
    the others get the same ones whether the meta-device case runs or not."""
    grading = check_api.recording() or check_api.replaying()
    for name, (culprit, change, words) in BAD_INPUTS.items():
        if names is not None and name not in names:
            continue
        args = _valid(gen)
        change(args)
        if not (grading and name in NOT_WHILE_GRADING):
            yield name, culprit, args, words


def _good_cases(gen):
    """(what, arguments, what a rejection means)."""
    base = _valid(gen)
    yield "valid inputs", base, "these are valid inputs"
    yield "an empty batch", _valid(gen, batch=0), "an empty batch (B = 0) is valid"
    yield "zero queries", _valid(gen, queries=0), "zero queries (Q = 0) is valid"
    yield "int32 shapes and start index", dict(
        base, value_spatial_shapes=base["value_spatial_shapes"].int(),
        value_level_start_index=base["value_level_start_index"].int()), \
        "value_spatial_shapes and value_level_start_index may be int32 as well as int64"
    yield "a batch of 2 with im2col_step 3", dict(base, im2col_step=3), \
        "im2col_step need not divide the batch: the kernels take the whole batch at once"
    yield "non-contiguous value", dict(base, value=base["value"].transpose(2, 3)
                                       .contiguous().transpose(2, 3)), \
        "non-contiguous tensors are valid: the Function makes them contiguous"


def _course_error(args):
    """What the course's validation raises for these arguments (judging only)."""
    from source_kernels.validate import validate_inputs

    try:
        validate_inputs(*(args[k] for k in ARGS), args["im2col_step"])
    except (TypeError, ValueError) as exc:
        return exc
    raise RuntimeError("internal: a bad case that the course's validation accepts")


def _names(culprit):
    return re.compile(rf"(?<![\w.]){re.escape(culprit)}(?![\w])")


class KernelLaunched(RuntimeError):
    """A kernel was launched on arguments that validation must reject."""


@contextlib.contextmanager
def _kernels_refuse():
    """The course's kernels raise instead of running: the arguments are invalid, and a kernel
    launched on them would read outside the tensors."""
    def refuse(*_args, **_kwargs):
        raise KernelLaunched("msda_operator launched a kernel on arguments that validation "
                             "must reject")

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


def _call(fn, args):
    return fn(*(args[k] for k in ARGS), args["im2col_step"])


TYPE_RULE = ("TypeError is for a wrong type or dtype, ValueError for a wrong shape, size, "
             "value or device")


LAUNCHED = ("MSDAFunction.forward calls validate before anything else: a kernel launched on "
            "these arguments reads outside the tensors")


def _judge_bad(name, culprit, args, words, got, where, launched=LAUNCHED):
    """Raise AssertionError unless ``got`` is the course's exception type with ``words``."""
    if isinstance(got, Raised) and isinstance(got.exc, RuntimeError) and \
            "launched a kernel" in str(got.exc):
        raise AssertionError(f"{where}: {got.exc}\nHint: {launched}")
    course = _course_error(args)
    wanted = f"{type(course).__name__}: {course}"
    if got is None:
        raise AssertionError(f"{where}: nothing was raised; expected {wanted}\nHint: "
                             + NOT_CAUGHT.get(name, "add the table's check for this problem")
                             + f"; the words the message must hold: {words!r}")
    if isinstance(got, Raised) and not isinstance(got.exc, (TypeError, ValueError)):
        raise AssertionError(
            f"{where}: raised {got}; expected {wanted}\nHint: validate must catch this before "
            "anything else touches the argument; check in the table's order (tensors first, "
            "then dtypes, devices, im2col_step, ranks, sizes, contents)")
    exc = got.exc
    # the course's own class, or the builtin kind it is (its dtype-mismatch error is both a
    # TypeError and a ValueError, for mmcv-style callers; the table asks for a TypeError)
    if type(exc) is not type(course) and not (type(exc) in (TypeError, ValueError)
                                              and isinstance(course, type(exc))):
        raise AssertionError(f"{where}: raised {got}; expected {wanted}\nHint: {TYPE_RULE}")
    message = str(exc)
    if words not in message:
        named = message.split(" ", 1)[0].split("[", 1)[0]
        if named != culprit and named in ARGS + ("im2col_step",):
            hint = (f"this is the error of another check (about {named}): the check for this "
                    "problem is missing or comes later; run the checks in the table's order"
                    + (f" ({NOT_CAUGHT[name]})" if name in NOT_CAUGHT else ""))
        elif not _names(culprit).search(message):
            hint = f"the message must name the argument {culprit!r}"
        else:
            hint = (f"use the table's words: the test suite looks for {words!r} in the "
                    "message")
        raise AssertionError(f"{where}: raised {got}; expected {wanted}\nHint: {hint}")


def _judge_valid(args, got, where):
    """Raise AssertionError when validate raised on the plain valid inputs: its own code fails
    (an exception that is no validation's), or one of its checks rejects a right argument."""
    if got is None:
        return
    from .demo import where as line_of

    exc = got.exc
    if not isinstance(exc, (TypeError, ValueError)):
        raise AssertionError(
            f"{where}: raised {got}{line_of(exc)}, on arguments the operator accepts\nHint: "
            "validate's own code fails on valid inputs: the line named is where it "
            "stops (a name used before it is assigned, an attribute or index that is not there)")
    named = str(exc).split(" ", 1)[0].split("[", 1)[0]
    if named in ARGS:
        value = args[named]
        shown = (f"its shape here is {tuple(value.shape)}, dtype {value.dtype}"
                 if isinstance(value, torch.Tensor) else f"it is {value!r} here")
        hint = (f"your check of {named} rejects a right {named} ({shown}, as the table "
                "allows): compare that check's condition, and the axis and size it reads, "
                "with the table")
    else:
        hint = ("these are valid inputs: the check that raised this rejects arguments the "
                "table allows")
    raise AssertionError(f"{where}: raised {got}, but the operator accepts these arguments"
                         f"\nHint: {hint}")


def check_validation(validate, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    bad = list(_bad_cases(gen))
    host = list(_host_cases(gen))
    good = list(_good_cases(gen))
    results = []
    with forbid_references(validate, allow=KERNEL_MODULES):
        for _, _, args, _ in bad:
            results.append(_attempt_none(validate, args))
        with _compiling_for_the_gpu():
            host_results = [_attempt_none(validate, args) for _, _, args, _ in host]
        good_results = [_attempt_none(validate, args) for _, args, _ in good]
    if not judging():
        return
    # the valid inputs first: a validation that rejects them says nothing about the bad ones
    _judge_valid(good[0][1], good_results[0], f"validate with valid inputs (seed {seed})")
    for (name, culprit, args, words), got in zip(bad, results):
        _judge_bad(name, culprit, args, words, got,
                   f"validate with bad input {name!r} (seed {seed})")
    with _compiling_for_the_gpu():
        for (name, culprit, args, words), got in zip(host, host_results):
            _judge_bad(name, culprit, args, words, got,
                       f"validate with {name} (TRITON_INTERPRET off, seed {seed})")
    for (what, _, meaning), got in zip(good, good_results):
        if got is not None:
            raise AssertionError(f"validate with {what} (seed {seed}): raised {got}, but the "
                                 f"operator accepts these arguments\nHint: {meaning}")
    suite = sum(1 for name, *_ in bad if name in SUITE_CASES)
    show(f"validate: {len(bad) + len(host)} bad inputs rejected with the table's exception and words "
         f"({suite} of them the test suite's), {len(good)} valid ones accepted (seed {seed})")


def _attempt_none(fn, args):
    """None when ``fn(args)`` returns, else :class:`Raised` (a TypeError or ValueError is
    what a bad input should give, in the grading kernel too)."""
    result = attempt_expecting((TypeError, ValueError), _call, fn, args)
    return result if isinstance(result, Raised) else None


# ------------------------------------------------------------------ the autograd Function
class Context:
    """What autograd hands ``forward`` and ``backward`` as ``ctx``, for a direct call: tensors
    kept with ``save_for_backward`` come back from ``saved_tensors``, unless one was changed in
    place since (then it raises, as autograd does)."""

    def __init__(self):
        self._saved, self._versions = (), ()
        self.needs_input_grad = (True, False, False, True, True, False, False)

    def save_for_backward(self, *tensors):
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"save_for_backward can only save tensors, but argument {i} is "
                                f"of type {type(t).__name__}")
        self._saved = tensors
        self._versions = tuple(None if t is None else t._version for t in tensors)

    @property
    def saved_tensors(self):
        for i, (t, version) in enumerate(zip(self._saved, self._versions)):
            if t is not None and t._version != version:
                raise RuntimeError(f"one of the variables needed for gradient computation has "
                                   f"been modified by an inplace operation: saved tensor {i} is "
                                   f"at version {t._version}; expected version {version}")
        return self._saved

    def mark_non_differentiable(self, *args):
        pass

    def set_materialize_grads(self, value):
        pass


def _function_cases(gen):
    """(what, arguments as a dict with the trailing arguments under "extra", grad_output,
    changed in place between forward and backward)."""
    def grad_for(args):
        batch, _, heads, channels = args["value"].shape
        shape = (batch, args["sampling_locations"].shape[1], heads * channels)
        return torch.randn(shape, generator=gen, dtype=args["value"].dtype).to(
            args["value"].device)

    cases = []
    args = op.inputs(gen, 2, 5, 2, 4, [[3, 5], [2, 2]], 2, outside=0.2)
    cases.append(("fp32, mmcv's six arguments (im2col_step=64)", args, (64,), grad_for(args),
                  False))
    args = op.inputs(gen, 1, 4, 1, 3, [[2, 3], [1, 1]], 2, dtype=torch.float64)
    cases.append(("fp64, seven arguments: mmcv's six and fp32_grad_accum=None, as "
                  "msda_operator passes them", args, (64, None), grad_for(args), False))
    args = op.inputs(gen, 2, 4, 2, 3, [[3, 4], [1, 2]], 2, outside=0.1)
    args = dict(args,
                sampling_locations=args["sampling_locations"].transpose(1, 2).contiguous()
                .transpose(1, 2),
                attention_weights=args["attention_weights"].transpose(1, 2).contiguous()
                .transpose(1, 2))
    cases.append(("non-contiguous sampling_locations and attention_weights", args, (64,),
                  grad_for(args), False))
    args = op.inputs(gen, 1, 3, 1, 2, [[2, 3]], 1, dtype=torch.float64)
    cases.append(("value changed in place (doubled) after forward, before backward", args,
                  (64,), grad_for(args), True))
    return cases


OUT_AXES = ("batch", "query", "head", "channel")


def _assert_output(got, args, what, hint=None):
    """The forward's (B, Q, M*D) against the float64 reference, compared as (B, Q, M, D) so
    that a message names the head and the channel."""
    expected = op.forward_fp64({k: args[k] for k in ARGS})
    batch, _, heads, channels = args["value"].shape
    shape = (batch, args["sampling_locations"].shape[1], heads, channels)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(expected.shape):
        got, expected, axes = got.reshape(shape), expected.reshape(shape), OUT_AXES
    else:
        axes = op.MSDA_OUTPUT_AXES
    op.assert_scaled(got, expected, args["value"].dtype, what, axes, hint=hint)


def _run_function(MSDAFunction, args, extra, grad_output, change_in_place):
    """(forward's output or Raised, backward's return or Raised or None)."""
    ctx = Context()
    values = [args[k] for k in ARGS]
    with torch.no_grad():
        out = attempt(MSDAFunction.forward, ctx, *values, *extra)
        if isinstance(out, Raised):
            return out, None
        if change_in_place:
            values[0].mul_(2)
        # a tensor changed in place since forward: backward should raise (a RuntimeError)
        return out, attempt_expecting((RuntimeError,) if change_in_place else (),
                                      MSDAFunction.backward, ctx, grad_output)


def _gradients(returned, n_inputs, where):
    """The three gradients from what backward returned, checked as autograd checks them."""
    if isinstance(returned, Raised):
        text = str(returned.exc)
        if "values to unpack" in text or "has no attribute" in text:
            hint = ("backward only gets what forward kept: save all five tensors the backward "
                    "launcher needs (value, value_spatial_shapes, value_level_start_index, "
                    "sampling_locations, attention_weights) with ctx.save_for_backward(...) and "
                    "read them back from ctx.saved_tensors")
        else:
            hint = ("backward(ctx, grad_output) reads ctx.saved_tensors and calls "
                    "msda_backward(grad_output, value, ...)")
        raise AssertionError(f"{where}: backward raised {returned}\nHint: {hint}")
    if not isinstance(returned, (tuple, list)):
        raise AssertionError(f"{where}: backward returned a {type(returned).__name__}; it "
                             f"returns a tuple with one gradient per input of forward")
    returned = tuple(returned)
    extra = returned[n_inputs:]
    if len(returned) < n_inputs or any(g is not None for g in extra):
        raise AssertionError(
            f"{where}: backward returned {len(returned)} values for {n_inputs} inputs of "
            f"forward\nHint: one gradient per argument of forward, in order: grad_value, None, "
            "None, grad_sampling_locations, grad_attention_weights, None (im2col_step), None "
            "(fp32_grad_accum); autograd drops a trailing None when apply got only mmcv's six")
    for position in (1, 2, 5, 6):
        if position < n_inputs and returned[position] is not None:
            raise AssertionError(
                f"{where}: backward returned a gradient in position {position} "
                f"({(['value'] + list(ARGS[1:]) + ['im2col_step', 'fp32_grad_accum'])[position]})"
                f", which is not differentiable\nHint: None for the shapes, the start index, "
                "im2col_step and fp32_grad_accum")
    return returned[0], returned[3], returned[4]


def _judge_function(case, out, returned, seed):
    what, args, extra, grad_output, change_in_place = case
    where = f"MSDAFunction, {what} (seed {seed})"
    dtype = args["value"].dtype
    if isinstance(out, Raised):
        raise AssertionError(f"{where}: forward raised {out}\nHint: forward(ctx, value, "
                             "value_spatial_shapes, value_level_start_index, "
                             "sampling_locations, attention_weights, im2col_step=64, "
                             "fp32_grad_accum=None)")
    if change_in_place:
        if isinstance(returned, Raised) and "modified by an inplace operation" in \
                str(returned.exc):
            return
        raise AssertionError(
            f"{where}: backward ran without noticing that value changed after forward (it "
            f"returned {'an error: ' + str(returned) if isinstance(returned, Raised) else 'gradients'})"
            "\nHint: keep the tensors backward needs with ctx.save_for_backward(...), not as "
            "attributes of ctx: autograd then records each tensor's version and refuses a "
            "tensor changed in place, instead of computing gradients from the wrong numbers; "
            "it also frees them after backward (attributes of ctx keep them alive)")
    contiguity = ("forward hands the kernels contiguous tensors: call .contiguous() on value, "
                  "sampling_locations and attention_weights first"
                  if not args["sampling_locations"].is_contiguous() else None)
    _assert_output(out, args, f"{where}: forward", hint=contiguity)
    grads = _gradients(returned, 5 + len(extra), where)
    expected_grads = op.gradients_fp64(args, grad_output)
    axes = (op.VALUE_AXES, op.LOC_AXES, op.PARAM_AXES)
    shapes = [tuple(e.shape) for e in expected_grads]
    for name, got, want, ax in zip(GRAD_NAMES, grads, expected_grads, axes):
        if got is None:
            raise AssertionError(f"{where}: {name} is None\nHint: backward returns one gradient "
                                 "per input of forward, in order: grad_value, None, None, "
                                 "grad_sampling_locations, grad_attention_weights, None, None")
        if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(want.shape) and \
                tuple(got.shape) in shapes:
            raise AssertionError(
                f"{where}: {name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}\n"
                "Hint: the gradients go in the order of forward's arguments: grad_value first, "
                "grad_sampling_locations in position 3, grad_attention_weights in position 4")
        op.assert_scaled(got, want, dtype, f"{where}: {name}", ax, table=op.GRAD_TOLERANCE,
                         hint=contiguity)


def check_autograd(MSDAFunction, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _function_cases(gen)
    runs = []
    with forbid_references(MSDAFunction.forward, MSDAFunction.backward, allow=KERNEL_MODULES,
                           share_inputs=True):
        for _, args, extra, grad_output, change in cases:
            runs.append(_run_function(MSDAFunction, args, extra, grad_output, change))
    if not judging():
        return
    for case, (out, returned) in zip(cases, runs):
        _judge_function(case, out, returned, seed)
    show(f"MSDAFunction: {len(cases)} cases (seed {seed}): mmcv's six arguments and seven, "
         "non-contiguous inputs, forward and three gradients right; an input changed in place "
         "after forward is refused (that forward validates is checked with the operator)")


# ------------------------------------------------------------------ the operator
def check_operator(msda_operator, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    base = op.inputs(gen, 3, 4, 2, 4, [[3, 4], [1, 2]], 2, outside=0.1)
    strided = dict(base, value=base["value"].transpose(2, 3).contiguous().transpose(2, 3),
                   attention_weights=torch.stack([base["attention_weights"]] * 2, -1)[..., 1])
    half = {k: v.half() if v.is_floating_point() else v for k, v in base.items()}
    leaves = {k: v.detach().clone().requires_grad_(k in ("value", "sampling_locations",
                                                         "attention_weights"))
              for k, v in base.items()}
    empty = {k: v for k, v in _valid(gen, batch=0).items() if k in ARGS}
    no_query = {k: v for k, v in _valid(gen, queries=0).items() if k in ARGS}
    calls = [("keyword arguments with mmcv's names, batch 3 with im2col_step 2", base,
              dict(im2col_step=2)),
             ("non-contiguous value and attention_weights", strided, {}),
             ("fp16 inputs with fp32_grad_accum=True", half, dict(fp32_grad_accum=True)),
             ("inputs that require gradients", leaves, {}),
             ("an empty batch", empty, {}), ("zero queries", no_query, {})]
    with forbid_references(msda_operator, allow=KERNEL_MODULES):
        results = [attempt(msda_operator, **args, **extra) for _, args, extra in calls]
    if not judging():
        return
    for (description, args, extra), got in zip(calls, results):
        where = f"msda_operator with {description} (seed {seed})"
        if isinstance(got, Raised):
            raise AssertionError(f"{where}: raised {got}\nHint: msda_operator(value, "
                                 "value_spatial_shapes, value_level_start_index, "
                                 "sampling_locations, attention_weights, im2col_step=64, "
                                 "fp32_grad_accum=None) passes them all, in that order, to "
                                 "MSDAFunction.apply")
        _assert_output(got, args, where,
                       hint="go through MSDAFunction.apply with every argument: its forward "
                            "validates, makes the tensors contiguous and runs the kernel")
        if args is leaves and not got.requires_grad:
            raise AssertionError(f"{where}: the output carries no gradient\nHint: go through "
                                 "MSDAFunction.apply, not the forward launcher: autograd only "
                                 "knows how to differentiate what goes through the Function")
    show(f"msda_operator: {len(calls)} calls (seed {seed}): keywords, im2col_step 2 with a batch "
         "of 3, non-contiguous inputs, fp16 with the fp32 switch, a differentiable output, an "
         "empty batch and zero queries")


OPERATOR_CASES = ("value integer", "S not sum of H*W", "locations batch", "mixed dtypes",
                  "im2col_step 0")


def check_operator_validates(msda_operator, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    bad = list(_bad_cases(gen, OPERATOR_CASES))
    again = _valid(gen)
    with forbid_references(msda_operator, allow=KERNEL_MODULES):
        with _kernels_refuse():
            results = [_attempt_none(msda_operator, args) for _, _, args, _ in bad]
        first = attempt(_call, msda_operator, again)
        valid = dict(again, value_spatial_shapes=again["value_spatial_shapes"].clone())
        again["value_spatial_shapes"][1, 0] = 3      # now sum(H*W) no longer matches S
        with _kernels_refuse():
            second = _attempt_none(msda_operator, again)
    if not judging():
        return
    for (name, culprit, args, words), got in zip(bad, results):
        _judge_bad(name, culprit, args, words, got,
                   f"msda_operator with bad input {name!r} (seed {seed})")
    if isinstance(first, Raised):
        raise AssertionError(f"msda_operator with valid inputs (seed {seed}): raised {first}")
    _assert_output(first, valid, f"msda_operator with valid inputs (seed {seed})")
    where = (f"msda_operator after value_spatial_shapes was changed in place so that sum(H*W) "
             f"no longer matches S (seed {seed})")
    _judge_bad("shapes changed in place", "value", again, "sum(H*W)", second, where,
               launched="validate on every call: the contents of the shapes can change "
                        "between calls")
    show(f"msda_operator: validates its arguments before any kernel runs ({len(bad)} bad inputs, "
         f"and shapes changed in place between two calls; seed {seed})")
