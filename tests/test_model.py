"""The operator inside a model: source_kernels.model.MSDeformAttn and DeformableEncoder.

What is pinned here:
- the module has Deformable DETR's parameter names, shapes and initialisation, so that a
  checkpoint of that family of models loads into it;
- with the same weights and inputs, the module on the Triton operator and the module on the
  grid_sample reference agree in the forward and in every gradient (reference points of
  last dim 2 and 4, with and without a padding mask, fp64 and fp32);
- a few training steps of a tiny encoder on synthetic data give the same loss curve with
  either core.

On a CPU the Triton kernels run in Triton's interpreter, which costs a large fraction of a
second per program, so the sizes are tiny: one batch element, two heads, queries and pixels
in the tens.  The tests marked ``gpu`` repeat the comparisons at realistic sizes.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import source_kernels  # noqa: F401  (interpreter switch before the kernels are defined)
from source_kernels.inputs import level_start_index
from source_kernels.reference import msda_grid_sample
from source_kernels.model import (CORES, DeformableDecoder, DeformableEncoder, MSDeformAttn,
                                  encoder_reference_points, jitter_offsets,
                                  sine_position_embedding, use_core)

DEVICE_CPU = torch.device("cpu")
# The small cases run on the GPU when there is one (the compiled kernels need CUDA tensors)
# and on the CPU through Triton's interpreter otherwise.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------- helpers
def pyramid(shapes, device=DEVICE_CPU):
    spatial_shapes = torch.tensor(shapes, dtype=torch.int64, device=device)
    return spatial_shapes, level_start_index(spatial_shapes)


def randomise_heads(module: MSDeformAttn, generator, offset_std=0.5, weight_std=0.5):
    """Give the sampling-offset and attention-weight heads non-zero weights, so that every
    query samples its own locations (some outside the map) with its own weights."""
    with torch.no_grad():
        for linear, std in ((module.sampling_offsets, offset_std),
                            (module.attention_weights, weight_std)):
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * std)
            linear.bias.add_(torch.randn(linear.bias.shape, generator=generator) * std)


def module_case(*, d_model, heads, points, shapes, queries, batch, dtype, ref_dim, masked,
                device=DEVICE, seed=0):
    """A module with random heads and its inputs, as (module, args)."""
    generator = torch.Generator().manual_seed(seed)
    spatial_shapes, starts = pyramid(shapes, device)
    levels = len(shapes)
    total = int(spatial_shapes.prod(dim=1).sum())
    torch.manual_seed(seed)
    module = MSDeformAttn(d_model, levels, heads, points)
    randomise_heads(module, generator)
    module = module.to(device=device, dtype=dtype)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(
            device=device, dtype=dtype)

    query = rand(batch, queries, d_model).requires_grad_()
    inputs = rand(batch, total, d_model).requires_grad_()
    if ref_dim == 2:
        ref = torch.rand(batch, queries, levels, 2, generator=generator, dtype=torch.float64)
    else:
        centre = torch.rand(batch, queries, 1, 2, generator=generator, dtype=torch.float64)
        size = 0.1 + 0.4 * torch.rand(batch, queries, 1, 2, generator=generator,
                                      dtype=torch.float64)
        ref = torch.cat([centre, size], dim=-1).expand(batch, queries, levels, 4)
    ref = ref.to(device=device, dtype=dtype).contiguous().requires_grad_()
    mask = None
    if masked:
        mask = torch.rand(batch, total, generator=generator) < 0.3
        mask = mask.to(device)
    return module, (query, ref, inputs, spatial_shapes, starts, mask)


def forward_backward(module, args, core, generator_seed=123):
    """Output and the gradients of every parameter and floating input for one core."""
    module.core = core
    module.zero_grad(set_to_none=True)
    for t in args[:3]:
        t.grad = None
    out = module(*args)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(generator_seed),
                           dtype=torch.float64).to(device=out.device, dtype=out.dtype)
    out.backward(grad_out)
    grads = {name: p.grad.detach().clone() for name, p in module.named_parameters()}
    for name, t in zip(("query", "reference_points", "input_flatten"), args[:3]):
        grads[name] = t.grad.detach().clone()
    return out.detach().clone(), grads


def assert_parity(module, args, *, rtol, atol):
    out_t, grads_t = forward_backward(module, args, "triton")
    out_r, grads_r = forward_backward(module, args, "grid_sample")
    torch.testing.assert_close(out_t, out_r, rtol=rtol, atol=atol, msg=lambda m: "output: " + m)
    assert grads_t.keys() == grads_r.keys()
    for name in grads_r:
        torch.testing.assert_close(grads_t[name], grads_r[name], rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")
    # the comparison is not vacuous: every gradient carries signal
    for name in ("sampling_offsets.weight", "attention_weights.weight", "value_proj.weight",
                 "reference_points", "query", "input_flatten"):
        assert grads_r[name].abs().max() > 0, f"gradient of {name} is all zeros"


# ----------------------------------------------------------------------------- layout
def test_parameter_layout_matches_deformable_detr():
    """Names and shapes of Deformable DETR's default module (C=256, L=4, M=8, K=4)."""
    module = MSDeformAttn()
    shapes = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    assert shapes == {
        "sampling_offsets.weight": (8 * 4 * 4 * 2, 256),
        "sampling_offsets.bias": (8 * 4 * 4 * 2,),
        "attention_weights.weight": (8 * 4 * 4, 256),
        "attention_weights.bias": (8 * 4 * 4,),
        "value_proj.weight": (256, 256),
        "value_proj.bias": (256,),
        "output_proj.weight": (256, 256),
        "output_proj.bias": (256,),
    }
    assert module.im2col_step == 64
    assert module.core == "triton"
    with pytest.raises(ValueError, match="divisible"):
        MSDeformAttn(d_model=100, n_heads=8)


