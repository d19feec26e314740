"""Every typical mistake of the forward-side labs (01, 02, 04, 05), put into the lab's own
solution, is named by the visible check that follows it.

A row is one mistake a student makes: the solution cell it goes into, the text substitutions
that make it, the visible check cell that must catch it, and words that only the check's
*hint* holds (the diagnosis: "x * W - 0.5", "not c <= W", "int64", ...), so that the test fails
if the diagnosis were removed and the check only reported the wrong number.  The lab's setup,
solution and given cells run in-process with the mistake in place, then the one visible check
(not through nbgrader, to stay fast), by the runner of ``lab_cells``.

The table and the runner need nothing but torch and Triton, so that
``scripts/gpu/forward_labs_compiled.py`` runs the same rows compiled on a GPU.
"""
from __future__ import annotations

import ast

import pytest

import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)

from support import lab_cells

L01, L02, L04, L05 = ("lab01_the_spec", "lab02_tensors_are_pointers", "lab04_hello_triton",
                      "lab05_forward_correct")

LAB01_CORNERS = """    return [(y0, x0, (1 - dy) * (1 - dx)),
            (y0, x0 + 1, (1 - dy) * dx),
            (y0 + 1, x0, dy * (1 - dx)),
            (y0 + 1, x0 + 1, dy * dx)]"""
LAB04_ADD = """    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)"""
LAB05_CLAMP = """    first = tl.where(first > -2.0, first, -2.0)    # comparisons: NaN becomes -2
    first = tl.where(first < size + 1.0, first, size + 1.0)
"""
LAB05_CORNERS = """x0, dx = corner_coordinate(x, W)
    y0, dy = corner_coordinate(y, H)"""
LAB05_LOADS = [("x = tl.load(loc_ptr + 2 * p, mask=mask_q, other=0.0).to(ACC_DTYPE)",
                "x = tl.load(loc_ptr + 2 * p, mask=mask_q, other=0.0)"),
               ("y = tl.load(loc_ptr + 2 * p + 1, mask=mask_q, other=0.0).to(ACC_DTYPE)",
                "y = tl.load(loc_ptr + 2 * p + 1, mask=mask_q, other=0.0)"),
               ("a = tl.load(attn_ptr + p, mask=mask_q, other=0.0).to(ACC_DTYPE)",
                "a = tl.load(attn_ptr + p, mask=mask_q, other=0.0)")]

