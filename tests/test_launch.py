"""The operator's launch path (source_kernels/launch.py): its cache key must tell apart every
pair of calls that Triton compiles differently, and a cached launch must compute exactly what
Triton's ordinary ``kernel[grid](...)`` computes."""
import pytest
import torch

import source_kernels
from source_kernels import launch as launch_module
from source_kernels.inputs import make_inputs

# where the kernels run: the GPU when there is one, else Triton's interpreter on the CPU
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

ARG_NAMES = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
             "attention_weights")


def _triton_specialisation(arg):
    libtriton = pytest.importorskip("triton._C.libtriton")
    if not hasattr(libtriton, "native_specialize_impl"):
        pytest.skip("this Triton has no native_specialize_impl to compare with")
    from triton.backends.compiler import BaseBackend
    return libtriton.native_specialize_impl(BaseBackend, arg, False, True, True)


def test_cache_key_refines_tritons_specialisation():
    """Two arguments with one key in launch.py get one specialisation from Triton."""
    ints = [0, 1, 2, 15, 16, 17, 32, 300, 22223, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31,
            2 ** 31 + 16, 2 ** 40, 2 ** 63, 2 ** 63 + 16, -1, -16, -2 ** 31, -2 ** 31 - 16]
    base = torch.zeros(64)
    tensors = [base, base[1:], base[4:], base[8:], base.double(), base.half()[1:],
               base.bfloat16()[8:]]
    seen = {}
    for arg in ints + tensors:
        ours = launch_module._specialisation([arg])
        theirs = _triton_specialisation(arg)
        if ours in seen:
            assert seen[ours] == theirs, (
                f"{arg!r:.40} shares the key {ours} with an argument Triton specialises as "
                f"{seen[ours]}, but Triton specialises it as {theirs}")
        seen[ours] = theirs


def test_cached_path_is_taken_unless_a_launch_is_watched():
    """No hook and an unpatched JITFunction.run: the cached path is open.  A launch hook
    or a patched run (the grader's launch counter) closes it."""
    import triton
    from autograde.trust.recording import watch_kernel_launches
    assert not launch_module._hooks_active(), "the cached path is closed with nothing set"
    chain = triton.knobs.runtime.launch_enter_hook

    def hook(metadata):
        return None
    if hasattr(chain, "add"):
        chain.add(hook)
        try:
            assert launch_module._hooks_active()
        finally:
            chain.remove(hook)
    undo = watch_kernel_launches(lambda name: None)
    try:
        assert launch_module._hooks_active()
    finally:
        undo()
    assert not launch_module._hooks_active()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_cached_launch_matches_tritons_launch(dtype, monkeypatch):
    """Forward outputs bit for bit equal, through the cache and through Triton's own path,
    for aligned and misaligned inputs and row strides (value as a view)."""
    from source_kernels.forward import msda_forward
    for offset, queries in ((0, 40), (1, 33), (3, 17)):
        args = make_inputs(2, queries, 2, 8, [[5, 7], [3, 2]], 3, dtype=dtype, device="cuda",
                           seed=offset)
        storage = torch.randn(args["value"].numel() + offset, device="cuda").to(dtype)
        args["value"] = storage[offset:].view_as(args["value"])
        ordered = [args[k] for k in ARG_NAMES]
        launch_module._compiled.clear()
        first = msda_forward(*ordered)                  # compiles, fills the cache
        assert launch_module._compiled, "the first launch did not fill the cache"
        cached = msda_forward(*ordered)                 # through the cached launcher
        monkeypatch.setattr(launch_module, "_hooks_active", lambda: True)
        ordinary = msda_forward(*ordered)               # Triton's ordinary path
        monkeypatch.undo()
        torch.cuda.synchronize()
        assert torch.equal(first, ordinary) and torch.equal(cached, ordinary), (
            f"offset {offset}: the cached launch differs from Triton's own")


@pytest.mark.gpu
def test_gpu_launch_counters_still_see_every_launch():
    """A patched ``JITFunction.run`` (the grader's launch counter) is never bypassed."""
    from autograde.trust.recording import watch_kernel_launches
    from source_kernels.forward import msda_forward
    args = make_inputs(1, 8, 2, 8, [[4, 4]], 2, device="cuda")
    ordered = [args[k] for k in ARG_NAMES]
    msda_forward(*ordered)
    msda_forward(*ordered)                              # now cached
    names = []
    undo = watch_kernel_launches(names.append)
    try:
        msda_forward(*ordered)
        msda_forward(*ordered)
    finally:
        undo()
    assert len(names) == 2 and all(name.startswith("_msda_forward") for name in names), names


