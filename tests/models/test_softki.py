"""SoftKIGP against dense closed forms, the exact GP, naive solves, and BoTorch end to end."""

from __future__ import annotations

import copy
import math
import re
import warnings

import pytest
import torch
from botorch.acquisition import qLogExpectedImprovement
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, LinearMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.linalg.grid_kernel import cholesky_with_jitter
from streamgp.models.softki import (
    SMALL_NOISE_RATIO,
    SmallFixedNoiseWarning,
    SoftKIGP,
    hutchinson_pseudo_loss,
)

DTYPE = torch.float64


def target(X):
    return torch.sin(3 * X).sum(-1, keepdim=True) + 0.5 * X[..., :1] * X[..., 1:2]


def make_data(n, d=2, noise=0.05, dtype=DTYPE):
    X = torch.rand(n, d, dtype=dtype)
    return X, target(X) + noise * torch.randn(n, 1, dtype=dtype)


def make_model(X, Y, Z, lengthscale=0.3, noise=0.01, temperature=0.1, **kwargs):
    """A zero-mean SoftKIGP on raw targets (what the dense oracles compute) unless told.

    Without the exact prior variance (tested on its own): the oracles are the SoftKI GP.
    """
    kwargs.setdefault("outcome_transform", None)
    kwargs.setdefault("mean_module", ZeroMean())
    kwargs.setdefault("exact_prior_variance", False)
    kernel = ScaleKernel(RBFKernel(ard_num_dims=X.shape[-1])).to(X)
    kernel.outputscale = 1.3
    kernel.base_kernel.lengthscale = lengthscale
    likelihood = GaussianLikelihood(noise_constraint=GreaterThan(1e-12)).to(X)
    likelihood.noise = noise
    return SoftKIGP(
        X,
        Y,
        likelihood=likelihood,
        covar_module=kernel,
        inducing_points=Z,
        temperature=temperature,
        **kwargs,
    )


def dense_oracle(model, X, y, Xs):
    """Dense n x n SoftKI GP: kernel W K W^T (K with the model's jitter) + s2 I."""
    with torch.no_grad():
        K = model.covar_module(model.inducing_points).to_dense()
        _, jitter = cholesky_with_jitter(K)
        K = K + jitter * torch.eye(len(K), dtype=K.dtype)
        W, Ws = model.weights(X).values, model.weights(Xs).values
        S = W @ K @ W.mT + model.noise_variance * torch.eye(len(X), dtype=X.dtype)
        Ksx = Ws @ K @ W.mT
        mean = Ksx @ torch.linalg.solve(S, y)
        covar = Ws @ K @ Ws.mT - Ksx @ torch.linalg.solve(S, Ksx.mT)
        L = torch.linalg.cholesky(S)
        z = torch.linalg.solve_triangular(L, y.unsqueeze(-1), upper=False).squeeze(-1)
        mll = -0.5 * (z @ z + 2 * L.diagonal().log().sum() + len(y) * math.log(2 * math.pi))
    return mean, covar, mll


def test_posterior_and_mll_equal_dense_closed_form():
    X, Y = make_data(80, d=3)
    model = make_model(X, Y, Z=torch.rand(25, 3, dtype=DTYPE), lengthscale=0.2, noise=0.05)
    Xs = torch.rand(2, 6, 3, dtype=DTYPE)
    mean, covar, mll = dense_oracle(model, X, Y.squeeze(-1), Xs)
    post = model.posterior(Xs)
    assert post.mean.shape == (2, 6, 1)
    torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(post.covariance_matrix, covar, atol=1e-8, rtol=0)
    value, n = model.fit_objective()
    assert n.item() == 80
    torch.testing.assert_close(value, mll, atol=1e-8, rtol=1e-10)
    noisy = model.posterior(Xs, observation_noise=True).covariance_matrix
    torch.testing.assert_close(
        noisy - post.covariance_matrix, 0.05 * torch.eye(6, dtype=DTYPE).expand(2, 6, 6)
    )


def test_blocked_factorisation_equals_one_block(monkeypatch):
    import streamgp.models.softki as softki

    X, Y = make_data(70, d=2)
    model = make_model(X, Y, Z=torch.rand(12, 2, dtype=DTYPE))
    one = model.fit_objective()[0]
    mean = model.posterior(X[:5]).mean
    monkeypatch.setattr(softki, "QR_CHUNK", 9)
    model._invalidate()
    f = softki.softki_factor(
        None,
        model.train_y_t,
        model._kernel_matrix(),
        model.noise_variance,
        weights_fn=model._weight_values,
        X=model.train_X_t,
        chunk=9,
    )
    torch.testing.assert_close(f.log_marginal_likelihood(model.noise_variance), one)
    post = f.posterior()
    torch.testing.assert_close(model.weights(X[:5]).values @ post.mean, mean.squeeze(-1))


