"""AdditiveWiskiGP against dense additive SKI and an exact GP with the same additive kernel."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP
from botorch.models.transforms.input import Normalize
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood

from streamgp import AdditiveWiskiGP
from streamgp.models.additive_wiski import (
    AdditiveGridInterpolation,
    check_groups,
    default_group_grid_sizes,
)

DT = torch.float64


def _data(n: int, d: int = 4, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    X = 0.05 + 0.9 * torch.rand(n, d, generator=generator, dtype=DT)
    Y = torch.sin(3 * X).sum(-1, keepdim=True) + 0.5 * X[:, :1] * X[:, 1:2]
    return X, Y


def _model(X, Y, Yvar=None, **options) -> AdditiveWiskiGP:
    model = AdditiveWiskiGP(X, Y, Yvar, outcome_transform=None, **options)
    for i, part in enumerate(model.covar_module.kernels):
        part.base_kernel.lengthscale = torch.full_like(part.base_kernel.lengthscale, 0.3 + 0.1 * i)
        part.outputscale = torch.tensor(0.2 + 0.1 * i, dtype=DT)
    model.mean_module.constant = torch.tensor(0.3, dtype=DT)
    if Yvar is None:
        model.likelihood.noise = torch.tensor([0.01], dtype=DT)
    model.eval()
    return model


def _dense_ski_kernel(model: AdditiveWiskiGP, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """sum_g W_g(A) K_g W_g(B)^T, each group on its own grid (no 1/G scaling, no jitter)."""
    interpolation = model.interpolation
    total = 0.0
    for part, kernel, group, points in zip(
        interpolation.parts,
        model.covar_module.kernels,
        interpolation.groups,
        interpolation.group_points(),
        strict=True,
    ):
        W_a = part.weights(A[:, group]).to_dense()
        W_b = part.weights(B[:, group]).to_dense()
        total = total + W_a @ kernel(points).to_dense() @ W_b.T
    return total


def _dense_posterior(kernel, X, y, noise, X_test, mean):
    K = kernel(X, X) + torch.diag(noise)
    K_s = kernel(X_test, X)
    solve = torch.linalg.solve(K, torch.cat([(y - mean).unsqueeze(-1), K_s.T], -1))
    mu = mean + K_s @ solve[:, 0]
    cov = kernel(X_test, X_test) - K_s @ solve[:, 1:]
    residual = y - mean
    mll = -0.5 * (
        residual @ torch.linalg.solve(K, residual)
        + torch.linalg.slogdet(K)[1]
        + len(y) * math.log(2 * math.pi)
    )
    return mu, cov, mll


#: Where the rows live: grid sums from the start, rows throughout (data space), or rows
#: for the constructor's 40 and grid sums once ``observe`` passes the limit.
SPACES = {"grid": (0, False), "data": (10_000, True), "switch": (41, False)}


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("space", sorted(SPACES))
@pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"])
@pytest.mark.parametrize("groups", ["singletons", "pairs", [[0, 2], [1], [3, 0, 1]]])
def test_equals_dense_additive_ski(groups, fixed_noise, space):
    X, Y = _data(40)
    Yvar = 0.005 + 0.01 * torch.rand(40, 1, dtype=DT) if fixed_noise else None
    limit, in_data_space = SPACES[space]
    model = _model(X, Y, Yvar, groups=groups, grid_size=10, data_space_limit=limit)
    assert model.in_data_space is (limit >= 40)
    X_new, Y_new = _data(3, seed=1)
    Yvar_new = None if Yvar is None else torch.full((3, 1), 0.01, dtype=DT)
    model.observe(X_new, Y_new, Yvar_new)
    assert model.in_data_space is in_data_space
    X_all, y_all = torch.cat([X, X_new]), torch.cat([Y, Y_new]).squeeze(-1)
    if fixed_noise:
        noise = torch.cat([Yvar, Yvar_new]).squeeze(-1)
    else:
        noise = model.likelihood.noise.detach().expand(len(y_all))
    X_test = _data(6, seed=2)[0]

    def kernel(A, B):
        return _dense_ski_kernel(model, A, B)

    with torch.no_grad():
        mu, cov, mll = _dense_posterior(kernel, X_all, y_all, noise, X_test, 0.3)
        posterior = model.posterior(X_test)
        assert torch.allclose(posterior.mean.squeeze(-1), mu, atol=1e-8, rtol=0)
        assert torch.allclose(posterior.covariance_matrix, cov, atol=1e-8, rtol=0)
        assert torch.allclose(model.fit_objective()[0], mll, atol=1e-7, rtol=0)
        # A fantasy (rank-q conditioning) is the dense posterior with the extra rows.
        X_f, Y_f = _data(2, seed=3)
        fantasy = model.condition_on_observations(X_f, Y_f, noise=torch.full((2, 1), 0.02).to(X))
        noise_f = torch.cat([noise, torch.full((2,), 0.02, dtype=DT)])
        mu_f, cov_f, _ = _dense_posterior(
            kernel, torch.cat([X_all, X_f]), torch.cat([y_all, Y_f[:, 0]]), noise_f, X_test, 0.3
        )
        post_f = fantasy.posterior(X_test)
        assert torch.allclose(post_f.mean.squeeze(-1), mu_f, atol=1e-8, rtol=0)
        assert torch.allclose(post_f.covariance_matrix, cov_f, atol=1e-8, rtol=0)


def test_fine_grids_equal_the_exact_gp_with_the_same_additive_kernel():
    X, Y = _data(30)
    model = _model(X, Y, grid_size=400)
    X_test = _data(5, seed=2)[0]

    def kernel(A, B):
        return model.covar_module(A, B).to_dense()

    noise = model.likelihood.noise.detach().expand(30)
    with torch.no_grad():
        mu, cov, _ = _dense_posterior(kernel, X, Y.squeeze(-1), noise, X_test, 0.3)
        posterior = model.posterior(X_test)
        assert torch.allclose(posterior.mean.squeeze(-1), mu, atol=1e-5, rtol=0)
        assert torch.allclose(posterior.variance.squeeze(-1), cov.diagonal(), atol=1e-5, rtol=0)


def test_botorch_plumbing_fit_model_list_fixed_noise_normalize_and_checkpoints():
    X, Y = _data(40, d=6)
    X = 10 * X - 5  # raw inputs in [-4.5, 4.5]: Normalize(6) without bounds learns them
    Yvar = torch.full_like(Y, 0.01)
    models = [
        AdditiveWiskiGP(X, Y, Yvar, input_transform=Normalize(6)),
        AdditiveWiskiGP(X, -Y, Yvar, input_transform=Normalize(6), groups="pairs", grid_size=8),
    ]
    model_list = ModelListGP(*models)
    fit_gpytorch_mll(SumMarginalLogLikelihood(model_list.likelihood, model_list))
    single = AdditiveWiskiGP(X, Y)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(single.likelihood, single))
    X_test = 10 * _data(50, d=6, seed=4)[0] - 5
    Y_test = torch.sin(3 * (X_test + 5) / 10).sum(-1, keepdim=True)
    with torch.no_grad():
        posterior = model_list.posterior(X_test)
        assert posterior.mean.shape == (50, 2)
        rmse = (single.posterior(X_test).mean - Y_test).square().mean().sqrt()
    assert rmse < 0.5 * Y_test.std()  # the learned constant mean and Standardize at work
    buffer = io.BytesIO()
    torch.save(models[0].checkpoint(), buffer)
    buffer.seek(0)
    restored = AdditiveWiskiGP(X[:5], Y[:5], Yvar[:5], input_transform=Normalize(6))
    restored.restore(torch.load(buffer, weights_only=True))
    with torch.no_grad():
        assert torch.equal(restored.posterior(X_test).mean, models[0].posterior(X_test).mean)


def test_restandardize_rescales_every_group_output_scale():
    X, Y = _data(30)
    model = AdditiveWiskiGP(X[:5], 10 * Y[:5] + 3)
    model.observe(X[5:], 10 * Y[5:] + 3)
    scales = [part.outputscale.item() for part in model.covar_module.kernels]
    old_std = model.outcome_transform.stdvs.item()
    model.restandardize()
    ratio = (old_std / model.outcome_transform.stdvs.item()) ** 2
    for part, before in zip(model.covar_module.kernels, scales, strict=True):
        assert part.outputscale.item() == pytest.approx(before * ratio)


def test_cost_per_point_is_sum_of_group_weights():
    X, Y = _data(20, d=10)
    model = AdditiveWiskiGP(X, Y)
    weights = model.interpolation.weights(X)
    assert weights.indices.shape[-1] == 10 * 4  # not 4^10
    assert model.interpolation.num_grid == 10 * 64
    assert torch.allclose(weights.values.sum(-1), torch.ones(20, dtype=DT))


@pytest.mark.parametrize(
    "dim,size", [(2, 64), (6, 64), (10, 64), (11, 58), (16, 40), (20, 32), (40, 32)]
)
def test_default_singleton_axes_share_a_grid_budget_beyond_ten_dimensions(dim, size):
    singletons = [[i] for i in range(dim)]
    assert default_group_grid_sizes(singletons) == [size] * dim
    X, Y = _data(8, d=dim)
    model = AdditiveWiskiGP(X, Y)
    assert model.interpolation.axis_sizes == [size] * dim
    assert model.interpolation.num_grid == size * dim
    # a re-grid keeps the sizes; user groups of other sizes keep their own defaults
    model = model.observe(X[:1] + 2.0, Y[:1])
    assert model.interpolation.axis_sizes == [size] * dim
    mixed = [[0, 1], *singletons[2:]]
    assert default_group_grid_sizes(mixed) == [16] + [64] * (dim - 2)


@pytest.mark.parametrize(
    "groups,match",
    [
        ([[0, 4]], r"distinct dimensions in \[0, 4\)"),
        ([[0, 0]], "distinct dimensions"),
        ([[0, 1, 2, 3]], "1 to 3 dimensions"),
        ([], "non-empty list"),
        ("triples", "'singletons', 'pairs'"),
        ([[0.5]], "must be ints"),
    ],
)
def test_bad_groups_are_refused(groups, match):
    X, Y = _data(10)
    with pytest.raises(ValueError, match=match):
        AdditiveWiskiGP(X, Y, groups=groups)


def test_bad_observations_leave_the_model_unchanged():
    X, Y = _data(20)
    model = AdditiveWiskiGP(X, Y, keep_data=False)  # refuses points outside its box
    before = {k: v.clone() for k, v in model.state_dict().items()}
    X_test = _data(4, seed=5)[0]
    mean = model.posterior(X_test).mean.detach()
    bad = torch.tensor([[0.5, float("nan"), 0.5, 0.5]], dtype=DT)
    with pytest.raises(ValueError, match="X contains NaN"):
        model.observe(bad, torch.ones(1, 1, dtype=DT))
    with pytest.raises(ValueError, match="outside grid_bounds"):
        model.observe(torch.full((1, 4), 3.0, dtype=DT), torch.ones(1, 1, dtype=DT))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(model.posterior(X_test).mean.detach(), mean)


@pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"])
def test_regrid_equals_a_model_built_on_all_data(fixed_noise):
    X, Y = _data(30)
    X = 2 + 3 * X  # raw inputs in [2, 5]^4: Normalize(4) learns them
    Yvar = torch.full_like(Y, 0.01) if fixed_noise else None
    model = _model(X, Y, Yvar, groups=[[0, 1], [2], [3]], input_transform=Normalize(4))
    X_out = torch.tensor([[1.0, 3.0, 3.0, 3.0], [4.0, 7.5, 3.0, 0.5]], dtype=DT)
    Y_out = torch.sin(X_out).sum(-1, keepdim=True)
    Yvar_out = None if Yvar is None else torch.full_like(Y_out, 0.02)
    before = model.interpolation.bounds.clone()
    model.observe(X_out, Y_out, Yvar_out)
    assert not torch.equal(model.interpolation.bounds, before)
    assert len(model.observations) == 32
    oracle = AdditiveWiskiGP(
        torch.cat([X, X_out]),
        torch.cat([Y, Y_out]),
        None if Yvar is None else torch.cat([Yvar, Yvar_out]),
        input_transform=copy.deepcopy(model.input_transform),  # eval mode: stays frozen
        outcome_transform=None,
        groups=[[0, 1], [2], [3]],
        grid_bounds=model.interpolation.bounds.clone(),
    )
    oracle.load_state_dict(model.state_dict())
    X_test = torch.tensor([[1.5, 3.0, 4.0, 1.0], [3.0, 7.0, 2.5, 4.5]], dtype=DT)
    with torch.no_grad():
        a, b = model.posterior(X_test), oracle.posterior(X_test)
        assert torch.allclose(a.mean, b.mean, atol=1e-10, rtol=0)
        assert torch.allclose(a.variance, b.variance, atol=1e-10, rtol=0)
        assert torch.allclose(model.fit_objective()[0], oracle.fit_objective()[0], atol=1e-8)
    # The checkpoint carries the grown grid.
    restored = AdditiveWiskiGP(
        X, Y, Yvar, groups=[[0, 1], [2], [3]], input_transform=Normalize(4), outcome_transform=None
    )
    restored.restore(model.checkpoint())
    with torch.no_grad():
        assert torch.equal(restored.posterior(X_test).mean, model.posterior(X_test).mean)


@pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"])
def test_a_fantasy_beyond_the_grids_equals_observing_it_and_leaves_the_model_alone(fixed_noise):
    # qKG / qNIPV candidates past the data's box under Normalize(4): conditioned on the
    # same data on grids grown over them, which is what observing them re-grids to.
    X, Y = _data(30)
    X = 2 + 3 * X
    Yvar = torch.full_like(Y, 0.01) if fixed_noise else None
    model = _model(X, Y, Yvar, groups=[[0, 1], [2], [3]], input_transform=Normalize(4))
    X_out = torch.tensor([[1.0, 3.0, 3.0, 3.0], [4.0, 7.5, 3.0, 0.5]], dtype=DT)
    Y_out = torch.sin(X_out).sum(-1, keepdim=True)
    # The fantasy rows' noise: given (fixed noise; no outcome transform here) or the
    # learned level (which observing them uses too).
    noise = torch.full_like(Y_out, 0.02) if fixed_noise else None
    X_test = torch.tensor([[1.5, 3.0, 4.0, 1.0], [3.0, 7.0, 2.5, 4.5]], dtype=DT)
    before = model.posterior(X_test)
    bounds = model.interpolation.bounds.clone()
    fantasy = model.condition_on_observations(X_out, Y_out, noise=noise)
    assert torch.equal(model.interpolation.bounds, bounds)
    after = model.posterior(X_test)
    assert torch.equal(after.mean, before.mean) and torch.equal(after.variance, before.variance)
    observed = copy.deepcopy(model)
    observed.observe(X_out, Y_out, noise)
    assert torch.equal(fantasy.interpolation.bounds, observed.interpolation.bounds)
    with torch.no_grad():
        a, b = fantasy.posterior(X_test), observed.posterior(X_test)
    assert torch.allclose(a.mean, b.mean, atol=1e-10, rtol=0)
    assert torch.allclose(a.variance, b.variance, atol=1e-10, rtol=0)


def test_small_n_is_kept_in_data_space_up_to_a_quarter_of_the_grid():
    # Data space is the same model (test_equals_dense_additive_ski), with a marginal
    # likelihood in O(n^2 m) instead of O(m^3): the default keeps rows up to m // 4.
    X, Y = _data(50, d=6)
    model = AdditiveWiskiGP(X, Y)  # six singleton groups of 64 points: m = 384
    assert model.interpolation.num_grid == 384 and model.data_space_limit == 96
    assert model.in_data_space
    grid = AdditiveWiskiGP(X, Y, data_space_limit=0)  # the same default hyperparameters
    assert not grid.in_data_space
    with torch.no_grad():
        a, b = (m.fit_objective()[0] for m in (model, grid))
    assert torch.allclose(a, b, rtol=1e-10, atol=0)
    X_more, Y_more = _data(50, d=6, seed=1)
    model.observe(X_more, Y_more)
    assert not model.in_data_space and model.num_train == 100
    with pytest.raises(ValueError, match="data_space_limit"):
        AdditiveWiskiGP(X, Y, data_space_limit=-1)


@pytest.mark.parametrize("groups", [[[0], [1], [2], [3]], [[3], [0], [2]]])
def test_singleton_rows_in_one_call_equal_the_per_group_rows(groups):
    # The default groups' rows come from one product grid's per-axis rows (no loop over
    # groups); they must be the loop's rows, values and gradients in X, bit for bit.
    bounds = torch.tensor([[-0.1] * 4, [1.2] * 4], dtype=DT)
    fast = AdditiveGridInterpolation(bounds, groups, 12)
    loop = AdditiveGridInterpolation(bounds, groups, 12)
    loop._singletons = None
    X = torch.rand(2, 5, 4, dtype=DT, requires_grad=True)
    rows = [interp.weights(X) for interp in (fast, loop)]
    assert torch.equal(rows[0].indices, rows[1].indices)
    assert torch.equal(rows[0].values, rows[1].values)
    grads = [torch.autograd.grad(r.values.square().sum(), X)[0] for r in rows]
    assert torch.equal(grads[0], grads[1])


def test_check_groups_pairs():
    assert check_groups("singletons", 3) == [[0], [1], [2]]
    assert len(check_groups("pairs", 10)) == 45


def test_fixed_noise_is_per_row_as_in_single_task_gp():
    """WiskiGP's fixed-noise semantics carry over: likelihood.noise is train_Yvar, a fantasy
    has its own likelihood (the parent's rows, then their mean), and train_inputs are kept."""
    X, Y = _data(20)
    Yvar = 0.01 + 0.02 * torch.rand(20, 1, dtype=DT)
    model = _model(X, Y, Yvar)
    assert torch.equal(model.likelihood.noise, Yvar.squeeze(-1))
    assert torch.equal(model.train_inputs[0], X) and torch.equal(model.train_targets, Y[:, 0])
    X_f = 0.2 + 0.6 * torch.rand(2, 4, dtype=DT)
    fantasy = model.fantasize(X_f, SobolQMCNormalSampler(sample_shape=torch.Size([3])))
    assert fantasy.likelihood is not model.likelihood
    noise = fantasy.likelihood.noise
    assert noise.shape == (3, 22) and torch.equal(model.likelihood.noise, Yvar.squeeze(-1))
    assert torch.equal(noise[:, 20:], Yvar.mean().expand(3, 2))
    assert torch.allclose(fantasy.train_inputs[0][:, 20:], X_f.expand(3, -1, -1))
