"""WiskiGP in client code written for SingleTaskGP (the closed-loop pattern for every model is in
test_botorch_entry_points.py)."""

from __future__ import annotations

import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models.transforms import Normalize
from botorch.optim.closures import get_loss_closure
from gpytorch.mlls import ExactMarginalLogLikelihood

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