def test_identity_weights_equal_exact_gp():
    """Points = training inputs and T -> 0: W = I, so SoftKI is the exact GP."""
    X, Y = make_data(20, d=2)
    model = make_model(X, Y, Z=X.clone(), temperature=1e-8, noise=0.02)
    torch.testing.assert_close(model.weights(X).values, torch.eye(20, dtype=DTYPE), atol=0, rtol=0)
    exact = SingleTaskGP(
        X,
        Y,
        covar_module=copy.deepcopy(model.covar_module),
        likelihood=copy.deepcopy(model.likelihood),
        outcome_transform=None,
    )
    exact.mean_module.constant.data.fill_(0.0)
    exact.eval()
    expected = exact.posterior(X)
    post = model.posterior(X)
    torch.testing.assert_close(post.mean, expected.mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(
        post.covariance_matrix, expected.covariance_matrix, atol=1e-8, rtol=0
    )
    mll = ExactMarginalLogLikelihood(exact.likelihood, exact)
    exact.train()
    with torch.no_grad():
        expected_mll = mll(exact(X), Y.squeeze(-1)) * 20
    torch.testing.assert_close(model.fit_objective()[0], expected_mll, atol=1e-8, rtol=0)


def _naive_mean(model, X, y, Xs):
    """Posterior mean from the normal equations C alpha = K W^T y / s2 (no QR)."""
    with torch.no_grad():
        K = model.covar_module(model.inducing_points).to_dense()
        _, jitter = cholesky_with_jitter(K)
        K = K + jitter * torch.eye(len(K), dtype=K.dtype)
        W, s2 = model.weights(X).values, model.noise_variance
        C = K + K @ W.mT @ W @ K / s2
        alpha = torch.linalg.solve(C, K @ W.mT @ y / s2)
        return model.weights(Xs).values @ K @ alpha, C


def test_qr_solve_matches_dense_solve_when_well_conditioned():
    X, Y = make_data(60, d=2)
    model = make_model(X, Y, Z=torch.rand(30, 2, dtype=DTYPE), lengthscale=0.3, noise=1e-2)
    Xs = torch.rand(10, 2, dtype=DTYPE)
    naive, _ = _naive_mean(model, X, Y.squeeze(-1), Xs)
    torch.testing.assert_close(model.posterior(Xs).mean.squeeze(-1), naive, atol=1e-8, rtol=0)


def test_qr_solve_stays_accurate_where_normal_equations_fail():
    """Long lengthscale, tiny noise: C = K + K W^T W K / s2 has condition ~1e18."""
    X, Y = make_data(60, d=2)
    model = make_model(X, Y, Z=torch.rand(30, 2, dtype=DTYPE), lengthscale=3.0, noise=1e-8)
    Xs = torch.rand(10, 2, dtype=DTYPE)
    oracle, _, _ = dense_oracle(model, X, Y.squeeze(-1), Xs)  # n x n: condition ~1e10
    naive, C = _naive_mean(model, X, Y.squeeze(-1), Xs)
    assert torch.linalg.cond(C) > 1e16
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(C)  # the normal equations cannot even be factored
    rel = lambda a: ((a - oracle).norm() / oracle.norm()).item()  # noqa: E731
    naive_error = rel(naive) if torch.isfinite(naive).all() else math.inf
    post = model.posterior(Xs)
    assert torch.isfinite(post.mean).all() and torch.isfinite(post.variance).all()
    assert (post.variance >= 0).all()
    assert rel(post.mean.squeeze(-1)) < 1e-6
    assert naive_error > 1e-2


def test_hutchinson_pseudo_loss_value_and_gradient():
    A = torch.randn(40, 40, dtype=DTYPE)
    base = A @ A.mT / 40 + 0.5 * torch.eye(40, dtype=DTYPE)
    y = torch.randn(40, dtype=DTYPE)
    t = torch.tensor(1.0, dtype=DTYPE, requires_grad=True)
    # Exact -log p and its gradient along Sigma(t) = t * base.
    exact = -torch.distributions.MultivariateNormal(
        torch.zeros(40, dtype=DTYPE), t * base
    ).log_prob(y)
    (exact_grad,) = torch.autograd.grad(exact, t)
    generator = torch.Generator().manual_seed(0)
    loss = hutchinson_pseudo_loss(t * base, y, num_probes=4000, generator=generator)
    torch.testing.assert_close(loss.detach(), exact.detach())
    (grad,) = torch.autograd.grad(loss, t)
    assert abs(grad - exact_grad) < 0.05 * abs(exact_grad)


def test_fit_lowers_pseudo_loss_and_improves_rmse():
    d = 6
    X, Y = make_data(800, d=d)
    Xt = torch.rand(300, d, dtype=DTYPE)
    Yt = target(Xt)
    model = SoftKIGP(X, Y, num_inducing=64, outcome_transform=Standardize(1))
    assert model.num_inducing == 64
    rmse = lambda: (model.posterior(Xt).mean - Yt).square().mean().sqrt().item()  # noqa: E731
    before, mll_before = rmse(), model.fit_objective()[0].item()
    history = model.fit(num_epochs=15, batch_size=256, lr=0.02, seed=0)
    assert len(history) == 15 and history[-1] < history[0]
    after = rmse()
    assert after < 0.8 * before
    assert model.fit_objective()[0].item() > mll_before


def test_fit_gpytorch_mll_increases_mll():
    X, Y = make_data(120, d=3)
    model = SoftKIGP(X, Y, num_inducing=24, outcome_transform=Standardize(1))
    before = model.fit_objective()[0].item()
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(model.likelihood, model),
        optimizer_kwargs={"options": {"maxiter": 50}},
    )
    assert model.fit_objective()[0].item() > before
    assert torch.isfinite(model.posterior(X[:3]).mean).all()


