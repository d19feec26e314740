"""The visible checks of labs 07 and 08 name the typical mistakes of the backward pass.

Each row of ``MISTAKES`` puts one typical mistake into the lab's own solution (a text
substitution in the source notebook's solution cell), runs the visible check that follows it
in this process (not through nbgrader) and asserts that the check fails with a message naming
the mistake.  ``AUTOGRAD`` does the same for lab 07 submissions that get their gradients from
autograd: the visible check and the hidden one (as the grading kernel runs it) both fail with
the hand-written-gradients message.

Per lab, the source notebook's setup, given and solution cells run once; each mistake then
runs only its own solution cell and the check.
"""
from __future__ import annotations


import nbformat
import pytest

import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)

from support import lab_cells
from support.nbgrader_helpers import nbgrader_meta, source_notebook

LAB07, LAB08 = "lab07_the_other_direction", "lab08_concurrent_writes"
# ungraded cells that only draw, time or demonstrate: not needed to check anything
SKIP = ("fig_", "gpu_", "race_", "gradcheck", "compare_")

ATTN, LOC, VALUE = "lab07_grad_attn", "lab07_grad_loc", "lab07_grad_value"
RACY, LOST, ATOMIC, BACKWARD = ("lab08_racy_kernel", "lab08_lost_updates",
                                "lab08_atomic_kernel", "lab08_backward_kernel")
PREDICTION = '''    rows, cols = corners_of(locations, height, width)
    on_map = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    pixels = rows * width + cols
    lost = 0
    for start in range(0, pixels.shape[0], block):
        for corner in range(4):
            hit = pixels[start:start + block, corner][on_map[start:start + block, corner]]
            lost += hit.numel() - torch.unique(hit).numel()
    return int(lost)'''
NO_ON_MAP = ("on_map = mask & (r >= 0) & (r < H) & (c >= 0) & (c < W)", "on_map = mask")
ALL_LANES = "mask_q[:, None] & mask_d[None, :]"
ROW_INT32 = ("row_bqm = (b.to(tl.int64) * Q + offs_q) * M + m",
             "row_bqm = (b * Q + offs_q) * M + m")
BASE_INT32 = ("base_bm = (b.to(tl.int64) * S * M + m) * D", "base_bm = (b * S * M + m) * D")
NO_SCATTER = ("                tl.atomic_add(grad_value_ptr + offs, contrib, mask=msk)\n", "")
NO_LOC_STORE = ("""            tl.store(grad_loc_ptr + 2 * p, (a * W * grad_x_im).to(grad_loc_ptr.dtype.element_ty),
                     mask=mask_q)
            tl.store(grad_loc_ptr + 2 * p + 1, (a * H * grad_y_im).to(grad_loc_ptr.dtype.element_ty),
                     mask=mask_q)
""", "")

