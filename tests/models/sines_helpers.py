"""Shared test helpers: the sweep's 2-D problem, a brief fit and its test RMSE.

Used by the variational models' tests of a converged model (``observe`` after a fit,
warm starts): targets around 100 with a standard deviation near 10, so a model that is
knocked off its fit shows it in the RMSE.
"""

from __future__ import annotations

import torch
from botorch.fit import fit_gpytorch_mll
from gpytorch.mlls import ExactMarginalLogLikelihood

DT = torch.float64


def sines(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points of the sweep's 2-D problem."""
    X = torch.rand(n, 2, dtype=DT, generator=torch.Generator().manual_seed(seed))
    return X, 100 + 10 * torch.sin(8 * X).sum(-1, keepdim=True)


def fit_briefly(model) -> None:
    """fit_gpytorch_mll, capped (a fast test; the fit is near its optimum)."""
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 40}})


def held_out_rmse(model) -> float:
    """The model's RMSE on 100 fixed test points of the problem."""
    X, Y = sines(100, seed=1)
    with torch.no_grad():
        return (model.posterior(X).mean - Y).pow(2).mean().sqrt().item()
