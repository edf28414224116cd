"""OnlineSVGP against dense oracles: Titsias optimum, streaming bound, OVC conditioning."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from botorch.acquisition import qKnowledgeGradient, qNegIntegratedPosteriorVariance
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import BernoulliLikelihood, GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from oracles import hyperparameter_vector, rel_err
from oracles.variational import (
    collapsed_bound,
    pseudo_point_conditioning,
    svgp_predictive,
    titsias_optimum,
)
from sines_helpers import fit_briefly, held_out_rmse, sines

from streamgp.models import OnlineSVGP
from streamgp.models.osvgp import FrozenPosterior

DT = torch.float64
NOISE = 0.01
MEAN = 0.2


def _toy(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, dtype=DT, generator=gen)
    Y = torch.sin(6 * X) + 0.1 * torch.randn(n, 1, dtype=DT, generator=gen)
    return X, Y


def _fixed_model(X, Y, Z, *, beta=1.0, lbfgs_iters=0, **kwargs) -> OnlineSVGP:
    """Model with fixed hyperparameters and inducing points (only q(u) is learned)."""
    kernel = ScaleKernel(RBFKernel())
    kernel.base_kernel.lengthscale = 0.2
    kernel.outputscale = 1.3
    kernel.requires_grad_(False)
    likelihood = GaussianLikelihood()
    likelihood.noise = NOISE
    likelihood.requires_grad_(False)
    mean = ConstantMean()
    mean.constant.data.fill_(MEAN)
    mean.requires_grad_(False)
    options = {}
    if lbfgs_iters:
        options = {
            "optimizer_cls": torch.optim.LBFGS,
            "optimizer_kwargs": {
                "lr": 1.0,
                "max_iter": lbfgs_iters,
                "line_search_fn": "strong_wolfe",
                "tolerance_grad": 1e-10,
                "tolerance_change": 1e-14,
            },
            "keep_optimizer_state": False,
            "num_init_steps": 1,
            "num_steps": 1,
        }
    options.update(outcome_transform=None)  # the oracles work in the units of Y
    options.update(kwargs)
    return OnlineSVGP(
        X,
        Y,
        inducing_points=Z,
        covar_module=kernel,
        likelihood=likelihood,
        mean_module=mean,
        beta=beta,
        learn_inducing_points=False,
        # Tiny jitter: the oracles have none (K_zz is well conditioned here).
        jitter=1e-10,
        **options,
    )


def _dense(model: OnlineSVGP, Z, X):
    """Kernel blocks with the model's jitter on K_zz, as gpytorch's strategy uses."""
    k = model.covar_module
    jitter = model.model.variational_strategy.jitter_val
    with torch.no_grad():
        K_zz = k(Z).to_dense() + jitter * torch.eye(len(Z), dtype=DT)
        K_zx = k(Z, X).to_dense()
        # The strategy also adds the jitter to the data covariance (the trace term).
        diag = k(X, diag=True) + jitter
    return K_zz, K_zx, diag


def _set_q(model: OnlineSVGP, m: torch.Tensor, S: torch.Tensor) -> None:
    """Set q(u) = N(m, S) (unwhitened) through the whitened parametrisation."""
    Z = model.inducing_points
    K_zz, _, _ = _dense(model, Z, Z)
    L = torch.linalg.cholesky(K_zz)
    m_w = torch.linalg.solve_triangular(L, (m - MEAN).unsqueeze(-1), upper=False).squeeze(-1)
    half = torch.linalg.solve_triangular(L, S, upper=False)
    S_w = torch.linalg.solve_triangular(L, half.T, upper=False)
    model.model.set_variational_parameters(m_w, torch.linalg.cholesky(0.5 * (S_w + S_w.T)))


def _q(model: OnlineSVGP) -> tuple[torch.Tensor, torch.Tensor]:
    frozen = model._freeze_posterior()
    return frozen.mean, frozen.root @ frozen.root.T


def _variational_grad(model: OnlineSVGP, X, y) -> tuple[torch.Tensor, torch.Tensor]:
    model.model.train()
    model.likelihood.train()
    loss = model.streaming_loss(X, y)
    model.model.eval()
    model.likelihood.eval()
    dist = model.model.variational_strategy._variational_distribution
    grads = torch.autograd.grad(loss, [dist.variational_mean, dist.chol_variational_covar])
    return loss.detach(), torch.cat([g.flatten() for g in grads])


def _optimum(model, Z, X, Y):
    K_zz, K_zx, _ = _dense(model, Z, X)
    n, m = len(X), len(Z)
    return titsias_optimum(
        K_zz,
        K_zx,
        Y.squeeze(-1),
        NOISE,
        torch.full((m,), MEAN, dtype=DT),
        torch.full((n,), MEAN, dtype=DT),
    )


def _bound(model, Z, X, Y):
    K_zz, K_zx, diag = _dense(model, Z, X)
    return collapsed_bound(
        K_zz, K_zx, diag, Y.squeeze(-1), NOISE, torch.full((len(X),), MEAN, dtype=DT)
    )


Z6 = torch.linspace(0.05, 0.95, 6, dtype=DT).unsqueeze(-1)


def test_first_batch_objective_is_collapsed_bound_at_titsias_optimum():
    X, Y = _toy(30)
    model = _fixed_model(X, Y, Z6, num_init_steps=0)
    _set_q(model, *_optimum(model, Z6, X, Y))
    loss, grad = _variational_grad(model, X, Y.squeeze(-1))
    # Tolerances: float64 round-off of terms of size ~1/noise.
    assert torch.allclose(-loss, _bound(model, Z6, X, Y), atol=1e-5, rtol=0)
    assert grad.abs().max() < 1e-4


def test_streaming_objective_is_stationary_at_batch_optimum():
    X, Y = _toy(40)
    X1, Y1, X2, Y2 = X[:25], Y[:25], X[25:], Y[25:]
    model = _fixed_model(X1, Y1, Z6, num_init_steps=0)
    _set_q(model, *_optimum(model, Z6, X1, Y1))
    # Freeze q_old = optimum on batch 1; put q at the optimum on batches 1 and 2.
    model.frozen_posterior = model._freeze_posterior()
    _set_q(model, *_optimum(model, Z6, X, Y))
    loss, grad = _variational_grad(model, X2, Y2.squeeze(-1))
    assert grad.abs().max() < 1e-4
    # Chain rule of the bound: streaming optimum = bound(all) - bound(batch 1).
    expected = _bound(model, Z6, X, Y) - _bound(model, Z6, X1, Y1)
    assert torch.allclose(-loss, expected, atol=1e-5, rtol=0)


def test_beta_downweights_kl_terms():
    X, Y = _toy(20)
    model = _fixed_model(X, Y, Z6, num_init_steps=0)
    _set_q(model, *_optimum(model, Z6, X, Y))
    loss_1, _ = _variational_grad(model, X, Y.squeeze(-1))
    kl = model.model.variational_strategy.kl_divergence().detach()
    model.beta = 1e-3
    loss_small, _ = _variational_grad(model, X, Y.squeeze(-1))
    assert torch.allclose(loss_1 - loss_small, (1 - 1e-3) * kl, atol=1e-9)


def test_streaming_batches_reach_batch_optimum():
    X, Y = _toy(36)
    model = _fixed_model(X[:12], Y[:12], Z6, lbfgs_iters=40)
    m1, S1 = _optimum(model, Z6, X[:12], Y[:12])
    m_hat, S_hat = _q(model)
    assert torch.allclose(m_hat, m1, atol=1e-4) and torch.allclose(S_hat, S1, atol=1e-4)
    for start in (12, 24):
        model.observe(X[start : start + 12], Y[start : start + 12])
    m_all, S_all = _optimum(model, Z6, X, Y)
    m_hat, S_hat = _q(model)
    assert torch.allclose(m_hat, m_all, atol=1e-4)
    assert torch.allclose(S_hat, S_all, atol=1e-5)
    assert model.num_observed == 36


@pytest.mark.slow
def test_default_adam_learns_hyperparameters_and_inducing_points():
    X, Y = _toy(300, seed=1)
    model = OnlineSVGP(X[:60], Y[:60], num_inducing=12, num_init_steps=300, lr=0.01, num_steps=30)
    lengthscale = model.covar_module.base_kernel.lengthscale.clone()
    Z = model.inducing_points.detach().clone()
    for start in range(60, 300, 60):
        model.observe(X[start : start + 60], Y[start : start + 60])
    assert not torch.equal(model.inducing_points, Z)
    assert not torch.equal(model.covar_module.base_kernel.lengthscale, lengthscale)
    X_test = torch.linspace(0, 1, 50, dtype=DT).unsqueeze(-1)
    with torch.no_grad():
        rmse = (model.posterior(X_test).mean - torch.sin(6 * X_test)).pow(2).mean().sqrt()
    assert rmse < 0.1


# ----------------------------------------------------------------- conditioning
@pytest.fixture
def fitted():
    """A model whose q(u) is the exact Titsias optimum (a genuine Gaussian posterior)."""
    X, Y = _toy(30)
    model = _fixed_model(X, Y, Z6, num_init_steps=0)
    m, S = _optimum(model, Z6, X, Y)
    _set_q(model, m, S)
    return model, m, S


def test_conditioning_matches_joint_and_pseudo_point_oracles(fitted):
    model, m, S = fitted
    gen = torch.Generator().manual_seed(3)
    b, q, t, s = 3, 2, 4, 5
    X_new = torch.rand(b, q, 1, dtype=DT, generator=gen)
    Y_new = torch.randn(s, b, q, 1, dtype=DT, generator=gen)
    X_test = torch.rand(b, t, 1, dtype=DT, generator=gen)
    conditioned = model.condition_on_observations(X_new, Y_new)
    assert conditioned.batch_shape == torch.Size([s, b])
    with torch.no_grad():
        post = conditioned.posterior(X_test)
        post_noisy = conditioned.posterior(X_test, observation_noise=True)
    assert post.mean.shape == (s, b, t, 1)
    K_zz, _, _ = _dense(model, Z6, Z6)
    k = model.covar_module
    for j in range(b):
        X_all = torch.cat([X_new[j], X_test[j]])
        with torch.no_grad():
            K_zx = k(Z6, X_all).to_dense()
            K_xx = k(X_all).to_dense()
            full = torch.cat([Z6, X_all])
            K_full = k(full).to_dense() + 1e-12 * torch.eye(len(full), dtype=DT)
        mean_all = torch.full((q + t,), MEAN, dtype=DT)
        mu, C = svgp_predictive(m, S, K_zz, K_zx, K_xx, torch.full((6,), MEAN, dtype=DT), mean_all)
        A = C[:q, :q] + NOISE * torch.eye(q, dtype=DT)
        cov_oracle = C[q:, q:] - C[q:, :q] @ torch.linalg.solve(A, C[:q, q:])
        assert torch.allclose(post.distribution.covariance_matrix[0, j], cov_oracle, atol=1e-8)
        noisy = cov_oracle + NOISE * torch.eye(t, dtype=DT)
        assert torch.allclose(post_noisy.distribution.covariance_matrix[0, j], noisy, atol=1e-8)
        for i in range(s):
            y = Y_new[i, j].squeeze(-1)
            mean_oracle = mu[q:] + C[q:, :q] @ torch.linalg.solve(A, y - mu[:q])
            assert torch.allclose(post.mean[i, j].squeeze(-1), mean_oracle, atol=1e-8)
            mean_pp, cov_pp = pseudo_point_conditioning(
                m, S, K_zz, torch.full((6,), MEAN, dtype=DT), K_full,
                torch.full((6 + q + t,), MEAN, dtype=DT), 6, q, y, NOISE,
            )  # fmt: skip
            assert torch.allclose(mean_pp, mean_oracle, atol=1e-5)
            assert torch.allclose(cov_pp, cov_oracle, atol=1e-5)


def test_repeated_conditioning_equals_joint_conditioning(fitted):
    model, _, _ = fitted
    gen = torch.Generator().manual_seed(4)
    X1, X2 = torch.rand(2, 1, dtype=DT, generator=gen), torch.rand(3, 1, dtype=DT, generator=gen)
    Y1, Y2 = torch.randn(2, 1, dtype=DT, generator=gen), torch.randn(3, 1, dtype=DT, generator=gen)
    X_test = torch.rand(4, 1, dtype=DT, generator=gen)
    two_step = model.condition_on_observations(X1, Y1).condition_on_observations(X2, Y2)
    one_step = model.condition_on_observations(torch.cat([X1, X2]), torch.cat([Y1, Y2]))
    with torch.no_grad():
        a, b = two_step.posterior(X_test), one_step.posterior(X_test)
    assert torch.allclose(a.mean, b.mean, atol=1e-10)
    assert torch.allclose(
        a.distribution.covariance_matrix, b.distribution.covariance_matrix, atol=1e-10
    )
    # The parent is unchanged (the conditioned model is a view).
    with torch.no_grad():
        parent = model.posterior(X_test)
    assert not torch.allclose(parent.mean, a.mean)
    assert model.batch_shape == torch.Size([])


def test_fantasize_shapes_and_gradients(fitted):
    model, _, _ = fitted
    X = torch.rand(4, 2, 1, dtype=DT, requires_grad=True)
    fantasy = model.fantasize(X, SobolQMCNormalSampler(torch.Size([8])))
    assert fantasy.batch_shape == torch.Size([8, 4])
    post = fantasy.posterior(torch.rand(4, 3, 1, dtype=DT))
    assert post.mean.shape == (8, 4, 3, 1)
    post.variance.sum().backward()
    assert X.grad is not None and torch.isfinite(X.grad).all() and X.grad.abs().sum() > 0


def test_qnipv_and_qkg_run_through_optimize_acqf(fitted):
    model, _, _ = fitted
    bounds = torch.tensor([[0.0], [1.0]], dtype=DT)
    mc_points = torch.linspace(0, 1, 16, dtype=DT).unsqueeze(-1)
    qnipv = qNegIntegratedPosteriorVariance(model, mc_points=mc_points)
    candidate, value = optimize_acqf(
        qnipv, bounds, q=2, num_restarts=2, raw_samples=8, options={"maxiter": 5}
    )
    assert candidate.shape == (2, 1) and torch.isfinite(value)
    qkg = qKnowledgeGradient(model, num_fantasies=4)
    candidate, value = optimize_acqf(
        qkg, bounds, q=1, num_restarts=2, raw_samples=8, options={"maxiter": 5}
    )
    assert candidate.shape == (1, 1) and torch.isfinite(value)


# --------------------------------------------------------------------- Bernoulli
def test_bernoulli_learns_separable_problem_and_refuses_conditioning():
    gen = torch.Generator().manual_seed(5)
    X = torch.rand(200, 1, dtype=DT, generator=gen)
    Y = (X > 0.5).to(DT)
    model = OnlineSVGP(
        X[:40],
        Y[:40],
        likelihood=BernoulliLikelihood(),
        num_inducing=8,
        num_init_steps=100,
        num_steps=5,
        lr=0.05,
    )
    for start in range(40, 200, 40):
        model.observe(X[start : start + 40], Y[start : start + 40])
    X_test = torch.linspace(0.02, 0.98, 49, dtype=DT).unsqueeze(-1)
    with torch.no_grad():
        latent = model.posterior(X_test).mean.squeeze(-1)
    accuracy = ((latent > 0) == (X_test.squeeze(-1) > 0.5)).to(DT).mean()
    assert accuracy >= 0.9
    with pytest.raises(NotImplementedError, match="GaussianLikelihood"):
        model.condition_on_observations(X_test[:2], torch.ones(2, 1, dtype=DT))
    with pytest.raises(ValueError, match="observation_noise"):
        model.fantasize(X_test[:2], SobolQMCNormalSampler(torch.Size([2])))
    with pytest.raises(ValueError, match="0/1 labels"):
        model.observe(X_test[:2], torch.tensor([[0.0], [0.5]], dtype=DT))


# --------------------------------------------------------------- inducing selector
class _GrowingSelector:
    """Keeps every input farther than ``spacing`` from the current set (a toy OIPS)."""

    def __init__(self, initial: torch.Tensor, spacing: float) -> None:
        self.points = initial.clone()
        self.spacing = spacing

    def update(self, X: torch.Tensor) -> torch.Tensor:
        for x in X:
            if torch.cdist(x[None], self.points).min() > self.spacing:
                self.points = torch.cat([self.points, x[None]])
        return self.points


def test_inducing_selector_grows_the_set_and_warm_start_is_exact():
    X, Y = _toy(40)
    Z0 = torch.tensor([[0.1], [0.5]], dtype=DT)
    selector = _GrowingSelector(Z0, spacing=0.15)
    model = _fixed_model(X[:20], Y[:20], None, inducing_selector=selector, lbfgs_iters=30)
    assert not model.inducing_points.requires_grad  # the selector owns the locations
    num_before = len(model.inducing_points)
    assert num_before > 2
    X_test = torch.linspace(0, 1, 7, dtype=DT).unsqueeze(-1)
    X_far = torch.tensor([[1.3], [-0.3]], dtype=DT)
    Y_far = torch.zeros(2, 1, dtype=DT)
    with torch.no_grad():
        before = model.posterior(X_test)
        expected = model.condition_on_observations(X_far, Y_far).posterior(X_far).mean
    # A superset of inducing points: the predictions are unchanged (q is the exact
    # projection of q_old).
    grown = copy.deepcopy(model)
    grown.model.replace_inducing_points(torch.cat([grown.inducing_points, X_far]))
    with torch.no_grad():
        after = grown.posterior(X_test)
    assert torch.allclose(before.mean, after.mean, atol=1e-6)
    assert torch.allclose(before.variance, after.variance, atol=1e-6)
    # New points far from the set: the set grows, and even with no optimizer steps q
    # absorbs the batch (Bui et al.'s closed form); with the new points in the set, q
    # at them is the exact Gaussian update of q_old there.
    model.observe(X_far, Y_far, num_steps=0)
    assert len(model.inducing_points) > num_before
    assert torch.equal(model.inducing_points, selector.points)
    with torch.no_grad():
        assert torch.allclose(model.posterior(X_far).mean, expected, atol=1e-6)


# -------------------------------------------------------------------- validation
def _state(model: OnlineSVGP):
    return {k: v.clone() for k, v in model.state_dict().items()}, model.num_observed


def test_bad_inputs_raise_and_leave_model_unchanged(fitted):
    model, _, _ = fitted
    state, n = _state(model)
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
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            model.observe(*args)
    with pytest.raises(ValueError, match="num_steps"):
        model.observe(X, Y, num_steps=-1)
    with pytest.raises(ValueError, match="Yvar must be None: OnlineSVGP learns"):
        model.observe(X, Y, torch.full_like(Y, 0.1))  # the third argument is Yvar
    with pytest.raises(TypeError, match="positional"):
        model.observe(X, Y, None, 3)  # num_steps is keyword-only
    with pytest.raises(ValueError, match="X contains NaN"):
        model.posterior(X.clone().fill_(math.nan))
    with pytest.raises(ValueError, match="noise must be strictly positive"):
        model.condition_on_observations(X, Y, noise=torch.zeros(3, 1, dtype=DT))
    with pytest.raises(RuntimeError, match="conditioned"):
        model.condition_on_observations(X, Y).observe(X, Y)
    new_state, new_n = _state(model)
    assert new_n == n and all(torch.equal(state[k], new_state[k]) for k in state)


def test_bad_constructor_arguments():
    X, Y = _toy(10)
    assert 0 < len(OnlineSVGP(X, Y, num_init_steps=0).inducing_points) <= 10  # not 64
    with pytest.raises(ValueError, match="num_inducing=64"):
        OnlineSVGP(X[:0], Y[:0])
    with pytest.raises(TypeError, match="likelihood must be"):
        OnlineSVGP(X, Y, num_inducing=4, likelihood=torch.nn.Module())
    with pytest.raises(ValueError, match="beta must be a positive"):
        OnlineSVGP(X, Y, num_inducing=4, beta=0.0)
    with pytest.raises(ValueError, match="inducing_points must have last dimension 1"):
        OnlineSVGP(X, Y, inducing_points=torch.rand(4, 2, dtype=DT))
    with pytest.raises(ValueError, match="train_Y contains NaN"):
        OnlineSVGP(X, Y.clone().fill_(math.nan), num_inducing=4)
    with pytest.raises(ValueError, match="0/1 labels"):
        OnlineSVGP(X, Y, num_inducing=4, likelihood=BernoulliLikelihood())
    with pytest.raises(TypeError, match="update"):
        OnlineSVGP(X, Y, inducing_selector=object())


def test_transforms_are_frozen_and_applied():
    from botorch.models.transforms import Normalize, Standardize

    X, Y = _toy(30)
    X_raw, Y_raw = 10 * X + 5, 3 * Y - 1
    model = OnlineSVGP(
        X_raw,
        Y_raw,
        num_inducing=6,
        num_init_steps=20,
        input_transform=Normalize(1),
        outcome_transform=Standardize(1),
    )
    # Inducing points were chosen in the normalised space.
    assert model.inducing_points.abs().max() < 3
    model.observe(X_raw[:5], Y_raw[:5])
    with torch.no_grad():
        post = model.posterior(X_raw[:4])
    assert post.mean.shape == (4, 1)
    assert (post.mean - Y_raw[:4]).abs().max() < 3 * Y_raw.std()


def test_diverging_update_is_rolled_back(fitted):
    model, _, _ = fitted
    # q is set in closed form; an infinite SGD step sends a hyperparameter to inf.
    model.covar_module.raw_outputscale.requires_grad_(True)
    model.optimizer_cls = torch.optim.SGD
    model.optimizer_kwargs = {"lr": math.inf}
    model.keep_optimizer_state = False
    state, n = _state(model)
    X, Y = _toy(5, seed=7)
    with pytest.raises(RuntimeError, match="non-finite"):
        model.observe(X, Y, num_steps=1)
    new_state, new_n = _state(model)
    assert new_n == n and all(torch.equal(state[k], new_state[k]) for k in state)


def test_refine_continues_the_last_batch_objective():
    import copy

    X, Y = _toy(40)
    base = OnlineSVGP(X[:20], Y[:20], num_inducing=6, num_init_steps=10, lr=0.01)
    split, joined = base, copy.deepcopy(base)
    split.observe(X[20:], Y[20:], num_steps=3).refine(5)
    joined.observe(X[20:], Y[20:], num_steps=8)
    assert split.num_observed == joined.num_observed == 40
    state, other = split.state_dict(), joined.state_dict()
    assert all(torch.equal(state[k], other[k]) for k in state)
    # The refined objective is the streaming bound of the last batch, which went down.
    loss_before = split.streaming_loss(*split.last_batch).item()
    split.refine(50)
    assert split.streaming_loss(*split.last_batch).item() < loss_before


def test_refine_bad_calls_raise_and_leave_model_unchanged(fitted):
    model, _, _ = fitted
    state, n = _state(model)
    with pytest.raises(ValueError, match="num_steps"):
        model.refine(-1)
    with pytest.raises(RuntimeError, match="conditioned"):
        X = torch.rand(2, 1, dtype=DT)
        model.condition_on_observations(X, torch.zeros(2, 1, dtype=DT)).refine(1)
    model.covar_module.raw_outputscale.requires_grad_(True)  # (q is set in closed form)
    model.optimizer_cls = torch.optim.SGD
    model.optimizer_kwargs = {"lr": math.inf}
    with pytest.raises(RuntimeError, match="non-finite"):
        model.refine(1)
    new_state, new_n = _state(model)
    assert new_n == n and all(torch.equal(state[k], new_state[k]) for k in state)
    empty = OnlineSVGP(X[:0], torch.zeros(0, 1, dtype=DT), inducing_points=Z6)
    with pytest.raises(RuntimeError, match="observe data first"):
        empty.refine(1)


# ------------------------------------------------------- defaults and the prior mean
def test_defaults_are_standardize_and_a_learned_constant_mean():
    gen = torch.Generator().manual_seed(2)
    X = torch.rand(40, 1, dtype=DT, generator=gen)
    Y = 100 + 10 * torch.sin(6 * X)
    far = torch.full((1, 1), 20.0, dtype=DT)
    model = OnlineSVGP(X, Y, num_inducing=12, num_init_steps=50, lr=0.05)
    assert isinstance(model.outcome_transform, Standardize)
    assert type(model.mean_module) is ConstantMean
    assert model.mean_module.raw_constant.requires_grad
    with torch.no_grad():
        assert abs(model.posterior(far).mean.item() - 100) < 3.0  # not ~0
    # ZeroMean without a transform: the zero-mean model on raw targets.
    zero = OnlineSVGP(
        X, Y, num_inducing=12, num_init_steps=0, outcome_transform=None, mean_module=ZeroMean()
    )
    assert not hasattr(zero, "outcome_transform")
    assert not any("mean_module" in name for name, _ in zero.named_parameters())
    with torch.no_grad():
        assert abs(zero.posterior(far).mean.item()) < 1e-6
    empty = OnlineSVGP(X[:0], Y[:0], inducing_points=Z6)  # nothing to standardise
    assert not hasattr(empty, "outcome_transform")


def test_bernoulli_default_is_no_transform_and_a_given_one_raises():
    X = torch.rand(10, 1, dtype=DT)
    labels = (X > 0.5).to(DT)
    options = {"likelihood": BernoulliLikelihood(), "num_inducing": 4, "num_init_steps": 0}
    assert not hasattr(OnlineSVGP(X, labels, **options), "outcome_transform")
    assert not hasattr(
        OnlineSVGP(X, labels, outcome_transform=None, **options), "outcome_transform"
    )
    with pytest.raises(ValueError, match="outcome_transform must be None"):
        OnlineSVGP(X, labels, outcome_transform=Standardize(1), **options)


def test_constant_is_learned_by_observe_steps_and_fit_gpytorch_mll():
    X, Y = _toy(60)
    Y = Y + 5.0
    model = OnlineSVGP(
        X[:30],
        Y[:30],
        num_inducing=8,
        outcome_transform=None,
        # A constant from zero (given, so not started at the targets' mean): learned.
        mean_module=ConstantMean(),
        num_init_steps=5,
        num_steps=5,
        lr=0.1,
    )
    first = model.mean_module.constant.item()
    assert first > 0.3  # 5 Adam steps of 0.1 toward 5
    model.observe(X[30:], Y[30:])
    second = model.mean_module.constant.item()
    assert second > first + 0.2
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    assert model.mean_module.constant.item() > second


# ---------------------------------------------- fit_gpytorch_mll: the collapsed bound
def _fit(model: OnlineSVGP) -> None:
    model.train()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    model.eval()


def _valid_stream(beta: float = 1e-3) -> OnlineSVGP:
    """Defaults (Standardize, learned constant); q at its optimum on the first batch, so
    the frozen old posterior is a genuine one; then steps move the hyperparameters."""
    X, Y = _toy(40)
    Y = Y + 1.0
    model = OnlineSVGP(X[:20], Y[:20], num_inducing=6, num_init_steps=20, lr=0.05, beta=beta)
    model.model.set_variational_parameters(*model.optimal_variational_parameters(model.beta))
    model.observe(X[20:], Y[20:], num_steps=10)
    return model


@pytest.mark.parametrize("beta", [1.0, 1e-3])
def test_closed_form_q_is_stationary_for_the_models_own_loss(beta):
    """Learned constant, an old posterior under other hyperparameters: gpytorch's
    streaming loss has zero gradient in q at the closed form (for either KL weight)."""
    model = _valid_stream()
    model.model.set_variational_parameters(*model.optimal_variational_parameters(beta))
    model.beta = beta
    loss, grad = _variational_grad(model, *model.last_batch)
    assert grad.abs().max() < 1e-8
    # And a maximum: a perturbed q has a larger loss.
    dist = model.model.variational_strategy._variational_distribution
    with torch.no_grad():
        dist.variational_mean.add_(1e-3)
    model.model.variational_strategy._clear_cache()
    assert _variational_grad(model, *model.last_batch)[0] > loss


def test_fit_with_inducing_points_at_the_data_is_the_exact_gp_fit():
    """Z = X, fixed: the collapsed bound is the exact log marginal likelihood, so
    fit_gpytorch_mll finds the exact GP's hyperparameters and posterior (same kernel,
    mean and likelihood, no priors)."""
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
    model = OnlineSVGP(X, Y, inducing_points=X, learn_inducing_points=False, outcome_transform=None)
    _fit(model)
    assert rel_err(hyperparameter_vector(model), hyperparameter_vector(exact)) < 1e-3
    X_test = torch.linspace(0, 1, 50, dtype=DT).unsqueeze(-1)
    with torch.no_grad():
        p, ref = model.posterior(X_test), exact.posterior(X_test)
    assert rel_err(p.mean, ref.mean) < 1e-3 and rel_err(p.variance, ref.variance) < 1e-2


def test_fit_converges_with_q_at_its_optimum_and_beats_first_order_steps():
    """A stream, the defaults: the fit ends at a stationary point of Bui et al.'s bound
    in the hyperparameters and inducing points, with q at its closed form there."""
    model = _valid_stream()
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    before = -model.compute_custom_loss(mll).item()
    _fit(model)
    m, R = model.optimal_variational_parameters()
    dist = model.model.variational_strategy._variational_distribution
    assert torch.equal(dist.variational_mean, m) and torch.equal(dist.chol_variational_covar, R)
    model.train()
    loss = model.compute_custom_loss(mll)
    held = {id(p) for p in dist.parameters()}
    params = [p for p in mll.parameters() if p.requires_grad and id(p) not in held]
    assert len(params) == 5  # lengthscale, outputscale, noise, constant, inducing points
    grads = torch.autograd.grad(loss, params)
    assert max(g.abs().max().item() for g in grads) < 1e-3
    assert -loss.item() > before + 0.1  # per datum


def test_fit_without_a_maximiser_in_q_warns_and_takes_first_order_steps():
    """An old posterior 9x wider than an old prior with a quarter of today's variance:
    Bui et al.'s bound is unbounded in q; the fit falls back to the beta-weighted steps."""
    X, Y = _toy(22)
    model = OnlineSVGP(X[:20], Y[:20], num_inducing=6, num_init_steps=0, lr=0.01)
    model.observe(X[20:], Y[20:], num_steps=0)
    model.num_init_steps = 20  # the fallback's steps
    old = model.frozen_posterior
    model.frozen_posterior = FrozenPosterior(
        inducing_points=old.inducing_points,
        mean=old.mean,
        root=1.5 * old.prior_root,
        prior_mean=old.prior_mean,
        prior_root=0.5 * old.prior_root,
    )
    with pytest.raises(torch.linalg.LinAlgError):
        model.optimal_variational_parameters()
    model.train()
    loss_before = model.streaming_loss(*model.last_batch).item()
    hyperparameters = hyperparameter_vector(model)
    with pytest.warns(RuntimeWarning, match="no maximiser"):
        _fit(model)
    model.train()
    assert model.streaming_loss(*model.last_batch).item() < loss_before
    assert not torch.equal(hyperparameter_vector(model), hyperparameters)


