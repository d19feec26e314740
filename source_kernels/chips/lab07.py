"""Chips of lab 07 (the other direction): the three gradients of MSDA in plain PyTorch.

With g = grad_output[b, q, m*D:(m+1)*D], one sample (weight a, location (x, y) on a level of
H x W pixels, corners c with bilinear weights w_c and value rows v_c, zero outside the map):

    grad_attention_weights = <g, sum_c w_c v_c>
    grad_sampling_locations = a * (W * <g, (1-dy)(v01 - v00) + dy (v11 - v10)>,
                                   H * <g, (1-dx)(v10 - v00) + dx (v11 - v01)>)
    grad_value[row of corner c] += a * w_c * g

The factors W and H come from the chain rule through the pixel coordinate x * W - 0.5.

``sample_corners`` gathers what all three need; the gradient functions take the operator's
arguments plus ``grad_output`` (B, Q, M*D) and return tensors in the dtype of ``value``.

Graded code may call these chips in lab 08 (``grad_attention_weights``,
``grad_sampling_locations``, ``grad_value``, ``sample_corners``) only; in lab 07 itself and in
every other lab a graded function that calls one fails its check (book/labs.md, the chips your
graded code may call).
"""
from __future__ import annotations

import torch

__all__ = ["sample_corners", "grad_attention_weights", "grad_sampling_locations",
           "grad_value"]

CORNERS = ((0, 0), (0, 1), (1, 0), (1, 1))      # (dy, dx) steps: (y0,x0) (y0,x1) (y1,x0) (y1,x1)


def sample_corners(value, spatial_shapes, level_start_index, sampling_locations):
    """The four corners of every sample.

    Returns a dict of tensors, with P = (B, Q, M, L, K):
      rows    P + (4,) int64: row of each corner inside S (0 where the corner is outside)
      inside  P + (4,) bool: the corner lies on the map
      weights P + (4,): bilinear weights (1-dy)(1-dx), (1-dy)dx, dy(1-dx), dy dx
      dx, dy  P: fractional offsets past the top-left corner
      values  P + (4, D): the corner rows of value (zeros outside the map)
      width, height  (L, 1): W_l and H_l in the dtype of the locations, ready to broadcast
    """
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    shapes = spatial_shapes.to(device=sampling_locations.device, dtype=torch.int64)
    starts = level_start_index.to(device=sampling_locations.device, dtype=torch.int64)
    height = shapes[:, 0].to(sampling_locations.dtype)[:, None]            # (L, 1)
    width = shapes[:, 1].to(sampling_locations.dtype)[:, None]
    x_im = sampling_locations[..., 0] * width - 0.5                         # (B, Q, M, L, K)
    y_im = sampling_locations[..., 1] * height - 0.5
    x0 = torch.floor(x_im)
    y0 = torch.floor(y_im)
    dx = x_im - x0
    dy = y_im - y0
    rows, inside, weights = [], [], []
    for step_y, step_x in CORNERS:
        row = y0.long() + step_y
        col = x0.long() + step_x
        ok = (row >= 0) & (row < shapes[:, 0, None]) & (col >= 0) & (col < shapes[:, 1, None])
        s = starts[:, None] + row * shapes[:, 1, None] + col
        rows.append(torch.where(ok, s, torch.zeros_like(s)))
        inside.append(ok)
        weights.append((dy if step_y else 1 - dy) * (dx if step_x else 1 - dx))
    rows = torch.stack(rows, dim=-1)                                        # P + (4,)
    inside = torch.stack(inside, dim=-1)
    weights = torch.stack(weights, dim=-1)
    # gather: value (B, S, M, D) -> (B, M, S, D); rows -> (B, M, Q*L*K*4)
    per_head = value.permute(0, 2, 1, 3)
    index = rows.permute(0, 2, 1, 3, 4, 5).reshape(batch, heads, -1)
    gathered = torch.gather(per_head, 2, index[..., None].expand(-1, -1, -1, channels))
    values = gathered.reshape(batch, heads, queries, levels, points, 4, channels)
    values = values.permute(0, 2, 1, 3, 4, 5, 6) * inside[..., None].to(value.dtype)
    return {"rows": rows, "inside": inside, "weights": weights, "dx": dx, "dy": dy,
            "values": values, "width": width, "height": height}


def _grad_per_head(grad_output, value):
    batch, _, heads, channels = value.shape
    return grad_output.reshape(batch, -1, heads, channels)                  # (B, Q, M, D)


def grad_attention_weights(grad_output, value, spatial_shapes, level_start_index,
                           sampling_locations, attention_weights):
    """(B, Q, M, L, K): <g, bilinear sample> for every sample."""
    c = sample_corners(value, spatial_shapes, level_start_index, sampling_locations)
    g = _grad_per_head(grad_output, value)[:, :, :, None, None, :]         # (B, Q, M, 1, 1, D)
    sample = (c["weights"][..., None] * c["values"]).sum(dim=-2)           # P + (D,)
    return (sample * g).sum(dim=-1)


def grad_sampling_locations(grad_output, value, spatial_shapes, level_start_index,
                            sampling_locations, attention_weights):
    """(B, Q, M, L, K, 2): the gradient with respect to the normalised (x, y)."""
    c = sample_corners(value, spatial_shapes, level_start_index, sampling_locations)
    g = _grad_per_head(grad_output, value)[:, :, :, None, None, None, :]
    gv = (c["values"] * g).sum(dim=-1)                                      # P + (4,): <g, v_c>
    gv00, gv01, gv10, gv11 = gv.unbind(dim=-1)
    dx, dy = c["dx"], c["dy"]
    d_x_im = (1 - dy) * (gv01 - gv00) + dy * (gv11 - gv10)                 # d sample / d x_im
    d_y_im = (1 - dx) * (gv10 - gv00) + dx * (gv11 - gv01)
    grad_x = attention_weights * d_x_im * c["width"]                        # x_im = x * W - 0.5
    grad_y = attention_weights * d_y_im * c["height"]
    return torch.stack([grad_x, grad_y], dim=-1)


def grad_value(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
               attention_weights):
    """(B, S, M, D): every sample adds a * w_c * g to the row of each corner on the map."""
    batch, total, heads, channels = value.shape
    c = sample_corners(value, spatial_shapes, level_start_index, sampling_locations)
    g = _grad_per_head(grad_output, value)[:, :, :, None, None, None, :]
    scale = attention_weights[..., None] * c["weights"] * c["inside"].to(value.dtype)
    contributions = scale[..., None] * g                                    # P + (4, D)
    out = value.new_zeros(batch, heads, total, channels)
    index = c["rows"].permute(0, 2, 1, 3, 4, 5).reshape(batch, heads, -1)
    flat = contributions.permute(0, 2, 1, 3, 4, 5, 6).reshape(batch, heads, -1, channels)
    out.scatter_add_(2, index[..., None].expand(-1, -1, -1, channels), flat)
    return out.permute(0, 2, 1, 3).contiguous()