def test_initialisation_conventions():
    torch.manual_seed(0)
    heads, levels, points = 8, 4, 4
    module = MSDeformAttn(256, levels, heads, points)
    assert torch.count_nonzero(module.sampling_offsets.weight) == 0
    assert torch.count_nonzero(module.attention_weights.weight) == 0
    assert torch.count_nonzero(module.attention_weights.bias) == 0
    # bias (M, L, K, 2): head m points along the angle 2*pi*m/8, scaled to max |coord| 1,
    # point k at k+1 times that; e.g. head 1 (45 degrees) is (1, 1), head 6 is (0, -1).
    directions = torch.tensor([[1, 0], [1, 1], [0, 1], [-1, 1], [-1, 0], [-1, -1], [0, -1],
                               [1, -1]], dtype=torch.float32)
    expected = (directions[:, None, None, :]
                * torch.arange(1, points + 1, dtype=torch.float32)[None, None, :, None])
    expected = expected.expand(heads, levels, points, 2)
    got = module.sampling_offsets.bias.detach().view(heads, levels, points, 2)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    for linear in (module.value_proj, module.output_proj):
        assert torch.count_nonzero(linear.bias) == 0
        bound = math.sqrt(6.0 / (linear.in_features + linear.out_features))   # Xavier uniform
        weight = linear.weight.detach()
        assert weight.abs().max() <= bound
        assert weight.abs().max() > 0.9 * bound
        # the variance of U(-a, a) is a^2 / 3
        assert abs(weight.var().item() / (bound ** 2 / 3) - 1) < 0.05


def test_initial_sampling_locations_and_weights():
    """At initialisation every query attends uniformly to points k+1 pixels from its
    reference point along its head's direction, on every level."""
    torch.manual_seed(0)
    module = MSDeformAttn(16, 2, 4, 3)
    spatial_shapes, _ = pyramid([[5, 8], [3, 4]])
    query = torch.randn(1, 6, 16)
    ref = torch.rand(1, 6, 2, 2)
    locations, weights = module.sampling(query, ref, spatial_shapes)
    assert locations.shape == (1, 6, 4, 2, 3, 2) and weights.shape == (1, 6, 4, 2, 3)
    torch.testing.assert_close(weights, torch.full_like(weights, 1 / 6))
    pixels = (locations - ref[:, :, None, :, None, :]) * torch.tensor([[8.0, 5.0], [4.0, 3.0]])[
        None, None, None, :, None, :]
    expected = module.initial_offset_grid()[None, None].expand_as(pixels)
    torch.testing.assert_close(pixels, expected, atol=1e-5, rtol=0)
    # box reference points: offsets scale with half the box size over K points
    box = torch.tensor([0.5, 0.5, 0.2, 0.4]).expand(1, 6, 2, 4)
    locations, _ = module.sampling(query, box, spatial_shapes)
    grid = module.initial_offset_grid()
    torch.testing.assert_close(locations[0, 0, :, :, :, 0], 0.5 + grid[..., 0] / 3 * 0.1)
    torch.testing.assert_close(locations[0, 0, :, :, :, 1], 0.5 + grid[..., 1] / 3 * 0.2)
    with pytest.raises(ValueError, match="reference_points"):
        module.sampling(query, torch.rand(1, 6, 2, 3), spatial_shapes)


