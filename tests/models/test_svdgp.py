"""DecoupledSVGP against dense SVGP oracles, exact GPs and BoTorch end to end."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from botorch.acquisition import (
    qKnowledgeGradient,
    qNegIntegratedPosteriorVariance,
    qUpperConfidenceBound,
)
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import BernoulliLikelihood, GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood, VariationalELBO
from gpytorch.models import ApproximateGP
from gpytorch.variational import CholeskyVariationalDistribution, UnwhitenedVariationalStrategy
from oracles import hyperparameter_vector, rel_err
from oracles.svdgp import svgp_elbo, svgp_parameters_from_decoupled
from sines_helpers import fit_briefly, held_out_rmse, sines

from streamgp.linalg.decoupled import (
    decoupled_covariance,
    decoupled_kl,
    gaussian_optimal_parameters,
    mean_kl_term,
)
from streamgp.models import DecoupledSVGP

DT = torch.float64


def _toy(n: int, seed: int = 0, d: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, dtype=DT, generator=gen)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=DT, generator=gen)
    return X, Y


def _fixed_hyperparameters_model(X, Y, Z, **kwargs) -> DecoupledSVGP:
    """alpha = beta = Z, set hyperparameters, random (a, L); nothing optimised yet."""
    kernel = ScaleKernel(RBFKernel())
    kernel.base_kernel.lengthscale = 0.25
    kernel.outputscale = 1.3
    likelihood = GaussianLikelihood()
    likelihood.noise = 0.05
    mean = ConstantMean()
    mean.constant.data.fill_(0.2)
    kwargs.setdefault("outcome_transform", None)
    model = DecoupledSVGP(
        X,
        Y,
        mean_basis=Z,
        covar_basis=Z,
        covar_module=kernel,
        mean_module=mean,
        likelihood=likelihood,
        num_init_steps=0,
        warm_start=False,
        learn_inducing_points=True,
        **kwargs,
    )
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.mean_weights.copy_(torch.randn(len(Z), dtype=DT, generator=gen))
        # A full (not triangular) matrix: only its lower triangle is L.
        model.covar_root.copy_(torch.randn(len(Z), len(Z), dtype=DT, generator=gen))
    return model


# ---------------------------------------------------------- objective vs SVGP
def test_shared_basis_elbo_and_gradients_equal_standard_svgp():
    X, Y = _toy(40)
    Z = torch.linspace(0, 1, 7, dtype=DT).unsqueeze(-1)
    model = _fixed_hyperparameters_model(X, Y, Z)
    model.train()
    y = Y.squeeze(-1)
    value = model.elbo(X, y)

    # Oracle: the standard SVGP ELBO at q(u) = N(m_0(Z) + K a, (K^-1 + B)^-1), as a
    # function of the same leaves (Z enters both bases, so its gradient is the sum).
    Z_leaf, kernel = model.mean_basis, model.covar_module
    K_zz = kernel(Z_leaf).to_dense()
    L = model.covar_root.tril()
    mean_z = model.mean_module(Z_leaf)
    m, S = svgp_parameters_from_decoupled(K_zz, mean_z, model.mean_weights, L @ L.T)
    oracle = svgp_elbo(
        m,
        S,
        K_zz,
        kernel(Z_leaf, X).to_dense(),
        kernel(X, diag=True),
        mean_z,
        model.mean_module(X),
        y,
        model.likelihood.noise.squeeze(),
    )
    torch.testing.assert_close(value, oracle, rtol=1e-9, atol=1e-9)

    params = dict(model.named_parameters())
    grads = dict(zip(params, torch.autograd.grad(value, list(params.values())), strict=True))
    shared = [p for name, p in params.items() if name != "covar_basis"]
    oracle_grads = dict(
        zip(
            [n for n in params if n != "covar_basis"],
            torch.autograd.grad(oracle, shared),
            strict=True,
        )
    )
    torch.testing.assert_close(
        grads["mean_basis"] + grads["covar_basis"],
        oracle_grads.pop("mean_basis"),
        rtol=1e-7,
        atol=1e-8,
    )
    assert grads["covar_root"].triu(1).abs().max() == 0  # only the lower triangle is used
    for name, grad in oracle_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-7, atol=1e-8, msg=name)

    # gpytorch's own VariationalELBO (unwhitened Cholesky q(u)) at the same (m, S).
    class _SVGP(ApproximateGP):
        def __init__(self):
            dist = CholeskyVariationalDistribution(len(Z)).to(DT)
            super().__init__(
                UnwhitenedVariationalStrategy(
                    self, Z, dist, learn_inducing_locations=False, jitter_val=1e-12
                )
            )
            self.mean_module, self.covar_module = model.mean_module, model.covar_module

        def forward(self, x):
            from gpytorch.distributions import MultivariateNormal

            return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    svgp = _SVGP()
    with torch.no_grad():
        dist = svgp.variational_strategy._variational_distribution
        dist.variational_mean.copy_(m)
        dist.chol_variational_covar.copy_(torch.linalg.cholesky(S))
    svgp.variational_strategy.variational_params_initialized.fill_(1)
    svgp.train()
    gpytorch_elbo = VariationalELBO(model.likelihood, svgp, num_data=len(y))(svgp(X), y) * len(y)
    torch.testing.assert_close(value, gpytorch_elbo, rtol=1e-7, atol=1e-7)


def test_minibatch_elbo_scales_likelihood_term():
    X, Y = _toy(40)
    Z = torch.linspace(0, 1, 5, dtype=DT).unsqueeze(-1)
    model = _fixed_hyperparameters_model(X, Y, Z)
    y = Y.squeeze(-1)
    full = model.elbo(X, y)
    halves = model.elbo(X[:20], y[:20], num_data=40) + model.elbo(X[20:], y[20:], num_data=40)
    kl = full - model.elbo(X, y, num_data=0)  # = -KL
    torch.testing.assert_close(0.5 * (halves - 2 * kl) + kl, full)


def test_column_sampled_kl_term_is_unbiased():
    gen = torch.Generator().manual_seed(3)
    Z = torch.rand(6, 2, dtype=DT, generator=gen)
    K = RBFKernel().to(DT)(Z).to_dense().detach()
    a = torch.randn(6, dtype=DT, generator=gen, requires_grad=True)
    exact = mean_kl_term(a, K)
    # Averaging the one-column estimate over all columns is the uniform expectation.
    estimates = torch.stack([mean_kl_term(a, K[:, [j]], torch.tensor([j])) for j in range(6)])
    torch.testing.assert_close(estimates.mean(), exact)
    grad = torch.autograd.grad(estimates.mean(), a)[0]
    torch.testing.assert_close(grad, K @ a.detach())
    # Pairs of columns: the average over all pairs is exact too.
    pairs = [(i, j) for i in range(6) for j in range(i + 1, 6)]
    est = torch.stack([mean_kl_term(a, K[:, list(p)], torch.tensor(p)) for p in pairs]).mean()
    torch.testing.assert_close(est, exact)


def test_kl_matches_dense_gaussian_kl_with_decoupled_bases():
    """With beta inside alpha's span the KL is the SVGP KL on the union of the bases."""
    gen = torch.Generator().manual_seed(4)
    alpha = torch.rand(6, 1, dtype=DT, generator=gen)
    # beta = the first 3 points of alpha.
    kernel = RBFKernel().to(DT)
    kernel.lengthscale = 0.3
    K = kernel(alpha).to_dense().detach()
    a = torch.randn(6, dtype=DT, generator=gen)
    L = torch.randn(3, 3, dtype=DT, generator=gen).tril()
    kl = decoupled_kl(mean_kl_term(a, K), decoupled_covariance(K[:3, :3], L))
    B = torch.zeros(6, 6, dtype=DT)
    B[:3, :3] = L @ L.T
    m, S = svgp_parameters_from_decoupled(K, torch.zeros(6, dtype=DT), a, B)
    K_inv = torch.linalg.inv(K)
    dense = 0.5 * (torch.trace(K_inv @ S) + m @ K_inv @ m - 6 + torch.logdet(K) - torch.logdet(S))
    torch.testing.assert_close(kl, dense, rtol=1e-7, atol=1e-8)


