r"""Plumbing shared by the streaming models: frozen transforms, posterior assembly, views.

A streaming model sees its data once. Its transforms are therefore fitted on the data
given to the constructor and frozen; every later batch (``observe``,
``condition_on_observations``) passes through the frozen transforms. With
``Standardize`` this keeps the first batch's mean and scale for the whole stream,
which is what BoTorch's own ``condition_on_observations`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import (
    DenseLinearOperator,
    DiagLinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from streamgp.linalg.posterior_covariance import PosteriorCovariance


@contextmanager
def eval_mode(module: torch.nn.Module | None):
    r"""Temporarily put ``module`` (may be None) in eval mode."""
    if module is None:
        yield
        return
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def fit_frozen_transforms(
    model: torch.nn.Module,
    train_X: Tensor,
    train_Y: Tensor,
    input_transform: InputTransform | None,
    outcome_transform: OutcomeTransform | None,
    train_Yvar: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    r"""Fit the transforms on ``(train_X, train_Y)``, attach them to ``model``, freeze them.

    Returns:
        The transformed ``(train_X, train_Y, train_Yvar)``.
    """
    tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
    if input_transform is not None:
        input_transform.to(**tkwargs)
        with torch.no_grad():
            train_X = input_transform(train_X) if len(train_X) else train_X
        input_transform.eval()
        model.input_transform = input_transform
    if outcome_transform is not None:
        outcome_transform.to(**tkwargs)
        if len(train_Y):
            train_Y, train_Yvar = outcome_transform(train_Y, train_Yvar, X=train_X)
        outcome_transform.eval()
        model.outcome_transform = outcome_transform
    return train_X, train_Y, train_Yvar


def transform_new_data(
    model: torch.nn.Module, X: Tensor, Y: Tensor | None = None, Yvar: Tensor | None = None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    r"""Pass new data through ``model``'s frozen input and outcome transforms."""
    input_tf = getattr(model, "input_transform", None)
    outcome_tf = getattr(model, "outcome_transform", None)
    with eval_mode(input_tf), eval_mode(outcome_tf):
        X_t = input_tf(X) if input_tf is not None else X
        if Y is not None and outcome_tf is not None:
            Y, Yvar = outcome_tf(Y, Yvar, X=X_t)
    return X_t, Y, Yvar


def assemble_posterior(
    model: torch.nn.Module,
    mvn: MultivariateNormal,
    X_t: Tensor,
    observation_noise: bool | Tensor,
    noise_variance: Callable[[], Tensor],
    posterior_transform: Any | None = None,
) -> GPyTorchPosterior:
    r"""The BoTorch posterior of a latent ``mvn`` at transformed inputs ``X_t``.

    Adds observation noise (``noise_variance()`` when ``observation_noise`` is True,
    or the given ``batch x q x 1`` tensor, in the outcome-transformed space), then
    untransforms with ``model``'s outcome transform and applies ``posterior_transform``.
    A low-rank ``RootLinearOperator`` covariance (LOVE) keeps its structure
    (:func:`assemble_root_posterior`).
    """
    if isinstance(mvn.lazy_covariance_matrix, RootLinearOperator):
        return assemble_root_posterior(
            model, mvn, X_t, observation_noise, noise_variance, posterior_transform
        )
    noise = _observation_noise(observation_noise, noise_variance, mvn.mean.shape)
    outcome_tf = getattr(model, "outcome_transform", None)
    covar = mvn.lazy_covariance_matrix
    if isinstance(covar, PosteriorCovariance) and (
        outcome_tf is None or type(outcome_tf) is Standardize
    ):
        # Keep the factors: variances stay O(t) per factor column (no t x t matrix).
        mean = mvn.mean
        if noise is not None:
            covar = covar.with_noise(noise)
        if outcome_tf is not None:
            scale = outcome_tf.stdvs.reshape(())
            mean = outcome_tf.means.reshape(()) + scale * mean
            covar = covar.scaled(scale.square())
        return _untransform(MultivariateNormal(mean, covar), X_t, None, posterior_transform)
    if noise is not None:
        covar = mvn.covariance_matrix + torch.diag_embed(noise)
        mvn = MultivariateNormal(mvn.mean, DenseLinearOperator(covar))
    return _untransform(mvn, X_t, getattr(model, "outcome_transform", None), posterior_transform)


def _observation_noise(
    observation_noise: bool | Tensor, noise_variance: Callable[[], Tensor], shape: torch.Size
) -> Tensor | None:
    """The noise variances to add at the ``shape`` test points, or ``None`` for none."""
    if isinstance(observation_noise, Tensor):
        return observation_noise.squeeze(-1).expand(shape)
    if observation_noise:
        return noise_variance().expand(shape)
    return None


def _untransform(
    mvn: MultivariateNormal,
    X_t: Tensor,
    outcome_tf: OutcomeTransform | None,
    posterior_transform: Any | None,
) -> GPyTorchPosterior:
    posterior = GPyTorchPosterior(distribution=mvn)
    if outcome_tf is not None:
        posterior = outcome_tf.untransform_posterior(posterior, X=X_t)
    if posterior_transform is not None:
        return posterior_transform(posterior=posterior, X=X_t)
    return posterior


def assemble_root_posterior(
    model: torch.nn.Module,
    mvn: MultivariateNormal,
    X_t: Tensor,
    observation_noise: bool | Tensor,
    noise_variance: Callable[[], Tensor],
    posterior_transform: Any | None = None,
) -> GPyTorchPosterior:
    r"""Like :func:`assemble_posterior`, for an ``mvn`` whose covariance is a low-rank root.

    Keeps the covariance as ``root root^T (+ diag(noise))`` so that variances stay
    ``O(k)`` and BoTorch's samplers draw ``k``-dimensional base samples (LOVE). A
    ``Standardize`` outcome transform scales the root itself, because its generic
    untransform would wrap the root in a product operator and lose that structure.
    """
    mean, root = mvn.mean, mvn.lazy_covariance_matrix.root.to_dense()
    noise = _observation_noise(observation_noise, noise_variance, mean.shape)
    outcome_tf = getattr(model, "outcome_transform", None)
    if type(outcome_tf) is Standardize:
        scale = outcome_tf.stdvs.reshape(())
        mean = outcome_tf.means.reshape(()) + scale * mean
        root = scale * root
        noise = None if noise is None else noise * scale.square()
        outcome_tf = None
    if noise is None:
        covar = RootLinearOperator(root)
    else:
        covar = LowRankRootAddedDiagLinearOperator(
            LowRankRootLinearOperator(root), DiagLinearOperator(noise)
        )
    return _untransform(MultivariateNormal(mean, covar), X_t, outcome_tf, posterior_transform)


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
