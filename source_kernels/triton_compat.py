"""The Triton internals of the operator and of the course's checks, in one place; written
against triton 3.6.0 and 3.7.1 (requirements.txt pins 3.7.1).

Nothing else in ``source_kernels`` or ``autograde/checks`` reaches below Triton's documented
surface (``triton.jit``, ``triton.language``, ``triton.cdiv``, ``triton.testing``...).  What
is reached, and by whom:

- ``JITFunction`` (``triton.runtime.jit``): the class of a ``@triton.jit`` kernel, whose
  ``run`` every compiled launch goes through (``launch``, ``ptx``);
- the compiled kernel's launcher: ``compiled.run(gx, gy, gz, stream, function,
  packed_metadata, launch_metadata, enter_hook, exit_hook, *args)`` (``launch``);
- the active driver's current device and stream (``launch``) and the runtime knobs that hold
  the launch hooks (``launch``);
- ``ASTSource`` and ``GPUTarget``, to compile a kernel for a chip this host lacks, and the
  ``cuobjdump`` Triton ships (``ptx``);
- the interpreter's builder, its ``TensorHandle``, its dtype table ``_get_np_dtype`` and the
  private ``GridExecutor._init_args_hst`` (the host copies of a launch's arguments), which
  the out-of-bounds guard of the checks wraps (``autograde/checks/guard.py``);
- three shortcuts of the interpreter, installed by ``import source_kernels`` in interpreter
  mode (``interpreter_shortcuts``), each of them work whose result nothing reads: the repeats
  of ``_patch_lang`` (``patch_language_once_per_launch``), the integer overflow checks whose
  assertion the interpreter drops (``skip_unread_overflow_checks``), and the dtype table
  ``_get_np_dtype`` builds afresh on every call (``remember_np_dtypes``).

The engine has its own module for its two uses (``autograde/compat/triton_compat.py``): the
engine does not import the operator.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

__all__ = ["ASTSource", "GPUTarget", "JITFunction", "active_driver", "cuobjdump_path",
           "grid_executor_arguments", "interpreter", "interpreter_as_shipped", "interpreter_shortcuts",
           "launcher_parts",
           "np_dtype", "patch_language_once_per_launch", "remember_np_dtypes", "runtime_knobs",
           "skip_unread_overflow_checks"]

# the three launcher arguments between the metadata and the kernel's own: launch metadata
# and the enter and exit hooks, all None for a launch nothing watches
NO_LAUNCH_HOOKS = (None, None, None)


def runtime_knobs():
    """``triton.knobs.runtime`` (launch_enter_hook, launch_exit_hook), None before 3.4."""
    knobs = getattr(triton, "knobs", None)
    return knobs.runtime if knobs is not None else None


def active_driver():
    """The driver of this host's backend (``get_current_device``, ``get_current_stream``)."""
    return triton.runtime.driver.active


def launcher_parts(compiled):
    """(launcher, function handle, packed metadata) of a compiled kernel: a launch is
    ``launcher(gx, gy, gz, stream, function, metadata, *NO_LAUNCH_HOOKS, *args)``."""
    return compiled.run, compiled.function, compiled.packed_metadata


def cuobjdump_path() -> str:
    """The cuobjdump of Triton's NVIDIA backend."""
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")


def interpreter():
    """Triton's interpreter module (``interpreter_builder``, ``TensorHandle``,
    ``GridExecutor``)."""
    from triton.runtime import interpreter as interp
    return interp


def np_dtype(triton_type):
    """The numpy dtype the interpreter stores a Triton element type as."""
    return interpreter()._get_np_dtype(triton_type)


def grid_executor_arguments():
    """(class, attribute name) of the interpreter's method that copies a launch's arguments
    to the host: ``method(executor, args_dev, kwargs) -> (args_hst, kwargs_hst)``; the
    executor has ``arg_names`` and ``fn``."""
    return interpreter().GridExecutor, "_init_args_hst"


# ------------------------------------------------------------ the interpreter's language patch
# Under TRITON_INTERPRET=1 a launch (``GridExecutor.__call__``) swaps the builtins of
# ``triton.language`` that the kernel's module holds for interpreted ones, and puts them back
# when the launch ends.  Every call of a @triton.jit helper inside the kernel
# (``InterpretedFunction.__call__``: the course's own helpers, and ``tl.zeros``, ``tl.cdiv``,
# ``tl.sum``... of Triton's standard library) swaps them again for the helper's module, by
# listing every member of ``triton.language`` (``inspect.getmembers``), and never puts those
# back: a helper called once per program and per loop step repeats that listing thousands of
# times per launch (without this shortcut, the operator's forward and backward in the interpreter
# take half as long again: results/interpreter_shortcuts_cpu.txt).
# Within one launch, the second call of a helper finds everything its first call swapped still
# swapped (nothing is put back before the launch ends), so the repeat changes nothing and is
# skipped; the first call of each helper in each launch still swaps, exactly as before.  A
# helper called outside a launch is left to Triton.
_LAUNCH_PATCHED = {"helpers": None}    # the helpers already swapped for in this launch


class _NothingPatched:
    def restore(self) -> None:
        pass