# (id, lab, solution cell, [(old, new)], visible check cell, words the message must hold)
MISTAKES = [
    # ---------------------------------------------------------------- lab 01
    ("01 pixel coordinate without the half pixel", L01, "lab01_corner_weights",
     [("return normalised * size - 0.5", "return normalised * size")],
     "lab01_check_corner_weights", ["x * W instead of x * W - 0.5"]),
    ("01 pixel coordinate with align_corners=True", L01, "lab01_corner_weights",
     [("return normalised * size - 0.5", "return normalised * (size - 1)")],
     "lab01_check_corner_weights", ["align_corners=True"]),
    ("01 int() instead of floor", L01, "lab01_corner_weights",
     [("x0 = math.floor(x_im)\n    y0 = math.floor(y_im)", "x0 = int(x_im)\n    y0 = int(y_im)")],
     "lab01_check_corner_weights", ["towards zero", "floor"]),
    ("01 corners as (x, y) instead of (row, col)", L01, "lab01_corner_weights",
     [(LAB01_CORNERS, """    return [(x0, y0, (1 - dy) * (1 - dx)),
            (x0 + 1, y0, (1 - dy) * dx),
            (x0, y0 + 1, dy * (1 - dx)),
            (x0 + 1, y0 + 1, dy * dx)]""")],
     "lab01_check_corner_weights", ["row and column are swapped"]),
    ("01 each corner weighted by its own area", L01, "lab01_corner_weights",
     [(LAB01_CORNERS, """    return [(y0, x0, dy * dx),
            (y0, x0 + 1, dy * (1 - dx)),
            (y0 + 1, x0, (1 - dy) * dx),
            (y0 + 1, x0 + 1, (1 - dy) * (1 - dx))]""")],
     "lab01_check_corner_weights", ["rectangle opposite"]),
    ("01 corner weights with dx where 1 - dx belongs", L01, "lab01_corner_weights",
     [(LAB01_CORNERS, """    return [(y0, x0, (1 - dy) * dx),
            (y0, x0 + 1, (1 - dy) * (1 - dx)),
            (y0 + 1, x0, dy * dx),
            (y0 + 1, x0 + 1, dy * (1 - dx))]""")],
     "lab01_check_corner_weights", ["column weights are swapped"]),
    ("01 corner weights with dy where 1 - dy belongs", L01, "lab01_corner_weights",
     [(LAB01_CORNERS, """    return [(y0, x0, dy * (1 - dx)),
            (y0, x0 + 1, dy * dx),
            (y0 + 1, x0, (1 - dy) * (1 - dx)),
            (y0 + 1, x0 + 1, (1 - dy) * dx)]""")],
     "lab01_check_corner_weights", ["row weights are swapped"]),
    ("01 sample with x and y swapped", L01, "lab01_bilinear_sample",
     [("pixel_coordinate(x, width),\n                                                    "
       "pixel_coordinate(y, height)", "pixel_coordinate(y, width),\n"
       "                                                    pixel_coordinate(x, height)")],
     "lab01_check_bilinear_sample", ["x and y are swapped"]),
    ("01 sample with row <= H (index past the map)", L01, "lab01_bilinear_sample",
     [("if 0 <= row < height and 0 <= col < width:", "if 0 <= row <= height and 0 <= col <= width:")],
     "lab01_check_bilinear_sample", ["one past the last", "corner"]),
    ("01 sample without the test >= 0 (index -1 wraps)", L01, "lab01_bilinear_sample",
     [("if 0 <= row < height and 0 <= col < width:", "if row < height and col < width:")],
     "lab01_check_bilinear_sample", ["index -1 is the last"]),
    ("01 sample clamped onto the edge (border padding)", L01, "lab01_bilinear_sample",
     [("if 0 <= row < height and 0 <= col < width:\n            out = out + weight * image[row, col]",
       "out = out + weight * image[min(max(row, 0), height - 1), min(max(col, 0), width - 1)]")],
     "lab01_check_bilinear_sample", ["pads with zeros"]),
    ("01 msda_naive reads every level from row 0", L01, "lab01_msda_naive",
     [("start = int(level_start_index[lvl])", "start = 0")],
     "lab01_check_msda_naive", ["level_start_index[l]"]),
    ("01 msda_naive's output reshaped without D", L01, "lab01_msda_naive",
     [("out.reshape(batch, queries, heads * channels)", "out.reshape(batch, queries, heads)")],
     "lab01_check_msda_naive", ["raised RuntimeError", "the output is (B, Q, M*D)"]),
    ("01 msda_naive reshapes a level to (W, H)", L01, "lab01_msda_naive",
     [(".reshape(height, width, channels)", ".reshape(width, height, channels)")],
     "lab01_check_msda_naive", ["H and W are swapped"]),
    ("01 msda_naive with x and y swapped", L01, "lab01_msda_naive",
     [("x, y = sampling_locations[b, q, m, lvl, k].tolist()",
       "y, x = sampling_locations[b, q, m, lvl, k].tolist()")],
     "lab01_check_msda_naive", ["x and y are swapped"]),
    ("01 msda_naive without attention weights", L01, "lab01_msda_naive",
     [("out[b, q, m] += weight * bilinear_sample_naive", "out[b, q, m] += bilinear_sample_naive")],
     "lab01_check_msda_naive", ["attention weights are missing"]),
    ("01 msda_naive with a softmax on the given weights", L01, "lab01_msda_naive",
     [("weight = float(attention_weights[b, q, m, lvl, k])",
       "weight = float(attention_weights[b, q, m].reshape(-1).softmax(0)[lvl * points + k])")],
     "lab01_check_msda_naive", ["softmax is applied"]),
    ("01 msda_naive with a level start one row late", L01, "lab01_msda_naive",
     [("start = int(level_start_index[lvl])", "start = int(level_start_index[lvl]) + 1")],
     "lab01_check_msda_naive", ["raised RuntimeError", "level_start_index[l]"]),
    ("01 msda_naive reads every point at point 0's location", L01, "lab01_msda_naive",
     [("x, y = sampling_locations[b, q, m, lvl, k].tolist()",
       "x, y = sampling_locations[b, q, m, lvl, 0].tolist()")],
     "lab01_check_msda_naive", ["location's index ignores the point"]),
    ("01 msda_naive with the channels before the heads", L01, "lab01_msda_naive",
     [("return out.reshape(batch, queries, heads * channels)",
       "return out.transpose(2, 3).reshape(batch, queries, heads * channels)")],
     "lab01_check_msda_naive", ["head-major"]),
    # ---------------------------------------------------------------- lab 02
    ("02 column-major strides", L02, "lab02_strides",
     [("for k in range(len(shape) - 2, -1, -1):\n        strides[k] = strides[k + 1] * shape[k + 1]",
       "for k in range(1, len(shape)):\n        strides[k] = strides[k - 1] * shape[k - 1]")],
     "lab02_check_strides", ["column-major"]),
    ("02 flat_offset with the strides reversed", L02, "lab02_strides",
     [("return sum(i * s for i, s in zip(index, strides))",
       "return sum(i * s for i, s in zip(index, reversed(strides)))")],
     "lab02_check_strides", ["same order"]),
    ("02 row stride H instead of W", L02, "lab02_msda_flat",
     [("start + row * width + col", "start + row * height + col")],
     "lab02_check_msda_flat", ["not r * H + c", "((b*S + start + r*W + c)*M + m)*D"]),
    ("02 x and y read from swapped offsets", L02, "lab02_msda_flat",
     [("x, y = float(loc_flat[2 * p]), float(loc_flat[2 * p + 1])",
       "y, x = float(loc_flat[2 * p]), float(loc_flat[2 * p + 1])")],
     "lab02_check_msda_flat", ["x and y are swapped"]),
    ("02 no level start", L02, "lab02_msda_flat",
     [("((b * S + start + row * width + col) * M + m) * D", "((b * S + row * width + col) * M + m) * D")],
     "lab02_check_msda_flat", ["level_start_index[l]"]),
    ("02 value read as (B, M, S, D)", L02, "lab02_msda_flat",
     [("((b * S + start + row * width + col) * M + m) * D",
       "((b * M + m) * S + start + row * width + col) * D")],
     "lab02_check_msda_flat", ["rows come before the heads"]),
    ("02 sample index with points before levels", L02, "lab02_msda_flat",
     [("p = (((b * Q + q) * M + m) * L + lvl) * K + k", "p = (((b * Q + q) * M + m) * K + k) * L + lvl")],
     "lab02_check_msda_flat", ["levels before points"]),
    ("02 flat version without the half pixel", L02, "lab02_msda_flat",
     [("corner_weights(x * width - 0.5, y * height - 0.5)", "corner_weights(x * width, y * height)")],
     "lab02_check_msda_flat", ["x * W instead of x * W - 0.5"]),
    ("02 head and channel strides swapped", L02, "lab02_msda_flat",
     [("((b * S + start + row * width + col) * M + m) * D",
       "((b * S + start + row * width + col) * D) * M + m"),
      ("value_flat[v_row:v_row + D]", "value_flat[v_row:v_row + D * M:M]")],
     "lab02_check_msda_flat", ["head and channel strides are swapped"]),
    ("02 value offset without the batch term", L02, "lab02_msda_flat",
     [("((b * S + start + row * width + col) * M + m) * D", "((start + row * width + col) * M + m) * D")],
     "lab02_check_msda_flat", ["misses its batch term", "two batch elements"]),
    ("02 int32_wrap unsigned", L02, "lab02_int32",
     [("return (n + 2 ** 31) % 2 ** 32 - 2 ** 31", "return n % 2 ** 32")],
     "lab02_check_int32", ["unsigned"]),
    ("02 first overflowing batch one too early", L02, "lab02_int32",
     [("return 2 ** 31 // per_batch + 1", "return 2 ** 31 // per_batch")],
     "lab02_check_int32", ["still fits"]),
    # ---------------------------------------------------------------- lab 04
    ("04 vector add without a mask", L04, "lab04_vector_add",
     [(LAB04_ADD, "    x = tl.load(x_ptr + offs)\n    y = tl.load(y_ptr + offs)"),
      ("tl.store(out_ptr + offs, x + y, mask=mask)", "tl.store(out_ptr + offs, x + y)")],
     "lab04_check_vector_add", ["past the end of x_ptr", "mask = offs < n"]),
    ("04 vector add masking only the store", L04, "lab04_vector_add",
     [(LAB04_ADD, "    x = tl.load(x_ptr + offs)\n    y = tl.load(y_ptr + offs)")],
     "lab04_check_vector_add", ["masking only the store"]),
    ("04 vector add with offs <= n", L04, "lab04_vector_add",
     [("mask = offs < n", "mask = offs <= n")],
     "lab04_check_vector_add", ["not offs <= n"]),
    ("04 vector add with n // block programs", L04, "lab04_vector_add",
     [("triton.cdiv(n, block)", "n // block")],
     "lab04_check_vector_add", ["too few programs"]),
    ("04 vector add with tl.program_id(1) on a 1-D grid", L04, "lab04_vector_add",
     [("pid = tl.program_id(0)", "pid = tl.program_id(1)")],
     "lab04_check_vector_add", ["every program computed the first block", "tl.program_id(0)"]),
    ("04 copy assuming a contiguous source", L04, "lab04_copy_2d",
     [("src.stride(0), src.stride(1),", "cols, 1,")],
     "lab04_check_copy_2d", ["as if the source were contiguous"]),
    ("04 copy masking only the rows", L04, "lab04_copy_2d",
     [("(offs_c < cols)[None, :]", "(offs_c < 1000000)[None, :]")],
     "lab04_check_copy_2d", ["past the end of src_ptr", "(offs_c < cols)"]),
    ("04 copy with the column test laid along the rows", L04, "lab04_copy_2d",
     [("(offs_c < cols)[None, :]", "(offs_c < cols)[:, None]")],
     "lab04_check_copy_2d", ["past the end of src_ptr", "switches lanes inside off"]),
    ("04 gather without other=0.0", L04, "lab04_gather_rows",
     [("mask=valid[:, None] & mask_d[None, :], other=0.0)", "mask=valid[:, None] & mask_d[None, :])")],
     "lab04_check_gather_rows", ["without other=", "other=0.0"]),
    ("04 gather without idx >= 0", L04, "lab04_gather_rows",
     [("valid = mask_i & (idx >= 0) & (idx < n_rows)", "valid = mask_i & (idx < n_rows)")],
     "lab04_check_gather_rows", ["before the start of table_ptr", "negative index"]),
    ("04 bilinear with c <= W", L04, "lab04_bilinear",
     [("(c >= 0) & (c < W)", "(c >= 0) & (c <= W)")],
     "lab04_check_bilinear", ["not c <= W", "corner (y"]),
    ("04 bilinear masking only the store", L04, "lab04_bilinear",
     [("v = tl.load(ptrs, mask=inside[:, None] & mask_d[None, :], other=0.0)", "v = tl.load(ptrs)")],
     "lab04_check_bilinear", ["before the start of image_ptr", "corner (y"]),
    ("04 bilinear without other=0.0", L04, "lab04_bilinear",
     [("mask=inside[:, None] & mask_d[None, :], other=0.0)", "mask=inside[:, None] & mask_d[None, :])")],
     "lab04_check_bilinear", ["without other=", "other=0.0"]),
    ("04 bilinear without the half pixel", L04, "lab04_bilinear",
     [("* W - 0.5", "* W"), ("* H - 0.5", "* H")],
     "lab04_check_bilinear", ["x * W instead of x * W - 0.5"]),
    ("04 bilinear truncating instead of floor", L04, "lab04_bilinear",
     [("x0 = x0f.to(tl.int32)", "x0 = x_im.to(tl.int32)"), ("y0 = y0f.to(tl.int32)", "y0 = y_im.to(tl.int32)"),
      ("dx = x_im - x0f", "dx = x_im - x_im.to(tl.int32)"), ("dy = y_im - y0f", "dy = y_im - y_im.to(tl.int32)")],
     "lab04_check_bilinear", ["towards zero"]),
    ("04 bilinear with dx where 1 - dx belongs", L04, "lab04_bilinear",
     [("(dx if corner % 2 == 1 else 1 - dx)", "(1 - dx if corner % 2 == 1 else dx)")],
     "lab04_check_bilinear", ["column weights are swapped"]),
    # no catalogue names these: the probes locate them (pixel centres, then between centres)
    ("04 bilinear with dx = x_im + x0f", L04, "lab04_bilinear",
     [("dx = x_im - x0f", "dx = x_im + x0f")],
     "lab04_check_bilinear", ["probe 'every point on a pixel centre' is the first",
                              "dx = dy = 0"]),
    ("04 bilinear masking row 0", L04, "lab04_bilinear",
     [("(r >= 0) & (r < H)", "(r > 0) & (r < H)")],
     "lab04_check_bilinear", ["probe 'every point on a pixel centre' is the first",
                              "its mask true"]),
    ("04 bilinear reading the locations at offs_n", L04, "lab04_bilinear",
     [("loc_ptr + 2 * offs_n, mask", "loc_ptr + offs_n, mask")],
     "lab04_check_bilinear", ["probe 'every point on a pixel centre' is the first",
                              "at points 1, 2, 4 of 5", "loc[2n]"]),
    ("04 bilinear with a corner's weight dx for dy", L04, "lab04_bilinear",
     [("w = (dy if corner // 2 == 1 else 1 - dy)", "w = (dx if corner // 2 == 1 else 1 - dy)")],
     "lab04_check_bilinear", ["between four pixel centres", "the pixel centres were right"]),
    ("04 bilinear with x and y swapped", L04, "lab04_bilinear",
     [("loc_ptr + 2 * offs_n, mask", "loc_ptr + 2 * offs_n + 1, mask"),
      ("loc_ptr + 2 * offs_n + 1, mask=mask_n, other=0.0).to(tl.float32) * H",
       "loc_ptr + 2 * offs_n, mask=mask_n, other=0.0).to(tl.float32) * H")],
     "lab04_check_bilinear", ["x and y are swapped"]),
    # ---------------------------------------------------------------- lab 05
    ("05 grid rounds the blocks of queries down", L05, "lab05_grid",
     [("triton.cdiv(queries, block_q)", "queries // block_q")],
     "lab05_check_grid", ["round up"]),
    ("05 program_of with the head major", L05, "lab05_grid",
     [("return (q // block_q, b * heads + m, q % block_q)",
       "return (q // block_q, m * heads + b, q % block_q)")],
     "lab05_check_grid", ["pid_bm = b * M + m"]),
    ("05 program_of without the batch element's factor", L05, "lab05_grid",
     [("return (q // block_q, b * heads + m, q % block_q)",
       "return (q // block_q, heads + m, q % block_q)")],
     "lab05_check_grid", ["yours is M + m", "pid_bm = b * M + m"]),
    ("05 program_of with the query as the tile row", L05, "lab05_grid",
     [("return (q // block_q, b * heads + m, q % block_q)", "return (q // block_q, b * heads + m, q)")],
     "lab05_check_grid", ["q % BLOCK_Q"]),
    ("05 corner without the half pixel", L05, "lab05_corner",
     [("x_im = loc * size - 0.5", "x_im = loc * size")],
     "lab05_check_corner", ["x * W instead of x * W - 0.5"]),
    ("05 corner with align_corners=True", L05, "lab05_corner",
     [("x_im = loc * size - 0.5", "x_im = loc * (size - 1)")],
     "lab05_check_corner", ["align_corners=True"]),
    ("05 corner truncating instead of floor", L05, "lab05_corner",
     [("first = tl.floor(x_im)", "first = x_im.to(tl.int32).to(tl.float32)")],
     "lab05_check_corner", ["towards zero"]),
    ("05 corner without the clamp", L05, "lab05_corner", [(LAB05_CLAMP, "")],
     "lab05_check_corner", ["does not fit in int32", "before .to(tl.int32)"]),
    ("05 corner clamped with tl.maximum (NaN passes)", L05, "lab05_corner",
     [(LAB05_CLAMP, "    first = tl.minimum(tl.maximum(first, -2.0), size + 1.0)\n")],
     "lab05_check_corner", ["NaN went through your clamp", "tl.where"]),
    ("05 corner clamped into the map", L05, "lab05_corner",
     [(LAB05_CLAMP, "    first = tl.where(first > 0.0, first, 0.0)\n"
                    "    first = tl.where(first < size - 1.0, first, size - 1.0)\n")],
     "lab05_check_corner", ["clamped into the map"]),
    ("05 level_row with r * H", L05, "lab05_offsets",
     [("return start + r * W + c", "return start + r * H + c")],
     "lab05_check_offsets", ["whatever H is"]),
    ("05 level_row without the level start", L05, "lab05_offsets",
     [("return start + r * W + c", "return r * W + c")],
     "lab05_check_offsets", ["first row is missing"]),
    ("05 value_offset in int32", L05, "lab05_offsets",
     [("b.to(tl.int64) * S", "b * S")],
     "lab05_check_offsets", ["wrapped around past 2**31", "b.to(tl.int64)"]),
    ("05 value_offset cast to int64 too late", L05, "lab05_offsets",
     [("return ((b.to(tl.int64) * S + s) * M + m) * D", "return ((b * S + s) * M + m).to(tl.int64) * D")],
     "lab05_check_offsets", ["cast before the first multiplication"]),
    ("05 sample with c <= W", L05, "lab05_sample_level",
     [("(c >= 0) & (c < W)", "(c >= 0) & (c <= W)")],
     "lab05_check_sample", ["not c <= W"]),
    ("05 sample without the map mask", L05, "lab05_sample_level",
     [("inside = mask_q & (r >= 0) & (r < H) & (c >= 0) & (c < W)", "inside = mask_q")],
     "lab05_check_sample", ["of value_ptr", "off the", "map", "c < W"]),
    ("05 sample without other=0.0", L05, "lab05_sample_level",
     [("mask=inside[:, None] & mask_d[None, :], other=0.0)", "mask=inside[:, None] & mask_d[None, :])")],
     "lab05_check_sample", ["without other=", "other=0.0"]),
    ("05 sample without the corner weights", L05, "lab05_sample_level",
     [("tile += w[:, None] * v.to(x.dtype)", "tile += v.to(x.dtype)")],
     "lab05_check_sample", ["corner weights are missing"]),
    ("05 sample with x and y swapped", L05, "lab05_sample_level",
     [(LAB05_CORNERS, "x0, dx = corner_coordinate(y, W)\n    y0, dy = corner_coordinate(x, H)")],
     "lab05_check_sample", ["x and y are swapped"]),
    ("05 sample passing W for H (row stride H)", L05, "lab05_sample_level",
     [("level_row(start, r, c, H, W)", "level_row(start, r, c, W, H)")],
     "lab05_check_sample", ["not r * H + c"]),
    ("05 sample with dx where 1 - dx belongs", L05, "lab05_sample_level",
     [("(dx if corner % 2 == 1 else 1 - dx)", "(1 - dx if corner % 2 == 1 else dx)")],
     "lab05_check_sample", ["column weights are swapped"]),
    ("05 sample accumulating in bfloat16", L05, "lab05_sample_level",
     [("tile += w[:, None] * v.to(x.dtype)",
       "tile = (tile + w[:, None] * v.to(x.dtype)).to(tl.bfloat16)")],
     "lab05_check_sample", ["bfloat16 value", "accumulated in bfloat16"]),
    ("05 sample with every corner's row from x0, y0 + i % 2", L05, "lab05_sample_level",
     [("r = y0 + corner // 2", "r = y0 + corner % 2")],
     "lab05_check_sample", ["probe: locations between pixel centres",
                            "read at (y0 + i % 2, x0 + i % 2)"]),
    ("05 sample with the lower corners a row up", L05, "lab05_sample_level",
     [("r = y0 + corner // 2", "r = y0 - corner // 2")],
     "lab05_check_sample", ["read at (y0 - i // 2, x0 + i % 2)", "row y0 - 1"]),
    ("05 sample halving every tile", L05, "lab05_sample_level",
     [("tile += w[:, None] * v.to(x.dtype)", "tile += w[:, None] * v.to(x.dtype) * 0.5")],
     "lab05_check_sample", ["0.5 times the right one"]),
    ("05 kernel decodes pid_bm the wrong way round", L05, "lab05_kernel",
     [("b = pid_bm // M\n    m = pid_bm % M", "b = pid_bm % M\n    m = pid_bm // M")],
     "lab05_check_inside", ["the index is wrong", "b = pid_bm // M"]),
    ("05 kernel decodes pid_bm the wrong way round (tile's edges)", L05, "lab05_kernel",
     [("b = pid_bm // M\n    m = pid_bm % M", "b = pid_bm % M\n    m = pid_bm // M")],
     "lab05_check_channels", ["the index is wrong", "b = pid_bm // M"]),
    ("05 kernel's attention index ignores the point", L05, "lab05_kernel",
     [("a = tl.load(attn_ptr + p,", "a = tl.load(attn_ptr + row_bqm * (L * K) + l * K,")],
     "lab05_check_inside", ["weight's index ignores the point", "level 0, point 1"]),
    ("05 kernel without attention weights", L05, "lab05_kernel",
     [("acc += a[:, None] * sample_level", "acc += sample_level")],
     "lab05_check_inside", ["attention weights are missing"]),
    ("05 kernel row index in int32", L05, "lab05_kernel",
     [("row_bqm = (b.to(tl.int64) * Q + offs_q) * M + m", "row_bqm = (b * Q + offs_q) * M + m")],
     "lab05_check_inside", ["wrapped around", "does not fit in int32", "b.to(tl.int64) * Q"]),
    ("05 kernel row int64 only at the store", L05, "lab05_kernel",
     [("row_bqm = (b.to(tl.int64) * Q + offs_q) * M + m", "row_bqm = (b * Q + offs_q) * M + m"),
      ("out_ptrs = out_ptr + (row_bqm * D)", "out_ptrs = out_ptr + (row_bqm.to(tl.int64) * D)")],
     "lab05_check_inside", ["wrapped around", "b.to(tl.int64) * Q"]),
    ("05 kernel row index without the batch element", L05, "lab05_kernel",
     [("row_bqm = (b.to(tl.int64) * Q + offs_q) * M + m", "row_bqm = (Q + offs_q) * M + m")],
     "lab05_check_inside", ["the index is wrong", "batch term b * Q lost its factor b"]),
    ("05 kernel overwrites the accumulator", L05, "lab05_kernel",
     [("acc += a[:, None] * sample_level", "acc = a[:, None] * sample_level")],
     "lab05_check_inside", ["accumulator is overwritten"]),
    ("05 kernel reads y at x's offset", L05, "lab05_kernel",
     [("y = tl.load(loc_ptr + 2 * p + 1,", "y = tl.load(loc_ptr + 2 * p,")],
     "lab05_check_inside", ["y is read where x is"]),
    ("05 kernel's level start one row late", L05, "lab05_kernel",
     [("start = tl.load(starts_ptr + l)", "start = tl.load(starts_ptr + l) + 1")],
     "lab05_check_inside", ["is +1 from the row of level 0", "level_start_index[l]"]),
    ("05 kernel reads every level from row 0", L05, "lab05_kernel",
     [("start = tl.load(starts_ptr + l)", "start = tl.load(starts_ptr) * 0")],
     "lab05_check_inside", ["level_start_index[l]"]),
    ("05 kernel loads (W, H) instead of (H, W)", L05, "lab05_kernel",
     [("H = tl.load(shapes_ptr + 2 * l).to(tl.int32)\n        W = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)",
       "W = tl.load(shapes_ptr + 2 * l).to(tl.int32)\n        H = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)")],
     "lab05_check_inside", ["H and W are swapped"]),
    ("05 kernel location loads without mask_q", L05, "lab05_kernel",
     [("x = tl.load(loc_ptr + 2 * p, mask=mask_q, other=0.0)", "x = tl.load(loc_ptr + 2 * p)")],
     "lab05_check_inside", ["past the end of loc_ptr", "mask_q"]),
    ("05 kernel inlines an unclamped cast", L05, "lab05_sample_level",
     [(LAB05_CORNERS, "x_im = x * W - 0.5\n    y_im = y * H - 0.5\n"
                      "    x0 = tl.floor(x_im).to(tl.int32)\n    y0 = tl.floor(y_im).to(tl.int32)\n"
                      "    dx = x_im - tl.floor(x_im)\n    dy = y_im - tl.floor(y_im)")],
     "lab05_check_outside", ["unclamped", "-2, W + 1"]),
    ("05 kernel store without mask_d", L05, "lab05_kernel",
     [("mask=mask_q[:, None] & mask_d[None, :])\n    ### END", "mask=mask_q[:, None])\n    ### END")],
     "lab05_check_channels", ["past the end of out_ptr", "mask_d"]),
    ("05 kernel without the fp32 conversion", L05, "lab05_kernel", LAB05_LOADS,
     "lab05_check_half", ["float16", "convert every loaded location"]),
    ("05 kernel computing float64 inputs in float32", L05, "lab05_kernel",
     [(old, old.replace(".to(ACC_DTYPE)", ".to(tl.float32)")) for old, _ in LAB05_LOADS]
     + [("acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC_DTYPE)",
         "acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)")],
     "lab05_check_half", ["hard-coded tl.float32"]),
]


