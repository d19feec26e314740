"""Labs 00, 03, 06, 09 and 10: every typical mistake, put into the lab's own solution, is named
by the visible check that follows its stage.

Each row of ``MISTAKES`` is one mistake: a text substitution in one solution cell of the source
notebook.  The test runs the notebook's setup, given and solution cells in a module of their
own (in this process, not through nbgrader), then the visible check cell of the stage, which
must fail with a hint that names the mistake (the pattern is searched in the hint only, so the
test fails if the diagnosis goes).  Further tests: the visible checks replay out of the kernel
as the grader replays them, lab 10's bad inputs are the test suite's, and the baselines the
diagnoses compare against equal the course's reference.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re

import pytest
import torch

import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)

from support import lab_cells

LABS = {"lab00": "lab00_the_idea", "lab03": "lab03_the_machine", "lab06": "lab06_make_it_fast",
        "lab09": "lab09_hardware_detective", "lab10": "lab10_ship_it"}
# code cells that neither define what a check needs nor are checks: figures, GPU sections,
# compilations, demonstrations
SKIP = ("fig_", "paper_gpu", "race", "sweep", "tune_here", "gpu_", "compile_sm", "compiled_",
        "cas_loop", "preset_costs", "suite", "cost_numbers", "row_stride", "wide_source",
        "narrow_and_wide", "launchers")

INSIDE = "inside = mask_q & (r >= 0) & (r < H) & (c >= 0) & (c < W)"
STRATEGY_LOOP = '''    for strategy, types in (("bf16-native", {"bf16", "bf16x2"}), ("fp16-native", {"f16", "f16x2"}),
                            ("fp32", {"f32"})):
        if any(p & types for p in adds):
            return strategy'''
TRY_RUN = ("        try:\n            out = run(config)\n        except Exception:\n"
           "            medians[config] = None\n            continue\n")
VALIDATE_CALL = ("        validate(value, value_spatial_shapes, value_level_start_index, "
                 "sampling_locations,\n                 attention_weights, im2col_step)\n")
APPLY = ("return MSDAFunction.apply(value, value_spatial_shapes, value_level_start_index,\n"
         "                              sampling_locations, attention_weights, im2col_step, "
         "fp32_grad_accum)")

# (lab, solution cell, substitutions (old, new[, count]), visible check cell, pattern in the
#  hint, the mistake)
MISTAKES = [
    # lab 00: the layers' shapes, conventions and softmax axis
    ("lab00", "deformable_attention", [("align_corners=False)", "align_corners=True)")],
     "check_deformable_attention", "align_corners=True", "align_corners=True"),
    ("lab00", "deformable_attention", [("grid = 2 * sampling_locations - 1",
                                        "grid = sampling_locations")],
     "check_deformable_attention", r"\[-1, 1\]", "grid in [0, 1] instead of [-1, 1]"),
    ("lab00", "deformable_attention", [("grid = 2 * sampling_locations - 1",
                                        "grid = (2 * sampling_locations - 1).flip(-1)")],
     "check_deformable_attention", "x and y are swapped", "x and y swapped"),
    ("lab00", "deformable_attention", [("feature.permute(0, 3, 1, 2)",
                                        "feature.permute(0, 3, 2, 1)")],
     "check_deformable_attention", "height and width are", "image as (B, D, W, H)"),
    ("lab00", "deformable_attention", [('padding_mode="zeros"', 'padding_mode="border"')],
     "check_deformable_attention", "count as zero", "border padding"),
    ("lab00", "deformable_attention", [("(sampled * attention_weights[:, None]).sum(-1)",
                                        "sampled.sum(-1)")],
     "check_deformable_attention", "multiplied by its attention weight", "no attention weights"),
    ("lab00", "deformable_attention", [(".sum(-1).transpose(1, 2)", ".sum(-1)")],
     "check_deformable_attention", r"result is \(batch, query, channel\)",
     "output left as (B, D, Q)"),
    ("lab00", "deformable_attention", [(".sum(-1).transpose(1, 2)", ".mean(-1).transpose(1, 2)")],
     "check_deformable_attention", "do not average", "mean over the points"),
    ("lab00", "deformable_attention", [("    return (sampled * attention_weights",
                                        "    (sampled * attention_weights")],
     "check_deformable_attention", "returned None: a `return` is missing",
     "the result computed, not returned"),
    ("lab00", "cross_attention", [("+ offsets / scale", "+ offsets")],
     "check_cross_attention", "offsets are in pixels", "offsets not divided by (W, H)"),
    ("lab00", "cross_attention", [("[width, height]", "[height, width]")],
     "check_cross_attention", r"not \(H, W\)", "offsets divided by (H, W)"),
    ("lab00", "cross_attention", [(".softmax(-1)", ".softmax(-2)")],
     "check_cross_attention", r"not\s+over the heads", "softmax over the heads"),
    ("lab00", "cross_attention", [(".view(batch, queries, heads, points).softmax(-1)",
                                   ".view(batch, queries, heads, points)")],
     "check_cross_attention", "go through a softmax", "no softmax"),
    ("lab00", "cross_attention",
     [("self.attention_weights(query).view(batch, queries, heads, points).softmax(-1)",
       "self.attention_weights(query).softmax(-1).view(batch, queries, heads, points)")],
     "check_cross_attention", r"all M\*K", "one softmax over all M*K samples"),
    ("lab00", "cross_attention", [(".view(batch, height, width, heads, -1)",
                                   ".view(batch, width, height, heads, -1)")],
     "check_cross_attention", "row-major", "memory viewed as (B, W, H, ...)"),
    ("lab00", "cross_attention", [(".view(batch, height, width, heads, -1)",
                                   ".view(batch, height, width, -1, heads)"),
                                  ("value[..., m, :]", "value[..., m]")],
     "check_cross_attention", "head m owns", "heads interleaved in the channels"),
    ("lab00", "cross_attention", [(".view(batch, queries, heads, points, 2)",
                                   ".view(batch, queries, points, heads, 2).transpose(2, 3)")],
     "check_cross_attention", "sampling_offsets gives", "offsets viewed as (K, M)"),
    ("lab00", "cross_attention", [("return self.output_proj(torch.cat(per_head, dim=-1))",
                                   "return torch.cat(per_head, dim=-1)")],
     "check_cross_attention", "output_proj", "no output_proj"),
    ("lab00", "cross_attention", [("self.value_proj(memory).view", "memory.view")],
     "check_cross_attention", "value_proj", "no value_proj"),
    ("lab00", "msdeform_attn",
     [("logits.softmax(-1).view(batch, queries, heads, levels, points)",
       "logits.view(batch, queries, heads, levels, points).softmax(-1)")],
     "check_msdeform_attn", "not one per level", "softmax per level"),
    ("lab00", "msdeform_attn", [("        heads, levels, points = self.heads, self.levels, "
                                 "self.points\n", "")],
     "check_msdeform_attn", "`heads` has no value when that line runs",
     "a name used before it is set"),
    ("lab00", "msdeform_attn", [("offsets / scale[:, None, :]", "offsets / scale[:1, None, :]")],
     "check_msdeform_attn", "first level's", "every level scaled by level 0's size"),
    ("lab00", "msdeform_attn", [("spatial_shapes.flip(-1).to(query.dtype)",
                                 "spatial_shapes.to(query.dtype)")],
     "check_msdeform_attn", "x goes with the width", "offsets divided by (H_l, W_l)"),
    ("lab00", "msdeform_attn", [("+ offsets / scale[:, None, :]", "+ offsets")],
     "check_msdeform_attn", "offsets are in pixels", "offsets not divided"),
    ("lab00", "msdeform_attn", [("batch, height, width, self.heads, -1)",
                                 "batch, width, height, self.heads, -1)")],
     "check_msdeform_attn", r"not\s+\(B, W_l", "a level viewed as (W_l, H_l)"),
    ("lab00", "msdeform_attn", [("start = int(level_start_index[lvl])", "start = 0")],
     "check_msdeform_attn", "level_start_index", "every level read from row 0"),
    ("lab00", "msdeform_attn", [("return self.output_proj(out)",
                                 "return self.output_proj(out / len(spatial_shapes))")],
     "check_msdeform_attn", "do not average", "levels averaged"),
    ("lab00", "msdeform_attn", [("enumerate(spatial_shapes.tolist())",
                                 "enumerate(spatial_shapes.tolist()[:-1])")],
     "check_msdeform_attn", "misses the last", "last level left out"),
    # lab 03: the sector counting, the tilings, the traffic and the prediction
    ("lab03", "sectors_and_lines", [("sectors = set()", "sectors = []"),
                                    ("sectors.update(", "sectors.extend(")],
     "check_sectors_and_lines", "distinct sectors", "a sector per lane"),
    ("lab03", "sectors_and_lines", [("(a + access_bytes - 1) // SECTOR_BYTES + 1",
                                     "a // SECTOR_BYTES + 1")],
     "check_sectors_and_lines", "first byte", "straddling accesses ignored"),
    ("lab03", "sectors_and_lines", [("(a + access_bytes - 1) //", "(a + access_bytes) //")],
     "check_sectors_and_lines", r"a \+ access_bytes - 1", "last byte off by one"),
    ("lab03", "sectors_and_lines", [("if a < 0:", "if a < -1:")],
     "check_sectors_and_lines", "idle lanes", "idle lanes counted"),
    ("lab03", "sectors_and_lines", [("return len(sectors), len(lines)",
                                     "return len(sectors), math.ceil(len(sectors) / 4)")],
     "check_sectors_and_lines", "divide the number of sectors by 4", "lines = sectors / 4"),
    ("lab03", "sectors_and_lines", [("s // (LINE_BYTES // SECTOR_BYTES)", "s // LINE_BYTES")],
     "check_sectors_and_lines", r"s // 4", "line = sector // 128"),
    ("lab03", "warp_instructions", [("for r in rows:\n            for c in range(channels):",
                                     "for c in range(channels):\n            for r in rows:")],
     "check_warp_instructions", "row by row", "wide in channel-major order"),
    ("lab03", "warp_instructions", [("lanes.append(r * stride + c * elem_bytes)",
                                     "lanes.append(r * stride + c)")],
     "check_warp_instructions", "in bytes", "channel offsets in elements"),
    ("lab03", "warp_instructions",
     [("stride = channels * elem_bytes if row_stride_bytes is None else row_stride_bytes",
       "stride = channels * elem_bytes")],
     "check_warp_instructions", "row_stride_bytes is given", "row_stride_bytes ignored"),
    ("lab03", "warp_instructions", [("lanes += [-1] * (WARP_SIZE - len(group))",
                                     "lanes += [0] * (WARP_SIZE - len(group))")],
     "check_warp_instructions", "idle lanes of a narrow", "idle narrow lanes at address 0"),
    ("lab03", "warp_instructions", [("        lanes += [-1] * (-len(lanes) % WARP_SIZE)\n", "")],
     "check_warp_instructions", "pad the last instruction", "last wide instruction not padded"),
    ("lab03", "gather_traffic", [("s, l = sectors_and_lines(lanes, elem_bytes)",
                                  "s, l = sectors_and_lines(lanes, 4)")],
     "check_gather_traffic", "pass elem_bytes", "4-byte lanes whatever the dtype"),
    ("lab03", "gather_traffic", [("useful = len(rows) * channels * elem_bytes",
                                  "useful = int(instructions.shape[0]) * 32 * elem_bytes")],
     "check_gather_traffic", "idle lanes read nothing", "idle lanes counted as useful"),
    ("lab03", "gather_traffic", [("moved = sectors * SECTOR_BYTES", "moved = lines * LINE_BYTES")],
     "check_gather_traffic", "not whole lines", "moved bytes from lines"),
    ("lab03", "gather_traffic", [('"efficiency": useful / max(moved, 1)',
                                  '"efficiency": moved / max(useful, 1)')],
     "check_gather_traffic", "not the other way", "efficiency inverted"),
    ("lab03", "gather_traffic", [('return "wide" if wide["sectors"] <= narrow["sectors"] else',
                                  'return "wide" if wide["sectors"] < narrow["sectors"] else')],
     "check_gather_traffic", "tie goes to", "a tie goes to narrow"),
    ("lab03", "gather_traffic",
     [('return "wide" if wide["sectors"] <= narrow["sectors"] else "narrow"',
       'return "wide" if wide["instructions"] <= narrow["instructions"] else "narrow"')],
     "check_gather_traffic", "not its instructions", "prediction by instructions"),
    ("lab03", "gather_traffic",
     [('return "wide" if wide["sectors"] <= narrow["sectors"] else "narrow"',
       'return "narrow" if wide["sectors"] <= narrow["sectors"] else "wide"')],
     "check_gather_traffic", "fewer sectors, not more", "prediction inverted"),
    # lab 06: the narrow kernel's masks and arithmetic, the tuner's guards
    ("lab06", "narrow_kernel", [(INSIDE, "inside = mask_q")],
     "check_narrow", "mask every corner", "no corner mask"),
    ("lab06", "narrow_kernel", [(INSIDE, "inside = mask_q & (r >= 0) & (r < H)")],
     "check_narrow", "mask c >= 0 and c < W too", "no column mask"),
    ("lab06", "narrow_kernel", [(INSIDE, "inside = mask_q & (c >= 0) & (c < W)")],
     "check_narrow", "mask r >= 0 and r < H too", "no row mask"),
    ("lab06", "narrow_kernel", [("(c < W)", "(c <= W)")],
     "check_narrow", "not c <= W", "c <= W"),
    ("lab06", "narrow_kernel", [(INSIDE, "inside = mask_q & (r < H) & (c < W)")],
     "check_narrow", "mask r >= 0 and c >= 0 too", "no lower bounds"),
    ("lab06", "narrow_kernel", [("* W - 0.5", "* W"), ("* H - 0.5", "* H")],
     "check_narrow", r"x \* W - 0.5", "no half-pixel offset"),
    ("lab06", "narrow_kernel", [("x0f = tl.floor(x_im)", "x0f = x_im.to(tl.int32).to(ACC_DTYPE)"),
                                ("y0f = tl.floor(y_im)", "y0f = y_im.to(tl.int32).to(ACC_DTYPE)")],
     "check_narrow", "truncates", "truncation instead of floor"),
    ("lab06", "narrow_kernel", [("loc_ptr + 2 * p, mask", "loc_ptr + 2 * p + 9, mask"),
                                ("loc_ptr + 2 * p + 1, mask", "loc_ptr + 2 * p, mask"),
                                ("loc_ptr + 2 * p + 9, mask", "loc_ptr + 2 * p + 1, mask")],
     "check_narrow", "x and y are swapped", "x and y swapped"),
    ("lab06", "narrow_kernel", [("s = start + (r * W + c)", "s = start + (r * H + c)")],
     "check_narrow", r"start \+ r \* W \+ c", "row stride H"),
    ("lab06", "narrow_kernel", [("value_bm + s * (M * D) + d", "value_bm + s * D + d")],
     "check_narrow", r"M \* D elements apart", "rows D apart instead of M * D"),
    ("lab06", "narrow_kernel", [("acc.to(out_ptr.dtype.element_ty), mask=mask_q)",
                                "acc.to(out_ptr.dtype.element_ty))")],
     "check_narrow", "mask the store", "store without mask_q"),
    ("lab06", "narrow_kernel", [("acc += a * w * v.to(ACC_DTYPE)", "acc += w * v.to(ACC_DTYPE)")],
     "check_narrow", "attention weights are missing", "no attention weight"),
    ("lab06", "narrow_kernel", [(".to(ACC_DTYPE)", ".to(tl.float32)", 4),
                                ("dtype=ACC_DTYPE", "dtype=tl.float32")],
     "check_narrow", "accumulate in ACC_DTYPE", "float32 arithmetic on float64 inputs"),
    ("lab06", "narrow_kernel",
     [("w = (dy if corner // 2 == 1 else 1 - dy) * (dx if corner % 2 == 1 else 1 - dx)",
       "w = (dx if corner // 2 == 1 else 1 - dx) * (dy if corner % 2 == 1 else 1 - dy)")],
     "check_narrow", "corner weights", "dx and dy swapped in the corner weights"),
    # mistakes lab 06's own table (NARROW_MISTAKES) does not hold: a probe (one term at a time)
    # catches them first, the first named by the operator's catalogue, the second located
    ("lab06", "narrow_kernel", [("tl.load(attn_ptr + p, mask", "tl.load(attn_ptr + p - k, mask")],
     "check_narrow", "weight's index ignores the point", "the weight's index ignores the point k"),
    ("lab06", "narrow_kernel", [("value_bm + s * (M * D) + d,", "value_bm + s * (M * D),")],
     "check_narrow", "adds: the channel term", "every channel reads channel 0 of value"),
    ("lab06", "tune", [(TRY_RUN, "        out = run(config)\n")],
     "check_tune", "catch the exception", "a failing configuration stops the tuning"),
    ("lab06", "tune", [("\n                or not torch.allclose(out, expected, atol=atol, rtol=rtol)",
                        "")],
     "check_tune", "differs from expected", "a wrong configuration kept"),
    ("lab06", "tune", [("not torch.allclose(out, expected, atol=atol, rtol=rtol)",
                        "not torch.equal(out, expected)")],
     "check_tune", "not exact equality", "exact equality rejects a right configuration"),
    ("lab06", "tune", [("out.shape != expected.shape\n                or out.dtype != "
                        "expected.dtype\n                or ", "")],
     "check_tune", "compare the shape", "shape not compared"),
    ("lab06", "tune", [("statistics.median(", "statistics.mean(")],
     "check_tune", "not the mean", "mean instead of median"),
    ("lab06", "tune", [("statistics.median(measure(config) for _ in range(repeats))",
                        "min(measure(config) for _ in range(repeats))")],
     "check_tune", "not the minimum", "minimum instead of median"),
    ("lab06", "tune", [("for _ in range(repeats))", "for _ in range(repeats + 1))")],
     "check_tune", "exactly `repeats` times", "one measurement too many"),
    ("lab06", "tune", [("return min(timed)[2], medians",
                        "return max((-t, i, c) for t, i, c in timed)[2], medians")],
     "check_tune", "earliest candidate", "a tie goes to the later candidate"),
    ("lab06", "tune", [('        raise RuntimeError("no candidate configuration produced the '
                        'expected output")', "        return None, medians")],
     "check_tune", "raise RuntimeError", "no error when nothing is correct"),
    # lab 09: reading PTX
    ("lab09", "atomic_instructions", [('        if tokens and tokens[0].startswith("@"):\n'
                                       '            tokens = tokens[1:]\n', "")],
     "check_atomic_instructions", "predicate", "predicated instructions missed"),
    ("lab09", "atomic_instructions",
     [('        if tokens and (tokens[0].startswith("atom.") or tokens[0].startswith("red.")):\n'
       '            found.append(tokens[0])',
       '        found += [t for t in tokens if t.startswith(("atom.", "red."))]')],
     "check_atomic_instructions", "comments", "atomics found in comments"),
    ("lab09", "atomic_instructions", [(' or tokens[0].startswith("red.")', "")],
     "check_atomic_instructions", r"red\.\* instructions are atomics", "red.* missed"),
    ("lab09", "atomic_instructions", [("    return found", "    return sorted(set(found))")],
     "check_atomic_instructions", "duplicates included", "duplicates dropped"),
    ("lab09", "atomic_instructions", [("found.append(tokens[0])", "found.append(line.strip())")],
     "check_atomic_instructions", "not the whole line", "whole lines returned"),
    ("lab09", "atomic_strategy",
     [('    if any("cas" in p for p in parts):\n        return "cas-loop"\n', ""),
      ('    return "none"', '    if any("cas" in p for p in parts):\n        return "cas-loop"\n'
                           '    return "none"')],
     "check_atomic_strategy", r"test for cas\s+before", "adds checked before the CAS"),
    ("lab09", "atomic_strategy",
     [('parts = [set(op.split(".")) for op in atomic_instructions(ptx_text)]',
       'parts = [set(tok.split(".")) for tok in ptx_text.split()]')],
     "check_atomic_strategy", "only atomic instructions count", "adds that are not atomic"),
    ("lab09", "atomic_strategy",
     [('if any("cas" in p for p in parts):',
       'if any("cas" in p for p in parts) and "add" in ptx_text.split(".cas")[0]:')],
     "check_atomic_strategy", "loop around it", "a CAS counted only after an add"),
    ("lab09", "atomic_strategy",
     [(STRATEGY_LOOP, '''    ops = [op for op in atomic_instructions(ptx_text) if ".add" in op]
    for strategy, word in (("fp16-native", "f16"), ("bf16-native", "bf16"), ("fp32", "f32")):
        if any(word in op for op in ops):
            return strategy''')],
     "check_atomic_strategy", "substring", "'f16' found inside 'bf16'"),
    ("lab09", "atomic_strategy", [('    return "none"', '    return "fp32" if adds else "none"')],
     "check_atomic_strategy", "another type", "an atomic add of another type taken as fp32"),
    ("lab09", "atomic_strategy",
     [('("fp16-native", {"f16", "f16x2"}),\n                            ("fp32", {"f32"})',
       '("fp32", {"f32"}),\n                            ("fp16-native", {"f16", "f16x2"})')],
     "check_atomic_strategy", "order bf16, f16, f32", "types checked out of order"),
    ("lab09", "switch", [("return capability is None or capability[0] < 9",
                          "return capability[0] < 9")],
     "check_switch", "CPU interpreter", "capability None not handled"),
    ("lab09", "switch", [("capability[0] < 9", "capability[0] <= 9")],
     "check_switch", "sm_90 and later", "sm_90 given the buffer"),
    ("lab09", "switch", [("if dtype != torch.bfloat16:",
                          "if dtype not in (torch.bfloat16, torch.float16):")],
     "check_switch", "only bf16 needs", "fp16 given the buffer"),
    ("lab09", "switch", [('"buffer_bytes": 4 * numel', '"buffer_bytes": itemsize * numel')],
     "check_switch", "holds fp32", "buffer in the input dtype"),
    ("lab09", "switch", [("(4 + itemsize) * numel", "4 * numel")],
     "check_switch", "reads the fp32 buffer", "conversion without the write"),
    ("lab09", "switch", [("if dtype not in (torch.float16, torch.bfloat16):",
                          "if dtype == torch.float64:")],
     "check_switch", "need no buffer", "a buffer for fp32"),
    ("lab09", "switch", [("if dtype != torch.bfloat16:", "if dtype != torch.float32:")],
     "check_switch", r"answers for torch\.float32 what bf16 should get",
     "the buffer decided for fp32, not bf16"),
    ("lab09", "switch", [('return {"buffer_bytes": 0, "conversion_bytes": 0}',
                          'return {"buffer_bytes": -1, "conversion_bytes": 0}')],
     "check_switch", "both values are 0 .*yours are -1 and 0", "fp32's cost not 0"),
    ("lab09", "switch", [("return capability is None or capability[0] < 9",
                          "return capability is None or capability[0] > 9")],
     "check_switch", "your answers are wrong for torch.bfloat16 on sm_70, ",
     "bf16 on the GPUs backwards"),
    # lab 10: the validation's words and order, the autograd Function, the operator
    ("lab10", "validate", [("### BEGIN SOLUTION\n", "### BEGIN SOLUTION\n    return None\n")],
     "check_validate", "the words the message must hold", "no validation"),
    ("lab10", "validate", [('"(x, y)")', '"x and y")')],
     "check_validate", "the test suite looks for", "the meaning in other words"),
    ("lab10", "validate",
     [('    for name in ("value", "sampling_locations", "attention_weights"):\n'
       '        if named[name].dtype not in floating:',
       '    for name in ():\n        if named[name].dtype not in floating:')],
     "check_validate", "error of another check", "the floating-dtype check left out"),
    ("lab10", "validate", [("isinstance(im2col_step, bool) or ", "")],
     "check_validate", "a bool is an int", "im2col_step=True accepted"),
    ("lab10", "validate", [('raise ValueError(f"{name} is on {t.device}',
                            'raise TypeError(f"{name} is on {t.device}')],
     "check_validate", "TypeError is for a wrong type", "TypeError for a device"),
    ("lab10", "validate", [('    if value.device.type == "cpu" and os.environ.get(',
                            '    if False and os.environ.get(')],
     "check_validate", "read os.environ when validate is called",
     "CPU inputs accepted with the kernels compiled for the GPU"),
    ("lab10", "validate", [("if h <= 0 or w <= 0:", "if h < 0 or w < 0:")],
     "check_validate", "H > 0", "a level of height 0 accepted"),
    ("lab10", "validate",
     [("    for name, t in named.items():\n        if not isinstance(t, torch.Tensor):",
       "    for name, t in ():\n        if not isinstance(t, torch.Tensor):")],
     "check_validate", "table's order", "no tensor check: AttributeError on a list"),
    ("lab10", "validate", [("    batch, total, heads, channels = value.shape\n", "")],
     "check_validate", "validate's own code fails on valid inputs",
     "a name used before it is assigned"),
    ("lab10", "validate",
     [('size("sampling_locations", 3, levels, "L levels, from value_spatial_shapes")',
       'size("sampling_locations", levels, 3, "L levels, from value_spatial_shapes")')],
     "check_validate", "your check of sampling_locations rejects a right sampling_locations",
     "a size check's axis and size swapped"),
    ("lab10", "function", [("ctx.save_for_backward(*tensors)",
                            "ctx.save_for_backward(tensors[0], tensors[3], tensors[4])")],
     "check_function", "only gets what forward kept", "3 of the 5 tensors saved"),
    ("lab10", "function", [("ctx.save_for_backward(*tensors)", "ctx.tensors = tensors"),
                           ("= ctx.saved_tensors", "= ctx.tensors")],
     "check_function", r"not as\s+attributes of ctx", "tensors kept on ctx"),
    ("lab10", "function", [("return grad_value, None, None, grad_loc, grad_attn, None, None",
                            "return grad_value, None, None, grad_loc, grad_attn, None")],
     "check_function", "one gradient per argument", "6 gradients for 7 inputs"),
    ("lab10", "function", [("return grad_value, None, None, grad_loc, grad_attn, None, None",
                            "return grad_value, None, None, grad_attn, grad_loc, None, None")],
     "check_function", "in the order of forward", "gradients out of order"),
    ("lab10", "function", [("sampling_locations.contiguous(), attention_weights.contiguous()",
                            "sampling_locations, attention_weights")],
     "check_function", "contiguous", "non-contiguous tensors handed to the kernels"),
    # (the Function's own check leaves validation to the operator's, which follows it: a
    # submission whose validate is empty loses the points of validation once)
    ("lab10", "function", [(VALIDATE_CALL, "")],
     "check_operator", "calls validate before", "forward without validation"),
    ("lab10", "operator", [("attention_weights, im2col_step, fp32_grad_accum)",
                            "attention_weights, fp32_grad_accum, im2col_step)")],
     "check_operator", "in that order", "arguments out of order"),
    ("lab10", "operator", [(APPLY, "return msda_forward(value, value_spatial_shapes, "
                                   "value_level_start_index,\n                              "
                                   "sampling_locations, attention_weights)")],
     "check_operator", r"MSDAFunction\.apply", "the launcher called without autograd"),
]


def _cells(lab):
    return [(c.grade_id, c) for c in lab_cells.cells(LABS[lab]) if c.kind == "code"]


def _run(source, name, namespace):
    """Execute a cell (Triton needs the source of each kernel: it goes into linecache)."""
    lab_cells.execute(source, name, namespace)


def _namespace(lab, upto, changes=None):
    """The lab's setup, given and solution cells before the cell ``upto`` (a grade id), run in
    a module of their own; ``changes`` maps a solution cell to its substitutions."""
    return lab_cells.namespace(LABS[lab], changes, upto=upto, select=lab_cells.skipping(SKIP),
                               quiet=True)


def _visible(lab, check_cell):
    return dict(_cells(lab))[f"{lab}_{check_cell}"].source


@pytest.mark.parametrize("row", MISTAKES, ids=lambda r: f"{r[0]}-{r[5]}")
def test_the_visible_check_names_the_mistake(row):
    lab, cell, substitutions, check_cell, pattern, _ = row
    namespace = _namespace(lab, f"{lab}_{check_cell}", {f"{lab}_{cell}": substitutions})
    with pytest.raises(AssertionError) as failed:
        with contextlib.redirect_stdout(io.StringIO()):
            _run(_visible(lab, check_cell), f"<{lab} {check_cell}>", namespace)
    message = str(failed.value)
    assert "\nHint: " in message, message
    hint = message.split("\nHint: ", 1)[1]
    assert re.search(pattern, hint), f"the hint does not name the mistake:\n{message}"


@pytest.mark.parametrize("lab", sorted(LABS))
def test_every_visible_check_passes_on_the_solution(lab):
    """The solution passes each visible cell, and each visible cell is nothing but calls of
    the lab's checks with a shown seed (or none), as the grader replays them."""
    namespace = _namespace(lab, None)
    visible = [(gid, c.source) for gid, c in _cells(lab) if c.visible_check]
    assert visible
    for gid, source in visible:
        for statement in ast.parse(source).body:
            call = statement.value
            assert isinstance(statement, ast.Expr) and isinstance(call, ast.Call), gid
            assert call.func.value.id == "check" and call.func.attr.startswith("check_"), gid
            assert all(isinstance(a, ast.Name) for a in call.args), gid
            assert all(k.arg == "seed" and isinstance(k.value, ast.Constant)
                       for k in call.keywords), gid
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            _run(source, f"<{lab} {gid}>", namespace)
        assert output.getvalue().strip(), f"{gid} prints nothing when it passes"


