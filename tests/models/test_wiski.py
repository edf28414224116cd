"""WiskiGP against dense float64 oracles: posterior, MLL, conditioning, fantasies."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import (
    ExpectedImprovement,
    qKnowledgeGradient,
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
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ZeroMean
from oracles import DenseSKIModel, copy_hyperparameters, rel_err, without_defaults

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood

DTYPE = torch.float64
GRID = {1: 40, 2: 14, 3: 7}


@pytest.fixture(autouse=True, params=["data", "mixed", "grid"])
def space(request, monkeypatch):
    """Every test runs in data space (the default while n <= m), with data-space statistics
    but the posterior on the grid (the default for mid-sized n), and in grid space."""
    if request.param == "grid":
        monkeypatch.setattr(WiskiGP, "DATA_SPACE_LIMIT", 0)
    monkeypatch.setattr(WiskiGP, "GRID_POSTERIOR_MIN_N", 0 if request.param == "mixed" else 10**9)
    return request.param


def make_data(n: int, d: int, fixed_noise: bool = False):
    X = torch.rand(n, d, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=DTYPE)
    Yvar = 0.01 + 0.05 * torch.rand(n, 1, dtype=DTYPE) if fixed_noise else None
    return X, Y, Yvar


def make_model(d: int, X, Y, Yvar=None, kernel: str = "rbf", **kwargs) -> WiskiGP:
    if kernel == "rbf":
        covar = ScaleKernel(RBFKernel(ard_num_dims=d))
    else:
        covar = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d))
    options = {**without_defaults(), **kwargs}
    model = WiskiGP(X, Y, Yvar, grid_size=GRID[d], covar_module=covar, **options)
    # ARD lengthscales that differ per dimension catch dimension-order mistakes.
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 0.7][:d], dtype=DTYPE)
    model.covar_module.outputscale = 1.3
    if Yvar is None:
        model.likelihood.noise = 0.04
    return model


def oracle_for(model: WiskiGP, X, Y, Yvar=None) -> DenseSKIModel:
    noise = Yvar.squeeze(-1) if Yvar is not None else None
    return DenseSKIModel(model, X, Y.squeeze(-1), noise)


CASES = [
    (d, fixed, kernel) for d in (1, 2, 3) for fixed in (False, True) for kernel in ("rbf", "matern")
]


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("d,fixed_noise,kernel", CASES)
def test_posterior_and_mll_match_dense_ski(d, fixed_noise, kernel):
    X, Y, Yvar = make_data(30, d, fixed_noise)
    model = make_model(d, X, Y, Yvar, kernel)
    oracle = oracle_for(model, X, Y, Yvar)
    Xs = torch.rand(2, 5, d, dtype=DTYPE)
    post = model.posterior(Xs)
    mean, covar = oracle.latent(Xs)
    assert post.mean.shape == (2, 5, 1)
    assert rel_err(post.mean.squeeze(-1), mean) < 1e-8
    assert rel_err(post.covariance_matrix, covar) < 1e-8

    # MLL value and gradients w.r.t. every hyperparameter.
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    value = mll()
    grads = torch.autograd.grad(value, params)
    priors = sum(p.log_prob(c(m)).sum() for _, m, p, c, _ in mll.model.named_priors())
    reference = (oracle.log_marginal_likelihood() + priors) / len(X)
    ref_grads = torch.autograd.grad(reference, params)
    assert abs(value.item() - reference.item()) < 1e-8 * abs(reference.item())
    for g, r in zip(grads, ref_grads, strict=True):
        assert rel_err(g, r) < 1e-7


def test_fine_grid_approaches_exact_gp():
    """Catches dimension-order mistakes that the SKI oracle would share."""
    X = torch.rand(40, 2, dtype=DTYPE)
    Y = torch.sin(6 * X[:, :1]) + torch.cos(3 * X[:, 1:])
    model = WiskiGP(X, Y, grid_size=40, **without_defaults())
    exact = SingleTaskGP(X, Y, outcome_transform=None)
    for m in (model, exact):
        m.covar_module.lengthscale = torch.tensor([0.2, 0.5], dtype=DTYPE)
        m.likelihood.noise = 1e-2
    Xs = 0.05 + 0.9 * torch.rand(50, 2, dtype=DTYPE)
    pw, pe = model.posterior(Xs), exact.posterior(Xs)
    assert (pw.mean - pe.mean).abs().max() < 1e-3
    assert (pw.variance - pe.variance).abs().max() < 1e-3
    # Swapping the lengthscales is far off (~0.55), so the check above has teeth.
    model.covar_module.lengthscale = torch.tensor([0.5, 0.2], dtype=DTYPE)
    assert (model.posterior(Xs).mean - pe.mean).abs().max() > 0.1


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_observe_and_condition_equal_rebuild(fixed_noise):
    d = 2
    X, Y, Yvar = make_data(60, d, fixed_noise)
    first = 20
    part = (Yvar[:first],) if fixed_noise else ()
    streamed = make_model(d, X[:first], Y[:first], *part)
    conditioned = streamed
    for start in range(first, 60, 4):
        sl = slice(start, start + 4)
        cond_kw = {"noise": Yvar[sl]} if fixed_noise else {}
        conditioned = conditioned.condition_on_observations(X[sl], Y[sl], **cond_kw)
        # In-place updates of the parent must not leak into models conditioned on it.
        noise_kw = {"Yvar": Yvar[sl]} if fixed_noise else {}
        streamed.observe(X[sl], Y[sl], **noise_kw)
    rebuilt = make_model(d, X, Y, Yvar)
    Xs = torch.rand(6, d, dtype=DTYPE)
    ref = rebuilt.posterior(Xs)
    for model in (streamed, conditioned):
        post = model.posterior(Xs)
        assert rel_err(post.mean, ref.mean) < 1e-8
        assert rel_err(post.covariance_matrix, ref.covariance_matrix) < 1e-8
    assert streamed.num_train == conditioned.num_train == 60
    # The conditioned model kept the root it started from (shared, not copied).
    assert _factor(conditioned).data_ptr() != _factor(streamed).data_ptr()
    mll_ref = WoodburyMarginalLogLikelihood(rebuilt.likelihood, rebuilt)()
    for model in (streamed, conditioned):
        mll = WoodburyMarginalLogLikelihood(model.likelihood, model)()
        assert abs(mll.item() - mll_ref.item()) < 1e-8 * abs(mll_ref.item())


@pytest.mark.usefixtures("ski_prior_variance")
def test_many_sequential_single_observations_stay_exact():
    d = 3
    X, Y, _ = make_data(200, d)
    model = make_model(d, X[:1], Y[:1])
    for i in range(1, 200):
        model.observe(X[i : i + 1], Y[i : i + 1])
    oracle = oracle_for(model, X, Y)
    Xs = torch.rand(8, d, dtype=DTYPE)
    post = model.posterior(Xs)
    mean, covar = oracle.latent(Xs)
    assert rel_err(post.mean.squeeze(-1), mean) < 1e-8
    assert rel_err(post.covariance_matrix, covar) < 1e-8


def _factor(model: WiskiGP) -> torch.Tensor:
    """The m x m grid root, or the n x n data-space Cholesky factor."""
    posterior = model._posterior
    return posterior.chol if space_of(model) == "data" else posterior.root


def space_of(model: WiskiGP) -> str:
    if not model.in_data_space:
        return "grid"
    return "mixed" if hasattr(model.exact_posterior(), "root") else "data"


def test_condition_shares_parent_root(space):
    X, Y, _ = make_data(20, 2)
    model = make_model(2, X, Y)
    assert space_of(model) == space
    Xf = torch.rand(5, 3, 2, dtype=DTYPE)
    fantasy = model.fantasize(Xf, SobolQMCNormalSampler(torch.Size([4])))
    assert fantasy.batch_shape == torch.Size([4, 5])
    assert _factor(fantasy) is _factor(model)
    if space != "data":
        assert fantasy._correction.V.shape == (5, model.interpolation.num_grid, 3)
    else:  # an n x q block per batch, never a copy of the n x n factor
        assert fantasy._correction.U.shape == (5, 20, 3)


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_fantasy_posterior_matches_oracle(fixed_noise):
    d = 2
    X, Y, Yvar = make_data(25, d, fixed_noise)
    model = make_model(d, X, Y, Yvar)
    oracle = oracle_for(model, X, Y, Yvar)
    Xf = torch.rand(3, 2, d, dtype=DTYPE)
    noise = torch.full((3, 2, 1), 0.02, dtype=DTYPE) if fixed_noise else None
    sampler = SobolQMCNormalSampler(torch.Size([5]), seed=1)
    fm = model.fantasize(Xf, sampler, observation_noise=noise)
    fo = oracle.fantasize(
        Xf, SobolQMCNormalSampler(torch.Size([5]), seed=1), observation_noise=noise
    )
    assert fm.batch_shape == fo.batch_shape == torch.Size([5, 3])
    Xs = torch.rand(3, 4, d, dtype=DTYPE)
    pm, po = fm.posterior(Xs), fo.posterior(Xs)
    assert pm.mean.shape == po.mean.shape == (5, 3, 4, 1)
    assert rel_err(pm.mean, po.mean) < 1e-7
    assert rel_err(pm.covariance_matrix, po.covariance_matrix) < 1e-7
    # Fantasies of fantasies (nested conditioning) stay exact too.
    fm2 = fm.condition_on_observations(Xs[..., :1, :], pm.mean[..., :1, :])
    fo2 = fo.condition_on_observations(Xs[..., :1, :], po.mean[..., :1, :])
    Xt = torch.rand(4, d, dtype=DTYPE)
    assert rel_err(fm2.posterior(Xt).mean, fo2.posterior(Xt).mean) < 1e-7
    assert rel_err(fm2.posterior(Xt).variance, fo2.posterior(Xt).variance) < 1e-7


def _acquisitions(model, best_f, mc_points):
    def sampler(n=8):
        return SobolQMCNormalSampler(torch.Size([n]), seed=3)

    return {
        "qNIPV": (
            qNegIntegratedPosteriorVariance(model, mc_points=mc_points, sampler=sampler(1)),
            2,
        ),
        "qKG": (
            qKnowledgeGradient(model, num_fantasies=4, sampler=sampler(4), inner_sampler=sampler()),
            2,
        ),
        "qLogEI": (qLogExpectedImprovement(model, best_f=best_f, sampler=sampler()), 3),
        "qUCB": (qUpperConfidenceBound(model, beta=2.0, sampler=sampler()), 3),
        "EI": (ExpectedImprovement(model, best_f=best_f), 1),
    }


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("name", ["qNIPV", "qKG", "qLogEI", "qUCB", "EI"])
def test_acquisition_values_match_oracle_and_optimize(name):
    d = 2
    X, Y, _ = make_data(30, d)
    model = make_model(d, X, Y)
    oracle = oracle_for(model, X, Y)
    mc_points = torch.rand(32, d, dtype=DTYPE)
    acq, q = _acquisitions(model, Y.max(), mc_points)[name]
    acq_ref, _ = _acquisitions(oracle, Y.max(), mc_points)[name]
    q_total = acq.get_augmented_q_batch_size(q) if name == "qKG" else q
    Xc = torch.rand(4, q_total, d, dtype=DTYPE)
    values, reference = acq(Xc), acq_ref(Xc)
    assert values.shape == reference.shape == (4,)
    assert rel_err(values, reference) < 1e-6
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(DTYPE)
    cand, val = optimize_acqf(
        acq, bounds=bounds, q=q, num_restarts=2, raw_samples=16, options={"maxiter": 20}
    )
    assert cand.shape == (q, d) and torch.isfinite(val)
    assert ((cand >= 0) & (cand <= 1)).all()


def test_qnipv_gradients_flow_through_conditioning():
    X, Y, _ = make_data(20, 2)
    model = make_model(2, X, Y)
    acq = qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(16, 2, dtype=DTYPE))
    Xc = torch.rand(3, 2, 2, dtype=DTYPE, requires_grad=True)
    acq(Xc).sum().backward()
    assert Xc.grad is not None and torch.isfinite(Xc.grad).all() and Xc.grad.abs().sum() > 0


def test_transforms_frozen_after_construction():
    """Normalize/Standardize are fitted on the first batch and frozen for the stream."""
    d = 2
    lo, hi = -3.0, 5.0
    X = lo + (hi - lo) * torch.rand(50, d, dtype=DTYPE)
    Y = 10 + 3 * torch.sin(X).sum(-1, keepdim=True)
    bounds = torch.tensor([[lo] * d, [hi] * d], dtype=DTYPE)
    model = WiskiGP(
        X[:20],
        Y[:20],
        grid_size=14,
        input_transform=Normalize(d, bounds=bounds),
        outcome_transform=Standardize(1),
        mean_module=ZeroMean(),
    )
    mean0, std0 = Y[:20].mean(), Y[:20].std()
    model.train()  # as fit_gpytorch_mll leaves it mid-fit: observe must still freeze
    model.observe(X[20:], Y[20:])
    Xn = (X - lo) / (hi - lo)
    base = WiskiGP(Xn, (Y - mean0) / std0, grid_size=14, **without_defaults())
    copy_hyperparameters(model, base)
    Xs = lo + (hi - lo) * torch.rand(6, d, dtype=DTYPE)
    post, ref = model.posterior(Xs), base.posterior((Xs - lo) / (hi - lo))
    assert rel_err(post.mean, mean0 + std0 * ref.mean) < 1e-8
    assert rel_err(post.variance, std0**2 * ref.variance) < 1e-8


def test_fit_and_online_steps_rebuild_from_statistics():
    X, Y, _ = make_data(80, 2)
    # Softplus-constrained noise: plain torch optimizers cannot make it negative.
    model = WiskiGP(
        X[:40], Y[:40], grid_size=12, likelihood=GaussianLikelihood(), outcome_transform=None
    )
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    before = mll().item()
    fit_gpytorch_mll(mll)
    assert mll().item() > before
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for i in range(40, 80):
        model.observe(X[i : i + 1], Y[i : i + 1])
        optimizer.zero_grad()
        (-mll()).backward()
        optimizer.step()
    rebuilt = WiskiGP(X, Y, grid_size=12, likelihood=GaussianLikelihood(), outcome_transform=None)
    copy_hyperparameters(model, rebuilt)
    Xs = torch.rand(5, 2, dtype=DTYPE)
    assert rel_err(model.posterior(Xs).mean, rebuilt.posterior(Xs).mean) < 1e-8
    assert rel_err(model.posterior(Xs).variance, rebuilt.posterior(Xs).variance) < 1e-8


def test_state_dict_resumes_stream():
    X, Y, _ = make_data(40, 2)
    model = make_model(2, X[:30], Y[:30])
    fresh = make_model(2, X[:1], Y[:1])
    fresh.load_state_dict(model.state_dict(), keep_transforms=False)
    for m in (model, fresh):
        m.observe(X[30:], Y[30:])
    Xs = torch.rand(4, 2, dtype=DTYPE)
    assert rel_err(fresh.posterior(Xs).mean, model.posterior(Xs).mean) < 1e-10


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_load_state_dict_warm_starts_without_touching_the_data(fixed_noise, tmp_path):
    """BoTorch's tutorial warm start: rebuild on all data, load the previous model's state."""
    X, Y, Yvar = make_data(50, 2, fixed_noise)
    old_Yvar = None if Yvar is None else Yvar[:20]
    old = make_model(2, X[:20], Y[:20], old_Yvar, outcome_transform=Standardize(1))
    old.covar_module.base_kernel.lengthscale = torch.tensor([0.2, 0.6], dtype=DTYPE)
    if not fixed_noise:
        old.likelihood.noise = 0.07
    new = make_model(2, X, Y, Yvar, outcome_transform=Standardize(1))
    fresh = make_model(2, X, Y, Yvar, outcome_transform=Standardize(1))
    path = tmp_path / "old.pt"
    torch.save(old.state_dict(), path)
    new.load_state_dict(torch.load(path, weights_only=True))
    assert new.num_train == 50  # the 20-point model's statistics did not replace these
    # Predictions equal a fresh model on all data with the loaded hyperparameters.
    copy_hyperparameters(old, fresh)
    Xs = torch.rand(6, 2, dtype=DTYPE)
    post, ref = new.posterior(Xs), fresh.posterior(Xs)
    assert rel_err(post.mean, ref.mean) < 1e-10
    assert rel_err(post.variance, ref.variance) < 1e-10
    torch.testing.assert_close(new.outcome_transform.means, fresh.outcome_transform.means)
    torch.testing.assert_close(new.likelihood.noise, fresh.likelihood.noise)
    # keep_transforms=False restores the saved stream itself (a checkpoint).
    new.load_state_dict(torch.load(path, weights_only=True), keep_transforms=False)
    assert new.num_train == 20
    assert rel_err(new.posterior(Xs).mean, old.posterior(Xs).mean) < 1e-10


def test_empty_start_and_observation_noise():
    model = make_model(2, torch.empty(0, 2, dtype=DTYPE), torch.empty(0, 1, dtype=DTYPE))
    Xs = torch.rand(3, 2, dtype=DTYPE)
    prior = model.posterior(Xs)
    assert prior.mean.abs().max() == 0
    noisy = model.posterior(Xs, observation_noise=True)
    assert torch.allclose(noisy.variance, prior.variance + 0.04)
    X, Y, _ = make_data(10, 2)
    model.observe(X, Y)
    ref = make_model(2, X, Y)
    assert rel_err(model.posterior(Xs).mean, ref.posterior(Xs).mean) < 1e-8


def test_float32_close_to_float64():
    X, Y, _ = make_data(100, 2)
    m64 = make_model(2, X, Y)
    m32 = make_model(2, X.float(), Y.float())
    m32.covar_module.base_kernel.lengthscale = torch.tensor([0.3, 0.5])
    m32.covar_module.outputscale = 1.3
    m32.likelihood.noise = 0.04
    m32.observe(X[:5].float(), Y[:5].float())
    m64.observe(X[:5], Y[:5])
    Xs = torch.rand(6, 2, dtype=DTYPE)
    p32, p64 = m32.posterior(Xs.float()), m64.posterior(Xs)
    assert p32.mean.dtype == torch.float32
    assert (p32.mean.double() - p64.mean).abs().max() < 1e-3
    assert (p32.variance.double() - p64.variance).abs().max() < 1e-3


def test_default_grid_and_kernel():
    X, Y, _ = make_data(10, 3)
    model = WiskiGP(X, Y)
    assert model.interpolation.grid_size == [10, 10, 10]
    assert isinstance(model.covar_module, RBFKernel)
    assert model.covar_module.lengthscale_prior is not None
    assert math.isfinite(WoodburyMarginalLogLikelihood(model.likelihood, model)().item())


def test_invalid_noise_hyperparameter_is_explained():
    X, Y, _ = make_data(10, 2)
    model = make_model(2, X, Y)
    with torch.no_grad():
        model.likelihood.noise_covar.raw_noise.fill_(-0.1)
    with pytest.raises(ValueError, match="noise variance"):
        model.posterior(torch.rand(2, 2, dtype=DTYPE))


@pytest.mark.parametrize("data_space_limit", [0, None], ids=["grid", "data"])
def test_statistics_keep_the_gradient_to_learned_inputs(data_space_limit):
    """A learned projection of the inputs is fitted through the statistics (the
    streaming protocol's WISKI for d > 3): the likelihood must reach its parameters."""
    torch.manual_seed(0)
    X = torch.rand(40, 4, dtype=torch.float64)
    Y = torch.sin(3 * X).sum(-1, keepdim=True)
    projection = torch.nn.Parameter(0.3 * torch.randn(4, 2, dtype=torch.float64))
    features = torch.sigmoid(X @ projection)
    model = WiskiGP(
        features,
        Y,
        grid_size=10,
        grid_bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64),
        data_space_limit=data_space_limit,
    )
    value, _ = model.fit_objective()
    (grad,) = torch.autograd.grad(value, projection)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
