"""Collapsed streaming SGPR algebra against dense function-space formulas.

Oracles (:mod:`oracles.sgpr`, dense solves, no whitening or natural parameters):
Titsias' batch bound and ``q(u)``, Bui et al.'s eq. 11 in their own parametrisation,
and ``DenseQuModel`` for predictions and conditioning of ``q(u)``. The
pseudo-observation factor itself is checked against its definition
``t(u) ∝ N(y; K_fu K_uu^{-1} u, s2 I)`` (precision ``K^-1 K_uf K_fu K^-1 / s2``).
"""

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.means import ConstantMean
from oracles.sgpr import DenseQuModel, bui_bound, jittered, rel_err, titsias

from streamgp.linalg import (
    LowRankCorrection,
    PseudoObservations,
    sparse_posterior,
    streaming_collapsed_bound,
)
from streamgp.linalg.sparse_gp import (
    inducing_cross_covariance,
    match_points,
    predict,
    projection_weights,
)

DTYPE = torch.float64
JITTER = 1e-10


def make_kernel(d=2, outputscale=1.3, lengthscale=(0.3, 0.45), kind="rbf"):
    base = RBFKernel(ard_num_dims=d) if kind == "rbf" else MaternKernel(2.5, ard_num_dims=d)
    kernel = ScaleKernel(base).to(DTYPE)
    kernel.outputscale = outputscale
    base.lengthscale = torch.tensor(lengthscale[:d], dtype=DTYPE)
    return kernel


def make_data(n, d=2):
    X = torch.rand(n, d, dtype=DTYPE)
    y = torch.sin(5 * X).sum(-1) + 0.1 * torch.randn(n, dtype=DTYPE)
    return X, y


def absorb(kernel, noise, X, y, Z, previous=None, shared=None):
    previous = PseudoObservations.empty(Z) if previous is None else previous
    return streaming_collapsed_bound(
        kernel, noise, X, y, Z, previous, shared=shared, relative_jitter=JITTER
    )


@pytest.mark.parametrize("kind", ["rbf", "matern"])
def test_single_batch_is_titsias_sgpr(kind):
    kernel, noise = make_kernel(kind=kind), torch.tensor(0.05, dtype=DTYPE)
    X, y = make_data(40)
    Z = torch.rand(9, 2, dtype=DTYPE)
    with torch.no_grad():
        bound, factor = absorb(kernel, noise, X, y, Z)
        ref_bound, m, S, K_uu = titsias(kernel, noise, X, y, Z, JITTER)
        post = sparse_posterior(kernel, factor, relative_jitter=JITTER)
    assert abs(bound - ref_bound) < 1e-10 * abs(ref_bound)
    m_post, S_post = post.q_u()
    assert rel_err(m_post, m) < 1e-8 and rel_err(S_post, S) < 1e-8
    assert rel_err(post.chol @ post.chol.T, K_uu) < 1e-12
    # The factor is the Gaussian likelihood of the projected data: precision and eta.
    K_inv_K_uf = torch.linalg.solve(K_uu, kernel(Z, X).to_dense())
    precision = K_inv_K_uf @ K_inv_K_uf.T / noise
    assert rel_err(factor.root @ factor.root.T, precision) < 1e-8
    assert rel_err(factor.eta, K_inv_K_uf @ y / noise) < 1e-8
    assert factor.root.shape[1] <= 9  # compressed from n = 40 columns


def test_factor_log_norm_reproduces_the_bound_as_an_integral():
    """``log int p(u) t(u) du`` with the returned constant is the bound itself."""
    kernel, noise = make_kernel(), torch.tensor(0.05, dtype=DTYPE)
    X, y = make_data(25)
    Z = torch.rand(6, 2, dtype=DTYPE)
    with torch.no_grad():
        bound, factor = absorb(kernel, noise, X, y, Z)
        K_uu = jittered(kernel(Z).to_dense(), JITTER)
    # int N(u; 0, K) exp(c - u^T P u / 2 + eta^T u) du
    #   = c - 1/2 log|I + K P| + 1/2 eta^T (K^-1 + P)^-1 eta.
    P = factor.root @ factor.root.T
    inner = torch.linalg.inv(torch.linalg.inv(K_uu) + P)
    log_int = (
        factor.log_norm
        - 0.5 * torch.logdet(torch.eye(6, dtype=DTYPE) + K_uu @ P)
        + 0.5 * factor.eta @ inner @ factor.eta
    )
    assert abs(log_int - bound) < 1e-8 * abs(bound)


