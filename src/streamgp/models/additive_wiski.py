r"""Additive WISKI: constant-time online SKI in 4-20 dimensions.

A product grid in ``d`` dimensions has ``g^d`` points and cubic interpolation puts
``4^d`` weights on every input (4,096 in 6-D), so WISKI's grid stops paying off beyond
three dimensions. An additive kernel

.. math::

    k(x, x') = \sum_{g=1}^G k_g(x_{S_g}, x'_{S_g})

over groups ``S_g`` of at most three input dimensions (Duvenaud, Nickisch & Rasmussen,
"Additive Gaussian Processes", NeurIPS 2011; Gardner et al., "Product Kernel
Interpolation for Scalable Gaussian Processes", AISTATS 2018, for SKI with additive
structure) puts each group on its own small grid ``U_g``. Its SKI approximation is
``k(x, x') ~ w(x)^T K_UU w(x')`` with the concatenated interpolation row
``w(x) = [w_1(x_{S_1}), ..., w_G(x_{S_G})]`` and the block-diagonal
``K_UU = diag(K_1, ..., K_G)``: the same algebra as WISKI's
(:class:`~streamgp.models.WiskiGP`) with ``m = sum_g m_g`` grid points and
``sum_g 4^{|S_g|}`` weights per input (24 for six singleton groups). So WISKI's
statistics, ``observe`` in ``O(m^2 q)``, rank-``q`` fantasies, LOVE and the marginal
likelihood in ``O(m^3)`` whatever ``n`` apply unchanged.

The rows are scaled by ``1 / G`` and the root of ``K_UU`` by ``G`` (the kernel is
unchanged): rows then sum to one, as WISKI's constant prior mean and
``restandardize`` require.

Choosing groups: singletons (the default) model main effects only, with the fewest
grid points and weights; pairs of dimensions (``groups="pairs"``, ``d (d - 1) / 2``
groups) add every two-way interaction at ``d^2 / 2`` times the cost; given groups
(a list of index lists) encode known structure. An additive model is a prior: on a
function with strong high-order interactions an exact GP with a product kernel fits
better at small ``n``, while the additive model stays cheap at any ``n``.

References:

.. [Duvenaud2011] D. Duvenaud, H. Nickisch, C. E. Rasmussen. Additive Gaussian
    Processes. Advances in Neural Information Processing Systems, 2011.
.. [Gardner2018] J. R. Gardner, G. Pleiss, R. Wu, K. Q. Weinberger, A. G. Wilson.
    Product Kernel Interpolation for Scalable Gaussian Processes. AISTATS, 2018.
.. [Stanton2021] S. Stanton, W. J. Maddox, I. Delbridge, A. G. Wilson. Kernel
    Interpolation for Scalable Online Gaussian Processes. AISTATS, 2021.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import torch
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from botorch.utils.types import DEFAULT, _DefaultType
from gpytorch.kernels import AdditiveKernel, Kernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.priors import GammaPrior
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.grid import (
    CubicGridInterpolation,
    GridBox,
    InterpolationWeights,
    data_grid_bounds,
    grown_grid_bounds,
)
from streamgp.linalg.grid_kernel import (
    GridKernelRoot,
    is_scaled_rbf,
    jittered_cholesky,
    stacked_rbf_roots,
)
from streamgp.models.wiski import WiskiGP
from streamgp.utils.validation import (
    check_count,
    check_grid_bounds,
    check_grid_model_data,
    learns_input_coefficients,
)

#: See :data:`streamgp.settings.DEFAULT_GROUP_GRID_SIZE` (overridable here).
DEFAULT_GROUP_GRID_SIZE = settings.DEFAULT_GROUP_GRID_SIZE
#: See :data:`streamgp.settings.ADDITIVE_GRID_POINTS` (overridable here).
ADDITIVE_GRID_POINTS = settings.ADDITIVE_GRID_POINTS
#: Largest group (dimensions): a group's grid and its ``4^|S|`` weights grow
#: exponentially with it, as WISKI's do with ``d``.
MAX_GROUP_SIZE = 3


def check_groups(groups: object, dim: int) -> list[list[int]]:
    r"""The groups as lists of input dimensions, validated.

    Args:
        groups: ``"singletons"`` (one group per dimension), ``"pairs"`` (every pair of
            dimensions) or a sequence of sequences of dimension indices in ``[0, d)``, each
            of 1 to ``MAX_GROUP_SIZE`` distinct dimensions.
        dim: The input dimension ``d``.

    Example:
        >>> check_groups("pairs", 3)
        [[0, 1], [0, 2], [1, 2]]
    """
    if groups == "singletons":
        return [[i] for i in range(dim)]
    if groups == "pairs":
        if dim < 2:
            raise ValueError(f"groups='pairs' needs at least 2 input dimensions, got {dim}.")
        return [list(pair) for pair in itertools.combinations(range(dim), 2)]
    if isinstance(groups, str) or not isinstance(groups, Sequence) or len(groups) == 0:
        raise ValueError(
            "groups must be 'singletons', 'pairs' or a non-empty list of lists of input "
            f"dimensions, got {groups!r}."
        )
    checked = []
    for group in groups:
        if isinstance(group, str) or not isinstance(group, Sequence):
            raise ValueError(f"groups: each group must be a list of dimensions, got {group!r}.")
        if not 1 <= len(group) <= MAX_GROUP_SIZE:
            raise ValueError(
                f"groups: each group must have 1 to {MAX_GROUP_SIZE} dimensions, got {group!r}."
            )
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in group):
            raise ValueError(f"groups: dimensions must be ints, got {group!r}.")
        if len(set(group)) != len(group) or not all(0 <= i < dim for i in group):
            raise ValueError(
                f"groups: group {list(group)} must name distinct dimensions in [0, {dim}) "
                f"(train_X has {dim} columns)."
            )
        checked.append([int(i) for i in group])
    return checked


def default_group_grid_sizes(groups: list[list[int]]) -> list[int]:
    r"""The default points per axis of each group's grid.

    ``DEFAULT_GROUP_GRID_SIZE`` by the group's size, except that singleton groups (the
    default structure) share a budget of ``ADDITIVE_GRID_POINTS`` grid points once there
    are more than ``ADDITIVE_GRID_POINTS // 64`` of them: the ``O(m^3)`` grid algebra
    then stays that of ``d = 10`` while each axis keeps at least half its points.

    Args:
        groups: Lists of input dimensions (:func:`check_groups`).

    Example:
        >>> default_group_grid_sizes([[i] for i in range(10)])[0]
        64
        >>> default_group_grid_sizes([[i] for i in range(20)])[0]
        32
    """
    sizes = [DEFAULT_GROUP_GRID_SIZE[len(group)] for group in groups]
    if all(len(group) == 1 for group in groups) and sum(sizes) > ADDITIVE_GRID_POINTS:
        singleton = DEFAULT_GROUP_GRID_SIZE[1]
        size = max(singleton // 2, ADDITIVE_GRID_POINTS // len(groups))
        sizes = [size] * len(groups)
    return sizes


class AdditiveGridInterpolation(GridBox):
    r"""Cubic interpolation onto one small grid per group, rows concatenated.

    Row ``w(x) = [w_1(x_{S_1}), ..., w_G(x_{S_G})] / G`` (so rows sum to one), with
    ``w_g`` the cubic weights of :class:`~streamgp.interpolation.grid.CubicGridInterpolation`
    on group ``g``'s grid over the box ``bounds[:, S_g]``.

    Args:
        bounds: ``2 x d`` box (transformed input space).
        groups: Lists of input dimensions (:func:`check_groups`).
        grid_size: Points per axis of every group's grid: an int, one int per group, or
            None for :func:`default_group_grid_sizes`.

    Example:
        >>> bounds = torch.tensor([[0.0] * 4, [1.0] * 4], dtype=torch.float64)
        >>> interp = AdditiveGridInterpolation(bounds, [[0], [1, 2], [3]], grid_size=10)
        >>> interp.num_grid, interp.weights(torch.rand(5, 4, dtype=torch.float64)).indices.shape
        (120, torch.Size([5, 24]))
    """

    def __init__(
        self, bounds: Tensor, groups: list[list[int]], grid_size: int | list[int] | None
    ) -> None:
        self.bounds = bounds
        self.groups = [list(group) for group in groups]
        if grid_size is None:
            sizes = default_group_grid_sizes(self.groups)
        elif isinstance(grid_size, int):
            sizes = [grid_size] * len(self.groups)
        else:
            sizes = [int(g) for g in grid_size]
        self.axis_sizes = sizes
        self.parts = [
            CubicGridInterpolation(bounds[:, group], size)
            for group, size in zip(self.groups, sizes, strict=True)
        ]
        self._columns = [torch.tensor(group, device=bounds.device) for group in self.groups]
        offsets, total = [], 0
        for part in self.parts:
            offsets.append(total)
            total += part.num_grid
        self.offsets = offsets
        # Singleton groups of one size (the default) are the axes of one product grid over
        # their columns: its per-axis rows, computed in one call for all groups, are the
        # groups' rows (no Python loop over groups on the hot path).
        self._singletons = None
        if all(len(group) == 1 for group in self.groups) and len(set(sizes)) == 1:
            columns = torch.tensor([group[0] for group in self.groups], device=bounds.device)
            self._singletons = (
                columns,
                CubicGridInterpolation(bounds[:, columns], [sizes[0]] * len(self.groups)),
                torch.tensor(offsets, device=bounds.device),
            )

    @property
    def dim(self) -> int:
        return self.bounds.shape[-1]

    @property
    def num_grid(self) -> int:
        return self.offsets[-1] + self.parts[-1].num_grid

    @property
    def grid_size(self) -> list[int]:
        return [self.num_grid]

    def weights(self, X: Tensor) -> InterpolationWeights:
        r"""``batch_shape x N x sum_g 4^|S_g|`` weights of ``batch_shape x N x d`` points."""
        scale = 1.0 / len(self.parts)
        if self._singletons is not None:
            columns, grid, offsets = self._singletons
            rows = grid.weights(X.index_select(-1, columns))
            indices, _ = rows.stacked_axes()
            # groups x ... x N x 4 -> ... x N x (groups 4), group-major as the loop below
            offsets = offsets.view(-1, *[1] * (indices.dim() - 1))
            indices = (indices + offsets).movedim(0, -2).flatten(-2)
            base, values, _ = rows.axis_rows  # ... x N x groups x (1, 4)
            values = values * scale
            return InterpolationWeights(
                indices, values.flatten(-2), self.num_grid, group_rows=(base, values)
            )
        indices, values = [], []
        for part, columns, offset in zip(self.parts, self._columns, self.offsets, strict=True):
            rows = part.weights(X.index_select(-1, columns))
            indices.append(rows.indices + offset)
            values.append(rows.values * scale)
        return InterpolationWeights(torch.cat(indices, -1), torch.cat(values, -1), self.num_grid)

    @functools.cached_property
    def own_group_points(self) -> list[Tensor]:
        r"""Each group's ``m_g x |S_g|`` grid points in the group's own coordinates."""
        return [part.grid_points() for part in self.parts]

    def group_points(self) -> list[Tensor]:
        r"""Each group's grid points embedded in ``d`` dimensions (other coordinates 0)."""
        points = []
        for local, group in zip(self.own_group_points, self.groups, strict=True):
            full = local.new_zeros(len(local), self.dim)
            full[:, group] = local
            points.append(full)
        return points

    def to(self, device: torch.device | None = None, dtype: torch.dtype | None = None):
        r"""Return a copy on another device and/or dtype."""
        return AdditiveGridInterpolation(
            self.bounds.to(device=device, dtype=dtype), self.groups, self.axis_sizes
        )