def test_core_choice():
    module = MSDeformAttn(16, 2, 2, 2, core="grid_sample")
    assert module.core == "grid_sample"
    assert "core='grid_sample'" in repr(module)
    # the core is not part of the checkpoint
    assert all("core" not in name for name in module.state_dict())
    with pytest.raises(ValueError, match="core must be one of"):
        module.core = "cuda"
    encoder = use_core(DeformableEncoder(2, 16, 32, 0.0, 2, 2, 2), "grid_sample")
    assert {layer.self_attn.core for layer in encoder.layers} == {"grid_sample"}
    assert set(CORES) == {"triton", "grid_sample"}


def test_padding_mask_silences_padded_pixels():
    """Values of padded pixels are zeroed: changing them changes nothing."""
    torch.manual_seed(0)
    module = MSDeformAttn(16, 2, 2, 2, core="grid_sample")
    randomise_heads(module, torch.Generator().manual_seed(1))
    spatial_shapes, starts = pyramid([[4, 4], [2, 2]])
    x = torch.randn(1, 20, 16)
    mask = torch.zeros(1, 20, dtype=torch.bool)
    mask[:, 2:9] = True
    query, ref = torch.randn(1, 5, 16), torch.rand(1, 5, 2, 2)
    out = module(query, ref, x, spatial_shapes, starts, mask)
    x2 = x.clone()
    x2[:, 2:9] = 100.0
    torch.testing.assert_close(module(query, ref, x2, spatial_shapes, starts, mask), out)
    assert not torch.allclose(module(query, ref, x2, spatial_shapes, starts), out)


def test_encoder_reference_points():
    spatial_shapes, _ = pyramid([[2, 4], [1, 2]])
    ref = encoder_reference_points(spatial_shapes, torch.ones(1, 2, 2))
    assert ref.shape == (1, 10, 2, 2)
    torch.testing.assert_close(ref[0, :4, 0], torch.tensor(
        [[0.125, 0.25], [0.375, 0.25], [0.625, 0.25], [0.875, 0.25]]))
    torch.testing.assert_close(ref[0, 8:, 1], torch.tensor([[0.25, 0.5], [0.75, 0.5]]))


