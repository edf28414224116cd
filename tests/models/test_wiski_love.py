"""WiskiGP with LOVE (fast_pred_var / fast_pred_samples, large grids) against dense oracles."""

from __future__ import annotations

import subprocess
import sys

import gpytorch
import pytest
import torch
from botorch.acquisition import (
    UpperConfidenceBound,
    qLogExpectedImprovement,
    qNegIntegratedPosteriorVariance,
    qUpperConfidenceBound,
)
from botorch.fit import fit_gpytorch_mll
from botorch.models.transforms import Standardize
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from linear_operator.operators import DenseLinearOperator, RootLinearOperator
from oracles import DenseSKIModel, rel_err, without_defaults

import streamgp.linalg.statistics as statistics_module
import streamgp.models.wiski as wiski_module
from streamgp import WiskiGP, WoodburyMarginalLogLikelihood
from streamgp.linalg import GridKernelRoot, grid_kernel_root
from streamgp.linalg.structured import conjugate_gradients

DTYPE = torch.float64
GRID = {1: 40, 2: 14, 3: 7}


@pytest.fixture(autouse=True)
def grid_space(monkeypatch):
    """LOVE roots belong to grid space: start there (data space is exact and needs none)."""
    monkeypatch.setattr(WiskiGP, "DATA_SPACE_LIMIT", 0)


def target(X):
    return torch.sin(5 * X).sum(-1, keepdim=True)


def make_model(d, n=30, fixed_noise=False, grid=None, **kwargs):
    X = torch.rand(n, d, dtype=DTYPE)
    Y = target(X) + 0.1 * torch.randn(n, 1, dtype=DTYPE)
    Yvar = 0.01 + 0.05 * torch.rand(n, 1, dtype=DTYPE) if fixed_noise else None
    model = WiskiGP(
        X,
        Y,
        Yvar,
        grid_size=grid or GRID[d],
        covar_module=ScaleKernel(RBFKernel(ard_num_dims=d)),
        **{**without_defaults(), **kwargs},
    )
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 0.7][:d], dtype=DTYPE)
    model.covar_module.outputscale = 1.3
    if not fixed_noise:
        model.likelihood.noise = 0.04
    data = [X, Y.squeeze(-1), None if Yvar is None else Yvar.squeeze(-1)]
    return model, data


def stream(model, data, d, calls=10, q=3):
    """``calls`` observe calls; returns the data absorbed so far (for the oracle)."""
    X, y, noise = data
    for _ in range(calls):
        Xn = torch.rand(q, d, dtype=DTYPE)
        Yn = target(Xn)
        Vn = 0.02 + 0.03 * torch.rand(q, 1, dtype=DTYPE) if model.fixed_noise else None
        model.observe(Xn, Yn, Vn)
        X, y = torch.cat([X, Xn]), torch.cat([y, Yn.squeeze(-1)])
        if Vn is not None:
            noise = torch.cat([noise, Vn.squeeze(-1)])
    return X, y, noise


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_fast_pred_var_matches_dense_within_the_stated_bound(d, fixed_noise):
    model, data = make_model(d, fixed_noise=fixed_noise)
    oracle = DenseSKIModel(model, *stream(model, data, d))
    Xs = torch.rand(2, 25, d, dtype=DTYPE)
    mean, covar = oracle.latent(Xs)
    exact_var = covar.diagonal(dim1=-2, dim2=-1)

    default = model.posterior(Xs)  # accurate by default: the exact dense root
    assert isinstance(default.distribution.lazy_covariance_matrix, DenseLinearOperator)
    for switch in (gpytorch.settings.fast_pred_var, gpytorch.settings.fast_pred_samples):
        model.love_tolerance = 1e-6
        with switch():
            post = model.posterior(Xs)
        assert isinstance(post.distribution.lazy_covariance_matrix, RootLinearOperator)
        love_var = post.variance.squeeze(-1)
        assert torch.allclose(post.mean.squeeze(-1), mean, atol=1e-9)
        # 0 <= exact - LOVE <= |w|^2 tol tr(Sigma_U), never negative.
        R = model.grid_posterior().root
        w_sq = model.interpolation.weights(Xs).values.square().sum(-1)
        bound = w_sq * model.love_tolerance * R.square().sum()
        assert (love_var >= 0).all()
        assert (exact_var - love_var >= -1e-10).all()
        assert (exact_var - love_var <= bound + 1e-10).all()
        assert model.love_grid_posterior() is None  # outside the switch: exact again
        assert model._love_cache[2].root.shape[-1] < model.interpolation.num_grid


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("d", [1, 2, 3])
def test_full_rank_love_reproduces_dense(d):
    model, data = make_model(d, fixed_noise=d == 2)
    oracle = DenseSKIModel(model, *stream(model, data, d, calls=4))
    model.love_tolerance = 0.0
    Xs = torch.rand(20, d, dtype=DTYPE)
    with gpytorch.settings.fast_pred_var():
        post = model.posterior(Xs)
    mean, covar = oracle.latent(Xs)
    assert post.distribution.lazy_covariance_matrix.root.shape[-1] == model.interpolation.num_grid
    assert (post.covariance_matrix - covar).abs().max() < 1e-10 * covar.abs().max()
    assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-10


