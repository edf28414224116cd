"""Softmax interpolation (SoftKI, Definition 4.1): dense and top-k forms against formulas."""

from __future__ import annotations

import pytest
import torch

from streamgp.interpolation.grid import InterpolationWeights
from streamgp.interpolation.softmax import (
    DenseInterpolationWeights,
    softmax_interpolation,
    softmax_weights,
)
from streamgp.linalg.statistics import GridStatistics

DTYPE = torch.float64


def explicit_weights(X, Z, T, squared=False):
    """exp(-||x - z|| / T) normalised per row, from explicit differences (no expansion)."""
    dist = (X.unsqueeze(-2) - Z).norm(dim=-1)
    logits = -(dist.square() if squared else dist) / T
    w = (logits - logits.max(-1, keepdim=True).values).exp()
    return w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("squared", [False, True])
def test_dense_weights_match_definition_and_rows_sum_to_one(squared):
    X, Z = torch.rand(2, 7, 3, dtype=DTYPE), torch.rand(11, 3, dtype=DTYPE)
    W = softmax_weights(X, Z, 0.2, squared=squared)
    assert W.shape == (2, 7, 11)
    torch.testing.assert_close(W, explicit_weights(X, Z, 0.2, squared), atol=1e-12, rtol=0)
    torch.testing.assert_close(W.sum(-1), torch.ones(2, 7, dtype=DTYPE))


def test_top_k_equals_dense_when_k_is_m_and_renormalises_otherwise():
    X, Z = torch.rand(9, 4, dtype=DTYPE), torch.rand(13, 4, dtype=DTYPE)
    dense = softmax_weights(X, Z, 0.1)
    full = softmax_interpolation(X, Z, 0.1, top_k=13)
    assert isinstance(full, InterpolationWeights) and full.indices.shape == (9, 13)
    torch.testing.assert_close(full.to_dense(), dense, atol=1e-14, rtol=0)
    sparse = softmax_interpolation(X, Z, 0.1, top_k=3)
    kept = dense.topk(3, dim=-1)
    torch.testing.assert_close(sparse.values, kept.values / kept.values.sum(-1, keepdim=True))
    assert torch.equal(sparse.indices, kept.indices)
    torch.testing.assert_close(sparse.values.sum(-1), torch.ones(9, dtype=DTYPE))


@pytest.mark.parametrize("top_k", [None, 5, 16])
def test_weights_products_and_grid_statistics_equal_dense_computations(top_k):
    """The SKI seam: InterpolationWeights / DenseInterpolationWeights products and
    GridStatistics.add equal the dense W^T v and W^T diag(p) W."""
    X, Z = torch.rand(20, 3, dtype=DTYPE), torch.rand(16, 3, dtype=DTYPE)
    weights = softmax_interpolation(X, Z, 0.15, top_k=top_k)
    W = weights.to_dense()
    v, p = torch.randn(20, dtype=DTYPE), torch.rand(20, dtype=DTYPE) + 0.5
    torch.testing.assert_close(weights.t_matvec(v), W.mT @ v)
    torch.testing.assert_close(weights.weighted_gram(p), W.mT @ (p.unsqueeze(-1) * W))
    torch.testing.assert_close(
        weights.weighted_gram(p, sparse=True).to_dense(), W.mT @ (p.unsqueeze(-1) * W)
    )
    rhs = torch.randn(16, 4, dtype=DTYPE)
    torch.testing.assert_close(weights.matmul(rhs), W @ rhs)
    torch.testing.assert_close(weights.dot(rhs[:, 0]), W @ rhs[:, 0])
    stats = GridStatistics.empty(16, v, fixed_noise=False, sparse=False).add(weights, v)
    torch.testing.assert_close(stats.A, W.mT @ W)
    torch.testing.assert_close(stats.b, W.mT @ v)
    torch.testing.assert_close(stats.c, v @ v)


def test_dense_weights_cat_detach_and_batch():
    a = DenseInterpolationWeights(torch.rand(2, 3, 5, dtype=DTYPE))
    b = DenseInterpolationWeights(torch.rand(4, 5, dtype=DTYPE))
    both = a.cat(b)
    assert both.values.shape == (2, 7, 5) and both.num_grid == 5 and both.num_rows == 7
    assert not a.detach().values.requires_grad
    with pytest.raises(ValueError, match="Cannot stack"):
        a.cat(DenseInterpolationWeights(torch.rand(1, 4, dtype=DTYPE)))


def test_differentiable_in_inputs_points_and_temperature():
    X = torch.rand(5, 2, dtype=DTYPE, requires_grad=True)
    Z = torch.rand(6, 2, dtype=DTYPE, requires_grad=True)
    T = torch.tensor(0.3, dtype=DTYPE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, z, t: softmax_weights(x, z, t), (X, Z, T))
    # A point sitting exactly on an interpolation point has finite gradients.
    X_on = Z.detach()[:2].clone().requires_grad_(True)
    softmax_weights(X_on, Z, T)[:, 0].sum().backward()
    assert torch.isfinite(X_on.grad).all() and torch.isfinite(T.grad).all()


def test_tiny_temperature_gives_nearest_point_one_hot():
    Z = torch.rand(10, 3, dtype=DTYPE)
    X = Z[[3, 7]] + 1e-4
    W = softmax_weights(X, Z, 1e-9)
    assert torch.isfinite(W).all()
    torch.testing.assert_close(W, torch.eye(10, dtype=DTYPE)[[3, 7]], atol=0, rtol=0)


def test_float32_rows_sum_to_one():
    X, Z = torch.rand(50, 8), torch.rand(32, 8)
    W = softmax_weights(X, Z, 0.05)
    assert W.dtype == torch.float32
    torch.testing.assert_close(W, explicit_weights(X, Z, 0.05), atol=1e-4, rtol=0)


@pytest.mark.parametrize("top_k", [0, 17, 2.0, True])
def test_bad_top_k_raises(top_k):
    with pytest.raises(ValueError, match="top_k"):
        softmax_interpolation(torch.rand(3, 2), torch.rand(16, 2), 0.1, top_k=top_k)
