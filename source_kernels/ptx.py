"""Compile the course's kernels for a GPU on a machine without one, and read their atomics.

``triton.compile`` with an ``ASTSource`` and a ``GPUTarget`` runs the whole CUDA pipeline on
the CPU (Triton ships ptxas), so the PTX that an sm_80 (Ampere) or sm_90 (Hopper) GPU would
run can be read anywhere.  The interesting lines are the atomics of the backward: a bf16
``atom...add`` on sm_90, a compare-and-swap loop (``atom...cas``) on sm_80.

Run ``python -m source_kernels.ptx`` for the table the hardware chapter uses, and
``python -m source_kernels.ptx --resources --dtype bf16 fp32 fp64`` for the registers, stack
and shared memory of every launch candidate of the sweep (what bounds their occupancy).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys

import torch
import triton
import triton.language as tl
from . import backward, forward, tiled
from .triton_compat import ASTSource, GPUTarget, JITFunction, cuobjdump_path

__all__ = ["compile_ptx", "atomic_instructions", "atomic_summary", "main", "TILED_DEFAULT",
           "compile_candidate", "resource_usage"]

# (BLOCK_Q, num_warps) at which the tiled kernels are compiled unless told otherwise.
TILED_DEFAULT = (2, 4)

_TRITON_TYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                torch.float64: "fp64"}
_ATOMIC = re.compile(r"^\s*(?:@%p\d+\s+)?((?:atom|red)\.[\w.]+)", re.MULTILINE)


def _jit(kernel):
    """The JITFunction behind a kernel, also when the interpreter wrapped it."""
    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def _acc(dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=64)
def compile_ptx(kernel: str, arch: int, dtype: torch.dtype = torch.bfloat16,
                fp32_grad_accum: bool = False, *, channels: int = 32, levels: int = 4,
                points: int = 4, block_q: int | None = None, num_warps: int | None = None,
                kernel_fn=None) -> str:
    """PTX of the forward or backward kernel for ``sm_<arch>`` (80 or 90), as launched on
    16-byte aligned tensors of ``dtype`` (grad_value in fp32 when ``fp32_grad_accum``).
    ``kernel_fn`` compiles another kernel with the same signature (a variant under study).

    In a process where Triton's interpreter is on, kernels are not compilable objects, so
    the compilation runs in a child process with the interpreter off (a few seconds more).
    """
    if _interpreting():
        if kernel_fn is not None:
            raise RuntimeError("kernel_fn cannot be compiled while TRITON_INTERPRET is on; "
                               "define the variant in a process started without it")
        request = json.dumps([kernel, arch, str(dtype).removeprefix("torch."),
                              fp32_grad_accum, channels, levels, points, block_q, num_warps])
        env = dict(os.environ, TRITON_INTERPRET="0")
        done = subprocess.run([sys.executable, "-m", "source_kernels.ptx_child", request],
                              env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {kernel} for sm_{arch} failed:\n{done.stderr}")
        return done.stdout
    elem = "*" + _TRITON_TYPE[dtype]
    block_d = triton.next_power_of_2(channels)
    constexprs = {"L": levels, "K": points}
    if kernel.endswith("_tiled"):
        constexprs["LK_PAD"] = triton.next_power_of_2(levels * points)
        default_q, default_warps = TILED_DEFAULT
    if kernel == "forward_tiled":
        fn = _jit(kernel_fn or tiled._msda_forward_tiled_kernel)
        signature = {"value_ptr": elem, "shapes_ptr": "*i64", "starts_ptr": "*i64",
                     "loc_ptr": elem, "attn_ptr": elem, "out_ptr": elem}
    elif kernel == "backward_tiled":
        fn = _jit(kernel_fn or tiled._msda_backward_tiled_kernel)
        grad_value = "*fp32" if fp32_grad_accum and dtype in (torch.float16, torch.bfloat16) \
            else elem
        signature = {"grad_out_ptr": elem, "value_ptr": elem, "shapes_ptr": "*i64",
                     "starts_ptr": "*i64", "loc_ptr": elem, "attn_ptr": elem,
                     "grad_value_ptr": grad_value, "grad_loc_ptr": elem, "grad_attn_ptr": elem}
    elif kernel == "forward":
        fn = _jit(kernel_fn or forward._msda_forward_kernel)
        default_q, default_warps = forward.forward_config(channels, dtype)
        signature = {"value_ptr": elem, "shapes_ptr": "*i64", "starts_ptr": "*i64",
                     "loc_ptr": elem, "attn_ptr": elem, "out_ptr": elem}
    elif kernel == "backward":
        fn = _jit(kernel_fn or backward._msda_backward_kernel)
        default_q, default_warps = backward.BWD_BLOCK_Q, backward.BWD_NUM_WARPS
        grad_value = "*fp32" if fp32_grad_accum and dtype in (torch.float16, torch.bfloat16) \
            else elem
        signature = {"grad_out_ptr": elem, "value_ptr": elem, "shapes_ptr": "*i64",
                     "starts_ptr": "*i64", "loc_ptr": elem, "attn_ptr": elem,
                     "grad_value_ptr": grad_value, "grad_loc_ptr": elem, "grad_attn_ptr": elem}
    else:
        raise ValueError("kernel must be 'forward', 'backward', 'forward_tiled' or "
                         f"'backward_tiled', got {kernel!r}")
    signature.update({"stride_b": "i32", "stride_s": "i32", "stride_m": "i32", "Q": "i32",
                      "M": "i32", "D": "i32"})
    constexprs.update({"BLOCK_Q": block_q or default_q, "BLOCK_D": block_d,
                       "ACC_DTYPE": _acc(dtype)})
    signature.update({name: "constexpr" for name in constexprs})
    # Pointers are 16-byte aligned, as torch's allocations are; D = 32 is a multiple of 16.
    # Strides as for a contiguous (B, S, M, D) value with M = 8 heads.
    aligned = [name for name, ty in signature.items() if ty.startswith("*")]
    if channels % 16 == 0:
        aligned += ["D", "stride_b", "stride_s", "stride_m"]
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    target = GPUTarget("cuda", arch, 32)
    compiled = triton.compile(source, target=target,
                              options={"num_warps": num_warps or default_warps})
    return compiled.asm["ptx"]


def compile_candidate(direction: str, kernel: str, dtype: torch.dtype, block: int,
                      num_warps: int, *, arch: int = 90, channels: int = 32, levels: int = 4,
                      points: int = 4):
    """Compile one launch candidate of the sweep (``source_kernels.bench``): the forward or
    backward of a "loop", "tiled" or "rows..." kernel, for ``sm_<arch>``, specialised as the
    operator launches it on 16-byte aligned tensors with int32 sizes and strides that are
    multiples of 16 (grad_value in the value's dtype).  Returns Triton's compiled kernel."""
    from .forward import rows_options
    elem = "*" + _TRITON_TYPE[dtype]
    if direction == "forward":
        pointers = ["value_ptr", "shapes_ptr", "starts_ptr", "loc_ptr", "attn_ptr", "out_ptr"]
    else:
        pointers = ["grad_out_ptr", "value_ptr", "shapes_ptr", "starts_ptr", "loc_ptr",
                    "attn_ptr", "grad_value_ptr", "grad_loc_ptr", "grad_attn_ptr"]
    signature = {p: "*i64" if p in ("shapes_ptr", "starts_ptr") else elem for p in pointers}
    ints = ["stride_b", "stride_s", "stride_m", "Q", "M", "D"]
    constexprs = {"L": levels, "K": points, "BLOCK_D": triton.next_power_of_2(channels)}
    if kernel in ("loop", "tiled"):
        module = {"loop": forward if direction == "forward" else backward, "tiled": tiled}[kernel]
        name = f"_msda_{direction}{'_tiled' if kernel == 'tiled' else ''}_kernel"
        fn = _jit(getattr(module, name))
        constexprs.update({"BLOCK_Q": block, "ACC_DTYPE": _acc(dtype)})
        if kernel == "tiled":
            constexprs["LK_PAD"] = triton.next_power_of_2(levels * points)
    else:
        from . import rows
        options = rows_options(kernel)
        fn = _jit(getattr(rows, f"_msda_{direction}_rows_kernel"))
        chunk = {"all": levels * points, "level": points, "sample": 1}[options["chunk"]]
        ints.append("ROWS")
        constexprs.update({"BLOCK_R": block, "CHUNK": chunk,
                           "N_PAD": triton.next_power_of_2(chunk),
                           "HEAD_MAJOR": options["head_major"], "WIDE": False})
        if direction == "forward":
            constexprs["PERSISTENT"] = options["persistent"]
    signature.update({name: "i32" for name in ints})
    signature.update({name: "constexpr" for name in constexprs})
    aligned = pointers + [n for n in ints if n not in ("Q", "M")]
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps})


def resource_usage(compiled) -> dict:
    """Registers per thread, stack bytes (spills land there) and static shared memory of a
    compiled kernel, read from its cubin with the cuobjdump that Triton ships."""
    import tempfile
    tool = cuobjdump_path()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(compiled.asm["cubin"])
        handle.flush()
        report = subprocess.run([tool, "--dump-resource-usage", handle.name],
                                capture_output=True, text=True, check=False).stdout
    usage = {}
    for key in ("REG", "STACK", "SHARED"):
        found = re.search(key + r":(\d+)", report)
        usage[key.lower()] = int(found.group(1)) if found else None
    return usage


def resources_table(dtype_names) -> int:
    """Print registers, stack and shared memory of every sweep candidate (sm_90)."""
    from .bench import SWEEP_CANDIDATES, SWEEP_CANDIDATES_FP64
    dtypes = {name: dt for dt, name in _TRITON_TYPE.items()}
    print(f"triton {triton.__version__}, sm_90: registers/thread, stack bytes, shared bytes")
    for name in dtype_names:
        table = SWEEP_CANDIDATES_FP64 if name == "fp64" else SWEEP_CANDIDATES
        for (direction, regime), candidates in table.items():
            for kernel, block, warps in candidates:
                try:
                    usage = resource_usage(compile_candidate(direction, kernel, dtypes[name],
                                                             block, warps))
                    shown = f"{usage['reg']:4d} regs {usage['stack']:4d} stack " \
                            f"{usage['shared']:6d} shared"
                except Exception as error:                          # noqa: BLE001
                    shown = f"failed: {type(error).__name__}: {str(error)[:120]}"
                print(f"{name:4s} {direction:8s} {regime:5s} {kernel:18s} {block:3d} rows/queries"
                      f" {warps:2d} warps: {shown}", flush=True)
    return 0


def atomic_instructions(ptx: str) -> list[str]:
    """Every atomic or reduction instruction in the PTX, e.g. 'atom.global.gpu.relaxed...'"""
    return _ATOMIC.findall(ptx)


def atomic_summary(ptx: str) -> dict[str, int]:
    """Distinct atomic instructions and how often each occurs."""
    counts: dict[str, int] = {}
    for instr in atomic_instructions(ptx):
        counts[instr] = counts.get(instr, 0) + 1
    return dict(sorted(counts.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    parser.add_argument("--dtype", nargs="+", default=["fp32", "fp16", "bf16"])
    parser.add_argument("--resources", action="store_true",
                        help="registers, stack and shared memory of every sweep candidate")
    args = parser.parse_args(argv)
    if args.resources:
        if _interpreting():            # kernels must be compilable objects: a fresh process
            env = dict(os.environ, TRITON_INTERPRET="0")
            return subprocess.run([sys.executable, "-m", "source_kernels.ptx",
                                   *(sys.argv[1:] if argv is None else argv)],
                                  env=env, check=False).returncode
        return resources_table(args.dtype)
    dtypes = {name: dt for dt, name in _TRITON_TYPE.items()}
    print(f"triton {triton.__version__}: atomics of the backward kernel (D=32, L=K=4)")
    for arch in args.arch:
        for name in args.dtype:
            dtype = dtypes[name]
            accum_choices = [False, True] if dtype in (torch.float16, torch.bfloat16) else [False]
            for accum in accum_choices:
                ptx = compile_ptx("backward", arch, dtype, accum)
                label = f"sm_{arch} {name:>4} grad_value in {'fp32' if accum else name}"
                summary = ", ".join(f"{k} x{v}" for k, v in atomic_summary(ptx).items())
                print(f"{label:<34} {summary or 'no atomics'}")
        ptx = compile_ptx("forward", arch, torch.bfloat16)
        print(f"sm_{arch} forward (bf16): {len(atomic_instructions(ptx))} atomics, "
              f"{ptx.count('ld.global')} global loads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