@pytest.mark.usefixtures("ski_prior_variance")
def test_love_root_follows_observe_and_tolerance_changes():
    model, data = make_model(2)
    Xs = torch.rand(10, 2, dtype=DTYPE)
    with gpytorch.settings.fast_pred_var():
        model.posterior(Xs)
        first = model.love_grid_posterior()
        assert model.love_grid_posterior() is first  # cached
        X, y, noise = stream(model, data, 2, calls=3)
        after_observe = model.posterior(Xs)
        assert model.love_grid_posterior() is not first
        model.love_tolerance = 1e-2
        coarse = model.love_grid_posterior()
    assert coarse.root.shape[-1] < model._love_cache[0].root.shape[-1]
    _, covar = DenseSKIModel(model, X, y, noise).latent(Xs)
    assert (after_observe.variance.squeeze(-1) - covar.diagonal()).abs().max() < 1e-6


@pytest.mark.usefixtures("ski_prior_variance")
def test_fast_pred_samples_have_the_dense_covariance_with_standardize():
    torch.manual_seed(1)
    model, data = make_model(2, outcome_transform=Standardize(1))
    X, y, _ = stream(model, data, 2, calls=2)
    Xs = torch.rand(6, 2, dtype=DTYPE)
    exact = model.posterior(Xs)
    with gpytorch.settings.fast_pred_samples():
        post = model.posterior(Xs)
        k = post.distribution.lazy_covariance_matrix.root.shape[-1]
        assert post.base_sample_shape == torch.Size([k, 1]) or post.base_sample_shape[-1] == k
        samples = post.rsample(torch.Size([40_000])).squeeze(-1)
        qmc = SobolQMCNormalSampler(torch.Size([64]))(post)
    assert qmc.shape == (64, 6, 1)
    centered = samples - samples.mean(0)
    empirical = centered.T @ centered / len(samples)
    reference = exact.covariance_matrix
    assert (empirical - reference).abs().max() < 0.05 * reference.abs().max()
    assert torch.allclose(post.mean, exact.mean, atol=1e-9)
    assert torch.allclose(post.variance, exact.variance, rtol=1e-4)
    # Observation noise keeps a root-plus-diagonal covariance.
    with gpytorch.settings.fast_pred_var():
        noisy = model.posterior(Xs, observation_noise=True)
    exact_noisy = model.posterior(Xs, observation_noise=True)
    assert torch.allclose(noisy.variance, exact_noisy.variance, rtol=1e-4)


