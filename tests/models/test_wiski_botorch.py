"""WiskiGP in client code written for SingleTaskGP: BoTorch's closed-loop tutorial pattern."""

from __future__ import annotations

import torch
from botorch.acquisition.logei import qLogExpectedImprovement, qLogNoisyExpectedImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.optim.closures import get_loss_closure
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood
from oracles import rel_err

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood

DTYPE = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=DTYPE)


def _problem(X):
    objective = -(X - 0.4).square().sum(-1, keepdim=True) + 0.05 * torch.randn(len(X), 1)
    constraint = X.sum(-1, keepdim=True) - 1.5  # feasible when <= 0
    return objective.to(DTYPE), constraint


def _model(X, Y, state_dict=None) -> ModelListGP:
    models = [
        WiskiGP(
            X,
            Y[:, i : i + 1],
            grid_size=8,
            input_transform=Normalize(3, bounds=BOUNDS),
            outcome_transform=Standardize(1),
        )
        for i in range(Y.shape[-1])
    ]
    model = ModelListGP(*models)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


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


def test_closed_loop_tutorial_pattern_with_a_model_list():
    torch.manual_seed(0)
    X = torch.rand(10, 3, dtype=DTYPE)
    Y = torch.cat(_problem(X), dim=-1)
    state_dict = None
    objective = GenericMCObjective(lambda Z, X=None: Z[..., 0])
    constraints = [lambda Z: Z[..., 1]]
    for _ in range(3):
        model = _model(X, Y, state_dict)
        if state_dict is not None:  # the warm start kept every observation
            assert all(m.num_train == len(X) for m in model.models)
        fit_gpytorch_mll(SumMarginalLogLikelihood(model.likelihood, model))
        sampler = SobolQMCNormalSampler(torch.Size([32]))
        feasible = (Y[:, 1] <= 0).any()
        best = Y[Y[:, 1] <= 0, 0].max() if feasible else Y[:, 0].min()
        acqfs = [
            qLogExpectedImprovement(
                model, best, sampler, objective=objective, constraints=constraints
            ),
            qLogNoisyExpectedImprovement(
                model, X, sampler, objective=objective, constraints=constraints
            ),
        ]
        candidates = []
        for acqf in acqfs:
            new_X, value = optimize_acqf(acqf, BOUNDS, q=2, num_restarts=2, raw_samples=32)
            assert new_X.shape == (2, 3) and torch.isfinite(value)
            candidates.append(new_X)
        new_X = torch.cat(candidates)
        X, Y = torch.cat([X, new_X]), torch.cat([Y, torch.cat(_problem(new_X), dim=-1)])
        state_dict = model.state_dict()
    # The list's joint posterior is the two models' posteriors, output by output.
    Xs = torch.rand(2, 4, 3, dtype=DTYPE)
    post = model.posterior(Xs)
    for i, sub in enumerate(model.models):
        single = sub.posterior(Xs)
        assert rel_err(post.mean[..., i], single.mean[..., 0]) < 1e-12
        assert rel_err(post.variance[..., i], single.variance[..., 0]) < 1e-12
    # Fantasies through the list (what qKG / qNIPV do) keep one batch per fantasy.
    fantasy = model.fantasize(Xs[0, :2], SobolQMCNormalSampler(torch.Size([3])))
    assert fantasy.posterior(Xs[0]).mean.shape == (3, 4, 2)
