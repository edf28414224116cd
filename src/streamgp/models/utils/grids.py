r"""The regular grid a grid model (WISKI, KISS-GP) builds by default.

:func:`default_grid_size` spreads a device-dependent budget of points
(:data:`streamgp.settings.DEFAULT_GRID_POINTS`, ``DEFAULT_CUDA_GRID_POINTS``) evenly over the
domain, or, in ``d >= 4`` dimensions where the model stays in data space, a fixed number
of points per unit of extent (:class:`HighDimensionalGridWarning`). :func:`build_grid`
makes the interpolation over the default or given box (one that follows the data when the
model keeps it) and decides whether the grid is too large for a dense root.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.grid import CubicGridInterpolation, data_grid_bounds, grown_grid_bounds
from streamgp.linalg.grid_kernel import is_separable
from streamgp.utils.validation import check_grid_bounds

#: See :data:`streamgp.settings.DEFAULT_GRID_POINTS` (overridable here).
DEFAULT_GRID_POINTS = settings.DEFAULT_GRID_POINTS
#: See :data:`streamgp.settings.DEFAULT_CUDA_GRID_POINTS` (overridable here).
DEFAULT_CUDA_GRID_POINTS = settings.DEFAULT_CUDA_GRID_POINTS
#: See :data:`streamgp.settings.HIGH_DIM_POINTS_PER_UNIT` (overridable here).
HIGH_DIM_POINTS_PER_UNIT = settings.HIGH_DIM_POINTS_PER_UNIT


class HighDimensionalGridWarning(UserWarning):
    r"""A product grid in 4 or more dimensions: its updates are not constant in ``n``.

    Raised once per process and input dimension (see :func:`warn_high_dimensional`)
    when :class:`WiskiGP` builds its default grid for ``d >= 4`` inputs. Cubic
    interpolation there puts ``4^d`` weights on every input, so the model stays in data
    space and evaluates its kernel exactly (``n x n`` matrices: an exact GP, with its
    costs) instead of folding rows into a grid;
    :class:`~streamgp.models.AdditiveWiskiGP` is the model whose updates stay constant in
    ``n`` in those dimensions. Passing ``grid_size`` states the choice and silences it.
    """


#: (model class name, input dimension) pairs already warned about in this process.
_WARNED_HIGH_DIMENSIONAL: set[tuple[str, int]] = set()


def _filter_action(category: type[Warning], message: str) -> str:
    r"""The action of the first warnings filter that matches ``category`` and ``message``
    (module and line aside), or ``"default"``."""
    for action, pattern, filtered, _module, _line in warnings.filters:
        if issubclass(category, filtered) and (pattern is None or pattern.match(message)):
            return action
    return "default"


def warn_high_dimensional(model: str, dim: int, message: str, stacklevel: int = 2) -> None:
    r"""Warn ``message`` (a :class:`HighDimensionalGridWarning`) once per process for
    ``model`` on ``dim``-D inputs.

    Python's own once-per-location registry is cleared whenever a warnings filter changes,
    as it does inside every ``fit_gpytorch_mll`` call, so a BO loop that rebuilds its
    model each iteration would see the warning every iteration. A filter asking for every
    occurrence (``"always"``, ``"error"``, as ``pytest.warns`` sets) is still honoured.
    """
    key = (model, dim)
    if key in _WARNED_HIGH_DIMENSIONAL and _filter_action(
        HighDimensionalGridWarning, message
    ) not in ("always", "error"):
        return
    _WARNED_HIGH_DIMENSIONAL.add(key)
    warnings.warn(message, HighDimensionalGridWarning, stacklevel=stacklevel + 1)


def default_grid_size(
    dim: int,
    bounds: Tensor | None = None,
    device: torch.device | str | None = None,
    *,
    per_unit_from_dim: float = CubicGridInterpolation.FACTORED_FROM_DIM,
) -> list[int]:
    r"""Default points per dimension: about the device's budget in total, spaced evenly.

    The budget is ``DEFAULT_GRID_POINTS`` (CPU) or ``DEFAULT_CUDA_GRID_POINTS`` (CUDA).
    One spacing ``h`` serves every axis of the domain ``bounds`` (default: the unit
    cube), so a domain twice as wide along one axis gets twice the points there:
    ``g_i = extent_i / h`` with ``prod_i g_i`` about the budget, each between 4 and 256.
    Pass ``grid_size`` to a model to choose the grid yourself.

    In ``d >= per_unit_from_dim`` (4) dimensions, where ``WiskiGP`` stays in data space,
    every axis gets ``HIGH_DIM_POINTS_PER_UNIT`` points per unit of extent (plus the
    padding) instead of a share of a total budget; a model whose every prediction works
    on the grid (``KissGP``) keeps the budget in any ``d``.

    Example:
        >>> default_grid_size(3)
        [10, 10, 10]
        >>> default_grid_size(6)
        [35, 35, 35, 35, 35, 35]
        >>> default_grid_size(2, torch.tensor([[0.0, 0.0], [1.0, 4.0]]))
        [16, 64]
    """
    on_cuda = device is not None and torch.device(device).type == "cuda"
    budget = DEFAULT_CUDA_GRID_POINTS if on_cuda else DEFAULT_GRID_POINTS
    if bounds is None:
        extents = [1.0] * dim
    else:
        extents = [max(float(e), 1e-12) for e in (bounds[1] - bounds[0]).tolist()]
    if dim >= per_unit_from_dim:  # data space: axes cost apart
        spacing = 1.0 / HIGH_DIM_POINTS_PER_UNIT
        return [int(min(256, max(4, math.ceil(e / spacing - 1e-9) + 3))) for e in extents]
    spacing = (math.prod(extents) / budget) ** (1.0 / dim)
    return [int(min(256, max(4, math.floor(e / spacing + 1e-9)))) for e in extents]


def build_grid(
    train_X: Tensor,
    transformed_X: Tensor,
    grid_bounds: Tensor | None,
    grid_size: int | Sequence[int] | None,
    covar_module: Kernel,
    max_dense_grid: int,
    *,
    follow_data: bool = False,
    around_data: bool = False,
    budget_grid: bool = False,
    check_kernel: bool = True,
) -> tuple[CubicGridInterpolation, bool]:
    r"""The grid of an SKI model and whether it is too large for a dense root.

    Args:
        train_X: The training inputs (dtype and device).
        transformed_X: The transformed training inputs the grid must cover.
        grid_bounds: ``2 x d`` box of the grid, or None for the default.
        grid_size: Points per dimension, or None for :func:`default_grid_size` of the box.
        covar_module: The base kernel (grids above ``max_dense_grid`` need a
            Kronecker-structured one).
        max_dense_grid: Largest grid with a dense root.
        follow_data: The model keeps its data and re-grids: the default box is
            :func:`~streamgp.interpolation.grid.data_grid_bounds` and a box the data
            pass is grown (:func:`~streamgp.interpolation.grid.grown_grid_bounds`).
            False: the default box is the unit cube and data outside the box are refused.
        around_data: The inputs were normalised from these data (see
            :func:`~streamgp.interpolation.grid.data_grid_bounds`).
        budget_grid: The default size spreads the point budget in any ``d`` (a model
            without a data space), never points per unit of extent.
        check_kernel: Refuse a kernel without Kronecker structure on a structured grid
            (:func:`check_structured_kernel`); False for a model that may evaluate its
            kernel exactly instead (it checks once it has decided).

    Returns:
        The grid interpolation and ``structured`` (``m > max_dense_grid``).
    """
    dim = train_X.shape[-1]
    tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
    if grid_bounds is None:
        if follow_data:  # (over every batch member's rows)
            flat_X = transformed_X.detach().reshape(-1, dim)
            grid_bounds = data_grid_bounds(flat_X, around_data)
        else:
            grid_bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(**tkwargs)
    else:
        check_grid_bounds(grid_bounds, train_X, dim)
        if follow_data:
            grown = grown_grid_bounds(grid_bounds, transformed_X.detach())
            grid_bounds = grid_bounds if grown is None else grown
    interpolation = CubicGridInterpolation(
        grid_bounds,
        default_grid_size(
            dim,
            grid_bounds,
            train_X.device,
            per_unit_from_dim=math.inf if budget_grid else CubicGridInterpolation.FACTORED_FROM_DIM,
        )
        if grid_size is None
        else grid_size,
    )
    interpolation.check_inside(transformed_X, "train_X")
    structured = interpolation.num_grid > max_dense_grid
    if structured and check_kernel:
        check_structured_kernel(covar_module, interpolation, max_dense_grid)
    return interpolation, structured


def check_structured_kernel(
    covar_module: Kernel, interpolation: CubicGridInterpolation, max_dense_grid: int
) -> None:
    r"""Refuse a kernel without Kronecker structure on a grid too large for a dense root.

    Raises:
        ValueError: Naming the kernel and, by the grid's dimension, the remedy.
    """
    if is_separable(covar_module):
        return
    remedy = (
        " From 4-D on, leave grid_size and data_space_limit at their defaults: a WiskiGP "
        "then evaluates any kernel exactly."
        if interpolation.dim >= CubicGridInterpolation.FACTORED_FROM_DIM
        else " Use a coarser grid_size."
    )
    raise ValueError(
        f"A grid of {interpolation.num_grid} > MAX_DENSE_GRID = {max_dense_grid} points needs "
        "a Kronecker-structured kernel (RBF or ScaleKernel(RBF)); got "
        f"{type(covar_module).__name__}." + remedy
    )