def test_streaming_on_fixed_inducing_points_equals_batch_sgpr():
    kernel, noise = make_kernel(), torch.tensor(0.04, dtype=DTYPE)
    X, y = make_data(50)
    Z = torch.rand(10, 2, dtype=DTYPE)
    with torch.no_grad():
        factor = PseudoObservations.empty(Z)
        for start in range(0, 50, 12):
            rows = slice(start, start + 12)
            bound, factor = absorb(kernel, noise, X[rows], y[rows], Z, factor, match_points(Z, Z))
        ref_bound, m, S, _ = titsias(kernel, noise, X, y, Z, JITTER)
        m_post, S_post = sparse_posterior(kernel, factor, relative_jitter=JITTER).q_u()
    assert abs(bound - ref_bound) < 1e-9 * abs(ref_bound)
    assert rel_err(m_post, m) < 1e-8 and rel_err(S_post, S) < 1e-8


def test_new_inducing_points_and_hyperparameters_match_bui_et_al():
    old_kernel, old_noise = make_kernel(), torch.tensor(0.04, dtype=DTYPE)
    X, y = make_data(40)
    a = torch.rand(8, 2, dtype=DTYPE)
    with torch.no_grad():
        old_bound, factor = absorb(old_kernel, old_noise, X[:20], y[:20], a)
        _, m_a, S_a, K_aa_old = titsias(old_kernel, old_noise, X[:20], y[:20], a, JITTER)
    # New hyperparameters, 4 old points kept and 6 new ones.
    kernel = make_kernel(outputscale=0.9, lengthscale=(0.35, 0.25))
    noise = torch.tensor(0.06, dtype=DTYPE, requires_grad=True)
    b = torch.cat([a[:4], torch.rand(6, 2, dtype=DTYPE)]).requires_grad_(True)
    shared = match_points(b.detach(), a)
    assert shared.tolist() == [0, 1, 2, 3] + [-1] * 6
    bound, new_factor = absorb(kernel, noise, X[20:], y[20:], b, factor, shared)
    ref, m_b, S_b = bui_bound(
        kernel, noise, X[20:], y[20:], b, a, m_a, S_a, K_aa_old, old_bound, JITTER
    )
    assert abs(bound.item() - ref.item()) < 1e-7 * abs(ref.item())
    # Differentiable in the hyperparameters, the noise and the inducing inputs.
    params = [*kernel.parameters(), noise, b]
    grads = torch.autograd.grad(bound, params)
    grads_ref = torch.autograd.grad(ref, params)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert torch.isfinite(g).all()
        assert rel_err(g, g_ref) < 1e-5
    with torch.no_grad():
        m_post, S_post = sparse_posterior(kernel, new_factor, relative_jitter=JITTER).q_u()
    assert rel_err(m_post, m_b.detach()) < 1e-6 and rel_err(S_post, S_b.detach()) < 1e-6


def test_zero_row_update_keeps_bound_and_posterior():
    kernel, noise = make_kernel(), torch.tensor(0.05, dtype=DTYPE)
    X, y = make_data(20)
    Z = torch.rand(7, 2, dtype=DTYPE)
    with torch.no_grad():
        bound, factor = absorb(kernel, noise, X, y, Z)
        same, again = absorb(kernel, noise, X[:0], y[:0], Z, factor, match_points(Z, Z))
        before = sparse_posterior(kernel, factor, relative_jitter=JITTER).q_u()
        after = sparse_posterior(kernel, again, relative_jitter=JITTER).q_u()
    assert abs(same - bound) < 1e-10 * abs(bound)
    assert rel_err(after[0], before[0]) < 1e-9 and rel_err(after[1], before[1]) < 1e-9
    # Nothing seen at all: the bound is 0 and q(u) is the prior.
    with torch.no_grad():
        empty_bound, empty = absorb(kernel, noise, X[:0], y[:0], Z)
        m0, S0 = sparse_posterior(kernel, empty, relative_jitter=JITTER).q_u()
    assert empty_bound == 0 and empty.root.shape == (7, 0)
    assert torch.equal(m0, torch.zeros(7, dtype=DTYPE))
    assert rel_err(S0, jittered(kernel(Z).to_dense().detach(), JITTER)) < 1e-12


