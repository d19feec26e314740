"""Checks of lab 07 (the other direction): the three gradients written by hand in PyTorch,
against autograd through the float64 grid_sample reference.

One code path for the visible checks (a fixed ``seed``, in the notebook) and the hidden ones
(``seed=None``: the grader's seed).  A function that gets its gradients from autograd fails
whatever it returns: it is found by name before the call (``autograd``, ``.backward``,
``requires_grad``, ... in the function or a notebook function it calls), while it runs (grad
mode is off and autograd's entry points raise) and in what it returns (a ``grad_fn``).
"""
from __future__ import annotations

import contextlib
import types

import torch

from autograde import check_api

from . import _operator as op
from . import diagnose_grad
from .common import forbid_references, fresh_generator, judging
from .demo import unwritten, where

__all__ = ["check_grad_attention_weights", "check_grad_sampling_locations",
           "check_grad_value", "AutogradUsed", "guarded"]

TOL = {torch.float64: 1e-9}


class AutogradUsed(AssertionError):
    """A graded gradient function used autograd."""


def _cases(gen):
    """(description, inputs), float64 on the CPU."""
    yield ("3 levels incl. 1x1, locations up to 20% outside", op.inputs(
        gen, 2, 5, 2, 3, [[4, 5], [1, 1], [3, 2]], 2, dtype=torch.float64, outside=0.2,
        on="cpu"))
    yield ("queries sharing corners (local locations on a 3x4 map)", op.inputs(
        gen, 1, 6, 1, 4, [[3, 4]], 3, dtype=torch.float64, distribution="local",
        sigma_pixels=0.5, on="cpu"))


# ------------------------------------------------------------------ written by hand
_AUTOGRAD_NAMES = frozenset({
    "autograd", "backward", "requires_grad", "requires_grad_", "enable_grad",
    "set_grad_enabled", "_set_grad_enabled", "grad_fn", "vjp", "jvp", "jacrev", "jacfwd",
    "hessian", "make_dual", "dual_level", "forward_ad", "gradcheck", "grad_and_value",
    "linearize"})


def _used_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _used_names(const)
    return names


def _autograd_by_name(fn, seen=None):
    """(name used, function using it) for the first autograd entry point that ``fn`` or a
    function of its own module it calls names; None if there is none."""
    seen = set() if seen is None else seen
    code = getattr(fn, "__code__", None)
    if code is None or id(fn) in seen:
        return None
    seen.add(id(fn))
    names = _used_names(code)
    found = sorted(names & _AUTOGRAD_NAMES)
    if {"func", "grad"} <= names:
        found.append("torch.func.grad")
    if found:
        return found[0], getattr(fn, "__name__", "?")
    namespace = getattr(fn, "__globals__", {})
    for name in sorted(names):
        callee = namespace.get(name)
        if isinstance(callee, types.FunctionType) and \
                callee.__module__ == getattr(fn, "__module__", None):
            hit = _autograd_by_name(callee, seen)
            if hit:
                return hit
    return None


def _message(name, what):
    return (f"{name} uses autograd ({what}): in this lab the gradients are written by hand, "
            "from your derivation (autograd through the reference is what checks them). "
            "Compute them from sample_corners' quantities with ordinary tensor arithmetic.")


class _NoEngine:
    """Stands in for autograd's engine while a graded function runs."""

    def __init__(self, name):
        self.name = name

    def run_backward(self, *args, **kwargs):
        raise AutogradUsed(_message(self.name, "a backward pass"))

    def queue_callback(self, *args, **kwargs):
        raise AutogradUsed(_message(self.name, "a backward pass"))


def _entry_points():
    """(owner, attribute, what) for every autograd entry point a gradient function could use."""
    import torch.autograd.forward_ad as forward_ad
    import torch.autograd.functional as functional
    import torch.autograd.grad_mode as grad_mode
    import torch.func

    points = [(torch.autograd, "grad", "torch.autograd.grad"),
              (torch.autograd, "backward", "torch.autograd.backward"),
              (torch.Tensor, "backward", ".backward()"),
              (torch.Tensor, "requires_grad_", ".requires_grad_()"),
              (torch, "enable_grad", "torch.enable_grad"),
              (torch, "set_grad_enabled", "torch.set_grad_enabled"),
              (torch.autograd, "enable_grad", "torch.enable_grad"),
              (torch.autograd, "set_grad_enabled", "torch.set_grad_enabled"),
              (grad_mode, "enable_grad", "torch.enable_grad"),
              (grad_mode, "set_grad_enabled", "torch.set_grad_enabled"),
              (torch._C, "_set_grad_enabled", "grad mode switched on"),
              (forward_ad, "make_dual", "forward-mode autograd"),
              (forward_ad, "dual_level", "forward-mode autograd")]
    points += [(torch.func, attr, f"torch.func.{attr}") for attr in
               ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian",
                "linearize")]
    points += [(functional, attr, f"torch.autograd.functional.{attr}") for attr in
               ("vjp", "jvp", "jacobian", "hessian", "vhp", "hvp")]
    return [(owner, attr, what) for owner, attr, what in points if hasattr(owner, attr)]