def test_optimize_acqf_with_q_log_ei():
    bounds = torch.tensor([[-1.0, 0.0, 0.0], [1.0, 2.0, 1.0]], dtype=DTYPE)
    X = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(60, 3, dtype=DTYPE)
    Y = -target(X)
    model = SoftKIGP(
        X,
        Y,
        num_inducing=20,
        input_transform=Normalize(3, bounds=bounds),
        outcome_transform=Standardize(1),
    )
    model.fit(num_epochs=3, batch_size=30, seed=0)
    acqf = qLogExpectedImprovement(model, best_f=Y.max())
    candidates, value = optimize_acqf(
        acqf, bounds=bounds, q=2, num_restarts=2, raw_samples=16, options={"maxiter": 20}
    )
    assert candidates.shape == (2, 3) and torch.isfinite(value)
    assert ((candidates >= bounds[0]) & (candidates <= bounds[1])).all()


def test_condition_on_observations_equals_model_on_all_data():
    X, Y = make_data(40, d=2)
    Z = torch.rand(15, 2, dtype=DTYPE)
    X_new, Y_new = make_data(3, d=2)
    model = make_model(X, Y, Z=Z)
    full = make_model(torch.cat([X, X_new]), torch.cat([Y, Y_new]), Z=Z)
    conditioned = model.condition_on_observations(X_new, Y_new)
    Xs = torch.rand(5, 2, dtype=DTYPE)
    a, b = conditioned.posterior(Xs), full.posterior(Xs)
    torch.testing.assert_close(a.mean, b.mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(a.covariance_matrix, b.covariance_matrix, atol=1e-8, rtol=0)
    # BoTorch fantasies: batched over samples and candidate sets.
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]))
    fantasy = model.fantasize(torch.rand(3, 2, 2, dtype=DTYPE), sampler)
    assert fantasy.batch_shape == (4, 3)
    assert fantasy.posterior(Xs).mean.shape == (4, 3, 5, 1)


def test_cache_is_reused_and_rebuilt_after_hyperparameter_change():
    X, Y = make_data(30, d=2)
    model = make_model(X, Y, Z=torch.rand(10, 2, dtype=DTYPE))
    Xs = torch.rand(4, 2, dtype=DTYPE)
    first = model.posterior(Xs).mean
    cached = model._posterior
    model.posterior(Xs)
    assert model._posterior is cached
    model.covar_module.base_kernel.lengthscale = 0.5
    second = model.posterior(Xs).mean
    assert model._posterior is not cached
    expected, _, _ = dense_oracle(model, X, Y.squeeze(-1), Xs)
    torch.testing.assert_close(second.squeeze(-1), expected, atol=1e-8, rtol=0)
    assert not torch.allclose(first, second)


def test_float32_and_default_options():
    X, Y = make_data(200, d=4, dtype=torch.float32)
    model = SoftKIGP(X, Y, outcome_transform=Standardize(1))
    assert model.num_inducing == 200  # min(512, n): the inputs themselves
    model = SoftKIGP(X, Y, num_inducing=32)
    model.fit(num_epochs=2, batch_size=64, seed=0)
    post = model.posterior(torch.rand(3, 5, 4))
    assert post.mean.dtype == torch.float32 and post.mean.shape == (3, 5, 1)
    assert torch.isfinite(post.mean).all() and (post.variance >= 0).all()
    assert torch.isfinite(model.fit_objective()[0])


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"train_X": torch.tensor([[0.0, math.nan]], dtype=DTYPE)}, ValueError, "train_X"),
        ({"train_X": torch.rand(2, 3, 2, dtype=DTYPE)}, ValueError, "train_X"),
        ({"train_Y": torch.rand(9, 1, dtype=DTYPE)}, ValueError, "train_Y"),
        ({"train_Y": torch.rand(10, 1)}, TypeError, "train_Y"),
        ({"train_Yvar": torch.full((10, 1), 0.1, dtype=DTYPE)}, ValueError, "train_Yvar"),
        ({"num_inducing": 0}, ValueError, "num_inducing"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"learn_temperature": 0}, TypeError, "learn_temperature"),
        ({"learn_noise": "no"}, TypeError, "learn_noise"),
        ({"noise": 0.0}, ValueError, "noise"),
        ({"noise": math.nan}, ValueError, "noise"),
        ({"noise": True}, ValueError, "noise"),
        ({"inducing_points": torch.rand(4, 3, dtype=DTYPE)}, ValueError, "inducing_points"),
        ({"likelihood": "noise"}, TypeError, "likelihood"),
        ({"covar_module": 3}, TypeError, "covar_module"),
        ({"mean_module": LinearMean(2).to(DTYPE)}, ValueError, "mean_module"),
        ({"mean_module": ConstantMean(batch_shape=torch.Size([2]))}, ValueError, "mean_module"),
    ],
)
def test_bad_constructor_inputs_raise(kwargs, error, match):
    args = {"train_X": torch.rand(10, 2, dtype=DTYPE), "train_Y": torch.rand(10, 1, dtype=DTYPE)}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        SoftKIGP(**args)


