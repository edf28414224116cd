r"""BoTorch's ``SingleTaskGP`` defaults, shared by every streamgp model.

A BoTorch user swaps the class and keeps the line: ``SingleTaskGP(X, Y)`` becomes
``WiskiGP(X, Y)``. So every model takes ``SingleTaskGP``'s defaults (BoTorch >= 0.12):

- ``outcome_transform`` defaults to ``Standardize(m=num_outputs)`` fitted on the
  constructor's data (``train_Yvar`` is scaled with it); ``outcome_transform=None``
  means no transform. BoTorch's ``DEFAULT`` sentinel marks the default, as in
  ``SingleTaskGP``'s signature.
- ``mean_module=None`` is a learned ``ConstantMean``; pass ``ZeroMean()`` for a zero
  prior mean.
- The kernel is an RBF with ARD lengthscales and dimension-scaled priors, and the
  likelihood Gaussian with a log-normal noise prior.

Without these, a model on raw targets (say ``100 + 10 sin(x)``) predicts about zero away
from its data, and nothing warns.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.utils.types import DEFAULT, _DefaultType
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, Mean
from torch import Tensor

__all__ = [
    "DEFAULT",
    "_DefaultType",
    "in_target_units",
    "kernel_and_likelihood_or_defaults",
    "mean_module_or_default",
    "outcome_transform_or_default",
]


def outcome_transform_or_default(
    outcome_transform: OutcomeTransform | _DefaultType | None, train_Y: Tensor
) -> OutcomeTransform | None:
    r"""The given outcome transform, or ``SingleTaskGP``'s default ``Standardize``.

    Args:
        outcome_transform: A transform, None (no transform), or ``DEFAULT``.
        train_Y: ``... x n x m`` training targets. With no rows there is nothing to fit
            a standardisation on, so ``DEFAULT`` then means no transform.

    Returns:
        ``Standardize(m=train_Y.shape[-1], batch_shape=train_Y.shape[:-2])`` for
        ``DEFAULT`` (and at least one row), else ``outcome_transform`` itself.

    Example:
        >>> import torch
        >>> Y = torch.rand(5, 2)
        >>> outcome_transform_or_default(DEFAULT, Y)
        Standardize()
        >>> outcome_transform_or_default(None, Y) is None
        True
    """
    if not isinstance(outcome_transform, _DefaultType):
        return outcome_transform
    if train_Y.shape[-2] == 0:
        return None
    return Standardize(m=train_Y.shape[-1], batch_shape=train_Y.shape[:-2])


def mean_module_or_default(mean_module: Mean | None, like: Tensor) -> Mean:
    r"""The given prior mean, or ``SingleTaskGP``'s learned ``ConstantMean``.

    Args:
        mean_module: A gpytorch mean, or None for a learned constant.
        like: A tensor whose dtype and device the mean is moved to.

    Example:
        >>> import torch
        >>> mean_module_or_default(None, torch.zeros(1))
        ConstantMean()
    """
    mean_module = ConstantMean() if mean_module is None else mean_module
    return mean_module.to(dtype=like.dtype, device=like.device)


def kernel_and_likelihood_or_defaults(
    covar_module: Kernel | None, likelihood: GaussianLikelihood | None, like: Tensor
) -> tuple[Kernel, GaussianLikelihood]:
    r"""The given kernel and likelihood, or BoTorch's ``SingleTaskGP`` defaults for them.

    The defaults are an RBF kernel with ARD lengthscales and dimension-scaled priors
    and a Gaussian likelihood with a log-normal noise prior.

    Args:
        covar_module: A kernel, or None for the default over ``like.shape[-1]`` inputs.
        likelihood: A Gaussian likelihood, or None for the default.
        like: ``n x d`` training inputs, whose dtype and device the modules are moved to.

    Returns:
        The kernel and the likelihood, on ``like``'s dtype and device.
    """
    tkwargs = {"dtype": like.dtype, "device": like.device}
    if covar_module is None:
        covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=like.shape[-1])
    if likelihood is None:
        likelihood = get_gaussian_likelihood_with_lognormal_prior()
    return covar_module.to(**tkwargs), likelihood.to(**tkwargs)


def in_target_units(
    train_Y: Tensor,
    *,
    mean_module: Mean | None = None,
    covar_module: Kernel | None = None,
    likelihood: Any | None = None,
) -> None:
    r"""Start default modules in the targets' units when nothing standardises them.

    With ``Standardize`` (the default) a model sees targets of mean 0 and variance 1,
    which is what its default modules' initial values (a zero constant, an outputscale
    and a noise of order one) are for. With ``outcome_transform=None`` the targets may be
    ``Y + 100`` or ``1e12 Y``, far from every initial value; a model trained by a few
    Adam steps (O-SVGP, SVDGP) then never gets there and silently predicts the wrong
    level or scale. This gives such a model the same starting point in the targets' own
    units: the constant at their mean, the outputscale and the noise times their
    variance; all stay learned. Pass only the modules the model created itself: the
    caller's own are left as given.

    Args:
        train_Y: ``n x 1`` targets, as the model sees them.
        mean_module: A default ``ConstantMean``, or None.
        covar_module: A default kernel (its outputscale is scaled if it is a
            ``ScaleKernel``), or None.
        likelihood: A default ``GaussianLikelihood``, or None.

    Example:
        >>> import torch
        >>> from gpytorch.kernels import RBFKernel, ScaleKernel
        >>> Y = 1e6 * torch.randn(50, 1, dtype=torch.float64) + 100
        >>> mean, kernel = ConstantMean().double(), ScaleKernel(RBFKernel()).double()
        >>> in_target_units(Y, mean_module=mean, covar_module=kernel)
        >>> bool(torch.isclose(mean.constant, Y.mean()))
        True
    """
    y = train_Y.detach().reshape(-1)
    if len(y) == 0 or not bool(torch.isfinite(y).all()):
        return
    variance = y.var() if len(y) > 1 else y.new_ones(())
    if not variance > 0:
        variance = y.new_ones(())
    with torch.no_grad():
        if isinstance(mean_module, ConstantMean):
            mean_module.constant = y.mean().to(mean_module.constant)
        if isinstance(covar_module, ScaleKernel):
            covar_module.outputscale = covar_module.outputscale * variance
        if isinstance(likelihood, GaussianLikelihood):
            likelihood.noise = likelihood.noise * variance