@contextlib.contextmanager
def _by_hand(name, student):
    """While the block runs: grad mode off, autograd's entry points (and the names of the
    student's module bound to them) raise AutogradUsed, setting requires_grad raises."""
    from torch.autograd.variable import Variable

    undo = []

    def raiser(what):
        def autograd_used(*args, **kwargs):
            raise AutogradUsed(_message(name, what))
        return autograd_used

    with torch.no_grad():
        try:
            originals = {}
            for owner, attr, what in _entry_points():
                old = getattr(owner, attr)
                originals[id(old)] = what
                if attr in owner.__dict__:
                    undo.append(lambda owner=owner, attr=attr, old=old: setattr(owner, attr, old))
                else:                                   # inherited: shadow, then unshadow
                    undo.append(lambda owner=owner, attr=attr: delattr(owner, attr))
                setattr(owner, attr, raiser(what))
            namespace = getattr(student, "__globals__", None)
            if isinstance(namespace, dict):
                for key, obj in list(namespace.items()):
                    if id(obj) in originals:
                        namespace[key] = raiser(originals[id(obj)])
                        undo.append(lambda key=key, obj=obj: namespace.__setitem__(key, obj))
            base = torch._C.TensorBase.__dict__["requires_grad"]

            def set_requires_grad(tensor, flag):
                raise AutogradUsed(_message(name, "requires_grad"))
            torch.Tensor.requires_grad = property(base.__get__, set_requires_grad)
            undo.append(lambda: delattr(torch.Tensor, "requires_grad"))
            engine = Variable._execution_engine
            Variable._execution_engine = _NoEngine(name)
            undo.append(lambda: setattr(Variable, "_execution_engine", engine))
            yield
        finally:
            for restore in reversed(undo):
                restore()


def raised_in(student, name, what, exc):
    """What a check says when the student's function raised ``exc``: the exception and the
    line of the student's code it came from."""
    import linecache
    import traceback

    if isinstance(exc, NotImplementedError):
        return f"{what}: {name} is not written yet (it raises NotImplementedError)"
    filename = getattr(getattr(student, "__code__", None), "co_filename", None)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    at = ""
    if frames:
        frame = frames[-1]
        line = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        at = f" in {frame.name}, at `{line}`" if line else f" in {frame.name}"
    return (f"{what}: {name} raised {type(exc).__name__}: {exc}{at}\nHint: the check called "
            "it with the arguments its docstring gives, in its shapes and dtypes: that line is "
            "where your code stopped (print what it computes with, on these shapes)")


def _call(student, name, grad_output, args, what=None):
    """The student's gradient on copies of the inputs, written by hand or failed."""
    what = what or name
    if not isinstance(student, check_api.Proxy):    # the grader's stand-in has no code to read
        hit = _autograd_by_name(student)
        if hit:
            raise AutogradUsed(_message(name, f"`{hit[0]}` in {hit[1]}"))
    with forbid_references(student), _by_hand(name, student):
        try:
            got = student(grad_output.clone(), *(t.clone() for t in args.values()))
        except AssertionError:
            raise
        except Exception as exc:                  # noqa: BLE001  (explained, as a failure)
            raise AssertionError(raised_in(student, name, what, exc)) from None
    if isinstance(got, torch.Tensor) and (got.requires_grad or got.grad_fn is not None):
        raise AutogradUsed(_message(name, "its result carries a grad_fn"))
    return got


# ------------------------------------------------------------------ the checks
_FALLBACK = {
    "grad_attention_weights": "none of the usual mistakes (a sign, the corner weights, the "
                              "attention weight, d_x and d_y) explains it",
    "grad_sampling_locations": "none of the usual mistakes (a sign, the factors W and H, x and "
                               "y, d_x and d_y, the attention weight) explains it",
    "grad_value": "none of the usual mistakes (a sign, the attention weight, d_x and d_y, "
                  "corners off the map, assigning where you must add) explains it",
}


def _hint(name, got, expected, args, grad_output, located):
    """The diagnosis of this lab's gradients, the same for the visible and the hidden check:
    a mistake of the catalogue when it reproduces ``got``, else the first isolation probe
    that goes wrong."""
    named = diagnose_grad.explain(name, got, expected, args, grad_output, torch.float64,
                                  table=TOL, off_map="row 0")
    if named:
        return named
    where = diagnose_grad.locate(name, located, torch.float64, table=TOL, off_map="row 0")
    return (_FALLBACK[name] + ". " + (where or "Every isolation probe (one term at a time) is "
            "right: the mistake shows only when several terms meet; work out your derivation "
            "for the one sample named above by hand, and compare term by term (the gradcheck "
            "at the end of the lab compares all three with finite differences)"))