def test_gaussian_optimal_parameters_are_stationary():
    X, Y = _toy(30)
    gen = torch.Generator().manual_seed(5)
    model = _fixed_hyperparameters_model(X, Y, torch.rand(4, 1, dtype=DT, generator=gen))
    # Decoupled: a larger mean basis than covariance basis.
    alpha = torch.rand(12, 1, dtype=DT, generator=gen)
    model2 = DecoupledSVGP(
        X,
        Y,
        mean_basis=alpha,
        covar_basis=model.covar_basis.detach(),
        covar_module=model.covar_module,
        mean_module=model.mean_module,
        likelihood=model.likelihood,
        num_init_steps=0,
        outcome_transform=None,
    )
    y = Y.squeeze(-1)
    value = model2.elbo(X, y)
    g_a, g_L = torch.autograd.grad(value, [model2.mean_weights, model2.covar_root])
    assert g_a.abs().max() < 1e-6 * max(1.0, model2.mean_weights.abs().max().item())
    assert g_L.tril().abs().max() < 1e-6
    # And it is a maximum: perturbing (a, L) lowers the ELBO.
    with torch.no_grad():
        model2.mean_weights.add_(1e-2)
        model2.covar_root.mul_(1.1)
    assert model2.elbo(X, y) < value
    # n < M_beta: the QR root is padded, still a stationary point.
    a, L = gaussian_optimal_parameters(
        *[
            t.detach()
            for t in (
                model2._kernel(alpha, alpha),
                model2._kernel(X[:2], alpha),
                y[:2] - model2.mean_module(X[:2]),
                model2._kernel(alpha, alpha),
                model2._kernel(X[:2], alpha),
                model2.likelihood.noise.reshape(()),
            )
        ]
    )
    assert L.shape == (12, 12) and torch.equal(L, L.tril())


