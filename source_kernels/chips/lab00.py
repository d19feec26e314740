"""Chips of lab 00 (the idea): deformable attention, as a cross-attention layer, multi-scale.

Pure PyTorch.  The multi-scale layer's sampling core is the package's vectorised reference,
``source_kernels.reference.msda_grid_sample``: the operator the rest of the course rebuilds.

Conventions (those of ``source_kernels.reference``): sampling locations are (x, y) in [0, 1]
of the feature map, bilinear with zero padding and ``align_corners=False``.  Offsets predicted
by a layer are in pixels of each level and divided by (W_l, H_l) before they are added to the
query's reference point.

Graded code may call these chips in no lab: they answer lab 00, and a graded function that
calls one fails its check (book/labs.md, the chips your graded code may call).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from source_kernels.reference import msda_grid_sample

__all__ = ["deformable_attention", "DeformableCrossAttention", "MSDeformAttn",
           "init_offset_directions"]


def deformable_attention(feature, sampling_locations, attention_weights):
    """One head, one level: every query mixes K bilinear samples of one feature map.

    feature             (B, H, W, D) float
    sampling_locations  (B, Q, K, 2) float, (x, y) in [0, 1]
    attention_weights   (B, Q, K)    float
    returns             (B, Q, D)    in the dtype of ``feature``
    """
    image = feature.permute(0, 3, 1, 2)                       # (B, D, H, W)
    grid = 2 * sampling_locations - 1                         # grid_sample wants [-1, 1]
    sampled = F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros",
                            align_corners=False)              # (B, D, Q, K)
    return (sampled * attention_weights[:, None]).sum(-1).transpose(1, 2)


def init_offset_directions(linear: nn.Linear, heads: int, levels: int, points: int):
    """Start every head looking in its own direction: zero weights, and a bias that puts
    point k of head m at (k + 1) pixels along the angle 2*pi*m/heads (the direction scaled
    so that its larger component is 1), the same on every level."""
    with torch.no_grad():
        linear.weight.zero_()
        angles = torch.arange(heads, dtype=torch.float64) * (2 * math.pi / heads)
        directions = torch.stack([angles.cos(), angles.sin()], -1)          # (M, 2)
        directions = directions / directions.abs().max(-1, keepdim=True).values
        steps = torch.arange(1, points + 1, dtype=torch.float64)
        bias = directions[:, None, None, :] * steps[None, None, :, None]   # (M, 1, K, 2)
        bias = bias.expand(heads, levels, points, 2)
        linear.bias.copy_(bias.reshape(-1).to(linear.bias.dtype))


class DeformableCrossAttention(nn.Module):
    """Multi-head deformable attention from queries into one feature map (one level).

    Each query predicts, from its own embedding, K pixel offsets around its reference point
    and K attention weights per head; each head samples its own slice of the projected
    memory there.
    """

    def __init__(self, embed_dim=32, heads=4, points=4):
        super().__init__()
        assert embed_dim % heads == 0
        self.embed_dim, self.heads, self.points = embed_dim, heads, points
        self.value_proj = nn.Linear(embed_dim, embed_dim)
        self.sampling_offsets = nn.Linear(embed_dim, heads * points * 2)
        self.attention_weights = nn.Linear(embed_dim, heads * points)
        self.output_proj = nn.Linear(embed_dim, embed_dim)
        init_offset_directions(self.sampling_offsets, heads, 1, points)
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)

    def forward(self, query, reference_points, memory, spatial_shape):
        """query (B, Q, C); reference_points (B, Q, 2) in [0, 1]; memory (B, H*W, C) in
        row-major (row, column) order; spatial_shape (H, W) ints.  Returns (B, Q, C)."""
        batch, queries, _ = query.shape
        height, width = spatial_shape
        heads, points = self.heads, self.points
        head_dim = self.embed_dim // heads
        value = self.value_proj(memory).view(batch, height, width, heads, head_dim)
        offsets = self.sampling_offsets(query).view(batch, queries, heads, points, 2)
        weights = self.attention_weights(query).view(batch, queries, heads, points).softmax(-1)
        normaliser = torch.tensor([width, height], dtype=query.dtype, device=query.device)
        locations = reference_points[:, :, None, None, :] + offsets / normaliser
        per_head = [deformable_attention(value[..., m, :], locations[:, :, m], weights[:, :, m])
                    for m in range(heads)]                    # M x (B, Q, D)
        return self.output_proj(torch.cat(per_head, dim=-1))


class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention: every head samples K points on each of L levels,
    and the attention weights are normalised over all L*K samples of a head."""

    def __init__(self, embed_dim=32, heads=4, levels=2, points=2):
        super().__init__()
        assert embed_dim % heads == 0
        self.embed_dim, self.heads, self.levels, self.points = embed_dim, heads, levels, points
        self.value_proj = nn.Linear(embed_dim, embed_dim)
        self.sampling_offsets = nn.Linear(embed_dim, heads * levels * points * 2)
        self.attention_weights = nn.Linear(embed_dim, heads * levels * points)
        self.output_proj = nn.Linear(embed_dim, embed_dim)
        init_offset_directions(self.sampling_offsets, heads, levels, points)
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)

    def sampling(self, query, reference_points, spatial_shapes):
        """query (B, Q, C); reference_points (B, Q, 2) in [0, 1]; spatial_shapes (L, 2) int64
        (H, W).  Returns sampling_locations (B, Q, M, L, K, 2) and attention_weights
        (B, Q, M, L, K), the weights of each (query, head) summing to 1 over L*K."""
        batch, queries, _ = query.shape
        heads, levels, points = self.heads, self.levels, self.points
        offsets = self.sampling_offsets(query).view(batch, queries, heads, levels, points, 2)
        logits = self.attention_weights(query).view(batch, queries, heads, levels * points)
        weights = logits.softmax(-1).view(batch, queries, heads, levels, points)
        normaliser = spatial_shapes.flip(-1).to(query.dtype)            # (L, 2) as (W, H)
        locations = reference_points[:, :, None, None, None, :] \
            + offsets / normaliser[None, None, None, :, None, :]
        return locations, weights

    def forward(self, query, reference_points, memory, spatial_shapes, level_start_index):
        """memory (B, S, C), the L flattened maps one after the other; other arguments as in
        ``sampling``; level_start_index (L,) int64.  Returns (B, Q, C)."""
        batch, total, _ = memory.shape
        value = self.value_proj(memory).view(batch, total, self.heads, -1)
        locations, weights = self.sampling(query, reference_points, spatial_shapes)
        out = msda_grid_sample(value, spatial_shapes, level_start_index, locations, weights)
        return self.output_proj(out)