# (lab, mistake, solution cell, [(old, new)], visible check cell, words the message must hold)
MISTAKES = [
    # lab 07: the three gradients in PyTorch
    (LAB07, "grad_attn without the corner weights", ATTN,
     [('(c["weights"][..., None] * c["values"]).sum(dim=-2)', 'c["values"].sum(dim=-2)')],
     "lab07_check_grad_attn", ["corner weights are missing"]),
    (LAB07, "grad_attn times the attention weight", ATTN,
     [("return (samples * g).sum(dim=-1)",
       "return (samples * g).sum(dim=-1) * attention_weights")],
     "lab07_check_grad_attn", ["multiply by the attention weight"]),
    (LAB07, "grad_attn sign", ATTN,
     [("return (samples * g).sum(dim=-1)", "return -(samples * g).sum(dim=-1)")],
     "lab07_check_grad_attn", ["sign error"]),
    (LAB07, "grad_loc without W and H", LOC,
     [(' * c["width"]', ""), (' * c["height"]', "")],
     "lab07_check_grad_loc", ["factors W and H are missing"]),
    (LAB07, "grad_loc without W", LOC, [(' * c["width"]', "")],
     "lab07_check_grad_loc", ["x column lacks the factor W"]),
    (LAB07, "grad_loc with W and H swapped", LOC,
     [(' * c["width"]', ' * c["HEIGHT"]'), (' * c["height"]', ' * c["width"]'),
      ('c["HEIGHT"]', 'c["height"]')],
     "lab07_check_grad_loc", ["W and H are swapped"]),
    (LAB07, "grad_loc sign", LOC,
     [("return torch.stack([grad_x, grad_y], dim=-1)",
       "return -torch.stack([grad_x, grad_y], dim=-1)")],
     "lab07_check_grad_loc", ["sign error"]),
    (LAB07, "grad_loc sign of x", LOC,
     [("d_x_im = (1 - dy) * (gv01 - gv00) + dy * (gv11 - gv10)",
       "d_x_im = (1 - dy) * (gv00 - gv01) + dy * (gv10 - gv11)")],
     "lab07_check_grad_loc", ["x column has the wrong sign"]),
    (LAB07, "grad_loc with d_x and d_y swapped", LOC,
     [("d_x_im = (1 - dy) * (gv01 - gv00) + dy * (gv11 - gv10)",
       "d_x_im = (1 - dx) * (gv01 - gv00) + dx * (gv11 - gv10)"),
      ("d_y_im = (1 - dx) * (gv10 - gv00) + dx * (gv11 - gv01)",
       "d_y_im = (1 - dy) * (gv10 - gv00) + dy * (gv11 - gv01)")],
     "lab07_check_grad_loc", ["d_x and d_y are swapped"]),
    (LAB07, "grad_loc with x and y swapped", LOC,
     [("return torch.stack([grad_x, grad_y], dim=-1)",
       "return torch.stack([grad_y, grad_x], dim=-1)")],
     "lab07_check_grad_loc", ["x and y are swapped"]),
    (LAB07, "grad_loc without the attention weight", LOC,
     [("grad_x = attention_weights * d_x_im", "grad_x = d_x_im"),
      ("grad_y = attention_weights * d_y_im", "grad_y = d_y_im")],
     "lab07_check_grad_loc", ["attention weight is missing"]),
    (LAB07, "grad_value: corners off the map receive gradient", VALUE,
     [(' * c["inside"].to(value.dtype)', "")],
     "lab07_check_grad_value", ["corners off the map receive gradient"]),
    (LAB07, "grad_value without the attention weight", VALUE,
     [('scale = attention_weights[..., None] * c["weights"]', 'scale = c["weights"]')],
     "lab07_check_grad_value", ["attention weight is missing"]),
    (LAB07, "grad_value assigned, not added", VALUE, [("out.scatter_add_(", "out.scatter_(")],
     "lab07_check_grad_value", ["assigns", "scatter_add_"]),
    (LAB07, "grad_value sign", VALUE,
     [("contributions = scale[..., None] * g", "contributions = -scale[..., None] * g")],
     "lab07_check_grad_value", ["sign error"]),
    (LAB07, "grad_loc: the y column scaled by W", LOC, [(' * c["height"]', ' * c["width"]')],
     "lab07_check_grad_loc", ["y column is scaled by W where H belongs"]),
    (LAB07, "grad_loc: the x derivative without (1 - dy)", LOC,
     [("d_x_im = (1 - dy) * (gv01 - gv00)", "d_x_im = (gv01 - gv00)")],
     "lab07_check_grad_loc", ["x derivative lacks its (1 - d_y) factor"]),
    (LAB07, "grad_value: every contribution halved (no catalogue entry)", VALUE,
     [('scale = attention_weights[..., None] * c["weights"]',
       'scale = attention_weights[..., None] * c["weights"] * 0.5')],
     "lab07_check_grad_value", ["Located by isolation", "first wrong with one level, one point",
                                "On every probe your result is exactly 0.5 times"]),
    (LAB07, "grad_attn doubled (no catalogue entry)", ATTN,
     [("return (samples * g).sum(dim=-1)", "return (samples * g).sum(dim=-1) * 2")],
     "lab07_check_grad_attn", ["On every probe your result is exactly 2 times"]),
    (LAB07, "grad_value raises", VALUE, [("out.scatter_add_(", "out.scatter_add_(1, ")],
     "lab07_check_grad_value", ["grad_value raised TypeError", "at `out.scatter_add_(1, 2"]),
    # lab 08: the racy histogram, the prediction, the atomic histogram
    (LAB08, "racy stage written with atomics", RACY,
     [("        count = tl.load(hits_ptr + r * W + c, mask=on_map, other=0)\n"
       "        tl.store(hits_ptr + r * W + c, count + 1, mask=on_map)",
       "        tl.atomic_add(hits_ptr + r * W + c, on_map.to(tl.int32), mask=on_map)")],
     "lab08_check_racy", ["every update landed"]),
    (LAB08, "racy stage: corners off the map counted", RACY, [NO_ON_MAP],
     "lab08_check_racy", ["before the start of hits_ptr", "corners off the map are counted"]),
    (LAB08, "racy stage: the test r >= 0 left out", RACY,
     [(NO_ON_MAP[0], "on_map = mask & (r < H) & (c >= 0) & (c < W)")],
     "lab08_check_racy", ["before the start of hits_ptr",
                          "your mask lets through the corners above the map (row -1);"]),
    (LAB08, "racy stage: x * W", RACY, [("* W - 0.5", "* W"), ("* H - 0.5", "* H")],
     "lab08_check_racy", ["instead of x * W - 0.5"]),
    (LAB08, "racy stage: lanes past n read", RACY,
     [("tl.load(loc_ptr + 2 * offs, mask=mask, other=0.0)", "tl.load(loc_ptr + 2 * offs)")],
     "lab08_check_racy", ["read past the end of loc_ptr", "offs < n"]),
    (LAB08, "prediction across programs", LOST,
     [(PREDICTION, "    rows, cols = corners_of(locations, height, width)\n"
       "    on_map = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)\n"
       "    pixels = rows * width + cols\n"
       "    return int(sum(int(on_map[:, c].sum()) - torch.unique(pixels[:, c][on_map[:, c]])\n"
       "                   .numel() for c in range(4)))")],
     "lab08_check_lost", ["collisions across programs"]),
    (LAB08, "prediction across corners", LOST,
     [("        for corner in range(4):\n"
       "            hit = pixels[start:start + block, corner]"
       "[on_map[start:start + block, corner]]\n"
       "            lost += hit.numel() - torch.unique(hit).numel()",
       "        hit = pixels[start:start + block][on_map[start:start + block]]\n"
       "        lost += hit.numel() - torch.unique(hit).numel()")],
     "lab08_check_lost", ["collisions between different corners"]),
    (LAB08, "prediction counts corners off the map", LOST,
     [("hit = pixels[start:start + block, corner][on_map[start:start + block, corner]]",
       "hit = (rows * 1000 + cols)[start:start + block, corner]")],
     "lab08_check_lost", ["corners off the map"]),
    (LAB08, "prediction raises", LOST,
     [("pixels[start:start + block, corner]", "pixels[corner, start:start + block]")],
     "lab08_check_lost", ["lost_updates raised IndexError", "in lost_updates, at `hit = "]),
    (LAB08, "prediction counts collided pixels", LOST,
     [("lost += hit.numel() - torch.unique(hit).numel()",
       "lost += int((torch.unique(hit, return_counts=True)[1] > 1).sum())")],
     "lab08_check_lost", ["loses n - 1"]),
    (LAB08, "atomic stage: load + store", ATOMIC,
     [("tl.atomic_add(hits_ptr + r * W + c, on_map.to(tl.int32), mask=on_map)",
       "tl.store(hits_ptr + r * W + c,\n"
       "                 tl.load(hits_ptr + r * W + c, mask=on_map, other=0) + 1, mask=on_map)")],
     "lab08_check_atomic", ["updates are lost", "tl.atomic_add"]),
    (LAB08, "atomic stage: corners off the map counted", ATOMIC, [NO_ON_MAP],
     "lab08_check_atomic", ["hits_ptr", "corners off the map are counted"]),
    (LAB08, "atomic stage: the test c < W left out", ATOMIC,
     [(NO_ON_MAP[0], "on_map = mask & (r >= 0) & (r < H) & (c >= 0)")],
     "lab08_check_atomic", ["past the end of hits_ptr", "located by isolation",
                            "your mask lets through the corners right of the map (column W);"]),
    (LAB08, "atomic stage: only c < W kept", ATOMIC, [(NO_ON_MAP[0], "on_map = (c < W)")],
     "lab08_check_atomic", ["your mask lets through the corners above the map (row -1), below "
                            "the map (row H) and left of the map (column -1), and the lanes "
                            "past the last sample (offs >= n)"]),
    (LAB08, "atomic stage: x and y swapped", ATOMIC,
     [("tl.load(loc_ptr + 2 * offs, mask=mask", "tl.load(loc_ptr + 2 * offs + 2, mask=mask"),
      ("tl.load(loc_ptr + 2 * offs + 1, mask=mask", "tl.load(loc_ptr + 2 * offs, mask=mask"),
      ("tl.load(loc_ptr + 2 * offs + 2, mask=mask", "tl.load(loc_ptr + 2 * offs + 1, mask=mask")],
     "lab08_check_atomic", ["x and y are swapped"]),
    (LAB08, "atomic stage: truncation", ATOMIC,
     [("x0 = tl.floor(x_im).to(tl.int32)", "x0 = x_im.to(tl.int32)"),
      ("y0 = tl.floor(y_im).to(tl.int32)", "y0 = y_im.to(tl.int32)")],
     "lab08_check_atomic", ["truncated towards zero"]),
    (LAB08, "atomic stage: row stride H", ATOMIC,
     [("tl.atomic_add(hits_ptr + r * W + c,", "tl.atomic_add(hits_ptr + r * H + c,")],
     "lab08_check_atomic", ["row stride is H"]),
    # lab 08: the backward kernel, one gradient per check
    (LAB08, "kernel: grad_attn without the corner weights", BACKWARD,
     [("grad_a += wy * wx * gv", "grad_a += gv")],
     "lab08_check_backward_attn", ["corner weights are missing"]),
    (LAB08, "kernel: grad_attn sign", BACKWARD,
     [("grad_a += wy * wx * gv", "grad_a -= wy * wx * gv")],
     "lab08_check_backward_attn", ["sign error"]),
    (LAB08, "kernel: corners off the map read", BACKWARD,
     [("v = tl.load(value_ptr + offs, mask=msk, other=0.0)",
       f"v = tl.load(value_ptr + offs, mask={ALL_LANES}, other=0.0)")],
     "lab08_check_backward_attn", ["value_ptr", "corners off the map are read"]),
    (LAB08, "kernel: corners off the map read and updated", BACKWARD,
     [("msk = inside[:, None] & mask_d[None, :]", f"msk = {ALL_LANES}")],
     "lab08_check_backward_attn", ["value_ptr", "grad_value_ptr",
                                   "corners off the map are read and receive gradient"]),
    (LAB08, "kernel: grad_attn stored for lanes past Q", BACKWARD,
     [("grad_a.to(grad_attn_ptr.dtype.element_ty), mask=mask_q)",
       "grad_a.to(grad_attn_ptr.dtype.element_ty))")],
     "lab08_check_backward_attn", ["past the end of grad_attn_ptr", "offs_q < Q"]),
    (LAB08, "kernel: grad_loc without W and H", BACKWARD,
     [("(a * W * grad_x_im)", "(a * grad_x_im)"), ("(a * H * grad_y_im)", "(a * grad_y_im)")],
     "lab08_check_backward_loc", ["factors W and H are missing"]),
    (LAB08, "kernel: grad_loc sign of x", BACKWARD,
     [("sign_x = 1.0 if corner % 2 == 1 else -1.0", "sign_x = -1.0 if corner % 2 == 1 else 1.0")],
     "lab08_check_backward_loc", ["x column has the wrong sign"]),
    (LAB08, "kernel: grad_loc with d_x and d_y swapped", BACKWARD,
     [("grad_x_im += sign_x * wy * gv", "grad_x_im += sign_x * wx * gv"),
      ("grad_y_im += sign_y * wx * gv", "grad_y_im += sign_y * wy * gv")],
     "lab08_check_backward_loc", ["d_x and d_y are swapped"]),
    (LAB08, "kernel: grad_loc without the attention weight", BACKWARD,
     [("(a * W * grad_x_im)", "(W * grad_x_im)"), ("(a * H * grad_y_im)", "(H * grad_y_im)")],
     "lab08_check_backward_loc", ["attention weight is missing"]),
    (LAB08, "kernel: grad_loc with x and y swapped", BACKWARD,
     [("tl.store(grad_loc_ptr + 2 * p, (a * W", "tl.store(grad_loc_ptr + 2 * p + 1, (a * W"),
      ("tl.store(grad_loc_ptr + 2 * p + 1, (a * H", "tl.store(grad_loc_ptr + 2 * p, (a * H")],
     "lab08_check_backward_loc", ["x and y are swapped"]),
    (LAB08, "kernel: grad_value by load + store", BACKWARD,
     [("tl.atomic_add(grad_value_ptr + offs, contrib, mask=msk)",
       "tl.store(grad_value_ptr + offs,\n"
       "                         tl.load(grad_value_ptr + offs, mask=msk, other=0.0) + contrib,\n"
       "                         mask=msk)")],
     "lab08_check_backward_value", ["updates are lost", "tl.atomic_add"]),
    (LAB08, "kernel: corners off the map receive gradient", BACKWARD,
     [("tl.atomic_add(grad_value_ptr + offs, contrib, mask=msk)",
       f"tl.atomic_add(grad_value_ptr + offs, contrib, mask={ALL_LANES})")],
     "lab08_check_backward_value", ["grad_value_ptr", "corners off the map receive gradient"]),
    (LAB08, "kernel: grad_value without the attention weight", BACKWARD,
     [("contrib = ((a * wy * wx)[:, None] * g)", "contrib = ((wy * wx)[:, None] * g)")],
     "lab08_check_backward_value", ["attention weight is missing"]),
    (LAB08, "kernel: the y gradient scaled by W", BACKWARD,
     [("(a * H * grad_y_im)", "(a * W * grad_y_im)")],
     "lab08_check_backward_loc", ["y column is scaled by W where H belongs"]),
    # the lab's increments: grad_attn written, the rest not yet
    (LAB08, "kernel: grad_value not written yet", BACKWARD, [NO_SCATTER],
     "lab08_check_backward_value", ["grad_value is never written"]),
    (LAB08, "kernel: grad_value not written yet (half check)", BACKWARD, [NO_SCATTER],
     "lab08_check_backward_half", ["grad_value is never written"]),
    (LAB08, "kernel: grad_loc not written yet", BACKWARD, [NO_LOC_STORE],
     "lab08_check_backward_loc", ["grad_sampling_locations is never written"]),
    (LAB08, "kernel: channels past the first never written", BACKWARD,
     [("mask_d = offs_d < D", "mask_d = offs_d < 1")],
     "lab08_check_backward_value", ["never written", "channels 1, 2, 3"]),
    # mistakes no catalogue holds, located by the isolation probes
    (LAB08, "kernel: the level start ignores the level", BACKWARD,
     [("start = tl.load(starts_ptr + l)", "start = tl.load(starts_ptr)")],
     "lab08_check_backward_attn", ["Located by isolation", "first wrong with a second level",
                                   "level 1: its start row"]),
    (LAB08, "kernel: the attention index ignores the point", BACKWARD,
     [("a = tl.load(attn_ptr + p, mask=mask_q", "a = tl.load(attn_ptr + p - k, mask=mask_q")],
     "lab08_check_backward_value", ["first wrong with a second point",
                                    "the weight's index ignores the point k"]),
    (LAB08, "kernel: corner 00's x weight is d_x", BACKWARD,
     [("wx = dx if corner % 2 == 1 else 1 - dx", "wx = dx if corner % 2 == 1 else dx")],
     "lab08_check_backward_value", ["first wrong with one level, one point",
                                    "Your result is 0 for every element here"]),
    (LAB08, "kernel: a shape that does not broadcast", BACKWARD,
     [("gv = tl.sum(g * v, axis=1)", "gv = tl.sum(g * v, axis=0)")],
     "lab08_check_backward_attn", ["launching msda_backward_kernel raised",
                                   "at `grad_a += wy * wx * gv`"]),
    # the int32 offset class (lab 05's row index (b*Q + q)*M + m in int32)
    (LAB08, "kernel: the row index in int32 (grad_attn)", BACKWARD, [ROW_INT32],
     "lab08_check_backward_attn", ["wraps around past 2**31", "(b * Q + q) * M + m",
                                   "b.to(tl.int64) * Q"]),
    (LAB08, "kernel: the row index in int32 (grad_loc)", BACKWARD, [ROW_INT32],
     "lab08_check_backward_loc", ["wraps around past 2**31", "(b * Q + q) * M + m"]),
    (LAB08, "kernel: the value offset in int32", BACKWARD, [BASE_INT32],
     "lab08_check_backward_value", ["wraps around past 2**31", "(b * S * M + m) * D",
                                    "b.to(tl.int64) * S"]),
    (LAB08, "kernel: corner 01's column from the row step", BACKWARD,
     [("c = x0 + corner % 2", "c = x0 + corner // 2")],
     "lab08_check_backward_attn", ["first wrong with the location halfway between two pixels "
                                   "along x", "corner 01 (one column to the right)"]),
    (LAB08, "kernel: computes in the input dtype", BACKWARD,
     [(f"mask={ALL_LANES}, other=0.0).to(ACC_DTYPE)", f"mask={ALL_LANES}, other=0.0)"),
      ("v = tl.load(value_ptr + offs, mask=msk, other=0.0).to(ACC_DTYPE)",
       "v = tl.load(value_ptr + offs, mask=msk, other=0.0)")],
     "lab08_check_backward_half", ["right in float32 and wrong in", "ACC_DTYPE"]),
]

