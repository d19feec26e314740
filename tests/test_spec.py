"""The spec (plain loops) against the grid_sample reference: what pins the convention."""
import pytest
import torch

from source_kernels import reference
from source_kernels.inputs import make_inputs
from source_kernels.testing import MSDA_OUTPUT_AXES, explain_mismatch

CASES = [
    # (B, Q, M, D, spatial shapes, K, distribution)
    (1, 3, 1, 2, [[4, 4]], 1, "uniform"),
    (2, 4, 2, 3, [[5, 7], [3, 2], [1, 1]], 2, "uniform"),
    (1, 5, 3, 4, [[6, 3], [2, 5]], 3, "local"),
]


def spec_vs_reference(case, seed=0):
    batch, queries, heads, channels, shapes, points, distribution = case
    args = make_inputs(batch, queries, heads, channels, shapes, points,
                       distribution=distribution, dtype=torch.float64, seed=seed, outside=0.2)
    naive = reference.msda_naive(**args)
    vectorised = reference.msda_grid_sample(**args)
    return explain_mismatch(naive, vectorised, atol=1e-12, rtol=1e-10, axes=MSDA_OUTPUT_AXES,
                            what="msda_naive against msda_grid_sample")


@pytest.mark.parametrize("case", CASES)
def test_spec_matches_grid_sample_reference(case):
    assert spec_vs_reference(case) is None


def test_bilinear_sample_hits_pixel_centres_exactly():
    image = torch.arange(12, dtype=torch.float64).reshape(3, 4, 1)
    # Centre of pixel (row 1, col 2) is at x = (2 + 0.5) / 4, y = (1 + 0.5) / 3.
    got = reference.bilinear_sample_naive(image, 2.5 / 4, 1.5 / 3)
    assert got.item() == pytest.approx(image[1, 2, 0].item())


def test_corner_weights_sum_to_one_and_follow_distance():
    corners = reference.bilinear_corner_weights(1.25, 2.75)
    assert [c[:2] for c in corners] == [(2, 1), (2, 2), (3, 1), (3, 2)]
    weights = [c[2] for c in corners]
    assert sum(weights) == pytest.approx(1.0)
    assert weights == pytest.approx([0.25 * 0.75, 0.25 * 0.25, 0.75 * 0.75, 0.75 * 0.25])


def test_a_shifted_pixel_convention_is_caught(monkeypatch):
    """Replace the spec's ``- 0.5`` by ``- 0.4``: the spec test must fail."""
    monkeypatch.setattr(reference, "pixel_coordinate", lambda x, size: x * size - 0.4)
    assert spec_vs_reference(CASES[1]) is not None


def test_a_flipped_corner_weight_is_caught(monkeypatch):
    """Swap dx and 1 - dx in one corner of the spec: the spec test must fail."""
    original = reference.bilinear_corner_weights

    def flipped(x_im, y_im):
        corners = original(x_im, y_im)
        row, col, _ = corners[1]
        dx = x_im - int(torch.tensor(x_im).floor())
        dy = y_im - int(torch.tensor(y_im).floor())
        corners[1] = (row, col, (1 - dy) * (1 - dx))
        return corners

    monkeypatch.setattr(reference, "bilinear_corner_weights", flipped)
    assert spec_vs_reference(CASES[1]) is not None