def loop_reference_points(spatial_shapes, valid_ratios):
    """The reference points as Deformable DETR writes them: a loop over the levels' (H, W)."""
    centres = []
    for lvl, (height, width) in enumerate(spatial_shapes.tolist()):
        ys, xs = torch.meshgrid(torch.arange(height, dtype=valid_ratios.dtype) + 0.5,
                                torch.arange(width, dtype=valid_ratios.dtype) + 0.5,
                                indexing="ij")
        x = xs.reshape(1, -1) / (valid_ratios[:, None, lvl, 0] * width)
        y = ys.reshape(1, -1) / (valid_ratios[:, None, lvl, 1] * height)
        centres.append(torch.stack([x, y], dim=-1))
    return torch.cat(centres, dim=1)[:, :, None, :] * valid_ratios[:, None, :, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_encoder_positions_need_no_host_copy(dtype):
    """The reference points and position embedding come from index arithmetic on the
    shapes' device, equal bit for bit to the loop over each level's (H, W)."""
    shapes = [[100, 167], [50, 84], [25, 42], [13, 21]]
    spatial_shapes, _ = pyramid(shapes)
    ratios = 0.5 + 0.5 * torch.rand(2, 4, 2, generator=torch.Generator().manual_seed(0),
                                    dtype=dtype)
    got = encoder_reference_points(spatial_shapes, ratios, 22223)
    assert torch.equal(got, loop_reference_points(spatial_shapes, ratios))
    assert torch.equal(encoder_reference_points(spatial_shapes, ratios), got)
    encoder = DeformableEncoder(1, 16, 32, 0.0, 4, 2, 2)
    pos = encoder.position_embedding(spatial_shapes, 22223, dtype, DEVICE_CPU)
    start = 100 * 167 + 50 * 84                          # level 2, row 1, column 3
    centre = torch.tensor([[3.5 / 42, 1.5 / 25]], dtype=dtype)
    expected = (sine_position_embedding(centre, 16)[0]
                + encoder.level_embed[2].to(dtype))
    assert torch.equal(pos[start + 42 + 3], expected.detach())


def test_encoder_traces_with_static_sizes():
    """torch.compile(fullgraph=True) traces the encoder with every size static: nothing of
    spatial_shapes is read on the host (no .item() in the graph), so no size of the graph
    depends on data, which the operator's compiled kernels and CUDA graphs need."""
    torch.manual_seed(0)
    # on the operator's device: on a GPU host the kernels compile for the GPU and refuse CPU
    # tensors (a CPU tensor there is the error the operator exists to give)
    spatial_shapes, starts = pyramid([[4, 5], [2, 3]], DEVICE)
    encoder = DeformableEncoder(1, 16, 32, 0.0, 2, 2, 2).to(DEVICE)
    src = torch.randn(1, 26, 16, device=DEVICE)
    graphs = []

    def capture(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch.compiler.reset()
    out = torch.compile(encoder, fullgraph=True, backend=capture)(src, spatial_shapes, starts)
    torch.compiler.reset()
    assert len(graphs) == 1
    sizes = [size for node in graphs[0].graph.nodes
             if isinstance(node.meta.get("example_value"), torch.Tensor)
             for size in node.meta["example_value"].shape]
    assert sizes and not any(isinstance(size, torch.SymInt) for size in sizes), sizes
    assert not any(node.target == "item" for node in graphs[0].graph.nodes)
    torch.testing.assert_close(out, encoder(src, spatial_shapes, starts))


# ----------------------------------------------------------------------------- parity
# Non-square levels (so that a swapped (H, W) shows), a channel count per head that is not
# a power of two in one case, locations partly outside the maps (zero padding).
PARITY_CASES = {
    "fp64-points": dict(d_model=16, heads=2, points=2, shapes=[[5, 7], [3, 4]], queries=12,
                        batch=1, dtype=torch.float64, ref_dim=2, masked=False),
    "fp32-boxes-masked": dict(d_model=24, heads=2, points=2, shapes=[[4, 6], [2, 3]],
                              queries=10, batch=1, dtype=torch.float32, ref_dim=4,
                              masked=True),
}
# fp64: both cores compute the same sums in a different order: 1e-10 is far above the
# rounding (about 1e-15) and far below any real mistake.  fp32: 1e-5 likewise (rounding
# about 1e-6 for these sums).
PARITY_TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10),
              torch.float32: dict(rtol=1e-5, atol=1e-5)}


@pytest.mark.parametrize("case", sorted(PARITY_CASES))
def test_module_parity_triton_vs_grid_sample(case):
    spec = PARITY_CASES[case]
    module, args = module_case(**spec)
    assert_parity(module, args, **PARITY_TOL[spec["dtype"]])


def test_decoder_parity_triton_vs_grid_sample():
    """The decoder stack (cross-attention + FFN per layer) on either core: same output and
    same gradient of every parameter, from the same weights."""
    shapes = [[5, 6], [3, 3]]
    spatial_shapes, starts = pyramid(shapes, DEVICE)
    torch.manual_seed(0)
    decoder = DeformableDecoder(2, 16, 32, 0.0, 2, 2, 2, num_queries=6).to(DEVICE)
    memory = torch.randn(1, 39, 16, device=DEVICE)
    results = {}
    for core in ("triton", "grid_sample"):
        use_core(decoder, core)
        decoder.zero_grad(set_to_none=True)
        out = decoder(memory, spatial_shapes, starts)
        out.square().sum().backward()
        results[core] = (out.detach(), {n: p.grad.clone() for n, p in decoder.named_parameters()})
    assert results["triton"][0].shape == (1, 6, 16)
    torch.testing.assert_close(results["triton"][0], results["grid_sample"][0], rtol=1e-5,
                               atol=1e-5)
    for name, grad in results["grid_sample"][1].items():
        torch.testing.assert_close(results["triton"][1][name], grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_autocast_keeps_locations_in_fp32():
    """Under bf16 autocast the projections are bf16 but the operator gets fp32 locations
    (and values and weights promoted to match); the output comes back in bf16."""
    torch.manual_seed(0)
    seen = {}

    def spy(value, shapes, starts, locations, weights, step):
        seen.update(value=value.dtype, locations=locations.dtype, weights=weights.dtype)
        return CORES["triton"](value, shapes, starts, locations, weights, step)

    module = MSDeformAttn(16, 2, 2, 2, core=spy)
    randomise_heads(module, torch.Generator().manual_seed(2))
    module.to(DEVICE)
    spatial_shapes, starts = pyramid([[4, 5], [2, 3]], device=DEVICE)
    query, x, ref = (torch.randn(1, 6, 16, device=DEVICE), torch.randn(1, 26, 16, device=DEVICE),
                     torch.rand(1, 6, 2, 2, device=DEVICE))
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        out = module(query, ref, x, spatial_shapes, starts)
        module.core = "grid_sample"
        expected = module(query, ref, x, spatial_shapes, starts)
    assert seen == dict(value=torch.float32, locations=torch.float32, weights=torch.float32)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)     # bf16 defaults: rtol 1.6e-2, atol 1e-5


