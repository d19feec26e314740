"""What every hidden check shares.

``forbid_references()`` makes sure a graded function does its own work: while the context is
open, every builtin chip (``source_kernels.chips.*``) and every reference or kernel entry
point of ``source_kernels`` (everything but the input makers in ``source_kernels.inputs``,
the comparison helpers in ``source_kernels.testing`` and the Triton shims of
``source_kernels.triton_compat``, which the guard calls while a kernel runs) raises
``ReferenceCalled("graded function called the reference <name>")``.  A hidden check computes
its expected result first, outside the context, and calls the student's function inside it.

It catches the usual routes to a reference: a name imported into the notebook
(``from source_kernels.chips.lab01 import msda_naive``), a module attribute
(``reference.msda_naive``), a plain function reached any other way (its code object is
swapped for the time of the call), a Triton kernel launched with ``kernel[grid](...)`` and
the operator registered as ``torch.ops.source_kernels``.
"""
from __future__ import annotations

import contextlib
import inspect
import re
import sys
import types

import torch

from autograde import check_api

__all__ = ["requires_gpu", "ReferenceCalled", "forbid_references", "forbidden_objects", "check_close",
           "fresh_generator", "count_kernel_launches", "kernel_device", "judging", "expect",
           "show", "Raised", "attempt", "attempt_expecting"]

ALLOWED_MODULES = check_api.ALWAYS_ALLOWED       # the list the grader's static scan reads


def judging() -> bool:
    """False inside the grading kernel, where a check only runs the student's functions
    and records what they return; the grader's replay judges."""
    check_api.note_verdict_here()
    return not check_api.recording()


