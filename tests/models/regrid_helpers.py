"""Shared pieces of the re-grid oracle tests (WiskiGP, KissGP): data, models, oracles.

The oracle of a re-grid is a model of the same class built at once from all the data on
the new grid, with the same frozen transforms and hyperparameters.
"""

from __future__ import annotations

import copy

import pytest
import torch
from botorch.models.transforms.input import Normalize

DT = torch.float64


def regrid_cases(test):
    """The re-grid oracle cases: one or two outputs, learned or fixed noise, data or grid
    space (every re-grid and refinement test runs on all of them)."""
    for mark in (  # applied as stacked decorators are, bottom first
        pytest.mark.parametrize("space", ["data", "grid"]),
        pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"]),
        pytest.mark.parametrize("outputs", [1, 2], ids=["one-output", "two-outputs"]),
    ):
        test = mark(test)
    return test


def regrid_data(n: int, outputs: int = 1, seed: int = 0):
    """Raw inputs in [2, 5]^2 (``Normalize(2)`` learns them), targets and noise variances."""
    generator = torch.Generator().manual_seed(seed)
    X = 2.0 + 3.0 * torch.rand(n, 2, generator=generator, dtype=DT)
    Y = torch.sin(2 * X).sum(-1, keepdim=True) + torch.arange(outputs, dtype=DT)
    Yvar = 0.01 + 0.02 * torch.rand(n, 1, generator=generator, dtype=DT).expand(n, outputs)
    return X, Y, Yvar


def normalized_model(cls, X, Y, Yvar, fixed_noise: bool, **options):
    """``cls`` on ``Normalize(2)`` without bounds, no outcome transform, and hyperparameters
    away from their initial values (so that a comparison means something). Several
    outputs share their hyperparameters (the mode with a data space)."""
    if Y.shape[-1] > 1:
        options = {"shared_hyperparameters": True, **options}
    model = cls(
        X,
        Y,
        Yvar if fixed_noise else None,
        input_transform=Normalize(2),
        outcome_transform=None,
        **options,
    )
    kernel = getattr(model, "base_kernel", model.covar_module)
    kernel.lengthscale = torch.tensor([[0.3, 0.5]], dtype=DT)
    model.mean_module.constant = torch.full_like(model.mean_module.constant, 0.4)
    if not fixed_noise:
        model.likelihood.noise = torch.tensor([0.02], dtype=DT)
    return model


def oracle_on_the_grid(model, X, Y, Yvar, **options):
    """All data at once on ``model``'s grid, with its frozen transforms and hyperparameters."""
    if Y.shape[-1] > 1:
        options = {"shared_hyperparameters": True, **options}
    oracle = type(model)(
        X,
        Y,
        Yvar if model.fixed_noise else None,
        input_transform=copy.deepcopy(model.input_transform),  # eval mode: stays frozen
        outcome_transform=None,
        grid_bounds=model.interpolation.bounds.clone(),
        grid_size=model.interpolation.grid_size,
        **options,
    )
    oracle.load_state_dict(model.state_dict())  # hyperparameters (a warm start)
    return oracle


def assert_same_posterior(model, oracle, X_test, tol: float = 1e-10) -> None:
    """Posterior mean, variance and noisy variance of ``model`` and ``oracle`` agree."""
    with torch.no_grad():
        a, b = model.posterior(X_test), oracle.posterior(X_test)
        assert torch.allclose(a.mean, b.mean, atol=tol, rtol=0)
        assert torch.allclose(a.variance, b.variance, atol=tol, rtol=0)
        a = model.posterior(X_test, observation_noise=True)
        b = oracle.posterior(X_test, observation_noise=True)
        assert torch.allclose(a.variance, b.variance, atol=tol, rtol=0)


def assert_equal_to_oracle_and_streams_on(
    model, oracle, X_test, next_batch, fixed_noise, tol=1e-10
):
    """``model`` equals ``oracle`` (posterior and the marginal likelihood ``fit_gpytorch_mll``
    maximises), and still does after both observe ``next_batch`` ``(X, Y, Yvar)``."""
    assert_same_posterior(model, oracle, X_test, tol)
    assert torch.allclose(model.fit_objective()[0], oracle.fit_objective()[0], atol=1e-8, rtol=0)
    X_next, Y_next, Yvar_next = next_batch
    model.observe(X_next, Y_next, Yvar_next if fixed_noise else None)
    oracle.observe(X_next, Y_next, Yvar_next if fixed_noise else None)
    assert_same_posterior(model, oracle, X_test, tol)