def test_autocast_gives_the_operator_16bit_values(monkeypatch):
    """With the Triton core under bf16 autocast the operator takes the bf16 values as they
    are (no fp32 copy of value per layer, and no cast of the output back) with fp32
    locations and weights; output and gradients agree with the grid_sample core's."""
    import source_kernels.model as model_module
    torch.manual_seed(0)
    seen = []

    def spy(*args, **kwargs):
        seen.append((args[0].dtype, args[3].dtype, args[4].dtype, kwargs))
        return multi_scale_deformable_attn(*args, **kwargs)

    from source_kernels.op import multi_scale_deformable_attn
    monkeypatch.setattr(model_module, "multi_scale_deformable_attn", spy)
    module = MSDeformAttn(16, 2, 2, 2)
    randomise_heads(module, torch.Generator().manual_seed(2))
    module.to(DEVICE)
    spatial_shapes, starts = pyramid([[4, 5], [2, 3]], device=DEVICE)
    query = torch.randn(1, 6, 16, device=DEVICE)
    x = torch.randn(1, 26, 16, device=DEVICE)
    ref = torch.rand(1, 6, 2, 2, device=DEVICE)
    results = {}
    for core in ("triton", "grid_sample"):
        module.core = core
        module.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            out = module(query, ref, x, spatial_shapes, starts)
        out.float().square().sum().backward()
        results[core] = (out, module.sampling_offsets.weight.grad.clone(),
                         module.value_proj.weight.grad.clone())
    assert seen == [(torch.bfloat16, torch.float32, torch.float32,
                     {"mixed_precision": True})]
    assert results["triton"][0].dtype == torch.bfloat16
    for got, expected in zip(results["triton"], results["grid_sample"]):
        error = (got.float() - expected.float()).abs().max().item()
        assert error <= 3e-2 * expected.float().abs().max().item()


# ----------------------------------------------------------------------------- training
TRAIN_SHAPES = [[4, 5], [2, 3]]
TRAIN_TOL = dict(rtol=1e-5, atol=1e-6)     # per step, on the fp32 loss (see the test)


def shift_task(seed, shapes, batch, channels, device=DEVICE_CPU, dtype=torch.float32):
    """Synthetic data: random pyramid features; the target of each pixel is the feature of
    its right-hand neighbour on the same level (zero in the last column).  Learning it
    means moving the sampling points, which exercises the location gradients."""
    generator = torch.Generator().manual_seed(seed)
    spatial_shapes, starts = pyramid(shapes)
    total = int(spatial_shapes.prod(dim=1).sum())
    src = torch.randn(batch, total, channels, generator=generator)
    targets = []
    for (height, width), start in zip(shapes, starts.tolist()):
        level = src[:, start:start + height * width].view(batch, height, width, channels)
        shifted = torch.zeros_like(level)
        shifted[:, :, :-1] = level[:, :, 1:]
        targets.append(shifted.reshape(batch, height * width, channels))
    return src.to(device, dtype), torch.cat(targets, dim=1).to(device, dtype)