def test_variances_never_negative_with_extreme_heteroskedastic_noise():
    """gpytorch#864: fixed heteroskedastic noise gave negative LOVE variances there."""
    X = torch.rand(80, 2, dtype=DTYPE)
    Yvar = 10.0 ** torch.empty(80, 1, dtype=DTYPE).uniform_(-8, 1)
    model = WiskiGP(X, target(X), Yvar, grid_size=14)
    for tol in (1e-1, 1e-4, 1e-8):
        model.love_tolerance = tol
        with gpytorch.settings.fast_pred_var():
            var = model.posterior(torch.rand(500, 2, dtype=DTYPE)).variance
        assert (var >= 0).all()


def test_botorch_acquisitions_run_under_the_switches():
    model, data = make_model(2, n=40, outcome_transform=Standardize(1))
    X = torch.rand(4, 3, 2, dtype=DTYPE)
    best = float(target(data[0]).max())
    sampler = SobolQMCNormalSampler(torch.Size([32]))
    exact_ucb = UpperConfidenceBound(model, beta=2.0)(X[:, :1])
    with gpytorch.settings.fast_pred_var(), gpytorch.settings.fast_pred_samples():
        ucb = UpperConfidenceBound(model, beta=2.0)(X[:, :1])
        assert torch.allclose(ucb, exact_ucb, atol=1e-5)
        for acqf in (
            qUpperConfidenceBound(model, beta=2.0, sampler=sampler),
            qLogExpectedImprovement(model, best_f=best, sampler=sampler),
            qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(16, 2, dtype=DTYPE)),
        ):
            Xg = X.clone().requires_grad_(True)
            value = acqf(Xg)
            value.sum().backward()
            assert torch.isfinite(value).all() and torch.isfinite(Xg.grad).all()


# ---------------------------------------------------------------- large grids
@pytest.fixture
def structured_threshold(monkeypatch):
    """Make 7^3 = 343-point grids take the structured (large-grid) path."""
    monkeypatch.setattr(WiskiGP, "MAX_DENSE_GRID", 300)


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_structured_path_matches_dense_after_observe_and_conditioning(
    structured_threshold, fixed_noise
):
    torch.manual_seed(2)
    model, data = make_model(3, fixed_noise=fixed_noise)
    assert model.structured and model.statistics.A.is_sparse
    model.love_tolerance = 1e-10
    X, y, noise = stream(model, data, 3, calls=4)
    oracle = DenseSKIModel(model, X, y, noise)
    Xs = torch.rand(15, 3, dtype=DTYPE)
    post = model.posterior(Xs)  # LOVE by construction, no switch needed
    mean, covar = oracle.latent(Xs)
    assert isinstance(post.distribution.lazy_covariance_matrix, RootLinearOperator)
    assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-8
    assert (post.covariance_matrix - covar).abs().max() < 1e-8
    assert (post.variance >= 0).all()
    # Fantasy-style conditioning on the low-rank root (batched).
    Xc = torch.rand(2, 2, 3, dtype=DTYPE)
    Yc = torch.randn(2, 2, 1, dtype=DTYPE)
    cond = model.condition_on_observations(Xc, Yc).posterior(Xs)
    mean_c, covar_c = oracle.condition_on_observations(Xc, Yc).latent(Xs)
    assert (cond.mean.squeeze(-1) - mean_c).abs().max() < 1e-8
    assert (cond.covariance_matrix - covar_c).abs().max() < 1e-8


