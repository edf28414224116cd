"""Cell-by-cell Gram matrices of interpolation rows against the dense float64 oracle."""

from __future__ import annotations

import pytest
import torch

from streamgp.interpolation import CubicGridInterpolation, InterpolationWeights
from streamgp.linalg.grid_gram import CellGram
from streamgp.linalg.statistics import DataStatistics, GridStatistics

DTYPE = torch.float64


def _grid(d: int, g: int) -> CubicGridInterpolation:
    return CubicGridInterpolation(torch.tensor([[0.0] * d, [1.0] * d], dtype=DTYPE), g)


def _axes(weights: InterpolationWeights) -> tuple[list, list]:
    return [a.indices for a in weights.axes], [a.values for a in weights.axes]


@pytest.mark.parametrize(("d", "g"), [(1, 11), (2, 9), (3, 7), (3, 10)])
def test_cell_gram_equals_the_dense_oracle_and_the_direct_pattern(d, g):
    grid = _grid(d, g)
    # Points in part of the box (untouched cells stay out of the pattern), some exactly
    # on grid lines and on the upper bound (zero weights, the last cell).
    X = 0.7 * torch.rand(300, d, dtype=DTYPE)
    X[:10] = torch.round(X[:10] * (g - 3)) / (g - 3)
    X[10:12] = 1.0
    weights = grid.weights(X)
    precision = 0.5 + torch.rand(300, dtype=DTYPE)
    gram = CellGram(grid.grid_size, 4, weights.values)
    for rows in (slice(0, 100), slice(100, 300)):  # two chunks
        indices, values = _axes(weights)
        gram.add([i[rows] for i in indices], [v[rows] for v in values], precision[rows])
    A = gram.sparse()
    W = weights.to_dense()
    oracle = W.mT @ (precision.unsqueeze(-1) * W)
    assert A.is_coalesced()
    scale = oracle.abs().max()
    assert (A.to_dense() - oracle).abs().max() <= 1e-13 * scale
    direct = weights.weighted_gram(precision, sparse=True)
    assert torch.equal(A.indices(), direct.indices())  # same pattern, explicit zeros too
    assert (A.values() - direct.values()).abs().max() <= 1e-13 * scale


def test_cell_gram_is_differentiable_in_the_inputs():
    grid = _grid(2, 8)
    X = torch.rand(40, 2, dtype=DTYPE, requires_grad=True)
    probe = torch.randn(grid.num_grid, grid.num_grid, dtype=DTYPE)
    weights = grid.weights(X)
    gram = CellGram(grid.grid_size, 4, weights.values)
    gram.add(*_axes(weights), torch.ones(40, dtype=DTYPE))
    (grad,) = torch.autograd.grad((gram.sparse().to_dense() * probe).sum(), X)
    W = grid.weights(X).to_dense()
    (expected,) = torch.autograd.grad(((W.mT @ W) * probe).sum(), X)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def test_cell_gram_refuses_rows_without_consecutive_neighbours():
    grid = _grid(2, 8)
    weights = grid.weights(torch.rand(5, 2, dtype=DTYPE))
    indices, values = _axes(weights)
    gram = CellGram(grid.grid_size, 4, weights.values)
    with pytest.raises(ValueError, match="consecutive"):
        gram.add([indices[0].flip(-1), indices[1]], values, torch.ones(5, dtype=DTYPE))


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_sparse_statistics_of_rows_equal_row_by_row_addition(fixed_noise):
    grid = _grid(3, 8)
    X = torch.rand(500, 3, dtype=DTYPE)
    y = torch.randn(500, dtype=DTYPE)
    noise = 0.05 + 0.1 * torch.rand(500, dtype=DTYPE) if fixed_noise else None
    data = DataStatistics.empty(grid.grid_size, y, fixed_noise).add(grid.weights(X), y, noise)
    stats = data.to_grid(sparse=True, chunk=128)  # four chunks through CellGram
    dense = GridStatistics.empty(grid.num_grid, y, fixed_noise, sparse=False)
    dense = dense.add(grid.weights(X), y, noise)
    assert stats.sparse and stats.pending == ()
    scale = dense.A.abs().max()
    assert (stats.A.to_dense() - dense.A).abs().max() <= 1e-13 * scale
    torch.testing.assert_close(stats.b, dense.b, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(stats.c, dense.c, rtol=1e-13, atol=0)
    assert stats.count == 500
    if fixed_noise:
        torch.testing.assert_close(stats.sum_log_noise, noise.log().sum())
        torch.testing.assert_close(stats.sum_noise, noise.sum())


def test_rows_without_axes_take_the_direct_path_and_are_merged():
    grid = _grid(2, 9)
    X, y = torch.rand(60, 2, dtype=DTYPE), torch.randn(60, dtype=DTYPE)
    full = grid.weights(X)
    plain = InterpolationWeights(full.indices[:20], full.values[:20], full.num_grid)  # no axes
    structured = grid.weights(X[20:])
    chunks = [(plain, y[:20], None), (structured, y[20:], None)]
    stats = GridStatistics.of_rows(chunks, grid.num_grid, y, fixed_noise=False, sparse=True)
    W = full.to_dense()
    torch.testing.assert_close(stats.A.to_dense(), W.mT @ W, rtol=0, atol=1e-13)
    torch.testing.assert_close(stats.b, W.mT @ y, rtol=0, atol=1e-13)