# words a message must NOT hold, for mistakes whose hint used to be wrong
NOT_WORDS = {
    "04 vector add with tl.program_id(1) on a 1-D grid": ["too few programs"],
    "05 kernel decodes pid_bm the wrong way round": ["mask its loads with mask_q",
                                                     "read memory outside"],
    "05 kernel decodes pid_bm the wrong way round (tile's edges)": ["mask its loads with mask_q"],
    "05 sample accumulating in bfloat16": ["read outside", "outside the tensor"],
    "01 corner weights with dy where 1 - dy belongs": ["weighs the right column"],
    "05 kernel's level start one row late": ["a corner off the map was read"],
    "05 sample halving every tile": ["row and value offset"],
}


def _defines(source) -> bool:
    """A given cell that defines functions (lab 02's corner helper, lab 05's launcher)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.FunctionDef) for node in tree.body)


def cells(lab):
    """[(grade_id, nbgrader metadata, cell type, source)] of a lab's source notebook."""
    return [(c.grade_id, c.meta, c.kind, c.source) for c in lab_cells.cells(lab)]


visible_checks = lab_cells.visible_checks


def namespace(lab, cell_id=None, replacements=()):
    """The lab's setup, solution and function-defining given cells run in a module of their
    own, with the mistake ``replacements`` made in the solution cell ``cell_id``; returns the
    module's dict (``lab_cells.namespace``)."""
    return lab_cells.namespace(lab, {cell_id: list(replacements)} if cell_id else None)


