"""Exact prior variances at prediction (streamgp.linalg.prior_variance) in every SKI model.

Oracle: the dense SKI posterior plus ``diag(max(k(x, x) - w^T K_UU w, 0))`` at the test
points (``DenseSKIModel(..., exact_prior_variance=True)``), in float64, to 1e-10; the data
fit (mean, conditioning, marginal likelihood) stays exact SKI.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from botorch.models.transforms import Normalize
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ZeroMean
from gpytorch.settings import fast_pred_var
from linear_operator.operators import LowRankRootAddedDiagLinearOperator
from oracles import DenseSKIModel, prior_variance_gap, rel_err, without_defaults

from streamgp import AdditiveWiskiGP, KissGP, WiskiGP
from streamgp.linalg import PriorVarianceCorrection, grid_kernel_root
from streamgp.models import OnlineSoftKIGP
from streamgp.settings import exact_prior_variance

DTYPE = torch.float64
UNIT = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DTYPE)
TOL = 1e-10


def scaled_kernel(d: int, matern: bool = False, lengthscale: float = 0.09) -> ScaleKernel:
    base = MaternKernel(nu=2.5, ard_num_dims=d) if matern else RBFKernel(ard_num_dims=d)
    kernel = ScaleKernel(base).to(DTYPE)
    # Lengthscales of 1-2 grid spacings: SKI's prior variance is visibly short there,
    # so the correction is large enough for the oracle to see.
    kernel.base_kernel.lengthscale = lengthscale * torch.linspace(1.0, 1.5, d, dtype=DTYPE)
    kernel.outputscale = 1.3
    return kernel


def data(n: int, d: int, fixed_noise: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=generator, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=generator, dtype=DTYPE
    )
    Yvar = 0.01 + 0.05 * torch.rand(n, 1, generator=generator, dtype=DTYPE) if fixed_noise else None
    return X, Y, Yvar


def assert_matches(model, oracle, Xs, observation_noise=False):
    posterior = model.posterior(Xs, observation_noise=observation_noise)
    mean, covar = oracle.latent(Xs)
    if observation_noise:
        covar = covar + oracle.noise_level() * torch.eye(covar.shape[-1], dtype=DTYPE)
    assert rel_err(posterior.mean.squeeze(-1), mean) < TOL
    assert rel_err(posterior.covariance_matrix, covar) < TOL
    # The marginal variances are the joint covariance's diagonal (factored vs dense).
    variance = posterior.variance.squeeze(-1)
    assert rel_err(variance, posterior.covariance_matrix.diagonal(dim1=-2, dim2=-1)) < 1e-12
    assert rel_err(variance, covar.diagonal(dim1=-2, dim2=-1)) < TOL


# ------------------------------------------------------------- the measured table
GRID_SPACING = 1.0 / 27  # a 30-point grid over [0, 1] pads one spacing on each side


@pytest.mark.parametrize("spacings", [2.7, 1.35, 0.81, 0.5])
@pytest.mark.parametrize("model_class", [WiskiGP, KissGP])
def test_prior_variance_is_the_kernels_down_to_half_a_grid_spacing(spacings, model_class):
    # Issue 39's measurement: 30 x 30 grid over the unit square, RBF, one observation
    # in the far corner, 2,000 points in [0, 0.5]^2 where the exact prior variance is 1.
    X, Y = torch.ones(1, 2, dtype=DTYPE), torch.zeros(1, 1, dtype=DTYPE)
    model = model_class(X, Y, grid_size=30, grid_bounds=UNIT, **without_defaults())
    kernel = model.base_kernel if model_class is KissGP else model.covar_module
    kernel.lengthscale = spacings * GRID_SPACING
    model.likelihood.noise = 1e-2
    Xs = 0.5 * torch.rand(2000, 2, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    variance = model.posterior(Xs).variance
    assert (variance - 1.0).abs().max() < 0.01
    with exact_prior_variance(False):  # SKI's own: measured min 0.995, 0.938, 0.746, 0.500
        ski = model.posterior(Xs).variance
    expected_min = {2.7: 0.996, 1.35: 0.94, 0.81: 0.75, 0.5: 0.51}[spacings]
    assert ski.min() < expected_min
    if spacings < 2:
        assert ski.min() < 0.99  # well outside the 1% the correction keeps


def test_constructor_keyword_switches_it_off_for_that_model_alone():
    X, Y = torch.ones(1, 2, dtype=DTYPE), torch.zeros(1, 1, dtype=DTYPE)
    Xs = 0.5 * torch.rand(50, 2, dtype=DTYPE)
    on = WiskiGP(X, Y, grid_size=30, grid_bounds=UNIT, **without_defaults())
    off = WiskiGP(
        X, Y, grid_size=30, grid_bounds=UNIT, exact_prior_variance=False, **without_defaults()
    )
    for model in (on, off):
        model.covar_module.lengthscale = 0.03
    with exact_prior_variance(False):
        ski = on.posterior(Xs).variance
    torch.testing.assert_close(off.posterior(Xs).variance, ski, rtol=0, atol=0)
    assert (on.posterior(Xs).variance - 1.0).abs().max() < 1e-10
    with pytest.raises(TypeError, match="exact_prior_variance"):
        WiskiGP(X, Y, exact_prior_variance=1)
    with pytest.raises(TypeError, match="exact_prior_variance"):
        KissGP(X, Y, exact_prior_variance="yes")


# ------------------------------------------------------------------- WiskiGP oracle
@pytest.mark.parametrize("space", ["data", "grid"])
@pytest.mark.parametrize("fixed_noise", [False, True])
@pytest.mark.parametrize("matern", [False, True])
def test_wiski_equals_dense_ski_plus_the_diagonal(space, fixed_noise, matern):
    d = 2
    X, Y, Yvar = data(40, d, fixed_noise)
    options = {"data_space_limit": 0} if space == "grid" else {}
    model = WiskiGP(
        X,
        Y,
        Yvar,
        grid_size=16,
        covar_module=scaled_kernel(d, matern),
        **without_defaults(),
        **options,
    )
    if not fixed_noise:
        model.likelihood.noise = 0.04
    assert model.in_data_space == (space == "data")
    noise = None if Yvar is None else Yvar.squeeze(-1)
    oracle = DenseSKIModel(model, X, Y.squeeze(-1), noise, exact_prior_variance=True)
    Xs = torch.rand(3, 6, d, dtype=DTYPE)
    assert_matches(model, oracle, Xs)
    assert_matches(model, oracle, Xs[0], observation_noise=True)
    # The marginal likelihood is exact SKI's, whatever the switch.
    expected = DenseSKIModel(model, X, Y.squeeze(-1), noise).log_marginal_likelihood()
    assert abs(model.fit_objective()[0].item() - expected.item()) < 1e-8 * abs(expected.item())

    # Fantasies / conditioned models: SKI's conditioning, then the same diagonal.
    Xq = torch.rand(3, 2, d, dtype=DTYPE)
    Yq = torch.randn(4, 3, 2, 1, dtype=DTYPE)
    noise_q = None if not fixed_noise else torch.full((3, 2, 1), 0.02, dtype=DTYPE)
    conditioned = model.condition_on_observations(Xq, Yq, noise=noise_q)
    oracle_q = oracle.condition_on_observations(Xq, Yq, noise=noise_q)
    assert_matches(conditioned, oracle_q, torch.rand(4, 3, 5, d, dtype=DTYPE))

    # observe (in place) keeps applying it.
    model.observe(Xq[0], Yq[0, 0], None if noise_q is None else noise_q[0])
    X_all, Y_all = torch.cat([X, Xq[0]]), torch.cat([Y, Yq[0, 0]])
    noise_all = None if noise is None else torch.cat([noise, noise_q[0].squeeze(-1)])
    oracle = DenseSKIModel(model, X_all, Y_all.squeeze(-1), noise_all, exact_prior_variance=True)
    assert_matches(model, oracle, Xs)


def test_wiski_with_the_defaults_transforms_and_mean():
    X, Y, _ = data(30, 2, False)
    model = WiskiGP(X, 3 + 2 * Y, grid_size=16, input_transform=Normalize(2, bounds=UNIT))
    model.covar_module.lengthscale = 0.05
    Xs = torch.rand(8, 2, dtype=DTYPE)
    posterior = model.posterior(Xs)
    with exact_prior_variance(False):
        ski = model.posterior(Xs)
    # The diagonal is added in the latent (standardised) space: scaled by the stdv^2.
    gap = model.prior_variance_correction(Xs, model.interpolation.weights(Xs))
    stdv = model.outcome_transform.stdvs.squeeze()
    torch.testing.assert_close(
        posterior.variance.squeeze(-1) - ski.variance.squeeze(-1), stdv**2 * gap
    )
    torch.testing.assert_close(posterior.mean, ski.mean, rtol=0, atol=0)
    assert gap.min() > 1e-3  # lengthscale 1.35 grid spacings: a visible correction


def test_love_predictions_carry_the_same_diagonal_and_sample():
    X, Y, _ = data(40, 2, False)
    model = WiskiGP(
        X, Y, grid_size=16, covar_module=scaled_kernel(2), data_space_limit=0, **without_defaults()
    )
    model.likelihood.noise = 0.04
    model.observe(X[:5], Y[:5])
    Xs = torch.rand(2, 7, 2, dtype=DTYPE)
    gap = model.prior_variance_correction(Xs, model.interpolation.weights(Xs))
    with fast_pred_var():
        posterior = model.posterior(Xs)
        with exact_prior_variance(False):
            ski = model.posterior(Xs)
    covar = posterior.distribution.lazy_covariance_matrix
    assert isinstance(covar, LowRankRootAddedDiagLinearOperator)
    torch.testing.assert_close(posterior.variance.squeeze(-1) - ski.variance.squeeze(-1), gap)
    torch.testing.assert_close(
        posterior.covariance_matrix - ski.covariance_matrix, torch.diag_embed(gap)
    )
    # LOVE stays within its tolerance of the exact (corrected) variances.
    exact = model.posterior(Xs).variance
    assert (posterior.variance - exact).abs().max() < 1e-6
    # Joint samples draw rank + t base samples, and observation noise adds to the diagonal.
    with fast_pred_var():
        samples = posterior.rsample(torch.Size([64]))
        noisy = model.posterior(Xs, observation_noise=True)
    assert samples.shape == (64, 2, 7, 1)
    torch.testing.assert_close(noisy.variance - posterior.variance, 0.04 * torch.ones_like(exact))


def test_multi_output_models_share_the_diagonal():
    X, Y, _ = data(30, 2, False)
    Y2 = torch.cat([Y, -Y], -1)
    model = WiskiGP(X, Y2, grid_size=16, covar_module=scaled_kernel(2), **without_defaults())
    Xs = torch.rand(3, 5, 2, dtype=DTYPE)
    posterior = model.posterior(Xs)
    with exact_prior_variance(False):
        ski = model.posterior(Xs)
    gap = model.prior_variance_correction(Xs, model.interpolation.weights(Xs))
    torch.testing.assert_close(posterior.variance - ski.variance, gap.unsqueeze(-1).expand(3, 5, 2))
    fantasy = model.condition_on_observations(Xs[:, :2], torch.randn(3, 2, 2, dtype=DTYPE))
    assert fantasy.posterior(Xs).variance.shape == (3, 5, 2)


def test_variance_is_differentiable_in_the_inputs():
    X, Y, _ = data(30, 2, False)
    model = WiskiGP(X, Y, grid_size=16, covar_module=scaled_kernel(2), **without_defaults())
    x = torch.tensor([[0.413, 0.627]], dtype=DTYPE, requires_grad=True)
    model.posterior(x).variance.sum().backward()
    step = 1e-6
    numeric = []
    for i in range(2):
        shift = torch.zeros(1, 2, dtype=DTYPE)
        shift[0, i] = step
        up = model.posterior(x.detach() + shift).variance.sum()
        down = model.posterior(x.detach() - shift).variance.sum()
        numeric.append((up - down) / (2 * step))
    torch.testing.assert_close(x.grad.squeeze(0), torch.stack(numeric), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("space", ["data", "grid"])
def test_large_grid_path_carries_it_on_its_lanczos_root(monkeypatch, space):
    monkeypatch.setattr(WiskiGP, "MAX_DENSE_GRID", 300)  # 7^3 grids take the structured path
    X, Y, _ = data(60, 3, False)
    kernel = scaled_kernel(3, lengthscale=0.2)
    options = {"data_space_limit": 0} if space == "grid" else {}
    model = WiskiGP(X, Y, grid_size=7, covar_module=kernel, **without_defaults(), **options)
    model.likelihood.noise = 0.04
    model.love_tolerance = 1e-10
    assert model.structured
    model.observe(X[:4], Y[:4])
    X_all, Y_all = torch.cat([X, X[:4]]), torch.cat([Y, Y[:4]])
    oracle = DenseSKIModel(model, X_all, Y_all.squeeze(-1), None, exact_prior_variance=True)
    Xs = torch.rand(10, 3, dtype=DTYPE)
    posterior = model.posterior(Xs)
    mean, covar = oracle.latent(Xs)
    if space == "grid":  # the rank-k LOVE root, and the diagonal
        covar_op = posterior.distribution.lazy_covariance_matrix
        assert isinstance(covar_op, LowRankRootAddedDiagLinearOperator)
    assert (posterior.mean.squeeze(-1) - mean).abs().max() < 1e-8
    assert (posterior.covariance_matrix - covar).abs().max() < 1e-8
    Xq, Yq = torch.rand(2, 2, 3, dtype=DTYPE), torch.randn(2, 2, 1, dtype=DTYPE)
    conditioned = model.condition_on_observations(Xq, Yq).posterior(Xs)
    _, covar_q = oracle.condition_on_observations(Xq, Yq).latent(Xs)
    assert (conditioned.covariance_matrix - covar_q).abs().max() < 1e-8


# -------------------------------------------------------------------- other models
def test_kissgp_equals_dense_ski_plus_the_diagonal():
    X, Y, _ = data(40, 2, False)
    model = KissGP(X, Y, grid_size=16, covar_module=scaled_kernel(2), **without_defaults())
    model.likelihood.noise = 0.04
    view = SimpleNamespace(
        covar_module=model.base_kernel,
        interpolation=model.interpolation,
        likelihood=model.likelihood,
        noise_variance=model.noise_variance,
    )
    oracle = DenseSKIModel(view, X, Y.squeeze(-1), None, exact_prior_variance=True)
    Xs = torch.rand(3, 6, 2, dtype=DTYPE)
    assert_matches(model, oracle, Xs)
    Xq, Yq = torch.rand(3, 2, 2, dtype=DTYPE), torch.randn(4, 3, 2, 1, dtype=DTYPE)
    conditioned = model.condition_on_observations(Xq, Yq)
    assert_matches(conditioned, oracle.condition_on_observations(Xq, Yq), Xs.unsqueeze(0))
    with fast_pred_var():  # LOVE: the same diagonal on its root
        love = model.posterior(Xs).variance.squeeze(-1)
    assert rel_err(love, oracle.latent(Xs)[1].diagonal(dim1=-2, dim2=-1)) < 1e-6


@pytest.mark.parametrize("top_k", [None, 6])
def test_online_softki_equals_dense_softki_plus_the_diagonal(top_k):
    bounds = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=DTYPE)
    X, Y, _ = data(60, 3, False)
    Z = torch.rand(24, 3, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    likelihood = GaussianLikelihood(noise_constraint=GreaterThan(1e-12)).to(DTYPE)
    likelihood.noise = 0.01
    model = OnlineSoftKIGP(
        X,
        Y,
        likelihood=likelihood,
        covar_module=scaled_kernel(3, lengthscale=0.3),
        input_transform=Normalize(3, bounds=bounds),
        inducing_points=Z,
        temperature=0.15,
        top_k=top_k,
        pretrain_epochs=0,
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    oracle = DenseSKIModel(model, X, Y.squeeze(-1), None, exact_prior_variance=True)
    Xs = torch.rand(2, 6, 3, dtype=DTYPE)
    assert_matches(model, oracle, Xs)
    # SoftKI's prior variance is well short of k(x, x) (softmax weights average K_zz).
    gap = model.prior_variance_correction(Xs, model.interpolation.weights(Xs))
    assert gap.max() > 0.05
    Xq, Yq = torch.rand(2, 2, 3, dtype=DTYPE), torch.randn(3, 2, 2, 1, dtype=DTYPE)
    conditioned = model.condition_on_observations(Xq, Yq)
    assert_matches(conditioned, oracle.condition_on_observations(Xq, Yq), Xs.unsqueeze(0))


def additive_oracle(model, X, y, noise, Xs):
    """Dense additive SKI: sum_g W_g K_g W_g^T (no 1/G scaling, no jitter), plus the gap."""

    def ski(A, B):
        total = 0.0
        interpolation = model.interpolation
        for part, kernel, group, points in zip(
            interpolation.parts,
            model.covar_module.kernels,
            interpolation.groups,
            interpolation.group_points(),
            strict=True,
        ):
            W_a = part.weights(A[..., group]).to_dense()
            W_b = part.weights(B[..., group]).to_dense()
            total = total + W_a @ kernel(points).to_dense() @ W_b.mT
        return total

    K = ski(X, X) + torch.diag(noise)
    K_s = ski(Xs, X)
    mean = K_s @ torch.linalg.solve(K, y)
    prior = ski(Xs, Xs)
    covar = prior - K_s @ torch.linalg.solve(K, K_s.mT)
    return mean, covar + prior_variance_gap(model.covar_module, Xs, prior)


@pytest.mark.parametrize("fixed_noise", [False, True])
@pytest.mark.parametrize(
    "groups",
    # (singleton groups of one size: the prior variance from 4 x 4 blocks of each K_g)
    [[[0], [1, 2], [3]], "singletons"],
    ids=["mixed groups", "singletons"],
)
def test_additive_wiski_equals_dense_additive_ski_plus_the_diagonal(fixed_noise, groups):
    X, Y, Yvar = data(40, 4, fixed_noise)
    model = AdditiveWiskiGP(X, Y, Yvar, groups=groups, grid_size=12, **without_defaults())
    for i, part in enumerate(model.covar_module.kernels):
        part.base_kernel.lengthscale = torch.full_like(part.base_kernel.lengthscale, 0.1 + 0.05 * i)
        part.outputscale = torch.tensor(0.2 + 0.1 * i, dtype=DTYPE)
    if not fixed_noise:
        model.likelihood.noise = 0.01
    noise = model.noise_variance.expand(40) if Yvar is None else Yvar.squeeze(-1)
    Xs = torch.rand(7, 4, dtype=DTYPE)
    posterior = model.posterior(Xs)
    mean, covar = additive_oracle(model, X, Y.squeeze(-1), noise.detach(), Xs)
    assert rel_err(posterior.mean.squeeze(-1), mean) < TOL
    assert rel_err(posterior.covariance_matrix, covar) < TOL
    assert rel_err(posterior.variance.squeeze(-1), covar.diagonal()) < TOL
    gap = model.prior_variance_correction(Xs, model.interpolation.weights(Xs))
    assert gap.max() > 1e-3


# ---------------------------------------------------------------- the shared module
def test_correction_is_zero_at_grid_points_and_never_negative():
    from streamgp.interpolation.grid import CubicGridInterpolation

    interpolation = CubicGridInterpolation(UNIT, 20)
    kernel = scaled_kernel(2, lengthscale=0.05)
    root = grid_kernel_root(kernel, interpolation.grid)
    correction = PriorVarianceCorrection(kernel, root, UNIT[:1])
    grid = interpolation.grid_points()
    inside = grid[((grid >= 0) & (grid <= 1)).all(-1)]
    on_grid = correction(inside, interpolation.weights(inside))
    assert on_grid.abs().max() < 1e-9  # cubic weights are one-hot there
    Xs = torch.rand(500, 2, dtype=DTYPE)
    gap = correction(Xs, interpolation.weights(Xs))
    assert gap.min() >= 0 and gap.max() > 0.01


def test_state_dict_is_unchanged_and_the_flag_survives_a_load():
    X, Y, _ = data(20, 2, False)
    on = WiskiGP(X, Y, grid_size=12)
    off = WiskiGP(X, Y, grid_size=12, exact_prior_variance=False)
    assert on.state_dict().keys() == off.state_dict().keys()
    off.load_state_dict(on.state_dict())
    assert off.exact_prior_variance is False and on.exact_prior_variance is True
    Xs = torch.rand(5, 2, dtype=DTYPE)
    with exact_prior_variance(False):
        torch.testing.assert_close(on.posterior(Xs).variance, off.posterior(Xs).variance)