# ------------------------------------------------------------ learning on toys
def _rmse(model, X, f):
    with torch.no_grad():
        return (model.posterior(X).mean - f).pow(2).mean().sqrt().item()


@pytest.fixture(scope="module")
def exact_rmse():
    X, Y = _toy(200)
    gp = SingleTaskGP(X, Y)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    X_test = torch.linspace(0, 1, 101, dtype=DT).unsqueeze(-1)
    return _rmse(gp, X_test, torch.sin(6 * X_test))


def test_batch_and_streaming_fits_approach_exact_gp_rmse(exact_rmse):
    X, Y = _toy(200)
    X_test = torch.linspace(0, 1, 101, dtype=DT).unsqueeze(-1)
    f_test = torch.sin(6 * X_test)
    # The noise level is checked in the units of Y: no outcome transform.
    options = {"max_mean_basis": 64, "max_covar_basis": 16, "outcome_transform": None}
    batch = DecoupledSVGP(X, Y, num_init_steps=200, **options)
    assert _rmse(batch, X_test, f_test) < 1.5 * exact_rmse
    assert 0.005 < batch.likelihood.noise.item() < 0.03  # true noise variance 0.01

    stream = DecoupledSVGP(X[:40], Y[:40], basis_increment=4, **options)
    for i in range(40, 200, 10):
        stream.observe(X[i : i + 10], Y[i : i + 10])
    assert stream.num_observed == 200
    assert len(stream.mean_basis) == 64 and len(stream.covar_basis) == 16
    assert _rmse(stream, X_test, f_test) < 2.5 * exact_rmse
    # Calibrated-ish: test residuals within 3 posterior (noisy) sds for >= 90% of points.
    Y_test = f_test + 0.1 * torch.randn(f_test.shape, dtype=DT)
    with torch.no_grad():
        post = stream.posterior(X_test, observation_noise=True)
    z = (Y_test - post.mean).abs() / post.variance.sqrt()
    assert (z < 3).double().mean() > 0.9


def test_float32_stream():
    X, Y = _toy(120)
    X, Y = X.float(), Y.float()
    model = DecoupledSVGP(X[:80], Y[:80], max_mean_basis=48, max_covar_basis=12, num_init_steps=100)
    model.observe(X[80:], Y[80:])
    X_test = torch.linspace(0, 1, 50).unsqueeze(-1)
    with torch.no_grad():
        post = model.posterior(X_test)
    assert post.mean.dtype == torch.float32 and (post.variance > 0).all()
    assert (post.mean - torch.sin(6 * X_test)).pow(2).mean().sqrt() < 0.06


