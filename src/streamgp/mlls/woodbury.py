r"""Exact SKI marginal log likelihood from grid-space sufficient statistics.

For a :class:`~streamgp.models.WiskiGP`, ``log p(y | theta)`` of the SKI model
``y ~ N(0, W K_UU W^T + Lambda)`` depends on the data only through
``A = W^T Lambda^{-1} W``, ``b = W^T Lambda^{-1} y``, ``c = y^T Lambda^{-1} y``, ``n``
and ``sum(log Lambda)`` (Stanton et al., AISTATS 2021, eq. 13, in the root form of
:mod:`streamgp.linalg.woodbury`). Each evaluation costs ``O(m^3)`` whatever ``n``
is, so hyperparameters can be refit, or stepped once per streamed observation, at
constant cost.
"""

from __future__ import annotations

from typing import Any

from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor

from streamgp.linalg.grid_kernel import grid_kernel_root
from streamgp.linalg.woodbury import log_marginal_likelihood


class WoodburyMarginalLogLikelihood(MarginalLogLikelihood):
    r"""Exact SKI marginal log likelihood of a ``WiskiGP``, divided by ``n``.

    Like gpytorch's ``ExactMarginalLogLikelihood``, the value includes the log
    densities of the hyperparameter priors and is divided by the number of
    observations, so learning rates transfer. Works with
    :func:`botorch.fit.fit_gpytorch_mll` (through ``compute_custom_loss``) and with
    plain torch optimizers: ``loss = -mll(); loss.backward()``.

    Args:
        likelihood: The model's likelihood.
        model: A :class:`~streamgp.models.WiskiGP`.

    Example:
        >>> mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
        >>> fit_gpytorch_mll(mll)
    """

    def __init__(self, likelihood: Any, model: Any) -> None:
        super().__init__(likelihood, model)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        r"""Evaluate the MLL; positional arguments (output, targets) are ignored."""
        model = self.model
        A, b, c, n, sum_log_noise = model.weighted_statistics()
        if A.is_sparse:
            raise ValueError(
                f"The marginal likelihood needs a dense grid (at most {model.MAX_DENSE_GRID} "
                f"points); this model's grid has {A.shape[-1]}. Fit the hyperparameters on a "
                "coarser grid and copy them."
            )
        L_K = grid_kernel_root(model.covar_module, model.interpolation.grid)
        res = log_marginal_likelihood(L_K, A, b, c, n, sum_log_noise)
        for _, module, prior, closure, _ in self.named_priors():
            res = res + prior.log_prob(closure(module)).sum()
        return res / n.clamp_min(1.0)

    def compute_custom_loss(self, **kwargs: Any) -> Tensor:
        r"""Negative MLL, the loss BoTorch's fitting routines minimise."""
        return -self.forward()
