"""Grid-space Woodbury algebra against dense closed forms."""

import math

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from streamgp.interpolation import CubicGridInterpolation
from streamgp.linalg import (
    GridKernelRoot,
    LowRankCorrection,
    factorize,
    fold_low_rank,
    grid_kernel_matrix,
    grid_kernel_root,
    log_marginal_likelihood,
    update_root,
)

DTYPE = torch.float64


def setup(d=2, g=8, n=15):
    interp = CubicGridInterpolation(torch.stack([torch.zeros(d), torch.ones(d)]).to(DTYPE), g)
    kernel = ScaleKernel(RBFKernel(ard_num_dims=d)).to(DTYPE)
    kernel.base_kernel.lengthscale = torch.tensor([0.3, 0.6, 0.45][:d], dtype=DTYPE)
    kernel.outputscale = 2.0
    X = torch.rand(n, d, dtype=DTYPE)
    y = torch.randn(n, dtype=DTYPE)
    noise = 0.05 + 0.1 * torch.rand(n, dtype=DTYPE)
    return interp, kernel, X, y, noise


def dense_grid_posterior(K, W, y, noise):
    Kxx = W @ K @ W.T + torch.diag(noise)
    cross = K @ W.T
    mean = cross @ torch.linalg.solve(Kxx, y)
    cov = K - cross @ torch.linalg.solve(Kxx, cross.T)
    return mean, cov


def test_kronecker_root_matches_dense_kernel():
    interp, kernel, *_ = setup(d=3, g=6)
    with torch.no_grad():
        K = grid_kernel_matrix(kernel, interp.grid)
        root = grid_kernel_root(kernel, interp.grid)
        assert len(root.factors) == 3  # Kronecker form for the separable RBF kernel
        L = root.to_dense()
        assert (L @ L.T - K).abs().max() < 1e-9
        M = torch.randn(root.num_grid, 4, dtype=DTYPE)
        assert torch.allclose(root.matmul(M), L @ M) and torch.allclose(root.t_matmul(M), L.T @ M)
        assert torch.allclose(root.t_matmul(M[:, 0]), L.T @ M[:, 0])
        matern = ScaleKernel(MaternKernel(ard_num_dims=3)).to(DTYPE)
        L2 = grid_kernel_root(matern, interp.grid).to_dense()
        assert (L2 @ L2.T - grid_kernel_matrix(matern, interp.grid)).abs().max() < 1e-9


def test_factorize_update_and_fold_equal_dense_posterior():
    interp, kernel, X, y, noise = setup()
    with torch.no_grad():
        K = grid_kernel_matrix(kernel, interp.grid)
        L_K = grid_kernel_root(kernel, interp.grid)
        W = interp.weights(X)
        prec = noise.reciprocal()
        first = slice(0, 10)
        W1 = interp.weights(X[first])
        post = factorize(L_K, W1.weighted_gram(prec[first]), W1.t_matvec(prec[first] * y[first]))
        mean, cov = dense_grid_posterior(K, W1.to_dense(), y[first], noise[first])
        assert (post.mean - mean).abs().max() < 1e-9
        assert (post.root @ post.root.T - cov).abs().max() < 1e-9
        rest = slice(10, 15)
        updated = update_root(post, interp.weights(X[rest]), y[rest], noise[rest])
        mean_all, cov_all = dense_grid_posterior(K, W.to_dense(), y, noise)
        assert (updated.mean - mean_all).abs().max() < 1e-9
        assert (updated.root @ updated.root.T - cov_all).abs().max() < 1e-9
        correction = LowRankCorrection.empty(interp.num_grid, y).condition(
            post, interp.weights(X[rest]), y[rest], noise[rest]
        )
        folded = fold_low_rank(post, correction.V, correction.gamma)
        assert (folded.mean - mean_all).abs().max() < 1e-9
        assert (folded.root @ folded.root.T - cov_all).abs().max() < 1e-9


def _dense_logdet_minus_quad(factors, A, b, precision):
    """``log|C| - z^T C^{-1} z`` by dense autograd: the oracle of the closed-form gradient."""
    L = factors[0]
    for f in factors[1:]:
        L = torch.kron(L, f)
    p = 1.0 if precision is None else precision
    C = torch.eye(L.shape[-1], dtype=DTYPE) + p * L.mT @ A @ L
    z = p * (b.reshape(-1, b.shape[-1]) @ L)
    quad = (z * torch.linalg.solve(C, z.mT).mT).sum(-1).reshape(b.shape[:-1])
    return torch.logdet(C) - quad


@pytest.mark.parametrize("outputs", [None, 3])
@pytest.mark.parametrize("learned_noise", [True, False])
@pytest.mark.parametrize("g", [5, 6], ids=["m125-torch", "m216-lapack"])
def test_kronecker_marginal_likelihood_gradient_equals_dense_autograd(outputs, learned_noise, g):
    """The closed-form backward (partial traces of C^{-1}) equals autograd through dense C.

    ``m = 216`` takes SciPy's LAPACK path on the CPU (``factor.LAPACK_MIN_SIZE``).
    """
    interp, kernel, X, y, noise = setup(d=3, g=g, n=60)
    W = interp.weights(X).to_dense()
    A = W.T @ (W / noise.unsqueeze(-1))
    Y = y if outputs is None else torch.randn(outputs, len(y), dtype=DTYPE)
    root = grid_kernel_root(kernel, interp.grid)
    factors = [f.detach().clone().requires_grad_() for f in root.factors]
    b = (Y / noise @ W).detach().requires_grad_()
    precision = torch.tensor(2.5, dtype=DTYPE, requires_grad=True) if learned_noise else None
    c = (Y.square() / noise).sum(-1)
    n, log_noise = torch.tensor(float(len(y)), dtype=DTYPE), noise.log().sum()
    value = log_marginal_likelihood(
        GridKernelRoot(tuple(factors)), A, b, c, n, log_noise, precision=precision
    )
    inputs = [*factors, b] + ([precision] if learned_noise else [])
    grads = torch.autograd.grad(value.sum(), inputs)
    dense = _dense_logdet_minus_quad(factors, A, b, precision)
    c_weighted = c if precision is None else precision * c
    expected = -0.5 * (c_weighted + dense + log_noise + n * math.log(2 * math.pi))
    expected_grads = torch.autograd.grad(expected.sum(), inputs)
    assert value.shape == expected.shape
    assert torch.allclose(value, expected, rtol=1e-10, atol=1e-10)
    for got, want in zip(grads, expected_grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-8, atol=1e-8 * want.abs().max())


def test_kronecker_marginal_likelihood_backward_can_be_repeated():
    """``retain_graph``: a second backward gives the same gradients (the factor is reused)."""
    interp, kernel, X, y, noise = setup(d=3, g=6, n=60)
    W = interp.weights(X).to_dense()
    A = W.T @ (W / noise.unsqueeze(-1))
    factors = [
        f.detach().clone().requires_grad_() for f in grid_kernel_root(kernel, interp.grid).factors
    ]
    b = y / noise @ W
    c, n = (y.square() / noise).sum(), torch.tensor(float(len(y)), dtype=DTYPE)
    value = log_marginal_likelihood(GridKernelRoot(tuple(factors)), A, b, c, n, noise.log().sum())
    first = torch.autograd.grad(value, factors, retain_graph=True)
    second = torch.autograd.grad(value, factors)
    for a, b_ in zip(first, second, strict=True):
        assert torch.equal(a, b_)
