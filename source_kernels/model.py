"""The operator inside a model: a Deformable-DETR-style attention module and a small encoder.

``MSDeformAttn`` is multi-scale deformable attention as Zhu et al. describe it (Deformable
DETR, ICLR 2021, eq. 3 and section 4.1): for each query, a linear head on the query predicts
M x L x K sampling offsets and another one M x L x K attention weights (softmax over the L*K
samples of a head); the values are a linear projection of the flattened multi-scale feature
maps, split into M heads; the sampled, weighted values of all heads are concatenated and
projected back to ``d_model``.

Compatibility is the point of this module: its parameter names, shapes and initialisation
follow the ``MSDeformAttn`` module that the Deformable DETR release and the code bases built
on it (DINO, Mask2Former's pixel decoder) use, so a checkpoint of theirs loads with
``load_state_dict`` and the module can replace theirs line for line.  The conventions:

- parameters ``sampling_offsets`` (Linear d_model -> M*L*K*2), ``attention_weights``
  (Linear d_model -> M*L*K), ``value_proj`` and ``output_proj`` (Linear d_model -> d_model);
  the offsets are laid out (M, L, K, 2), the weights (M, L*K) before the softmax;
- initialisation: ``sampling_offsets`` has a zero weight and a bias that starts head m's
  points on the ray at angle 2*pi*m/M, the direction scaled so that its larger coordinate
  is 1 and the k-th point (k = 0..K-1) placed k+1 pixels out, the same on every level;
  ``attention_weights`` starts at zero (uniform attention after the softmax);
  ``value_proj`` and ``output_proj`` get Xavier-uniform weights and zero biases;
- ``forward(query, reference_points, input_flatten, input_spatial_shapes,
  input_level_start_index, input_padding_mask=None)``; reference points either (x, y) in
  [0, 1] (last dim 2: offsets are in pixels of each level) or boxes (cx, cy, w, h) (last
  dim 4: offsets are in units of half the box size divided by K);
- a padding mask (True = padded pixel) zeroes the projected values of padded pixels.

The sampling core is pluggable: ``core="triton"`` (default) runs the course's Triton
operator, ``core="grid_sample"`` the PyTorch reference
(:func:`source_kernels.reference.msda_grid_sample`), and a callable with the operator's
signature is taken as is.  Same weights, same inputs, either core: that is how the tests
compare them.

``DeformableEncoderLayer`` / ``DeformableEncoder`` are the encoder of the same paper (one
MSDeformAttn self-attention over all pyramid pixels plus a feed-forward block per layer,
post-norm), small enough to train on a CPU through Triton's interpreter.
``DeformableDecoderLayer`` / ``DeformableDecoder`` are the decoder's deformable part: object
queries attend to the encoder's output through MSDeformAttn cross-attention, then a
feed-forward block, each post-norm (the decoder's self-attention among queries, an ordinary
multi-head attention, is left out: it does not involve this operator).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .op import multi_scale_deformable_attn
from .reference import msda_grid_sample

__all__ = ["CORES", "resolve_core", "use_core", "MSDeformAttn", "DeformableEncoderLayer",
           "DeformableEncoder", "DeformableDecoderLayer", "DeformableDecoder",
           "encoder_reference_points", "pyramid_pixels", "sine_position_embedding",
           "jitter_offsets"]


# ----------------------------------------------------------------------------- the cores
def _triton_core(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights, im2col_step):
    # mixed_precision: a 16-bit value may come with fp32 locations and weights (autocast)
    return multi_scale_deformable_attn(value, spatial_shapes, level_start_index,
                                       sampling_locations, attention_weights, im2col_step,
                                       mixed_precision=True)


def _grid_sample_core(value, spatial_shapes, level_start_index, sampling_locations,
                      attention_weights, im2col_step):
    return msda_grid_sample(value, spatial_shapes, level_start_index, sampling_locations,
                            attention_weights)


#: name -> function(value, spatial_shapes, level_start_index, sampling_locations,
#: attention_weights, im2col_step) -> (B, Q, M*D)
CORES: dict[str, Callable] = {"triton": _triton_core, "grid_sample": _grid_sample_core}

CoreArg = Union[str, Callable]
# Cores that take a float16/bfloat16 value with float32 locations and weights as they are.
_MIXED_PRECISION_CORES = (_triton_core,)


def resolve_core(core: CoreArg) -> tuple[str, Callable]:
    """(name, function) for a core given by name ("triton", "grid_sample") or as a callable
    with the operator's signature (six arguments, the last ``im2col_step``)."""
    if callable(core):
        return getattr(core, "__name__", "custom"), core
    if core not in CORES:
        raise ValueError(f"core must be one of {sorted(CORES)} or a callable, got {core!r}")
    return core, CORES[core]


