"""Random MSDA inputs and the benchmark presets, shared by tests, labs, book and benchmarks.

The presets are those of the course's benchmark notes: M = 8 heads, D = 32 channels, L = 4
levels, K = 4 points over the 800 x 1333 pyramid at strides 8, 16, 32, 64 (ceiling division).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["PRESETS", "Preset", "pyramid_shapes", "level_start_index", "make_inputs",
           "preset_inputs"]

IMAGE_HEIGHT, IMAGE_WIDTH = 800, 1333
STRIDES = (8, 16, 32, 64)


def pyramid_shapes(height: int = IMAGE_HEIGHT, width: int = IMAGE_WIDTH,
                   strides=STRIDES) -> torch.Tensor:
    """(L, 2) int64 tensor of (H_l, W_l) for an image seen at the given strides."""
    return torch.tensor([[math.ceil(height / s), math.ceil(width / s)] for s in strides],
                        dtype=torch.int64)


def level_start_index(spatial_shapes: torch.Tensor) -> torch.Tensor:
    """(L,) int64 offsets of each level inside the flattened S axis."""
    sizes = spatial_shapes.prod(dim=1)
    return torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])


@dataclass(frozen=True)
class Preset:
    name: str
    batch: int
    queries: int | None      # None: one query per pyramid token (the encoder)
    heads: int = 8
    channels: int = 32
    points: int = 4

    def num_queries(self, spatial_shapes: torch.Tensor) -> int:
        return int(spatial_shapes.prod(dim=1).sum()) if self.queries is None else self.queries


PRESETS = {
    "decoder": Preset("decoder", batch=4, queries=300),
    "encoder": Preset("encoder", batch=2, queries=None),
    "decoder-b32": Preset("decoder-b32", batch=32, queries=300),
}


def _reference_points(batch, queries, spatial_shapes, generator, encoder_like):
    """(B, Q, 2) reference points in [0, 1]: pixel centres of the pyramid, or random points."""
    if encoder_like:
        centres = []
        for height, width in spatial_shapes.tolist():
            ys, xs = torch.meshgrid((torch.arange(height) + 0.5) / height,
                                    (torch.arange(width) + 0.5) / width, indexing="ij")
            centres.append(torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1))
        ref = torch.cat(centres)[:queries]
        return ref.unsqueeze(0).expand(batch, -1, -1).double()
    return torch.rand(batch, queries, 2, generator=generator, dtype=torch.float64)


def make_inputs(batch, queries, heads, channels, spatial_shapes, points, *,
                distribution="uniform", dtype=torch.float32, device="cpu", seed=0,
                encoder_like=False, outside=0.05, sigma_pixels=2.0, requires_grad=False):
    """Random inputs for one MSDA call, as a dict of the operator's arguments.

    ``distribution``:
      - ``"uniform"``: locations uniform over [-outside, 1 + outside] (no locality);
      - ``"local"``: each query's reference point plus normal offsets of ``sigma_pixels``
        pixels of each level (neighbouring queries share corners, as in trained models).
    Value ~ randn, attention weights softmaxed over L*K.  Generated on the CPU from ``seed``
    (the same numbers on every device), then moved to ``device`` and cast to ``dtype``.
    """
    generator = torch.Generator().manual_seed(seed)
    spatial_shapes = torch.as_tensor(spatial_shapes, dtype=torch.int64).reshape(-1, 2)
    levels = spatial_shapes.shape[0]
    total = int(spatial_shapes.prod(dim=1).sum())
    value = torch.randn(batch, total, heads, channels, generator=generator, dtype=torch.float64)
    if distribution == "uniform":
        loc = torch.rand(batch, queries, heads, levels, points, 2, generator=generator,
                         dtype=torch.float64) * (1 + 2 * outside) - outside
    elif distribution == "local":
        ref = _reference_points(batch, queries, spatial_shapes, generator, encoder_like)
        sizes = spatial_shapes.flip(-1).double()               # (L, 2) as (W, H)
        noise = torch.randn(batch, queries, heads, levels, points, 2, generator=generator,
                            dtype=torch.float64)
        loc = ref[:, :, None, None, None, :] + noise * sigma_pixels / sizes[:, None, :]
    else:
        raise ValueError(f"distribution must be 'uniform' or 'local', got {distribution!r}")
    logits = torch.randn(batch, queries, heads, levels * points, generator=generator,
                         dtype=torch.float64)
    attn = logits.softmax(-1).reshape(batch, queries, heads, levels, points)
    tensors = {"value": value, "sampling_locations": loc, "attention_weights": attn}
    tensors = {k: t.to(device=device, dtype=dtype).requires_grad_(requires_grad)
               for k, t in tensors.items()}
    return {
        "value": tensors["value"],
        "value_spatial_shapes": spatial_shapes.to(device),
        "value_level_start_index": level_start_index(spatial_shapes).to(device),
        "sampling_locations": tensors["sampling_locations"],
        "attention_weights": tensors["attention_weights"],
    }


def preset_inputs(name, *, distribution="uniform", dtype=torch.float32, device="cpu", seed=0,
                  requires_grad=False):
    """The inputs of a named preset (``decoder``, ``encoder``, ``decoder-b32``)."""
    preset = PRESETS[name]
    shapes = pyramid_shapes()
    return make_inputs(preset.batch, preset.num_queries(shapes), preset.heads, preset.channels,
                       shapes, preset.points, distribution=distribution, dtype=dtype,
                       device=device, seed=seed, encoder_like=preset.queries is None,
                       requires_grad=requires_grad)
