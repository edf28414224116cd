r"""A :class:`~streamgp.models.WiskiGP`'s latent posterior at test points (``forward``).

The mean and the covariance's factors come from the cached posterior and its
conditioning correction (:meth:`WiskiGP._predictive_factors`, one path for every case),
plus the exact prior variance's diagonal (:mod:`streamgp.linalg.prior_variance`); under
LOVE from the rank-``k`` root. On CUDA, inside :class:`streamgp.settings.cuda_graphs`,
the same factors are replayed from a captured graph.
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from streamgp.linalg.data_space import DataPosterior
from streamgp.linalg.grid_kernel import GridKernelRoot
from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.linalg.prior_variance import PriorVarianceCorrection, root_covariance
from streamgp.linalg.woodbury import GridPosterior, LowRankCorrection
from streamgp.settings import cuda_graphs, immediate_value_checks, skip_value_checks
from streamgp.settings import exact_prior_variance as exact_prior_variance_setting
from streamgp.utils.cuda_graphs import GraphCache, without_parameter_grads


class PredictionMixin:
    r"""``forward`` (eager, LOVE or a CUDA graph) and the exact prior variance.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    def _latent_forward(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of the latent function at already-transformed inputs ``X`` (what
        ``model(X)`` returns in eval mode; see ``StreamingModelMixin.forward``)."""
        posterior = self.exact_posterior()
        love = self.love_grid_posterior()
        correction = self._current_correction()
        if love is None and X.is_cuda and cuda_graphs.on() and isinstance(posterior, GridPosterior):
            return self._graphed_forward(X, posterior, correction)
        weights = self._rows(X)
        # k(x, x) - w^T K_UU w on the diagonal (exact_prior_variance); the same for
        # the marginal variances and the joint covariance, exact and LOVE paths alike.
        diagonal = self.prior_variance_correction(X, weights)
        if love is not None:
            # Sparse W_* times the m x k root: t x k, never t x 4^d x m.
            mean = self._plus_prior_mean(weights.dot(love.mean))
            root = weights.matmul(love.root)
            root = root.expand(*mean.shape, root.shape[-1])  # shared by the outputs
            return MultivariateNormal(mean, root_covariance(root, diagonal))
        mean, positive, negative = self._predictive_factors(weights, posterior, correction)
        return self._factored_normal(mean, positive, negative, diagonal)

    def _predictive_factors(
        self, weights: Any, posterior: GridPosterior | DataPosterior, correction: Any
    ) -> tuple[Tensor, tuple, tuple]:
        r"""The mean (prior mean included) and the covariance's positive and negative
        factors at the rows ``weights`` (see :class:`PosteriorCovariance`)."""
        mean, positive, negative = correction.predict_factors(posterior, weights)
        return self._plus_prior_mean(mean), positive, negative

    @staticmethod
    def _factored_normal(
        mean: Tensor, positive: tuple, negative: tuple, diagonal: Tensor | None
    ) -> MultivariateNormal:
        # Variances from the factors, the dense t x t matrix only when asked for (joint
        # samples, Cholesky); a LinearOperator also defers factorisation to whoever needs
        # it (samplers add jitter as required).
        covar = PosteriorCovariance(positive, negative, diagonal, batch_shape=mean.shape[:-1])
        return MultivariateNormal(mean, covar)

    def _graphed_forward(
        self, X: Tensor, posterior: GridPosterior, correction: LowRankCorrection
    ) -> MultivariateNormal:
        r""":meth:`forward` in grid space from a replayed CUDA graph of
        :meth:`_grid_factors` (see :class:`streamgp.settings.cuda_graphs`)."""

        def factors(X: Tensor) -> tuple[Tensor, ...]:
            with without_parameter_grads(self):  # a gradient in X only
                return self._grid_factors(X, posterior, correction)

        if getattr(self, "_graphs", None) is None:
            self._graphs = GraphCache()
        anchors = (posterior, correction, self._prior_variance)
        key = tuple(id(anchor) for anchor in anchors)
        mean, root, *rest = self._graphs(key, factors, X, anchors)
        num_negative = 1 if correction.rank else 0
        negative = tuple(rest[:num_negative])
        diagonal = rest[num_negative] if len(rest) > num_negative else None
        return self._factored_normal(mean, (root,), negative, diagonal)

    def _grid_factors(
        self, X: Tensor, posterior: GridPosterior, correction: LowRankCorrection
    ) -> tuple[Tensor, ...]:
        r"""The grid-space posterior at ``X`` as plain tensors, without host reads: the
        mean, the root ``W_* R``, the correction's root (if conditioned) and the exact
        prior variance's diagonal (if on), in that order."""
        with skip_value_checks():  # (checked by the caller, before any graph)
            weights = self._rows(X)
            diagonal = self.prior_variance_correction(X, weights)
            mean, (root,), negative = self._predictive_factors(weights, posterior, correction)
        root = root if isinstance(root, Tensor) else root.tensor
        return (mean, root, *negative, *(() if diagonal is None else (diagonal,)))

    def _new_prior_variance(self, root: GridKernelRoot) -> PriorVarianceCorrection | None:
        r"""The prior variance correction of the kernel with its (detached) root (None
        for a kernel evaluated exactly: its variance needs none)."""
        if self.evaluates_kernel_exactly:
            return None
        return PriorVarianceCorrection(self.covar_module, root, self.interpolation.bounds[:1])

    def prior_variance_correction(self, X: Tensor, weights: Any) -> Tensor | None:
        r"""``d(x) = k(x, x) - w(x)^T K_UU w(x)`` (clamped at 0) at transformed inputs.

        The diagonal the predictive covariance gets (see ``exact_prior_variance``), in
        the layout of the rows ``weights`` (``batch x t``); None when switched off (the
        constructor's ``exact_prior_variance`` or
        :class:`streamgp.settings.exact_prior_variance`).
        """
        if self.evaluates_kernel_exactly or not (
            self.exact_prior_variance and exact_prior_variance_setting.on()
        ):
            return None
        if self._prior_variance is None:  # a posterior set without a rebuild (rare)
            with torch.no_grad(), immediate_value_checks():
                self._prior_variance = self._new_prior_variance(self.kernel_root())
        return self._prior_variance(X, weights)
