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

import math
from typing import Any

import torch
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.utils.types import DEFAULT, _DefaultType
from gpytorch.constraints import Interval
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
    "target_unit",
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


def target_unit(train_Y: Tensor) -> Tensor:
    r"""The power of ten nearest the targets' standard deviation (one for fewer than two
    targets, or targets that are all equal or not finite).

    The unit in which a model parametrises what gradient steps move, so that the steps
    are relative to the targets (``in_target_units(..., parametrise=True)``,
    :class:`~streamgp.models.DecoupledSVGP`). A decimal unit, as a person would pick
    one: targets of order one (standard deviation from 0.32 to 3.2) have unit one and
    keep the unit-scale parametrisation exactly; ``1e12 Y`` takes the same relative
    steps as ``Y``.

    Args:
        train_Y: ``n x 1`` targets, as the model sees them.

    Returns:
        A scalar tensor of ``train_Y``'s dtype and device.

    Example:
        >>> import torch
        >>> target_unit(torch.tensor([[0.0], [2.0]])), target_unit(torch.tensor([[0.0], [2e3]]))
        (tensor(1.), tensor(1000.))
    """
    std = _target_variance(train_Y).sqrt()
    return torch.full_like(std, 10.0) ** std.log10().round()


def _target_variance(train_Y: Tensor) -> Tensor:
    r"""The targets' variance (one where :func:`target_unit` says so)."""
    y = train_Y.detach().reshape(-1)
    if len(y) < 2 or not bool(torch.isfinite(y).all()):
        return y.new_ones(())
    variance = y.var()
    return variance if variance > 0 else y.new_ones(())


class TargetUnits(Interval):
    r"""A parameter constraint whose raw value is in the targets' units.

    ``value = offset + scale * t(raw)``, with ``t(raw)`` the value the unit-scale
    constraint it replaces gives (a positive parameter's lower bound plus the softplus of
    ``raw``), or ``raw`` itself for an unconstrained parameter. The raw value of a model
    trained on targets ``s Y + c`` then follows the same path under gradient steps as on
    ``Y``: Adam's steps, of a fixed size in the raw value, are relative to the targets'
    scale. ``scale`` and
    ``offset`` are buffers, saved with the parameter in ``state_dict()``.

    Args:
        scale: Positive scalar: the targets' variance for a variance (outputscale,
            noise), their standard deviation for a level.
        offset: Scalar added to the value (the targets' mean for a constant mean).
        unit: The unit-scale constraint whose transform and lower bound (times
            ``scale``) are kept, or None for an unconstrained parameter.

    Example:
        >>> import torch
        >>> from gpytorch.constraints import GreaterThan
        >>> noise = TargetUnits(torch.tensor(1e6), unit=GreaterThan(1e-4))
        >>> raw = torch.tensor(0.0)
        >>> bool(torch.isclose(noise.transform(raw), 1e6 * GreaterThan(1e-4).transform(raw)))
        True
    """

    def __init__(
        self, scale: Tensor, offset: Tensor | float = 0.0, unit: Interval | None = None
    ) -> None:
        scale = torch.as_tensor(scale).detach().clone()
        offset = torch.as_tensor(offset).detach().to(scale).clone()
        if unit is None:
            unit_lower, transform, inverse = scale.new_zeros(()), _identity, _identity
            lower = -math.inf
        else:
            unit_lower = unit.lower_bound.detach().to(scale).clone()
            transform, inverse = unit._transform, unit._inv_transform
            lower = offset + scale * unit_lower
        super().__init__(lower, math.inf, transform=transform, inv_transform=inverse)
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)
        self.register_buffer("unit_lower", unit_lower)

    def transform(self, tensor: Tensor) -> Tensor:
        return self.offset + self.scale * (self.unit_lower + self._transform(tensor))

    def inverse_transform(self, transformed_tensor: Tensor) -> Tensor:
        unit_value = (transformed_tensor - self.offset) / self.scale
        return self._inv_transform(unit_value - self.unit_lower)


def _identity(tensor: Tensor) -> Tensor:
    return tensor


def in_target_units(
    train_Y: Tensor,
    *,
    mean_module: Mean | None = None,
    covar_module: Kernel | None = None,
    likelihood: Any | None = None,
    parametrise: bool = False,
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

    With ``parametrise=True`` the modules are instead parametrised in the targets' unit
    ``u`` (:func:`target_unit`, a power of ten): :class:`TargetUnits` constraints on their
    raw parameters, which keep their unit-scale values, make the constant the targets'
    mean plus ``u`` times the raw value, and the outputscale and the noise ``u^2`` times
    their unit-scale values. A model trained by gradient steps (SVDGP) then takes the
    same relative steps on ``10^k Y + c`` as on ``Y`` (with scaled initial values alone
    a step of Adam's size on a raw outputscale of order ``10^{2k}`` moves nothing), and
    is unchanged on targets of order one (``u = 1``) but for its constant's start.

    Args:
        train_Y: ``n x 1`` targets, as the model sees them.
        mean_module: A default ``ConstantMean``, or None.
        covar_module: A default kernel (its outputscale is scaled if it is a
            ``ScaleKernel``), or None.
        likelihood: A default ``GaussianLikelihood``, or None.
        parametrise: Parametrise the modules in the targets' units (see above), not
            only start them there.

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
    if parametrise:
        _parametrise_in_target_units(y, target_unit(train_Y), mean_module, covar_module, likelihood)
        return
    variance = _target_variance(train_Y)
    with torch.no_grad():
        if isinstance(mean_module, ConstantMean):
            mean_module.constant = y.mean().to(mean_module.constant)
        if isinstance(covar_module, ScaleKernel):
            covar_module.outputscale = covar_module.outputscale * variance
        if isinstance(likelihood, GaussianLikelihood):
            likelihood.noise = likelihood.noise * variance


def _parametrise_in_target_units(
    y: Tensor, unit: Tensor, mean_module: Any, covar_module: Any, likelihood: Any
) -> None:
    r""":func:`in_target_units` with ``parametrise=True``: the raw parameters keep their
    (unit-scale) values, and constraints in the targets' units give them their meaning."""
    unit = unit.to(y)
    # (A constant with a constraint of its own is the caller's: left as it is.)
    if isinstance(mean_module, ConstantMean) and not hasattr(
        mean_module, "raw_constant_constraint"
    ):
        level = TargetUnits(unit, offset=y.mean())
        mean_module.register_constraint("raw_constant", level.to(y))
    if isinstance(covar_module, ScaleKernel):
        unit_constraint = covar_module.raw_outputscale_constraint
        scaled = TargetUnits(unit.square(), unit=unit_constraint).to(y)
        covar_module.register_constraint("raw_outputscale", scaled)
    if isinstance(likelihood, GaussianLikelihood):
        unit_constraint = likelihood.noise_covar.raw_noise_constraint
        scaled = TargetUnits(unit.square(), unit=unit_constraint).to(y)
        likelihood.noise_covar.register_constraint("raw_noise", scaled)