def test_bad_call_inputs_raise_and_leave_model_unchanged():
    X, Y = make_data(30, d=2)
    model = make_model(X, Y, Z=torch.rand(8, 2, dtype=DTYPE))
    model.posterior(X[:2])
    state = _state(model)
    for call, error, match in [
        (lambda: model.posterior(torch.rand(3, 2)), TypeError, "X"),
        (lambda: model.posterior(torch.rand(3, 4, dtype=DTYPE)), ValueError, "X"),
        (lambda: model.posterior(torch.tensor([[math.inf, 0.0]], dtype=DTYPE)), ValueError, "X"),
        (lambda: model.fit(lr=-1.0), ValueError, "lr"),
        (lambda: model.fit(batch_size=0), ValueError, "batch_size"),
        (lambda: model.fit(num_epochs=1.5), ValueError, "num_epochs"),
        (lambda: model.condition_on_observations(X[:2], Y[:3]), ValueError, "Y"),
    ]:
        with pytest.raises(error, match=match):
            call()
        assert _same(state, _state(model))
    # A diverging fit restores the hyperparameters before raising.
    with pytest.raises(ValueError, match="not finite"):
        model.fit(num_epochs=1, batch_size=10, lr=1e30)
    assert _same(state, _state(model))


# ------------------------------------------------------------ the constant prior mean
MEAN = 1.7


def _with_constant(X, Y, Z, constant=MEAN, **kwargs):
    """A SoftKIGP whose ConstantMean is fixed at ``constant`` (else as ``make_model``)."""
    mean = ConstantMean().to(DTYPE)
    mean.constant = torch.tensor(constant, dtype=DTYPE)  # a float would pass through float32
    return make_model(X, Y, Z, mean_module=mean, **kwargs)


def _assert_shifted(with_mean, shifted, Xs, constant=MEAN):
    """``with_mean`` is ``shifted`` (a zero-mean model of ``y - constant``) plus the constant."""
    for noise in (False, True):
        a = with_mean.posterior(Xs, observation_noise=noise)
        b = shifted.posterior(Xs, observation_noise=noise)
        torch.testing.assert_close(a.mean, b.mean + constant, atol=1e-10, rtol=0)
        torch.testing.assert_close(a.covariance_matrix, b.covariance_matrix, atol=1e-10, rtol=0)


def test_constant_mean_is_the_shift_of_the_targets():
    """W 1 = 1: the model with mean c on y is the zero-mean model on y - c, plus c."""
    X, Y = make_data(60, d=3)
    Z = torch.rand(20, 3, dtype=DTYPE)
    with_mean, shifted = _with_constant(X, Y, Z), make_model(X, Y - MEAN, Z)
    Xs = torch.rand(2, 5, 3, dtype=DTYPE)
    _assert_shifted(with_mean, shifted, Xs)
    torch.testing.assert_close(
        with_mean.fit_objective()[0], shifted.fit_objective()[0], atol=1e-10, rtol=0
    )
    index = torch.arange(0, 60, 3)
    losses = [
        model.pseudo_loss(model.train_X_t[index], model.train_y_t[index])
        for model in (with_mean, shifted)
    ]
    torch.testing.assert_close(losses[0], losses[1], atol=1e-10, rtol=0)
    # The dense closed form of y - c, plus c.
    mean, covar, mll = dense_oracle(with_mean, X, Y.squeeze(-1) - MEAN, Xs)
    post = with_mean.posterior(Xs)
    torch.testing.assert_close(post.mean.squeeze(-1), mean + MEAN, atol=1e-8, rtol=0)
    torch.testing.assert_close(post.covariance_matrix, covar, atol=1e-8, rtol=0)
    torch.testing.assert_close(with_mean.fit_objective()[0], mll, atol=1e-8, rtol=1e-10)
    # Conditioning (twice) and batched fantasy targets: residuals y - c throughout.
    X_new, Y_new = make_data(3, d=3)
    a = with_mean.condition_on_observations(X_new, Y_new)
    b = shifted.condition_on_observations(X_new, Y_new - MEAN)
    _assert_shifted(a, b, Xs)
    Y_q = torch.randn(4, 2, 1, dtype=DTYPE)
    X_q = torch.rand(2, 3, dtype=DTYPE)
    _assert_shifted(
        a.condition_on_observations(X_q, Y_q), b.condition_on_observations(X_q, Y_q - MEAN), Xs[0]
    )
    # A new constant rebuilds the cache and replays the conditioning with it.
    with torch.no_grad():
        a.mean_module.constant = torch.tensor(-0.4, dtype=DTYPE)
    c = make_model(X, Y + 0.4, Z).condition_on_observations(X_new, Y_new + 0.4)
    _assert_shifted(a, c, Xs, constant=-0.4)


def test_constant_mean_gradient_matches_finite_differences():
    X, Y = make_data(50, d=2)
    model = _with_constant(X, Y, torch.rand(15, 2, dtype=DTYPE))
    mean = model.mean_module
    index = torch.arange(0, 50, 2)

    def objectives():
        # The exact log marginal likelihood, and the pseudo-loss (exact in the constant).
        probes = torch.Generator().manual_seed(0)
        value = model.fit_objective()[0]
        loss = model.pseudo_loss(model.train_X_t[index], model.train_y_t[index], 3, probes)
        return value, loss

    grads = [torch.autograd.grad(f, mean.raw_constant)[0] for f in objectives()]
    step = 1e-5
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            mean.constant = torch.tensor(MEAN + sign * step, dtype=DTYPE)
            values.append(objectives())
    for k, grad in enumerate(grads):
        fd = (values[0][k] - values[1][k]) / (2 * step)
        torch.testing.assert_close(grad, fd.reshape(grad.shape), rtol=1e-6, atol=1e-9)
    assert grads[0].abs() > 1.0  # a real signal, not a vacuous zero


