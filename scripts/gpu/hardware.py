"""What a CUDA GPU says about the backward kernel's atomics (chapters 5 and 7).

    python3 scripts/gpu/hardware.py OUTDIR [--presets decoder encoder] [--budget-s 18]
                                           [--fill-missing results/hardware_h200.json]

writes OUTDIR/hardware_<gpu>.json (hardware_h200.json on an H200) with three sections (a
measurement that would start after --budget-s seconds is skipped and listed as such):

- ``compiled``: for the kernels the operator launches, as this GPU's Triton compiles them,
  the atomic and global-memory instructions of the PTX and of the SASS, registers and
  spills, and a SASS excerpt around the first atomic.
- ``accumulation``: the backward timed with grad_value accumulated in the input's 16-bit
  dtype (``fp32_grad_accum=False``) and in an fp32 buffer (``True``).  Before Hopper the
  first one is the bf16 compare-and-swap loop, so on such a GPU this measures the cliff;
  on Hopper both paths are native if Triton emitted packed or vector atomics (the
  ``compiled`` section says whether it did).
- ``determinism``: the backward run ten times on the same inputs: how many elements of
  each gradient differ bitwise from the first run, and by how much (atomics commit in a
  different order every run); the forward, for contrast.

With ``--fill-missing FILE`` the script starts from an earlier results file and measures only
what it lacks (accumulation and determinism rows it does not hold; the ``compiled`` section
is kept as it is).  Rows measured by such a run carry ``"filled_in": N``, an index into the
file's ``filled_in`` list, which holds that run's provenance and what it measured: the
file's own ``provenance`` stays the one of the run that measured everything else.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import time

from _provenance import provenance, require_gpu, write_results

SCRIPT = "hardware.py"
NAMES = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
         "attention_weights")
_PTX_MEMORY = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:atom|red|ld\.global|st\.global)[\w.:]*)",
                         re.MULTILINE)
_SASS_ADDRESS = re.compile(r"/\*\s*(?:0x)?[0-9a-f]+\s*\*/")  # cuobjdump: /*0a60*/, encodings
_SASS_CONTROL = re.compile(r"^\S+:\S+:\S+:\S+:\d+\s+")       # triton's get_sass: --:0:-:-:2
_SASS_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def sass_instructions(sass: str) -> list[tuple[str, str]]:
    """(opcode, instruction text) for every instruction of a SASS listing, in the format of
    ``cuobjdump -sass`` or of Triton's ``get_sass``."""
    found = []
    for line in sass.splitlines():
        text = _SASS_ADDRESS.sub("", line).strip()
        text = _SASS_CONTROL.sub("", text).rstrip(" ;")
        match = re.match(r"([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(\s|$)",
                         _SASS_PREDICATE.sub("", text))
        if match and not text.endswith(":") and not text.startswith(("Function", "Fatbin")):
            found.append((match.group(1), text))
    return found


def sass_summary(sass: str) -> dict:
    """Counts of the memory opcodes (ATOM*, RED*, LDG*, STG*) in a SASS listing."""
    counts = collections.Counter(op for op, _ in sass_instructions(sass)
                                 if op.startswith(("ATOM", "RED", "LDG", "STG")))
    return dict(sorted(counts.items()))


def sass_excerpt(sass: str, before: int = 8, after: int = 4) -> list[str]:
    """The SASS instructions around the first atomic one."""
    instructions = sass_instructions(sass)
    for i, (op, _) in enumerate(instructions):
        if op.startswith(("ATOM", "RED")):
            return [text for _, text in instructions[max(0, i - before):i + after + 1]]
    return []


