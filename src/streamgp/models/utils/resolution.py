r"""A warning when a fit leaves lengthscales too short for the model's grid.

SKI interpolates the kernel from a regular grid, so it can only represent functions that
vary slowly on the grid's spacing ``h``. With a lengthscale near ``h`` the interpolated
kernel is visibly wrong: on a 30 x 30 grid over the unit square (RBF kernel) SKI's prior
variance ``w(x)^T K_UU w(x)``, exactly 1 in the kernel, fell to 0.995 at 2.7 ``h``, 0.938
at 1.35 ``h``, 0.746 at 0.81 ``h`` and 0.500 at 0.5 ``h``. The models' exact prior
variance (:mod:`streamgp.linalg.prior_variance`) repairs the variances, not the
covariances between points, nor the mean. So after ``fit_gpytorch_mll`` (a model put back
in eval mode after training mode), a grid model whose fitted lengthscale along some axis is
below :data:`MIN_SPACINGS_PER_LENGTHSCALE` grid spacings warns once with
:class:`CoarseGridWarning`, naming the axis and a ``grid_size`` that would meet the
ratio. The check reads the lengthscales on the host once per fit, never in predictions,
and not at all inside :class:`~streamgp.settings.skip_value_checks`.

The remedy is exact where the model keeps its data: ``WiskiGP.refine_grid()`` rebuilds
the statistics on the grid :func:`suggested_grid_size` names, and the loops do so after
every refit (the registry's ``refine_grid`` and ``max_grid_points`` options), so the
warning is left for grids a cap keeps coarse.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from streamgp import settings
from streamgp.settings import skip_value_checks

#: See :data:`streamgp.settings.MIN_SPACINGS_PER_LENGTHSCALE` (overridable here).
MIN_SPACINGS_PER_LENGTHSCALE = settings.MIN_SPACINGS_PER_LENGTHSCALE


class CoarseGridWarning(UserWarning):
    r"""A fitted lengthscale below :data:`MIN_SPACINGS_PER_LENGTHSCALE` grid spacings.

    The grid is too coarse for the function the fit found: the interpolated kernel (and
    so the posterior mean and covariances) is inaccurate there. Remedy: a finer grid,
    ``grid_size`` at least the one the message names (or a shorter ``grid_bounds`` box);
    ``WiskiGP.refine_grid()`` moves a model that keeps its data there exactly.
    Issued once per model; silence it with :mod:`warnings` filters.
    """


def _lengthscale_kernel(kernel: Any) -> Any | None:
    r"""The kernel carrying the lengthscale (through ``ScaleKernel``), or None."""
    while not getattr(kernel, "has_lengthscale", False) and hasattr(kernel, "base_kernel"):
        kernel = kernel.base_kernel
    return kernel if getattr(kernel, "has_lengthscale", False) else None


def _grid_parts(kernel: Any, interpolation: Any) -> list[tuple[Any, Any]]:
    r"""``(kernel, grid interpolation)`` pairs: one for a product grid, one per group of
    an additive grid (its kernel's parts, in order); none for other interpolations."""
    parts = getattr(interpolation, "parts", None)
    kernels = getattr(kernel, "kernels", None)
    if parts is not None and kernels is not None and len(parts) == len(kernels):
        return [
            pair for k, part in zip(kernels, parts, strict=True) for pair in _grid_parts(k, part)
        ]
    if hasattr(interpolation, "grid") and hasattr(interpolation, "grid_size"):
        return [(kernel, interpolation)]
    return []


def _coarse_axes(kernel: Any, interpolation: Any) -> tuple[list[str], list[list[int]]]:
    r"""The axes whose fitted lengthscale is under the ratio (described), and for each
    grid part with such an axis the ``grid_size`` that would meet the ratio."""
    problems, sizes = [], []
    for part_kernel, grid in _grid_parts(kernel, interpolation):
        base = _lengthscale_kernel(part_kernel)
        if base is None:
            continue
        lengthscales = base.lengthscale.detach().reshape(-1).tolist()
        spacings = [float(axis[1] - axis[0]) for axis in grid.grid]
        if len(lengthscales) == 1:
            lengthscales = lengthscales * len(spacings)
        if len(lengthscales) != len(spacings):
            continue  # a batched or otherwise shaped kernel: nothing to compare
        suggested = list(grid.grid_size)
        for i, (ell, h) in enumerate(zip(lengthscales, spacings, strict=True)):
            ratio = ell / h
            if ratio < MIN_SPACINGS_PER_LENGTHSCALE:
                # Spacing extent / (g - 3) (one padding spacing on each side of the box).
                extent = h * (suggested[i] - 3)
                suggested[i] = math.ceil(MIN_SPACINGS_PER_LENGTHSCALE * extent / ell) + 3
                problems.append(f"{ell:.3g} = {ratio:.2f} spacings of {h:.3g} on axis {i}")
        if suggested != list(grid.grid_size):
            sizes.append(suggested)
    return problems, sizes


def suggested_grid_size(kernel: Any, interpolation: Any) -> list[int] | None:
    r"""The ``grid_size`` that puts :data:`MIN_SPACINGS_PER_LENGTHSCALE` grid spacings in
    every fitted lengthscale of a product grid, or None where the grid is fine enough
    (or is not one product grid). Reads the lengthscales on the host.

    Example:
        >>> import torch
        >>> from gpytorch.kernels import RBFKernel
        >>> from streamgp.interpolation.grid import CubicGridInterpolation
        >>> grid = CubicGridInterpolation(torch.tensor([[0.0], [1.0]]), [13])
        >>> kernel = RBFKernel()
        >>> kernel.lengthscale = 0.05  # 0.5 spacings of 0.1
        >>> suggested_grid_size(kernel, grid)
        [43]
    """
    if len(_grid_parts(kernel, interpolation)) != 1:
        return None
    _, sizes = _coarse_axes(kernel, interpolation)
    return sizes[0] if sizes else None


def coarse_grid_message(kernel: Any, interpolation: Any) -> str | None:
    r"""Why the grid is too coarse for ``kernel``'s lengthscales, or None if it is not.

    Reads the lengthscales on the host (one read per grid).

    Args:
        kernel: The model's kernel (``ScaleKernel``, RBF/Matern, or an additive sum of
            them, one per group of an additive grid).
        interpolation: The model's grid interpolation (a regular grid, or an additive one
            with ``parts``); others (SoftKI's points) are not checked.
    """
    problems, sizes = _coarse_axes(kernel, interpolation)
    if not problems:
        return None
    sizes_text = sizes[0] if len(sizes) == 1 else sizes
    return (
        f"Fitted lengthscale {'; '.join(problems)}: below {MIN_SPACINGS_PER_LENGTHSCALE:g} grid "
        "spacings, so the grid interpolates the kernel poorly (the posterior mean and "
        "covariances between points lose accuracy). Use a finer grid: grid_size="
        f"{sizes_text} or more (per axis of the grid)."
    )


class GridResolutionMixin:
    r"""Warn (:class:`CoarseGridWarning`, once per model) after a fit that leaves a
    lengthscale below :data:`MIN_SPACINGS_PER_LENGTHSCALE` grid spacings.

    A fit is training mode followed by eval mode (``fit_gpytorch_mll`` calls
    ``mll.train()`` and then ``mll.eval()``). List it before ``torch.nn.Module`` bases;
    the model needs ``covar_module`` (or :attr:`resolution_kernel`) and ``interpolation``.
    """

    _fitted_since_check = False
    _coarse_grid_warned = False

    @property
    def resolution_kernel(self) -> Any:
        r"""The kernel whose lengthscales are compared with the grid's spacing."""
        return self.covar_module

    def train(self, mode: bool = True) -> Any:
        if mode:
            self._fitted_since_check = True
        elif self._fitted_since_check:
            self._fitted_since_check = False
            self._check_grid_resolution()
        return super().train(mode)

    def check_grid_resolution(self, again: bool = False) -> None:
        r"""Warn (:class:`CoarseGridWarning`) if a fitted lengthscale is under the ratio.

        Args:
            again: Warn even if this model warned before (e.g. after a refinement that a
                cap kept coarse).
        """
        if again:
            self._coarse_grid_warned = False
        self._check_grid_resolution()

    def _check_grid_resolution(self) -> None:
        if self._coarse_grid_warned or skip_value_checks.on():
            return
        message = coarse_grid_message(self.resolution_kernel, self.interpolation)
        if message is not None:
            self._coarse_grid_warned = True
            warnings.warn(f"{type(self).__name__}: {message}", CoarseGridWarning, stacklevel=3)
