"""The per-datum objective against gpytorch's own ExactMarginalLogLikelihood."""

from __future__ import annotations

import torch
from botorch.models import SingleTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.mlls.objective import per_datum_objective


def test_each_hyperprior_is_counted_once_as_in_gpytorch():
    # The mll lists its likelihood's priors twice (as its own and as its model's): a
    # second noise prior made every streamgp fit differ from SingleTaskGP's objective.
    torch.manual_seed(0)
    X = torch.rand(25, 2, dtype=torch.float64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = SingleTaskGP(X, Y, outcome_transform=None)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    assert len(list(mll.named_priors())) > len(list(model.named_priors()))  # the duplicate
    model.train()
    output = model(*model.train_inputs)
    expected = mll(output, model.train_targets)
    log_likelihood = model.likelihood(output).log_prob(model.train_targets)
    value = per_datum_objective(mll, log_likelihood, len(X))
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)