def test_a_model_that_predicted_can_be_deep_copied_and_the_copy_predicts_the_same():
    # gpytorch memoizes factors with gradients after a prediction; deepcopy refused them.
    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model = OnlineSVGP(X, torch.sin(4 * X).sum(-1, keepdim=True), num_inducing=6, num_init_steps=1)
    expected = model.posterior(X[:3]).mean.detach()
    copied = copy.deepcopy(model)
    with torch.no_grad():
        assert torch.equal(copied.posterior(X[:3]).mean, expected)
        assert torch.equal(model.posterior(X[:3]).mean, expected)


# ------------------------------------------- a converged model, and warm starts
def test_observe_keeps_a_fitted_model_and_q_at_its_optimum():
    """A small batch after fit_gpytorch_mll: Adam's steps on q moved every coordinate by
    about lr whatever its gradient (test RMSE 0.76 -> 1.26 on three points); q is now
    Bui et al.'s closed form, also with no optimizer steps (which ignored the batch)."""
    X, Y = sines(33, seed=0)
    model = OnlineSVGP(X[:30], Y[:30], num_init_steps=20)
    fit_briefly(model)
    fitted = held_out_rmse(model)
    for batch, num_steps in [(slice(30, 33), None), (slice(0, 1), None), (slice(30, 31), 0)]:
        stream = copy.deepcopy(model)
        stream.observe(X[batch], Y[batch], num_steps=num_steps)
        assert held_out_rmse(stream) < 1.05 * fitted
        m, R = stream.optimal_variational_parameters()
        dist = stream.model.variational_strategy._variational_distribution
        assert rel_err(dist.variational_mean, m) < 1e-10
        assert rel_err(dist.chol_variational_covar, R) < 1e-10
    stream.observe(X[31:], Y[31:], num_steps=0)  # absorbed, not ignored
    with torch.no_grad():
        before, after = model.posterior(X[31:]).mean, stream.posterior(X[31:]).mean
    assert (after - Y[31:]).abs().max() < 0.5 * (before - Y[31:]).abs().max()