def run_with_mistake(lab, cell_id, replacements, check_id):
    """Run the visible check ``check_id`` after the lab's cells with the mistake in place
    (``cell_id`` None: the solution as it is); returns the check's AssertionError message,
    None when it passed."""
    return lab_cells.run_check(namespace(lab, cell_id, replacements), lab, check_id)


@pytest.mark.parametrize("name, lab, cell_id, replacements, check_id, words", MISTAKES,
                         ids=[row[0] for row in MISTAKES])
def test_visible_check_names_the_mistake(name, lab, cell_id, replacements, check_id, words,
                                         capsys):
    message = run_with_mistake(lab, cell_id, replacements, check_id)
    assert message is not None, f"{check_id} passed with the mistake in place"
    assert "Hint:" in message, message
    for word in words:
        assert word in message, f"{word!r} not in the message:\n{message}"
    for word in NOT_WORDS.get(name, ()):
        assert word not in message, f"the wrong hint {word!r} is back:\n{message}"


def test_not_words_name_rows_of_the_table():
    names = {row[0] for row in MISTAKES}
    assert set(NOT_WORDS) <= names, set(NOT_WORDS) - names


def test_off_map_corners_are_listed_by_name():
    """The list of a sample's corners off the map names each corner whole (it once printed
    'level 1 point 1 (y0,, level 1 point 1 (y0,')."""
    import torch

    from autograde.checks import diagnose
    value = torch.randn(1, 4, 1, 2, dtype=torch.float64)
    args = (value, torch.tensor([[2, 2]]), torch.tensor([0]),
            torch.tensor([[[[[[0.0, 0.0]]]]]], dtype=torch.float64),
            torch.ones(1, 1, 1, 1, 1, dtype=torch.float64))
    got = torch.full((1, 1, 2), float("nan"), dtype=torch.float64)
    text = diagnose.explain_element(got, args, (0, 0, 0), 1e-9)
    assert "level 0 point 0 corner (y0, x0); level 0 point 0 corner (y0, x1); " \
           "level 0 point 0 corner (y1, x0)" in text, text
    assert "(y0,," not in text and "read memory outside" not in text, text