# ------------------------------------------------------------------- what torch.compile sees

def test_traced_ops_match_the_reference():
    """source_kernels.traced, run eagerly (compiled on a GPU, in the interpreter on a CPU):
    forward and the registered backward against the fp64 reference."""
    from source_kernels import reference, traced  # noqa: F401  (registers the ops)
    args = make_inputs(2, 5, 2, 4, [[4, 5], [2, 3]], 2, outside=0.1, seed=3,
                       device=KERNEL_DEVICE)
    ordered = [args[k] for k in ARG_NAMES]
    leaves = [ordered[i].clone().requires_grad_() for i in (0, 3, 4)]
    out = torch.ops.source_kernels.msda_traced(leaves[0], ordered[1], ordered[2], leaves[1],
                                               leaves[2])
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    expected = reference.msda_grid_sample(ref_leaves[0], ordered[1], ordered[2], ref_leaves[1],
                                          ref_leaves[2])
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    out.backward(grad)
    expected.backward(grad.double())
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-4, rtol=0)


_TRACE_PROGRAM = r'''
import json, os, sys
os.environ["TRITON_INTERPRET"] = "0"           # kernels as compiled objects, as on a GPU
import torch
import triton
from functorch.compile import aot_function
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
from triton.backends.compiler import GPUTarget

import source_kernels
from source_kernels import backward, forward, traced  # noqa: F401
from source_kernels.inputs import make_inputs, pyramid_shapes


class Hopper:                                   # what the tracer asks of the driver
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(Hopper())
backward._capabilities[0] = (9, 0)             # a GPU with native bf16 atomics
forward._sm_counts[0] = 132
plans = json.loads(sys.argv[1])


class Traced(Exception):
    pass


def traced_graph(batch, queries, dtype):
    graphs = []

    def capture(graph, example_inputs):
        graphs.append(graph)
        raise Traced()

    def step(grad, *args):
        out = torch.ops.source_kernels.msda_traced(*args)
        return (out,) + tuple(torch.ops.source_kernels.msda_traced_backward(grad, *args))

    args = make_inputs(batch, queries, 8, 32, pyramid_shapes(), 4, dtype=dtype)
    names = ("value", "value_spatial_shapes", "value_level_start_index",
             "sampling_locations", "attention_weights")
    with FakeTensorMode():
        fake = [torch.empty(args[k].shape, dtype=args[k].dtype, device="cuda") for k in names]
        grad = torch.empty(batch, queries, 256, dtype=dtype, device="cuda")
        try:
            aot_function(step, fw_compiler=capture)(grad, *fake)
        except Traced:
            pass
    launches = []
    for node in graphs[0].graph.nodes:
        if "triton_kernel_wrapper" in str(node.target):
            kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            launches.append({"kernel": kernel.fn.__name__,
                             "cloned": sorted(node.kwargs.get("tensors_to_clone", []))})
    return launches


report = []
for plan in plans:
    forward.FORWARD_PLAN[("small", 2)] = tuple(plan["forward"])
    backward.BACKWARD_PLAN[("small", 2)] = tuple(plan["backward"])
    report.append(traced_graph(4, 300, torch.bfloat16))
print(json.dumps(report))
'''


PLANS_TRACED = [
    {"forward": ["tiled", 1, 1], "backward": ["tiled", 1, 2]},
    {"forward": ["loop", 16, 4], "backward": ["loop", 16, 4]},
    {"forward": ["rows-persistent", 8, 4], "backward": ["rows", 8, 4]},
]