@pytest.mark.usefixtures("ski_prior_variance")
def test_structured_observe_updates_the_low_rank_root_in_place(structured_threshold, monkeypatch):
    """After a prediction, observe holds small batches as a rank-q correction of the LOVE root
    and folds them into it at FOLD_RANK (no rebuild), staying accurate throughout."""
    torch.manual_seed(4)
    model, data = make_model(3)
    model.love_tolerance = 1e-10
    model.eval()
    model.posterior(torch.rand(2, 3, dtype=DTYPE))  # builds the LOVE root once
    rank = model.grid_posterior().root.shape[-1]
    folds = []
    original = wiski_module.fold_low_rank
    monkeypatch.setattr(wiski_module, "fold_low_rank", lambda *a: folds.append(1) or original(*a))
    monkeypatch.setattr(
        statistics_module, "structured_grid_posterior", lambda *a, **k: 1 / 0
    )  # no rebuild
    Xs = torch.rand(15, 3, dtype=DTYPE)
    X, y, noise = data
    steps = model.FOLD_RANK // 3 + 2  # past one fold, then a correction pending again
    for step in range(steps):
        X, y, noise = stream(model, (X, y, noise), 3, calls=1)
        post = model.posterior(Xs)
        if step == 0:
            assert not folds and model._correction.rank == 3  # held, not folded
        mean, covar = DenseSKIModel(model, X, y, noise).latent(Xs)
        assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-8
        assert (post.covariance_matrix - covar).abs().max() < 1e-8
    assert len(folds) == 1 and model.grid_posterior().root.shape[-1] == rank
    assert 0 < model._correction.rank < model.FOLD_RANK


@pytest.mark.usefixtures("ski_prior_variance")
def test_structured_observe_with_fixed_noise_updates_the_root(structured_threshold, monkeypatch):
    """Fixed noise is not deferred: every observe is a rank-q update of the LOVE root."""
    torch.manual_seed(4)
    model, data = make_model(3, fixed_noise=True)
    model.love_tolerance = 1e-10
    model.eval()
    model.posterior(torch.rand(2, 3, dtype=DTYPE))
    rank = model.grid_posterior().root.shape[-1]
    calls = []
    original = wiski_module.update_root
    monkeypatch.setattr(wiski_module, "update_root", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr(statistics_module, "structured_grid_posterior", lambda *a, **k: 1 / 0)
    Xs = torch.rand(15, 3, dtype=DTYPE)
    X, y, noise = data
    for _ in range(3):
        X, y, noise = stream(model, (X, y, noise), 3, calls=1)
        post = model.posterior(Xs)
    assert len(calls) == 3 and model.grid_posterior().root.shape[-1] == rank
    mean, covar = DenseSKIModel(model, X, y, noise).latent(Xs)
    assert (post.mean.squeeze(-1) - mean).abs().max() < 1e-8
    assert (post.covariance_matrix - covar).abs().max() < 1e-8


def test_structured_path_rejects_what_it_cannot_do(structured_threshold):
    X = torch.rand(5, 3, dtype=DTYPE)
    with pytest.raises(ValueError, match="Kronecker"):
        WiskiGP(X, target(X), grid_size=7, covar_module=MaternKernel(ard_num_dims=3))


def test_structured_marginal_likelihood_matches_dense_and_fits(monkeypatch):
    """Large grids: the MLL (Nystrom log-det + CG) equals the dense grid's; fitting works."""
    torch.manual_seed(3)
    dense, data = make_model(3, n=60)
    monkeypatch.setattr(WiskiGP, "MAX_DENSE_GRID", 300)
    torch.manual_seed(3)
    model, _ = make_model(3, n=60)
    assert model.structured and not dense.structured
    values, grads = [], []
    for m in (model, dense):
        mll = WoodburyMarginalLogLikelihood(m.likelihood, m)
        value = mll()
        params = [p for p in m.parameters() if p.requires_grad]
        values.append(value)
        grads.append(torch.autograd.grad(value, params))
    # The log-det gap is likelihood_gap(60) = 6e-8 in all: at most 5e-10 per datum.
    assert abs(float(values[0] - values[1])) < 1e-9
    for got, want in zip(*grads, strict=True):
        assert (got - want).abs().max() <= 1e-7 * want.abs().max()

    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    before = float(mll())
    fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 5}})
    assert float(mll()) > before
    # The same fit on the dense grid lands on the same hyperparameters...
    fit_gpytorch_mll(
        WoodburyMarginalLogLikelihood(dense.likelihood, dense),
        optimizer_kwargs={"options": {"maxiter": 5}},
    )
    for (name, fitted), (_, reference) in zip(
        model.named_parameters(), dense.named_parameters(), strict=True
    ):
        assert rel_err(fitted, reference) < 1e-5, name
    # ...and they predict as the dense grid does with them.
    dense.load_state_dict(model.state_dict())
    Xs = torch.rand(10, 3, dtype=DTYPE)
    model.eval(), dense.eval()
    assert rel_err(model.posterior(Xs).mean, dense.posterior(Xs).mean) < 1e-7