def train(core, *, steps, shapes, batch, d_model, heads, points, layers, d_ffn, lr=3e-3,
          device=DEVICE, seed=0, jitter=0.25):
    """Fit encoder + linear head to one batch of ``shift_task`` with AdamW; returns the
    loss of every step."""
    torch.manual_seed(seed)
    encoder = DeformableEncoder(layers, d_model, d_ffn, 0.0, len(shapes), heads, points,
                                core=core)
    head = torch.nn.Linear(d_model, d_model)
    if jitter:
        jitter_offsets(encoder, seed + 1, jitter)
    encoder, head = encoder.to(device), head.to(device)
    spatial_shapes, starts = pyramid(shapes, device)
    optimiser = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=lr)
    losses = []
    src, target = shift_task(1000, shapes, batch, d_model, device)   # one batch, fitted
    for _ in range(steps):
        loss = F.mse_loss(head(encoder(src, spatial_shapes, starts)), target)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def test_training_parity_triton_vs_grid_sample():
    """Same seeds, same data, two cores: the fp32 loss curves agree step by step.

    Tolerance: relative 1e-5 (plus 1e-6 absolute) per step.  The two cores differ only by
    fp32 rounding; over these six steps the curves stayed within about 1e-7 of each other
    (one unit in the last place of the loss).  A core that loses the gradient of the
    sampling locations or of the attention weights parts from the reference by more than
    1e-3 from the second step on (``test_training_parity_catches_a_lost_gradient``).
    AdamW is blind to a uniform rescaling of one parameter's gradient; the module parity
    test above, which compares gradients directly, is what catches that.  Without the offset
    jitter (see ``source_kernels.model.jitter_offsets``) the two curves part by a few 1e-4
    after one step.
    """
    config = dict(steps=6, shapes=TRAIN_SHAPES, batch=1, d_model=16, heads=2, points=2,
                  layers=2, d_ffn=32)
    triton_losses = train("triton", **config)
    reference_losses = train("grid_sample", **config)
    torch.testing.assert_close(torch.tensor(triton_losses), torch.tensor(reference_losses),
                               **TRAIN_TOL)
    # and it is a real training run: the loss goes down at every step
    assert all(b < a for a, b in zip(reference_losses, reference_losses[1:])), reference_losses


def _grid_sample_without_location_gradient(value, shapes, starts, locations, weights, step):
    return msda_grid_sample(value, shapes, starts, locations.detach(), weights)


def _grid_sample_without_weight_gradient(value, shapes, starts, locations, weights, step):
    return msda_grid_sample(value, shapes, starts, locations, weights.detach())


@pytest.mark.parametrize("broken_core", [_grid_sample_without_location_gradient,
                                         _grid_sample_without_weight_gradient])
def test_training_parity_catches_a_lost_gradient(broken_core):
    """The training comparison is not vacuous: a core with a forward right to the last bit
    but one gradient missing fails it."""
    config = dict(steps=3, shapes=TRAIN_SHAPES, batch=1, d_model=16, heads=2, points=2,
                  layers=2, d_ffn=32)
    reference_losses = torch.tensor(train("grid_sample", **config))
    broken_losses = torch.tensor(train(broken_core, **config))
    assert broken_losses[0] == reference_losses[0]          # same forward
    with pytest.raises(AssertionError):
        torch.testing.assert_close(broken_losses, reference_losses, **TRAIN_TOL)
    assert ((broken_losses[1:] - reference_losses[1:]).abs() / reference_losses[1:]).min() > 1e-3


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_module_parity_gpu(dtype):
    spec = dict(d_model=256, heads=8, points=4, shapes=[[50, 84], [25, 42], [13, 21], [7, 11]],
                queries=300, batch=2, dtype=dtype, ref_dim=4, masked=True,
                device=torch.device("cuda"))
    module, args = module_case(**spec)
    tol = PARITY_TOL[dtype] if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    assert_parity(module, args, **tol)


@pytest.mark.gpu
def test_training_parity_gpu():
    config = dict(steps=30, shapes=[[32, 48], [16, 24], [8, 12], [4, 6]], batch=2,
                  d_model=64, heads=4, points=4, layers=3, d_ffn=128,
                  device=torch.device("cuda"))
    triton_losses = train("triton", **config)
    reference_losses = train("grid_sample", **config)
    torch.testing.assert_close(torch.tensor(triton_losses), torch.tensor(reference_losses),
                               rtol=1e-4, atol=1e-5)
    assert reference_losses[-1] < reference_losses[0]


