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
  the out-of-bounds guard of the checks wraps (``autograde/checks/guard.py``).

The engine has its own module for its two uses (``autograde/compat/triton_compat.py``): the
engine does not import the operator.
"""
from __future__ import annotations

import os

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

__all__ = ["ASTSource", "GPUTarget", "JITFunction", "active_driver", "cuobjdump_path",
           "grid_executor_arguments", "interpreter", "launcher_parts", "np_dtype",
           "runtime_knobs"]

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
