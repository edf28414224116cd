r"""Exact rebuilds of a :class:`~streamgp.models.WiskiGP`'s statistics.

The statistics are sums over rows, so they can be rebuilt exactly: on a new grid from the
kept raw data (a re-grid when an observation leaves the box, or :meth:`refine_grid` to a
finer grid), or in new units from the statistics themselves (:meth:`restandardize`).
Afterwards the model equals one built on all data with the new grid or standardisation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models.transforms.outcome import Standardize
from gpytorch.kernels import AdditiveKernel, Kernel, ProductKernel, ScaleKernel
from gpytorch.means import ConstantMean
from torch import Tensor

from streamgp.interpolation.exact import ExactKernelInputs
from streamgp.interpolation.grid import CubicGridInterpolation
from streamgp.models.utils import transaction
from streamgp.models.utils.grids import build_grid
from streamgp.models.utils.resolution import suggested_grid_size
from streamgp.settings import immediate_value_checks
from streamgp.utils.validation import check_count

if TYPE_CHECKING:
    from streamgp.models.wiski import WiskiGP


class RebuildMixin:
    r"""Re-grids, ``refine_grid`` and ``restandardize``.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    def _regridded_interpolation(
        self, bounds: Tensor, X: Tensor, X_t: Tensor, grid_size: list[int] | None = None
    ) -> tuple[CubicGridInterpolation, bool]:
        r"""The interpolation over the box ``bounds`` (and ``structured``), covering the
        transformed inputs ``X_t`` (of raw ``X``), with ``grid_size`` points per axis
        (default: the model's ``grid_size`` option)."""
        size = self._grid_size_option if grid_size is None else grid_size
        exact = self.evaluates_kernel_exactly
        grid, structured = build_grid(
            X, X_t, bounds, size, self.covar_module, self.MAX_DENSE_GRID, check_kernel=not exact
        )
        if exact:  # (its rows are the inputs, whatever the grid)
            return ExactKernelInputs(grid), structured
        return grid, structured

    def _regrid(
        self,
        bounds: Tensor,
        X: Tensor,
        Y: Tensor,
        Yvar: Tensor | None,
        grid_size: list[int] | None = None,
    ) -> None:
        r"""Move to a grid over ``bounds`` holding every kept observation and ``(X, Y, Yvar)``.

        Exact: the statistics are rebuilt from the raw data through the frozen
        transforms, so the model equals one built on all data with this grid (and the
        same transforms and hyperparameters). ``O(n 4^d)`` for the rows plus a
        factorisation at the next prediction. Nothing changes if it fails.
        """
        store = self.observations
        X_all, Y_all = torch.cat([store.X, X], -2), torch.cat([store.Y, Y], -2)
        Yvar_all = None if Yvar is None else torch.cat([store.Yvar, Yvar], -2)
        interpolation, structured, statistics = self._statistics_on_new_grid(
            bounds, X_all, Y_all, Yvar_all, grid_size
        )
        store.append(X, Y, Yvar)
        self.interpolation, self.structured = interpolation, structured
        self._clear_caches()
        self._set_statistics(statistics)

    def _statistics_on_new_grid(
        self,
        bounds: Tensor,
        X: Tensor,
        Y: Tensor,
        Yvar: Tensor | None,
        grid_size: list[int] | None = None,
    ) -> tuple[CubicGridInterpolation, bool, Any]:
        r"""The interpolation over ``bounds`` (and ``structured``) and the statistics of
        the raw rows ``(X, Y, Yvar)`` on it, through the frozen transforms (no gradient)."""
        X_t, Y_t, Yvar_t = self._transform_new_data(X, Y, Yvar)
        interpolation, structured = self._regridded_interpolation(bounds, X, X_t, grid_size)
        self._check_dense_for_outputs(interpolation, structured)
        noise = None if Yvar_t is None else self._shared_noise(Yvar_t, "Yvar")
        with torch.no_grad():
            statistics = self._statistics_of(
                interpolation, structured, X_t, self._targets(Y_t), noise
            )
        return interpolation, structured, statistics

    def refine_grid(
        self,
        grid_size: int | Sequence[int] | None = None,
        *,
        max_grid_points: int | None = None,
    ) -> WiskiGP:
        r"""Move to a finer grid, exactly: the statistics are rebuilt from the kept data.

        The remedy for a fit whose lengthscales are too short for the grid
        (:class:`~streamgp.models.utils.resolution.CoarseGridWarning`): afterwards the
        model equals one built on all its observations with the new grid (the same
        box, transforms and hyperparameters). ``O(n 4^d)`` for the rows plus a
        factorisation at the next prediction; the loops call it after each refit.

        Args:
            grid_size: Points per axis (an int for every axis, or one per axis), at
                least the current ones. Default: the size that puts
                ``MIN_SPACINGS_PER_LENGTHSCALE`` grid spacings in every fitted
                lengthscale (nothing changes where the grid is fine enough).
            max_grid_points: Cap on the grid's points (the default size is shrunk
                evenly on the axes it refines, never below the current grid).

        Returns:
            The model itself. Raises (and changes nothing) on a bad argument, or if the
            model keeps no data (``keep_data=False``, a conditioned view). A model that
            evaluates its kernel exactly (``evaluates_kernel_exactly``) has no grid in use:
            nothing changes.

        Example:
            >>> from streamgp.models import WiskiGP
            >>> X = torch.linspace(0, 1, 50, dtype=torch.float64).unsqueeze(-1)
            >>> model = WiskiGP(X, torch.sin(20 * X), grid_size=8)
            >>> model.covar_module.lengthscale = 0.05
            >>> model.refine_grid().interpolation.grid_size
            [43]
        """
        if self.evaluates_kernel_exactly:
            return self
        with transaction(self):
            size = self._refined_grid_size(grid_size, max_grid_points)
            if size is None:
                return self
            if self.observations is None:
                raise RuntimeError(
                    "refine_grid rebuilds the statistics from the kept observations, and "
                    "this model keeps none (keep_data=False, or a conditioned view)."
                )
            X, Y, Yvar = (
                None if rows is None else rows[..., :0, :]
                for rows in (self.observations.X, self.observations.Y, self.observations.Yvar)
            )
            with immediate_value_checks():
                self._regrid(self.interpolation.bounds, X, Y, Yvar, size)
            self._grid_size_option = size
        return self

    def _refined_grid_size(
        self, grid_size: int | Sequence[int] | None, max_grid_points: int | None
    ) -> list[int] | None:
        r""":meth:`refine_grid`'s new size (validated), or None where nothing changes."""
        current = list(self.interpolation.grid_size)
        dim = len(current)
        if max_grid_points is not None:
            check_count(max_grid_points, "max_grid_points", minimum=math.prod(current))
        if grid_size is None:
            size = suggested_grid_size(self.covar_module, self.interpolation)
            if size is None:
                return None
            if max_grid_points is not None and math.prod(size) > max_grid_points:
                refined = [i for i in range(dim) if size[i] > current[i]]
                shrink = (max_grid_points / math.prod(size)) ** (1.0 / len(refined))
                for i in refined:
                    size[i] = max(current[i], math.floor(size[i] * shrink))
        else:
            if isinstance(grid_size, int):
                sizes = [grid_size] * dim
            else:
                sizes = list(grid_size) if isinstance(grid_size, Sequence) else []
            if len(sizes) != dim or any(
                not isinstance(g, int) or isinstance(g, bool) or g < c
                for g, c in zip(sizes, current, strict=False)
            ):
                raise ValueError(
                    f"grid_size must be an int or {dim} ints, each at least the current "
                    f"grid's {current}; got {grid_size!r}."
                )
            size = sizes
            if max_grid_points is not None and math.prod(size) > max_grid_points:
                raise ValueError(
                    f"grid_size {size} has {math.prod(size)} points, more than "
                    f"max_grid_points = {max_grid_points}."
                )
        return None if size == current else size

    def restandardize(self, rescale_hyperparameters: bool = True) -> WiskiGP:
        r"""Re-estimate the ``Standardize`` outcome transform from every observation, exactly.

        The transforms are fitted on the constructor's data and then frozen, so a
        ``Standardize`` fitted on a few initial points can be far off later. Its
        statistics are affine in the targets and interpolation rows sum to one, so the
        new mean and standard deviation of all targets, and the statistics of the
        re-standardised targets, follow from the statistics themselves in ``O(m^2)``
        (``O(n)`` in data space): the model afterwards equals one built from all data
        at once with ``Standardize`` fitted on all of them (tested to 1e-10). Call it
        before a refit of the hyperparameters.

        Args:
            rescale_hyperparameters: Express the noise variance (and a ``ScaleKernel``'s
                output scale) in the new units, so that only the prior mean (zero in the
                new standardised space) changes. False keeps their values. A learned
                constant mean (``mean_module``) is always carried over, so with it the
                model is unchanged.

        Returns:
            The model itself. Learned (homoskedastic) noise only: grid statistics with
            fixed noise keep only noise-weighted target sums. If it raises, the model
            is unchanged.
        """
        # It also writes into the transform, the prior mean and the kernel's scales.
        state = self.mutable_state
        modules = ("likelihood", "outcome_transform", "mean_module", "covar_module")
        with transaction(self, dataclasses.replace(state, modules=modules)):
            return self._restandardize(rescale_hyperparameters)

    def _restandardize(self, rescale_hyperparameters: bool) -> WiskiGP:
        if self._num_outputs > 1:
            raise ValueError(
                "restandardize needs a single-output model: re-estimating each output's "
                "scale would give the outputs different noise levels, which they share."
            )
        transform = getattr(self, "outcome_transform", None)
        if not isinstance(transform, Standardize) or transform._m != 1:
            raise ValueError(
                "restandardize needs outcome_transform=Standardize(1); this model has "
                f"{type(transform).__name__ if transform is not None else None}."
            )
        if self.fixed_noise:
            raise ValueError(
                "restandardize supports learned noise only: with train_Yvar the statistics "
                "keep noise-weighted target sums, not the moments Standardize needs."
            )
        if self._data_batch_shape:
            raise UnsupportedError(
                "restandardize on a WiskiGP with batched training data is not supported yet."
            )
        if len(self.batch_shape) > 0:
            raise RuntimeError("restandardize is not available on a batched (fantasy) model.")

        self._fold_observed()
        statistics = self._statistics
        n = statistics.count
        if n < 2:
            raise ValueError(f"restandardize needs at least 2 observations; the model has {n}.")
        with torch.no_grad():
            total, squares = statistics.target_moments()
            mean_t = total / n
            var_t = ((squares - total * mean_t) / (n - 1)).clamp_min(0.0)
            old_mean, old_std = transform.means.reshape(()), transform.stdvs.reshape(())
            new_mean = old_mean + old_std * mean_t
            new_std = old_std * var_t.sqrt()
            new_std = torch.where(new_std >= transform._min_stdv, new_std, torch.ones_like(new_std))
            alpha, beta = old_std / new_std, (old_mean - new_mean) / new_std
            self._set_statistics(statistics.affine(alpha, beta))
            if isinstance(self.mean_module, ConstantMean):  # the same prior mean, new units
                self.mean_module.constant = alpha * self.mean_module.constant + beta
            transform.means.fill_(new_mean)
            transform.stdvs.fill_(new_std)
            transform._stdvs_sq.fill_(new_std**2)
            if rescale_hyperparameters:
                self.likelihood.noise = self.likelihood.noise * alpha**2
                for kernel in self._scale_kernels():
                    kernel.outputscale = kernel.outputscale * alpha**2
        self._invalidate()
        return self

    def _scale_kernels(self) -> list[ScaleKernel]:
        r"""The kernels whose output scales carry the targets' units (``restandardize``):
        scaling them all by ``c`` scales the whole kernel by ``c`` (none if no set does)."""
        return _output_scales(self.covar_module) or []


def _output_scales(kernel: Kernel) -> list[ScaleKernel] | None:
    r"""``ScaleKernel``s of ``kernel`` whose output scales, each multiplied by ``c``, multiply
    ``kernel`` by ``c``: itself, every term's of a sum, one factor's of a product; None
    when there is no such set (a kernel without an output scale)."""
    if isinstance(kernel, ScaleKernel):
        return [kernel]
    if isinstance(kernel, AdditiveKernel):
        terms = [_output_scales(term) for term in kernel.kernels]
        if any(term is None for term in terms):
            return None
        unique = {id(scale): scale for term in terms for scale in term}  # (shared terms)
        return list(unique.values())
    if isinstance(kernel, ProductKernel):
        return next(
            (scales for scales in map(_output_scales, kernel.kernels) if scales is not None),
            None,
        )
    return None