def test_defaults_are_standardize_and_a_learned_constant_mean():
    """SingleTaskGP's defaults: raw targets like 100 + 10 sin are predicted, not ~0."""
    X = torch.rand(150, 2, dtype=DTYPE)
    f = lambda X: 100 + 10 * torch.sin(6 * X).sum(-1, keepdim=True)  # noqa: E731
    model = SoftKIGP(X, f(X), num_inducing=30)
    assert isinstance(model.outcome_transform, Standardize)
    assert type(model.mean_module) is ConstantMean
    assert "mean_module.raw_constant" in model.state_dict()  # a hyperparameter, not data
    assert not model.is_data_key("mean_module.raw_constant")
    model.fit(num_epochs=5, batch_size=50, seed=0)
    Xs = torch.rand(20, 2, dtype=DTYPE)
    assert (model.posterior(Xs).mean - f(Xs)).abs().max() < 10
    old = SoftKIGP(X, f(X), num_inducing=30, outcome_transform=None, mean_module=ZeroMean())
    assert not hasattr(old, "outcome_transform")


def test_zero_mean_is_the_model_without_a_mean():
    X, Y = make_data(40, d=2)
    Z = torch.rand(12, 2, dtype=DTYPE)
    zero, at_zero = make_model(X, Y, Z), _with_constant(X, Y, Z, constant=0.0)
    assert zero._prior_mean() is None
    assert not any(name.startswith("mean_module") for name, _ in zero.named_parameters())
    Xs = torch.rand(6, 2, dtype=DTYPE)
    a, b = zero.posterior(Xs), at_zero.posterior(Xs)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
    assert torch.equal(zero.fit_objective()[0], at_zero.fit_objective()[0])
    zero.fit(num_epochs=2, batch_size=20, seed=0)
    assert type(zero.mean_module) is ZeroMean and zero._prior_mean() is None


def test_fitting_learns_the_constant_mean():
    """A large offset, no transform: both fits move the constant towards the data."""
    X, Y = make_data(60, d=2)
    Y = Y + 20.0
    kwargs = {"num_inducing": 12, "outcome_transform": None}
    adam = SoftKIGP(X, Y, **kwargs)
    assert adam.mean_module.constant.item() == 0.0
    adam.fit(num_epochs=10, batch_size=30, lr=0.3, seed=0)
    assert adam.mean_module.constant.item() > 2.0  # Adam: at most ~lr per step, 20 steps
    lbfgs = SoftKIGP(X, Y, **kwargs)
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(lbfgs.likelihood, lbfgs),
        optimizer_kwargs={"options": {"maxiter": 40}},
    )
    assert abs(lbfgs.mean_module.constant.item() - Y.mean().item()) < 2.0
    Xs = torch.rand(10, 2, dtype=DTYPE)
    assert (lbfgs.posterior(Xs).mean - target(Xs) - 20.0).abs().max() < 1.0


def test_constant_mean_survives_warm_start_and_checkpoint():
    X, Y = make_data(40, d=2)
    Z = torch.rand(10, 2, dtype=DTYPE)
    model = _with_constant(X, Y, Z)
    # A warm start: hyperparameters (the constant included) into a model of other data.
    other = make_model(*make_data(25, d=2), Z=Z, mean_module=ConstantMean())
    other.load_state_dict(model.state_dict())
    assert other.mean_module.constant.item() == MEAN
    assert other.train_y_t.shape == (25,)
    restored = make_model(*make_data(40, d=2), Z=Z, mean_module=ConstantMean())
    restored.restore(model.checkpoint())
    Xs = torch.rand(5, 2, dtype=DTYPE)
    a, b = model.posterior(Xs), restored.posterior(Xs)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)


# ------------------------------------------------ fixed temperature and fixed noise
def _fit_both_ways(model):
    model.fit(num_epochs=3, batch_size=20, lr=0.05, seed=0, check_noise=False)
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(model.likelihood, model),
        optimizer_kwargs={"options": {"maxiter": 30}},
    )