def test_structured_marginal_likelihood_stops_at_a_gap_per_observation(monkeypatch):
    """The Nystrom log-determinant stops at LIKELIHOOD_TOLERANCE * n (never finer than
    love_tolerance): a lower rank, and the value still within half the gap of exact SKI's."""
    import streamgp.linalg.structured as structured

    asked = []
    nystrom = structured.WhitenedStatistic.nystrom

    def recording(operator, tol, max_rank=None):
        result = nystrom(operator, tol, max_rank)
        asked.append((tol, result.complement_root.shape[-1]))
        return result

    monkeypatch.setattr(structured.WhitenedStatistic, "nystrom", recording)
    n = 400
    torch.manual_seed(4)
    dense, _ = make_model(3, n=n)
    monkeypatch.setattr(WiskiGP, "MAX_DENSE_GRID", 300)
    torch.manual_seed(4)
    model, _ = make_model(3, n=n)
    assert model.structured and not dense.structured
    assert model.kernel_root().toeplitz  # an evenly spaced grid: tr(G) from A's offset sums
    exact = float(WoodburyMarginalLogLikelihood(dense.likelihood, dense)())  # per datum
    values, ranks = {}, {}
    for per_observation in (0.0, 1e-9, 1e-7):
        monkeypatch.setattr(WiskiGP, "LIKELIHOOD_TOLERANCE", per_observation)
        gap = model.likelihood_gap(n)
        assert gap == max(model.love_tolerance, per_observation * n)
        values[per_observation] = float(WoodburyMarginalLogLikelihood(model.likelihood, model)())
        assert asked[-1][0] == gap
        ranks[per_observation] = asked[-1][1]
        # log|C| is under-estimated by at most the gap: the value per datum over-estimated
        # by at most gap / (2 n) (plus round-off of the O(n) value).
        assert -1e-12 <= values[per_observation] - exact <= gap / (2 * n) + 1e-12
    assert ranks[1e-7] < ranks[0.0]  # the coarser gap stops the Lanczos earlier
    # Statistics given to the marginal likelihood (the WISKI paper's eq. 18) get their own
    # count's gap.
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    assert float(mll(statistics=model.statistics)) == values[1e-7]
    assert asked[-1][0] == model.likelihood_gap(n)
    monkeypatch.setattr(WiskiGP, "LIKELIHOOD_TOLERANCE", 1e-9)
    assert model.likelihood_gap(1) == model.love_tolerance  # never finer than love_tolerance


# The same build, observe and prediction in a fresh interpreter: its peak memory is then
# measured from the import baseline, independent of what earlier tests left behind
# (ru_maxrss is a process-wide peak).
_PEAK_MEMORY_PROBE = """
import resource, torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from streamgp import WiskiGP
torch.manual_seed(0)
X = torch.rand(300, 3, dtype=torch.float64)
Y = torch.sin(5 * X).sum(-1, keepdim=True)
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
model = WiskiGP(X, Y, grid_size=22, covar_module=ScaleKernel(RBFKernel(ard_num_dims=3)))
model.covar_module.base_kernel.lengthscale = torch.tensor([0.4, 0.5, 0.6], dtype=torch.float64)
model.likelihood.noise = 0.05
model.love_tolerance = 1e-4
Xn = torch.rand(4, 3, dtype=torch.float64)
model.observe(Xn, torch.sin(5 * Xn).sum(-1, keepdim=True))
model.posterior(torch.rand(2000, 3, dtype=torch.float64)).variance
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start)
"""