def test_no_inducing_points_posterior_is_empty():
    Z = torch.zeros(0, 2, dtype=DTYPE)
    post = sparse_posterior(make_kernel(), PseudoObservations.empty(Z))
    assert post.whitened.mean.shape == (0,) and post.whitened.root.shape == (0, 0)


def test_match_points_and_cross_covariance():
    a = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5], [1.0, 1.0]], dtype=DTYPE)
    b = torch.tensor([[1.0, 1.0], [0.2, 0.3], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]], dtype=DTYPE)
    # Duplicates keep distinct identities; the third copy of (1, 1) finds no free match.
    assert match_points(b, a).tolist() == [1, -1, 3, -1, 0]
    assert match_points(b[:0], a).shape == (0,)
    assert match_points(b, a[:0]).tolist() == [-1] * 5
    kernel, jitter = make_kernel(), torch.tensor([[0.25]], dtype=DTYPE)
    with torch.no_grad():
        C = inducing_cross_covariance(kernel, b, a, jitter, match_points(b, a))
        K = kernel(b, a).to_dense()
    expected = K.clone()
    for j, i in [(0, 1), (2, 3), (4, 0)]:
        expected[j, i] += 0.25
    assert torch.equal(C, expected)
    with torch.no_grad():
        assert torch.equal(inducing_cross_covariance(kernel, b, a, jitter, None), K)


def test_predict_and_conditioning_match_dense_q_u_model():
    kernel, noise = make_kernel(), torch.tensor(0.05, dtype=DTYPE)
    X, y = make_data(30)
    Z = torch.rand(8, 2, dtype=DTYPE)
    with torch.no_grad():
        _, factor = absorb(kernel, noise, X, y, Z)
        post = sparse_posterior(kernel, factor, relative_jitter=JITTER)
        _, m, S, K_uu = titsias(kernel, noise, X, y, Z, JITTER)
        oracle = DenseQuModel(kernel, noise, Z, K_uu, m, S)
        Xs = torch.rand(3, 5, 2, dtype=DTYPE)  # batch x t x d
        # A = K_XZ L^-T: A A^T = K_XZ K_uu^-1 K_ZX.
        A = projection_weights(kernel, post, Xs).matrix
        K_xz = kernel(Xs, Z).to_dense()
        Q_xx = K_xz @ torch.linalg.solve(K_uu, K_xz.mT)
        assert A.shape == (3, 5, 8) and rel_err(A @ A.mT, Q_xx) < 1e-9
        correction = LowRankCorrection.empty(8, post.whitened.mean)
        mean, covar = predict(kernel, post, correction, Xs)
        ref_mean, ref_covar = oracle.latent(Xs)
        assert mean.shape == (3, 5) and covar.shape == (3, 5, 5)
        assert rel_err(mean, ref_mean) < 1e-8 and rel_err(covar, ref_covar) < 1e-8
        # Online conditioning of q(u) on batched fantasies, as a linear-Gaussian update.
        X_c = torch.rand(3, 2, 2, dtype=DTYPE)
        Y_c = torch.randn(4, 3, 2, dtype=DTYPE)
        noise_c = torch.full((3, 2), 0.05, dtype=DTYPE)
        conditioned = correction.condition(
            post.whitened, projection_weights(kernel, post, X_c), Y_c, noise_c
        )
        mean_c, covar_c = predict(kernel, post, conditioned, Xs)
        ref_c = oracle.condition_on_observations(X_c, Y_c.unsqueeze(-1), noise=noise_c[..., None])
        ref_mean_c, ref_covar_c = ref_c.latent(Xs)
    assert mean_c.shape == (4, 3, 5)
    assert rel_err(mean_c, ref_mean_c) < 1e-7
    assert rel_err(covar_c.expand_as(ref_covar_c), ref_covar_c) < 1e-7


