"""The interpreter's shortcuts (``source_kernels.triton_compat.interpreter_shortcuts``):

- the language patch, made once per launch for each @triton.jit helper: the same results as
  Triton's own per-call patch, fewer patches, and nothing left behind by a launch that raised;
- the integer overflow checks switched off: the interpreter drops their assertion anyway (an
  overflow wraps silently, and a failing ``tl.device_assert`` passes), and the results are
  the same bit for bit;
- the remembered dtype table: Triton's own answer for every type.

The course's operator, forward and backward, gives the same bits with the shortcuts as with
the interpreter as Triton ships it.  CPU only: on a GPU host the kernels compile and the
interpreter is not used."""
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


def test_importing_the_package_installs_them():
    interp = triton_compat.interpreter()
    assert getattr(interp._patch_lang, "_once_per_launch", False)
    assert interp.interpreter_builder.options.sanitize_overflow is False
    assert getattr(interp._get_np_dtype, "_remembered", False)
    # the pinned Triton allows all three; installing again changes nothing
    assert triton_compat.interpreter_shortcuts() == {
        "patch_language_once_per_launch": True, "skip_unread_overflow_checks": True,
        "remember_np_dtypes": True}
    assert getattr(interp._get_np_dtype.__wrapped__, "_remembered", False) is False


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


# ---------------------------------------------------------------- the interpreter as shipped
_as_triton_ships_it = triton_compat.interpreter_as_shipped


@contextlib.contextmanager
def _counting_launches():
    """The number of launches the interpreter runs inside the block, in a one-item list."""
    builder = triton_compat.interpreter().interpreter_builder
    count = [0]
    grid = builder.set_grid_dim

    def counted(*dims):
        count[0] += 1
        return grid(*dims)

    builder.set_grid_dim = counted
    try:
        yield count
    finally:
        del builder.set_grid_dim                    # the class's own method again


def test_as_shipped_undoes_each_shortcut_and_puts_it_back():
    interp = triton_compat.interpreter()
    builder = interp.interpreter_builder
    with _as_triton_ships_it():
        assert not getattr(interp._patch_lang, "_once_per_launch", False)
        assert not getattr(interp._get_np_dtype, "_remembered", False)
        assert builder.options.sanitize_overflow is True
    with _as_triton_ships_it("remember_np_dtypes"):
        assert not getattr(interp._get_np_dtype, "_remembered", False)
        assert getattr(interp._patch_lang, "_once_per_launch", False)
        assert builder.options.sanitize_overflow is False
    assert getattr(interp._get_np_dtype, "_remembered", False)
    with pytest.raises(ValueError, match="no interpreter shortcut named"):
        with _as_triton_ships_it("remember_everything"):
            pass


@triton.jit
def _integer_arithmetic(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offsets)
    b = tl.load(b_ptr + offsets)
    tl.device_assert(a < 0, "never true here")    # dropped by the interpreter
    wide = n * 3                                  # an int32 product past 2**31 for n = 2**30
    small = (a * b + wide - b).to(tl.int16) * 1000
    tl.store(out_ptr + offsets, (small + a * 7 - 12).to(tl.int32))


def _integers():
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(2 ** 20, 2 ** 30, (16,), generator=gen, dtype=torch.int32)
    b = torch.randint(-2 ** 12, 2 ** 12, (16,), generator=gen, dtype=torch.int32)
    out = torch.zeros(16, dtype=torch.int32)
    _integer_arithmetic[(1,)](a, b, out, 2 ** 30, BLOCK=16)
    return a, b, out


def test_overflow_checks_are_dropped_by_the_interpreter_and_skipping_them_changes_nothing():
    a, b, out = _integers()
    # int32 arithmetic wrapped around (numpy's, as a GPU's would), no assertion failed
    exact = ((a.long() * b.long() + 3 * 2 ** 30 - b.long()) % 2 ** 16)
    exact = torch.where(exact >= 2 ** 15, exact - 2 ** 16, exact)            # to int16
    exact = (exact * 1000) % 2 ** 16
    exact = torch.where(exact >= 2 ** 15, exact - 2 ** 16, exact)            # int16 again
    exact = (exact + a.long() * 7 - 12) % 2 ** 32
    exact = torch.where(exact >= 2 ** 31, exact - 2 ** 32, exact).int()
    assert torch.equal(out, exact)
    with _as_triton_ships_it():
        assert triton_compat.interpreter().interpreter_builder.options.sanitize_overflow
        _, _, shipped = _integers()
    assert torch.equal(out, shipped)


def test_the_remembered_dtype_table_gives_tritons_answers():
    interp = triton_compat.interpreter()
    table = interp._get_np_dtype.__wrapped__
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64,
               tl.uint64, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5,
               tl.float8e4nv]
    types = scalars + [tl.pointer_type(t) for t in scalars]
    types += [tl.block_type(t, [4, 8]) for t in types]
    for triton_type in types * 2:                      # the second pass reads the memo
        assert interp._get_np_dtype(triton_type) == table(triton_type), triton_type
    with pytest.raises(KeyError):                      # and what Triton refuses, it refuses
        interp._get_np_dtype(tl.void)


def test_the_operator_gives_the_same_bits_as_the_interpreter_as_shipped():
    from source_kernels import multi_scale_deformable_attn
    from source_kernels.inputs import make_inputs

    def forward_and_backward():
        args = make_inputs(2, 9, 2, 4, [(5, 6), (3, 3), (1, 2)], 3, seed=5, outside=0.2,
                           requires_grad=True)
        out = multi_scale_deformable_attn(*args.values())
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
        leaves = [t for t in args.values() if t.requires_grad]
        return [out.detach()] + [t.grad for t in leaves]

    with _counting_launches() as launches:
        mine = forward_and_backward()
    with _as_triton_ships_it(), _counting_launches() as shipped_launches:
        shipped = forward_and_backward()
    # the kernels ran in the interpreter both times (a forward and a backward launch at least)
    assert launches[0] >= 2 and shipped_launches[0] == launches[0], (launches, shipped_launches)
    assert len(mine) == 4
    for got, expected in zip(mine, shipped):
        assert torch.equal(got, expected)