def test_fixed_temperature_and_noise_stay_fixed_through_both_fits():
    X, Y = make_data(60, d=2, noise=0.2)
    model = SoftKIGP(
        X,
        Y,
        num_inducing=12,
        temperature=0.2,
        learn_temperature=False,
        noise=1e-3,
        learn_noise=False,
    )
    assert not model.learn_temperature and not model.learn_noise
    temperature, noise = model.temperature.clone(), model.noise_variance.clone()
    assert temperature.item() == pytest.approx(0.2) and noise.item() == pytest.approx(1e-3)
    lengthscale = model.covar_module.lengthscale.clone()
    _fit_both_ways(model)
    assert torch.equal(model.temperature, temperature)
    assert torch.equal(model.noise_variance, noise)
    assert not torch.allclose(model.covar_module.lengthscale, lengthscale)  # the rest learns
    # Both are learned, by both fits, when asked to (the noise by default).
    default = SoftKIGP(X, Y, num_inducing=12, temperature=0.2, noise=1e-3, learn_temperature=True)
    assert default.learn_temperature and default.learn_noise
    assert not SoftKIGP(X, Y, num_inducing=12).learn_temperature  # the paper's fixed T
    default.fit(num_epochs=3, batch_size=20, lr=0.05, seed=0)
    after_adam = default.temperature.clone(), default.noise_variance.clone()
    assert after_adam[0] != temperature and after_adam[1] != noise
    fit_gpytorch_mll(ExactMarginalLogLikelihood(default.likelihood, default))
    assert default.temperature != after_adam[0] and default.noise_variance != after_adam[1]


def test_constructor_options_equal_the_manual_way():
    """``learn_*=False`` is exactly the old recipe: requires_grad off, fit(learn_noise=False)."""
    X, Y = make_data(50, d=2, noise=0.2)
    options = {"num_inducing": 10, "temperature": 1.0, "seed": 0}
    new = SoftKIGP(X, Y, **options, learn_temperature=False, noise=1e-3, learn_noise=False)
    likelihood = GaussianLikelihood(noise_constraint=GreaterThan(0.5e-3)).to(X)
    likelihood.noise = 1e-3
    old = SoftKIGP(X, Y, **options, likelihood=likelihood)
    old.raw_temperature.requires_grad_(False)
    new.fit(num_epochs=3, batch_size=20, seed=0, check_noise=False)
    old.fit(num_epochs=3, batch_size=20, seed=0, learn_noise=False, check_noise=False)
    assert _same(_state(new), _state(old))


def test_fixed_noise_admitted_by_the_likelihood():
    X, Y = make_data(20, d=2)
    # A fixed noise below BoTorch's floor (1e-4) gets a default likelihood that admits it.
    tiny = SoftKIGP(X, Y, num_inducing=5, noise=1e-6, learn_noise=False)
    assert tiny.noise_variance.item() == pytest.approx(1e-6)
    given = GaussianLikelihood(noise_constraint=GreaterThan(1e-2)).to(X)
    before = given.noise.clone()
    for kwargs, match in [
        ({"noise": 1e-5}, "noise=1e-05 is not above"),  # learned, under the default floor
        ({"noise": 1e-3, "likelihood": given}, "noise floor 0.01"),
        ({"noise": 1e-3, "likelihood": given, "learn_noise": False}, "noise floor 0.01"),
    ]:
        with pytest.raises(ValueError, match=match):
            SoftKIGP(X, Y, num_inducing=5, **kwargs)
    assert torch.equal(given.noise, before) and given.noise_covar.raw_noise.requires_grad
    fixed = SoftKIGP(X, Y, num_inducing=5, likelihood=given, learn_noise=False)
    assert torch.equal(fixed.noise_variance, before.reshape(()))  # the likelihood's own value
    assert not copy.deepcopy(fixed).learn_noise


def _nll(model, X, Y):
    posterior = model.posterior(X, observation_noise=True)
    mean, variance = posterior.mean, posterior.variance
    return (0.5 * ((Y - mean).square() / variance + (2 * math.pi * variance).log())).mean()


def test_small_fixed_noise_warns_and_its_variances_are_too_small():
    X, Y = make_data(400, d=3, noise=0.3)
    Xt, Yt = make_data(400, d=3, noise=0.3)
    # The SoftKI posterior alone: the exact prior variance hides part of the problem.
    paper = SoftKIGP(
        X, Y, num_inducing=32, noise=1e-3, learn_noise=False, exact_prior_variance=False
    )
    with pytest.warns(
        SmallFixedNoiseWarning, match=r"fixed noise variance 0.001 is \d+x below"
    ) as w:
        paper.fit(num_epochs=5, batch_size=100, lr=0.02, seed=0)
    # The figure it reports: the residuals' mean square in the transformed (standardised)
    # units of the noise, over all rows (n < NOISE_CHECK_ROWS).
    reported = float(re.search(r"mean square ([0-9.e+-]+):", str(w[0].message)).group(1))
    with torch.no_grad():
        std = paper.outcome_transform.stdvs.reshape(())
        expected = ((Y - paper.posterior(X).mean) / std).square().mean().item()
    assert reported == pytest.approx(expected, rel=1e-2) and expected > SMALL_NOISE_RATIO * 1e-3
    learned = SoftKIGP(X, Y, num_inducing=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallFixedNoiseWarning)
        learned.fit(num_epochs=5, batch_size=100, lr=0.02, seed=0)  # learned: no check
    # What the warning says is true: the fixed-noise model's test NLL is far worse.
    assert _nll(paper, Xt, Yt) > 5 and _nll(learned, Xt, Yt) < 1.5
    # A fixed noise near the residuals' mean square does not warn; nor does check_noise=False.
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallFixedNoiseWarning)
        near = SoftKIGP(X, Y, num_inducing=32, noise=0.1, learn_noise=False)
        near.fit(num_epochs=5, batch_size=100, lr=0.02, seed=0)
        SoftKIGP(X, Y, num_inducing=32, noise=1e-3, learn_noise=False).fit(
            num_epochs=1, batch_size=100, seed=0, check_noise=False
        )
    # fit(learn_noise=False) holds the noise fixed too, so it checks.
    manual = SoftKIGP(X, Y, num_inducing=32)
    manual.likelihood.noise = 2e-4
    with pytest.warns(SmallFixedNoiseWarning):
        manual.fit(num_epochs=1, batch_size=100, seed=0, learn_noise=False)
    with pytest.raises(TypeError, match="check_noise"):
        manual.fit(check_noise=None)


