"""Multi-scale deformable attention (MSDA) in Triton: the course's operator.

Importing this package picks Triton's CPU interpreter when no CUDA GPU is visible: the
variable TRITON_INTERPRET must be set before any ``@triton.jit`` runs, so this happens here,
before the kernel modules are imported.  Set TRITON_INTERPRET yourself to override.
On a machine without a GPU, import this package first in a fresh process (before ``triton``
and before defining kernels of your own), so that every kernel is defined in the same mode.
"""
import os as _os

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"
if _os.environ.get("TRITON_INTERPRET") == "1":
    # the interpreter, spared work whose result nothing reads (triton_compat says which)
    from .triton_compat import interpreter_shortcuts as _shortcuts
    _shortcuts()

from .reference import msda_grid_sample, msda_naive
from .op import (
    MultiScaleDeformableAttnFunction,
    multi_scale_deformable_attn,
)
from .validate import validate_inputs

__all__ = ["MultiScaleDeformableAttnFunction", "multi_scale_deformable_attn", "msda_naive",
           "msda_grid_sample", "validate_inputs"]
