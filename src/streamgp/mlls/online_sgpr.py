r"""The collapsed streaming SGPR bound of an :class:`~streamgp.models.OnlineSGPR` as a loss.

Bui, Nguyen & Turner (NeurIPS 2017), eq. 11: for a new batch ``(X, Y)`` and new
inducing inputs, the bound combines the Titsias bound of the batch with the model's
summary of all earlier data (:func:`streamgp.linalg.sparse_gp.streaming_collapsed_bound`).
Its cost depends on the batch size and the number of inducing points, never on the
number of observations seen before, so hyperparameters can be stepped once per batch
at constant cost. ``OnlineSGPR.observe`` runs ``steps_per_batch`` Adam steps on it;
this module lets any torch optimizer (or schedule) do the same.
"""

from __future__ import annotations

from typing import Any

from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor

from streamgp.linalg.sparse_gp import match_points
from streamgp.utils.validation import check_targets, check_tensor


class OnlineSGPRBound(MarginalLogLikelihood):
    r"""Online collapsed bound of an ``OnlineSGPR`` on a new batch, per observation.

    The value is ``(F + log hyperprior) / (n_seen + q)``, where ``F`` approximates the
    log evidence of all data (the ones summarised by the model plus the batch), so
    learning rates transfer across stream lengths as with gpytorch's MLLs. Gradients
    flow to the kernel and likelihood hyperparameters and to ``inducing_points`` if
    it requires grad. Evaluating it does not change the model.

    Args:
        likelihood: The model's likelihood.
        model: An :class:`~streamgp.models.OnlineSGPR`.

    Example:
        >>> import torch
        >>> from streamgp.models import OnlineSGPR
        >>> X = torch.rand(40, 2, dtype=torch.float64)
        >>> model = OnlineSGPR(X, torch.sin(6 * X).sum(-1, keepdim=True), num_inducing=16)
        >>> X_new = torch.rand(10, 2, dtype=torch.float64)
        >>> Y_new = torch.sin(6 * X_new).sum(-1, keepdim=True)
        >>> mll = OnlineSGPRBound(model.likelihood, model)
        >>> optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        >>> for _ in range(10):
        ...     optimizer.zero_grad()
        ...     (-mll(X_new, Y_new)).backward()
        ...     optimizer.step()
        >>> model = model.observe(X_new, Y_new)
        >>> int(model.num_observed)
        50
    """

    def __init__(self, likelihood: Any, model: Any) -> None:
        super().__init__(likelihood, model)

    def forward(self, X: Tensor, Y: Tensor, inducing_points: Tensor | None = None) -> Tensor:
        r"""Evaluate the bound on a new batch.

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (original space).
            inducing_points: ``M' x d`` new inducing inputs (transformed space);
                default: the model's current ones.
        """
        model = self.model
        model._check_inputs(X, "X")
        if X.dim() != 2:
            raise ValueError(f"X must have shape q x d, got {tuple(X.shape)}.")
        check_targets(check_tensor(Y, "Y", like=model.pseudo_eta, min_dim=2), "Y", len(X))
        current = model.inducing_points
        if inducing_points is None:
            inducing_points = current
        else:
            check_tensor(
                inducing_points,
                "inducing_points",
                like=current,
                min_dim=2,
                last_dim=current.shape[-1],
            )
        X_t, Y_t = model._transform_new_data(X, Y)
        shared = match_points(inducing_points.detach(), current)
        return -model._loss(X_t, Y_t.squeeze(-1), inducing_points, shared)