# lab 07 submissions that let autograd do the work: (name, solution cell, new body, check)
BODIES = {
    ATTN: '''    batch, _, heads, channels = value.shape
    c = sample_corners(value, spatial_shapes, level_start_index, sampling_locations)
    g = grad_output.reshape(batch, -1, heads, channels)[:, :, :, None, None, :]
    samples = (c["weights"][..., None] * c["values"]).sum(dim=-2)
    return (samples * g).sum(dim=-1)''',
    LOC: '''    batch, _, heads, channels = value.shape
    c = sample_corners(value, spatial_shapes, level_start_index, sampling_locations)''',
    VALUE: '''    batch, total, heads, channels = value.shape
    c = sample_corners(value, spatial_shapes, level_start_index, sampling_locations)''',
}
AUTOGRAD = [
    ("torch.autograd.grad through forward_from_corners", ATTN, '''
    attn = attention_weights.detach().requires_grad_()
    out = forward_from_corners(value, spatial_shapes, level_start_index, sampling_locations,
                               attn)
    return torch.autograd.grad(out, attn, grad_output)[0]''',
     "check_grad_attention_weights", "lab07_check_grad_attn"),
    ("names hidden from a reader, grad mode switched on", ATTN, '''
    engine = getattr(torch, "auto" + "grad")
    getattr(torch._C, "_set_" + "grad_enabled")(True)
    attn = attention_weights.detach()
    setattr(attn, "requires" + "_grad", True)
    out = forward_from_corners(value, spatial_shapes, level_start_index, sampling_locations,
                               attn)
    return getattr(engine, "gr" + "ad")(out, attn, grad_output)[0]''',
     "check_grad_attention_weights", "lab07_check_grad_attn"),
    (".backward() under torch.enable_grad", LOC, '''
    loc = sampling_locations.detach().clone()
    loc.requires_grad = True
    with torch.enable_grad():
        out = forward_from_corners(value, spatial_shapes, level_start_index, loc,
                                   attention_weights)
        (out * grad_output).sum().backward()
    return loc.grad''',
     "check_grad_sampling_locations", "lab07_check_grad_loc"),
    ("torch.func.vjp", VALUE, '''
    def forward(v):
        return forward_from_corners(v, spatial_shapes, level_start_index, sampling_locations,
                                    attention_weights)
    return torch.func.vjp(forward, value)[1](grad_output)[0]''',
     "check_grad_value", "lab07_check_grad_value"),
    ("a helper of the notebook calls autograd", VALUE, '''
    return _helper(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                   attention_weights)


def _helper(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
            attention_weights):
    leaf = value.detach().requires_grad_()
    out = forward_from_corners(leaf, spatial_shapes, level_start_index, sampling_locations,
                               attention_weights)
    return torch.autograd.grad(out, leaf, grad_output)[0]''',
     "check_grad_value", "lab07_check_grad_value"),
]
# words a check printed for these mistakes before its diagnosis confirmed its hypotheses: the
# message must not hold them now
WRONG_HINTS = {
    "grad_loc: the y column scaled by W": ["none of the usual mistakes"],
    "grad_loc: the x derivative without (1 - dy)": ["none of the usual mistakes"],
    "kernel: the y gradient scaled by W": ["none of the usual mistakes"],
    "kernel: grad_value not written yet": ["updates are lost", "none of the usual mistakes"],
    "kernel: grad_value not written yet (half check)": ["updates are lost",
                                                         "none of the usual mistakes"],
    "kernel: the attention index ignores the point": ["updates are lost"],
    "atomic stage: the test c < W left out": ["corners off the map are counted"],
    "atomic stage: only c < W kept": ["corners off the map are counted"],
    "racy stage: the test r >= 0 left out": ["corners off the map are counted"],
    # one element on a probe is some multiple of the right one: no "factor" from that
    "kernel: corner 01's column from the row step": ["a factor is wrong"],
}
HAND_WRITTEN = "the gradients are written by hand"
FUNCTIONS = {ATTN: "grad_attention_weights", LOC: "grad_sampling_locations", VALUE: "grad_value"}


