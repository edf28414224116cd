r"""Conditioned models as views: ``condition_on_observations`` without copies.

BoTorch's ``fantasize`` and look-ahead acquisition functions (qKG, qNIPV) condition a
model on hypothetical observations many times per optimisation step. streamgp's models
return a *view* of themselves (:func:`shallow_view`): a new object sharing every tensor
and module, holding the conditioning data (or a low-rank correction built from them)
on top. The helpers here are the pieces the models share: the default noise of the
conditioning rows, the accumulated conditioning data of models that condition their
joint predictive (:func:`append_conditioning`, :func:`condition_joint`) and the batch
shape such data imply.

References:

.. [Maddox2021] W. J. Maddox, S. Stanton, A. G. Wilson. Conditioning Sparse
    Variational Gaussian Processes for Online Decision-making. Advances in Neural
    Information Processing Systems 34, 2021.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from streamgp.linalg.variational import condition_on_noisy_observations
from streamgp.models.utils.transforms import transform_new_data
from streamgp.utils.validation import check_conditioning_data

#: Transformed conditioning inputs ``batch x q x d``, targets ``batch x q`` and noise
#: variances ``batch x q``.
Conditioning = tuple[Tensor, Tensor, Tensor]


def shallow_view(model: torch.nn.Module) -> Any:
    r"""A new model object sharing ``model``'s tensors and modules (no copies).

    The models replace their state tensors rather than writing into them, so a view
    (e.g. a conditioned model) is unaffected by later in-place updates of its parent;
    the instance dictionaries (module and buffer registries, caches) are copied.
    """
    new = model.__class__.__new__(model.__class__)
    new.__dict__ = {
        key: value.copy() if isinstance(value, dict) else value
        for key, value in model.__dict__.items()
    }
    return new


def conditioning_noise(noise: Tensor | None, model: Any, X: Tensor) -> Tensor:
    r"""Noise variances ``batch x q`` of conditioning rows at ``batch x q x d`` inputs ``X``.

    ``noise`` as BoTorch passes it (``batch x q x 1``, outcome-transformed space), or
    ``model.noise_variance`` (detached) at every row.
    """
    if noise is None:
        noise = model.noise_variance
        return (noise.detach() if noise.requires_grad else noise).expand(X.shape[:-1])
    return noise.squeeze(-1)


def append_conditioning(
    previous: Conditioning | None, X_t: Tensor, y: Tensor, noise: Tensor
) -> Conditioning:
    r"""``previous`` conditioning data followed by ``(X_t, y, noise)``, broadcast to one batch."""
    if previous is None:
        return X_t, y, noise
    X_old, y_old, noise_old = previous
    batch = torch.broadcast_shapes(X_old.shape[:-2], y_old.shape[:-1], X_t.shape[:-2], y.shape[:-1])
    X_t = torch.cat(
        [X_old.expand(*batch, *X_old.shape[-2:]), X_t.expand(*batch, *X_t.shape[-2:])], -2
    )
    y = torch.cat([y_old.expand(*batch, -1), y.expand(*batch, -1)], -1)
    noise = torch.cat([noise_old.expand(*batch, -1), noise.expand(*batch, -1)], -1)
    return X_t, y, noise


def conditioning_batch_shape(conditioning: Conditioning | None) -> torch.Size:
    r"""The batch shape of a model conditioned on ``conditioning`` (none: ``[]``)."""
    if conditioning is None:
        return torch.Size([])
    X_c, y_c, _ = conditioning
    return torch.broadcast_shapes(X_c.shape[:-2], y_c.shape[:-1])


def condition_joint(
    joint: Callable[[Tensor], tuple[Tensor, Tensor]], conditioning: Conditioning, X_t: Tensor
) -> MultivariateNormal:
    r"""The Gaussian update, on ``conditioning``, of a joint predictive at ``X_t``.

    Args:
        joint: Maps ``batch x (q + t) x d`` inputs to the mean and covariance of the
            (variational) predictive of ``f`` there.
        conditioning: The conditioning data ``(X_c, y_c, noise_c)``.
        X_t: ``batch x t x d`` transformed test inputs.

    Returns:
        The conditioned predictive at ``X_t`` (differentiable in ``X_t`` and ``X_c``).
    """
    X_c, y_c, noise_c = conditioning
    batch = torch.broadcast_shapes(X_c.shape[:-2], X_t.shape[:-2])
    joint_X = torch.cat(
        [X_c.expand(*batch, *X_c.shape[-2:]), X_t.expand(*batch, *X_t.shape[-2:])], dim=-2
    )
    mean, covar = joint(joint_X)
    mean, covar = condition_on_noisy_observations(mean, covar, X_c.shape[-2], y_c, noise_c)
    covar = covar.expand(*mean.shape, X_t.shape[-2])
    return MultivariateNormal(mean, DenseLinearOperator(covar))


def correction_batch_shape(correction: Any | None) -> torch.Size:
    r"""The batch shape of a model holding a low-rank conditioning ``correction`` (none: ``[]``).

    ``correction`` is a :class:`~streamgp.linalg.woodbury.LowRankCorrection` (or None).
    """
    if correction is None:
        return torch.Size([])
    return correction.gamma.shape[:-1]


class JointConditioningMixin:
    r"""``condition_on_observations`` for models that condition their joint predictive.

    The conditioned model is a view (:func:`shallow_view`) holding the accumulated
    conditioning data; its ``forward`` applies the exact Gaussian update of the model's
    joint (variational) predictive on them (:func:`condition_joint`, online variational
    conditioning, [Maddox2021]_), so BoTorch's ``fantasize`` and look-ahead acquisition
    functions work without optimisation. Gaussian likelihood only; the model provides
    ``is_gaussian``, ``_check_inputs`` and a ``_conditioning`` attribute.
    """

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> Any:
        r"""A new model (a view) conditioned on ``(X, Y)``.

        Args:
            X: ``batch_shape x q x d`` inputs (original space).
            Y: ``sample_shape x batch_shape x q x 1`` targets (original space).
            noise: Optional ``batch_shape x q x 1`` noise variances (outcome-transformed
                space); default: the likelihood's noise level.

        Returns:
            A model of the same class with batch shape
            ``sample_shape + broadcast(batch, model.batch)``.
        """
        if not self.is_gaussian:
            raise NotImplementedError(
                "Closed-form conditioning (condition_on_observations / fantasize) needs a "
                f"GaussianLikelihood; this model uses {type(self.likelihood).__name__}. "
                "Use observe() to update it."
            )
        self._check_inputs(X, "X")
        check_conditioning_data(X, Y, noise, like=X, dim=X.shape[-1])
        X_t, Y_t, _ = transform_new_data(self, X, Y)
        noise_q = conditioning_noise(noise, self, X)
        new = shallow_view(self)
        new._conditioning = append_conditioning(self._conditioning, X_t, Y_t.squeeze(-1), noise_q)
        return new