def test_calibrate_noise_sets_the_residual_mean_square_and_repairs_the_nll():
    X, Y = make_data(400, d=3, noise=0.3)
    Xt, Yt = make_data(400, d=3, noise=0.3)
    model = SoftKIGP(
        X, Y, num_inducing=32, noise=1e-3, learn_noise=False, exact_prior_variance=False
    )
    model.fit(num_epochs=5, batch_size=100, lr=0.02, seed=0, check_noise=False)
    # Oracle: the residuals at the training inputs, in the standardised units of the noise.
    with torch.no_grad():
        std = model.outcome_transform.stdvs.reshape(())
        expected = ((Y - model.posterior(X).mean) / std).square().mean().item()
        rmse_before = (model.posterior(Xt).mean - Yt).square().mean().sqrt().item()
    nll_before = _nll(model, Xt, Yt).item()
    value = model.calibrate_noise()
    assert value == pytest.approx(expected, rel=1e-6)  # (through the softplus constraint)
    assert model.noise_variance.item() == value
    assert not model.learn_noise  # still fixed
    with torch.no_grad():
        rmse_after = (model.posterior(Xt).mean - Yt).square().mean().sqrt().item()
    assert nll_before > 5 and _nll(model, Xt, Yt).item() < 1.0
    assert abs(rmse_after / rmse_before - 1) < 0.1
    # A floor above the residuals: refused, the model unchanged.
    floor = GaussianLikelihood(noise_constraint=GreaterThan(5.0)).to(X)
    floor.noise = 6.0
    high = SoftKIGP(X, Y, num_inducing=32, likelihood=floor, learn_noise=False)
    state = _state(high)
    with pytest.raises(ValueError, match="noise floor 5"):
        high.calibrate_noise()
    assert _same(state, _state(high))


def _fitted_steps(model, **fit_kwargs) -> list[int]:
    """The L-BFGS-B steps BoTorch's fit_gpytorch_mll took on ``model``."""
    steps = []
    optimizer_kwargs = fit_kwargs.pop("optimizer_kwargs", {})
    optimizer_kwargs["callback"] = lambda parameters, result: steps.append(result.step)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    fit_gpytorch_mll(mll, optimizer_kwargs=optimizer_kwargs, **fit_kwargs)
    assert not mll.training
    return steps


def test_fit_gpytorch_mll_caps_lbfgsb_unless_told(monkeypatch):
    """Few points (m = n learnable points): unbounded, L-BFGS-B runs for thousands of
    iterations while the predictions worsen; BoTorch's fit stops at the cap instead, and
    a maxiter the caller passes, or another optimizer, is run as given."""
    from streamgp.models import softki

    torch.manual_seed(0)
    X, Y = make_data(12)
    monkeypatch.setattr(softki, "SOFTKI_FIT_MAXITER", 40)
    steps = _fitted_steps(SoftKIGP(X, Y))
    assert 0 < max(steps) <= 40
    uncapped = {"options": {"maxiter": 100}}
    assert max(_fitted_steps(SoftKIGP(X, Y), optimizer_kwargs=uncapped)) > 40
    # through a ModelListGP too (BoTorch fits each member through its custom_fit)
    from botorch.models import ModelListGP
    from gpytorch.mlls import SumMarginalLogLikelihood

    pair = ModelListGP(SoftKIGP(X, Y), SoftKIGP(X, -Y))
    steps = []
    fit_gpytorch_mll(
        SumMarginalLogLikelihood(pair.likelihood, pair),
        optimizer_kwargs={"callback": lambda parameters, result: steps.append(result.step)},
    )
    assert 0 < max(steps) <= 40
    # another optimizer: its own arguments, nothing added
    from botorch.optim.fit import fit_gpytorch_mll_torch

    model = SoftKIGP(X, Y)
    before = model.covar_module.lengthscale.clone()
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(model.likelihood, model),
        optimizer=fit_gpytorch_mll_torch,
        optimizer_kwargs={"step_limit": 3},
    )
    assert not torch.equal(model.covar_module.lengthscale, before)


