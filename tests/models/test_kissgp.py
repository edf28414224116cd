"""KissGP (KISS-GP with LOVE) against dense SKI and exact-GP oracles, in float64."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import gpytorch
import pytest
import torch
from botorch.acquisition import (
    qLogExpectedImprovement,
    qNegIntegratedPosteriorVariance,
    qUpperConfidenceBound,
)
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.means import ConstantMean, LinearMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from linear_operator.operators import DenseLinearOperator, RootLinearOperator
from oracles import DenseSKIModel

from streamgp import KissGP
from streamgp.linalg import grid_kernel_matrix

DTYPE = torch.float64
GRID = {1: 40, 2: 14, 3: 7}
LENGTHSCALES = [0.3, 0.5, 0.7]


def target(X):
    return torch.sin(5 * X).sum(-1, keepdim=True)


def make_model(d, n=30, fixed_noise=False, grid=None, kernel=None, **kwargs):
    """A KissGP with set hyperparameters; by default the zero-mean, untransformed model."""
    kwargs.setdefault("outcome_transform", None)
    kwargs.setdefault("mean_module", ZeroMean())
    X = torch.rand(n, d, dtype=DTYPE)
    Y = target(X) + 0.1 * torch.randn(n, 1, dtype=DTYPE)
    Yvar = 0.01 + 0.05 * torch.rand(n, 1, dtype=DTYPE) if fixed_noise else None
    base = kernel if kernel is not None else ScaleKernel(RBFKernel(ard_num_dims=d))
    model = KissGP(X, Y, Yvar, grid_size=grid or GRID[d], covar_module=base, **kwargs)
    inner = base.base_kernel if isinstance(base, ScaleKernel) else base
    inner.lengthscale = torch.tensor(LENGTHSCALES[:d], dtype=DTYPE)
    if isinstance(base, ScaleKernel):
        base.outputscale = 1.3
    if not fixed_noise:
        model.likelihood.noise = 0.04
    return model


def oracle(model, X=None, y=None, noise=None):
    """Dense SKI posterior with K_UU = the base kernel on all grid points."""
    view = SimpleNamespace(
        covar_module=model.base_kernel,
        interpolation=model.interpolation,
        likelihood=model.likelihood,
        noise_variance=model.noise_variance,
    )
    X = model.train_inputs[0] if X is None else X
    y = model.train_targets if y is None else y
    if noise is None and model.fixed_noise:
        noise = model.likelihood.noise.detach()
    mean = None
    if isinstance(model.mean_module, ConstantMean):
        mean = model.mean_module.constant.detach().reshape(())
    return DenseSKIModel(view, X, y, noise, mean=mean)


def prior_variance_bound(model, Xs, tol):
    """tol * (w^T K_UU w + |w|^2 tr(K_UU)): the certificate of the LOVE root (module docs)."""
    W = model.interpolation.weights(Xs)
    K = grid_kernel_matrix(model.base_kernel, model.interpolation.grid).detach()
    Wd = W.to_dense()
    prior = ((Wd @ K) * Wd).sum(-1)
    return tol * (prior + W.values.square().sum(-1) * K.trace())


# ---------------------------------------------------------------- the kernel
def test_ski_kernel_applies_ard_lengthscales_to_the_right_dimensions():
    """gpytorch 1.15.2's GridInterpolationKernel swaps them (error 0.59); ours must not."""
    X = torch.rand(40, 2, dtype=DTYPE)
    model = make_model(2, grid=60, kernel=RBFKernel(ard_num_dims=2))
    model.base_kernel.lengthscale = torch.tensor([0.2, 0.5], dtype=DTYPE)
    with torch.no_grad():
        ski = model.covar_module(X).to_dense()
        exact = model.base_kernel(X).to_dense()
        swapped = RBFKernel(ard_num_dims=2).to(DTYPE)
        swapped.lengthscale = torch.tensor([0.5, 0.2], dtype=DTYPE)
        wrong = swapped(X).to_dense()
    assert (ski - exact).abs().max() < 2e-4
    assert (wrong - exact).abs().max() > 0.3  # the test can tell the two orders apart