def additive_kernel(groups: list[list[int]], like: Tensor) -> AdditiveKernel:
    r"""BoTorch's ``SingleTaskGP`` kernel on each group, scaled, and summed.

    Each group gets an RBF kernel with BoTorch's dimension-scaled lengthscale prior on
    its dimensions (``active_dims``) inside a ``ScaleKernel`` whose output scale starts at
    ``1 / G``, so the prior variance of the sum starts at one (standardised targets). The
    output scale has a ``Gamma(2, 2 G)`` prior (mean ``1 / G``), whose density vanishes at
    zero: without it the marginal likelihood on a few points switches most groups off
    (scales near ``e^-20``), and a warm start (BoTorch's loop) keeps them off for good. On
    BoTorch's closed-loop tutorial that left the objective model with one dimension.
    """
    parts = []
    for group in groups:
        base = get_covar_module_with_dim_scaled_prior(
            ard_num_dims=len(group), active_dims=torch.tensor(group)
        )
        scaled = ScaleKernel(base, outputscale_prior=GammaPrior(2.0, 2.0 * len(groups)))
        scaled.outputscale = 1.0 / len(groups)
        parts.append(scaled)
    return AdditiveKernel(*parts).to(like)


class AdditiveWiskiGP(WiskiGP):
    r"""WISKI with an additive kernel over low-dimensional groups: BoTorch's 4-20-D problems.

    A :class:`~streamgp.models.WiskiGP` (``observe`` in ``O(m^2 q)``, fantasies, LOVE,
    the marginal likelihood in ``O(m^3)`` whatever ``n``, fixed or learned noise,
    checkpoints, ``SingleTaskGP``'s defaults) whose kernel is a sum over groups of input
    dimensions, each on its own grid (see the module docs). It keeps its rows while ``n``
    is small (``data_space_limit``, data space as ``WiskiGP``'s), then grid statistics,
    with a dense ``m x m`` root.

    Args:
        train_X: ``n x d`` training inputs.
        train_Y: ``n x 1`` training targets.
        train_Yvar: Optional ``n x 1`` observed noise variances (fixed noise).
        likelihood: Gaussian likelihood for the learned-noise variant (default:
            ``SingleTaskGP``'s).
        covar_module: The additive kernel: a gpytorch ``AdditiveKernel`` with one part
            per group, each acting on its group's dimensions (``active_dims``). Default:
            :func:`additive_kernel` (a scaled RBF per group).
        outcome_transform: Default ``Standardize(m=1)``, as ``SingleTaskGP``'s; None for none.
        input_transform: Fitted on ``train_X``, then frozen. ``Normalize(d)`` without
            bounds is accepted: the box then is the data's plus a margin
            (:func:`~streamgp.interpolation.grid.data_grid_bounds`).
        groups: ``"singletons"`` (default), ``"pairs"`` or a list of lists of input
            dimensions (each 1 to 3 distinct dimensions; :func:`check_groups`).
        grid_size: Points per axis of every group's grid (default:
            :func:`default_group_grid_sizes`, 64 per singleton axis up to ``d = 10``).
        grid_bounds: ``2 x d`` box of the grids, in the transformed space. Default: the
            unit cube, or the data's box plus a margin with a learned input transform.
            A box the data pass is grown to cover them (see ``keep_data``); predictions
            outside follow ``extrapolation``.
        extrapolation: ``"nearest"`` (default) or ``"error"``, as in ``WiskiGP``.
        keep_data: As in ``WiskiGP``: keep the raw observations (``O(n d)``) so that an
            observation outside the box re-grids exactly (every group's grid over the
            grown box, the same points per axis); False refuses it instead.
        data_space_limit: Largest number of observations kept as rows (exact SKI with
            ``n x n`` matrices, the same model) before they are folded into grid sums.
            Default ``m // 4``: in data space the marginal likelihood costs ``O(n^2 m)``
            against ``O(m^3)`` on the grid (with ``m = 640``, ten singleton groups, value
            and gradient 31 / 48 / 107 ms at ``n`` = 50 / 150 / 300 against 73-75 ms,
            one CPU thread). 0: grid sums from the start.
        mean_module: None (a learned constant, the default), a ``ConstantMean`` or
            ``ZeroMean()``.
        exact_prior_variance: As in ``WiskiGP`` (default True): predictive variances
            get ``k(x, x) - w(x)^T K_UU w(x)``, here ``sum_g`` of each group's
            (:mod:`streamgp.linalg.prior_variance`), so the prior variance is the additive
            kernel's own; False: the exact SKI posterior.

    Example:
        >>> X = torch.rand(50, 6, dtype=torch.float64)
        >>> Y = torch.sin(3 * X).sum(-1, keepdim=True)
        >>> model = AdditiveWiskiGP(X, Y)  # six singleton groups, 6 x 64 grid points
        >>> model.interpolation.num_grid
        384
        >>> model = model.observe(X[:2], Y[:2])
        >>> model.posterior(torch.rand(3, 6, dtype=torch.float64)).mean.shape
        torch.Size([3, 1])
    """

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        likelihood: GaussianLikelihood | None = None,
        covar_module: Kernel | None = None,
        outcome_transform: OutcomeTransform | _DefaultType | None = DEFAULT,
        input_transform: InputTransform | None = None,
        *,
        groups: str | Sequence[Sequence[int]] = "singletons",
        grid_size: int | None = None,
        grid_bounds: Tensor | None = None,
        extrapolation: str = "nearest",
        keep_data: bool = True,
        data_space_limit: int | None = None,
        mean_module: ConstantMean | ZeroMean | None = None,
        exact_prior_variance: bool = True,
    ) -> None:
        check_grid_model_data(train_X, train_Y, train_Yvar, likelihood)
        dim = train_X.shape[-1]
        checked = check_groups(groups, dim)
        check_count(grid_size, "grid_size", minimum=4, allow_none=True)
        if covar_module is None:
            covar_module = additive_kernel(checked, like=train_X)
        elif not isinstance(covar_module, AdditiveKernel) or len(covar_module.kernels) != len(
            checked
        ):
            raise ValueError(
                "covar_module must be a gpytorch AdditiveKernel with one part per group "
                f"({len(checked)}), each on its group's dimensions (active_dims)."
            )
        if grid_bounds is not None:
            check_grid_bounds(grid_bounds, train_X, dim)
        around_data = learns_input_coefficients(input_transform)

        def build_interpolation(X_t: Tensor, y: Tensor, noise: Tensor | None):
            X_t = X_t.detach()
            if grid_bounds is None:
                bounds = data_grid_bounds(X_t, around_data)
            else:
                grown = grown_grid_bounds(grid_bounds, X_t) if keep_data is True else None
                bounds = grid_bounds if grown is None else grown
            interpolation = AdditiveGridInterpolation(bounds, checked, grid_size)
            interpolation.check_inside(X_t, "train_X")
            return interpolation

        super().__init__(
            train_X,
            train_Y,
            train_Yvar,
            likelihood,
            covar_module,
            outcome_transform,
            input_transform,
            extrapolation=extrapolation,
            interpolation=build_interpolation,
            keep_data=keep_data,
            data_space_limit=data_space_limit,
            mean_module=mean_module,
            exact_prior_variance=exact_prior_variance,
        )

    @property
    def groups(self) -> list[list[int]]:
        r"""The groups of input dimensions, one kernel and one grid each."""
        return self.interpolation.groups

    def kernel_root(self) -> GridKernelRoot:
        r"""Root ``G diag(L_1, ..., L_G)`` of ``G^2 K_UU`` (the rows carry ``1 / G``)."""
        interpolation = self.interpolation
        parts = self.covar_module.kernels
        if all(is_scaled_rbf(part) for part in parts):
            # (The default kernel: one batched evaluation and factorisation, no host read.)
            blocks = stacked_rbf_roots(parts, interpolation.own_group_points)
        else:
            blocks = [
                jittered_cholesky(part(points).to_dense())
                for part, points in zip(parts, interpolation.group_points(), strict=True)
            ]
        return GridKernelRoot.block_diagonal([block * len(blocks) for block in blocks])

    REGRIDS_INTERPOLATION = True
    FACTORY_DATA_SPACE = True

    def _default_data_space_limit(self, num_grid: int) -> int:
        return num_grid // 4  # where the data-space likelihood stops being cheaper

    def refine_grid(self, grid_size: Any = None, *, max_grid_points: int | None = None) -> Any:
        r"""Not available: each group has its own grid (``axis_sizes``).

        Raises:
            NotImplementedError: Build a new model with finer ``axis_sizes`` instead.
        """
        raise NotImplementedError(
            "AdditiveWiskiGP.refine_grid: each group of inputs has its own grid; build a "
            "new AdditiveWiskiGP with finer axis_sizes (and load_state_dict) instead."
        )

    def _regridded_interpolation(
        self, bounds: Tensor, X: Tensor, X_t: Tensor, grid_size: list[int] | None = None
    ) -> tuple[AdditiveGridInterpolation, bool]:
        interpolation = AdditiveGridInterpolation(
            bounds, self.interpolation.groups, self.interpolation.axis_sizes
        )
        interpolation.check_inside(X_t, "X")
        return interpolation, False

    def _grid_state(self) -> tuple[Tensor, Tensor]:
        return self.interpolation.bounds.detach(), torch.tensor(self.interpolation.axis_sizes)

    def _grid_from_state(self, bounds: Tensor, size: Tensor) -> tuple[Any, bool]:
        sizes = [int(g) for g in size.tolist()]
        return AdditiveGridInterpolation(bounds, self.interpolation.groups, sizes), False

    def _checkpoint_options(self) -> dict[str, Any]:
        return {**super()._checkpoint_options(), "groups": self.groups}