def expect(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` when the check judges; None inside the grading kernel."""
    return fn(*args, **kwargs) if judging() else None


class ReferenceCalled(AssertionError):
    """A graded function called a builtin chip or a reference implementation."""


def _is_forbidden_module(name: str) -> bool:
    return (name == "source_kernels" or name.startswith("source_kernels.")) \
        and not any(name == a or name.startswith(a + ".") for a in ALLOWED_MODULES)


def _is_kernel(obj) -> bool:
    """A Triton @jit object (compiled JITFunction or the interpreter's wrapper)."""
    return hasattr(obj, "fn") and hasattr(obj, "run") and callable(getattr(obj, "fn", None))


def _defined_in_forbidden(obj) -> bool:
    if _is_kernel(obj):
        module = getattr(obj.fn, "__module__", "") or ""
    else:
        module = getattr(obj, "__module__", "") or ""
    return _is_forbidden_module(module)


def forbidden_objects() -> dict:
    """{id(obj): (qualified name, obj)} for every chip and reference entry point loaded."""
    found = {}
    for mod_name, module in list(sys.modules.items()):
        if module is None or not _is_forbidden_module(mod_name):
            continue
        for attr, obj in list(vars(module).items()):
            if attr.startswith("__") or isinstance(obj, types.ModuleType):
                continue
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or _is_kernel(obj)):
                continue
            if not _defined_in_forbidden(obj):
                continue            # e.g. torch or math imported into a chip module
            if inspect.isclass(obj) and not issubclass(obj, torch.autograd.Function):
                continue            # dataclasses, exceptions: data, not computations
            found.setdefault(id(obj), (f"{mod_name}.{attr}", obj))
    return found


# ---------------------------------------------------------------- which chips a lab may call
# One rule: graded code of lab N may call the chips of earlier labs that lab N's setup imports,
# the names its grading kernel holds (``autograde.labs.KERNEL_VIEW``), and whatever those chips
# call; never a chip of lab N or of a later lab, nor the course's reference
# (``source_kernels.reference``, which lab 01's chips re-export), nor any other entry point of
# the operator package.  The notebooks, the chips' docstrings and book/labs.md state the lists
# ``chips_allowed`` returns (tests/test_chip_rule.py holds them to it).
_CHIP = re.compile(r"^source_kernels\.chips\.lab(\d\d)$")
_CHECKS = re.compile(r"^autograde\.checks\.lab(\d\d)$")
REFERENCE_MODULE = "source_kernels.reference"


def checking_lab():
    """The number of the lab whose check module (``autograde.checks.labNN``) is running the
    current call, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        match = _CHECKS.match(frame.f_globals.get("__name__", "") or "")
        if match:
            return int(match.group(1))
        frame = frame.f_back
    return None


def _view_chips(lab: int) -> dict:
    """{chip module: "*" | names} of earlier labs in lab ``lab``'s kernel view; in the grading
    kernel (where ``autograde.labs`` is not in the view) the chip modules it holds, which are
    that view by construction."""
    try:
        from autograde.check_api import kernel_view_table
        KERNEL_VIEW = kernel_view_table()
    except ImportError:
        return {name: "*" for name in sys.modules
                if _CHIP.match(name) and int(_CHIP.match(name).group(1)) < lab}
    chips = {}
    for module, names in KERNEL_VIEW.get(lab, {}).items():
        match = _CHIP.match(module)
        if match and int(match.group(1)) < lab:
            chips[module] = names
    return chips


def _chip_names(module: str, names) -> list:
    if names != "*":
        return list(names)
    loaded = sys.modules.get(module)
    if loaded is None:
        import importlib
        loaded = importlib.import_module(module)
    return list(getattr(loaded, "__all__", [n for n in vars(loaded) if not n.startswith("_")]))


def _course_modules() -> list:
    """(name, module) of every loaded module of ``source_kernels`` outside ALLOWED_MODULES."""
    return [(n, m) for n, m in list(sys.modules.items())
            if m is not None and _is_forbidden_module(n)]


def _depends(obj, seen=None, modules=None) -> list:
    """The functions, kernels and classes of ``source_kernels`` that ``obj`` reaches
    (transitively) through the names its code uses, its default arguments, its closure and the
    attributes of course modules it names: what a chip needs to run.  ``modules``: the
    loaded course modules (``_course_modules()``, listed once for the whole walk)."""
    seen = {} if seen is None else seen
    modules = _course_modules() if modules is None else modules
    if id(obj) in seen:
        return list(seen.values())
    seen[id(obj)] = obj
    functions = []
    if _is_kernel(obj):
        obj = obj.fn
    if inspect.isfunction(obj):
        functions.append(obj)
    elif inspect.isclass(obj):
        for member in vars(obj).values():
            member = getattr(member, "__func__", member)
            if inspect.isfunction(member):
                functions.append(member)

    def follow(target):
        if target is not None and id(target) not in seen and \
                (inspect.isfunction(target) or inspect.isclass(target) or _is_kernel(target)) \
                and _defined_in_forbidden(target):
            _depends(target, seen, modules)

    for fn in functions:
        for value in list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values()):
            follow(value)
        for cell in fn.__closure__ or ():
            try:
                follow(cell.cell_contents)
            except ValueError:                      # an empty cell
                pass
        scope = fn.__globals__
        stack, names = [fn.__code__], set()
        while stack:
            current = stack.pop()
            stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
            names.update(current.co_names)
        named = [v for v in scope.values() if isinstance(v, types.ModuleType)
                 and _is_forbidden_module(v.__name__)]
        named += [m for n, m in modules                           # imported inside the code
                  if n in names or n.rsplit(".", 1)[-1] in names]
        for name in names:
            follow(scope.get(name))
            for module in named:                    # module.attribute
                follow(getattr(module, name, None))
    return list(seen.values())


def _module_of(obj) -> str:
    return getattr(obj.fn if _is_kernel(obj) else obj, "__module__", "") or ""


def chips_allowed(lab) -> list:
    """The chips graded code of lab ``lab`` may call, as dotted names
    (``source_kernels.chips.lab04.bilinear_sample_triton``), in lab order; a chip that is the
    course's reference or calls it is not among them.  None for no lab: every chip is
    forbidden."""
    if lab is None:
        return []
    import importlib

    view, loaded = sorted(_view_chips(lab).items()), {}
    for module, _ in view:
        try:
            loaded[module] = sys.modules.get(module) or importlib.import_module(module)
        except ImportError:
            continue
    allowed, modules = [], _course_modules()            # the chip modules imported above too
    for module, names in view:
        for name in _chip_names(module, names) if module in loaded else ():
            obj = getattr(loaded[module], name, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or _is_kernel(obj)):
                continue
            if any(_module_of(dep) == REFERENCE_MODULE for dep in _depends(obj, modules=modules)):
                continue
            allowed.append(f"{module}.{name}")
    return allowed


def chips_allowed_text(lab, allowed=None) -> str:
    """``chips_allowed(lab)`` in words, a whole chip module said once: "`source_kernels.chips.
    lab05` (all of it), `source_kernels.chips.lab03.gather_traffic`"; "none" when empty.
    ``allowed``: that list, where the caller has it already."""
    allowed = chips_allowed(lab) if allowed is None else allowed
    if not allowed:
        return "none"
    parts = []
    for module, names in sorted(_view_chips(lab).items()):
        mine = [a for a in allowed if a.rsplit(".", 1)[0] == module]
        if not mine:
            continue
        if names == "*" and len(mine) == len(_chip_names(module, names)):
            parts.append(f"`{module}` (all of it)")
        else:
            parts.extend(f"`{a}`" for a in mine)
    return ", ".join(parts)


def chip_rule(lab, allowed=None) -> str:
    """The rule in words, for lab ``lab``: what a check says when a graded function breaks it
    (``allowed``: ``chips_allowed(lab)``, where the caller has it already)."""
    if lab is None:
        return "a graded function may call no chip and never the course's reference"
    allowed = chips_allowed_text(lab, allowed)
    if allowed == "none":
        return f"in lab {lab:02d} a graded function may call no chip and never the course's reference"
    return (f"in lab {lab:02d} a graded function may call only these chips of earlier labs, and "
            f"never the course's reference: {allowed}")


def _allowed_chip_ids(allowed) -> set:
    """ids of the objects ``allowed`` (``chips_allowed(lab)``) names and of everything they
    call."""
    ids, modules = set(), _course_modules()
    for dotted in allowed:
        module, name = dotted.rsplit(".", 1)
        obj = getattr(sys.modules.get(module), name, None)
        if obj is not None:
            ids.update(id(dep) for dep in _depends(obj, modules=modules))
    return ids


def _raiser(name: str, rule: str | None = None):
    message = _message(name, rule)

    def raise_reference_called(*args, **kwargs):
        raise ReferenceCalled(message)

    raise_reference_called.__name__ = name.rsplit(".", 1)[-1]
    return raise_reference_called


def _message(name: str, rule: str | None) -> str:
    what = "the chip" if _CHIP.match(name.rsplit(".", 1)[0]) else "the reference"
    message = f"graded function called {what} {name}: write this stage yourself"
    return f"{message} ({rule})" if rule else message


def _code_raiser(name: str, rule: str | None = None) -> types.CodeType:
    """A code object with no free variables and no globals, which raises AssertionError
    (a builtin, so it resolves from whichever module's globals the function carries)."""
    message = _message(name, rule)
    namespace = {}
    exec(f"def _f(*args, **kwargs):\n    raise AssertionError({message!r})\n", namespace)  # noqa: S102  (our own text)
    return namespace["_f"].__code__


@contextlib.contextmanager
def forbid_references(*student_functions, allow=(), writes=(), share_inputs=False):
    """Make every chip and reference entry point raise while the block runs.

    ``student_functions``: the graded functions (their ``__globals__``, the notebook's
    namespace, get the same treatment as ``__main__``).

    ``allow``: module names (``"source_kernels.forward"``) whose functions and kernels stay
    usable, wherever they are reached from (a chip that re-exports them included): for a lab
    whose graded function builds on an earlier lab's chip, as lab 10's wrapper calls the
    forward and backward kernels.

    While autograding, the calls of ``student_functions`` made in the block are also recorded
    and the grader replays the whole check outside the kernel (``autograde.trust.recording``): so
    pass every student function the block calls, and call them only inside the block.

    ``writes``: the positions (or keyword names) of the arguments that are outputs, the
    buffers a Triton kernel stores into.  Every other tensor argument is an input: a Python
    function gets a private copy of it (``share_inputs=True``: the check's own tensor, for a
    check that changes it between two calls on purpose), and a call that writes into an
    input fails, naming it (``check_api.InputChanged``)."""
    lab = checking_lab()
    chips = tuple(chips_allowed(lab))     # the lab's chips: the grader's scan too
    with check_api.session(student_functions, allow=tuple(allow) + chips, writes=writes,
                           share_inputs=share_inputs) as replaying:
        if replaying:
            yield
        else:
            with _forbid_in_kernel(*student_functions, allow=allow, lab=lab, chips=chips):
                yield


def _allowed(obj, allow) -> bool:
    module = getattr(obj.fn if _is_kernel(obj) else obj, "__module__", "") or ""
    return any(module == a or module.startswith(a + ".") for a in allow)


@contextlib.contextmanager
def _forbid_in_kernel(*student_functions, allow=(), lab=None, chips=()):
    """Every chip and reference entry point raises while the block runs, but those of the
    modules ``allow`` names and the chips of lab ``lab`` that ``chips`` (its
    ``chips_allowed``) lists, with everything they call."""
    rule = chip_rule(lab, list(chips)) if lab is not None else None
    chips = _allowed_chip_ids(chips) if lab is not None else set()
    objects = {key: (name, obj) for key, (name, obj) in forbidden_objects().items()
               if not _allowed(obj, allow) and key not in chips}
    undo = []

    def patch(target, attr, replacement, setter=setattr):
        old = getattr(target, attr) if not isinstance(target, dict) else target[attr]
        if isinstance(target, dict):
            target[attr] = replacement
            undo.append(lambda: target.__setitem__(attr, old))
        else:
            setter(target, attr, replacement)
            undo.append(lambda: setattr(target, attr, old))

    try:
        raisers = {key: _raiser(name, rule) for key, (name, _) in objects.items()}
        # 1. module attributes of source_kernels and its chips
        for mod_name, module in list(sys.modules.items()):
            if module is None or not _is_forbidden_module(mod_name):
                continue
            for attr, obj in list(vars(module).items()):
                if id(obj) in objects and objects[id(obj)][1] is obj and not inspect.isclass(obj):
                    patch(module.__dict__, attr, raisers[id(obj)])
        # 2. names bound in the notebook (and in each graded function's module)
        namespaces = []
        main = sys.modules.get("__main__")
        if main is not None:
            namespaces.append(vars(main))
        for fn in student_functions:
            target = getattr(fn, "fn", fn)      # a Triton kernel wraps a Python function
            g = getattr(target, "__globals__", None)
            if g is not None and all(g is not n for n in namespaces):
                namespaces.append(g)
        for namespace in namespaces:
            for attr, obj in list(namespace.items()):
                if id(obj) in objects and objects[id(obj)][1] is obj and not inspect.isclass(obj):
                    patch(namespace, attr, raisers[id(obj)])
        # 3. the objects themselves, however they are reached (classes keep their names:
        #    an autograd Function's ``apply`` raises, a module's methods call patched code)
        for name, obj in objects.values():
            if inspect.isfunction(obj) and not obj.__code__.co_freevars:
                old_code = obj.__code__
                obj.__code__ = _code_raiser(name, rule)
                undo.append(lambda obj=obj, code=old_code: setattr(obj, "__code__", code))
            elif _is_kernel(obj):
                obj.run = raisers[id(obj)]      # kernel[grid](...) calls self.run
                undo.append(lambda obj=obj: obj.__dict__.pop("run", None))
            elif inspect.isclass(obj):
                own = obj.__dict__.get("apply")
                obj.apply = staticmethod(raisers[id(obj)])
                undo.append(lambda obj=obj, own=own: setattr(obj, "apply", own)
                            if own is not None else delattr(obj, "apply"))
        # 4. the registered operator
        namespace = getattr(torch.ops, "source_kernels", None) if _ops_loaded() else None
        if namespace is not None:
            for attr in list(vars(namespace)):
                if not attr.startswith("_") and attr not in ("name",):
                    try:
                        patch(namespace, attr, _raiser(f"torch.ops.source_kernels.{attr}"))
                    except (AttributeError, TypeError):
                        pass
        yield
    finally:
        for restore in reversed(undo):
            restore()


def _ops_loaded() -> bool:
    """True once the operator module registered torch.ops.source_kernels (never trigger a
    load of an unknown namespace, which raises)."""
    return any(name.startswith("source_kernels.op") for name in sys.modules)


def kernel_device() -> str:
    """Where Triton kernels run: "cpu" under the interpreter (TRITON_INTERPRET=1, set by
    ``import source_kernels`` when no GPU is visible), else "cuda"."""
    import os

    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return "cpu"
    return "cuda"


def show(message: str) -> None:
    """Print what a visible check verified, in the student's notebook (not in the grading
    kernel, and not in the grader while it replays)."""
    if not (check_api.recording() or check_api.replaying()):
        print(message)


class Raised:
    """What a student's call raised, kept so that a check can run every case before it
    judges (the same calls in the grading kernel and in the grader's replay)."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def __str__(self):
        return f"{type(self.exc).__name__}: {self.exc}"


def attempt(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or :class:`Raised` when it raises anything but an
    AssertionError (a reference called, a check's own failure: those stop the check).

    In the grading kernel the exception goes on up: the cell fails there, and the grader
    replays only cells that passed in the kernel, so record and replay never disagree on which
    calls were made."""
    return attempt_expecting((), fn, *args, **kwargs)


def attempt_expecting(errors, fn, *args, **kwargs):
    """:func:`attempt` for a call that should raise one of ``errors`` on some inputs (a
    validation, a tuner with nothing to choose): in the grading kernel too, such an exception
    is kept for the grader to judge."""
    try:
        return fn(*args, **kwargs)
    except AssertionError:
        raise
    except Exception as exc:
        if check_api.recording() and (not isinstance(exc, errors)
                                      or isinstance(exc, NotImplementedError)):
            raise                                 # (an unwritten stage fails in the kernel)
        return Raised(exc)


def fresh_generator(seed=None) -> torch.Generator:
    """A generator seeded from the wall clock unless ``seed`` is given: hidden checks draw
    inputs the student never saw."""
    import time

    if seed is None:
        seed = check_api.next_seed()        # while autograding: the grader's seed, else None
    if seed is None:
        seed = time.time_ns() % (2 ** 31)
    return torch.Generator().manual_seed(int(seed))


def check_close(got, expected, *, atol=1e-5, rtol=1e-5, axes=None, what="result", hint=None):
    """``assert_close_explained`` plus a type check, for hidden checks."""
    from source_kernels.testing import assert_close_explained

    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    assert_close_explained(got, expected, atol=atol, rtol=rtol, axes=axes, what=what, hint=hint)


class _LaunchCounter:
    def __init__(self):
        self.count = 0
        self.kernels = []


@contextlib.contextmanager
def count_kernel_launches():
    """Count Triton kernel launches (``kernel[grid](...)``) while the block runs, compiled or
    interpreted.  Yields an object whose ``count`` and ``kernels`` (names) grow."""
    if check_api.replaying():              # the grader counts what the kernel recorded
        with check_api.replay_launches(_LaunchCounter()) as counter:
            yield counter
        return
    counter = _LaunchCounter()

    def seen(name):
        counter.count += 1
        counter.kernels.append(name)

    undo = check_api.watch_kernel_launches(seen)
    try:
        yield counter
    finally:
        undo()


def requires_gpu(check):
    """Mark a hidden check as GPU-only: without a CUDA GPU it prints a note and returns; the
    grader reports its cell "not gradable here" on a CPU host instead of scoring it."""
    import functools

    @functools.wraps(check)
    def gpu_only(*args, **kwargs):
        if not torch.cuda.is_available():
            print(f"{check.__name__}: needs a CUDA GPU, not checked on this machine")
            return None
        return check(*args, **kwargs)

    gpu_only.requires_gpu = True
    return gpu_only