def use_core(model: nn.Module, core: CoreArg) -> nn.Module:
    """Switch every ``MSDeformAttn`` inside ``model`` to ``core``; returns ``model``."""
    for module in model.modules():
        if isinstance(module, MSDeformAttn):
            module.core = core
    return model


# ----------------------------------------------------------------------------- the module
class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention with Deformable DETR's parameters and initialisation.

    Args:
        d_model: channels C of queries and values (default 256).
        n_levels: pyramid levels L (default 4).
        n_heads: attention heads M; ``d_model`` must be divisible by it (default 8).
        n_points: sampling points K per head and level (default 4).
        core: "triton" (default), "grid_sample", or a callable with the operator's signature.
        im2col_step: passed to the core for mmcv compatibility (the Triton op checks it but
            needs no batch divisibility).
    """

    def __init__(self, d_model: int = 256, n_levels: int = 4, n_heads: int = 8,
                 n_points: int = 4, *, core: CoreArg = "triton", im2col_step: int = 64):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        self.n_points = n_points
        self.im2col_step = im2col_step
        self.core = core

        samples = n_heads * n_levels * n_points
        self.sampling_offsets = nn.Linear(d_model, samples * 2)
        self.attention_weights = nn.Linear(d_model, samples)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self._reset_parameters()

    # The core is a plain attribute, never part of the state dict: a checkpoint does not
    # say which kernel computed it.
    @property
    def core(self) -> str:
        return self._core_name

    @core.setter
    def core(self, core: CoreArg) -> None:
        self._core_name, self._core_fn = resolve_core(core)

    def initial_offset_grid(self) -> torch.Tensor:
        """The (M, L, K, 2) pixel offsets the sampling-offset bias starts from.

        Head m looks along the direction (cos, sin) of 2*pi*m/M, rescaled so that its larger
        coordinate has magnitude 1 (the point lands on the square ring of pixels around the
        reference); point k sits k+1 times that far out; all levels start alike.
        """
        angle = torch.arange(self.n_heads, dtype=torch.float64) * (2 * math.pi / self.n_heads)
        direction = torch.stack([angle.cos(), angle.sin()], dim=-1)           # (M, 2)
        direction = direction / direction.abs().amax(dim=-1, keepdim=True)
        distance = torch.arange(1, self.n_points + 1, dtype=torch.float64)   # (K,)
        grid = direction[:, None, None, :] * distance[None, None, :, None]   # (M, 1, K, 2)
        return grid.expand(self.n_heads, self.n_levels, self.n_points, 2).float()

    def _reset_parameters(self) -> None:
        with torch.no_grad():
            nn.init.zeros_(self.sampling_offsets.weight)
            self.sampling_offsets.bias.copy_(self.initial_offset_grid().reshape(-1))
            nn.init.zeros_(self.attention_weights.weight)
            nn.init.zeros_(self.attention_weights.bias)
            for linear in (self.value_proj, self.output_proj):
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)

    def sampling(self, query: torch.Tensor, reference_points: torch.Tensor,
                 input_spatial_shapes: torch.Tensor):
        """The two query heads: (sampling_locations (B, Q, M, L, K, 2) normalised to [0, 1],
        attention_weights (B, Q, M, L, K), softmaxed over L*K per head)."""
        batch, queries, _ = query.shape
        heads, levels, points = self.n_heads, self.n_levels, self.n_points
        offsets = self.sampling_offsets(query).view(batch, queries, heads, levels, points, 2)
        weights = self.attention_weights(query).view(batch, queries, heads, levels * points)
        weights = weights.softmax(-1).view(batch, queries, heads, levels, points)
        if reference_points.shape[-1] == 2:
            # offsets in pixels of each level: divide by (W_l, H_l)
            size_xy = input_spatial_shapes.flip(-1).to(offsets.dtype)        # (L, 2) as (W, H)
            locations = (reference_points[:, :, None, :, None, :]
                         + offsets / size_xy[None, None, None, :, None, :])
        elif reference_points.shape[-1] == 4:
            # boxes (cx, cy, w, h): offsets in units of half the box over K points
            centre = reference_points[:, :, None, :, None, :2]
            half_size = reference_points[:, :, None, :, None, 2:] * 0.5
            locations = centre + offsets / points * half_size
        else:
            raise ValueError("reference_points must end in 2 (x, y) or 4 (cx, cy, w, h), got "
                             f"shape {tuple(reference_points.shape)}")
        return locations, weights

    def forward(self, query: torch.Tensor, reference_points: torch.Tensor,
                input_flatten: torch.Tensor, input_spatial_shapes: torch.Tensor,
                input_level_start_index: torch.Tensor,
                input_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attend from queries to a flattened feature pyramid.

        Args:
            query: (B, Q, C) query features (position embedding already added).
            reference_points: (B, Q, L, 2) points (x, y) in [0, 1], or (B, Q, L, 4) boxes
                (cx, cy, w, h), one per query and level.
            input_flatten: (B, S, C) the pyramid's pixels, level after level, row-major,
                S = sum over levels of H_l * W_l.
            input_spatial_shapes: (L, 2) integer (H_l, W_l).
            input_level_start_index: (L,) integer offset of each level inside S.
            input_padding_mask: optional (B, S) bool, True where a pixel is padding.
        Returns:
            (B, Q, C).
        """
        batch, queries, channels = query.shape
        _, total, _ = input_flatten.shape
        if channels != self.d_model or input_flatten.shape[-1] != self.d_model:
            raise ValueError(f"query and input_flatten must have {self.d_model} channels, got "
                             f"{tuple(query.shape)} and {tuple(input_flatten.shape)}")
        if input_spatial_shapes.shape[0] != self.n_levels:
            raise ValueError(f"input_spatial_shapes has {input_spatial_shapes.shape[0]} "
                             f"levels; this module was built for n_levels={self.n_levels}")
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], 0.0)
        value = value.view(batch, total, self.n_heads, self.d_model // self.n_heads)
        locations, weights = self.sampling(query, reference_points, input_spatial_shapes)
        # Under autocast the projections come out in bf16/fp16 while the locations, built on
        # fp32 reference points, stay fp32, and they must: bf16 keeps 8 significant bits, so
        # near x = 1 rounding would move a sample by up to 2**-9 * W pixels, a third of a
        # pixel on a level 167 pixels wide.  The Triton operator takes that mix as it is
        # (16-bit values, fp32 locations and weights, arithmetic in fp32); any other core
        # gets all three in the widest of their dtypes.  The result is in the values' dtype.
        if (self._core_fn in _MIXED_PRECISION_CORES
                and value.dtype in (torch.float16, torch.bfloat16)
                and locations.dtype == torch.float32):
            output = self._core_fn(value, input_spatial_shapes, input_level_start_index,
                                   locations, weights.to(torch.float32), self.im2col_step)
            return self.output_proj(output)
        dtype = torch.promote_types(torch.promote_types(value.dtype, locations.dtype),
                                    weights.dtype)
        output = self._core_fn(value.to(dtype), input_spatial_shapes, input_level_start_index,
                               locations.to(dtype), weights.to(dtype), self.im2col_step)
        return self.output_proj(output.to(value.dtype))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_levels={self.n_levels}, n_heads={self.n_heads}, "
                f"n_points={self.n_points}, core={self.core!r}")


