"""The figures of the kernel chapters (book/_kernel_figures.py): the readability check fails
what it should, every figure passes it, and the SASS reader counts loads in flight."""
from __future__ import annotations


import matplotlib
import pytest

matplotlib.use("agg")
import matplotlib.pyplot as plt

import _figures
import _kernel_figures as kf

from source_kernels.inputs import level_start_index, make_inputs, pyramid_shapes


@pytest.fixture(autouse=True)
def course_style():
    _figures.use_course_style()
    yield
    plt.close("all")


def test_readability_flags_a_wide_figure_small_text_and_overlap():
    fig, ax = plt.subplots(figsize=(9.0, 3.0))
    ax.set_title("a title")
    ax.text(0.5, 0.5, "tiny", fontsize=6)
    ax.text(0.2, 0.2, "one label here")
    ax.text(0.2, 0.2, "another label")
    problems = kf.readability_problems(fig)
    assert any("wide" in p for p in problems), problems
    assert any("'tiny' is 6.0 pt" in p for p in problems), problems
    assert any("'one label here' overlaps 'another label'" in p for p in problems), problems
    with pytest.raises(ValueError, match="not readable"):
        kf.show(fig)


def test_readability_passes_a_plain_figure():
    fig, ax = plt.subplots(figsize=(6.0, 3.0))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_xlabel("x, in bytes")
    ax.legend()
    assert kf.readability_problems(fig) == []


def test_every_kernel_figure_reads_at_the_book_width():
    shapes = pyramid_shapes()
    starts = level_start_index(shapes)
    loc = make_inputs(1, 16, 1, 32, shapes, 4, seed=0)["sampling_locations"][0, :, 0]
    rows, levels = kf.corner_rows(shapes, starts, loc)
    figures = {
        "tile_gather": kf.tile_gather(shapes, starts, [rows[q * 16 + 4] for q in range(16)],
                                      1, rows[:16], levels[:16]),
        "thread_mapping bf16": kf.thread_mapping(element_bytes=2),
        "thread_mapping fp32": kf.thread_mapping(element_bytes=4),
        "program_grid": kf.program_grid(batch=2, queries=5, heads=2, block_q=2),
        "gather_scatter": kf.gather_scatter({0: [1, 3], 1: [3, 4]}, rows=6),
        "cas_timeline": kf.cas_timeline(),
        "cas_contention": kf.cas_contention(),
    }
    for name, fig in figures.items():
        assert kf.readability_problems(fig) == [], name


def test_corner_rows_marks_corners_outside_the_map():
    import torch
    shapes = torch.tensor([[4, 5]])
    starts = level_start_index(shapes)
    # (x, y) = (0.5, 0.5): pixel (2.0, 1.5), top-left corner (2, 1); x = -0.3: outside
    loc = torch.tensor([[[[0.5, 0.5]], ], [[[-0.3, 0.5]]]], dtype=torch.float64)
    rows, levels = kf.corner_rows(shapes, starts, loc)
    assert rows == [1 * 5 + 2, -1] and levels == [0, 0]


SASS = """
        /*0010*/                   IMAD R2, R0, 0x10, RZ ;
        /*0020*/               @P0 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/                   LDG.E.128 R8, desc[UR4][R12.64] ;
        /*0040*/                   LDG.E.128 R16, desc[UR4][R14.64] ;
        /*0050*/                   FADD R20, R5, R9 ;
        /*0060*/                   LDG.E.128 R24, desc[UR4][R2.64] ;
        /*0070*/                   FADD R21, R18, R27 ;
        /*0080*/                   STG.E desc[UR4][R2.64], R21 ;
"""


def test_gathers_in_flight_counts_loads_until_their_registers_are_read():
    # three loads issued before the FADD reads R5 and R9 (two of them); then one more
    assert kf.gathers_in_flight(SASS) == (4, 3)