@pytest.mark.gpu
def test_module_under_torch_compile_gpu():
    spec = dict(d_model=256, heads=8, points=4, shapes=[[50, 84], [25, 42], [13, 21], [7, 11]],
                queries=300, batch=2, dtype=torch.float32, ref_dim=2, masked=False,
                device=torch.device("cuda"))
    module, args = module_case(**spec)
    eager = module(*args)
    compiled = torch.compile(module, fullgraph=True)
    # The operator is the same kernel either way; the projections around it are inductor's
    # fused kernels under compile, which round differently: 1e-4, as the GPU parity test.
    torch.testing.assert_close(compiled(*args), eager, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("with_backward", [False, True], ids=["forward", "forward_backward"])
def test_module_under_reduce_overhead_gpu(with_backward):
    """torch.compile(mode="reduce-overhead"): the compiled module, its kernels replayed from
    CUDA graphs, agrees with eager mode, also in the gradients; the generated code launches
    the operator's own Triton kernels (Inductor sees them) rather than an opaque op."""
    from torch._inductor.utils import run_and_get_code
    spec = dict(d_model=256, heads=8, points=4, shapes=[[50, 84], [25, 42], [13, 21], [7, 11]],
                queries=300, batch=2, dtype=torch.float32, ref_dim=2, masked=False,
                device=torch.device("cuda"))
    module, args = module_case(**spec)
    torch.compiler.reset()
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)

    def run(fn):
        leaves = [a if a is None else
                  a.detach().clone().requires_grad_(with_backward and a.is_floating_point())
                  for a in args]                # (the padding mask is None here)
        module.zero_grad(set_to_none=True)
        out = fn(*leaves)
        if with_backward:
            out.square().mean().backward()
            return [out.detach().clone(), leaves[0].grad.clone(), leaves[2].grad.clone(),
                    module.sampling_offsets.weight.grad.clone()]
        return [out.detach().clone()]

    eager = run(module)
    for _ in range(3):                                  # record, then replay the graphs
        torch.compiler.cudagraph_mark_step_begin()
        got = run(compiled)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.compiler.reset()
    _, code = run_and_get_code(lambda: run(torch.compile(module, fullgraph=True)))
    assert any("_msda_forward" in c for c in code), "the forward kernel is not in the code"
    if with_backward:
        assert any("_msda_backward" in c for c in code), "the backward kernel is not in the code"


@pytest.mark.gpu
def test_encoder_under_reduce_overhead_gpu():
    """The whole encoder under torch.compile(mode="reduce-overhead", fullgraph=True), as a
    training step runs it (bf16 autocast, forward and backward): it compiles (no size of the
    graph depends on the shapes' contents) and agrees with eager mode."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    spatial_shapes, starts = pyramid([[32, 48], [16, 24], [8, 12], [4, 6]], device)
    encoder = DeformableEncoder(2, 64, 128, 0.0, 4, 4, 4).to(device)
    jitter_offsets(encoder, 1, 0.25)
    src = torch.randn(2, 2040, 64, device=device)

    def run(fn):
        encoder.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(src, spatial_shapes, starts)
        out.float().square().mean().backward()
        return [out.detach().float(), encoder.layers[0].self_attn.sampling_offsets.weight.grad
                .clone(), encoder.level_embed.grad.clone()]

    eager = run(encoder)
    torch.compiler.reset()
    compiled = torch.compile(encoder, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):                                  # record, then replay the graphs
        torch.compiler.cudagraph_mark_step_begin()
        got = run(compiled)
    torch.compiler.reset()
    for name, a, b in zip(("output", "grad of level_embed"), got[::2], eager[::2]):
        # bf16 projections, fused differently: within 5% of the largest magnitude
        error = (a - b).abs().max().item()
        assert error <= 5e-2 * b.abs().max().item(), (name, error, b.abs().max().item())
    # The gradient reaching the sampling offsets is a difference of neighbouring bf16 values
    # (v01 - v00, ...): cancellation leaves few significant bits, so compiled and eager, which
    # round at different places, agree element by element only loosely. They must agree as a
    # whole: the same direction and size, within 10% (relative Frobenius error).
    a, b = got[1], eager[1]
    relative = ((a - b).norm() / b.norm()).item()
    assert relative <= 0.1, ("grad of sampling_offsets, relative Frobenius error", relative)
