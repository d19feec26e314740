"""Time the course's operator in Triton's interpreter with and without its shortcuts.

The workload is one forward and one backward of the operator on inputs the size the labs'
checks use (2 batches, 10 queries, 2 heads, 4 channels, three levels, 2 points), run in the
interpreter.  It is timed (host wall-clock, ``time.perf_counter``) with every shortcut of
``source_kernels.triton_compat.interpreter_shortcuts`` installed, with none (the interpreter
as Triton ships it), and with each one taken away alone; the median of ``--repeats`` runs.
The outputs are compared bit for bit with those of the interpreter as shipped.

    python scripts/time_interpreter.py [--repeats 5]

CPU only: on a machine with a GPU the operator does not run in the interpreter.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import source_kernels  # noqa: F401  (picks the interpreter and installs the shortcuts)
import torch
import triton

from source_kernels import multi_scale_deformable_attn, triton_compat
from source_kernels.inputs import make_inputs


def forward_and_backward():
    """The operator's output and the three gradients, on the checks' size of inputs."""
    args = make_inputs(2, 10, 2, 4, [(6, 5), (3, 2), (1, 1)], 2, seed=7, outside=0.2,
                       requires_grad=True)
    out = multi_scale_deformable_attn(*args.values())
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return [out.detach()] + [t.grad for t in args.values() if t.requires_grad]


def timed(repeats):
    seconds, results = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        results = forward_and_backward()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("the operator runs in Triton's interpreter only on a machine without a GPU")
        return 2
    installed = triton_compat.interpreter_shortcuts()
    names = [name for name, done in installed.items() if done]
    forward_and_backward()                          # imports and first launches, untimed
    with triton_compat.interpreter_as_shipped():
        shipped_s, shipped = timed(options.repeats)
    rows = [("none (the interpreter as Triton ships it)", shipped_s, shipped)]
    rows.append(("all: " + ", ".join(names), *timed(options.repeats)))
    for name in names:
        with triton_compat.interpreter_as_shipped(name):
            rows.append((f"all but {name}", *timed(options.repeats)))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"median of {options.repeats} runs, host wall-clock")
    for label, seconds, results in rows:
        same = all(torch.equal(a, b) for a, b in zip(results, shipped))
        print(f"{seconds:7.3f} s  {seconds / shipped_s:5.2f} of as shipped  "
              f"{'same bits' if same else 'DIFFERENT RESULTS'}  {label}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
