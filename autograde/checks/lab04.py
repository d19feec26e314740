"""Hidden checks of lab 04 (hello Triton): each wrapper must launch a Triton kernel of its
own and match torch on fresh inputs, small enough for the CPU interpreter."""
from __future__ import annotations

import torch

from source_kernels import reference
from source_kernels.testing import assert_close_explained

from .common import count_kernel_launches, forbid_references, fresh_generator, kernel_device


def _run(fn, *args):
    """Call ``fn`` on the kernels' device with the references forbidden; demand at least one
    kernel launch.  Returns the result on the CPU."""
    device = kernel_device()
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    with forbid_references(fn), count_kernel_launches() as launches:
        got = fn(*args)
    if launches.count == 0:
        raise AssertionError(f"{fn.__name__} launched no Triton kernel: the work has to be "
                             "done by your @triton.jit kernel, not by torch")
    return got.cpu() if isinstance(got, torch.Tensor) else got


def check_vector_add(vector_add):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for n in (1, 127, 1000):
        x = torch.randn(n, generator=gen)
        y = torch.randn(n, generator=gen)
        got = _run(vector_add, x, y)
        assert_close_explained(got, x + y, atol=0, rtol=0, axes=("element",),
                               what=f"vector_add of {n} elements (hidden check, seed {seed})",
                               hint="mask the last block: offs < n")


def check_copy_2d(copy_2d):
    gen = fresh_generator()
    seed = gen.initial_seed()
    base = torch.randn(23, 41, generator=gen)
    for name, src in (("a contiguous (23, 41)", base), ("a transposed (41, 23)", base.t()),
                      ("a strided slice", base[1::2, ::3]), ("a (1, 5)", base[:1, :5])):
        got = _run(copy_2d, src)
        if tuple(got.shape) != tuple(src.shape) or not got.is_contiguous():
            raise AssertionError(f"copy_2d of {name} tensor: expected a contiguous tensor of "
                                 f"shape {tuple(src.shape)}, got shape {tuple(got.shape)}, "
                                 f"contiguous={got.is_contiguous()} (hidden check, seed {seed})")
        assert_close_explained(got, src.contiguous(), atol=0, rtol=0, axes=("row", "column"),
                               what=f"copy_2d of {name} tensor (hidden check, seed {seed})",
                               hint="use the source's own strides, src.stride(0) and src.stride(1)")


def check_gather_rows(gather_rows):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for n_rows, channels, n_index in ((30, 8, 37), (5, 3, 9), (64, 32, 16)):
        table = torch.randn(n_rows, channels, generator=gen)
        index = torch.randint(-2, n_rows + 2, (n_index,), generator=gen)   # some out of range
        inside = (index >= 0) & (index < n_rows)
        expected = torch.where(inside[:, None], table[index.clamp(0, n_rows - 1)],
                               torch.zeros((), dtype=table.dtype))
        got = _run(gather_rows, table, index)
        assert_close_explained(got, expected, atol=0, rtol=0, axes=("output row", "channel"),
                               what=f"gather_rows of {n_index} rows from a ({n_rows}, {channels}) "
                                    f"table (hidden check, seed {seed})",
                               hint="rows outside [0, R) must read as zeros")


def check_bilinear(bilinear_sample_triton):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for height, width, channels, n in ((5, 7, 4, 21), (1, 3, 3, 10), (6, 2, 1, 5)):
        image = torch.randn(height, width, channels, generator=gen)
        loc = torch.rand(n, 2, generator=gen) * 1.3 - 0.15
        expected = torch.stack([reference.bilinear_sample_naive(image.double(), float(x), float(y))
                                for x, y in loc.tolist()]).float()
        got = _run(bilinear_sample_triton, image, loc)
        assert_close_explained(got, expected, atol=1e-5, rtol=1e-5, axes=("point", "channel"),
                               what=f"bilinear samples of a {height}x{width}x{channels} image "
                                    f"(hidden check, seed {seed})")