def test_every_lab_and_visible_check_has_rows():
    """The table covers each forward lab and, in lab 05, every checked step."""
    checks = {row[4] for row in MISTAKES}
    for lab in (L01, L02, L04, L05):
        missing = set(visible_checks(lab)) - checks
        assert not missing, f"{lab}: no mistake row for the visible checks {sorted(missing)}"


# (id, lab, solution cell, [(old, new)], demo cell, words its output must hold): a demo cell
# runs the student's code under the checks' guard, so a kernel that writes outside its
# tensors is reported there and the notebook goes on
DEMOS = [
    ("05 beside the spec, pid_bm decoded the wrong way round", L05, "lab05_kernel",
     [("b = pid_bm // M\n    m = pid_bm % M", "b = pid_bm % M\n    m = pid_bm // M")],
     "lab05_beside_spec", ["kernel msda_forward_kernel", "wrote past the end of out_ptr"]),
    ("05 interpreter cost, corners read without the map mask", L05, "lab05_sample_level",
     [("inside = mask_q & (r >= 0) & (r < H) & (c >= 0) & (c < W)", "inside = mask_q")],
     "lab05_interpreter_cost", ["kernel msda_forward_kernel read", "value_ptr"]),
    ("04 beside the spec, bilinear loads unmasked", L04, "lab04_bilinear",
     [("v = tl.load(ptrs, mask=inside[:, None] & mask_d[None, :], other=0.0)", "v = tl.load(ptrs)")],
     "lab04_beside_spec", ["kernel bilinear_kernel read", "image_ptr"]),
    ("04 upsampling figure, store unmasked", L04, "lab04_bilinear",
     [("tl.store(out_ptr + (offs_n * D)[:, None] + offs_d[None, :], acc,\n"
       "             mask=mask_n[:, None] & mask_d[None, :])",
       "tl.store(out_ptr + (offs_n * D)[:, None] + offs_d[None, :], acc)")],
     "lab04_fig_upsample", ["wrote past the end of out_ptr"]),
]


