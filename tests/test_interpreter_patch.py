"""The interpreter's language patch, made once per launch for each @triton.jit helper
(``source_kernels.triton_compat.patch_language_once_per_launch``): the same results as
Triton's own per-call patch, fewer patches, and nothing left behind by a launch that raised.
CPU only: on a GPU host the kernels compile and the interpreter is not used."""
import contextlib

import pytest
import torch

import source_kernels  # noqa: F401  (interpreter mode, and the patch, before any kernel)
from source_kernels import triton_compat

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the interpreter runs only where there is no GPU")

import triton  # noqa: E402  (after source_kernels, which picks the interpreter)
import triton.language as tl  # noqa: E402


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def _sum_of_doubles(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    total = tl.zeros([BLOCK], dtype=tl.float32)             # a helper of Triton's own module
    for _ in range(STEPS):
        total += _twice(tl.load(x_ptr + offsets, mask=mask, other=0.0))   # our helper
    tl.store(out_ptr + offsets, total, mask=mask)


@triton.jit
def _not_a_power_of_two():
    return tl.arange(0, 3)                  # raises: a range's size must be a power of two


@triton.jit
def _fails_inside(x_ptr, BLOCK: tl.constexpr):
    values = _twice(tl.load(x_ptr + tl.arange(0, BLOCK)))
    tl.store(x_ptr + tl.arange(0, BLOCK), values + _not_a_power_of_two())


def _run(x, steps=5):
    out = torch.empty_like(x)
    _sum_of_doubles[(triton.cdiv(x.numel(), 8),)](x, out, x.numel(), BLOCK=8, STEPS=steps)
    return out


@contextlib.contextmanager
def _counting_patch():
    """Triton's own ``_patch_lang`` counted, under a fresh once-per-launch wrapper; what was
    installed before is put back afterwards."""
    interp = triton_compat.interpreter()
    installed = interp._patch_lang
    original = getattr(installed, "__wrapped__", installed)
    calls = []

    def counted(fn):
        calls.append(fn.__name__)
        return original(fn)

    interp._patch_lang = counted
    try:
        yield calls, lambda: triton_compat.patch_language_once_per_launch()
    finally:
        interp._patch_lang = installed


def test_importing_the_package_installs_it():
    assert getattr(triton_compat.interpreter()._patch_lang, "_once_per_launch", False)
    assert triton_compat.patch_language_once_per_launch()      # idempotent


def test_each_helper_is_patched_once_per_launch_with_the_same_results():
    x = torch.arange(20, dtype=torch.float32)
    with _counting_patch() as (calls, install):
        per_call = _run(x)
        triton_per_call = len(calls)
        calls.clear()
        assert install()
        once = _run(x)
        mine = list(calls)
    torch.testing.assert_close(per_call, 10.0 * x, rtol=0, atol=0)
    torch.testing.assert_close(once, per_call, rtol=0, atol=0)
    # 3 programs: Triton patches once for the launch and then for every call of a helper
    # (5 of _twice and 1 of tl.zeros per program); once per launch: the launch, then each
    # helper the first time
    assert triton_per_call == 1 + 3 * (5 + 1), triton_per_call
    assert sorted(mine) == sorted(["_sum_of_doubles", "_twice", "zeros"]), mine


def test_a_launch_that_raised_leaves_nothing_behind():
    with pytest.raises(Exception, match="power of 2|power of two"):
        _fails_inside[(1,)](torch.ones(8), BLOCK=8)
    assert triton_compat._LAUNCH_PATCHED["helpers"] is None
    x = torch.arange(16, dtype=torch.float32)
    torch.testing.assert_close(_run(x, steps=2), 4.0 * x, rtol=0, atol=0)
    with _counting_patch() as (calls, install):
        install()
        _run(x, steps=2)
        _run(x, steps=2)
    assert sorted(calls) == sorted(["_sum_of_doubles", "_twice", "zeros"] * 2), calls
