r"""BoTorch's pathwise (Matheron) posterior samples for streamgp models.

BoTorch draws posterior sample *paths* (Wilson et al., "Efficiently Sampling Functions
from Gaussian Process Posteriors", ICML 2020) with ``draw_matheron_paths``: a prior
path from random Fourier features of the kernel plus an exact update through the
training data, ``f(x) + k(x, X) (K + Sigma)^{-1} (y - f(X) - eps)``. Sample paths cost
``O(n^3 + n F)`` once and ``O(F + n)`` per evaluation, instead of the ``O(N^3)``
Cholesky of a joint sample at ``N`` candidates, which is what Thompson sampling over
thousands of candidates (BoTorch's ``PathwiseThompsonSampling``,
``get_matheron_path_model``) is for.

From 4-D on a :class:`~streamgp.models.WiskiGP` evaluates its kernel exactly
(``evaluates_kernel_exactly``): it is then ``SingleTaskGP``'s model, with the same
``train_inputs``, ``train_targets``, kernel, mean and likelihood, so BoTorch's own
exact-GP sampler applies unchanged (registered here for it: the dispatchers select on
``ExactGP``, which a streamgp model is not). Every other streamgp model (and a
``WiskiGP`` that interpolates its kernel on a grid, whose posterior is SKI's, not the
exact kernel's) is refused with an error naming what works: BoTorch's joint posterior
samples (``MaxPosteriorSampling``), which every model supports.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths
from botorch.sampling.pathwise.prior_samplers import DrawKernelFeaturePaths
from botorch.sampling.pathwise.update_strategies import GaussianUpdate
from gpytorch.likelihoods import Likelihood
from gpytorch.likelihoods.gaussian_likelihood import _GaussianLikelihoodBase
from gpytorch.models import ExactGP

__all__ = ["register_pathwise_sampling"]


def _check_exact(model: Any) -> None:
    if not getattr(model, "evaluates_kernel_exactly", False):
        raise NotImplementedError(
            f"Pathwise (Matheron) sample paths need an exact-kernel model; this "
            f"{type(model).__name__} interpolates or approximates its kernel. A WiskiGP "
            "evaluates its kernel exactly from 4-D on with its default grid "
            "(model.evaluates_kernel_exactly). For any model, Thompson sampling with joint "
            "posterior samples works: botorch.generation.MaxPosteriorSampling."
        )


def register_pathwise_sampling(exact_capable: type, others: tuple[type, ...]) -> None:
    r"""Register BoTorch's exact-GP path sampler for ``exact_capable`` (used when a model
    evaluates its kernel exactly, refused otherwise) and a clear refusal for ``others``.

    Args:
        exact_capable: :class:`~streamgp.models.WiskiGP` (its subclasses inherit it).
        others: The models that never evaluate their kernel exactly.
    """
    exact_paths = DrawMatheronPaths.dispatch(ExactGP)
    exact_prior = DrawKernelFeaturePaths.dispatch(ExactGP)
    exact_update = GaussianUpdate.dispatch(ExactGP, _GaussianLikelihoodBase)

    @DrawMatheronPaths.register(exact_capable)
    def _paths(model: Any, **kwargs: Any) -> Any:
        _check_exact(model)
        if getattr(model, "fixed_noise", False):
            # BoTorch removes the outcome transform while it updates the paths, and a
            # streamgp model's known noise is read through it (outcome-transformed, as
            # SingleTaskGP holds it): read it first.
            (points,) = model.train_inputs
            noise = model.likelihood.noise_covar(shape=points.shape[:-1])
            kwargs["update_strategy"] = partial(kwargs["update_strategy"], noise_covariance=noise)
        return exact_paths(model, **kwargs)

    @DrawKernelFeaturePaths.register(exact_capable)
    def _prior(model: Any, **kwargs: Any) -> Any:
        _check_exact(model)
        return exact_prior(model, **kwargs)

    @GaussianUpdate.register(exact_capable, _GaussianLikelihoodBase)
    def _update(model: Any, likelihood: Any, **kwargs: Any) -> Any:
        _check_exact(model)
        return exact_update(model, likelihood, **kwargs)

    @DrawMatheronPaths.register(others)
    def _refuse(model: Any, **kwargs: Any) -> Any:
        _check_exact(model)

    @GaussianUpdate.register(others, (Likelihood, type(None)))
    def _refuse_update(model: Any, likelihood: Any, **kwargs: Any) -> Any:
        _check_exact(model)
