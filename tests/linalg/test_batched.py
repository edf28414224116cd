"""A batch of grid-space models in one set of tensors, member by member equal to single ones.

Issue 40's batched WiskiGP (``train_X``: ``b x n x d``, hyperparameters with ``batch_shape``
as in a batched ``SingleTaskGP``) rests on the linear algebra carrying a leading batch
dimension: the kernel root (batched Kronecker factors), the grid statistics (``b x m x m``
Gram matrices), the marginal likelihood, the factorisation, the streaming root update and
the low-rank conditioning. Each is checked here against the same computation on every
member alone, with that member's rows and hyperparameters.
"""

from __future__ import annotations

import pytest
import torch
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from streamgp.interpolation import CubicGridInterpolation
from streamgp.linalg import grid_kernel_root
from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.linalg.prior_variance import PriorVarianceCorrection
from streamgp.linalg.statistics import GridStatistics
from streamgp.linalg.woodbury import LowRankCorrection, fold_low_rank, update_root

DTYPE = torch.float64
BATCH = 3
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _kernel(kind: str, d: int, batch_shape: torch.Size = torch.Size([])):  # noqa: B008
    r"""A kernel of ``kind`` with distinct hyperparameters per batch member."""
    if kind == "botorch":  # SingleTaskGP's own (an RBF with priors, no outputscale)
        kernel = get_covar_module_with_dim_scaled_prior(ard_num_dims=d, batch_shape=batch_shape)
        lengthscale = 0.2 + 0.1 * torch.arange(d, dtype=DTYPE)
        members = torch.arange(max(1, batch_shape.numel()), dtype=DTYPE)
        kernel = kernel.to(DTYPE)
        kernel.lengthscale = (lengthscale + 0.05 * members.unsqueeze(-1)).reshape(
            *batch_shape, 1, d
        )
        return kernel
    base = (
        RBFKernel(ard_num_dims=d, batch_shape=batch_shape)
        if kind == "rbf"
        else MaternKernel(nu=2.5, ard_num_dims=d, batch_shape=batch_shape)
    )
    kernel = ScaleKernel(base, batch_shape=batch_shape).to(DTYPE)
    members = torch.arange(max(1, batch_shape.numel()), dtype=DTYPE)
    lengthscale = torch.tensor([0.3, 0.5, 0.7][:d], dtype=DTYPE)
    kernel.base_kernel.lengthscale = (lengthscale + 0.05 * members.unsqueeze(-1)).reshape(
        *batch_shape, 1, d
    )
    kernel.outputscale = (1.3 + 0.2 * members).reshape(batch_shape)
    return kernel


def _member_kernel(kernel, kind: str, d: int, i: int):
    r"""An unbatched kernel holding member ``i``'s hyperparameters."""
    single = _kernel(kind, d)
    for (name, param), (_, batched) in zip(
        single.named_parameters(), kernel.named_parameters(), strict=True
    ):
        with torch.no_grad():
            param.copy_(batched[i].reshape(param.shape))
        assert name
    return single


def _setup(kind: str, d: int, fixed_noise: bool = False):
    interpolation = CubicGridInterpolation(
        torch.tensor([[0.0] * d, [1.0] * d], dtype=DTYPE), {1: 20, 2: 9, 3: 6}[d]
    )
    X = torch.rand(BATCH, 15, d, dtype=DTYPE)
    y = torch.sin(5 * X).sum(-1) + 0.1 * torch.arange(BATCH, dtype=DTYPE).unsqueeze(-1)
    noise = 0.01 + 0.05 * torch.rand(BATCH, 15, dtype=DTYPE) if fixed_noise else None
    kernel = _kernel(kind, d, torch.Size([BATCH]))
    return interpolation, X, y, noise, kernel


def _statistics(interpolation, X, y, noise, fixed_noise, batch_shape=()):
    stats = GridStatistics.empty(
        interpolation.num_grid, y, fixed_noise, sparse=False, batch_shape=batch_shape
    )
    return stats.add(interpolation.weights(X), y, noise)


