"""Grid-space and data-space statistics: one likelihood, one posterior, across the switch."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from oracles import DenseSKIModel, rel_err

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood
from streamgp.interpolation import CubicGridInterpolation
from streamgp.linalg import grid_kernel_matrix, grid_kernel_root
from streamgp.linalg.statistics import DataStatistics, GridStatistics

DTYPE = torch.float64


def _kernel(kind: str, d: int):
    base = RBFKernel(ard_num_dims=d) if kind == "rbf" else MaternKernel(nu=2.5, ard_num_dims=d)
    kernel = ScaleKernel(base).to(DTYPE)
    kernel.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 0.7][:d], dtype=DTYPE)
    kernel.outputscale = 1.3
    return kernel


@pytest.mark.parametrize("kind", ["rbf", "matern"])
@pytest.mark.parametrize("fixed_noise", [False, True])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_data_and_grid_likelihoods_and_gradients_agree(kind, fixed_noise, d):
    interpolation = CubicGridInterpolation(
        torch.tensor([[0.0] * d, [1.0] * d], dtype=DTYPE), {1: 30, 2: 12, 3: 7}[d]
    )
    kernel = _kernel(kind, d)
    X = torch.rand(25, d, dtype=DTYPE)
    y = torch.sin(5 * X).sum(-1)
    noise = 0.01 + 0.05 * torch.rand(25, dtype=DTYPE) if fixed_noise else None
    s2 = torch.tensor(0.04, dtype=DTYPE, requires_grad=True)
    weights = interpolation.weights(X)
    m = interpolation.num_grid
    data = DataStatistics.empty(interpolation.grid_size, y, fixed_noise).add(weights, y, noise)
    grid = GridStatistics.empty(m, y, fixed_noise, sparse=False).add(weights, y, noise)
    torch.testing.assert_close(data.to_grid().A, grid.A, rtol=0, atol=1e-14)

    params = [*kernel.parameters(), s2]
    values, grads = [], []
    for stats in (data, grid):
        value = stats.log_marginal_likelihood(grid_kernel_root(kernel, interpolation.grid), s2)
        values.append(value)
        grads.append(torch.autograd.grad(value, params, allow_unused=True))
    # Oracle: the dense n x n SKI likelihood with K_UU evaluated on all grid points.
    W = weights.to_dense()
    B = W @ grid_kernel_matrix(kernel, interpolation.grid) @ W.mT
    B = B + torch.diag_embed(noise if fixed_noise else s2.expand(25))
    reference = torch.distributions.MultivariateNormal(torch.zeros_like(y), B).log_prob(y)
    for value in values:
        assert abs(value.item() - reference.item()) < 1e-8 * abs(reference.item())
    for g_data, g_grid in zip(*grads, strict=True):
        if g_data is None:  # the noise level with fixed noise
            assert g_grid is None or g_grid.abs().max() == 0
            continue
        assert rel_err(g_data, g_grid) < 1e-8


def _model(X, Y, Yvar=None, **kwargs):
    # Models built from different first batches are compared: no data-fitted transform.
    kwargs = {"outcome_transform": None, **kwargs}
    model = WiskiGP(
        X, Y, Yvar, grid_size=12, covar_module=ScaleKernel(RBFKernel(ard_num_dims=2)), **kwargs
    )
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.3, 0.5], dtype=DTYPE)
    if Yvar is None:
        model.likelihood.noise = 0.04
    return model


def _mll_without_priors(model):
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    priors = sum(p.log_prob(c(m)).sum() for _, m, p, c, _ in mll.model.named_priors())
    return mll() - priors / model.num_train


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_predictions_and_likelihood_are_continuous_across_the_switch(fixed_noise):
    X = torch.rand(60, 2, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    Yvar = 0.01 + 0.05 * torch.rand(60, 1, dtype=DTYPE) if fixed_noise else None
    part = lambda t, sl: None if t is None else t[sl]  # noqa: E731
    # keep_data=False: the raw observations (kept by default for re-grids) are not stored.
    model = _model(X[:20], Y[:20], part(Yvar, slice(20)), data_space_limit=40, keep_data=False)
    assert model.in_data_space
    Xs = torch.rand(7, 2, dtype=DTYPE)
    for start in range(20, 60, 10):
        sl = slice(start, start + 10)
        model.observe(X[sl], Y[sl], part(Yvar, sl))
        n = start + 10
        assert model.in_data_space == (n <= 40)
        oracle = DenseSKIModel(model, X[:n], Y[:n].squeeze(-1), part(Yvar, slice(n)))
        if oracle.noise is not None:
            oracle.noise = oracle.noise.squeeze(-1)
        mean, covar = oracle.latent(Xs)
        post = model.posterior(Xs)
        assert rel_err(post.mean.squeeze(-1), mean) < 1e-8
        assert rel_err(post.covariance_matrix, covar) < 1e-8
        value = _mll_without_priors(model)
        reference = oracle.log_marginal_likelihood() / n
        assert abs(value.item() - reference.item()) < 1e-8 * abs(reference.item())
    # Past the switch only grid statistics remain: memory no longer grows with n.
    assert isinstance(model.statistics, GridStatistics)
    assert all(t.shape[0] != 60 for t in model.state_dict().values() if t.dim())


@pytest.mark.usefixtures("ski_prior_variance")
def test_large_structured_grid_is_exact_in_data_space(monkeypatch):
    """A grid too large for a dense root still has an exact posterior and an MLL at small n."""
    monkeypatch.setattr(WiskiGP, "MAX_DENSE_GRID", 100)
    X = torch.rand(30, 2, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = _model(X, Y)
    assert model.structured and model.in_data_space and model.data_space_limit == 100
    oracle = DenseSKIModel(model, X, Y.squeeze(-1), None)
    Xs = torch.rand(5, 2, dtype=DTYPE)
    mean, covar = oracle.latent(Xs)
    post = model.posterior(Xs)
    assert rel_err(post.mean.squeeze(-1), mean) < 1e-8
    assert rel_err(post.covariance_matrix, covar) < 1e-8
    value = _mll_without_priors(model)
    assert abs(value.item() - oracle.log_marginal_likelihood().item() / 30) < 1e-10
    # Past the limit: sparse grid statistics and the LOVE root, as before.
    Xn = torch.rand(80, 2, dtype=DTYPE)
    model.observe(Xn, torch.sin(5 * Xn).sum(-1, keepdim=True))
    assert not model.in_data_space and model.statistics.A.is_sparse
    assert model.posterior(Xs).variance.min() >= 0


@pytest.mark.parametrize("space_limit", [None, 0])
def test_state_dict_round_trip_keeps_every_row(space_limit):
    X = torch.rand(30, 2, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    Yvar = 0.01 + 0.05 * torch.rand(30, 1, dtype=DTYPE)
    model = _model(X, Y, Yvar, data_space_limit=space_limit)
    fresh = _model(X[:1], Y[:1], Yvar[:1], data_space_limit=space_limit)
    fresh.load_state_dict(model.state_dict(), keep_transforms=False)
    assert fresh.num_train == 30 and fresh.in_data_space == model.in_data_space
    Xs = torch.rand(5, 2, dtype=DTYPE)
    torch.testing.assert_close(fresh.posterior(Xs).mean, model.posterior(Xs).mean)
    torch.testing.assert_close(fresh.likelihood.noise, model.likelihood.noise)
    # A learned-noise model refuses fixed-noise statistics instead of dropping the noise.
    learned = _model(X[:1], Y[:1], data_space_limit=space_limit)
    with pytest.raises(RuntimeError, match="statistics"):
        learned.load_state_dict(model.state_dict(), keep_transforms=False)
    assert learned.num_train == 1


def test_data_space_limit_is_validated():
    X = torch.rand(5, 2, dtype=DTYPE)
    with pytest.raises((TypeError, ValueError), match="data_space_limit"):
        _model(X, X.sum(-1, keepdim=True), data_space_limit=-1)


@pytest.mark.usefixtures("ski_prior_variance")
def test_large_grid_space_batches_rebuild_from_the_statistics():
    """A batch above ROOT_UPDATE_MAX_FRACTION * m is absorbed by refactorising: still exact."""
    X = torch.rand(200, 2, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = _model(X[:20], Y[:20], data_space_limit=0)
    model.posterior(X[:2])  # a cached root that a small batch would update
    assert 180 > WiskiGP.ROOT_UPDATE_MAX_FRACTION * model.interpolation.num_grid
    model.observe(X[20:], Y[20:])
    oracle = DenseSKIModel(model, X, Y.squeeze(-1), None)
    Xs = torch.rand(6, 2, dtype=DTYPE)
    mean, covar = oracle.latent(Xs)
    post = model.posterior(Xs)
    assert rel_err(post.mean.squeeze(-1), mean) < 1e-8
    assert rel_err(post.covariance_matrix, covar) < 1e-8


@pytest.mark.usefixtures("ski_prior_variance")
def test_small_grid_space_batches_are_held_back_and_folded_exactly():
    X = torch.rand(80, 2, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = _model(X[:20], Y[:20], data_space_limit=0)
    model.posterior(X[:2])
    Xs = torch.rand(5, 2, dtype=DTYPE)
    ranks = []
    for start in range(20, 80, 3):
        model.observe(X[start : start + 3], Y[start : start + 3])
        ranks.append(0 if model._correction is None else model._correction.rank)
        n = start + 3
        if n in (23, 38, 80):
            oracle = DenseSKIModel(model, X[:n], Y[:n].squeeze(-1), None)
            mean, covar = oracle.latent(Xs)
            post = model.posterior(Xs)
            assert rel_err(post.mean.squeeze(-1), mean) < 1e-8
            assert rel_err(post.covariance_matrix, covar) < 1e-8
    # Held back as a correction up to FOLD_RANK, then folded into the root and statistics.
    assert max(ranks) < WiskiGP.FOLD_RANK and 0 in ranks[1:] and ranks[0] == 3
    assert model.num_train == 80
    # Nothing observed is missing from the statistics or from a checkpoint.
    fresh = _model(X[:1], Y[:1], data_space_limit=0)
    fresh.load_state_dict(model.state_dict(), keep_transforms=False)
    assert fresh.num_train == 80 == model.statistics.count
    torch.testing.assert_close(fresh.posterior(Xs).mean, model.posterior(Xs).mean)


def test_sparse_statistic_update_inside_and_outside_its_pattern():
    """Adding rows to a sparse A: in-place values when the pattern holds them, else a merge."""
    from streamgp.linalg.statistics import _add_sparse

    interp = CubicGridInterpolation(torch.stack([torch.zeros(2), torch.ones(2)]).double(), 12)
    X = 0.5 * torch.rand(200, 2, dtype=torch.float64)  # (0.99, 0.99) is outside A's pattern
    A = interp.weights(X).weighted_gram(torch.ones(200, dtype=torch.float64), sparse=True)
    for new in (X[:3] + 1e-3, torch.tensor([[0.99, 0.99]], dtype=torch.float64)):
        B = interp.weights(new).weighted_gram(
            torch.ones(len(new), dtype=torch.float64), sparse=True
        )
        total = _add_sparse(A, B)
        keys = total.indices()[0] * interp.num_grid + total.indices()[1]
        assert total.is_coalesced() and (keys[1:] > keys[:-1]).all()  # sorted, unique
        assert torch.allclose(total.to_dense(), A.to_dense() + B.to_dense(), atol=1e-14)


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_sparse_statistics_defer_merges_and_keep_every_row(fixed_noise):
    """Small additions wait as pending Gram matrices; A, the MLL and a device move see all."""
    from streamgp.linalg import statistics as module

    interp = CubicGridInterpolation(torch.stack([torch.zeros(2), torch.ones(2)]).double(), 12)
    X = torch.rand(200, 2, dtype=DTYPE)
    y = torch.randn(200, dtype=DTYPE)
    noise = 0.05 + 0.1 * torch.rand(200, dtype=DTYPE) if fixed_noise else None
    stats = GridStatistics.empty(interp.num_grid, y, fixed_noise, sparse=True)
    stats = stats.add(interp.weights(X[:150]), y[:150], None if noise is None else noise[:150])
    assert stats.pending == () and stats.sparse
    merged_nnz = stats.gram._nnz()
    for start in range(150, 200, 2):  # 4 * 16 non-zeros per row: pending until 1/8 of gram
        rows = slice(start, start + 2)
        stats = stats.add(interp.weights(X[rows]), y[rows], None if noise is None else noise[rows])
        pending_nnz = sum(p._nnz() for p in stats.pending)
        assert pending_nnz <= module.PENDING_FRACTION * stats.gram._nnz()
    assert stats.pending, "the last additions should still be pending"
    assert stats.gram._nnz() > merged_nnz, "an addition past the fraction should have merged"
    full = GridStatistics.empty(interp.num_grid, y, fixed_noise, sparse=False)
    full = full.add(interp.weights(X), y, noise)
    torch.testing.assert_close(stats.A.to_dense(), full.A, rtol=0, atol=1e-13)
    kernel = _kernel("rbf", 2)
    root = grid_kernel_root(kernel, interp.grid)
    s2 = torch.tensor(0.07, dtype=DTYPE)
    value = stats.log_marginal_likelihood(root, s2, tol=1e-10)
    expected = full.log_marginal_likelihood(root, s2)
    assert abs(float(value - expected)) <= 1e-8 * abs(float(expected))
    merged = stats.A
    after = stats.add(interp.weights(X[:1]), y[:1], None if noise is None else noise[:1])
    assert after.gram is merged and len(after.pending) == 1  # the read merge is kept
    moved = stats.apply(lambda t: t.clone())
    assert moved.pending == ()
    torch.testing.assert_close(moved.A.to_dense(), full.A, rtol=0, atol=1e-13)


def test_structured_model_observe_defers_the_merge_and_checkpoints_every_row(monkeypatch):
    monkeypatch.setattr(WiskiGP, "MAX_DENSE_GRID", 100)
    X = torch.rand(120, 2, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = _model(X, Y)
    assert model.structured and not model.in_data_space
    Xn = torch.rand(2, 2, dtype=DTYPE)
    model.observe(Xn, torch.sin(5 * Xn).sum(-1, keepdim=True))
    assert model.statistics.pending, "one small observe should not merge the sparse statistic"
    restored = _model(X[:5], Y[:5])
    assert restored.restore(model.checkpoint()) is restored
    assert restored.num_train == 122 and restored.statistics.pending == ()
    torch.testing.assert_close(
        restored.statistics.A.to_dense(), model.statistics.A.to_dense(), rtol=0, atol=0
    )
