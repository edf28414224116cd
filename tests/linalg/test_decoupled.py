"""Decoupled (SVDGP) posterior algebra against its dense definition.

Oracles: the Cheng & Boots (2017) definitions with explicit inverses,
``k(x, x') = k_xx' - k_xb (B^-1 + K_b)^-1 k_bx'`` (or, for singular ``B``, the
equivalent ``K_b^-1 - K_b^-1 (K_b^-1 + B)^-1 K_b^-1``); with equal bases the SVGP
``q(u) = N(K a, (K^-1 + B)^-1)`` of :mod:`oracles.svdgp`, whose KL to the prior comes
from ``torch.distributions``; and Titsias' optimum (:mod:`oracles.variational`).
"""

import itertools

import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from oracles import rel_err
from oracles.svdgp import svgp_elbo, svgp_parameters_from_decoupled
from oracles.variational import titsias_optimum
from torch.distributions import MultivariateNormal, kl_divergence

from streamgp.linalg.decoupled import (
    decoupled_covariance,
    decoupled_kl,
    decoupled_predictive,
    gaussian_optimal_parameters,
    mean_kl_term,
)

DTYPE = torch.float64


def make_kernel():
    kernel = ScaleKernel(RBFKernel()).to(DTYPE)
    kernel.base_kernel.lengthscale = 0.3
    kernel.outputscale = 1.5
    return kernel


def K(kernel, A, B):
    with torch.no_grad():
        return kernel(A, B).to_dense()


def bases(m_alpha=7, m_beta=5):
    alpha = torch.rand(m_alpha, 1, dtype=DTYPE)
    beta = torch.rand(m_beta, 1, dtype=DTYPE)
    return alpha, beta


def random_root(m, scale=1.0):
    L = torch.randn(m, m, dtype=DTYPE).tril()
    L.diagonal().copy_(0.5 + torch.rand(m, dtype=DTYPE))  # nonsingular
    return scale * L


def test_h_factor_is_cholesky_of_its_definition():
    kernel = make_kernel()
    _, beta = bases()
    K_b, L = K(kernel, beta, beta), random_root(5)
    factors = decoupled_covariance(K_b, L)
    H = torch.eye(5, dtype=DTYPE) + L.T @ K_b @ L
    assert torch.equal(factors.root, L)
    assert torch.equal(factors.H_chol, factors.H_chol.tril())
    assert rel_err(factors.H_chol @ factors.H_chol.T, H) < 1e-13


@pytest.mark.parametrize("diag", [False, True])
def test_predictive_matches_dense_definition_batched(diag):
    kernel = make_kernel()
    alpha, beta = bases()
    Xs = torch.rand(3, 6, 1, dtype=DTYPE)  # batch x n x d
    a, L = torch.randn(7, dtype=DTYPE), random_root(5)
    K_b = K(kernel, beta, beta)
    K_xx = K(kernel, Xs, Xs)
    prior_mean = torch.randn(3, 6, dtype=DTYPE)
    mean, covar = decoupled_predictive(
        prior_mean,
        K(kernel, Xs, alpha),
        a,
        K_xx.diagonal(dim1=-2, dim2=-1) if diag else K_xx,
        K(kernel, Xs, beta),
        decoupled_covariance(K_b, L),
    )
    B_inv = torch.linalg.inv(L @ L.T)
    K_xb = K(kernel, Xs, beta)
    ref_covar = K_xx - K_xb @ torch.linalg.inv(B_inv + K_b) @ K_xb.mT
    ref_mean = prior_mean + K(kernel, Xs, alpha) @ a
    assert rel_err(mean, ref_mean) < 1e-12
    if diag:
        assert covar.shape == (3, 6)
        assert rel_err(covar, ref_covar.diagonal(dim1=-2, dim2=-1)) < 1e-9
    else:
        assert covar.shape == (3, 6, 6)
        assert rel_err(covar, ref_covar) < 1e-9


def test_predictive_with_singular_root_uses_no_inverse_of_b():
    """A rank-deficient ``B`` (e.g. the padded QR root for ``n < M_beta``) is allowed."""
    kernel = make_kernel()
    _, beta = bases(m_beta=6)
    Xs = torch.rand(4, 1, dtype=DTYPE)
    L = random_root(6)
    L[:, 3:] = 0.0  # rank 3
    K_b = K(kernel, beta, beta) + 1e-8 * torch.eye(6, dtype=DTYPE)
    K_xb = K(kernel, Xs, beta)
    _, covar = decoupled_predictive(
        torch.zeros(4, dtype=DTYPE),
        torch.zeros(4, 1, dtype=DTYPE),
        torch.zeros(1, dtype=DTYPE),
        K(kernel, Xs, Xs),
        K_xb,
        decoupled_covariance(K_b, L),
    )
    # (B^-1 + K)^-1 = K^-1 - K^-1 (K^-1 + B)^-1 K^-1 (Woodbury), no B^-1 needed.
    K_inv = torch.linalg.inv(K_b)
    middle = K_inv - K_inv @ torch.linalg.inv(K_inv + L @ L.T) @ K_inv
    ref = K(kernel, Xs, Xs) - K_xb @ middle @ K_xb.T
    assert torch.isfinite(covar).all()
    assert rel_err(covar, ref) < 1e-6