def _check(student, name, seed):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    runs = []
    for description, args in _cases(gen):
        out_shape = (args["value"].shape[0], args["sampling_locations"].shape[1],
                     args["value"].shape[2] * args["value"].shape[3])
        grad_output = torch.randn(out_shape, generator=gen, dtype=torch.float64)
        what = f"{name}, {description} (seed {seed})"
        runs.append((what, args, grad_output, _call(student, name, grad_output, args, what)))
    # the isolation probes run whatever the cases give (the same calls in the grading kernel
    # and in the grader's replay); they are judged after the cases
    located = [(label, term, args, grad_output,
                _call(student, name, grad_output, args, f"{name} with {label} (seed {seed})"))
               for label, term, args, grad_output in diagnose_grad.probes(gen)]
    if not judging():
        return
    for what, args, grad_output, got in runs:
        if isinstance(got, torch.Tensor) and got.dtype != args["value"].dtype:
            raise AssertionError(f"{what}: expected dtype {args['value'].dtype} (the inputs'), "
                                 f"got {got.dtype}")
        expected = op.gradients_fp64(args, grad_output)[diagnose_grad.GRADIENT_INDEX[name]]
        op.assert_scaled(got, expected, torch.float64, what, diagnose_grad.GRADIENT_AXES[name],
                         table=TOL, hint=lambda: _hint(name, got, expected, args, grad_output,
                                                       located))
    message = diagnose_grad.locate(name, located, torch.float64, table=TOL, off_map="row 0")
    if message:
        raise AssertionError(f"{name} (seed {seed}): right on the general cases, wrong on a "
                             f"simpler one. {message}")
    print(f"{name} matches autograd through the float64 reference in {len(runs)} cases and "
          f"{len(located)} isolation probes (seed {seed})")


# ------------------------------------------------------------------ the demonstration cell
# the gradcheck cell's inputs, in order, and the function whose gradient each one receives
GRADCHECK_INPUTS = (("value", "grad_value"), ("sampling_locations", "grad_sampling_locations"),
                    ("attention_weights", "grad_attention_weights"))


def _see_check(name):
    return (f"its visible check above (check.check_{name}) compares it with autograd and "
            "says where it goes wrong: run it, then this cell again")


def _gradcheck_failure(what, exc, inputs):
    """What the cell says when torch.autograd.gradcheck itself found a mismatch, or autograd
    refused a gradient: which function's gradient, in the lab's words."""
    import re

    text = str(exc)
    names = [name for _, name in inputs]
    mismatch = re.search(r"with respect to input (\d+)", text)
    if mismatch and int(mismatch.group(1)) < len(inputs):
        argument, name = inputs[int(mismatch.group(1))]
        return (f"{what}: the gradient {name} returns for {argument} is not the one finite "
                f"differences of the forward give (gradcheck stops at the first input that "
                f"disagrees, so the functions after it are not judged yet); {_see_check(name)}")
    shape = re.search(r"invalid gradient at index (\d+) - got \[([^\]]*)\] but expected shape "
                      r"compatible with \[([^\]]*)\]", text)
    if shape and int(shape.group(1)) < len(inputs):
        argument, name = inputs[int(shape.group(1))]
        return (f"{what}: {name} returned a tensor of shape ({shape.group(2)}), where the "
                f"gradient of {argument} has its shape ({shape.group(3)}); "
                f"{_see_check(name)}")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (f"{what}: gradcheck stopped with {type(exc).__name__}{where(exc)}: "
            f"{lines[0] if lines else ''}. It calls {', '.join(names)} as the backward of "
            "the forward: the visible check of each one, above, says which one is wrong")


@contextlib.contextmanager
def guarded(what, inputs=GRADCHECK_INPUTS):
    """The guard of the lab's demonstration cell (gradcheck of the three functions together):
    an exception raised in the student's code, or gradcheck's own failure, is reported in the
    cell's output, in the words of the checks, and the notebook goes on.  ``inputs``: (the
    gradcheck input, the function that computes its gradient), in gradcheck's order."""
    from torch.autograd.gradcheck import GradcheckError

    try:
        yield
    except KeyboardInterrupt:
        raise
    except Exception as exc:                  # noqa: BLE001  (explained, in the cell's output)
        if unwritten(exc):
            message = (f"{what}: a function it calls is not written yet: it raises "
                       f"NotImplementedError{where(exc)}. Write it first; its visible check "
                       "above says when it is right")
        elif isinstance(exc, GradcheckError) or "invalid gradient at index" in str(exc):
            message = _gradcheck_failure(what, exc, inputs)
        else:
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            message = (f"{what}: your code raised {type(exc).__name__}{where(exc)}: "
                       f"{lines[0] if lines else ''}\nThe cell stopped there. The visible check "
                       "of that function, above, calls it on its own and says what goes wrong: "
                       "run it, then this cell again")
        print(message)


def check_grad_attention_weights(grad_attention_weights, seed=None):
    _check(grad_attention_weights, "grad_attention_weights", seed)


def check_grad_sampling_locations(grad_sampling_locations, seed=None):
    _check(grad_sampling_locations, "grad_sampling_locations", seed)


def check_grad_value(grad_value, seed=None):
    _check(grad_value, "grad_value", seed)