class _Recorder:
    """Stands in for a @triton.jit kernel and keeps the compiled kernel of each launch."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled = None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.compiled = self.kernel[grid](*args, **kwargs)
            return self.compiled
        return launch


def describe_compiled(compiled) -> dict:
    from triton.tools.disasm import get_sass
    ptx = compiled.asm["ptx"]
    try:
        sass = compiled.asm["sass"]
    except KeyError:                      # a Triton whose asm dict does not disassemble
        sass = get_sass(compiled.asm["cubin"])
    ptx_counts = collections.Counter(_PTX_MEMORY.findall(ptx))
    target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE)
    return {
        "ptx_target": target.group(1) if target else None,
        "ptx_memory_instructions": dict(sorted(ptx_counts.items())),
        "sass_memory_opcodes": sass_summary(sass),
        "sass_excerpt_first_atomic": sass_excerpt(sass),
        "registers": getattr(compiled, "n_regs", None),
        "spills": getattr(compiled, "n_spills", None),
    }


def main(argv=None) -> int:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--presets", nargs="+", default=["decoder", "encoder"])
    parser.add_argument("--runs", type=int, default=10, help="runs for the determinism check")
    parser.add_argument("--budget-s", type=float, default=18.0,
                        help="start no new measurement after this many seconds (the course's "
                             "GPU run gives each script 28 s)")
    parser.add_argument("--fill-missing", metavar="FILE",
                        help="an earlier hardware results file: keep what it holds and "
                             "measure only the rows it lacks")
    args = parser.parse_args(argv)
    require_gpu(SCRIPT)
    import torch
    import triton.testing

    import source_kernels as sk
    from source_kernels import backward, forward
    from source_kernels.backward import default_fp32_grad_accum, msda_backward
    from source_kernels.inputs import preset_inputs

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    major, minor = torch.cuda.get_device_capability()
    payload = {
        "provenance": provenance(SCRIPT),
        "compiled": {"capability": f"{major}.{minor}", "kernels": []},
        "accumulation": {"method": "triton.testing.do_bench median (L2 flushed, warmup 5 ms, "
                                   "rep 25 ms) of source_kernels.backward.msda_backward, "
                                   "grad_value allocation and conversion included",
                         "native_16bit_atomics_expected": major >= 9,
                         "default_fp32_grad_accum": {
                             name: default_fp32_grad_accum(dt, "cuda")
                             for name, dt in dtypes.items()},
                         "rows": []},
        "determinism": {"runs": args.runs, "rows": []},
        "skipped": [],
    }
    fill = None                     # the index of this run in the file's "filled_in" list
    if args.fill_missing:
        earlier = json.loads(open(args.fill_missing).read())
        fill = len(earlier.get("filled_in", [])) + 1
        this_run = {"provenance": payload["provenance"], "measured": []}
        payload = {**earlier, "skipped": [],
                   "filled_in": [*earlier.get("filled_in", []), this_run]}
    have_accumulation = {(r["preset"], r["distribution"], r["dtype"])
                         for r in payload["accumulation"]["rows"]}
    have_determinism = {(r["preset"], r["dtype"]) for r in payload["determinism"]["rows"]}

    def record(section, row, what):
        # a measured row, marked with the run that measured it when filling in
        if fill is not None:
            row["filled_in"] = fill
            payload["filled_in"][fill - 1]["measured"].append(what)
        payload[section]["rows"].append(row)

    def over_budget(what):
        if time.perf_counter() - started <= args.budget_s:
            return False
        payload["skipped"].append({"what": what, "reason": f"time budget of {args.budget_s} s"})
        print(f"{what}: skipped (time budget)", flush=True)
        return True

    # --- what this GPU's Triton compiles for the kernels the operator launches ------------
    inputs32 = preset_inputs("decoder", device="cuda")
    compile_cases = [("backward", "bf16", False), ("backward", "bf16", True),
                     ("backward", "fp16", False), ("backward", "fp32", False),
                     ("forward", "bf16", False), ("forward", "fp32", False)]
    if fill is not None:
        compile_cases = []          # kept from the earlier file
    launched = [(backward, "_msda_backward_kernel"), (backward, "_msda_backward_tiled_kernel"),
                (forward, "_msda_forward_kernel"), (forward, "_msda_forward_tiled_kernel")]
    originals = {(module, attr): getattr(module, attr) for module, attr in launched}
    recorders = {(module, attr): _Recorder(kernel) for (module, attr), kernel in
                 originals.items()}
    for (module, attr), recorder in recorders.items():
        setattr(module, attr, recorder)
    try:
        for kernel, dtype_name, accum in compile_cases:
            if over_budget(f"compiled {kernel} {dtype_name} fp32_grad_accum={accum}"):
                continue
            ordered = [t.to(dtypes[dtype_name]) if t.is_floating_point() else t
                       for t in (inputs32[k] for k in NAMES)]
            for recorder in recorders.values():
                recorder.compiled = None
            if kernel == "backward":
                out = forward.msda_forward(*ordered)
                msda_backward(torch.ones_like(out), *ordered, fp32_grad_accum=accum)
            else:
                forward.msda_forward(*ordered)
            torch.cuda.synchronize()
            module = backward if kernel == "backward" else forward
            ran = [(attr, r.compiled) for (m, attr), r in recorders.items()
                   if m is module and r.compiled is not None]
            entry = {"kernel": kernel, "dtype": dtype_name,
                     "grad_value_buffer": ("fp32" if accum else dtype_name)
                     if kernel == "backward" else None,
                     "triton_function": ran[0][0] if ran else None}
            try:
                entry.update(describe_compiled(ran[0][1]))
            except Exception as err:  # noqa: BLE001 - keep the other sections if this fails
                entry["error"] = f"{type(err).__name__}: {err}"
            payload["compiled"]["kernels"].append(entry)
            print(f"{kernel} {dtype_name} buffer={entry['grad_value_buffer']} "
                  f"({entry['triton_function']}): "
                  f"SASS {entry.get('sass_memory_opcodes', entry.get('error'))}", flush=True)
    finally:
        for (module, attr), kernel in originals.items():
            setattr(module, attr, kernel)

    # --- the two accumulation paths -----------------------------------------------------
    for preset in args.presets:
        for distribution in ("local", "uniform"):
            for dtype_name in ("bf16", "fp16"):
                if (preset, distribution, dtype_name) in have_accumulation:
                    continue
                what = f"accumulation {preset} {distribution} {dtype_name}"
                if over_budget(what):
                    continue
                inputs = preset_inputs(preset, distribution=distribution,
                                       dtype=dtypes[dtype_name], device="cuda")
                ordered = [inputs[k] for k in NAMES]
                out = sk.multi_scale_deformable_attn(*ordered)
                grad_out = torch.randn_like(out)
                for accum in (False, True):
                    def run(accum=accum):
                        return msda_backward(grad_out, *ordered, fp32_grad_accum=accum)
                    run()
                    us = triton.testing.do_bench(run, warmup=5, rep=25,
                                                 return_mode="median") * 1e3
                    record("accumulation", {
                        "preset": preset, "distribution": distribution, "dtype": dtype_name,
                        "fp32_grad_accum": accum, "backward_us": us},
                        f"{what} fp32_grad_accum={accum}")
                    print(f"backward {preset} {distribution} {dtype_name} "
                          f"fp32_grad_accum={accum}: {us:.1f} µs", flush=True)

    # --- run-to-run differences ---------------------------------------------------------
    for preset in args.presets:
        for dtype_name in ("fp32", "bf16"):
            if (preset, dtype_name) in have_determinism:
                continue
            what = f"determinism {preset} {dtype_name}"
            if over_budget(what):
                continue
            inputs = preset_inputs(preset, distribution="local", dtype=dtypes[dtype_name],
                                   device="cuda")
            ordered = [inputs[k] for k in NAMES]
            outs = [sk.multi_scale_deformable_attn(*ordered) for _ in range(args.runs)]
            grad_out = torch.randn_like(outs[0])
            grads = [msda_backward(grad_out, *ordered) for _ in range(args.runs)]
            row = {"preset": preset, "distribution": "local", "dtype": dtype_name,
                   "fp32_grad_accum": default_fp32_grad_accum(dtypes[dtype_name], "cuda"),
                   "forward_runs_bitwise_equal": all(torch.equal(o, outs[0]) for o in outs)}
            for i, name in enumerate(("grad_value", "grad_sampling_locations",
                                      "grad_attention_weights")):
                first = grads[0][i].float()
                differing, max_abs = [], 0.0
                for g in grads[1:]:
                    differing.append(int((g[i] != grads[0][i]).sum().item()))
                    max_abs = max(max_abs, (g[i].float() - first).abs().max().item())
                row[name] = {"elements": first.numel(),
                             "differing_elements_per_run": differing,
                             "max_abs_difference": max_abs,
                             "max_abs_value": first.abs().max().item()}
            record("determinism", row, what)
            print(f"determinism {preset} {dtype_name}: grad_value differs in "
                  f"{statistics.median(row['grad_value']['differing_elements_per_run'])} "
                  f"of {row['grad_value']['elements']} elements (median over runs)",
                  flush=True)

    if fill is None:
        payload["elapsed_s"] = time.perf_counter() - started
    else:
        payload["filled_in"][fill - 1]["elapsed_s"] = time.perf_counter() - started
    path = write_results(args.outdir, "hardware", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
