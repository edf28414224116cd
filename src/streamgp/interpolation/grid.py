r"""Regular grids and sparse cubic interpolation onto them (SKI's ``W``).

Structured kernel interpolation (Wilson & Nickisch, 2015) approximates
``k(x, x') ~ w(x)^T K_UU w(x')`` where ``U`` is a regular grid and ``w(x)`` holds
the cubic-convolution weights of ``x`` on its ``4^d`` neighbouring grid points.
This module builds the grid with :func:`gpytorch.utils.grid.create_grid` and the
weights with the cubic convolution kernel of gpytorch's ``Interpolation``, and wraps the
result in :class:`InterpolationWeights`, a sparse ``N x m`` matrix that knows the
products SKI models need without ever forming a dense ``N x m`` array.

The flat grid index puts the first input dimension slowest, matching
``torch.cartesian_prod`` and ``torch.kron(K_1, ..., K_d)``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from gpytorch.utils.grid import create_grid
from torch import Tensor

from streamgp import settings
from streamgp.settings import skip_value_checks, value_check, value_warning


@dataclass(frozen=True)
class InterpolationWeights:
    r"""Sparse interpolation matrix ``W`` with ``k`` non-zeros per row.

    Attributes:
        indices: ``batch_shape x N x k`` grid indices of the non-zeros (None with
            ``axis_rows`` or ``given_axes``: formed on first use, see below).
        values: ``batch_shape x N x k`` interpolation weights (differentiable
            with respect to the interpolated inputs; None with ``indices``).
        num_grid: ``m``, the number of grid points (columns of ``W``).
        given_axes: Optional per-axis 1-D weights whose row-wise Kronecker product is
            this ``W`` (first axis slowest), given explicitly; see :attr:`axes`.
        axis_rows: The same per-axis weights stacked (what
            :meth:`CubicGridInterpolation.weights` makes, as a by-product, without an
            operation per axis): ``(base, values, grid_size)`` with ``base`` the
            ``batch_shape x N x d x 1`` grid index of each axis' second neighbour (the
            four are ``base - 1 .. base + 2``), ``values`` their ``batch_shape x N x d x 4``
            weights and ``grid_size`` the points per axis.
        group_rows: For rows that are a sum over groups of one-dimensional cubic rows
            (:class:`~streamgp.models.additive_wiski.AdditiveGridInterpolation`'s
            singleton groups, concatenated group after group): ``(base, values)``, each
            group's ``batch_shape x N x G x 1`` base index on its own grid and its
            ``batch_shape x N x G x 4`` (scaled) weights, the flat rows' entries by group.

    In ``d`` dimensions a cubic row has ``k = 4^d`` non-zeros (4,096 in 6-D, 10^6 in
    10-D), while its axes hold ``4 d``. Rows built from their axes alone
    (:attr:`is_factored`, what :meth:`CubicGridInterpolation.weights` returns from
    ``FACTORED_FROM_DIM`` dimensions on) keep only those; the flat ``indices`` and
    ``values`` are formed (and kept) on first access, which exact SKI in data space with a
    Kronecker root never needs.
    """

    _indices: Tensor | None
    _values: Tensor | None
    num_grid: int
    given_axes: tuple[InterpolationWeights, ...] = ()
    axis_rows: tuple[Tensor, Tensor, tuple[int, ...]] | None = None
    group_rows: tuple[Tensor, Tensor] | None = None
    #: Gathered elements (``N k p``) up to which :meth:`matmul` gathers instead of
    #: multiplying a sparse matrix: 2^24, 128 MiB in float64.
    GATHER_LIMIT = 2**24

    @functools.cached_property
    def axes(self) -> tuple[InterpolationWeights, ...]:
        r"""Per-axis 1-D weights whose row-wise Kronecker product is this ``W`` (first
        axis slowest), or ``()``: kernels with Kronecker-factored roots use them to work
        with ``d`` small ``N x g_i`` products instead of one ``N x m`` product. Made from
        :attr:`axis_rows` on first use (most predictions never need them)."""
        if self.given_axes or self.axis_rows is None:
            return self.given_axes
        base, values, grid_size = self.axis_rows
        indices = base + torch.arange(-1, 3, device=base.device)
        return tuple(
            InterpolationWeights(indices[..., i, :], values[..., i, :], g)
            for i, g in enumerate(grid_size)
        )

    @property
    def num_axes(self) -> int:
        r"""The number of per-axis weights (0 without them), without forming them."""
        if self.given_axes or self.axis_rows is None:
            return len(self.given_axes)
        return len(self.axis_rows[2])

    def stacked_axes(self) -> tuple[Tensor, Tensor]:
        r"""The per-axis indices and weights stacked axis first: ``d x batch_shape x N x 4``
        each (a view of :attr:`axis_rows` when the interpolation made them)."""
        if self.given_axes or self.axis_rows is None:
            axes = self.axes
            return torch.stack([a.indices for a in axes]), torch.stack([a.values for a in axes])
        base, values, _ = self.axis_rows
        indices = base + torch.arange(-1, 3, device=base.device)
        return indices.movedim(-2, 0), values.movedim(-2, 0)

    @property
    def is_factored(self) -> bool:
        r"""True while only the per-axis weights exist (the flat rows not yet formed)."""
        return self._indices is None

    @property
    def indices(self) -> Tensor:
        r"""``batch_shape x N x k`` grid indices of the non-zeros."""
        if self._indices is None:
            self._flatten()
        return self._indices

    @property
    def values(self) -> Tensor:
        r"""``batch_shape x N x k`` interpolation weights."""
        if self._values is None:
            self._flatten()
        return self._values

    @property
    def num_weights(self) -> int:
        r"""``k``, the non-zeros per row (without forming factored rows)."""
        if self._indices is not None:
            return self._indices.shape[-1]
        if self.given_axes:
            return math.prod(axis.num_weights for axis in self.given_axes)
        return 4**self.num_axes  # cubic: four per axis

    def _flatten(self) -> None:
        # Row-wise Kronecker product of the axes, first axis slowest: the flat index is
        # ((i_1 g_2 + i_2) g_3 + i_3) ..., as in CubicGridInterpolation.weights.
        first, *rest = self.axes
        indices, values = first.indices, first.values
        for axis in rest:
            indices = (indices.unsqueeze(-1) * axis.num_grid + axis.indices.unsqueeze(-2)).flatten(
                -2
            )
            values = (values.unsqueeze(-1) * axis.values.unsqueeze(-2)).flatten(-2)
        object.__setattr__(self, "_indices", indices)
        object.__setattr__(self, "_values", values)

    @property
    def batch_shape(self) -> torch.Size:
        if self._indices is None:
            return self._row_shape[:-1]
        return self._indices.shape[:-2]

    @property
    def num_rows(self) -> int:
        if self._indices is None:
            return self._row_shape[-1]
        return self._indices.shape[-2]

    @property
    def _row_shape(self) -> torch.Size:
        # ``batch_shape x N`` of factored rows.
        if self.axis_rows is not None:
            return self.axis_rows[1].shape[:-2]
        return self.given_axes[0].batch_shape + (self.given_axes[0].num_rows,)

    def matmul(self, rhs: Tensor) -> Tensor:
        r"""``W @ rhs`` for an ``m x p`` matrix ``rhs`` (or a batch of them).

        Gathers the ``k`` rows of ``rhs`` each row of ``W`` touches and contracts them
        with the weights in one batched product: a fixed number of kernels, no host
        synchronisation (a sparse product coalesces its indices, which synchronises on
        CUDA). That takes ``O(N k p)`` memory; above :attr:`GATHER_LIMIT` gathered
        elements an unbatched ``rhs`` goes through a sparse product (``O(N p)``), as in
        building a model from many points.
        """
        k = self.indices.shape[-1]
        p = rhs.shape[-1]
        if (
            rhs.dim() > 2
            and self.batch_shape.numel() == 1
            and self.indices.numel() * rhs.shape[:-2].numel() * p > self.GATHER_LIMIT
        ):
            # One set of rows against a batch of matrices (each output's root): the batch
            # side by side as columns of one sparse product, never N x k x p per member.
            rhs_batch, m = rhs.shape[:-2], rhs.shape[-2]
            columns = rhs.reshape(-1, m, p).transpose(0, 1).reshape(m, -1)
            out = self._sparse_matmul(self.indices.reshape(-1, k), columns)
            out = out.reshape(-1, rhs_batch.numel(), p).transpose(0, 1)
            batch = torch.broadcast_shapes(self.batch_shape, rhs_batch)
            return out.reshape(*rhs_batch, self.num_rows, p).expand(*batch, self.num_rows, p)
        if rhs.dim() > 2 or self.indices.numel() * p <= self.GATHER_LIMIT:
            batch = torch.broadcast_shapes(self.batch_shape, rhs.shape[:-2])
            if rhs.dim() == 2:  # one shared rhs: index its rows directly
                # (one operation; index_select on the flattened indices gathers up to 2x
                # faster on a CPU but adds two reshapes per call to the hot paths' budget)
                rows = rhs[self.indices]
            elif self.batch_shape.numel() == 1:  # one set of rows for a batch of rhs
                flat = self.indices.reshape(-1)
                rows = rhs.index_select(-2, flat).reshape(*rhs.shape[:-2], self.num_rows, k, p)
                rows = rows.expand(*batch, self.num_rows, k, p)
            else:
                idx = self.indices.expand(*batch, self.num_rows, k).reshape(*batch, -1, 1)
                rows = rhs.expand(*batch, *rhs.shape[-2:]).gather(
                    -2, idx.expand(*idx.shape[:-1], p)
                )
                rows = rows.reshape(*batch, self.num_rows, k, p)
            values = self.values if self.values.dtype == rhs.dtype else self.values.to(rhs.dtype)
            # One batched product (views around a bmm), the k gathered rows per point.
            return torch.einsum("...k,...kp->...p", values, rows)
        out = self._sparse_matmul(self.indices.reshape(-1, k), rhs)
        return out.reshape(*self.batch_shape, self.num_rows, p)

    def _sparse_matmul(self, flat_idx: Tensor, rhs: Tensor) -> Tensor:
        r"""``W @ rhs`` through a sparse product, ``O(N p)`` memory: ``flat_idx`` the
        ``N x k`` indices of every row (the batch flattened), ``rhs`` one ``m x p``."""
        k = flat_idx.shape[-1]
        rows = torch.arange(flat_idx.shape[0], device=rhs.device).repeat_interleave(k)
        sparse = torch.sparse_coo_tensor(
            torch.stack([rows, flat_idx.reshape(-1)]),
            self.values.reshape(-1).to(rhs.dtype),
            size=(flat_idx.shape[0], self.num_grid),
            check_invariants=False,
        )
        return torch.sparse.mm(sparse, rhs)

    def cat(self, other: InterpolationWeights) -> InterpolationWeights:
        r"""Rows of ``self`` followed by the rows of ``other`` (batch dims broadcast)."""
        if other.num_grid != self.num_grid:
            raise ValueError(
                f"Cannot stack weights on {self.num_grid} and {other.num_grid} points."
            )
        batch = torch.broadcast_shapes(self.batch_shape, other.batch_shape)

        def stack(a: Tensor, b: Tensor, event_dims: int = 1) -> Tensor:
            def expand(x: Tensor) -> Tensor:
                shape = (*batch, *x.shape[x.dim() - event_dims - 1 :])
                return x if x.shape == shape else x.expand(shape)

            return torch.cat([expand(a), expand(b)], dim=-1 - event_dims)

        factored = self.is_factored and other.is_factored
        indices = None if factored else stack(self.indices, other.indices)
        values = None if factored else stack(self.values, other.values)
        if self.axis_rows is not None and other.axis_rows is not None:
            (base, axis_values, grid_size), (other_base, other_values, _) = (
                self.axis_rows,
                other.axis_rows,
            )
            axis_rows = (stack(base, other_base, 2), stack(axis_values, other_values, 2), grid_size)
            return InterpolationWeights(indices, values, self.num_grid, axis_rows=axis_rows)
        axes = ()
        if len(self.axes) == len(other.axes):
            axes = tuple(a.cat(b) for a, b in zip(self.axes, other.axes, strict=True))
        return InterpolationWeights(indices, values, self.num_grid, axes)

    def _with(self, index_fn, value_fn, base_fn, values_fn, axis_fn):
        # New weights with (indices, values) mapped by ``index_fn`` / ``value_fn`` (unless
        # factored: they are not formed for it), the per-axis rows mapped alike: stacked
        # rows by ``base_fn`` / ``values_fn``, given axes by ``axis_fn``.
        indices = None if self.is_factored else index_fn(self._indices)
        values = None if self.is_factored else value_fn(self._values)
        if self.axis_rows is not None and not self.given_axes:
            base, axis_values, grid_size = self.axis_rows
            axis_rows = (base_fn(base), values_fn(axis_values), grid_size)
            return InterpolationWeights(indices, values, self.num_grid, axis_rows=axis_rows)
        axes = tuple(axis_fn(a) for a in self.axes)
        return InterpolationWeights(indices, values, self.num_grid, axes)

    def detach(self) -> InterpolationWeights:
        r"""The same weights, cut from the graph of the inputs they were computed from."""
        return self._with(
            lambda indices: indices,
            Tensor.detach,
            lambda base: base,
            Tensor.detach,
            InterpolationWeights.detach,
        )

    def apply(self, fn) -> InterpolationWeights:
        r"""Apply a tensor function (``Module._apply``'s) to every tensor."""
        return self._with(fn, fn, fn, fn, lambda a: a.apply(fn))

    def map_rows(self, fn) -> InterpolationWeights:
        r"""Apply a function of ``batch_shape x N x k`` tensors (a batch reshape, e.g. an
        expand or a permute) to the indices and values; the per-axis rows are left out."""
        return InterpolationWeights(fn(self.indices), fn(self.values), self.num_grid)

    def dot(self, vec: Tensor) -> Tensor:
        r"""``W @ vec`` for a grid vector ``vec`` of shape ``m`` (gather, no matrix).

        ``vec`` may be a batch of grid vectors, ``L x m`` (e.g. the grid means of ``L``
        outputs): the result is ``broadcast(batch_shape, L) x N``.
        """
        if vec.dim() == 1:
            if vec.dtype != self.values.dtype:
                return (self.values * vec[self.indices]).sum(-1)
            # One batched dot product of the k gathered entries of each row.
            return torch.einsum("...k,...k->...", self.values, vec[self.indices])
        batch = torch.broadcast_shapes(self.batch_shape, vec.shape[:-1])
        rows, k = self.indices.shape[-2:]
        index = self.indices.expand(*batch, rows, k).reshape(*batch, rows * k)
        gathered = vec.expand(*batch, vec.shape[-1]).gather(-1, index)
        return (self.values * gathered.view(*batch, rows, k)).sum(-1)

    def t_matvec(self, vec: Tensor) -> Tensor:
        r"""``W^T vec`` for ``vec`` of shape ``... x N``.

        Leading dimensions of ``vec`` (several outputs' targets) are kept: ``... x m``.
        Batched weights (``batch x N`` rows, one matrix per batch member) broadcast with
        them: ``broadcast(batch, ...) x m``.
        """
        if self.batch_shape:
            return self._batched_t_matvec(vec)
        lead = vec.shape[:-1]
        out = vec.new_zeros(*lead, self.num_grid)
        source = (self.values * vec.unsqueeze(-1)).reshape(*lead, -1)
        return out.index_add_(-1, self.indices.reshape(-1), source)

    def _batched_t_matvec(self, vec: Tensor) -> Tensor:
        # Each batch member's W^T vec: one scatter-add into a flat (members x m) output.
        source = self.values * vec.unsqueeze(-1)  # batch x N x k, broadcast
        lead = source.shape[:-2]
        entries = source.shape[-2] * source.shape[-1]
        index = self.indices.expand(*lead, *self.indices.shape[-2:]).reshape(-1, entries)
        out = vec.new_zeros(index.shape[0], self.num_grid)
        return out.scatter_add_(-1, index, source.reshape(index.shape)).reshape(*lead, -1)

    def unsqueeze_batch(self) -> InterpolationWeights:
        r"""The same rows with one more (size-one) batch dimension, right before the rows.

        A multi-output model's rows broadcast against its per-output quantities this way
        (``batch x 1 x N`` rows against ``k`` outputs' ``batch x k x N`` targets).
        """
        return self._with(
            lambda indices: indices.unsqueeze(-3),
            lambda values: values.unsqueeze(-3),
            lambda base: base.unsqueeze(-4),
            lambda values: values.unsqueeze(-4),
            InterpolationWeights.unsqueeze_batch,
        )

    def _gram_entries(self, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # Row, column and value of every product w_ik w_il weights_i (duplicates summed
        # by the caller), for all rows i of W.
        k = self.indices.shape[-1]
        idx = self.indices.reshape(-1, k)
        vals = self.values.reshape(-1, k)
        rows = idx.unsqueeze(-1).expand(-1, k, k).reshape(-1)
        cols = idx.unsqueeze(-2).expand(-1, k, k).reshape(-1)
        prod = (vals.unsqueeze(-1) * vals.unsqueeze(-2)) * weights.reshape(-1, 1, 1)
        return rows, cols, prod.reshape(-1)

    def weighted_gram(self, weights: Tensor, sparse: bool = False) -> Tensor:
        r"""``W^T diag(weights) W`` (unbatched weights only).

        Dense ``m x m`` by default (``O(N k^2)`` scatter plus an ``m x m`` allocation);
        with ``sparse=True`` a coalesced sparse COO tensor with at most ``7^d``
        non-zeros per row, so memory is ``O(m 7^d)`` however many rows ``W`` has.
        """
        rows, cols, vals = self._gram_entries(weights)
        m = self.num_grid
        if sparse:
            return torch.sparse_coo_tensor(
                torch.stack([rows, cols]), vals, size=(m, m), check_invariants=False
            ).coalesce()
        out = weights.new_zeros(m, m)
        return out.index_put_((rows, cols), vals, accumulate=True)

    def add_weighted_gram(self, A: Tensor, weights: Tensor) -> Tensor:
        r"""``A + W^T diag(weights) W`` for a dense ``m x m`` ``A``: one copy of ``A``, no
        second ``m x m`` matrix. Batched rows (``batch x N``) add each member's Gram
        matrix to its own ``batch x m x m`` ``A``; ``weights`` broadcast to the rows."""
        if self.batch_shape:
            return self._batched_add_weighted_gram(A, weights)
        rows, cols, vals = self._gram_entries(weights)
        return A.index_put((rows, cols), vals, accumulate=True)

    def _batched_add_weighted_gram(self, A: Tensor, weights: Tensor) -> Tensor:
        # The unbatched scatter with a third index, the batch member (A flattened to
        # members x m x m; its batch dims are the rows').
        k, m = self.indices.shape[-1], self.num_grid
        idx = self.indices.reshape(-1, self.num_rows, k)
        members = idx.shape[0]
        vals = self.values.reshape(members, -1, k)
        weights = weights.expand(*self.batch_shape, self.num_rows).reshape(members, -1, 1, 1)
        prod = vals.unsqueeze(-1) * vals.unsqueeze(-2) * weights
        shape = (members, self.num_rows, k, k)
        rows = idx.unsqueeze(-1).expand(shape)
        cols = idx.unsqueeze(-2).expand(shape)
        member = torch.arange(members, device=idx.device).reshape(-1, 1, 1, 1).expand(shape)
        flat = A.reshape(members, m, m).index_put((member, rows, cols), prod, accumulate=True)
        return flat.reshape(A.shape)

    def to_dense(self) -> Tensor:
        r"""Dense ``batch_shape x N x m`` matrix (for tests and small problems only)."""
        out = self.values.new_zeros(*self.indices.shape[:-1], self.num_grid)
        return out.scatter_add(-1, self.indices, self.values)


class GridExtrapolationWarning(UserWarning):
    r"""A grid model predicted at points outside its grid (at the nearest box point)."""


#: The grid models' ``extrapolation`` policies (see ``prediction_inputs``).
EXTRAPOLATION_POLICIES = ("nearest", "error")


class GridBox:
    r"""The box a grid interpolation covers, and what it does with points outside.

    Shared by every grid interpolation (:class:`CubicGridInterpolation`, the additive
    model's one grid per group of dimensions): a subclass sets ``bounds`` (``2 x d``).
    """

    bounds: Tensor
    #: Relative tolerance on the bounds, so that round-off from input transforms
    #: (e.g. ``Normalize``) does not reject points that are on the boundary.
    BOUNDS_RTOL = 1e-6

    def check_inside(self, X: Tensor, name: str = "X") -> None:
        r"""Raise ``ValueError`` naming ``name`` if any row of ``X`` lies outside the bounds.

        Inside :class:`~streamgp.settings.skip_value_checks` nothing is checked (the
        weights clamp points onto the box)."""
        if skip_value_checks.on():
            return

        def error() -> ValueError:
            if not bool(torch.isfinite(X).all()):  # (NaN is "outside" on the device)
                return ValueError(f"{name} contains NaN or Inf values.")
            flat = X.reshape(-1, X.shape[-1])
            dims = self.outside(X).reshape(-1, X.shape[-1]).any(0).nonzero().flatten().tolist()
            return ValueError(
                f"{name} has points outside grid_bounds in dimension(s) {dims} "
                f"(bounds {self.bounds.tolist()}; observed min {flat.min(0).values.tolist()}, "
                f"max {flat.max(0).values.tolist()}). Normalize inputs "
                "into grid_bounds or build the model with wider grid_bounds."
            )

        value_check(self.any_outside(X), error)

    def _tolerance_box(self) -> tuple[Tensor, Tensor]:
        r"""The bounds widened by :attr:`BOUNDS_RTOL` of the extent (lower, upper; ``d``
        each), made once per ``bounds`` tensor rather than in every check."""
        cached = getattr(self, "_tolerance_box_cache", None)
        if cached is None or cached[0] is not self.bounds:
            lo, hi = self.bounds[0], self.bounds[1]
            tol = self.BOUNDS_RTOL * (hi - lo)
            cached = (self.bounds, lo - tol, hi + tol)
            self._tolerance_box_cache = cached
        return cached[1], cached[2]

    def outside(self, X: Tensor) -> Tensor:
        r"""Where ``X`` lies outside the bounds by more than :attr:`BOUNDS_RTOL` (a boolean
        tensor of ``X``'s shape, computed on the device)."""
        lo, hi = self._tolerance_box()
        return (X < lo) | (X > hi)

    def any_outside(self, X: Tensor) -> Tensor:
        r"""Whether any point of ``X`` lies outside the bounds by more than
        :attr:`BOUNDS_RTOL`, or is not a number (a boolean scalar on the device): the
        points that clamping to the widened box would move."""
        lo, hi = self._tolerance_box()
        with torch.no_grad():  # a flag: no graph
            return X.clamp(lo, hi).ne(X).any()

    def prediction_inputs(self, X: Tensor, extrapolation: str, name: str = "X") -> Tensor:
        r"""Points at which a grid model predicts, under its ``extrapolation`` policy.

        The SKI kernel is defined only inside the grid, but BoTorch evaluates posteriors
        outside the search box too (qLogNEI with constraints and no feasible point yet
        estimates an infeasible cost from points 10% beyond the data's box). With
        ``"nearest"`` such points are predicted at the nearest point of the box
        (constant extrapolation) and a warning says so; with ``"error"`` they raise.
        Observations are always required inside the box.
        """
        if extrapolation == "error":
            self.check_inside(X, name)
            return X
        if skip_value_checks.on():  # the weights clamp points onto the box
            return X

        def warn() -> None:
            warnings.warn(
                f"{name} has points outside grid_bounds; they are predicted at the nearest "
                "point of the grid box (constant extrapolation). Pass extrapolation='error' "
                "to the model to refuse them instead.",
                GridExtrapolationWarning,
                stacklevel=4,
            )

        # Only the points outside the box (beyond its round-off tolerance) move, onto the
        # widened box, where the weights clamp them onto the box itself; the others, and
        # their gradients, stay exactly as they are. A selection on the device, no host
        # decision; the flag (NaN included, which the finite check reports first) is read
        # with the call's one read.
        lo, hi = self._tolerance_box()
        moved = X.clamp(lo, hi)
        value_warning(moved.ne(X).any(), warn)
        return moved


class CubicGridInterpolation(GridBox):
    r"""A fixed regular grid over a box and cubic interpolation onto it.

    The grid has ``grid_size[i]`` points in dimension ``i``, spanning the bounds
    padded by one spacing on each side (built with gpytorch's ``create_grid``), so
    the bounds are grid points and every point inside them has all of its ``4^d``
    interpolation neighbours on the grid.

    Args:
        bounds: ``2 x d`` tensor of lower and upper bounds; sets dtype and device.
        grid_size: Points per dimension (an int for all, or one per dimension);
            at least 4 each.

    Example:
        >>> interp = CubicGridInterpolation(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), 20)
        >>> W = interp.weights(torch.rand(5, 2))
        >>> W.to_dense().shape
        torch.Size([5, 400])
    """

    #: Keys' cubic convolution kernel (``a = -0.5``, gpytorch's) at the four neighbours
    #: ``base - 1 .. base + 2`` of a point at offset ``t`` in ``[0, 1]`` from ``base``, as
    #: polynomials in ``t``: row ``p`` holds the coefficients of ``t^(3 - p)``.
    _CUBIC_COEFFICIENTS = (
        (-0.5, 1.5, -1.5, 0.5),
        (1.0, -2.5, 2.0, -0.5),
        (-0.5, 0.0, 0.5, 0.0),
        (0.0, 1.0, 0.0, 0.0),
    )

    def __init__(self, bounds: Tensor, grid_size: int | Sequence[int]) -> None:
        if bounds.ndim != 2 or bounds.shape[0] != 2:
            raise ValueError(f"grid_bounds must have shape 2 x d, got {tuple(bounds.shape)}.")
        if not torch.all(bounds[1] > bounds[0]):
            raise ValueError("grid_bounds: every upper bound must exceed its lower bound.")
        d = bounds.shape[-1]
        sizes = [int(grid_size)] * d if isinstance(grid_size, int) else [int(g) for g in grid_size]
        if len(sizes) != d or min(sizes) < 4:
            raise ValueError(
                f"grid_size must be an int or a sequence of {d} ints, each >= 4; got {grid_size}."
            )
        self.bounds = bounds
        self.grid_size = sizes
        # Pad exactly one spacing h = (hi - lo) / (g - 3) on each side, so that the
        # bounds are grid points and every point inside them has its 4 cubic
        # neighbours per dimension on the grid (create_grid's own `extend` pads by a
        # slightly different amount, leaving a sliver near the bounds where
        # gpytorch falls back to nearest-neighbour weights).
        padded = []
        for (lo, hi), g in zip(bounds.t().tolist(), sizes, strict=True):
            h = (hi - lo) / (g - 3)
            padded.append((lo - h, hi + h))
        self.grid = create_grid(
            sizes, padded, extend=False, device=bounds.device, dtype=bounds.dtype
        )
        tkwargs = {"device": bounds.device, "dtype": bounds.dtype}
        # Every constant of :meth:`weights` is made here, once, on the device and in the
        # layout it is used in (``d x 1``, against points as ``... x N x d x 1``): a host
        # constant copied per call would synchronise, and a per-call reshape, slice or
        # conversion is one more operation (a kernel launch on a GPU) per call.
        column = lambda values, **kw: torch.tensor(values, **kw).unsqueeze(-1)  # noqa: E731
        self._lower, self._upper = bounds[0].unsqueeze(-1), bounds[1].unsqueeze(-1)
        self._grid_start = column([axis[0].item() for axis in self.grid], **tkwargs)
        self._grid_spacing = column([(axis[1] - axis[0]).item() for axis in self.grid], **tkwargs)
        # The second neighbour ``base`` lies in [1, g - 3] (see :meth:`weights`).
        self._base_min = torch.ones(d, 1, dtype=torch.long, device=bounds.device)
        self._base_max = column([g - 3 for g in sizes], device=bounds.device)
        # Keys' kernel's coefficients, one row per power of the offset (Horner's rule).
        self._cubic = tuple(torch.tensor(self._CUBIC_COEFFICIENTS, **tkwargs).unbind())
        # The flat layout, for grids whose rows are formed flat (below FACTORED_FROM_DIM
        # dimensions; in many dimensions a flat index may not even fit in 64 bits).
        self._neighbour_offsets = None
        if d < self.FACTORED_FROM_DIM:
            # Flat index stride of each dimension (first dimension slowest).
            strides = [math.prod(sizes[i + 1 :]) for i in range(d)]
            self._stride_column = column(strides, device=bounds.device)
            # Flat offsets of the 4^d neighbours from the second one of every axis
            # (``base``), first dimension slowest: ``digits[i, j] - 1`` times axis i's
            # stride, summed.
            digits = torch.cartesian_prod(*[torch.arange(4, device=bounds.device)] * d)
            digits = digits.reshape(-1, d).mT.contiguous()  # d x 4^d: neighbour per axis
            self._neighbour_offsets = ((digits - 1) * self._stride_column).sum(0)
            # Where each factor of the tensor product sits among the d x 4 per-axis
            # weights: one gather lays all d factors of all 4^d products out at once
            # (``d 4^d`` numbers per point; beyond PRODUCT_GATHER_MAX of them, one outer
            # product per axis).
            self._product_index = (torch.arange(d, device=bounds.device).unsqueeze(-1), digits)

    #: From this many dimensions on, rows are returned factored (their ``4^d`` flat
    #: weights formed only when used; see :class:`InterpolationWeights`).
    FACTORED_FROM_DIM = 4
    #: Most gathered factors per point (``d 4^d``) for which :meth:`weights` forms the
    #: tensor product by one gather (d <= 4); above, axis by axis (less memory).
    PRODUCT_GATHER_MAX = 1024

    @property
    def dim(self) -> int:
        return len(self.grid_size)

    @property
    def num_grid(self) -> int:
        return math.prod(self.grid_size)

    def grid_points(self) -> Tensor:
        r"""All ``m x d`` grid points, first dimension slowest."""
        if self.dim == 1:
            return self.grid[0].unsqueeze(-1)
        return torch.cartesian_prod(*self.grid)

    def weights(self, X: Tensor) -> InterpolationWeights:
        r"""Interpolation weights of ``batch_shape x N x d`` points (assumed inside bounds).

        Vectorised over points and dimensions (no host synchronisation), with the
        cubic convolution kernel of :class:`gpytorch.utils.interpolation.Interpolation`
        and the same flat index (first dimension slowest); differentiable in ``X``.
        """
        # Each coordinate as ``... x N x d x 1``, against the ``d x 1`` constants.
        X = X.unsqueeze(-1)
        # Points within BOUNDS_RTOL of the box are clamped onto it; a no-op for
        # interior points, so gradients there are untouched.
        X = X.clamp(self._lower, self._upper)
        # Position in grid units. Inside the bounds the left neighbour `base` lies
        # in [1, g - 2]; capping it at g - 3 keeps the four neighbours base - 1 ..
        # base + 2 on the grid for points exactly on the upper bound (their offset
        # becomes 1, where the kernel puts all weight on grid point g - 2). Positions
        # are positive (about 1 at the lower bound), so the integer conversion, which
        # truncates, is their floor.
        position = (X - self._grid_start) / self._grid_spacing
        base = position.long().clamp(self._base_min, self._base_max)
        # The kernel at the neighbours base - 1 .. base + 2, by Horner's rule in the
        # offset t = position - base (in [0, 1]; differentiable in X, as ``base`` is
        # constant): three fused multiply-adds for every point and dimension at once.
        t = position - base
        c0, c1, c2, c3 = self._cubic
        per_dim_values = torch.addcmul(c3, torch.addcmul(c2, torch.addcmul(c1, t, c0), t), t)
        axis_rows = (base, per_dim_values, tuple(self.grid_size))
        if self._neighbour_offsets is None:  # 4^d weights a row: formed only if needed
            return InterpolationWeights(None, None, self.num_grid, axis_rows=axis_rows)
        indices = (base * self._stride_column).sum(-2) + self._neighbour_offsets
        # Tensor product over dimensions, first dimension's neighbour slowest.
        if self.dim * 4**self.dim <= self.PRODUCT_GATHER_MAX:
            factors = per_dim_values[(..., *self._product_index)].unbind(-2)
            values = functools.reduce(torch.mul, factors)
        else:
            values = per_dim_values[..., 0, :]
            for i in range(1, self.dim):
                values = (values.unsqueeze(-1) * per_dim_values[..., i, None, :]).flatten(-2)
        return InterpolationWeights(indices, values, self.num_grid, axis_rows=axis_rows)

    def to(self, device: torch.device | None = None, dtype: torch.dtype | None = None):
        r"""Return a copy on another device and/or dtype."""
        return CubicGridInterpolation(self.bounds.to(device=device, dtype=dtype), self.grid_size)


# ------------------------------------------------------------- grid boxes from data
#: See :data:`streamgp.settings.GRID_MARGIN` (overridable here).
GRID_MARGIN = settings.GRID_MARGIN
#: See :data:`streamgp.settings.GRID_GROWTH` (overridable here).
GRID_GROWTH = settings.GRID_GROWTH


def _extent(lower: Tensor, upper: Tensor) -> Tensor:
    r"""``upper - lower``, with 1 where it is (numerically) zero (a single point)."""
    extent = upper - lower
    tiny = 1e-8 * torch.maximum(lower.abs(), upper.abs()).clamp_min(1.0)
    return torch.where(extent > tiny, extent, torch.ones_like(extent))


def data_grid_bounds(X: Tensor, around_data: bool) -> Tensor:
    r"""The default ``2 x d`` grid box of (transformed) inputs ``X`` (``n x d``).

    Args:
        X: The transformed inputs the grid must cover (``n`` may be 0).
        around_data: True when the inputs were normalised from these very data (an
            input transform that learned its coefficients): the box is then the data's
            box plus a margin on each side, ``max(GRID_MARGIN, log(40 d) / (n - 1))`` (at
            most 1) of its extent. False: the unit cube,
            the search space of inputs normalised with known bounds, grown as
            :func:`grown_grid_bounds` does where the data reach beyond it.

    Example:
        >>> X = torch.tensor([[0.0, 0.5], [1.0, 1.0]], dtype=torch.float64)
        >>> data_grid_bounds(X, around_data=True)  # two points: a margin of their extent
        tensor([[-1.0000,  0.0000],
                [ 2.0000,  1.5000]], dtype=torch.float64)
        >>> data_grid_bounds(X, around_data=False)
        tensor([[0., 0.],
                [1., 1.]], dtype=torch.float64)
    """
    dim = X.shape[-1]
    unit = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(X)
    if len(X) == 0:
        return unit
    if not around_data:
        grown = grown_grid_bounds(unit, X)
        return unit if grown is None else grown
    lower, upper = X.min(0).values, X.max(0).values
    fraction = max(GRID_MARGIN, min(1.0, math.log(40 * X.shape[-1]) / max(len(X) - 1, 1)))
    margin = fraction * _extent(lower, upper)
    return torch.stack([lower - margin, upper + margin])


def grown_grid_bounds(
    bounds: Tensor, X: Tensor, rtol: float = GridBox.BOUNDS_RTOL
) -> Tensor | None:
    r"""A larger grid box that covers ``X`` (``... x d``), or None if ``bounds`` does.

    Each side that a point passes (by more than ``rtol`` of the extent, the tolerance of
    :meth:`CubicGridInterpolation.check_inside`) moves beyond the farthest point by
    ``GRID_MARGIN`` of the current extent, and by at least ``GRID_GROWTH`` of it.

    Example:
        >>> unit = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
        >>> grown_grid_bounds(unit, torch.tensor([[0.5, 1.1]], dtype=torch.float64))
        tensor([[0.0000, 0.0000],
                [1.0000, 1.5000]], dtype=torch.float64)
    """
    lower, upper = bounds[0], bounds[1]
    extent = upper - lower
    points = X.reshape(-1, X.shape[-1])
    if len(points) == 0:
        return None
    low, high = points.min(0).values, points.max(0).values
    below, above = low < lower - rtol * extent, high > upper + rtol * extent
    if not bool((below | above).any()):
        return None
    new_lower = torch.minimum(low - GRID_MARGIN * extent, lower - GRID_GROWTH * extent)
    new_upper = torch.maximum(high + GRID_MARGIN * extent, upper + GRID_GROWTH * extent)
    return torch.stack([torch.where(below, new_lower, lower), torch.where(above, new_upper, upper)])