@pytest.mark.parametrize("kind", ["rbf", "botorch", "matern"])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_a_batched_kernel_has_each_members_root(kind, d):
    interpolation, *_, kernel = _setup(kind, d)
    root = grid_kernel_root(kernel, interpolation.grid)
    assert root.batch_shape == torch.Size([BATCH])
    dense = root.to_dense()
    rhs = torch.randn(BATCH, interpolation.num_grid, 2, dtype=DTYPE)
    for i in range(BATCH):
        single = grid_kernel_root(_member_kernel(kernel, kind, d, i), interpolation.grid)
        torch.testing.assert_close(dense[i], single.to_dense(), **TOL)
        torch.testing.assert_close(root.matmul(rhs)[i], single.matmul(rhs[i]), **TOL)
        torch.testing.assert_close(root.t_matmul(rhs)[i], single.t_matmul(rhs[i]), **TOL)
        # a vector (m) and one shared m x p right-hand side broadcast over the members
        torch.testing.assert_close(root.matmul(rhs[0, :, 0])[i], single.matmul(rhs[0, :, 0]))
        torch.testing.assert_close(root.t_matmul(rhs[0])[i], single.t_matmul(rhs[0]), **TOL)


@pytest.mark.parametrize("fixed_noise", [False, True])
@pytest.mark.parametrize("d", [1, 2])
def test_batched_statistics_are_each_members(fixed_noise, d):
    interpolation, X, y, noise, _ = _setup("rbf", d, fixed_noise)
    stats = _statistics(interpolation, X, y, noise, fixed_noise, (BATCH,))
    assert stats.A.shape == (BATCH, interpolation.num_grid, interpolation.num_grid)
    for i in range(BATCH):
        single = _statistics(
            interpolation, X[i], y[i], None if noise is None else noise[i], fixed_noise
        )
        for name in ("A", "b", "c", "n", "sum_log_noise", "sum_noise"):
            batched = getattr(stats, name)
            expected = getattr(single, name)
            member = batched if batched.dim() == expected.dim() else batched[i]
            torch.testing.assert_close(member, expected, rtol=1e-13, atol=1e-13)
        shifted, single_shifted = (
            stats.shift(torch.tensor([0.5, -1.0, 2.0], dtype=DTYPE)),
            (single.shift(torch.tensor([0.5, -1.0, 2.0], dtype=DTYPE)[i])),
        )
        torch.testing.assert_close(shifted.b[i], single_shifted.b, **TOL)
        torch.testing.assert_close(shifted.c[i], single_shifted.c, **TOL)


@pytest.mark.parametrize("kind", ["rbf", "botorch", "matern"])
@pytest.mark.parametrize("fixed_noise", [False, True])
@pytest.mark.parametrize("d", [1, 2])
def test_batched_likelihood_and_gradients_are_each_members(kind, fixed_noise, d):
    interpolation, X, y, noise, kernel = _setup(kind, d, fixed_noise)
    s2 = torch.tensor([0.02, 0.04, 0.08], dtype=DTYPE, requires_grad=True)
    stats = _statistics(interpolation, X, y, noise, fixed_noise, (BATCH,))
    value = stats.log_marginal_likelihood(grid_kernel_root(kernel, interpolation.grid), s2)
    assert value.shape == (BATCH,)
    params = [*kernel.parameters(), s2]
    # Summed over the members, as gpytorch's ExactMarginalLogLikelihood of a batched
    # model: the gradient of member i's parameters is member i's own gradient.
    grads = torch.autograd.grad(value.sum(), params, allow_unused=True)
    for i in range(BATCH):
        single_kernel = _member_kernel(kernel, kind, d, i)
        single_s2 = s2[i].detach().clone().requires_grad_(True)
        single = _statistics(
            interpolation, X[i], y[i], None if noise is None else noise[i], fixed_noise
        )
        expected = single.log_marginal_likelihood(
            grid_kernel_root(single_kernel, interpolation.grid), single_s2
        )
        torch.testing.assert_close(value[i], expected, **TOL)
        single_params = [*single_kernel.parameters(), single_s2]
        expected_grads = torch.autograd.grad(expected, single_params, allow_unused=True)
        for batched, single_grad in zip(grads, expected_grads, strict=True):
            if single_grad is None:  # the noise level with fixed noise
                assert batched is None or batched.abs().max() == 0
                continue
            torch.testing.assert_close(batched[i].reshape(single_grad.shape), single_grad, **TOL)


