"""The grader's record-and-replay of hidden checks, on a GPU: compiled Triton kernels, CUDA
tensors in the record, the replay's results put back on the GPU.

    python3 scripts/gpu/grading_replay.py OUTDIR     ->  OUTDIR/grading_replay_<gpu>.json

On a GPU grading host a hidden check runs the student's Triton kernel compiled for the device
(not the interpreter), and the grader replays the check with the recorded CUDA results
(autograde/trust/recording.py).  This script runs that cycle in one process for a small check in
the style of the course's (fresh inputs from ``fresh_generator``, the student's function
inside ``forbid_references`` and ``count_kernel_launches``) against four students: a correct
kernel, a wrong kernel, torch instead of a kernel, and a wrong kernel whose "kernel" run
replaced the comparison.  Expected: the kernel phase passes the correct and the cheating one,
the replay passes only the correct one.  tests/test_grading.py reads the file.
"""
from __future__ import annotations

import json
import sys
import time

from _provenance import provenance, require_gpu, write_results



def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    require_gpu("grading_replay.py")
    import torch
    import triton
    import triton.language as tl

    import source_kernels  # noqa: F401  (the interpreter switch; a GPU keeps it off)
    import source_kernels.testing as testing
    from autograde.trust import recording
    from autograde.checks.common import count_kernel_launches, forbid_references, fresh_generator

    def check_scale(scale):
        gen = fresh_generator()
        for n in (1, 1000, 4097):
            x = torch.randn(n, generator=gen).cuda()
            alpha = float(torch.randn((), generator=gen))
            with forbid_references(scale), count_kernel_launches() as launches:
                got = scale(x, alpha)
            if launches.count == 0:
                raise AssertionError("scale launched no Triton kernel")
            testing.assert_close_explained(got, alpha * x, atol=1e-6, rtol=1e-6,
                                           what=f"scale of {n} elements")

    @triton.jit
    def scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)

    @triton.jit
    def wrong_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha + 1e-3, mask=mask)

    def launcher(kernel):
        def scale(x, alpha):
            out = torch.empty_like(x)
            kernel[(triton.cdiv(x.numel(), 256),)](x, out, alpha, x.numel(), BLOCK=256)
            return out
        return scale

    def torch_scale(x, alpha):
        return alpha * x

    students = {"correct": (launcher(scale_kernel), False),
                "wrong": (launcher(wrong_kernel), False),
                "torch_only": (torch_scale, False),
                "wrong_with_replaced_comparison": (launcher(wrong_kernel), True)}
    rows = {}
    for name, (fn, cheat) in students.items():
        started = time.perf_counter()
        recording._mode, recording._base_seed, recording._counter = "record", "gpu-run", 0
        recording._events.clear()
        saved = testing.explain_mismatch
        if cheat:
            testing.explain_mismatch = lambda *a, **k: None
        try:
            check_scale(fn)
            kernel = "pass"
        except AssertionError as exc:
            kernel = f"fail: {str(exc).splitlines()[0][:120]}"
        finally:
            testing.explain_mismatch = saved
            torch.cuda.synchronize()
            events = json.loads(json.dumps(recording._events))
            recording._events.clear()
            recording._mode = None
        devices = sorted({v.get("device") for e in events if e.get("e") == "call"
                          for v in [e.get("result", {})] if isinstance(v, dict)})
        context = recording.ReplayContext(
            events, "gpu-run", lambda kind: "cuda" if kind == "cuda" else "cpu")
        try:
            recording.replay_check(check_scale, [recording.Proxy(context, "scale")], {}, context)
            replay = "pass"
        except AssertionError as exc:
            replay = f"fail: {str(exc).splitlines()[0][:120]}"
        rows[name] = {"kernel": kernel, "replay": replay, "record_devices": devices,
                      "launches_recorded": sum(e.get("launches", 0) for e in events
                                               if e.get("e") == "call"),
                      "seconds": round(time.perf_counter() - started, 3)}
    ok = (rows["correct"]["kernel"] == rows["correct"]["replay"] == "pass"
          and rows["wrong"]["replay"].startswith("fail")
          and rows["torch_only"]["replay"].startswith("fail")
          and rows["wrong_with_replaced_comparison"]["kernel"] == "pass"
          and rows["wrong_with_replaced_comparison"]["replay"].startswith("fail")
          and rows["correct"]["record_devices"] == ["cuda"])
    path = write_results(argv[0], "grading_replay",
                         {"provenance": provenance("grading_replay.py"), "cases": rows,
                          "as_expected": ok})
    print(json.dumps(rows, indent=1))
    print(f"wrote {path}; as expected: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
