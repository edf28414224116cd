r"""The normalisation every streamgp fitting objective shares with gpytorch's MLLs."""

from __future__ import annotations

import torch
from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor


def per_datum_objective(mll: MarginalLogLikelihood, value: Tensor, n: Tensor | int) -> Tensor:
    r"""``(value + log hyperprior) / n``, as gpytorch's ``ExactMarginalLogLikelihood``.

    Args:
        mll: The marginal likelihood module; the priors registered on it and on the
            modules it holds (the model, the likelihood) are added once each.
        value: The model's log marginal likelihood or bound, summed over observations;
            one per member for a batch of models (``batch``), each of which then gets
            the log densities of its own hyperparameters (gpytorch's convention for
            batched models; BoTorch's fit sums the members' objectives).
        n: The number of observations (clamped below at 1, so an empty model's
            objective is its log hyperprior).
    """
    seen: set[tuple[int, int]] = set()
    for _, module, prior, closure, _ in mll.named_priors():
        # The likelihood is listed twice (the mll's and its model's): count each once.
        if (id(module), id(prior)) in seen:
            continue
        seen.add((id(module), id(prior)))
        log_prob = prior.log_prob(closure(module))
        if value.dim() == 0:
            value = value + log_prob.sum()
        else:
            value = value + log_prob.reshape(*log_prob.shape[: value.dim()], -1).sum(-1)
    return value / torch.as_tensor(n, dtype=value.dtype, device=value.device).clamp_min(1.0)
