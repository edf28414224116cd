r"""Exact SKI marginal log likelihood from grid-space sufficient statistics.

For a :class:`~streamgp.models.WiskiGP`, ``log p(y | theta)`` of the SKI model
``y ~ N(0, W K_UU W^T + Lambda)`` depends on the data only through
``A = W^T Lambda^{-1} W``, ``b = W^T Lambda^{-1} y``, ``c = y^T Lambda^{-1} y``, ``n``
and ``sum(log Lambda)`` (Stanton et al., AISTATS 2021, eq. 13, in the root form of
:mod:`streamgp.linalg.woodbury`). Each evaluation costs ``O(m^3)`` whatever ``n``
is, so hyperparameters can be refit, or stepped once per streamed observation, at
constant cost. While the model is in data space (``n`` at most its
``data_space_limit``), the same value comes from the ``n x n`` SKI kernel matrix in
``O(n^3)`` (:mod:`streamgp.linalg.data_space`), which is cheaper there.
"""

from __future__ import annotations

from typing import Any

from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor

from streamgp.mlls.objective import per_datum_objective


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
        >>> import torch
        >>> from botorch.fit import fit_gpytorch_mll
        >>> from streamgp.models import WiskiGP
        >>> X = torch.rand(50, 2, dtype=torch.float64)
        >>> model = WiskiGP(X, torch.sin(6 * X).sum(-1, keepdim=True), grid_size=10)
        >>> mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
        >>> mll = fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 20}})
        >>> mll.training
        False
    """

    def __init__(self, likelihood: Any, model: Any) -> None:
        super().__init__(likelihood, model)

    def forward(self, *args: Any, statistics: Any | None = None, **kwargs: Any) -> Tensor:
        r"""Evaluate the MLL; positional arguments (output, targets) are ignored.

        Args:
            statistics: Optional statistics to evaluate instead of the model's own
                (e.g. ``model.statistics.add(...)`` with differentiable new rows, as in
                the WISKI paper's eq. 18); default: every observation of the model.
        """
        return ski_marginal_log_likelihood(self, statistics)

    def compute_custom_loss(self, **kwargs: Any) -> Tensor:
        r"""Negative MLL, the loss BoTorch's fitting routines minimise."""
        return -self.forward()


def ski_marginal_log_likelihood(
    mll: MarginalLogLikelihood, statistics: Any | None = None
) -> Tensor:
    r"""The exact SKI marginal log likelihood of ``mll.model`` (a ``WiskiGP``), per datum.

    The log likelihood from the statistics, plus the log densities of the priors
    registered on ``mll`` and the modules it holds, divided by ``n``, as gpytorch's
    ``ExactMarginalLogLikelihood`` normalises.

    Args:
        mll: A marginal likelihood module whose ``model`` is a ``WiskiGP``.
        statistics: Optional statistics to evaluate instead of the model's own
            (default: every observation, conditioning included).
    """
    model = mll.model
    if statistics is None:
        value, n = model.fit_objective()
    else:
        value = statistics.log_marginal_likelihood(
            model.kernel_root(), model.noise_variance, tol=model._likelihood_tolerance(statistics)
        )
        value, n = value.sum(), statistics.n  # summed over a multi-output model's outputs
    return per_datum_objective(mll, value, n)
