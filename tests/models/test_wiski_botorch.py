"""WiskiGP in client code written for SingleTaskGP (the closed-loop pattern for every model is in
test_botorch_entry_points.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models.transforms import Normalize, Standardize
from botorch.optim.closures import get_loss_closure
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.means import ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from oracles import rel_err

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood

DTYPE = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=DTYPE)


def _problem(X):
    objective = -(X - 0.4).square().sum(-1, keepdim=True) + 0.05 * torch.randn(len(X), 1)
    constraint = X.sum(-1, keepdim=True) - 1.5  # feasible when <= 0
    return objective.to(DTYPE), constraint


def test_exact_marginal_log_likelihood_fits_the_woodbury_objective():
    X = torch.rand(20, 3, dtype=DTYPE)
    model = WiskiGP(X, _problem(X)[0], grid_size=8, input_transform=Normalize(3, bounds=BOUNDS))
    exact = ExactMarginalLogLikelihood(model.likelihood, model)
    woodbury = WoodburyMarginalLogLikelihood(model.likelihood, model)
    # BoTorch's own loss closure for an ExactMarginalLogLikelihood is WISKI's objective.
    assert torch.allclose(get_loss_closure(exact)(), -woodbury(), rtol=1e-12)
    before = woodbury().item()
    fit_gpytorch_mll(exact)
    assert woodbury().item() > before


@pytest.mark.parametrize("data_space_limit", [None, 0])
def test_restandardize_equals_a_model_standardised_on_all_data(data_space_limit):
    """Statistics are affine in y and W 1 = 1: re-standardising from them is exact."""
    X = torch.rand(45, 3, dtype=DTYPE)
    Y = 3.0 + 2.0 * _problem(X)[0]
    # Zero prior mean: restandardize changes only it (a constant mean is carried over).
    options = {"grid_size": 8, "input_transform": Normalize(3, bounds=BOUNDS)}
    options["mean_module"] = ZeroMean()
    if data_space_limit is not None:
        options["data_space_limit"] = data_space_limit
    covar = ScaleKernel(RBFKernel(ard_num_dims=3)).to(DTYPE)
    covar.outputscale = 1.7
    model = WiskiGP(X[:5], Y[:5], covar_module=covar, outcome_transform=Standardize(1), **options)
    model.likelihood.noise = 0.05
    model.observe(X[5:], Y[5:])
    model.restandardize()
    options["input_transform"] = Normalize(3, bounds=BOUNDS)
    fresh = WiskiGP(
        X,
        Y,
        covar_module=copy.deepcopy(model.covar_module),
        outcome_transform=Standardize(1),
        **options,
    )
    fresh.likelihood.noise = model.likelihood.noise.detach()
    for name in ("means", "stdvs"):
        expected = getattr(fresh.outcome_transform, name)
        assert rel_err(getattr(model.outcome_transform, name), expected) < 1e-12
    Xs = torch.rand(6, 3, dtype=DTYPE)
    p, ref = model.posterior(Xs), fresh.posterior(Xs)
    assert rel_err(p.mean, ref.mean) < 1e-10
    assert rel_err(p.variance, ref.variance) < 1e-10
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    assert rel_err(mll(), WoodburyMarginalLogLikelihood(fresh.likelihood, fresh)()) < 1e-10


def test_restandardize_refuses_what_it_cannot_do_exactly():
    X = torch.rand(10, 3, dtype=DTYPE)
    Y = _problem(X)[0]
    with pytest.raises(ValueError, match="Standardize"):
        WiskiGP(
            X, Y, grid_size=8, input_transform=Normalize(3, bounds=BOUNDS), outcome_transform=None
        ).restandardize()
    fixed = WiskiGP(
        X,
        Y,
        torch.full_like(Y, 0.01),
        grid_size=8,
        input_transform=Normalize(3, bounds=BOUNDS),
        outcome_transform=Standardize(1),
    )
    with pytest.raises(ValueError, match="learned noise"):
        fixed.restandardize()


def test_posterior_moves_to_the_grid_earlier_for_kernels_without_kronecker_features():
    """Dense features cost O(4^d m) per test point in data space too: only the O(m^3)
    refit is weighed against n^2 (sqrt(m^3 / PREDICTIONS_PER_REFIT) = 85 for 30 x 30)."""
    from gpytorch.kernels import MaternKernel

    from streamgp.linalg.data_space import DataPosterior
    from streamgp.linalg.woodbury import GridPosterior

    torch.manual_seed(0)
    X = torch.rand(100, 2, dtype=torch.float64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    kinds = {}
    for n in (60, 100):
        for name, kernel in (("matern", MaternKernel(nu=0.5)), ("rbf", None)):
            model = WiskiGP(X[:n], Y[:n], grid_size=30, covar_module=kernel)
            assert model.in_data_space
            kinds[name, n] = type(model.exact_posterior())
    assert kinds["matern", 60] is DataPosterior and kinds["matern", 100] is GridPosterior
    assert kinds["rbf", 60] is DataPosterior and kinds["rbf", 100] is DataPosterior  # 151