# ---------------------------------------------------------------- basis growth
def test_basis_growth_respects_caps_and_keeps_posterior():
    X, Y = _toy(60, seed=2)
    model = DecoupledSVGP(
        X[:10],
        Y[:10],
        mean_basis=X[:4],
        covar_basis=X[:2],
        max_mean_basis=10,
        max_covar_basis=5,
        basis_increment=3,
        replay_size=8,
        num_init_steps=5,
        warm_start=False,  # the paper's first-order steps on (a, L), which grow with the bases
    )
    X_test = torch.rand(9, 1, dtype=DT)
    with torch.no_grad():
        before = model.posterior(X_test)
    model.observe(X[10:20], Y[10:20], num_steps=0)
    with torch.no_grad():
        after = model.posterior(X_test)
    assert (len(model.mean_basis), len(model.covar_basis)) == (7, 5)
    # The same new points start both bases, and they come from the batch.
    torch.testing.assert_close(model.mean_basis[4:6], model.covar_basis[2:4])
    assert all((X[10:20] == p).all(-1).any() for p in model.mean_basis[4:])
    # New coefficients are 0 (mean unchanged), the new block of B is tiny.
    torch.testing.assert_close(after.mean, before.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(after.variance, before.variance, rtol=1e-3, atol=1e-6)

    # Adam's moments are zero-padded to the grown shapes.
    model.observe(X[20:30], Y[20:30], num_steps=2)
    for group in model._optimizer.param_groups:
        for p in group["params"]:
            state = model._optimizer.state[p]
            assert state["exp_avg"].shape == p.shape
    for start in range(30, 60, 10):
        model.observe(X[start : start + 10], Y[start : start + 10], num_steps=1)
        assert len(model.mean_basis) <= 10 and len(model.covar_basis) <= 5
        assert len(model._replay_X) <= 8
    assert (len(model.mean_basis), len(model.covar_basis)) == (10, 5)
    assert model.covar_root.shape == (5, 5) and model.mean_weights.shape == (10,)
    assert model.num_observed == 60


def test_steps_sample_kl_columns_and_minibatches(monkeypatch):
    X, Y = _toy(100)
    model = DecoupledSVGP(
        X,
        Y,
        max_mean_basis=100,
        max_covar_basis=8,
        kl_columns=16,
        minibatch_size=32,
        num_init_steps=50,
    )
    assert len(model.mean_basis) == 100
    X_test = torch.linspace(0, 1, 50, dtype=DT).unsqueeze(-1)
    before = _rmse(model, X_test, torch.sin(6 * X_test))
    calls = []
    elbo = model.elbo

    def spy(X_mb, y_mb, *, num_data=None, kl_columns=None):
        calls.append((len(X_mb), num_data, kl_columns))
        return elbo(X_mb, y_mb, num_data=num_data, kl_columns=kl_columns)

    monkeypatch.setattr(model, "elbo", spy)
    X_new, Y_new = _toy(8, seed=7)
    model.observe(X_new, Y_new, num_steps=3)
    assert len(calls) == 3
    for size, num_data, columns in calls:
        # 8 new points topped up to 32 from the reservoir; N = 108 points seen.
        assert size == 32 and num_data == 108
        assert len(columns) == 16 and len(set(columns.tolist())) == 16
        assert 0 <= columns.min() and columns.max() < 100
    assert _rmse(model, X_test, torch.sin(6 * X_test)) < before + 0.05


# ------------------------------------------------------------------ BoTorch API
@pytest.fixture(scope="module")
def fitted():
    X, Y = _toy(60, d=2)
    return DecoupledSVGP(
        X,
        Y,
        max_mean_basis=40,
        max_covar_basis=10,
        num_init_steps=50,
        input_transform=Normalize(d=2),
        outcome_transform=Standardize(m=1),
    )


def test_posterior_shapes_batches_and_noise(fitted):
    model = fitted
    X = torch.rand(3, 2, 4, 2, dtype=DT)
    with torch.no_grad():
        post = model.posterior(X)
        assert post.mean.shape == (3, 2, 4, 1) and post.variance.shape == (3, 2, 4, 1)
        covar = post.distribution.covariance_matrix
        assert covar.shape == (3, 2, 4, 4)
        single = model.posterior(X[1, 0])
        torch.testing.assert_close(post.mean[1, 0], single.mean)
        torch.testing.assert_close(covar[1, 0], single.distribution.covariance_matrix)
        torch.testing.assert_close(covar, covar.mT)
        assert (torch.linalg.eigvalsh(covar) > -1e-10).all()
        noisy = model.posterior(X, observation_noise=True)
        noise = model.likelihood.noise.item() * model.outcome_transform.stdvs.item() ** 2
        torch.testing.assert_close(
            noisy.variance - post.variance, torch.full_like(post.variance, noise)
        )
        given = model.posterior(X, observation_noise=torch.full((3, 2, 4, 1), 0.5, dtype=DT))
        torch.testing.assert_close(
            given.variance - post.variance,
            torch.full_like(post.variance, 0.5 * model.outcome_transform.stdvs.item() ** 2),
        )
        samples = post.rsample(torch.Size([5]))
        assert samples.shape == (5, 3, 2, 4, 1)


def test_qucb_runs_through_optimize_acqf(fitted):
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    acqf = qUpperConfidenceBound(fitted, beta=2.0)
    candidate, value = optimize_acqf(
        acqf, bounds, q=2, num_restarts=2, raw_samples=16, options={"maxiter": 5}
    )
    assert candidate.shape == (2, 2) and torch.isfinite(value)
    assert ((candidate >= 0) & (candidate <= 1)).all()


def test_conditioning_is_exact_gaussian_update_of_q(fitted):
    model = fitted
    gen = torch.Generator().manual_seed(8)
    X_c, Y_c = torch.rand(3, 2, dtype=DT, generator=gen), torch.randn(3, 1, dtype=DT, generator=gen)
    X_test = torch.rand(5, 2, dtype=DT, generator=gen)
    with torch.no_grad():
        joint = model.posterior(torch.cat([X_c, X_test]))  # original (untransformed) space
        conditioned = model.condition_on_observations(X_c, Y_c).posterior(X_test)
    # Dense oracle in the original outcome space: noise scaled by the frozen Standardize.
    mean, covar = joint.mean.squeeze(-1), joint.distribution.covariance_matrix
    noise = model.likelihood.noise.item() * model.outcome_transform.stdvs.item() ** 2
    A = covar[:3, :3] + noise * torch.eye(3, dtype=DT)
    gain = torch.linalg.solve(A, covar[:3, 3:]).T
    oracle_mean = mean[3:] + gain @ (Y_c.squeeze(-1) - mean[:3])
    oracle_covar = covar[3:, 3:] - gain @ covar[:3, 3:]
    torch.testing.assert_close(conditioned.mean.squeeze(-1), oracle_mean)
    torch.testing.assert_close(conditioned.distribution.covariance_matrix, oracle_covar)
    # Conditioning twice equals conditioning once on both batches.
    with torch.no_grad():
        twice = model.condition_on_observations(X_c[:1], Y_c[:1])
        twice = twice.condition_on_observations(X_c[1:], Y_c[1:]).posterior(X_test)
    torch.testing.assert_close(twice.mean, conditioned.mean)
    with pytest.raises(RuntimeError, match="conditioned"):
        model.condition_on_observations(X_c, Y_c).observe(X_c, Y_c)


def test_fantasies_qnipv_and_qkg_run_through_optimize_acqf(fitted):
    model = fitted
    sampler = SobolQMCNormalSampler(torch.Size([4]))
    fantasy = model.fantasize(torch.rand(3, 2, 2, dtype=DT), sampler)
    assert fantasy.batch_shape == (4, 3)
    assert fantasy.posterior(torch.rand(3, 5, 2, dtype=DT)).mean.shape == (4, 3, 5, 1)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    qnipv = qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(16, 2, dtype=DT))
    candidate, value = optimize_acqf(
        qnipv, bounds, q=2, num_restarts=2, raw_samples=8, options={"maxiter": 5}
    )
    assert candidate.shape == (2, 2) and torch.isfinite(value)
    qkg = qKnowledgeGradient(model, num_fantasies=4)
    candidate, value = optimize_acqf(
        qkg, bounds, q=1, num_restarts=2, raw_samples=8, options={"maxiter": 5}
    )
    assert candidate.shape == (1, 2) and torch.isfinite(value)


