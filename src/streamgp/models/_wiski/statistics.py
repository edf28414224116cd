r"""What a :class:`~streamgp.models.WiskiGP` keeps of its observations, and in which space.

The statistics (:mod:`streamgp.linalg.statistics`) are the rows themselves while at most
``data_space_limit`` observations were absorbed (data space), then the grid sums
``W^T W, W^T y, y^T y, n`` (grid space). This mixin builds them (in chunks of
``STATISTICS_CHUNK`` rows), switches space when ``n`` passes the limit, and evaluates the
exact SKI marginal likelihood from them (what ``fit_gpytorch_mll`` maximises).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from streamgp.interpolation.grid import CubicGridInterpolation
from streamgp.linalg.statistics import DataStatistics, GridStatistics
from streamgp.linalg.woodbury import GridPosterior
from streamgp.models.utils import transform_new_data
from streamgp.settings import deferred_value_checks, immediate_value_checks

#: ``data_space_limit`` of a grid that grid space cannot hold (``d >= 4``, more than
#: ``MAX_DENSE_GRID`` points): the model never leaves data space (and there evaluates its
#: kernel exactly; see ``WiskiGP.evaluates_kernel_exactly``).
UNLIMITED_DATA_SPACE = 2**62


class StatisticsMixin:
    r"""The statistics, the data-space/grid-space switch and the fit objective.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    def _statistics_of(
        self,
        interpolation: CubicGridInterpolation,
        structured: bool,
        X_t: Tensor,
        y: Tensor,
        noise: Tensor | None,
    ) -> DataStatistics | GridStatistics:
        r"""The statistics of transformed data on a grid: their rows while at most
        ``data_space_limit``, else the grid sums."""
        if not self._data_batch_shape and len(X_t) <= self.data_space_limit:
            # y is n (one output) or k x n: the rows are shared by all outputs.
            if not isinstance(interpolation, CubicGridInterpolation):  # rows of its own width
                return DataStatistics(interpolation.weights(X_t), y, noise)
            statistics = DataStatistics.empty(interpolation.grid_size, y, self.fixed_noise)
            return statistics.add(interpolation.weights(X_t), y, noise)
        # Large data sets are absorbed in chunks to bound memory.
        return self._grid_statistics(interpolation, X_t, y, noise, sparse=structured)

    def _grid_statistics(
        self,
        interpolation: Any,
        X_t: Tensor,
        y: Tensor,
        noise: Tensor | None,
        differentiable: bool = True,
        sparse: bool | None = None,
    ) -> GridStatistics:
        r"""Grid statistics of transformed rows, ``STATISTICS_CHUNK`` rows at a time.

        ``differentiable``: keep the graph to ``X_t`` (a learned projection of the
        inputs is fitted through the statistics); False for learned interpolation
        points, whose statistics are recomputed when the points change.
        """
        chunks = (
            (
                interpolation.weights(X_t[..., start : start + self.STATISTICS_CHUNK, :]),
                y[..., start : start + self.STATISTICS_CHUNK],
                None if noise is None else noise[..., start : start + self.STATISTICS_CHUNK],
            )
            for start in range(0, y.shape[-1], self.STATISTICS_CHUNK)
        )
        with torch.set_grad_enabled(differentiable and torch.is_grad_enabled()):
            return GridStatistics.of_rows(
                chunks,
                interpolation.num_grid,
                y,
                self.fixed_noise,
                sparse=self.structured if sparse is None else sparse,
                batch_shape=self._data_batch_shape,
            )

    @property
    def statistics(self) -> DataStatistics | GridStatistics:
        r"""What the model keeps of its observations (not of conditioning).

        :class:`~streamgp.linalg.statistics.DataStatistics` (the rows) while at most
        ``data_space_limit`` observations were absorbed, then
        :class:`~streamgp.linalg.statistics.GridStatistics` (``W^T W, W^T y, ...``).
        Observations held as a pending low-rank correction (``FOLD_RANK``) are folded in
        first, so every observed row is accounted for.
        """
        self._fold_observed()
        return self._statistics

    def _fold_observed(self) -> None:
        r"""Fold pending rows of an unbatched model (a batched fantasy view keeps its own)."""
        if self._conditioning_log and len(self._internal_batch_shape) == 0:
            self._fold_conditioning()

    @property
    def in_data_space(self) -> bool:
        r"""True while the model keeps its rows and works with ``n x n`` matrices."""
        return isinstance(self._statistics, DataStatistics)

    def _set_statistics(self, statistics: DataStatistics | GridStatistics) -> None:
        self._statistics = statistics

    def _switch_space_if_needed(self, statistics: DataStatistics | GridStatistics) -> None:
        r"""Set the statistics, folding data-space rows into grid statistics past the limit."""
        if (
            isinstance(statistics, DataStatistics)
            and statistics.count > self.data_space_limit
            and not self.evaluates_kernel_exactly  # (data space for good)
        ):
            statistics = statistics.to_grid(sparse=self.structured)
            if not isinstance(self._posterior, GridPosterior) or self.structured:
                self._invalidate()  # the next prediction factorises in grid space, O(m^3)
        self._set_statistics(statistics)

    def weighted_statistics(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        r"""Grid-space noise-weighted ``(A, b, c, n, sum(log noise))``; differentiable in the noise.

        Includes data absorbed by ``condition_on_observations`` (unbatched only). In data
        space they are computed from the rows (``O(n 16^d)``), without switching space.
        """
        if self.evaluates_kernel_exactly:
            raise RuntimeError(
                "weighted_statistics: this model evaluates its kernel exactly (from 4-D on "
                "with the default grid), so it has no grid statistics."
            )
        self._fold_conditioning()
        return self._statistics.to_grid().weighted(self.noise_variance)

    def training_statistics(self) -> DataStatistics | GridStatistics:
        r"""The statistics of every observation, conditioning included (unbatched only)."""
        self._fold_conditioning()
        return self._statistics

    def statistics_with(
        self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None
    ) -> DataStatistics | GridStatistics:
        r"""The statistics of every observation plus ``(X, Y)``; the model is unchanged.

        The new rows pass through the model's frozen transforms and its interpolation, so
        the result is differentiable in ``X`` (and in anything ``X`` was computed from):
        the WISKI paper's streaming objective (eq. 18) keeps the old statistics fixed and
        differentiates the new rows' weights, e.g. in a learned input projection.
        ``WoodburyMarginalLogLikelihood(likelihood, model)(statistics=...)`` evaluates it.

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (a single-output model).
            Yvar: ``q x 1`` known noise variances (fixed-noise models only).

        Example:
            >>> from streamgp.models import WiskiGP
            >>> from streamgp.mlls import WoodburyMarginalLogLikelihood
            >>> X = torch.rand(10, 2, dtype=torch.float64)
            >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=8)
            >>> mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
            >>> new = torch.rand(3, 2, dtype=torch.float64, requires_grad=True)
            >>> mll(statistics=model.statistics_with(new, new.sum(-1, keepdim=True))).backward()
            >>> new.grad.shape, model.num_train
            (torch.Size([3, 2]), 10)
        """
        X_t, Y_t, noise_t = transform_new_data(self, X, Y, Yvar)
        return self.training_statistics().add(
            self.interpolation.weights(X_t),
            Y_t.squeeze(-1),
            None if noise_t is None else noise_t.squeeze(-1),
        )

    def fit_objective(self) -> tuple[Tensor, Tensor]:
        r"""The exact SKI log marginal likelihood of every observation, and ``n``.

        What ``fit_gpytorch_mll`` maximises (per datum, with the priors) for any marginal
        likelihood wrapping this model, ``ExactMarginalLogLikelihood`` and a
        ``SumMarginalLogLikelihood`` over a ``ModelListGP`` included
        (:meth:`~streamgp.models.base.StreamingModelMixin.compute_custom_loss`).

        Its value checks (the noise, every factorisation's failure flag) are read from the
        device once, after the value is computed; if a factorisation failed, the value is
        computed again with checked factorisations (the kernel's jitter raised as needed,
        or an error), as it always is inside a rebuild.
        """
        failed: list[bool] = []
        with deferred_value_checks(join=False) as checks:
            checks.defer_factorisations = True
            value, n = self._log_marginal_likelihood()
            flag = self._take_failures(checks)
            if flag is not None:
                checks.decide(flag, failed.append)
            checks.read()
        if failed and failed[0]:
            self._invalidate()  # factors folded in this call may be garbage
            with immediate_value_checks():
                value, n = self._log_marginal_likelihood()
        return value, n

    def _log_marginal_likelihood(self) -> tuple[Tensor, Tensor]:
        statistics = self.training_statistics()
        value = self._centered(statistics).log_marginal_likelihood(
            self.kernel_root(), self.noise_variance, tol=self._likelihood_tolerance(statistics)
        )
        if self._data_batch_shape:  # one value per member, as gpytorch's batched exact MLL
            return value, statistics.n
        return value.sum(), statistics.n  # summed over the outputs (one per output)

    def likelihood_gap(self, count: int) -> float:
        r"""The absolute Nystrom trace gap at which a large grid's marginal likelihood stops,
        for ``count`` observations: ``LIKELIHOOD_TOLERANCE * count``, and never finer than
        ``love_tolerance`` (dense grids and data space compute it exactly).

        Its log-determinant is then within half the gap of exact SKI's, ``5e-10`` nats per
        observation by default: below the change at which BoTorch's L-BFGS-B stops, and at
        ``32^3`` about half the Lanczos rank of a gap of ``love_tolerance``. The Lanczos
        round-off floor (small noise, float32 statistics) can be coarser than the gap, and
        then sets it (see :data:`streamgp.settings.LIKELIHOOD_TOLERANCE`). Set
        ``LIKELIHOOD_TOLERANCE = 0`` on the class (or a model) for the ``love_tolerance`` gap
        at any ``count``.

        Example:
            >>> from streamgp import WiskiGP
            >>> X = torch.rand(8, 2, dtype=torch.float64)
            >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10)
            >>> model.likelihood_gap(10_000)
            1e-05
        """
        return max(float(self.love_tolerance), self.LIKELIHOOD_TOLERANCE * int(count))

    def _likelihood_tolerance(self, statistics) -> float:
        r"""``tol`` for ``statistics.log_marginal_likelihood``: :meth:`likelihood_gap` where it
        is used (sparse, large-grid statistics, whose Lanczos reads the host anyway), else
        ``love_tolerance`` (ignored: the value is exact), so that the count (a host read of
        grid statistics) is read only there."""
        if getattr(statistics, "sparse", False):
            return self.likelihood_gap(statistics.count)
        return float(self.love_tolerance)

    @property
    def num_train(self) -> int:
        r"""Number of observations absorbed so far (including conditioning)."""
        extra = sum(entry[0].shape[-2] for entry in self._conditioning_log)
        return self._statistics.count + extra