@pytest.mark.slow
def test_22_cubed_grid_peak_memory_stays_below_one_dense_grid_matrix():
    m = 22**3
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_MEMORY_PROBE], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    grown = int(result.stdout.split()[-1])
    # One dense m x m float64 matrix alone would be m^2 * 8 bytes (907 MB here); the
    # structured path measured 240-330 MB.
    assert grown < 0.75 * m * m * 8, f"peak memory grew by {grown / 2**20:.0f} MiB"


@pytest.mark.slow
def test_22_cubed_grid_never_forms_a_dense_grid_matrix(monkeypatch):
    """m = 10648: every dense-root routine is made unreachable; LOVE variances stay accurate."""

    def unreachable(*args, **kwargs):
        raise AssertionError("dense m x m routine called on a large grid")

    for name in ("factorize",):
        monkeypatch.setattr(wiski_module, name, unreachable, raising=False)
        monkeypatch.setattr(statistics_module, name, unreachable, raising=False)
    low_rank_update = wiski_module.update_root

    def update_low_rank_only(posterior, *args):
        assert posterior.root.shape[-1] < posterior.root.shape[-2], "dense root updated"
        return low_rank_update(posterior, *args)

    monkeypatch.setattr(wiski_module, "update_root", update_low_rank_only)
    monkeypatch.setattr(GridKernelRoot, "to_dense", unreachable)
    X = torch.rand(300, 3, dtype=DTYPE)
    covar = ScaleKernel(RBFKernel(ard_num_dims=3))
    model = WiskiGP(X, target(X), grid_size=22, covar_module=covar, **without_defaults())
    m = model.interpolation.num_grid
    assert m == 22**3 and model.structured
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.4, 0.5, 0.6], dtype=DTYPE)
    model.likelihood.noise = 0.05
    model.love_tolerance = 1e-4
    Xn = torch.rand(4, 3, dtype=DTYPE)
    model.observe(Xn, target(Xn))
    Xs = torch.rand(2000, 3, dtype=DTYPE)
    post = model.posterior(Xs)
    love_var = post.variance.squeeze(-1)
    root = model.grid_posterior().root
    assert root.shape[-1] < m // 10
    assert (love_var >= 0).all()

    # Exact variances at a few points by CG (no Lanczos): z^T C^{-1} z, z = L_K^T w.
    L_K = grid_kernel_root(model.covar_module, model.interpolation.grid)
    A = model.weighted_statistics()[0].coalesce().to_sparse_csr()
    W = model.interpolation.weights(Xs[:5])
    Z = L_K.t_matmul(_dense_rows(W, m).T)
    with torch.no_grad():
        solved = conjugate_gradients(
            lambda V: V + L_K.t_matmul(A @ L_K.matmul(V)), Z, lambda V: V, 1e-10, 5000
        )
    exact_var = (Z * solved).sum(0)
    prior_var = Z.square().sum(0)
    err = (love_var[:5] - exact_var).abs()
    assert (err <= 2e-4 * prior_var + 1e-8).all(), err

    # BoTorch's acquisition functions on the large grid: values and gradients (qNIPV and
    # qLogEI through conditioning / fantasies on the low-rank root).
    sampler = SobolQMCNormalSampler(torch.Size([16]), seed=0)
    best = float(target(Xn).max())
    candidates = torch.rand(4, 3, 3, dtype=DTYPE, requires_grad=True)
    for acqf in (
        qUpperConfidenceBound(model, beta=2.0, sampler=sampler),
        qLogExpectedImprovement(model, best_f=best, sampler=sampler),
        qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(64, 3, dtype=DTYPE)),
    ):
        value = acqf(candidates)
        (grad,) = torch.autograd.grad(value.sum(), candidates)
        assert value.shape == (4,) and torch.isfinite(value).all() and torch.isfinite(grad).all()
        assert grad.abs().sum() > 0


def _dense_rows(W, m):
    """The ``t x m`` dense rows of a few interpolation weights (t small)."""
    out = torch.zeros(W.num_rows, m, dtype=DTYPE)
    return out.scatter_add(-1, W.indices, W.values)