def test_bernoulli_learns_separable_problem():
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(120, 1, dtype=DT, generator=gen)
    Y = (X > 0.5).to(DT)
    model = DecoupledSVGP(
        X,
        Y,
        likelihood=BernoulliLikelihood(),
        max_mean_basis=30,
        max_covar_basis=8,
        num_init_steps=100,
    )
    assert not model.warm_start
    model.observe(torch.tensor([[0.1], [0.9]], dtype=DT), torch.tensor([[0.0], [1.0]], dtype=DT))
    X_test = torch.tensor([[0.1], [0.3], [0.7], [0.9]], dtype=DT)
    with torch.no_grad():
        f = model.posterior(X_test).mean.squeeze(-1)
    assert (f[:2] < 0).all() and (f[2:] > 0).all()
    with pytest.raises(ValueError, match="observation_noise is only available"):
        model.posterior(X_test, observation_noise=True)
    with pytest.raises(ValueError, match="0/1 labels"):
        model.observe(X_test, torch.full((4, 1), 0.5, dtype=DT))
    with pytest.raises(NotImplementedError, match="GaussianLikelihood"):
        model.condition_on_observations(X_test, torch.zeros(4, 1, dtype=DT))


# ------------------------------------------------------------------ validation
def _state(model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return state, model.num_observed, len(model._replay_X)


def _unchanged(model, snapshot):
    state, n, r = _state(model)
    old_state, old_n, old_r = snapshot
    return (
        (n, r) == (old_n, old_r)
        and state.keys() == old_state.keys()
        and all(
            state[k].shape == old_state[k].shape and torch.equal(state[k], old_state[k])
            for k in state
        )
    )


def test_bad_inputs_raise_and_leave_model_unchanged():
    X0, Y0 = _toy(30)
    model = DecoupledSVGP(X0, Y0, max_mean_basis=20, max_covar_basis=5, num_init_steps=5)
    snapshot = _state(model)
    X, Y = torch.rand(3, 1, dtype=DT), torch.rand(3, 1, dtype=DT)
    bad = [
        ((X.clone().fill_(math.nan), Y), ValueError, "X contains NaN"),
        ((X, Y.clone().fill_(math.inf)), ValueError, "Y contains NaN or Inf"),
        ((X.float(), Y), TypeError, "X has dtype"),
        ((X, Y.float()), TypeError, "Y has dtype"),
        ((X, Y[:2]), ValueError, "Y has 2 rows"),
        ((torch.rand(3, 2, dtype=DT), Y), ValueError, "X must have last dimension 1"),
        ((X[None], Y), ValueError, "X must have shape q x d"),
        ((X, Y.squeeze(-1)), ValueError, "Y must have at least 2 dimension"),
        ((X, torch.rand(3, 2, dtype=DT)), ValueError, "Y must have shape n x 1"),
        (([[0.5]], Y), TypeError, "X must be a torch.Tensor"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            model.observe(*args)
    with pytest.raises(ValueError, match="num_steps"):
        model.observe(X, Y, num_steps=-1)
    with pytest.raises(ValueError, match="Yvar must be None: DecoupledSVGP learns"):
        model.observe(X, Y, torch.full_like(Y, 0.1))  # the third argument is Yvar
    with pytest.raises(TypeError, match="positional"):
        model.observe(X, Y, None, 3)  # num_steps is keyword-only
    with pytest.raises(ValueError, match="X contains NaN"):
        model.posterior(X.clone().fill_(math.nan))
    with pytest.raises(ValueError, match="noise must be strictly positive"):
        model.condition_on_observations(X, Y, noise=torch.zeros(3, 1, dtype=DT))
    with pytest.raises(ValueError, match="observation_noise contains NaN"):
        model.posterior(X, observation_noise=torch.full((3, 1), math.nan, dtype=DT))
    assert _unchanged(model, snapshot)


def test_diverging_update_is_rolled_back(monkeypatch):
    X0, Y0 = _toy(30)
    model = DecoupledSVGP(X0, Y0, max_mean_basis=20, max_covar_basis=5, num_init_steps=5)
    snapshot = _state(model)
    elbo = model.elbo
    monkeypatch.setattr(model, "elbo", lambda *args, **kwargs: elbo(*args, **kwargs) * math.nan)
    with pytest.raises(RuntimeError, match="non-finite"):
        model.observe(*_toy(5, seed=9), num_steps=1)
    assert _unchanged(model, snapshot)
    # A numerical failure in a later step (NaN parameters reach a Cholesky) also rolls back.
    with pytest.raises(torch.linalg.LinAlgError):
        model.observe(*_toy(5, seed=9), num_steps=2)
    assert _unchanged(model, snapshot)
    monkeypatch.undo()
    model.observe(*_toy(5, seed=9))  # still usable
    assert model.num_observed == 35 and len(model.mean_basis) == 20


def test_bad_constructor_arguments():
    X, Y = _toy(10)
    with pytest.raises(ValueError, match="train_X must have shape n x d with n >= 1"):
        DecoupledSVGP(X[:0], Y[:0])
    with pytest.raises(TypeError, match="likelihood must be"):
        DecoupledSVGP(X, Y, likelihood=torch.nn.Module())
    with pytest.raises(ValueError, match="max_covar_basis must be a positive int"):
        DecoupledSVGP(X, Y, max_covar_basis=0)
    with pytest.raises(ValueError, match="kl_columns must be a positive int"):
        DecoupledSVGP(X, Y, kl_columns=0)
    with pytest.raises(ValueError, match="lr must be a positive"):
        DecoupledSVGP(X, Y, lr=-1.0)
    with pytest.raises(ValueError, match="lr_decay"):
        DecoupledSVGP(X, Y, lr_decay=-0.1)
    with pytest.raises(
        ValueError, match=r"mean_basis must have shape M x d with 1 <= M <= max_mean_basis \(3\)"
    ):
        DecoupledSVGP(X, Y, mean_basis=X[:4], max_mean_basis=3)
    with pytest.raises(ValueError, match="covar_basis must have last dimension 1"):
        DecoupledSVGP(X, Y, covar_basis=torch.rand(3, 2, dtype=DT))
    with pytest.raises(ValueError, match="train_Y contains NaN"):
        DecoupledSVGP(X, Y.clone().fill_(math.nan))
    with pytest.raises(ValueError, match="0/1 labels"):
        DecoupledSVGP(X, Y, likelihood=BernoulliLikelihood())


# ------------------------------------------------------- defaults and the prior mean
def test_defaults_are_standardize_and_a_learned_constant_mean():
    gen = torch.Generator().manual_seed(2)
    X = torch.rand(40, 1, dtype=DT, generator=gen)
    Y = 100 + 10 * torch.sin(6 * X)
    far = torch.full((1, 1), 20.0, dtype=DT)
    options = {"max_mean_basis": 20, "max_covar_basis": 8}
    model = DecoupledSVGP(X, Y, num_init_steps=50, **options)
    assert isinstance(model.outcome_transform, Standardize)
    assert type(model.mean_module) is ConstantMean
    assert model.mean_module.raw_constant.requires_grad
    with torch.no_grad():
        assert (model.posterior(X).mean - Y).abs().max() < 3.0
        assert abs(model.posterior(far).mean.item() - 100) < 3.0  # not ~0
    # ZeroMean without a transform: the zero-mean model on raw targets.
    zero = DecoupledSVGP(
        X, Y, num_init_steps=0, outcome_transform=None, mean_module=ZeroMean(), **options
    )
    assert not hasattr(zero, "outcome_transform")
    assert not any("mean_module" in name for name, _ in zero.named_parameters())
    with torch.no_grad():
        assert abs(zero.posterior(far).mean.item()) < 1e-6


def test_bernoulli_default_is_no_transform_and_a_given_one_raises():
    X = torch.rand(10, 1, dtype=DT)
    labels = (X > 0.5).to(DT)
    options = {"likelihood": BernoulliLikelihood(), "max_covar_basis": 4, "num_init_steps": 0}
    assert not hasattr(DecoupledSVGP(X, labels, **options), "outcome_transform")
    plain = DecoupledSVGP(X, labels, outcome_transform=None, **options)
    assert not hasattr(plain, "outcome_transform")
    with pytest.raises(ValueError, match="outcome_transform must be None"):
        DecoupledSVGP(X, labels, outcome_transform=Standardize(1), **options)


def test_constant_is_learned_by_observe_steps_and_fit_gpytorch_mll():
    X, Y = _toy(60)
    Y = Y + 5.0
    model = DecoupledSVGP(
        X[:30],
        Y[:30],
        max_mean_basis=16,
        max_covar_basis=8,
        outcome_transform=None,
        # A constant from zero (given, so not started at the targets' mean): learned.
        mean_module=ConstantMean(),
        num_init_steps=5,
        num_steps=5,
        lr=0.1,
    )
    first = model.mean_module.constant.item()
    assert first > 0.1  # 5 (decayed) Adam steps toward 5
    model.observe(X[30:], Y[30:])
    second = model.mean_module.constant.item()
    assert second > first + 0.05
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    assert model.mean_module.constant.item() > second


# ---------------------------------------------- fit_gpytorch_mll: the collapsed bound
def test_fit_with_bases_at_the_data_is_the_exact_gp_fit():
    """Both bases at the data: the collapsed decoupled bound is the exact log marginal
    likelihood, so fit_gpytorch_mll finds the exact GP's hyperparameters and posterior."""
    X, Y = _toy(30)
    exact = SingleTaskGP(
        X,
        Y,
        likelihood=GaussianLikelihood(),
        covar_module=ScaleKernel(RBFKernel()),
        mean_module=ConstantMean(),
        outcome_transform=None,
    )
    fit_gpytorch_mll(ExactMarginalLogLikelihood(exact.likelihood, exact))
    model = DecoupledSVGP(
        X,
        Y,
        mean_basis=X,
        covar_basis=X,
        outcome_transform=None,
        mean_module=ConstantMean(),  # the exact GP's start: a constant from zero
        num_init_steps=0,
    )
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    assert rel_err(hyperparameter_vector(model), hyperparameter_vector(exact)) < 1e-6
    X_test = torch.linspace(0, 1, 50, dtype=DT).unsqueeze(-1)
    with torch.no_grad():
        p, ref = model.posterior(X_test), exact.posterior(X_test)
    assert rel_err(p.mean, ref.mean) < 1e-6 and rel_err(p.variance, ref.variance) < 1e-5


def test_fit_holds_a_and_L_at_their_optimum_on_the_replay_set_scaled_to_all_data():
    """A replay set of half the stream: the fit's (a, L) maximise the scaled ELBO, and
    the fit ends at a stationary point in the hyperparameters."""
    X, Y = _toy(40, d=2)
    model = DecoupledSVGP(X[:20], Y[:20], replay_size=20, max_covar_basis=8, num_init_steps=20)
    model.observe(X[20:], Y[20:])
    assert len(model._replay_y) == 20 and model.num_observed == 40
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    before = -model.compute_custom_loss(mll).item()
    fit_gpytorch_mll(mll)
    model.train()
    loss = model.compute_custom_loss(mll)
    assert -loss.item() > before
    variational = [model.mean_weights, model.covar_root]
    others = [
        p for p in mll.parameters() if p.requires_grad and all(p is not v for v in variational)
    ]
    grads = torch.autograd.grad(loss, variational + others)
    assert grads[0].abs().max() < 1e-6 * max(1.0, model.mean_weights.abs().max().item())
    assert grads[1].tril().abs().max() < 1e-6
    assert max(g.abs().max().item() for g in grads[2:]) < 1e-3


# ------------------------------------------------- without a transform: target units
def _scaled_model(scale: float, **options) -> DecoupledSVGP:
    X, Y = _toy(40, d=2)
    torch.manual_seed(0)
    model = DecoupledSVGP(X[:30], scale * Y[:30] + 100 * scale, outcome_transform=None, **options)
    model.observe(X[30:], scale * Y[30:] + 100 * scale)
    return model


def test_without_a_transform_the_fit_is_equivariant_in_the_targets_scale():
    # Issue 37: with outcome_transform=None, Adam's unit-size steps on a covariance root
    # of order 1e-12 (at 1e12 Y) broke it, and the hyperparameters (raw values of order
    # 1e24) never moved. In the targets' unit the same steps are relative: the model on
    # 1e12 (Y + 100) is the model on Y + 100, scaled (to the rounding Adam amplifies).
    X_test = _toy(10, seed=3, d=2)[0]
    options = {"max_mean_basis": 32, "max_covar_basis": 12, "num_init_steps": 5, "num_steps": 2}
    unit, scaled = _scaled_model(1.0, **options), _scaled_model(1e12, **options)
    assert unit.target_scale.item() == 1.0 and scaled.target_scale.item() == 1e12
    assert torch.equal(unit.covar_basis, scaled.covar_basis)  # the same basis is chosen
    with torch.no_grad():
        p, q = unit.posterior(X_test), scaled.posterior(X_test)
        assert rel_err((q.mean - 100e12) / 1e12, p.mean - 100) < 1e-5
        assert rel_err(q.variance / 1e24, p.variance) < 1e-5
        assert rel_err(scaled.likelihood.noise / 1e24, unit.likelihood.noise) < 1e-5


def test_standardized_targets_keep_the_papers_parametrisation():
    # The default path is unchanged: the variational parameters are a and L themselves,
    # and the modules' constraints are gpytorch's own.
    X, Y = _toy(20)
    model = DecoupledSVGP(1e6 * X, 1e6 * Y, num_init_steps=2)
    assert model.target_scale.item() == 1.0
    assert torch.equal(model.weights, model.mean_weights)
    assert torch.equal(model.root, model.covar_root.tril())
    assert "TargetUnits" not in repr(model)


def test_a_target_units_model_restores_bit_for_bit():
    # The unit and the constraints' scales are buffers: a checkpoint carries them.
    source = _scaled_model(1e12, max_mean_basis=16, max_covar_basis=6, num_init_steps=3)
    receiver = _scaled_model(1.0, max_mean_basis=16, max_covar_basis=6, num_init_steps=3)
    receiver.restore(source.checkpoint())
    assert receiver.target_scale.item() == 1e12
    X_test = _toy(5, seed=4, d=2)[0]
    with torch.no_grad():
        p, q = source.posterior(X_test), receiver.posterior(X_test)
    assert torch.equal(p.mean, q.mean) and torch.equal(p.variance, q.variance)


def test_a_checkpoint_from_before_the_unit_restores():
    # Checkpoints written before target_scale existed hold a and L themselves (unit one).
    X, Y = _toy(20)
    source = DecoupledSVGP(X, Y, max_mean_basis=16, max_covar_basis=6, num_init_steps=3)
    checkpoint = source.checkpoint()
    del checkpoint["state_dict"]["target_scale"], checkpoint["checksum"], checkpoint["meta"]
    receiver = DecoupledSVGP(X[:5], 1e6 * Y[:5], outcome_transform=Standardize(1))
    receiver.restore(checkpoint)
    assert receiver.target_scale.item() == 1.0
    X_test = _toy(5, seed=4)[0]
    with torch.no_grad():
        assert torch.equal(receiver.posterior(X_test).mean, source.posterior(X_test).mean)


# ------------------------------------------- a converged model, and warm starts
def test_observe_keeps_a_fitted_model_and_a_l_at_their_optimum():
    """A small batch after fit_gpytorch_mll: Adam's steps on a moved every coordinate by
    about the step size whatever its gradient, and a multiplies an ill-conditioned
    K_alpha (test RMSE 0.85 -> 10.4 on three points, 21.6 on one duplicate point)."""
    X, Y = sines(43, seed=0)
    model = DecoupledSVGP(X[:40], Y[:40], num_init_steps=20)
    fit_briefly(model)
    fitted = held_out_rmse(model)
    for batch in [slice(40, 43), slice(0, 1)]:
        stream = copy.deepcopy(model)
        stream.observe(X[batch], Y[batch])
        assert held_out_rmse(stream) < 1.1 * fitted
        weights, root = stream.mean_weights.clone(), stream.covar_root.clone()
        stream._set_optimal_parameters(stream._replay_X, stream._replay_y, stream.num_observed)
        assert torch.equal(stream.mean_weights, weights)
        assert torch.equal(stream.covar_root, root)


def test_warm_start_reproduces_the_model_on_its_data_and_adapts_to_more():
    """BoTorch's closed loop: rebuild on all data, load the old state_dict. (a, L) were
    this model's own, fitted under other hyperparameters (test RMSE 12.7 vs 0.75)."""
    X, Y = sines(43, seed=0)
    old = DecoupledSVGP(X[:40], Y[:40], num_init_steps=20)
    fit_briefly(old)
    same = DecoupledSVGP(X[:40], Y[:40], num_init_steps=20)
    same.load_state_dict(old.state_dict())
    X_test = sines(20, seed=1)[0]
    with torch.no_grad():
        p, ref = same.posterior(X_test), old.posterior(X_test)
    assert rel_err(p.mean, ref.mean) < 1e-8 and rel_err(p.variance, ref.variance) < 1e-6
    more = DecoupledSVGP(X, Y, num_init_steps=20)
    more.load_state_dict(old.state_dict())
    assert held_out_rmse(more) < 1.1 * held_out_rmse(old)
    assert more.num_observed == 43  # the receiving model's data are kept