def test_kl_with_equal_bases_is_the_gaussian_kl():
    kernel = make_kernel()
    Z = torch.linspace(0, 1, 6, dtype=DTYPE).unsqueeze(-1)
    K_zz = K(kernel, Z, Z) + 1e-6 * torch.eye(6, dtype=DTYPE)
    a, L = torch.randn(6, dtype=DTYPE), random_root(6, scale=0.7)
    kl = decoupled_kl(mean_kl_term(a, K_zz), decoupled_covariance(K_zz, L))
    zero = torch.zeros(6, dtype=DTYPE)
    m, S = svgp_parameters_from_decoupled(K_zz, zero, a, L @ L.T)
    ref = kl_divergence(MultivariateNormal(m, S), MultivariateNormal(zero, K_zz))
    assert abs(kl - ref) < 1e-7 * max(1.0, abs(ref.item()))


def test_kl_and_its_gradients_match_equation_9_densely():
    """Distinct bases: Eq. 9 with explicit log-det, inverse and trace."""
    kernel = make_kernel()
    alpha, beta = bases()
    K_a, K_b = K(kernel, alpha, alpha), K(kernel, beta, beta)
    a = torch.randn(7, dtype=DTYPE, requires_grad=True)
    L = random_root(5).requires_grad_(True)
    kl = decoupled_kl(mean_kl_term(a, K_a), decoupled_covariance(K_b, L))
    H = torch.eye(5, dtype=DTYPE) + L.T @ K_b @ L
    ref = (
        0.5 * a @ K_a @ a
        + 0.5 * torch.logdet(H)
        - 0.5 * torch.trace(K_b @ L @ torch.linalg.inv(H) @ L.T)
    )
    assert abs(kl - ref) < 1e-12 * abs(ref)
    grads = torch.autograd.grad(kl, [a, L])
    grads_ref = torch.autograd.grad(ref, [a, L])
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert torch.isfinite(g).all() and rel_err(g, g_ref) < 1e-9
    # KL >= 0, and = 0 exactly at the prior (a = 0, B = 0).
    assert kl > 0
    zero_kl = decoupled_kl(
        mean_kl_term(torch.zeros(7, dtype=DTYPE), K_a),
        decoupled_covariance(K_b, torch.zeros(5, 5, dtype=DTYPE)),
    )
    assert zero_kl == 0


@pytest.mark.parametrize("size", [1, 3])
def test_column_sampled_mean_term_is_unbiased_with_unbiased_gradient(size):
    kernel = make_kernel()
    alpha, _ = bases()
    K_a = K(kernel, alpha, alpha)
    a = torch.randn(7, dtype=DTYPE, requires_grad=True)
    exact = mean_kl_term(a, K_a)
    assert abs(exact - 0.5 * a.detach() @ K_a @ a.detach()) < 1e-13 * exact
    subsets = [list(c) for c in itertools.combinations(range(7), size)]
    estimates = torch.stack([mean_kl_term(a, K_a[:, c], torch.tensor(c)) for c in subsets])
    assert estimates.std() > 1e-3  # a genuine estimate, not the exact value
    torch.testing.assert_close(estimates.mean(), exact, rtol=1e-12, atol=0.0)
    grad = torch.autograd.grad(estimates.mean(), a)[0]
    torch.testing.assert_close(grad, K_a @ a.detach(), rtol=1e-12, atol=1e-12)