def patch_language_once_per_launch() -> bool:
    """Make the interpreter swap ``triton.language`` for each @triton.jit helper once per
    launch instead of once per call (see above); True where done, False where this Triton's
    interpreter lacks what this relies on (``_patch_lang`` called by both
    ``GridExecutor.__call__`` and ``InterpretedFunction.__call__``, as in 3.6.0 and 3.7.1),
    which then runs as it is.  Idempotent."""
    interp = interpreter()
    patch = getattr(interp, "_patch_lang", None)
    executor = getattr(interp, "GridExecutor", None)
    helper = getattr(interp, "InterpretedFunction", None)
    if patch is None or executor is None or helper is None:
        return False
    if getattr(patch, "_once_per_launch", False):
        return True
    names = helper.__call__.__code__.co_names
    if "_patch_lang" not in names or "_patch_lang" not in executor.__call__.__code__.co_names:
        return False
    launch_code = executor.__call__.__code__

    def once_per_launch(fn):
        if sys._getframe(1).f_code is launch_code:        # a launch begins
            scope = patch(fn)
            _LAUNCH_PATCHED["helpers"] = set()
            restore = scope.restore

            def restore_and_end():
                _LAUNCH_PATCHED["helpers"] = None
                restore()
            scope.restore = restore_and_end
            return scope
        done = _LAUNCH_PATCHED["helpers"]
        if done is None:                                   # outside a launch: as Triton does
            return patch(fn)
        if fn in done:
            return _NothingPatched()
        done.add(fn)
        return patch(fn)

    once_per_launch._once_per_launch = True
    once_per_launch.__wrapped__ = patch
    interp._patch_lang = once_per_launch
    return True


# ------------------------------------------------------------- the interpreter's overflow checks
# Each add, sub and mul of integers narrower than 64 bits (``binary_op_sanitize_overflow_impl``,
# on while the builder's ``options.sanitize_overflow`` is) recomputes its result in int64,
# compares it with the type's bounds and hands the comparison to ``device_assert``.  The
# interpreter's builder holds ``InterpreterOptions()``, whose ``debug`` is False and which no
# launch changes (TRITON_DEBUG included), and ``device_assert`` returns at once without
# ``options.debug``: the comparison is computed and never read, and an overflow wraps silently
# either way (tests/test_interpreter_patch.py shows both).  With those five extra operations
# per integer operation, the operator's forward and backward in the interpreter take about twice
# as long (results/interpreter_shortcuts_cpu.txt).
def skip_unread_overflow_checks() -> bool:
    """Switch the interpreter's overflow checks off where their assertion is dropped anyway
    (``debug`` False, and ``device_assert`` reads ``options.debug``); True where done.
    Idempotent."""
    builder = getattr(interpreter(), "interpreter_builder", None)
    options = getattr(builder, "options", None)
    try:
        from triton.language.semantic import TritonSemantic
    except ImportError:                    # before 3.4: semantic was a module of functions
        return False
    if not (dataclasses.is_dataclass(options) and hasattr(options, "sanitize_overflow")):
        return False
    if getattr(options, "debug", True) or \
            "debug" not in TritonSemantic.device_assert.__code__.co_names:
        return False
    if options.sanitize_overflow:
        _SHIPPED_OPTIONS["options"] = options
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


_SHIPPED_OPTIONS: dict = {}            # the builder's options before the shortcut replaced them


# ------------------------------------------------------------------- the interpreter's dtype table
# ``_get_np_dtype(triton_type)`` (the numpy dtype a value of that Triton type is stored as)
# builds its table of 19 dtypes on every call, a few times per interpreted operation.  The
# answer depends only on the type's class and name (a block type's name holds its element
# type, a pointer type's its pointee), so it is remembered under those (about 8% of the
# operator's forward and backward in the interpreter: results/interpreter_shortcuts_cpu.txt).
_NP_DTYPES: dict = {}


def remember_np_dtypes() -> bool:
    """Put a memo in front of the interpreter's ``_get_np_dtype``; True where done.
    Idempotent."""
    interp = interpreter()
    table = getattr(interp, "_get_np_dtype", None)
    if table is None:
        return False
    if getattr(table, "_remembered", False):
        return True

    def remembered(triton_type):
        key = (type(triton_type), getattr(triton_type, "name", None))
        found = _NP_DTYPES.get(key) if key[1] is not None else None
        if found is None:
            found = table(triton_type)
            if key[1] is not None:
                _NP_DTYPES[key] = found
        return found

    remembered._remembered = True
    remembered.__wrapped__ = table
    interp._get_np_dtype = remembered
    return True


SHORTCUTS = (patch_language_once_per_launch, skip_unread_overflow_checks, remember_np_dtypes)


def interpreter_shortcuts() -> dict:
    """Install the three shortcuts above (``import source_kernels`` does, in interpreter
    mode); {name: whether this Triton allowed it}."""
    return {install.__name__: install() for install in SHORTCUTS}


@contextlib.contextmanager
def interpreter_as_shipped(*names: str):
    """The interpreter without the shortcuts named (all of them when none is), as Triton ships
    it, inside the ``with`` block; whatever was installed is put back afterwards.  For
    comparing results and timings (tests/test_interpreter_patch.py,
    scripts/time_interpreter.py); not inside a launch."""
    known = [install.__name__ for install in SHORTCUTS]
    unknown = set(names) - set(known)
    if unknown:
        raise ValueError(f"no interpreter shortcut named {sorted(unknown)}; there are {known}")
    names = set(names or known)
    interp = interpreter()
    builder = interp.interpreter_builder
    installed = (interp._patch_lang, interp._get_np_dtype, builder.options)
    if "patch_language_once_per_launch" in names:
        interp._patch_lang = getattr(interp._patch_lang, "__wrapped__", interp._patch_lang)
    if "remember_np_dtypes" in names:
        interp._get_np_dtype = getattr(interp._get_np_dtype, "__wrapped__",
                                       interp._get_np_dtype)
    if "skip_unread_overflow_checks" in names:
        builder.options = _SHIPPED_OPTIONS.get("options", builder.options)
    try:
        yield
    finally:
        interp._patch_lang, interp._get_np_dtype, builder.options = installed