def _posteriors(kind: str, d: int, fixed_noise: bool):
    interpolation, X, y, noise, kernel = _setup(kind, d, fixed_noise)
    s2 = torch.tensor([0.02, 0.04, 0.08], dtype=DTYPE)
    stats = _statistics(interpolation, X, y, noise, fixed_noise, (BATCH,))
    with torch.no_grad():
        batched = stats.posterior(grid_kernel_root(kernel, interpolation.grid), s2)
        singles = [
            _statistics(
                interpolation, X[i], y[i], None if noise is None else noise[i], fixed_noise
            ).posterior(
                grid_kernel_root(_member_kernel(kernel, kind, d, i), interpolation.grid), s2[i]
            )
            for i in range(BATCH)
        ]
    return interpolation, s2, batched, singles


@pytest.mark.parametrize("kind", ["rbf", "matern"])
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_batched_posterior_and_streaming_update_are_each_members(kind, fixed_noise):
    d = 2
    interpolation, s2, batched, singles = _posteriors(kind, d, fixed_noise)
    assert batched.root.shape[:-2] == (BATCH,) and batched.mean.shape[:-1] == (BATCH,)
    for i, single in enumerate(singles):
        torch.testing.assert_close(batched.root[i], single.root, **TOL)
        torch.testing.assert_close(batched.mean[i], single.mean, **TOL)
    # observe: each member absorbs its own q rows (b x q x d) in O(m^2 q)
    X_q = torch.rand(BATCH, 4, d, dtype=DTYPE)
    y_q = torch.cos(3 * X_q).sum(-1)
    noise_q = s2.unsqueeze(-1).expand(BATCH, 4)
    if fixed_noise:
        noise_q = 0.01 + 0.05 * torch.rand(BATCH, 4, dtype=DTYPE)
    updated = update_root(batched, interpolation.weights(X_q), y_q, noise_q)
    for i, single in enumerate(singles):
        expected = update_root(single, interpolation.weights(X_q[i]), y_q[i], noise_q[i])
        torch.testing.assert_close(updated.root[i], expected.root, **TOL)
        torch.testing.assert_close(updated.mean[i], expected.mean, **TOL)


def _conditioned(q: int):
    """Batched and per-member posteriors, and the batched one conditioned on ``q`` rows."""
    interpolation, s2, batched, singles = _posteriors("rbf", 2, False)
    X_q = torch.rand(BATCH, q, 2, dtype=DTYPE)
    y_q = torch.randn(BATCH, q, dtype=DTYPE)
    noise_q = s2.unsqueeze(-1).expand(BATCH, q)
    correction = batched.no_correction.condition(batched, interpolation.weights(X_q), y_q, noise_q)
    return interpolation, batched, singles, (X_q, y_q, noise_q), correction


def test_batched_conditioning_and_prediction_are_each_members():
    interpolation, batched, singles, (X_q, y_q, noise_q), correction = _conditioned(3)
    X_star = torch.rand(5, 2, dtype=DTYPE)  # shared test points broadcast over the members
    mean, covar = correction.predict(batched, interpolation.weights(X_star))
    assert mean.shape == (BATCH, 5) and covar.shape == (BATCH, 5, 5)
    for i, single in enumerate(singles):
        expected = LowRankCorrection.empty(single.root.shape[-1], single.mean).condition(
            single, interpolation.weights(X_q[i]), y_q[i], noise_q[i]
        )
        expected_mean, expected_covar = expected.predict(single, interpolation.weights(X_star))
        torch.testing.assert_close(mean[i], expected_mean, **TOL)
        torch.testing.assert_close(covar[i], expected_covar, **TOL)