@pytest.mark.parametrize("lab", sorted(LABS))
def test_visible_checks_replay_out_of_the_kernel(lab):
    """Each visible check, recorded as the grading kernel records it, replays in the grader's
    process with the solution's functions replaced by the record."""
    from autograde.trust import recording

    namespace = _namespace(lab, None)
    module = importlib.import_module(f"autograde.checks.{lab}")
    for gid, cell in _cells(lab):
        if not cell.graded or cell.hidden:
            continue
        for statement in ast.parse(cell.source).body:
            call = statement.value
            check = getattr(module, call.func.attr)
            names = [a.id for a in call.args]
            kwargs = {k.arg: k.value.value for k in call.keywords}
            recording._mode, recording._base_seed, recording._counter = "record", "visible", 0
            recording._events = []
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    check(*(namespace[n] for n in names), **kwargs)
            finally:
                events, recording._events, recording._mode = recording._events, [], None
            context = recording.ReplayContext(events, "visible")
            proxies = [recording.Proxy(context, n) for n in names]
            recording.replay_check(check, proxies, kwargs, context)
            assert recording.unused_calls(context) == 0, gid


def test_lab10_tries_every_bad_input_of_the_test_suite():
    """Lab 10's bad inputs hold the suite's (tests/test_operator.py) under the same names, with
    the same words, raising what the suite expects on the same inputs."""
    from autograde.checks import lab10
    from source_kernels.validate import validate_inputs

    import test_operator

    assert set(test_operator.BAD_INPUTS) <= set(lab10.BAD_INPUTS)
    assert set(lab10.SUITE_CASES) == set(test_operator.BAD_INPUTS) | {"im2col_step 0"}
    for name, (change, error, words) in test_operator.BAD_INPUTS.items():
        _, lab_change, lab_words = lab10.BAD_INPUTS[name]
        assert lab_words == words, name
        suite_args, lab_args = test_operator._bad(change), test_operator._bad(lab_change)
        lab_args.pop("im2col_step", None)
        for args in (suite_args, lab_args):
            with pytest.raises(error, match=re.escape(words)):
                validate_inputs(**args)


