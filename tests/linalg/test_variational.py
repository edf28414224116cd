"""Gaussian algebra of the streaming variational models against dense closed forms.

Oracles: ``torch.distributions`` (KL divergences and entropies of full-rank Gaussians),
explicit dense inverses and log-determinants, :func:`oracles.gaussian_conditioning`
and the pseudo-point exact GP of online variational conditioning
(:func:`oracles.variational.pseudo_point_conditioning`, Maddox et al. 2021, Eq. 5).
"""

import math

import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from oracles import gaussian_conditioning, rel_err
from oracles.sgpr import bui_bound
from oracles.variational import pseudo_point_conditioning, svgp_predictive, titsias_optimum
from torch.distributions import MultivariateNormal, kl_divergence

from streamgp.linalg.variational import (
    condition_on_noisy_observations,
    gaussian_cross_entropy,
    optimal_whitened_posterior,
    streaming_kl_correction,
    whiten_gaussian,
)

DTYPE = torch.float64


def random_spd(*shape, jitter=0.1):
    n = shape[-1]
    F = torch.randn(*shape, n, dtype=DTYPE)
    return F @ F.mT / n + jitter * torch.eye(n, dtype=DTYPE)


def dense_cross_entropy(mean, covar, target_mean, target_covar):
    """``E_N(mean, covar)[-log N(x; target_mean, target_covar)]`` with dense inverses."""
    P_inv = torch.linalg.inv(target_covar)
    d = (mean - target_mean).unsqueeze(-1)
    m = mean.shape[-1]
    trace = (P_inv @ covar).diagonal(dim1=-2, dim2=-1).sum(-1)
    maha = (d.mT @ P_inv @ d).squeeze(-1).squeeze(-1)
    return 0.5 * (trace + maha + torch.logdet(target_covar) + m * math.log(2 * math.pi))


def test_cross_entropy_is_kl_plus_entropy_batched():
    batch, m = (2, 3), 5
    mean, target_mean = torch.randn(*batch, m, dtype=DTYPE), torch.randn(*batch, m, dtype=DTYPE)
    covar, target_covar = random_spd(*batch, m), random_spd(*batch, m)
    root = torch.linalg.cholesky(target_covar)
    value = gaussian_cross_entropy(mean, covar, target_mean, root)
    assert value.shape == batch
    q = MultivariateNormal(mean, covar)
    p = MultivariateNormal(target_mean, target_covar)
    torch.testing.assert_close(value, kl_divergence(q, p) + q.entropy(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(value, dense_cross_entropy(mean, covar, target_mean, target_covar))
    # A triangular root with negative diagonal entries (R D, D = diag(+-1)) is the same density.
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0], dtype=DTYPE)
    flipped = gaussian_cross_entropy(mean, covar, target_mean, root * signs)
    torch.testing.assert_close(flipped, value, rtol=1e-12, atol=1e-12)


def test_cross_entropy_with_singular_covariance_matches_limit():
    m = 4
    F = torch.randn(m, 2, dtype=DTYPE)
    covar = F @ F.T  # rank 2
    mean, target_mean = torch.randn(m, dtype=DTYPE), torch.randn(m, dtype=DTYPE)
    target = random_spd(m)
    value = gaussian_cross_entropy(mean, covar, target_mean, torch.linalg.cholesky(target))
    assert torch.isfinite(value)
    # Linear in covar: the value at covar + eps I approaches it at rate eps.
    eps = 1e-7
    near = dense_cross_entropy(mean, covar + eps * torch.eye(m, dtype=DTYPE), target_mean, target)
    assert abs(value - near) < 10 * eps * torch.linalg.inv(target).trace()
    assert abs(value - near) > 0  # the perturbation is visible: the comparison is sharp


def test_streaming_kl_correction_is_a_difference_of_kls():
    m = 4
    mean, old_mean, prior_mean = (torch.randn(m, dtype=DTYPE) for _ in range(3))
    covar, old_covar, prior_covar = (random_spd(m) for _ in range(3))
    value = streaming_kl_correction(
        mean,
        covar,
        old_mean,
        torch.linalg.cholesky(old_covar),
        prior_mean,
        torch.linalg.cholesky(prior_covar),
    )
    q = MultivariateNormal(mean, covar)
    expected = kl_divergence(q, MultivariateNormal(old_mean, old_covar)) - kl_divergence(
        q, MultivariateNormal(prior_mean, prior_covar)
    )
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-10)
    # Monte Carlo: E_q[log p_old(a) - log q_old(a)] (independent of any closed form).
    a = q.sample(torch.Size([200_000]))
    mc = MultivariateNormal(prior_mean, prior_covar).log_prob(a) - MultivariateNormal(
        old_mean, old_covar
    ).log_prob(a)
    assert abs(mc.mean() - value) < 5 * mc.std() / math.sqrt(len(mc))