# ----------------------------------------------------------------------------- the encoder
def pyramid_pixels(spatial_shapes: torch.Tensor, total: int):
    """Where each of the S rows of a flattened pyramid lies: (level (S,), x (S,), y (S,),
    width (S,), height (S,)), all int64 on the shapes' device.

    Computed from the shapes by index arithmetic on their device, with S given: nothing is
    read back to the host, and every size stays the static ``total``, so that
    ``torch.compile(fullgraph=True)`` traces it without data-dependent sizes (a loop over
    ``spatial_shapes.tolist()`` makes each H and W an unbacked size of the graph, and waits
    for the device in eager mode).  Rows past the shapes' sum count as the last level's.
    """
    shapes = spatial_shapes.to(torch.int64)
    sizes = shapes[:, 0] * shapes[:, 1]
    ends = torch.cumsum(sizes, 0)
    row = torch.arange(total, device=shapes.device)
    level = torch.bucketize(row, ends, right=True).clamp_(max=shapes.shape[0] - 1)
    local = row - (ends - sizes)[level]
    height, width = shapes[level, 0], shapes[level, 1]
    return level, local % width, local // width, width, height


def encoder_reference_points(spatial_shapes: torch.Tensor, valid_ratios: torch.Tensor,
                             total: Optional[int] = None) -> torch.Tensor:
    """Reference points of the encoder: every pyramid pixel's centre, seen on every level.

    spatial_shapes: (L, 2) integer (H_l, W_l); valid_ratios: (B, L, 2) float, the (x, y)
    fraction of each level not covered by padding (all ones without padding); total: S, the
    number of pyramid pixels (read from the shapes when not given, which copies them to
    the host).
    Returns (B, S, L, 2): pixel centres normalised by the valid part of their own level,
    then rescaled into each level's valid part.
    """
    if total is None:
        total = int(spatial_shapes.to(torch.int64).prod(1).sum())
    level, x, y, width, height = pyramid_pixels(spatial_shapes.to(valid_ratios.device), total)
    dtype = valid_ratios.dtype
    ratios = valid_ratios[:, level]                                           # (B, S, 2)
    x = (x.to(dtype) + 0.5) / (ratios[..., 0] * width.to(dtype))
    y = (y.to(dtype) + 0.5) / (ratios[..., 1] * height.to(dtype))
    points = torch.stack([x, y], dim=-1)                                      # (B, S, 2)
    return points[:, :, None, :] * valid_ratios[:, None, :, :]