@pytest.mark.parametrize("lab, cell_id, replacements, demo_id, words",
                         [row[1:] for row in DEMOS], ids=[row[0] for row in DEMOS])
def test_demo_cells_run_student_code_under_the_guard(lab, cell_id, replacements, demo_id, words,
                                                     capsys):
    import matplotlib
    matplotlib.use("Agg")
    scope = namespace(lab, cell_id, replacements)
    source = next(src for gid, _, _, src in cells(lab) if gid == demo_id)
    capsys.readouterr()
    lab_cells.execute(source, f"<{lab} {demo_id}>", scope)   # must not raise (nor crash)
    out = capsys.readouterr().out
    for word in words:
        assert word in out, f"{word!r} not in the demo's output:\n{out}"


def test_demo_cells_that_run_student_code_are_guarded():
    """Every given cell of labs 04 and 05 that calls a student's kernel wrapper goes through
    guarded() (the GPU timing cell of lab 05 excepted: it runs compiled only)."""
    wrappers = {L04: ("vector_add(", "copy_2d(", "gather_rows(", "bilinear_sample_triton("),
                L05: ("msda_forward(",)}
    for lab, names in wrappers.items():
        for gid, meta, kind, source in cells(lab):
            if kind != "code" or meta.get("grade") or meta.get("solution") or _defines(source) \
                    or gid in ("lab05_gpu_timing", "lab04_gpu_timing"):
                continue
            for name in names:
                for line in source.splitlines():
                    code = line.split("#")[0]
                    assert name not in code or "guarded(" in code, \
                        f"{lab} {gid} calls {name} unguarded: {line.strip()}"