def test_the_baselines_of_the_diagnoses_are_the_reference():
    """The variants the checks compare a wrong answer with start from the right answer: with
    no mistake switched on they equal the course's reference (else a diagnosis would misfire)."""
    from autograde.checks import _operator as op
    from autograde.checks import lab00, lab06, lab09
    from source_kernels.chips import lab00 as chip00
    from source_kernels.chips import lab09 as chip09
    from source_kernels.ptx import atomic_instructions

    gen = torch.Generator().manual_seed(0)
    for _, args, _ in lab06._narrow_cases(gen):
        batch, _, heads, channels = args["value"].shape
        expected = op.forward_fp64(args).view(batch, -1, heads, channels)
        torch.testing.assert_close(lab06._flat_forward(args), expected, atol=1e-12, rtol=0)
    for _, _, args in op.probes(gen, torch.float32):        # lab 06 names mistakes there too
        batch, _, heads, channels = args["value"].shape
        expected = op.forward_fp64(args).view(batch, -1, heads, channels)
        torch.testing.assert_close(lab06._flat_forward(args), expected, atol=1e-12, rtol=0)
    layer = chip00.DeformableCrossAttention(12, 3, 2).double()
    layer.load_state_dict(lab00._random_weights(gen, 12, 6))
    query = torch.randn(2, 5, 12, generator=gen, dtype=torch.float64)
    ref = torch.rand(2, 5, 2, generator=gen, dtype=torch.float64)
    memory = torch.randn(2, 24, 12, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(lab00._cross_variant(layer, query, ref, memory, (4, 6)),
                                   layer(query, ref, memory, (4, 6)))
    for what, text, expected in lab09.INSTRUCTION_LISTINGS:
        assert atomic_instructions(text) == expected, what
    for what, text, expected, _ in lab09.STRATEGY_LISTINGS:
        assert chip09.atomic_strategy(text) == expected, what


@pytest.mark.parametrize("substitutions, words", [
    ([(INSIDE, "inside = mask_q")], ["value_ptr", "every access checked",
                                     "corners off the map are read"]),
    ([], None),
], ids=["no corner mask", "the solution"])
def test_lab06_comparison_cell_runs_the_kernel_under_the_guard(substitutions, words):
    """The cell that runs the student's narrow kernel beside the wide chip reports an access
    outside a tensor (instead of reading another allocation) and goes on, printing it without
    raising (a demonstration cell that raises stops a student's run of the notebook); it is
    quiet about accesses on the solution."""
    namespace = _namespace("lab06", "lab06_narrow_and_wide",
                           {"lab06_narrow_kernel": substitutions})
    source = dict(_cells("lab06"))["lab06_narrow_and_wide"].source
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _run(source, "<lab06 narrow_and_wide>", namespace)         # must not raise
    out = printed.getvalue()
    if words is None:
        assert "every access checked" not in out and "raised" not in out, out
        assert "narrow against wide" in out, out
        return
    for word in words:
        assert word in out, out