def sine_position_embedding(points: torch.Tensor, d_model: int,
                            temperature: float = 10000.0) -> torch.Tensor:
    """Fixed sine/cosine embedding of normalised (x, y) points (Vaswani et al. 2017, applied
    per axis as DETR does): (..., 2) -> (..., d_model), half the channels for y, half for x."""
    if d_model % 4 != 0:
        raise ValueError(f"d_model must be divisible by 4 for a 2-D sine embedding, got "
                         f"{d_model}")
    per_axis = d_model // 2
    freq = temperature ** (2 * (torch.arange(per_axis // 2, device=points.device,
                                             dtype=points.dtype)) / per_axis)
    scaled = points[..., None] * (2 * math.pi) / freq                # (..., 2, per_axis/2)
    emb = torch.cat([scaled.sin(), scaled.cos()], dim=-1)            # (..., 2, per_axis)
    return torch.cat([emb[..., 1, :], emb[..., 0, :]], dim=-1)      # y first, then x


class _AttentionThenFFN(nn.Module):
    """What an encoder and a decoder layer share: after the attention, dropout, a residual
    connection and a LayerNorm; then a ReLU feed-forward block with the same (post-norm).
    The parameter names are Deformable DETR's."""

    def add_feed_forward(self, d_model: int, d_ffn: int, dropout: float):
        """Create the layers after the attention (after it, so that a seeded model draws
        its initial weights in Deformable DETR's order)."""
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ffn)
        self.dropout2 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ffn, d_model)
        self.dropout3 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)

    def add_and_feed_forward(self, x, attended):
        x = self.norm1(x + self.dropout1(attended))
        hidden = self.linear2(self.dropout2(F.relu(self.linear1(x))))
        return self.norm2(x + self.dropout3(hidden))