def test_streaming_kl_correction_singular_q_is_finite_with_finite_gradients():
    """More old inducing points than new ones: q(a) has rank 2 in 5 dimensions."""
    m, r = 5, 2
    B = torch.randn(m, r, dtype=DTYPE, requires_grad=True)  # q(a) = N(B mu, B S B^T)
    mu = torch.randn(r, dtype=DTYPE, requires_grad=True)
    S_root = torch.randn(r, r, dtype=DTYPE).tril().requires_grad_(True)
    old_mean, prior_mean = torch.randn(m, dtype=DTYPE), torch.randn(m, dtype=DTYPE)
    old_covar, prior_covar = random_spd(m), random_spd(m)
    mean = B @ mu
    covar = B @ S_root @ S_root.T @ B.T
    value = streaming_kl_correction(
        mean,
        covar,
        old_mean,
        torch.linalg.cholesky(old_covar),
        prior_mean,
        torch.linalg.cholesky(prior_covar),
    )
    assert torch.isfinite(value)
    # Dense form: 1/2 [tr((P_old^-1 - P_prior^-1) C) + maha_old - maha_prior + logdets].
    expected = dense_cross_entropy(mean, covar, old_mean, old_covar) - dense_cross_entropy(
        mean, covar, prior_mean, prior_covar
    )
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(value, [B, mu, S_root], retain_graph=True)
    grads_ref = torch.autograd.grad(expected, [B, mu, S_root])
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-10)