def test_gaussian_optimal_parameters_equal_ridge_and_titsias_closed_forms():
    kernel = make_kernel()
    # Well-separated bases: the ridge system is well conditioned, so the jitter is invisible.
    alpha = torch.linspace(0, 1, 6, dtype=DTYPE).unsqueeze(-1)
    beta = torch.linspace(0.05, 0.95, 5, dtype=DTYPE).unsqueeze(-1)
    X = torch.rand(30, 1, dtype=DTYPE)
    y = torch.sin(6 * X.squeeze(-1)) + 0.1 * torch.randn(30, dtype=DTYPE)
    prior = 0.3 * torch.ones(30, dtype=DTYPE)
    noise = torch.tensor(0.05, dtype=DTYPE)
    K_a, K_xa = K(kernel, alpha, alpha), K(kernel, X, alpha)
    K_b, K_xb = K(kernel, beta, beta), K(kernel, X, beta)
    a, L = gaussian_optimal_parameters(K_a, K_xa, y - prior, K_b, K_xb, noise)
    assert a.shape == (6,) and L.shape == (5, 5) and torch.equal(L, L.tril())
    # Mean: the kernel ridge normal equations.
    ref_a = torch.linalg.solve(K_xa.T @ K_xa + noise * K_a, K_xa.T @ (y - prior))
    assert rel_err(a, ref_a) < 1e-6
    # Covariance: B = K_b^-1 K_bx K_xb K_b^-1 / s2, which is Titsias' optimal S.
    K_b_inv = torch.linalg.inv(K_b)
    B = K_b_inv @ K_xb.T @ K_xb @ K_b_inv / noise
    assert rel_err(L @ L.T, B) < 1e-6
    zero = torch.zeros(5, dtype=DTYPE)
    _, S_opt = titsias_optimum(K_b, K_xb.T, y, noise.item(), zero, prior)
    _, S = svgp_parameters_from_decoupled(K_b, zero, zero, L @ L.T)
    assert rel_err(S, S_opt) < 1e-6


def test_gaussian_optimal_parameters_with_equal_bases_maximise_the_svgp_elbo():
    kernel = make_kernel()
    Z = torch.linspace(0, 1, 5, dtype=DTYPE).unsqueeze(-1)
    X = torch.rand(25, 1, dtype=DTYPE)
    y = torch.cos(5 * X.squeeze(-1)) + 0.1 * torch.randn(25, dtype=DTYPE)
    noise = torch.tensor(0.05, dtype=DTYPE)
    K_zz, K_xz = K(kernel, Z, Z), K(kernel, X, Z)
    a, L = gaussian_optimal_parameters(K_zz, K_xz, y, K_zz, K_xz, noise)
    zero5, zero25 = torch.zeros(5, dtype=DTYPE), torch.zeros(25, dtype=DTYPE)
    m, S = svgp_parameters_from_decoupled(K_zz, zero5, a, L @ L.T)
    m_opt, S_opt = titsias_optimum(K_zz, K_xz.T, y, noise.item(), zero5, zero25)
    assert rel_err(m, m_opt) < 1e-6 and rel_err(S, S_opt) < 1e-6
    diag = kernel(X, diag=True).detach()
    best = svgp_elbo(m, S, K_zz, K_xz.T, diag, zero5, zero25, y, noise)
    for scale in (0.9, 1.1):
        m2, S2 = svgp_parameters_from_decoupled(K_zz, zero5, scale * a, (scale * L) @ (scale * L).T)
        assert svgp_elbo(m2, S2, K_zz, K_xz.T, diag, zero5, zero25, y, noise) < best


def test_gaussian_optimal_parameters_with_fewer_points_than_basis_pad_the_root():
    kernel = make_kernel()
    _, beta = bases(m_beta=6)
    X = torch.rand(2, 1, dtype=DTYPE)
    noise = torch.tensor(0.1, dtype=DTYPE)
    K_b, K_xb = K(kernel, beta, beta), K(kernel, X, beta)
    _, L = gaussian_optimal_parameters(K_b, K_xb, torch.randn(2, dtype=DTYPE), K_b, K_xb, noise)
    assert L.shape == (6, 6) and torch.equal(L, L.tril())
    assert torch.equal(L[:, 2:], torch.zeros(6, 4, dtype=DTYPE))  # rank n = 2
    K_b_inv = torch.linalg.inv(K_b + 1e-12 * K_b.diagonal().mean() * torch.eye(6, dtype=DTYPE))
    B = K_b_inv @ K_xb.T @ K_xb @ K_b_inv / noise
    assert rel_err(L @ L.T, B) < 1e-5


@pytest.mark.parametrize("noise", [1e-2, 1e-4])
def test_gaussian_optimal_mean_is_accurate_for_a_smooth_kernel_and_small_noise(noise):
    """Mean basis at the data, K_alpha numerically singular (condition ~1e19): the
    posterior mean K a is the exact GP's ``K (K + s2 I)^-1 r`` to 1e-9 (the normal
    equations ``(K^2 + s2 K) a = K r`` lose ~6 digits at s2 = 1e-4)."""
    kernel = make_kernel()
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.3, 2.0
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(40, 1, dtype=DTYPE, generator=gen)
    r = torch.sin(6 * X.squeeze(-1))
    noise = torch.tensor(noise, dtype=DTYPE)
    K_xx = K(kernel, X, X)
    a, _ = gaussian_optimal_parameters(K_xx, K_xx, r, K_xx[:5, :5], K_xx[:, :5], noise)
    eye = torch.eye(40, dtype=DTYPE)
    exact = K_xx @ torch.cholesky_solve(r.unsqueeze(-1), torch.linalg.cholesky(K_xx + noise * eye))
    assert rel_err(K_xx @ a, exact.squeeze(-1)) < 1e-9