class DeformableEncoderLayer(_AttentionThenFFN):
    """One encoder layer: deformable self-attention, then a ReLU feed-forward block, each
    with dropout, a residual connection and a LayerNorm after it (post-norm)."""

    def __init__(self, d_model: int = 256, d_ffn: int = 1024, dropout: float = 0.1,
                 n_levels: int = 4, n_heads: int = 8, n_points: int = 4, *,
                 core: CoreArg = "triton"):
        super().__init__()
        self.self_attn = MSDeformAttn(d_model, n_levels, n_heads, n_points, core=core)
        self.add_feed_forward(d_model, d_ffn, dropout)

    def forward(self, src, pos, reference_points, spatial_shapes, level_start_index,
                padding_mask=None):
        """src, pos: (B, S, C); reference_points (B, S, L, 2); returns (B, S, C)."""
        query = src if pos is None else src + pos
        attended = self.self_attn(query, reference_points, src, spatial_shapes,
                                  level_start_index, padding_mask)
        return self.add_and_feed_forward(src, attended)


class DeformableEncoder(nn.Module):
    """A stack of ``DeformableEncoderLayer`` over a flattened feature pyramid, with a learned
    embedding per level added to a fixed sine embedding of each pixel's position."""

    def __init__(self, num_layers: int = 6, d_model: int = 256, d_ffn: int = 1024,
                 dropout: float = 0.1, n_levels: int = 4, n_heads: int = 8,
                 n_points: int = 4, *, core: CoreArg = "triton"):
        super().__init__()
        self.d_model = d_model
        self.n_levels = n_levels
        self.level_embed = nn.Parameter(torch.empty(n_levels, d_model))
        nn.init.normal_(self.level_embed)
        self.layers = nn.ModuleList(
            DeformableEncoderLayer(d_model, d_ffn, dropout, n_levels, n_heads, n_points,
                                   core=core)
            for _ in range(num_layers))

    def position_embedding(self, spatial_shapes: torch.Tensor, total: int, dtype,
                           device) -> torch.Tensor:
        """(S, C): sine embedding of each pixel centre plus its level's embedding."""
        level, x, y, width, height = pyramid_pixels(spatial_shapes.to(device), total)
        xy = torch.stack([(x.to(dtype) + 0.5) / width.to(dtype),
                          (y.to(dtype) + 0.5) / height.to(dtype)], dim=-1)
        return sine_position_embedding(xy, self.d_model) + self.level_embed.to(dtype)[level]

    def forward(self, src: torch.Tensor, spatial_shapes: torch.Tensor,
                level_start_index: torch.Tensor, valid_ratios: Optional[torch.Tensor] = None,
                padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """src (B, S, C) flattened pyramid; spatial_shapes (L, 2); level_start_index (L,);
        valid_ratios (B, L, 2) (default: ones); padding_mask (B, S) bool.  Returns (B, S, C)."""
        batch = src.shape[0]
        if valid_ratios is None:
            valid_ratios = src.new_ones(batch, self.n_levels, 2)
        total = src.shape[1]
        reference_points = encoder_reference_points(spatial_shapes, valid_ratios, total)
        pos = self.position_embedding(spatial_shapes, total, src.dtype, src.device)[None]
        out = src
        for layer in self.layers:
            out = layer(out, pos, reference_points, spatial_shapes, level_start_index,
                        padding_mask)
        return out


class DeformableDecoderLayer(_AttentionThenFFN):
    """One decoder layer without self-attention: MSDeformAttn cross-attention from the
    queries to the flattened pyramid, then a ReLU feed-forward block, each with dropout, a
    residual connection and a LayerNorm after it (post-norm)."""

    def __init__(self, d_model: int = 256, d_ffn: int = 1024, dropout: float = 0.1,
                 n_levels: int = 4, n_heads: int = 8, n_points: int = 4, *,
                 core: CoreArg = "triton"):
        super().__init__()
        self.cross_attn = MSDeformAttn(d_model, n_levels, n_heads, n_points, core=core)
        self.add_feed_forward(d_model, d_ffn, dropout)

    def forward(self, tgt, query_pos, reference_points, memory, spatial_shapes,
                level_start_index, padding_mask=None):
        """tgt, query_pos: (B, Q, C); reference_points (B, Q, L, 2 or 4); memory (B, S, C);
        returns (B, Q, C)."""
        query = tgt if query_pos is None else tgt + query_pos
        attended = self.cross_attn(query, reference_points, memory, spatial_shapes,
                                   level_start_index, padding_mask)
        return self.add_and_feed_forward(tgt, attended)


class DeformableDecoder(nn.Module):
    """A stack of ``DeformableDecoderLayer``: ``num_queries`` learned object queries (content
    and position halves, as in Deformable DETR) and a learned linear map from each query's
    position embedding to its reference point (sigmoid, the same point on every level)."""

    def __init__(self, num_layers: int = 6, d_model: int = 256, d_ffn: int = 1024,
                 dropout: float = 0.1, n_levels: int = 4, n_heads: int = 8,
                 n_points: int = 4, num_queries: int = 300, *, core: CoreArg = "triton"):
        super().__init__()
        self.n_levels = n_levels
        self.query_embed = nn.Embedding(num_queries, 2 * d_model)
        self.reference_points = nn.Linear(d_model, 2)
        self.layers = nn.ModuleList(
            DeformableDecoderLayer(d_model, d_ffn, dropout, n_levels, n_heads, n_points,
                                   core=core)
            for _ in range(num_layers))

    def forward(self, memory: torch.Tensor, spatial_shapes: torch.Tensor,
                level_start_index: torch.Tensor,
                padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """memory (B, S, C) the encoder's output; returns (B, num_queries, C)."""
        batch = memory.shape[0]
        query_pos, tgt = self.query_embed.weight.chunk(2, dim=-1)
        query_pos = query_pos[None].expand(batch, -1, -1)
        tgt = tgt[None].expand(batch, -1, -1)
        reference = self.reference_points(query_pos).sigmoid()                  # (B, Q, 2)
        reference_points = reference[:, :, None, :].expand(-1, -1, self.n_levels, -1)
        out = tgt
        for layer in self.layers:
            out = layer(out, query_pos, reference_points, memory, spatial_shapes,
                        level_start_index, padding_mask)
        return out


def jitter_offsets(model, seed, amount):
    """Move every initial sampling offset by up to ``amount`` pixels.

    Deformable DETR's initialisation puts the encoder's sampling points on whole-pixel
    offsets from pixel centres, so they sit (up to rounding) exactly on the pixel grid, where
    bilinear interpolation has a kink.  There the gradient with respect to a location is the
    one-sided derivative of whichever side rounding picked, and two correct implementations
    may pick different sides: the first step's location gradients then differ by O(1).  A
    fraction of a pixel of jitter keeps every sample off the kinks, so a comparison of two
    implementations tests the operator and not the rounding of the two coordinate formulas.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, MSDeformAttn):
                bias = module.sampling_offsets.bias
                noise = (torch.rand(bias.shape, generator=generator) * 2 - 1) * amount
                bias.add_(noise.to(bias.device, bias.dtype))