def test_predictive_mean_matches_exact_gp_on_a_fine_grid_with_ard():
    torch.manual_seed(3)
    X = torch.rand(300, 2, dtype=DTYPE)
    Y = torch.sin(12 * X[:, :1]) + torch.cos(3 * X[:, 1:]) + 0.05 * torch.randn(300, 1, dtype=DTYPE)
    lengthscale = torch.tensor([0.1, 0.6], dtype=DTYPE)
    kiss = KissGP(
        X,
        Y,
        grid_size=50,
        covar_module=RBFKernel(ard_num_dims=2),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    kiss.base_kernel.lengthscale = lengthscale
    kiss.likelihood.noise = 0.01
    exact = SingleTaskGP(X, Y, covar_module=RBFKernel(ard_num_dims=2), outcome_transform=None)
    exact.mean_module.constant.data.zero_()
    exact.covar_module.lengthscale = lengthscale
    exact.likelihood.noise = 0.01
    swapped = SingleTaskGP(X, Y, covar_module=RBFKernel(ard_num_dims=2), outcome_transform=None)
    swapped.mean_module.constant.data.zero_()
    swapped.covar_module.lengthscale = lengthscale.flip(0)
    swapped.likelihood.noise = 0.01
    g = torch.linspace(0.02, 0.98, 30, dtype=DTYPE)
    Xs = torch.cartesian_prod(g, g)
    with torch.no_grad():
        mean = kiss.posterior(Xs).mean
        var = kiss.posterior(Xs.unsqueeze(-2)).variance.flatten()
        ref = exact.posterior(Xs)
        ref_var = exact.posterior(Xs.unsqueeze(-2)).variance.flatten()
        wrong = swapped.posterior(Xs).mean
    assert (mean - ref.mean).abs().max() < 5e-3
    assert (var - ref_var).abs().max() < 5e-3
    assert (wrong - ref.mean).abs().max() > 0.1  # reversed ARD would be caught


# ------------------------------------------------------- exact predictions
@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_posterior_matches_dense_ski_closed_form(d, fixed_noise):
    model = make_model(d, fixed_noise=fixed_noise)
    Xs = torch.rand(2, 12, d, dtype=DTYPE)
    post = model.posterior(Xs)
    mean, covar = oracle(model).latent(Xs)
    assert isinstance(post.distribution.lazy_covariance_matrix, DenseLinearOperator)
    assert post.mean.shape == (2, 12, 1)
    assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-8
    assert (post.covariance_matrix - covar).abs().max() < 1e-8
    noisy = model.posterior(Xs, observation_noise=True)
    expected = covar.diagonal(dim1=-2, dim2=-1) + model.noise_variance
    assert (noisy.variance.squeeze(-1) - expected).abs().max() < 1e-8


@pytest.mark.usefixtures("ski_prior_variance")
def test_marginal_likelihood_is_the_dense_ski_one_and_trains():
    model = make_model(2, n=40, kernel=ScaleKernel(RBFKernel(ard_num_dims=2)))
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    with gpytorch.settings.max_cholesky_size(10_000):
        value = mll(model(*model.train_inputs), model.train_targets)
    prior_terms = sum(
        prior.log_prob(closure(module)).sum()
        for _, module, prior, closure, _ in model.named_priors()
    )
    expected = oracle(model).log_marginal_likelihood() / 40 + prior_terms / 40
    assert abs(value.item() - expected.item()) < 1e-8
    value.backward()
    lengthscale = model.base_kernel.base_kernel.raw_lengthscale
    assert torch.isfinite(lengthscale.grad).all() and lengthscale.grad.abs().sum() > 0
    # A hyperparameter step invalidates the cached predictions.
    model.eval()
    before = model.posterior(torch.rand(5, 2, dtype=DTYPE)).variance
    with torch.no_grad():
        model.base_kernel.base_kernel.lengthscale = torch.tensor([0.2, 0.4], dtype=DTYPE)
    Xs = torch.rand(5, 2, dtype=DTYPE)
    _, covar = oracle(model).latent(Xs)
    after = model.posterior(Xs).variance.squeeze(-1)
    assert (after - covar.diagonal()).abs().max() < 1e-8
    assert before.shape == (5, 1)


# ------------------------------------------------------------------- LOVE
@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_love_variances_are_within_the_stated_tolerance(d, fixed_noise):
    model = make_model(d, fixed_noise=fixed_noise)
    Xs = torch.rand(2, 25, d, dtype=DTYPE)
    mean, covar = oracle(model).latent(Xs)
    exact_var = covar.diagonal(dim1=-2, dim2=-1)
    model.love_tolerance = 1e-6
    bound = prior_variance_bound(model, Xs, model.love_tolerance)
    for switch in (gpytorch.settings.fast_pred_var, gpytorch.settings.fast_pred_samples):
        with switch():
            post = model.posterior(Xs)
        assert isinstance(post.distribution.lazy_covariance_matrix, RootLinearOperator)
        love_var = post.variance.squeeze(-1)
        assert (love_var >= 0).all()
        assert ((love_var - exact_var).abs() <= bound + 1e-12).all()
        assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-7
    assert model.love_grid_posterior() is None  # outside the switches: exact path again
    k = model._posterior_cache[("love", 1e-6)].root.shape[-1]
    assert k < model.interpolation.num_grid
    # A looser tolerance gives a lower rank, and larger (but still bounded) errors.
    model.love_tolerance = 1e-2
    with gpytorch.settings.fast_pred_var():
        coarse = model.posterior(Xs).variance.squeeze(-1)
    assert model._posterior_cache[("love", 1e-2)].root.shape[-1] < k
    assert ((coarse - exact_var).abs() <= prior_variance_bound(model, Xs, 1e-2) + 1e-12).all()


@pytest.mark.usefixtures("ski_prior_variance")
def test_love_with_a_non_separable_kernel_uses_the_dense_root():
    model = make_model(2, kernel=MaternKernel(nu=2.5, ard_num_dims=2))
    model.love_tolerance = 1e-6
    Xs = torch.rand(30, 2, dtype=DTYPE)
    _, covar = oracle(model).latent(Xs)
    exact_var = model.posterior(Xs).variance.squeeze(-1)  # the dense root LOVE compresses
    assert (exact_var - covar.diagonal()).abs().max() < 1e-8
    with gpytorch.settings.fast_pred_var():
        love_var = model.posterior(Xs).variance.squeeze(-1)
    R = model.grid_posterior().root
    w_sq = model.interpolation.weights(Xs).values.square().sum(-1)
    # lanczos_root: 0 <= exact - LOVE <= |w|^2 tol tr(Sigma_U).
    assert (exact_var - love_var >= -1e-12).all()
    assert (exact_var - love_var <= w_sq * 1e-6 * R.square().sum() + 1e-12).all()


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("kernel", ["rbf", "matern"])
def test_full_rank_love_reproduces_dense(kernel):
    base = (
        ScaleKernel(RBFKernel(ard_num_dims=2))
        if kernel == "rbf"
        else MaternKernel(nu=1.5, ard_num_dims=2)
    )
    model = make_model(2, fixed_noise=True, kernel=base)
    model.love_tolerance = 0.0
    Xs = torch.rand(20, 2, dtype=DTYPE)
    with gpytorch.settings.fast_pred_var():
        post = model.posterior(Xs)
    mean, covar = oracle(model).latent(Xs)
    assert post.distribution.lazy_covariance_matrix.root.shape[-1] == model.interpolation.num_grid
    assert (post.covariance_matrix - covar).abs().max() < 1e-9 * covar.abs().max()
    assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-9


def test_variances_never_negative_with_extreme_heteroskedastic_noise():
    X = torch.rand(80, 2, dtype=DTYPE)
    Yvar = 10.0 ** torch.empty(80, 1, dtype=DTYPE).uniform_(-8, 1)
    model = KissGP(X, target(X), Yvar, grid_size=14)
    for tol in (1e-1, 1e-4, 1e-8):
        model.love_tolerance = tol
        with gpytorch.settings.fast_pred_var():
            var = model.posterior(torch.rand(500, 2, dtype=DTYPE)).variance
        assert (var >= 0).all()


@pytest.mark.usefixtures("ski_prior_variance")
def test_fast_pred_samples_have_the_exact_covariance_with_standardize():
    model = make_model(2, outcome_transform=Standardize(1))
    Xs = torch.rand(6, 2, dtype=DTYPE)
    exact = model.posterior(Xs)
    with gpytorch.settings.fast_pred_samples():
        post = model.posterior(Xs)
        k = post.distribution.lazy_covariance_matrix.root.shape[-1]
        assert post.base_sample_shape[-1] == k
        samples = post.rsample(torch.Size([40_000])).squeeze(-1)
    centered = samples - samples.mean(0)
    empirical = centered.T @ centered / len(samples)
    reference = exact.covariance_matrix
    assert (empirical - reference).abs().max() < 0.05 * reference.abs().max()
    assert torch.allclose(post.mean, exact.mean, atol=1e-8)
    assert torch.allclose(post.variance, exact.variance, rtol=1e-4)


@pytest.fixture
def structured_threshold(monkeypatch):
    """Make 7^3 = 343-point grids take the large-grid (always LOVE) path."""
    monkeypatch.setattr(KissGP, "MAX_DENSE_GRID", 300)


@pytest.mark.usefixtures("ski_prior_variance")
def test_large_grid_path_matches_dense_including_conditioning(structured_threshold):
    model = make_model(3)
    assert model.structured
    model.love_tolerance = 1e-10
    Xs = torch.rand(15, 3, dtype=DTYPE)
    post = model.posterior(Xs)  # LOVE by construction
    ref = oracle(model)
    mean, covar = ref.latent(Xs)
    assert isinstance(post.distribution.lazy_covariance_matrix, RootLinearOperator)
    assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-8
    assert (post.covariance_matrix - covar).abs().max() < 1e-8
    Xc, Yc = torch.rand(2, 2, 3, dtype=DTYPE), torch.randn(2, 2, 1, dtype=DTYPE)
    cond = model.condition_on_observations(Xc, Yc).posterior(Xs)
    mean_c, covar_c = ref.condition_on_observations(Xc, Yc).latent(Xs)
    assert (cond.mean.squeeze(-1) - mean_c).abs().max() < 1e-8
    assert (cond.covariance_matrix - covar_c).abs().max() < 1e-8


# ------------------------------------------------------- conditioning/updates
def refit(model, X_all_t, y_all_t, noise_all=None):
    """A KissGP built from all (transformed) data with the same hyperparameters."""
    new = KissGP(
        X_all_t,
        y_all_t.unsqueeze(-1),
        None if noise_all is None else noise_all.unsqueeze(-1),
        grid_size=model.interpolation.grid_size,
        covar_module=ScaleKernel(RBFKernel(ard_num_dims=X_all_t.shape[-1])),
        outcome_transform=None,
        mean_module=copy.deepcopy(model.mean_module),
    )
    new.base_kernel.load_state_dict(model.base_kernel.state_dict())
    if not model.fixed_noise:
        new.likelihood.noise = model.likelihood.noise.detach()
    return new


def constant_mean(c):
    mean = ConstantMean()
    mean.constant = c
    return mean


@pytest.mark.parametrize("mean", [None, 0.7])
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_fantasize_matches_rebuilding_from_all_data(fixed_noise, mean):
    if mean is None:
        model = make_model(2, fixed_noise=fixed_noise)
    else:
        model = make_model(2, fixed_noise=fixed_noise, mean_module=constant_mean(mean))
    Xf = torch.rand(3, 2, 2, dtype=DTYPE)  # 3 candidate batches of q = 2
    sampler = SobolQMCNormalSampler(torch.Size([4]))
    fantasy = model.fantasize(Xf, sampler=sampler)
    assert fantasy.batch_shape == torch.Size([4, 3])
    Xs = torch.rand(5, 2, dtype=DTYPE)
    post = fantasy.posterior(Xs)
    assert post.mean.shape == (4, 3, 5, 1)
    # The fantasized targets, recovered from the conditioning log.
    _, y_f, noise_f = fantasy._conditioning_log[-1]
    X0, y0 = model.train_inputs[0], model.train_targets
    for s, b in [(0, 0), (3, 2), (1, 1)]:
        noise_all = None
        if fixed_noise:
            noise_all = torch.cat([model.likelihood.noise.detach(), noise_f[b].expand(2)])
        ref = refit(model, torch.cat([X0, Xf[b]]), torch.cat([y0, y_f[s, b]]), noise_all)
        ref_post = ref.posterior(Xs)
        assert (post.mean[s, b] - ref_post.mean).abs().max() < 1e-8
        assert (post.covariance_matrix[s, b] - ref_post.covariance_matrix).abs().max() < 1e-8


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("mean", [None, -0.4])
def test_condition_then_observe_matches_rebuild_and_leaves_parent_alone(mean):
    if mean is None:
        model = make_model(2, outcome_transform=Standardize(1))
    else:
        model = make_model(2, outcome_transform=Standardize(1), mean_module=constant_mean(mean))
    Xs = torch.rand(6, 2, dtype=DTYPE)
    before = model.posterior(Xs)
    Xc = torch.rand(3, 2, dtype=DTYPE)
    cond = model.condition_on_observations(Xc, target(Xc))
    after_parent = model.posterior(Xs)
    assert torch.equal(before.mean, after_parent.mean)
    Xn = torch.rand(2, 2, dtype=DTYPE)
    cond.observe(Xn, target(Xn))
    assert cond.num_train == 35 and cond.batch_shape == torch.Size([])
    X_all = torch.cat([model.train_inputs[0], Xc, Xn])
    y_all = model.outcome_transform(target(torch.cat([Xc, Xn])))[0].squeeze(-1)
    y_all = torch.cat([model.train_targets, y_all])
    ref = refit(model, X_all, y_all)
    mean_ref, covar_ref = oracle(ref).latent(Xs)
    got = cond.posterior(Xs)
    scale = model.outcome_transform.stdvs.squeeze()
    assert (
        got.mean.squeeze(-1) - (model.outcome_transform.means.squeeze() + scale * mean_ref)
    ).abs().max() < 1e-8
    assert (got.covariance_matrix - scale**2 * covar_ref).abs().max() < 1e-8
    # observe on the root model rebuilds the caches from all data.
    model.observe(Xn, target(Xn))
    assert model.num_train == 32
    assert not torch.equal(model.posterior(Xs).mean, before.mean)


def test_invalid_input_raises_and_leaves_the_model_unchanged():
    model = make_model(2, fixed_noise=True)
    Xs = torch.rand(4, 2, dtype=DTYPE)
    before = model.posterior(Xs).mean.clone()
    n = model.num_train
    bad = torch.rand(2, 2, dtype=DTYPE)
    with pytest.raises(ValueError, match="Yvar is required"):
        model.observe(bad, target(bad))
    with pytest.raises(ValueError, match="X contains NaN"):  # (beyond the grid: a re-grid)
        model.condition_on_observations(bad + float("nan"), target(bad))
    with pytest.raises(ValueError, match="Yvar must be strictly positive"):
        model.observe(bad, target(bad), -torch.ones(2, 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="Y contains NaN"):
        model.observe(
            bad, torch.full((2, 1), float("nan"), dtype=DTYPE), torch.ones(2, 1, dtype=DTYPE)
        )
    with pytest.raises(TypeError, match="X has dtype"):
        model.posterior(Xs.float())
    fantasy = model.fantasize(bad.unsqueeze(0), sampler=SobolQMCNormalSampler(torch.Size([2])))
    with pytest.raises(RuntimeError, match="batched"):
        fantasy.observe(bad, target(bad), torch.ones(2, 1, dtype=DTYPE))
    assert model.num_train == n and torch.equal(model.posterior(Xs).mean, before)
    with pytest.raises(ValueError, match="train_X contains NaN"):
        KissGP(torch.full((3, 2), float("nan"), dtype=DTYPE), torch.zeros(3, 1, dtype=DTYPE))
    with pytest.raises(TypeError, match="covar_module must be the base kernel"):
        KissGP(
            Xs,
            target(Xs),
            covar_module=gpytorch.kernels.GridInterpolationKernel(RBFKernel(), 10, 2),
        )


# ------------------------------------------------------------ prior mean, defaults
def test_defaults_are_standardize_and_a_learned_constant_mean():
    X = 0.4 * torch.rand(30, 1, dtype=DTYPE)
    Y = 100 + 10 * torch.sin(6 * X)
    far = torch.full((1, 1), 0.95, dtype=DTYPE)  # inside the grid, far from the data
    model = KissGP(X, Y, grid_size=40)
    assert isinstance(model.outcome_transform, Standardize)
    assert type(model.mean_module) is ConstantMean
    assert model.mean_module.raw_constant.requires_grad
    model.base_kernel.lengthscale = 0.05
    with torch.no_grad():
        assert (model.posterior(X).mean - Y).abs().max() < 0.5
        assert abs(model.posterior(far).mean.item() - Y.mean().item()) < 1e-6
    # ZeroMean without a transform is the old model: no mean parameter, zero far away.
    zero = KissGP(X, Y, grid_size=40, outcome_transform=None, mean_module=ZeroMean())
    assert not hasattr(zero, "outcome_transform")
    assert not any("mean_module" in name for name, _ in zero.named_parameters())
    zero.base_kernel.lengthscale = 0.05
    with torch.no_grad():
        assert abs(zero.posterior(far).mean.item()) < 1e-6


def test_defaults_match_single_task_gp_defaults_on_a_fine_grid():
    torch.manual_seed(5)
    X = torch.rand(100, 1, dtype=DTYPE)
    Y = 100 + 10 * torch.sin(6 * X) + 0.5 * torch.randn(100, 1, dtype=DTYPE)
    kiss = KissGP(X, Y, grid_size=200, covar_module=RBFKernel())
    exact = SingleTaskGP(X, Y, covar_module=RBFKernel())  # Standardize, ConstantMean
    for model, kernel in ((kiss, kiss.base_kernel), (exact, exact.covar_module)):
        kernel.lengthscale = 0.2
        model.likelihood.noise = 0.01
        model.mean_module.constant = 0.3
    assert torch.equal(kiss.outcome_transform.means, exact.outcome_transform.means)
    Xs = torch.linspace(0, 1, 50, dtype=DTYPE).unsqueeze(-1)
    with torch.no_grad():
        got, ref = kiss.posterior(Xs.unsqueeze(-2)), exact.posterior(Xs.unsqueeze(-2))
    scale = Y.std()
    # Interpolation error ~1e-6; a zero constant would be off by 1e-2 (in units of scale).
    assert (got.mean - ref.mean).abs().max() < 1e-4 * scale
    assert (got.variance - ref.variance).abs().max() < 1e-5 * scale**2


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_constant_mean_is_the_zero_mean_model_of_the_residuals(fixed_noise):
    """A constant c: the ZeroMean KissGP on y - c, plus c (exact, LOVE, conditioned, MLL)."""
    c = 0.7
    model = make_model(2, fixed_noise=fixed_noise, mean_module=constant_mean(c))
    X, y = model.train_inputs[0], model.train_targets
    zero = KissGP(
        X,
        (y - c).unsqueeze(-1),
        model.likelihood.noise.detach().unsqueeze(-1) if fixed_noise else None,
        grid_size=GRID[2],
        covar_module=copy.deepcopy(model.base_kernel),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    if not fixed_noise:
        zero.likelihood.noise = model.likelihood.noise.detach()
    Xs = torch.rand(2, 12, 2, dtype=DTYPE)

    def check(got, ref, oracle_latent=None):
        assert (got.mean - (ref.mean + c)).abs().max() < 1e-8
        assert (got.covariance_matrix - ref.covariance_matrix).abs().max() < 1e-8
        if oracle_latent is not None:
            mean, covar = oracle_latent
            assert (got.mean.squeeze(-1) - mean).abs().max() < 1e-8
            assert (got.covariance_matrix - covar).abs().max() < 1e-8

    check(model.posterior(Xs), zero.posterior(Xs), oracle(model).latent(Xs))
    # LOVE (the structured root of the residuals' grid posterior).
    model.love_tolerance = zero.love_tolerance = 1e-6
    with gpytorch.settings.fast_pred_var():
        got, ref = model.posterior(Xs), zero.posterior(Xs)
    assert isinstance(got.distribution.lazy_covariance_matrix, RootLinearOperator)
    check(got, ref)
    # Conditioning (fantasies): the new targets are centred too.
    Xc = torch.rand(2, 3, 2, dtype=DTYPE)
    Yc = torch.randn(4, 2, 3, 1, dtype=DTYPE)
    cond = model.condition_on_observations(Xc, Yc)
    check(
        cond.posterior(Xs),
        zero.condition_on_observations(Xc, Yc - c).posterior(Xs),
        oracle(model).condition_on_observations(Xc, Yc).latent(Xs),
    )
    # A new constant (a fit step) rebuilds the caches and replays the conditioning.
    with torch.no_grad():
        model.mean_module.constant = -0.2
    expected = oracle(model).condition_on_observations(Xc, Yc).latent(Xs)
    got = cond.posterior(Xs)
    assert (got.mean.squeeze(-1) - expected[0]).abs().max() < 1e-8
    assert (got.covariance_matrix - expected[1]).abs().max() < 1e-8
    with torch.no_grad():
        model.mean_module.constant = c
    # The marginal likelihood (gpytorch's, through the mean module), and its gradient in c.
    values = []
    for gp, targets in ((model, y), (zero, y - c)):
        gp.train()
        mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
        with gpytorch.settings.max_cholesky_size(10_000):
            values.append(mll(gp(*gp.train_inputs), targets))
    assert abs(values[0].item() - values[1].item()) < 1e-8
    values[0].backward()
    assert model.mean_module.raw_constant.grad.abs() > 0


@pytest.mark.usefixtures("ski_prior_variance")
def test_constant_mean_on_the_large_grid_path(structured_threshold):
    model = make_model(3, mean_module=constant_mean(0.5))
    assert model.structured
    model.love_tolerance = 1e-10
    Xs = torch.rand(15, 3, dtype=DTYPE)
    ref = oracle(model)
    mean, covar = ref.latent(Xs)
    post = model.posterior(Xs)
    assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-8
    assert (post.covariance_matrix - covar).abs().max() < 1e-8
    Xc, Yc = torch.rand(2, 2, 3, dtype=DTYPE), torch.randn(2, 2, 1, dtype=DTYPE)
    cond = model.condition_on_observations(Xc, Yc).posterior(Xs)
    mean_c, covar_c = ref.condition_on_observations(Xc, Yc).latent(Xs)
    assert (cond.mean.squeeze(-1) - mean_c).abs().max() < 1e-8
    assert (cond.covariance_matrix - covar_c).abs().max() < 1e-8


def test_constant_is_learned_by_fit_gpytorch_mll():
    torch.manual_seed(0)
    X = torch.rand(30, 1, dtype=DTYPE)
    Y = 5 + torch.sin(6 * X) + 0.05 * torch.randn(30, 1, dtype=DTYPE)
    model = KissGP(X, Y, grid_size=30, outcome_transform=None)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    assert not model.training
    assert abs(model.mean_module.constant.item() - 5.0) < 0.5
    assert (model.posterior(X).mean - Y).abs().max() < 0.3


def test_mean_module_must_be_a_constant_or_zero():
    X = torch.rand(10, 2, dtype=DTYPE)
    for bad in (LinearMean(2), ConstantMean(batch_shape=torch.Size([2]))):
        with pytest.raises(ValueError, match="mean_module must be"):
            KissGP(X, target(X), mean_module=bad)


# ------------------------------------------------------------- acquisitions
def test_botorch_acquisitions_optimize_under_the_switches():
    bounds = torch.tensor([[-1.0, 0.0], [1.0, 2.0]], dtype=DTYPE)
    X = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(40, 2, dtype=DTYPE)
    Y = target(X)
    model = KissGP(
        X,
        Y,
        grid_size=14,
        input_transform=Normalize(2, bounds=bounds),
        outcome_transform=Standardize(1),
    )
    sampler = SobolQMCNormalSampler(torch.Size([16]))
    mc_points = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(16, 2, dtype=DTYPE)
    acqfs = [
        qUpperConfidenceBound(model, beta=2.0, sampler=sampler),
        qLogExpectedImprovement(model, best_f=Y.max(), sampler=sampler),
        qNegIntegratedPosteriorVariance(model, mc_points=mc_points),
    ]
    with gpytorch.settings.fast_pred_var(), gpytorch.settings.fast_pred_samples():
        for acqf in acqfs:
            cand, value = optimize_acqf(
                acqf, bounds=bounds, q=2, num_restarts=2, raw_samples=16, options={"maxiter": 5}
            )
            assert cand.shape == (2, 2) and torch.isfinite(value)
            assert ((cand >= bounds[0]) & (cand <= bounds[1])).all()
            Xg = torch.rand(3, 2, 2, dtype=DTYPE).requires_grad_(True)
            acqf(bounds[0] + (bounds[1] - bounds[0]) * Xg).sum().backward()
            assert torch.isfinite(Xg.grad).all() and Xg.grad.abs().sum() > 0


def test_float32_follows_the_data_and_agrees_with_float64():
    model = make_model(2)
    Xs = torch.rand(10, 2, dtype=DTYPE)
    X, Y = model.train_inputs[0], model.train_targets.unsqueeze(-1)
    model32 = KissGP(
        X.float(),
        Y.float(),
        grid_size=GRID[2],
        covar_module=ScaleKernel(RBFKernel(ard_num_dims=2)),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    model32.base_kernel.load_state_dict(model.base_kernel.state_dict())
    model32.likelihood.noise = 0.04
    ref = model.posterior(Xs)
    for switch in (gpytorch.settings.fast_pred_var(False), gpytorch.settings.fast_pred_var()):
        with switch:
            post = model32.posterior(Xs.float())
        assert post.mean.dtype == torch.float32
        assert (post.mean.double() - ref.mean).abs().max() < 1e-3
        assert (post.variance.double() - ref.variance).abs().max() < 2e-2 * ref.variance.max()
    assert model32.to(DTYPE).posterior(Xs).mean.dtype == DTYPE


def test_fixed_noise_views_have_their_own_likelihood():
    """A conditioned KissGP holds its rows' noise in its own likelihood: observing on it
    used to write the fixed-noise likelihood it shared with its parent."""
    model = make_model(1, n=12, fixed_noise=True)
    Xs = torch.linspace(0.1, 0.9, 5, dtype=DTYPE).unsqueeze(-1)
    before = model.posterior(Xs, observation_noise=True)
    noise = model.likelihood.noise.clone()
    X1 = torch.rand(2, 1, dtype=DTYPE)
    view = model.condition_on_observations(
        X1, target(X1), noise=torch.full((2, 1), 0.02, dtype=DTYPE)
    )
    assert view.likelihood is not model.likelihood
    assert torch.equal(
        view.likelihood.noise, torch.cat([noise, torch.full((2,), 0.02, dtype=DTYPE)])
    )
    X2 = torch.rand(3, 1, dtype=DTYPE)
    view.observe(X2, target(X2), torch.full((3, 1), 0.5, dtype=DTYPE))
    assert torch.equal(model.likelihood.noise, noise)
    after = model.posterior(Xs, observation_noise=True)
    assert torch.allclose(after.mean, before.mean, rtol=1e-12, atol=1e-14)
    assert torch.allclose(after.variance, before.variance, rtol=1e-12, atol=1e-14)
    expected = torch.cat([noise, torch.full((2,), 0.02, dtype=DTYPE), torch.full((3,), 0.5)])
    assert torch.equal(view.likelihood.noise, expected)
    # A fantasy's: the parent's rows, then their mean (BoTorch's fantasy noise).
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([3]))
    fantasy = model.fantasize(torch.rand(4, 1, dtype=DTYPE), sampler)
    fantasy_noise = fantasy.likelihood.noise
    assert fantasy_noise.shape == (3, 16)
    assert torch.equal(fantasy_noise[:, 12:], noise.mean().expand(3, 4))
    assert torch.equal(model.likelihood.noise, noise)


def test_the_default_grid_keeps_its_budget_in_four_dimensions():
    # Every KissGP prediction works on the grid, so its default is the point budget in any
    # d (WiskiGP's per-unit default for its data space gave 35^4 = 1.5M points here, and a
    # prediction or a fantasy needed tens of GB).
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(30, 4, dtype=DTYPE, generator=generator)
    model = KissGP(X, target(X[:, :2]))
    assert model.interpolation.num_grid <= 1024 and not model.structured
    assert model.posterior(X[:3]).mean.shape == (3, 1)
    X_f = torch.rand(2, 4, dtype=DTYPE, generator=generator)
    fantasy = model.condition_on_observations(X_f, target(X_f[:, :2]))
    assert fantasy.posterior(X[:3]).mean.shape == (3, 1)


def test_inputs_above_four_dimensions_are_refused_naming_wiskigp():
    # Each row's cubic stencil is 4^d grid points: in 6-D its statistics need 16^6
    # products per observation (a 40-point Hartmann-6 model ran out of memory).
    X = torch.rand(10, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"at most 4-D inputs. In 5-D use WiskiGP"):
        KissGP(X, X.sum(-1, keepdim=True))


def test_four_dimensional_inputs_warn_naming_wiskigp():
    from streamgp.models.utils.grids import HighDimensionalGridWarning

    X = torch.rand(10, 4, dtype=torch.float64)
    with pytest.warns(HighDimensionalGridWarning, match="KissGP in 4-D.*use WiskiGP"):
        KissGP(X, X.sum(-1, keepdim=True))