def test_batched_statistics_of_rows_in_chunks_are_the_sums():
    interpolation, X, y, noise, _ = _setup("rbf", 2, True)
    chunks = (
        (interpolation.weights(X[:, start : start + 4]), y[:, start : start + 4], noise[:, start:])
        for start in range(0, 15, 4)
    )
    chunks = ((w, y_c, n_c[:, : y_c.shape[-1]]) for w, y_c, n_c in chunks)
    stats = GridStatistics.of_rows(
        chunks, interpolation.num_grid, y, True, sparse=False, batch_shape=(BATCH,)
    )
    expected = _statistics(interpolation, X, y, noise, True, (BATCH,))
    for name in ("A", "b", "c", "n", "sum_log_noise", "sum_noise"):
        torch.testing.assert_close(getattr(stats, name), getattr(expected, name), **TOL)
    with pytest.raises(ValueError, match="unbatched"):
        GridStatistics.empty(interpolation.num_grid, y, True, sparse=True, batch_shape=(BATCH,))


@pytest.mark.parametrize("kind", ["rbf", "matern"])
def test_batched_predictive_covariance_and_exact_prior_variance_are_each_members(kind):
    d = 2
    interpolation, s2, batched, singles = _posteriors(kind, d, False)
    _, _, _, _, kernel = _setup(kind, d)
    X_q = torch.rand(BATCH, 3, d, dtype=DTYPE)
    y_q = torch.randn(BATCH, 3, dtype=DTYPE)
    correction = batched.no_correction.condition(
        batched, interpolation.weights(X_q), y_q, s2.unsqueeze(-1)
    )
    X_star = torch.rand(6, d, dtype=DTYPE)
    weights = interpolation.weights(X_star)
    with torch.no_grad():
        root = grid_kernel_root(kernel, interpolation.grid)
        prior = PriorVarianceCorrection(kernel, root, interpolation.bounds[:1])
        diagonal = prior(X_star, weights)
        mean, positive, negative = correction.predict_factors(batched, weights)
    assert positive[0].shape == (BATCH, 6, interpolation.num_grid)
    covar = PosteriorCovariance(positive, negative, diagonal, batch_shape=mean.shape[:-1])
    assert diagonal.shape == (BATCH, 6) and covar.shape == (BATCH, 6, 6)
    for i in range(BATCH):
        single_kernel = _member_kernel(kernel, kind, d, i)
        with torch.no_grad():
            single_root = grid_kernel_root(single_kernel, interpolation.grid)
            single_prior = PriorVarianceCorrection(
                single_kernel, single_root, interpolation.bounds[:1]
            )
            single_diagonal = single_prior(X_star, weights)
            single_correction = singles[i].no_correction.condition(
                singles[i], interpolation.weights(X_q[i]), y_q[i], s2[i].expand(3)
            )
            factors = single_correction.predict_factors(singles[i], weights)
        expected = PosteriorCovariance(factors[1], factors[2], single_diagonal)
        torch.testing.assert_close(diagonal[i], single_diagonal, **TOL)
        torch.testing.assert_close(mean[i], factors[0], **TOL)
        torch.testing.assert_close(covar.diagonal()[i], expected.diagonal(), **TOL)
        torch.testing.assert_close(covar.to_dense()[i], expected.to_dense(), **TOL)


def test_batched_fold_of_a_correction_is_each_members():
    interpolation, batched, singles, (X_q, y_q, noise_q), correction = _conditioned(4)
    folded = fold_low_rank(batched, correction.V, correction.gamma)
    # folding the held rows equals absorbing them by the streaming update
    streamed = update_root(batched, interpolation.weights(X_q), y_q, noise_q)
    torch.testing.assert_close(folded.mean, streamed.mean, **TOL)
    torch.testing.assert_close(
        folded.root @ folded.root.mT, streamed.root @ streamed.root.mT, **TOL
    )
    for i, single in enumerate(singles):
        single_correction = single.no_correction.condition(
            single, interpolation.weights(X_q[i]), y_q[i], noise_q[i]
        )
        expected = fold_low_rank(single, single_correction.V, single_correction.gamma)
        torch.testing.assert_close(folded.root[i], expected.root, **TOL)
        torch.testing.assert_close(folded.mean[i], expected.mean, **TOL)
