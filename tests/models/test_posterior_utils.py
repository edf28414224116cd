"""The assembled posterior's distribution (``streamgp.models.utils.posterior``)."""

import warnings

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator

from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.models.utils.posterior import FactoredMultivariateNormal

DTYPE = torch.float64


def test_factored_variances_are_gpytorchs_without_the_host_read():
    torch.manual_seed(0)
    root = torch.randn(2, 5, 4, dtype=DTYPE)
    negative = 0.5 * root[..., :2]
    diagonal = torch.rand(2, 5, dtype=DTYPE)
    diagonal[0, 0] = -(root[0, 0] ** 2).sum() + (negative[0, 0] ** 2).sum()  # variance 0
    covar = PosteriorCovariance((root,), (negative,), diagonal)
    mean = torch.zeros(2, 5, dtype=DTYPE)
    factored = FactoredMultivariateNormal(mean, covar)
    dense = MultivariateNormal(mean, DenseLinearOperator(covar.to_dense()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gpytorch warns of the floored variance
        expected = dense.variance
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the factored one floors silently
        variance = factored.variance
    torch.testing.assert_close(variance, expected)
    assert variance[0, 0] == gpytorch.settings.min_variance.value(DTYPE)
    # Anything but the factored covariance is gpytorch's own.
    other = FactoredMultivariateNormal(mean, DenseLinearOperator(covar.to_dense()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(other.variance, expected)