def test_shifted_factor_is_the_factor_of_the_residuals():
    kernel, noise = make_kernel(), torch.tensor(0.05, dtype=DTYPE)
    X, y = make_data(15)
    Z = torch.rand(6, 2, dtype=DTYPE)
    with torch.no_grad():
        _, factor = absorb(kernel, noise, X, y, Z)

    def log_t(f, u):
        return f.log_norm - 0.5 * ((f.root.T @ u) ** 2).sum() + f.eta @ u

    offset, r = torch.randn(6, dtype=DTYPE), torch.randn(6, dtype=DTYPE)
    shifted = factor.shifted(offset)
    assert torch.equal(shifted.root, factor.root) and torch.equal(shifted.points, Z)
    assert abs(log_t(shifted, r) - log_t(factor, r + offset)) < 1e-10
    back = shifted.shifted(-offset)
    assert rel_err(back.eta, factor.eta) < 1e-12
    assert abs(back.log_norm - factor.log_norm) < 1e-10 * abs(factor.log_norm)


@pytest.mark.parametrize("n_first", [40, 15])
def test_prior_mean_is_a_factor_on_actual_inducing_values(n_first):
    """With prior GP(c, k) one batch gives Titsias on y - c, q(u) shifted by c, and the
    factor ``N(y; c + A (u - c), s2)`` on u itself; a stream with fixed inducing points
    equals that batch."""
    kernel, noise, c = make_kernel(), torch.tensor(0.05, dtype=DTYPE), 3.4
    mean = ConstantMean().to(DTYPE)
    mean.constant = torch.tensor(c, dtype=DTYPE)
    X, y = make_data(40)
    y = y + 5.0
    Z = torch.rand(9, 2, dtype=DTYPE)
    with torch.no_grad():
        factor = PseudoObservations.empty(Z)
        for rows in (slice(0, n_first), slice(n_first, 40)):
            bound, factor = streaming_collapsed_bound(
                kernel, noise, X[rows], y[rows], Z, factor, match_points(Z, Z), JITTER, mean
            )
        ref_bound, m, S, K_uu = titsias(kernel, noise, X, y - c, Z, JITTER)
        post = sparse_posterior(kernel, factor, JITTER, prior_mean=mean)
        A = torch.linalg.solve(K_uu, kernel(Z, X).to_dense()).T  # K_fu K_uu^-1
    assert abs(bound - ref_bound) < 1e-10 * abs(ref_bound)
    m_post, S_post = post.q_u()
    assert rel_err(m_post, m + c) < 1e-8 and rel_err(S_post, S) < 1e-8
    assert rel_err(factor.root @ factor.root.T, A.T @ A / noise) < 1e-8
    assert rel_err(factor.eta, A.T @ (y - c + c * A.sum(-1)) / noise) < 1e-8
    # Predictions add m(X); the zero-mean algebra is unchanged.
    Xs = torch.rand(3, 5, 2, dtype=DTYPE)
    with torch.no_grad():
        oracle = DenseQuModel(kernel, noise, Z, K_uu, m, S)
        correction = LowRankCorrection.empty(9, post.whitened.mean)
        mean_s, covar_s = predict(kernel, post, correction, Xs, prior_mean=mean)
        ref_mean, ref_covar = oracle.latent(Xs)
        empty = sparse_posterior(kernel, PseudoObservations.empty(Z[:0]), prior_mean=mean)
        prior_mean, _ = predict(kernel, empty, correction, Xs, prior_mean=mean)
    assert rel_err(mean_s, ref_mean + c) < 1e-8 and rel_err(covar_s, ref_covar) < 1e-8
    assert torch.allclose(prior_mean, torch.full_like(prior_mean, c), rtol=0, atol=0)