# ------------------------------------------------ calibration and the exact prior variance
def test_exact_prior_variance_adds_the_interpolants_missing_variance():
    """The covariance is the SoftKI posterior's plus diag(k(x, x) - w^T K_zz w) (K_zz with
    the factorisation's jitter), for conditioned models too; the setting switches it off."""
    from streamgp.settings import exact_prior_variance

    X, Y = make_data(40, d=2)
    Z = torch.rand(10, 2, dtype=DTYPE)
    model = make_model(X, Y, Z, exact_prior_variance=True)
    Xs = torch.rand(2, 6, 2, dtype=DTYPE)
    _, covar, _ = dense_oracle(model, X, Y.squeeze(-1), Xs)
    with torch.no_grad():
        K = model.covar_module(Z).to_dense()
        K = K + cholesky_with_jitter(K)[1] * torch.eye(len(K), dtype=DTYPE)
        W = model.weights(Xs).values
        missing = (model.covar_module(Xs, diag=True) - ((W @ K) * W).sum(-1)).clamp_min(0)
    assert missing.min() > 1e-3  # between the points the interpolant's variance falls short
    posterior = model.posterior(Xs)
    torch.testing.assert_close(
        posterior.covariance_matrix, covar + torch.diag_embed(missing), atol=1e-8, rtol=0
    )
    with exact_prior_variance(False):
        torch.testing.assert_close(model.posterior(Xs).covariance_matrix, covar, atol=1e-8, rtol=0)
    # A conditioned model adds the same diagonal to its own (smaller) posterior covariance.
    X_new, Y_new = make_data(3, d=2)
    conditioned = model.condition_on_observations(X_new, Y_new)
    with exact_prior_variance(False):
        without = conditioned.posterior(Xs).covariance_matrix
    torch.testing.assert_close(
        conditioned.posterior(Xs).covariance_matrix,
        without + torch.diag_embed(missing),
        atol=1e-8,
        rtol=0,
    )
    with pytest.raises(TypeError, match="exact_prior_variance"):
        SoftKIGP(X, Y, exact_prior_variance=1)


def _calibration(model, Xt, Yt):
    with torch.no_grad():
        posterior = model.posterior(Xt)
        z2 = (Yt - posterior.mean).square() / posterior.variance
    return z2.mean().item(), (z2 < 1.96**2).double().mean().item()


def test_default_fit_gpytorch_mll_is_calibrated_like_single_task_gp():
    """BoTorch's defaults (learned noise, m = min(512, n) learned points) gave test
    variances 100-10,000x too small: here mean z^2 2,666 and 9% of the test points in
    the 95% intervals, now 1.65 and 92% (SingleTaskGP: 0.93 and 96%)."""
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(40, 3, dtype=DTYPE, generator=generator)
    Xt = torch.rand(200, 3, dtype=DTYPE, generator=generator)
    f = lambda X: 10 * torch.sin(4 * X).sum(-1, keepdim=True)  # noqa: E731
    model = SoftKIGP(X, f(X))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    mean_z2, coverage = _calibration(model, Xt, f(Xt))
    assert mean_z2 < 5 and coverage > 0.8


# ------------------------------------------------ warm start (BoTorch's closed loop)
@pytest.mark.parametrize("change", [3, -2])
def test_warm_start_adopts_the_learned_points_of_another_size(change):
    """Rebuilt on n + 3 (or n - 2) points, the default m = min(512, n) differs from the
    fitted model's; loading its state takes its points and hyperparameters, as a model
    built with those points and loaded without resizing does, and no cache is stale."""
    torch.manual_seed(0)
    X, Y = make_data(15, d=2)
    old = SoftKIGP(X[:10], Y[:10])
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(old.likelihood, old),
        optimizer_kwargs={"options": {"maxiter": 20}},
    )
    X_b, Y_b = X[: 10 + change], Y[: 10 + change]
    Xs = torch.rand(6, 2, dtype=DTYPE)
    new = SoftKIGP(X_b, Y_b)
    before = new.posterior(Xs).mean  # builds the caches of the 10 + change points
    result = new.load_state_dict(old.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []  # torch's result
    assert new.num_inducing == 10 and torch.equal(new.inducing_points, old.inducing_points)
    points = old.inducing_points.detach().clone()
    direct = SoftKIGP(X_b, Y_b, inducing_points=points)
    direct.load_state_dict(old.state_dict())
    a, b = new.posterior(Xs), direct.posterior(Xs)
    assert not torch.allclose(a.mean, before)
    torch.testing.assert_close(a.mean, b.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(a.variance, b.variance, atol=1e-12, rtol=0)
    # The data and transforms are the new model's own.
    assert torch.equal(new.train_y_t, direct.train_y_t) and len(new.train_X_t) == 10 + change
    # It keeps learning: the points are parameters of the new size.
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(new.likelihood, new),
        optimizer_kwargs={"options": {"maxiter": 5}},
    )
    assert new.inducing_points.shape == (10, 2)


def test_warm_start_keeps_strict_semantics():
    X, Y = make_data(12, d=2)
    state = SoftKIGP(X[:10], Y[:10]).state_dict()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        SoftKIGP(X, Y).load_state_dict({**state, "extra": torch.zeros(1)})
    missing = {k: v for k, v in state.items() if k != "covar_module.raw_lengthscale"}
    with pytest.raises(RuntimeError, match="Missing key"):
        SoftKIGP(X, Y).load_state_dict(missing)
    model = SoftKIGP(X, Y)
    result = model.load_state_dict({**state, "extra": torch.zeros(1)}, strict=False)
    assert result.unexpected_keys == ["extra"] and model.num_inducing == 10
    # Points of another input dimension are not resized: torch reports the mismatch.
    with pytest.raises(RuntimeError, match="size mismatch for inducing_points"):
        SoftKIGP(X, Y).load_state_dict({**state, "inducing_points": torch.zeros(10, 3)})
