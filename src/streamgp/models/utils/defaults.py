r"""BoTorch's ``SingleTaskGP`` kernel and likelihood as the defaults of streamgp models."""

from __future__ import annotations

from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor


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