def test_condition_on_noisy_observations_matches_dense_conditioning():
    batch, o, r = 3, 2, 4
    mean = torch.randn(batch, o + r, dtype=DTYPE)
    covar = random_spd(batch, o + r)
    targets = torch.randn(5, batch, o, dtype=DTYPE)  # fantasy samples
    noise = torch.tensor([0.1, 0.3], dtype=DTYPE)  # broadcast over the batch
    mean_r, covar_r = condition_on_noisy_observations(mean, covar, o, targets, noise)
    assert mean_r.shape == (5, batch, r) and covar_r.shape == (batch, r, r)
    for j in range(batch):
        for s in range(5):
            ref_mean, ref_cov = gaussian_conditioning(mean[j], covar[j], o, targets[s, j], noise)
            torch.testing.assert_close(mean_r[s, j], ref_mean, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(covar_r[j], ref_cov, rtol=1e-10, atol=1e-10)


def test_conditioning_no_observations_returns_the_marginal():
    mean, covar = torch.randn(5, dtype=DTYPE), random_spd(5)
    empty = torch.zeros(0, dtype=DTYPE)
    mean_r, covar_r = condition_on_noisy_observations(mean, covar, 0, empty, empty)
    assert torch.equal(mean_r, mean) and torch.equal(covar_r, covar)


def dense_kernel(kernel, A, B):
    with torch.no_grad():
        return kernel(A, B).to_dense()


def test_conditioning_the_joint_predictive_is_online_variational_conditioning():
    """Maddox et al. (2021), Eq. 5: OVC's pseudo-point exact GP from the joint q(f)."""
    kernel = ScaleKernel(RBFKernel()).to(DTYPE)
    kernel.base_kernel.lengthscale = 0.25
    kernel.outputscale = 1.4
    Z = torch.linspace(0, 1, 6, dtype=DTYPE).unsqueeze(-1)
    X = torch.rand(30, 1, dtype=DTYPE)
    y = torch.sin(6 * X.squeeze(-1)) + 0.1 * torch.randn(30, dtype=DTYPE)
    X_new, X_test = torch.rand(3, 1, dtype=DTYPE), torch.rand(4, 1, dtype=DTYPE)
    y_new = torch.randn(3, dtype=DTYPE)
    noise, c = 0.05, 0.4  # c: a constant prior mean

    def const(n):
        return torch.full((n,), c, dtype=DTYPE)

    K_zz = dense_kernel(kernel, Z, Z) + 1e-10 * torch.eye(6, dtype=DTYPE)
    m, S = titsias_optimum(K_zz, dense_kernel(kernel, Z, X), y, noise, const(6), const(30))
    XA = torch.cat([X_new, X_test])
    K_za, K_aa = dense_kernel(kernel, Z, XA), dense_kernel(kernel, XA, XA)
    mean, covar = svgp_predictive(m, S, K_zz, K_za, K_aa, const(6), const(7))
    mean_r, covar_r = condition_on_noisy_observations(
        mean, covar, 3, y_new, torch.full((3,), noise, dtype=DTYPE)
    )
    ZA = torch.cat([Z, XA])
    K_all = dense_kernel(kernel, ZA, ZA)
    ref_mean, ref_cov = pseudo_point_conditioning(
        m, S, K_zz, const(6), K_all, const(13), 6, 3, y_new, noise
    )
    assert rel_err(mean_r, ref_mean) < 1e-6
    assert rel_err(covar_r, ref_cov) < 1e-6


@pytest.mark.parametrize("batch", [(), (2,)])
def test_whiten_gaussian_matches_dense_inverse(batch):
    m = 5
    mean, prior_mean = torch.randn(*batch, m, dtype=DTYPE), torch.randn(*batch, m, dtype=DTYPE)
    covar, prior = random_spd(*batch, m), random_spd(*batch, m)
    L = torch.linalg.cholesky(prior)
    m_w, S_w_root = whiten_gaussian(mean, covar, prior_mean, L)
    L_inv = torch.linalg.inv(L)
    ref_m = (L_inv @ (mean - prior_mean).unsqueeze(-1)).squeeze(-1)
    ref_S = L_inv @ covar @ L_inv.mT
    torch.testing.assert_close(m_w, ref_m, rtol=1e-10, atol=1e-10)
    assert torch.equal(S_w_root, S_w_root.tril())
    torch.testing.assert_close(S_w_root @ S_w_root.mT, ref_S, rtol=1e-10, atol=1e-10)
    # Unwhitening recovers N(mean, covar).
    torch.testing.assert_close(prior_mean + (L @ m_w.unsqueeze(-1)).squeeze(-1), mean)
    LS = L @ S_w_root
    torch.testing.assert_close(LS @ LS.mT, covar, rtol=1e-10, atol=1e-10)


def test_whiten_gaussian_singular_covariance_gets_a_root():
    """A rank-deficient q(u) (e.g. from a smaller inducing set) still gets a Cholesky root."""
    m = 5
    F = torch.randn(m, 2, dtype=DTYPE)
    covar = F @ F.T
    L = torch.linalg.cholesky(random_spd(m))
    _, S_w_root = whiten_gaussian(
        torch.zeros(m, dtype=DTYPE), covar, torch.zeros(m, dtype=DTYPE), L
    )
    assert torch.isfinite(S_w_root).all()
    L_inv = torch.linalg.inv(L)
    ref_S = L_inv @ covar @ L_inv.T
    # Only jitter separates the root from the exact singular matrix.
    assert rel_err(S_w_root @ S_w_root.T, ref_S) < 1e-5


# ------------------------------------------------- closed-form q of the streaming bound
def _kernel(lengthscale, outputscale):
    kernel = ScaleKernel(RBFKernel()).to(DTYPE)
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel.requires_grad_(False)


def _whitening(kernel, Z, rel_jitter=1e-10):
    K_zz = kernel(Z).to_dense()
    K_zz = K_zz + rel_jitter * K_zz.diagonal().mean() * torch.eye(len(Z), dtype=DTYPE)
    L = torch.linalg.cholesky(K_zz)
    return (
        K_zz,
        L,
        lambda X: torch.linalg.solve_triangular(L, kernel(Z, X).to_dense(), upper=False).T,
    )


def _unwhiten(L, mean_z, m_w, R):
    return mean_z + L @ m_w, L @ R @ R.T @ L.T


@pytest.mark.parametrize("beta", [1.0, 1e-3])
def test_optimal_whitened_posterior_is_titsias_optimum_at_noise_beta_s2(beta):
    """One batch: the beta-weighted ELBO's optimum is Titsias' with noise beta * s2."""
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(30, 1, dtype=DTYPE, generator=gen)
    y = torch.sin(6 * X.squeeze(-1)) + 0.1 * torch.randn(30, dtype=DTYPE, generator=gen)
    Z = torch.linspace(0.05, 0.95, 6, dtype=DTYPE).unsqueeze(-1)
    kernel, noise, prior = _kernel(0.2, 1.3), torch.tensor(0.01, dtype=DTYPE), 0.2
    K_zz, L, whitened = _whitening(kernel, Z)
    m_w, R = optimal_whitened_posterior(whitened(X), y - prior, noise, beta)
    assert torch.equal(R, R.tril())
    m, S = _unwhiten(L, prior, m_w, R)
    ref_m, ref_S = titsias_optimum(
        K_zz, kernel(Z, X).to_dense(), y, beta * noise.item(), torch.full((6,), prior), prior
    )
    assert rel_err(m, ref_m) < 1e-8 and rel_err(S, ref_S) < 1e-8


def test_optimal_whitened_posterior_is_bui_et_al_streaming_optimum():
    """Second batch, new hyperparameters and inducing points: Bui et al.'s optimal q(b)."""
    gen = torch.Generator().manual_seed(1)
    X = torch.rand(40, 1, dtype=DTYPE, generator=gen)
    y = torch.sin(6 * X.squeeze(-1)) + 0.1 * torch.randn(40, dtype=DTYPE, generator=gen)
    X1, y1, X2, y2 = X[:20], y[:20], X[20:], y[20:]
    noise = torch.tensor(0.02, dtype=DTYPE)
    a = torch.linspace(0.05, 0.95, 5, dtype=DTYPE).unsqueeze(-1)
    old_kernel, kernel = _kernel(0.2, 1.3), _kernel(0.25, 1.1)
    K_aa_old, L_old, _ = _whitening(old_kernel, a)
    zeros_a = torch.zeros(5, dtype=DTYPE)
    m_a, S_a = titsias_optimum(
        K_aa_old, old_kernel(a, X1).to_dense(), y1, noise.item(), zeros_a, 0.0
    )
    b = torch.linspace(0.0, 1.0, 7, dtype=DTYPE).unsqueeze(-1)
    _, L, whitened = _whitening(kernel, b)
    old = (whitened(a), zeros_a, m_a, torch.linalg.cholesky(S_a), zeros_a, L_old)
    m_w, R = optimal_whitened_posterior(whitened(X2), y2, noise, 1.0, old)
    m, S = _unwhiten(L, 0.0, m_w, R)
    _, ref_m, ref_S = bui_bound(
        kernel, noise, X2, y2, b, a, m_a, S_a, K_aa_old, torch.tensor(0.0, dtype=DTYPE), 1e-10
    )
    assert rel_err(m, ref_m) < 1e-7 and rel_err(S, ref_S) < 1e-7


def test_optimal_whitened_posterior_raises_where_the_bound_is_unbounded():
    """An old posterior 10x wider than its prior, and a new prior twice as wide: the
    whitened precision I + W_a^T (S_old^-1 - K_old^-1) W_a = (1 - 2 * 0.9) I."""
    a = torch.linspace(0.05, 0.95, 4, dtype=DTYPE).unsqueeze(-1)
    K_old, L_old, _ = _whitening(_kernel(0.3, 1.0), a, rel_jitter=0.0)
    _, L, whitened = _whitening(_kernel(0.3, 2.0), a, rel_jitter=0.0)
    zeros = torch.zeros(4, dtype=DTYPE)
    old = (whitened(a), zeros, zeros, 10**0.5 * L_old, zeros, L_old)
    empty = torch.zeros(0, 1, dtype=DTYPE)
    with pytest.raises(torch.linalg.LinAlgError):
        optimal_whitened_posterior(whitened(empty), empty[:, 0], torch.tensor(0.1), 1.0, old)
    # Half as wide instead: the old data's factor q_old / p_old has precision
    # 4 K^-1 - K^-1; with the new prior 2 K the posterior precision is 3.5 K^-1.
    old = (whitened(a), zeros, zeros, 0.5 * L_old, zeros, L_old)
    m_w, R = optimal_whitened_posterior(whitened(empty), empty[:, 0], torch.tensor(0.1), 1.0, old)
    _, S = _unwhiten(L, 0.0, m_w, R)
    assert rel_err(S, K_old / 3.5) < 1e-8