def test_hidden_check_catches_the_int32_row_index_in_the_replay():
    """The hidden check of the kernel's int64 rows judges in the grader's process, from what
    the recorded launch wrote into out (the guard's int32 report stays in the kernel)."""
    from autograde.trust import recording
    from autograde.checks import lab05

    scope = namespace(L05, "lab05_kernel", [("row_bqm = (b.to(tl.int64) * Q + offs_q) * M + m",
                                             "row_bqm = (b * Q + offs_q) * M + m")])
    recording._mode, recording._base_seed, recording._counter = "record", "replay", 0
    recording._events = []
    try:
        lab05.check_forward_int64(scope["msda_forward_kernel"])    # no verdict in the kernel
    finally:
        events, recording._events, recording._mode = recording._events, [], None
    context = recording.ReplayContext(events, "replay")
    with pytest.raises(AssertionError, match="which no program owns(.|\n)*Hint: .*int64"):
        recording.replay_check(lab05.check_forward_int64,
                               [recording.Proxy(context, "msda_forward_kernel")], {}, context)


def test_the_grading_kernel_can_build_the_probes():
    """The probes run in the grading kernel too (their results are recorded and judged in the
    grader's replay), so the module that builds them is in the kernel's view of each lab that
    uses them, and the diagnosis that judges them is not."""
    from autograde import labs

    for lab in (L01, L02, L05):
        view = labs.kernel_view(lab)
        assert "autograde.checks._operator" in view, lab
        assert "autograde.checks.diagnose" not in view, lab
