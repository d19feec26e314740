"""The child process of ``ptx.compile_ptx`` where Triton's interpreter is on: it compiles one
kernel with the interpreter off and prints its PTX, nothing else.

Usage (by ``compile_ptx`` only): ``python -m source_kernels.ptx_child REQUEST``, REQUEST being
the JSON list [kernel, arch, dtype name, fp32_grad_accum, channels, levels, points, block_q,
num_warps].  A module of its own so that a grading kernel's view of the package (lab 09) can
hold it beside ``compile_ptx`` without the rest of ``ptx``'s command line.
"""
from __future__ import annotations

import json
import sys

import torch

from source_kernels.ptx import compile_ptx


def main(argv=None) -> int:
    request = (sys.argv[1:] if argv is None else argv)[0]
    kernel, arch, dtype, accum, channels, levels, points, block_q, warps = json.loads(request)
    sys.stdout.write(compile_ptx(kernel, arch, getattr(torch, dtype), accum, channels=channels,
                                 levels=levels, points=points, block_q=block_q,
                                 num_warps=warps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