@pytest.mark.slow
def test_compiled_graph_holds_the_kernels_and_clones_only_outputs():
    """What Inductor receives from the traced ops (traced here with fake CUDA tensors, the
    kernels compiled for sm_90 only as far as Triton's IR), for a plan of each kernel kind:
    one launch of the plan's forward kernel and one of its backward kernel, and no argument
    taken for an output (which would make the compiled graph copy the locations and weights
    first)."""
    import json
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _TRACE_PROGRAM, json.dumps(PLANS_TRACED)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    kinds = {"tiled": "_tiled", "loop": "", "rows": "_rows"}
    for plan, launches in zip(PLANS_TRACED, report):
        expected = [f"_msda_{direction}{kinds[plan[direction][0].split('-')[0]]}_kernel"
                    for direction in ("forward", "backward")]
        assert [launch["kernel"] for launch in launches] == expected, (plan, launches)
        assert launches[0]["cloned"] == ["out_ptr"], (plan, launches)
        assert launches[1]["cloned"] == ["grad_attn_ptr", "grad_loc_ptr",
                                         "grad_value_ptr"], (plan, launches)


# ------------------------------------------------------------------- the benchmark harness

PEER_MODULE = '''
"""A stand-in peer with mmcv's signature: the grid_sample reference."""
import torch
from source_kernels.reference import msda_grid_sample

calls = []


def peer_msda(value, spatial_shapes, level_start_index, sampling_locations,
              attention_weights, im2col_step):
    calls.append(im2col_step)
    return msda_grid_sample(value, spatial_shapes, level_start_index, sampling_locations,
                            attention_weights)


class PeerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *args):
        calls.append("apply")
        return msda_grid_sample(*args[:5])
'''


