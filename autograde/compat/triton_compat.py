"""Triton internals the engine uses, written against triton 3.6.0 and 3.7.1.

The engine (not the operator, which has ``source_kernels/triton_compat.py`` for its own
uses: the engine may not import the operator) needs two things of Triton that it does not
document:

- the classes whose ``run`` method every launch goes through (``JITFunction`` for a
  compiled kernel, ``InterpretedFunction`` under ``TRITON_INTERPRET=1``), which the launch
  counter of :mod:`autograde.trust.recording` wraps;
- the folders in which the NVIDIA backend finds ``libcuda.so.1`` (``libcuda_dirs``), which
  the sandbox mounts for a kernel on a GPU host.
"""
from __future__ import annotations

__all__ = ["launch_classes", "libcuda_dirs"]


def launch_classes() -> list:
    """The classes whose ``run(self, *args, warmup=..., **kwargs)`` starts a launch; those
    this Triton lacks are left out."""
    classes = []
    try:
        from triton.runtime.jit import JITFunction
        classes.append(JITFunction)
    except Exception:                              # noqa: BLE001  (no Triton, or moved)
        pass
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except Exception:                              # noqa: BLE001  (no Triton, or moved)
        pass
    return classes


def libcuda_dirs() -> list:
    """The NVIDIA backend's folders of libcuda.so.1 (raises where there is no CUDA driver)."""
    from triton.backends.nvidia.driver import libcuda_dirs as find
    return find()