# ------------------------------------------------------------------ running the notebook
def _cells(lab):
    return {c.grade_id: c for c in lab_cells.cells(lab)}


_BASES = {}


def _base(lab):
    """The namespace after the setup, given and solution cells of ``lab`` (once per lab)."""
    if lab not in _BASES:
        _BASES[lab] = lab_cells.namespace(lab, select=lab_cells.skipping(SKIP))
    return _BASES[lab]


def _with_solution(lab, grade_id, source):
    """A namespace where the cell ``grade_id`` ran with ``source`` (a module of its own, so
    that its functions' globals are not the shared base's)."""
    return lab_cells.with_cell(_base(lab), lab, grade_id, source)


def _failure(namespace, lab, check_cell):
    """The AssertionError the visible check cell raises (None when it passes)."""
    return lab_cells.run_check(namespace, lab, check_cell)


def _shown(namespace, lab, demo_cell):
    """What a demonstration cell prints (it must not raise: it shows, the checks grade)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        lab_cells.execute(_cells(lab)[demo_cell].source, f"<{lab} {demo_cell}>", namespace)
    return out.getvalue()


_inject = lab_cells.substitute


# ------------------------------------------------------------------ the tests
@pytest.mark.parametrize("lab, mistake, cell, edits, check_cell, words", MISTAKES,
                         ids=[f"{row[0][:5]}: {row[1]}" for row in MISTAKES])
def test_visible_check_names_the_mistake(lab, mistake, cell, edits, check_cell, words):
    source = _inject(_cells(lab)[cell].source, edits)
    message = _failure(_with_solution(lab, cell, source), lab, check_cell)
    assert message is not None, f"{mistake}: the visible check passed"
    assert "Hint:" in message or "uses autograd" in message, message
    for word in words:
        assert word in message, f"{mistake}: {word!r} not in the message:\n{message}"
    for word in WRONG_HINTS.get(mistake, ()):
        assert word not in message, f"{mistake}: {word!r} in the message:\n{message}"


@pytest.mark.parametrize("lab", [LAB07, LAB08])
def test_solution_passes_the_visible_checks(lab):
    """The control: the untouched solution passes every visible check of the table."""
    namespace = _base(lab)
    for check_cell in sorted({row[4] for row in MISTAKES if row[0] == lab}):
        assert _failure(namespace, lab, check_cell) is None, check_cell


@pytest.mark.parametrize("mistake, cell, body, check, check_cell", AUTOGRAD,
                         ids=[row[0] for row in AUTOGRAD])
def test_autograd_submission_fails_visible_and_hidden_checks(mistake, cell, body, check,
                                                             check_cell):
    from autograde.trust import recording
    from autograde.checks import lab07

    source = _inject(_cells(LAB07)[cell].source, [(BODIES[cell], body.strip("\n"))])
    namespace = _with_solution(LAB07, cell, source)
    message = _failure(namespace, LAB07, check_cell)
    assert message is not None and HAND_WRITTEN in message, message
    # the hidden check as the grading kernel runs it: recording, the grader's seed
    function = namespace[FUNCTIONS[cell]]
    recording._mode, recording._base_seed, recording._counter = "record", "mistakes", 0
    recording._events = []
    try:
        with pytest.raises(lab07.AutogradUsed, match=HAND_WRITTEN):
            getattr(lab07, check)(function)
    finally:
        recording._mode, recording._events = None, []


# pieces of the three derivations' answers (in the notebook's LaTeX): none may appear in a cell
# the release shows, rubric and wrap-up included
ANSWERS = [r"v_{01} - v_{00}", r"v_{11} - v_{10}", r"v_{10} - v_{00}", r"\langle g,",
           r"a_{lk} w_c", r"a\, W", r"a\,W", r"a_{lk}\, w_c", r"= s_{lk"]


def test_lab07_release_gives_no_derivation_away():
    from support.nbgrader_helpers import BEGIN_SOLUTION

    shown = [c for c in nbformat.read(source_notebook(LAB07), as_version=4).cells
             if BEGIN_SOLUTION not in c.source]
    for cell in shown:
        for answer in ANSWERS:
            assert answer not in cell.source, (nbgrader_meta(cell)["grade_id"], answer)
    solutions = "".join(c.source for c in nbformat.read(source_notebook(LAB07), as_version=4).cells
                        if BEGIN_SOLUTION in c.source)
    assert all(answer in solutions for answer in ANSWERS[:4])     # the answers themselves do


# ------------------------------------------------------------------ the demonstration cells
# (mistake, solution cell, edits, demonstration cell, words the failure must hold): a mistake
# that crashed the notebook's kernel (heap corruption) or escaped as a raw exception in a cell
# that runs the student's kernel outside a check
DEMOS = [
    ("atomic add without its corner mask", BACKWARD,
     [("tl.atomic_add(grad_value_ptr + offs, contrib, mask=msk)",
       f"tl.atomic_add(grad_value_ptr + offs, contrib, mask={ALL_LANES})")],
     "lab08_compare_lab07", ["grad_value_ptr", "every access checked",
                             "corners off the map receive gradient"]),
    ("a shape that does not broadcast", BACKWARD,
     [("gv = tl.sum(g * v, axis=1)", "gv = tl.sum(g * v, axis=0)")],
     "lab08_compare_lab07", ["your kernel beside lab 07's chips: your code raised"]),
    ("racy kernel: corners off the map counted", RACY, [NO_ON_MAP],
     "lab08_race_example", ["hits_ptr", "corners off the map are counted"]),
]


POINTS_TO_CHECKS = "the visible checks of this section grade them"


@pytest.mark.parametrize("mistake, cell, edits, demo, words", DEMOS,
                         ids=[row[0] for row in DEMOS])
def test_demonstration_cell_reports_instead_of_crashing(mistake, cell, edits, demo, words):
    """The cell runs in this process: without the guard the first row corrupts the heap.  It
    prints what the guard found and ends without raising (a demonstration grades nothing)."""
    namespace = _with_solution(LAB08, cell, _inject(_cells(LAB08)[cell].source, edits))
    if demo == "lab08_compare_lab07":                 # the launcher and backward_case it uses
        lab_cells.execute(_cells(LAB08)["lab08_backward_launcher"].source, "<launcher>", namespace)
    shown = _shown(namespace, LAB08, demo)
    for word in words + [POINTS_TO_CHECKS]:
        assert word in shown, f"{mistake}: {word!r} not in the output:\n{shown}"


def test_demonstration_cells_run_the_solution_quietly():
    namespace = _with_solution(LAB08, BACKWARD, _cells(LAB08)[BACKWARD].source)
    lab_cells.execute(_cells(LAB08)["lab08_backward_launcher"].source, "<launcher>", namespace)
    for demo in ("lab08_race_example", "lab08_compare_lab07"):
        shown = _shown(namespace, LAB08, demo)
        assert POINTS_TO_CHECKS not in shown and "raised" not in shown, (demo, shown)


# lab 07's gradcheck cell: (mistake, solution cell, edits, words its output must hold)
GRADCHECK = [
    ("grad_loc: the y column scaled by W", LOC, [(' * c["height"]', ' * c["width"]')],
     ["the gradient grad_sampling_locations returns for sampling_locations is not the one "
      "finite differences", "check.check_grad_sampling_locations"]),
    ("grad_value in (B, M, S, D)", VALUE,
     [("return out.permute(0, 2, 1, 3).contiguous()", "return out")],
     ["grad_value returned a tensor of shape (1, 1, 14, 3), where the gradient of value has "
      "its shape (1, 14, 1, 3)", "check.check_grad_value"]),
    ("grad_attn: a name not defined", ATTN,
     [("return (samples * g).sum(dim=-1)", "return (sample * g).sum(dim=-1)")],
     ["your code raised NameError (in grad_attention_weights, at "
      "`return (sample * g).sum(dim=-1)`)", "The visible check of that function"]),
    ("grad_attn not written yet", ATTN,
     [("return (samples * g).sum(dim=-1)", "raise NotImplementedError()")],
     ["not written yet", "in grad_attention_weights"]),
]


@pytest.mark.parametrize("mistake, cell, edits, words", GRADCHECK,
                         ids=[row[0] for row in GRADCHECK])
def test_gradcheck_cell_reports_instead_of_raising(mistake, cell, edits, words):
    """Lab 07's gradcheck cell: a wrong gradient (gradcheck's own failure), a wrong shape
    (autograd refuses it) or an exception of the student's code is printed in the lab's
    words, naming the function and its check; the cell does not raise."""
    namespace = _with_solution(LAB07, cell, _inject(_cells(LAB07)[cell].source, edits))
    shown = _shown(namespace, LAB07, "lab07_gradcheck")
    assert "gradcheck: True" not in shown, shown
    for word in words:
        assert word in shown, f"{mistake}: {word!r} not in the output:\n{shown}"


def test_gradcheck_cell_passes_the_solution():
    shown = _shown(_base(LAB07), LAB07, "lab07_gradcheck")
    assert shown.strip() == "gradcheck: True", shown


@pytest.mark.parametrize("edit, check", [(ROW_INT32, "check_backward_grad_attn"),
                                         (BASE_INT32, "check_backward_grad_value")],
                         ids=["row index", "value offset"])
def test_hidden_check_catches_int32_offsets(edit, check):
    """The hidden check as the grading kernel runs it (recording, the grader's seed) and the
    grader replays it: the int32 offset fails there too."""
    from autograde.trust import recording
    from autograde.checks import lab08

    namespace = _with_solution(LAB08, BACKWARD, _inject(_cells(LAB08)[BACKWARD].source, [edit]))
    secret = "int32"
    recording._mode, recording._base_seed, recording._counter = "record", secret, 0
    recording._events = []
    try:
        getattr(lab08, check)(namespace["msda_backward_kernel"])
    finally:
        events, recording._events, recording._mode = recording._events, [], None
    context = recording.ReplayContext(events, secret)
    proxy = recording.Proxy(context, "msda_backward_kernel")
    with pytest.raises(AssertionError, match="wraps around past 2"):
        recording.replay_check(getattr(lab08, check), [proxy], {}, context)


@pytest.mark.parametrize("lab, cell, check_cell, words", [
    (LAB07, VALUE, "lab07_check_grad_value", "grad_value is not written yet"),
    (LAB08, BACKWARD, "lab08_check_backward_attn", "msda_backward_kernel is not written yet"),
    (LAB08, BACKWARD, "lab08_compare_lab07", "is not written yet"),
], ids=["lab 07 function", "lab 08 kernel", "lab 08 comparison cell"])
def test_unwritten_stage_is_named_as_such(lab, cell, check_cell, words):
    """A cell as released (its body a NotImplementedError) fails its check with that said,
    not with a hint about shapes."""
    source = _cells(lab)[cell].source
    start, end = source.index("### BEGIN SOLUTION"), source.index("### END SOLUTION")
    end += len("### END SOLUTION")
    namespace = _with_solution(lab, cell, source[:start] + "raise NotImplementedError()"
                               + source[end:])
    if check_cell == "lab08_compare_lab07":
        lab_cells.execute(_cells(LAB08)["lab08_backward_launcher"].source, "<launcher>", namespace)
        message = _shown(namespace, lab, check_cell)       # a demonstration prints, no raise
    else:
        message = _failure(namespace, lab, check_cell)
    assert message is not None and words in message, message
    assert "shape" not in message, message


def test_lab08_notebook_states_the_gradients():
    """Lab 08's formulas are in its notebook (with a pointer to the student's lab 07 answers),
    not only in a chip's docstring."""
    text = "".join(c.source for c in nbformat.read(source_notebook(LAB08), as_version=4).cells
                   if c.cell_type == "markdown")
    for piece in (r"\frac{\partial \mathcal{L}}{\partial a} = \sum_c w_c\, \gamma_c",
                  r"a\, W \big[(1 - d_y)(\gamma_{01} - \gamma_{00})",
                  r"a\, H \big[(1 - d_x)(\gamma_{10} - \gamma_{00})",
                  r"$a\, w_c\, g$ to the row of `grad_value`", "your answers to lab 07"):
        assert piece in text, piece