def test_bench_peer_is_wired_like_the_operator(tmp_path, monkeypatch):
    """--peer MODULE:FUNCTION: a function or an autograd Function with mmcv's signature is
    called with the six arguments, by the same forward and forward+backward the operator's
    rows time; without a GPU the command loads the peer, then says it needs one."""
    from source_kernels import bench
    (tmp_path / "fake_peer.py").write_text(PEER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import fake_peer
    args = make_inputs(1, 3, 2, 4, [[3, 4]], 2, requires_grad=True)
    forward, forward_backward = bench.make_calls("peer:fake_peer:peer_msda", args, torch.float32)
    out = forward()
    assert out.shape == (1, 3, 8) and fake_peer.calls == [64]
    forward_backward()
    assert all(args[k].grad is not None for k in ("value", "sampling_locations",
                                                  "attention_weights"))
    assert bench.load_peer("fake_peer:PeerFunction") == fake_peer.PeerFunction.apply
    with pytest.raises(ValueError, match="MODULE:FUNCTION"):
        bench.load_peer("fake_peer")
    with pytest.raises(ModuleNotFoundError):
        bench.main(["--peer", "no_such_module_here:fn", "--no-bench"])
    if not torch.cuda.is_available():
        assert bench.main(["--peer", "fake_peer:peer_msda", "--no-bench"]) == 2


def test_plan_from_sweep_takes_the_fastest_correct_candidate():
    """A wrong candidate is never chosen, however fast; the plan covers each regime and
    element size measured, and its literal reads back as the same table."""
    from source_kernels import bench
    rows = [
        {"kernel": "forward", "variant": "rows", "preset": "decoder", "dtype": "bf16",
         "block_q": 8, "num_warps": 4, "correct": False, "error": "wrong result"},
        {"kernel": "forward", "variant": "rows", "preset": "decoder", "dtype": "bf16",
         "block_q": 4, "num_warps": 2, "correct": True, "us": 9.0},
        {"kernel": "forward", "variant": "tiled", "preset": "decoder", "dtype": "bf16",
         "block_q": 1, "num_warps": 1, "correct": True, "us": 11.0},
        {"kernel": "backward", "variant": "loop", "preset": "encoder", "dtype": "fp64",
         "block_q": 8, "num_warps": 2, "correct": True, "us": 900.0},
    ]
    rows[0]["us"] = 1.0                     # fast but wrong
    plan = bench.plan_from_sweep(rows)
    assert plan == {"forward": {"small,2": ["rows", 4, 2]},
                    "backward": {"large,8": ["loop", 8, 2]}}
    table = {("small", 2): ("rows", 4, 2), ("large", 8): ("loop", 8, 2)}
    namespace = {}
    exec(bench.plan_literal("PLAN", table), namespace)  # noqa: S102  (the plan as written)
    assert namespace["PLAN"] == table


def test_sweep_checks_each_candidate_before_timing_it(monkeypatch):
    """The sweep's code path on toy inputs (timing stubbed; in the interpreter on a CPU): a
    candidate that computes a wrong result is recorded as wrong and never timed, the others
    are timed, and the plan comes from the correct ones only."""
    from source_kernels import bench, forward
    toy = make_inputs(1, 4, 2, 4, [[3, 4], [2, 2]], 2, outside=0.1, seed=5,
                      device=KERNEL_DEVICE)
    monkeypatch.setattr(bench, "preset_inputs", lambda *a, **k: {
        key: value.to(k.get("dtype")) if value.is_floating_point() else value
        for key, value in toy.items()})
    monkeypatch.setattr(bench, "_profiled_device_us", lambda call, flush, reps: 7.0)
    if KERNEL_DEVICE == "cpu":                      # the flush buffer and grad_out: on the CPU
        empty, randn = torch.empty, torch.randn
        monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(
            *a, **dict(k, device="cpu")) if k.get("device") == "cuda" else empty(*a, **k))
        monkeypatch.setattr(torch, "randn", lambda *a, **k: randn(
            *a, **dict(k, device="cpu")) if k.get("device") == "cuda" else randn(*a, **k))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    original = forward.msda_forward

    def sabotaged(*args, kernel=None, **kw):
        out = original(*args, kernel=kernel, **kw)
        return out + 1.0 if kernel == "rows" else out
    monkeypatch.setattr(forward, "msda_forward", sabotaged)
    monkeypatch.setattr(bench, "candidates_for", lambda direction, regime, dtype: [
        ("loop", 4, 1), ("rows", 4, 1)] if direction == "forward" else [("rows", 4, 1)])
    rows = bench.sweep(lambda message: None, cases=[("decoder", "fp32")],
                       directions=("forward", "backward"))
    by_variant = {(r["kernel"], r["variant"]): r for r in rows}
    assert by_variant["forward", "rows"]["correct"] is False
    assert "us" not in by_variant["forward", "rows"]
    assert by_variant["forward", "loop"]["correct"] and by_variant["forward", "loop"]["us"] == 7
    assert by_variant["backward", "rows"]["correct"]
    plan = bench.plan_from_sweep(rows)
    assert plan["forward"] == {"small,4": ["loop", 4, 1]}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_bound_launches_match_tritons_launch(dtype, monkeypatch):
    """The operator's bound launches (raw pointers, no look-up) compute bit for bit what
    Triton's ordinary launch computes, forward and the deterministic gradients, on each
    regime's plan; the first call binds, the next ones use the binding."""
    from source_kernels import op
    from source_kernels.inputs import preset_inputs
    for preset in ("decoder", "decoder-b32"):
        args = preset_inputs(preset, dtype=dtype, device="cuda", requires_grad=True)
        ordered = [args[k] for k in ARG_NAMES]
        grad = torch.randn(ordered[0].shape[0], ordered[3].shape[1],
                           ordered[0].shape[2] * ordered[0].shape[3], device="cuda",
                           dtype=dtype)
        op.forget_launches()

        def run():
            for k in ("value", "sampling_locations", "attention_weights"):
                args[k].grad = None
            out = source_kernels.multi_scale_deformable_attn(*ordered)
            out.backward(grad)
            return out.detach(), args["attention_weights"].grad.clone()

        first = run()
        call = op._call_for(*ordered, 64)
        assert call.forward_bound is not None and call.backward_bound, "nothing was bound"
        bound = run()
        monkeypatch.setattr(op, "hooks_active", lambda: True)
        monkeypatch.setattr(launch_module, "hooks_active", lambda: True)
        ordinary = run()
        monkeypatch.undo()
        for a, b, c in zip(first, bound, ordinary):
            assert torch.equal(a, c) and torch.equal(b, c), f"{preset}: bound launch differs"


def test_launch_counters_see_the_operators_launches():
    """The grader's launch counter (a patched JITFunction.run) sees every launch of the
    operator's eager path too: a bound launch steps aside while it is installed."""
    from autograde.trust.recording import watch_kernel_launches
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = make_inputs(1, 8, 2, 8, [[4, 4]], 2, device=device, requires_grad=True)
    source_kernels.multi_scale_deformable_attn(**args).sum().backward()   # binds both
    names = []
    undo = watch_kernel_launches(names.append)
    try:
        source_kernels.multi_scale_deformable_attn(**args).sum().backward()
    finally:
        undo()
    assert len(names) == 2, names
    assert names[0].startswith("_msda_forward") and names[1].startswith("_msda_backward"), names
