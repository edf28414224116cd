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
samples (``MaxPosteriorSampling``), which every model supports. Importing
:mod:`streamgp.models` registers all of this with BoTorch's dispatchers.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths
from botorch.sampling.pathwise.prior_samplers import DrawKernelFeaturePaths
from botorch.sampling.pathwise.update_strategies import GaussianUpdate
from gpytorch.likelihoods.gaussian_likelihood import _GaussianLikelihoodBase
from gpytorch.models import ExactGP

from streamgp.models.kissgp import KissGP
from streamgp.models.utils import PosteriorMixin
from streamgp.models.wiski import WiskiGP


def _check_exact(model: Any) -> None:
    if not getattr(model, "evaluates_kernel_exactly", False):
        raise NotImplementedError(
            f"Pathwise (Matheron) sample paths need an exact-kernel model; this "
            f"{type(model).__name__} interpolates or approximates its kernel. A WiskiGP "
            "evaluates its kernel exactly from 4-D on with its default grid "
            "(model.evaluates_kernel_exactly). For any model, Thompson sampling with joint "
            "posterior samples works: botorch.generation.MaxPosteriorSampling."
        )


_exact_paths = DrawMatheronPaths.dispatch(ExactGP)
_exact_prior = DrawKernelFeaturePaths.dispatch(ExactGP)
_exact_update = GaussianUpdate.dispatch(ExactGP, _GaussianLikelihoodBase)


@DrawMatheronPaths.register(WiskiGP)
def _draw_matheron_paths_wiski(model: WiskiGP, **kwargs: Any) -> Any:
    _check_exact(model)
    if model.fixed_noise:
        # BoTorch removes the outcome transform while it updates the paths, and a
        # streamgp model's known noise is read through it (outcome-transformed, as
        # SingleTaskGP holds it): read it first.
        (points,) = model.train_inputs
        noise = model.likelihood.noise_covar(shape=points.shape[:-1])
        kwargs["update_strategy"] = partial(kwargs["update_strategy"], noise_covariance=noise)
    return _exact_paths(model, **kwargs)


@DrawKernelFeaturePaths.register(WiskiGP)
def _draw_kernel_feature_paths_wiski(model: WiskiGP, **kwargs: Any) -> Any:
    _check_exact(model)
    return _exact_prior(model, **kwargs)


@GaussianUpdate.register(WiskiGP, _GaussianLikelihoodBase)
def _gaussian_update_wiski(model: WiskiGP, likelihood: Any, **kwargs: Any) -> Any:
    _check_exact(model)
    return _exact_update(model, likelihood, **kwargs)


# Every other streamgp model (KissGP, an ExactGP, named too: BoTorch's ExactGP sampler
# would otherwise take it, with its interpolated kernel's features).
@DrawMatheronPaths.register((PosteriorMixin, KissGP))
def _draw_matheron_paths_refused(model: Any, **kwargs: Any) -> Any:
    _check_exact(model)