def test_without_holding_the_optimum_q_takes_the_papers_first_order_steps():
    # The WISKI paper's O-SVGP baseline (its streaming protocol): beta-weighted Adam steps
    # on q itself, so q leaves the closed-form optimum after an observe.
    X, Y = sines(33, seed=0)
    model = OnlineSVGP(X[:30], Y[:30], num_init_steps=20, hold_variational_optimum=False)
    model.observe(X[30:], Y[30:])
    m, _ = model.optimal_variational_parameters()
    dist = model.model.variational_strategy._variational_distribution
    assert rel_err(dist.variational_mean, m) > 1e-3
    with pytest.raises(TypeError, match="hold_variational_optimum must be a bool"):
        OnlineSVGP(X, Y, hold_variational_optimum=1)


def test_warm_start_reproduces_the_model_on_its_data_and_adapts_to_more():
    """BoTorch's closed loop: rebuild on all data, load the old state_dict. q(u) was this
    model's own, whitened under other hyperparameters (test RMSE 25.8 vs 0.72)."""
    X, Y = sines(33, seed=0)
    old = OnlineSVGP(X[:30], Y[:30], num_init_steps=20)
    fit_briefly(old)
    same = OnlineSVGP(X[:30], Y[:30], num_init_steps=20)
    same.load_state_dict(old.state_dict())
    # The learned inducing points are fitted parameters: taken, whatever their number.
    assert torch.equal(same.inducing_points, old.inducing_points)
    X_test = sines(20, seed=1)[0]
    with torch.no_grad():
        p, ref = same.posterior(X_test), old.posterior(X_test)
    assert rel_err(p.mean, ref.mean) < 1e-8 and rel_err(p.variance, ref.variance) < 1e-6
    more = OnlineSVGP(X, Y, num_init_steps=20)
    more.load_state_dict(old.state_dict())
    assert held_out_rmse(more) < 1.1 * held_out_rmse(old)
    assert more.num_observed == 33  # the receiving model's data are kept


def test_fitting_a_model_without_data_says_so():
    X = torch.rand(0, 2, dtype=DT)
    model = OnlineSVGP(X, X[:, :1], inducing_points=torch.rand(4, 2, dtype=DT))
    with pytest.raises(RuntimeError, match="absorbed no data"):
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
