r"""What an SKI model keeps of its observations: grid-space or data-space statistics.

Both classes offer one interface, the :class:`Statistics` protocol, so a model holds
either and never asks which:

- ``add(weights, y, noise)``: a new object that also holds ``q`` more rows;
- ``log_marginal_likelihood(kernel_root, noise_variance, tol)``: exact SKI ``log p(y)``,
  differentiable in the hyperparameters;
- ``posterior(kernel_root, noise_variance)``: the exact posterior (a
  :class:`~streamgp.linalg.woodbury.GridPosterior` or a
  :class:`~streamgp.linalg.data_space.DataPosterior`);
- ``to_grid()``: the grid-space statistics of the same rows;
- ``target_moments()`` and ``affine(alpha, beta)``: the targets' sum and sum of squares,
  and the statistics of ``alpha y + beta`` (noise ``alpha^2 lambda``), so an outcome
  standardisation can be re-estimated from all data exactly
  (:meth:`streamgp.models.WiskiGP.restandardize`); ``shift(beta)``: those of ``y + beta``
  (a constant prior mean ``-beta``, differentiable).

:class:`GridStatistics` holds ``A = W^T Lambda^{-1} W``, ``b = W^T Lambda^{-1} y``,
``c = y^T Lambda^{-1} y``, ``n`` and the noise sums (for homoskedastic noise the raw
sums, divided by the noise variance when used): its size and every cost are
independent of ``n`` (``O(m^3)`` per likelihood or factorisation).
:class:`DataStatistics` keeps the rows themselves (``O(n 4^d)`` memory) and works with
``n x n`` matrices (:mod:`streamgp.linalg.data_space`), which is cheaper while
``n < m``. A model folds its data statistics into grid statistics when ``n`` passes a
switch point, so memory stays ``O(m 4^d)`` at every ``n``; the likelihood and the
posterior are the same on both sides (they are exact SKI in both).

``weights`` is anything with the interpolation-weights interface
(:class:`~streamgp.interpolation.grid.InterpolationWeights`: ``weighted_gram``,
``t_matvec`` and kernel features through the kernel root).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.grid import InterpolationWeights
from streamgp.linalg.data_space import DataPosterior
from streamgp.linalg.grid_gram import CellGram
from streamgp.linalg.grid_kernel import GridKernelRoot
from streamgp.linalg.love import DEFAULT_TOLERANCE
from streamgp.linalg.structured import (
    structured_grid_posterior,
    structured_log_marginal_likelihood,
)
from streamgp.linalg.woodbury import (
    GridPosterior,
    factorize,
    log_marginal_likelihood,
    logdet_plus_quad,
)

_LOG_2PI = math.log(2.0 * math.pi)


@runtime_checkable
class Statistics(Protocol):
    r"""The interface of :class:`GridStatistics` and :class:`DataStatistics` (see above).

    Example:
        >>> like = torch.zeros(1, dtype=torch.float64)
        >>> isinstance(GridStatistics.empty(16, like, fixed_noise=False, sparse=False), Statistics)
        True
        >>> isinstance(DataStatistics.empty([4, 4], like, fixed_noise=False), Statistics)
        True
    """

    @property
    def count(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def add(self, weights: InterpolationWeights, y: Tensor, noise: Tensor | None = None) -> Any:
        r"""New statistics that also hold ``q`` more rows (this object is unchanged)."""

    def to_grid(self) -> GridStatistics:
        r"""The grid-space statistics of the same rows."""

    def log_marginal_likelihood(
        self, kernel_root: GridKernelRoot, noise_variance: Tensor, tol: float = DEFAULT_TOLERANCE
    ) -> Tensor:
        r"""Exact SKI ``log p(y)``, differentiable in the hyperparameters."""

    def posterior(
        self, kernel_root: GridKernelRoot, noise_variance: Tensor, tol: float = DEFAULT_TOLERANCE
    ) -> GridPosterior | DataPosterior:
        r"""The exact SKI posterior."""

    def target_moments(self) -> tuple[Tensor, Tensor]:
        r"""``(sum y, sum y^2)`` of the rows (homoskedastic noise only)."""

    def shift(self, beta: Tensor) -> Any:
        r"""The statistics of ``y + beta``."""

    def affine(self, alpha: Tensor, beta: Tensor) -> Any:
        r"""The statistics of ``alpha y + beta`` (noise ``alpha^2 lambda``)."""

    def select_outputs(self, pick: Any) -> Any:
        r"""The statistics of some outputs."""

    def apply(self, fn: Any) -> Any:
        r"""Every tensor passed through ``fn`` (a device or dtype move)."""


def _noise_sums(y: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Row precisions, ``sum(log noise)`` and ``sum(noise)`` (unit precision without noise);
    batched noise (``batch x q``) gives one sum per batch member."""
    if noise is None:
        zero = torch.zeros((), dtype=y.dtype, device=y.device)
        return y.new_ones(y.shape[-1]), zero, zero  # rows are shared by all outputs
    if noise.dim() > 1:
        return noise.reciprocal(), noise.log().sum(-1), noise.sum(-1)
    return noise.reciprocal(), noise.log().sum(), noise.sum()


def _add_sparse(A: Tensor, B: Tensor) -> Tensor:
    r"""``A + B`` for coalesced sparse COO matrices, as a new coalesced tensor.

    A stream's new rows almost always touch grid-point pairs that ``A`` already holds;
    then only ``A``'s values are copied and ``B``'s added at their positions (found by
    binary search in ``A``'s sorted, row-major indices): ``O(nnz(A))`` memory traffic
    instead of the sort of a full ``coalesce``. Otherwise the two are merged.
    """
    size = A.shape[-1]
    keys = A.indices()[0] * size + A.indices()[1]  # coalesced: sorted row-major
    new = B.indices()[0] * size + B.indices()[1]
    if keys.numel() > 0 and new.numel() > 0:
        position = torch.searchsorted(keys, new).clamp_max(keys.numel() - 1)
        if bool((keys[position] == new).all()):
            values = A.values().index_add(0, position, B.values())
            return torch.sparse_coo_tensor(
                A.indices(), values, A.shape, is_coalesced=True, check_invariants=False
            )
    return (A + B).coalesce()


#: See :data:`streamgp.settings.PENDING_FRACTION` (overridable here).
PENDING_FRACTION = settings.PENDING_FRACTION


def _sum_sparse(parts: tuple[Tensor, ...]) -> Tensor:
    """The coalesced sum of sparse COO matrices of one shape."""
    indices = torch.cat([p.indices() for p in parts], dim=-1)
    values = torch.cat([p.values() for p in parts])
    return torch.sparse_coo_tensor(
        indices, values, parts[0].shape, check_invariants=False
    ).coalesce()


@dataclass(frozen=True)
class GridStatistics:
    r"""Grid-space sufficient statistics, independent of ``n`` in size.

    Attributes:
        gram: ``m x m`` ``W^T Lambda^{-1} W`` of the rows merged so far (dense, or sparse
            COO for large grids); :attr:`A` is the whole sum.
        b: ``m`` ``W^T Lambda^{-1} y``; c: ``y^T Lambda^{-1} y``; n: the count. With
            ``k`` outputs observed at the same rows (one noise per row), ``b`` is
            ``k x m`` and ``c`` has ``k`` entries; everything else is shared. A batch of
            models (``batch x n`` rows, as a batched ``SingleTaskGP``'s training data)
            has ``batch x m x m`` ``gram`` (dense only), ``batch x m`` ``b`` and
            ``batch`` ``c`` (and noise sums with fixed noise); ``n`` is shared.
        sum_log_noise, sum_noise: ``sum(log lambda_i)`` and ``sum(lambda_i)``
            (zero without fixed noise).
        fixed_noise: True when rows carry their own noise (then ``A, b, c`` are
            weighted by it); False for homoskedastic noise (raw sums).
        pending: Sparse statistics only: the Gram matrices of rows added since the last
            merge into ``gram`` (each ``O(q 16^d)`` non-zeros), so that adding rows
            costs ``O(q 16^d)`` rather than ``O(nnz(A))``. They are merged when they
            reach :data:`PENDING_FRACTION` of ``gram`` and whenever :attr:`A` is read.
    """

    gram: Tensor
    b: Tensor
    c: Tensor
    n: Tensor
    sum_log_noise: Tensor
    sum_noise: Tensor
    fixed_noise: bool
    pending: tuple[Tensor, ...] = ()

    @staticmethod
    def empty(
        num_grid: int,
        like: Tensor,
        fixed_noise: bool,
        sparse: bool,
        batch_shape: tuple[int, ...] = (),
    ) -> GridStatistics:
        r"""No rows yet, for targets shaped like ``like`` (``n``, or ``k x n``: ``k`` outputs).

        ``batch_shape``: a batch of models (dense only), whose targets ``like`` are
        ``batch_shape x n``; ``A`` then gets the batch dimensions too.
        """
        tkwargs = {"dtype": like.dtype, "device": like.device}
        outputs = like.shape[:-1]
        if batch_shape and sparse:
            raise ValueError("Sparse (large-grid) statistics are unbatched.")
        if sparse:
            index = torch.zeros(2, 0, dtype=torch.long, device=like.device)
            A = torch.sparse_coo_tensor(
                index, torch.zeros(0, **tkwargs), (num_grid, num_grid), check_invariants=False
            )
        else:
            A = torch.zeros(*batch_shape, num_grid, num_grid, **tkwargs)
        zero = torch.zeros((), **tkwargs)
        b, c = torch.zeros(*outputs, num_grid, **tkwargs), torch.zeros(outputs, **tkwargs)
        if batch_shape and fixed_noise:  # the noise sums are per member
            noise = torch.zeros(batch_shape, **tkwargs)
            return GridStatistics(A, b, c, zero, noise, noise, fixed_noise)
        return GridStatistics(A, b, c, zero, zero, zero, fixed_noise)

    @cached_property
    def A(self) -> Tensor:
        r"""``W^T Lambda^{-1} W`` of every row (sparse: merged once per object, then kept)."""
        if not self.pending:
            return self.gram
        return _add_sparse(self.gram, _sum_sparse(self.pending))

    @property
    def sparse(self) -> bool:
        r"""Whether ``A`` is a sparse COO matrix (large grids); reading it merges nothing."""
        return self.gram.is_sparse

    @property
    def count(self) -> int:
        return int(self.n.item())

    @property
    def dtype(self) -> torch.dtype:
        return self.b.dtype

    @property
    def device(self) -> torch.device:
        return self.b.device

    def add(self, weights: InterpolationWeights, y: Tensor, noise: Tensor | None = None):
        r"""Statistics after adding rows ``(W, y, noise)``; new tensors. A batch of models
        takes ``batch x q`` rows (targets and noise), one set per member."""
        precision, log_noise, noise_sum = _noise_sums(y, noise if self.fixed_noise else None)
        gram, pending = self.gram, ()
        if self.sparse:
            # Once A has been read (a fit, a rebuild) its merge is kept, not redone later.
            gram, held = (self.A, ()) if "A" in self.__dict__ else (gram, self.pending)
            pending = (*held, weights.weighted_gram(precision, sparse=True))
            if sum(p._nnz() for p in pending) > PENDING_FRACTION * gram._nnz():
                gram, pending = _add_sparse(gram, _sum_sparse(pending)), ()
        else:
            gram = weights.add_weighted_gram(gram, precision)
        return self._add_sums(weights, y, precision, log_noise, noise_sum, gram, pending)

    def _add_sums(self, weights, y, precision, log_noise, noise_sum, gram, pending):
        # Everything but the Gram matrix, which the caller has summed.
        return GridStatistics(
            gram=gram,
            b=self.b + weights.t_matvec(precision * y),
            c=self.c + (precision * y * y).sum(-1),
            n=self.n + y.shape[-1],
            sum_log_noise=self.sum_log_noise + log_noise,
            sum_noise=self.sum_noise + noise_sum,
            fixed_noise=self.fixed_noise,
            pending=pending,
        )

    @staticmethod
    def of_rows(
        chunks: Iterable[tuple[InterpolationWeights, Tensor, Tensor | None]],
        num_grid: int,
        like: Tensor,
        fixed_noise: bool,
        sparse: bool,
        batch_shape: tuple[int, ...] = (),
    ) -> GridStatistics:
        r"""The statistics of many rows, given in chunks ``(weights, y, noise)``.

        The same sums as adding the chunks one by one with :meth:`add`. Sparse statistics
        of rows with per-axis (Kronecker) structure, as cubic interpolation on a regular
        grid gives, sum their Gram matrix cell by cell
        (:class:`~streamgp.linalg.grid_gram.CellGram`) and form one coalesced sparse
        matrix at the end, instead of a sparse matrix of ``q 16^d`` entries per chunk
        and its merge: a ``32^3`` grid absorbs ``10^6`` rows in seconds, not minutes.
        ``batch_shape``: a batch of models (:meth:`empty`), rows ``batch_shape x q``.
        """
        stats = GridStatistics.empty(num_grid, like, fixed_noise, sparse, batch_shape)
        cells = None
        for weights, y, noise in chunks:
            if not (sparse and weights.axes and weights.indices.dim() == 2):
                stats = stats.add(weights, y, noise)
                continue
            precision, log_noise, noise_sum = _noise_sums(y, noise if fixed_noise else None)
            if cells is None:
                grid_size = [a.num_grid for a in weights.axes]
                cells = CellGram(grid_size, weights.axes[0].indices.shape[-1], weights.values)
            cells.add(
                [a.indices for a in weights.axes], [a.values for a in weights.axes], precision
            )
            stats = stats._add_sums(
                weights, y, precision, log_noise, noise_sum, stats.gram, stats.pending
            )
        if cells is None:
            return stats
        gram = cells.sparse()
        if stats.A._nnz() > 0:  # some chunks without per-axis structure
            gram = _add_sparse(stats.A, gram)
        return replace(stats, gram=gram, pending=())

    def to_grid(self) -> GridStatistics:
        return self

    def sums_and_precision(
        self, noise_variance: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        r"""``(A, b, c, n, sum(log noise), precision)``: the sums and their common noise weight.

        With fixed noise the sums are already weighted row by row and ``precision`` is
        None; with homoskedastic noise they are the raw sums and ``precision = 1 / s2``
        (differentiable in the noise), to be applied by whoever uses them.
        """
        if self.fixed_noise:
            return self.A, self.b, self.c, self.n, self.sum_log_noise, None
        s2 = noise_variance
        return self.A, self.b, self.c, self.n, self.n * s2.log(), s2.reciprocal()

    def weighted(self, noise_variance: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        r"""Noise-weighted ``(A, b, c, n, sum(log noise))``; differentiable in the noise.

        ``noise_variance`` (the homoskedastic level) is ignored with fixed noise.
        """
        A, b, c, n, sum_log_noise, precision = self.sums_and_precision(noise_variance)
        if precision is None:
            return A, b, c, n, sum_log_noise
        if precision.dim() > 0:  # one noise level per batch member
            vector = precision.unsqueeze(-1)
            return A * vector.unsqueeze(-1), b * vector, c * precision, n, sum_log_noise
        return A * precision, b * precision, c * precision, n, sum_log_noise

    def log_marginal_likelihood(
        self, kernel_root: GridKernelRoot, noise_variance: Tensor, tol: float = DEFAULT_TOLERANCE
    ) -> Tensor:
        r"""Exact SKI ``log p(y)`` in ``O(m^3)``, whatever ``n`` is.

        Sparse (large-grid) statistics use
        :func:`~streamgp.linalg.structured.structured_log_marginal_likelihood`: no
        ``m x m`` matrix, value within ``tol / 2`` (absolute; at least round-off of
        ``tr(G)``) of the exact one.
        """
        *sums, precision = self.sums_and_precision(noise_variance)
        if self.sparse:
            if sums[1].dim() != 1:
                raise ValueError("The large-grid marginal likelihood has one output only.")
            return structured_log_marginal_likelihood(
                kernel_root, *sums, precision=precision, tol=tol
            )
        return log_marginal_likelihood(kernel_root, *sums, precision=precision)

    def posterior(
        self, kernel_root: GridKernelRoot, noise_variance: Tensor, tol: float = DEFAULT_TOLERANCE
    ) -> GridPosterior:
        r"""The grid posterior: exact dense root, or a LOVE root for sparse (large) grids."""
        A, b, *_ = self.weighted(noise_variance)
        if A.is_sparse:
            return structured_grid_posterior(kernel_root, A, b, tol=tol).posterior
        return factorize(kernel_root, A, b)

    def target_moments(self) -> tuple[Tensor, Tensor]:
        r"""``(sum y, sum y^2)`` of the rows (homoskedastic noise only).

        Interpolation rows sum to one (``W 1 = 1``), so ``sum y = 1^T W^T y = 1^T b``;
        ``sum y^2`` is ``c``. With fixed noise only the noise-weighted sums are kept.
        """
        if self.fixed_noise:
            raise ValueError(
                "Grid statistics with fixed noise keep only noise-weighted target sums; the "
                "unweighted moments a Standardize needs are not recoverable."
            )
        return self.b.sum(-1), self.c

    def shift(self, beta: Tensor) -> GridStatistics:
        r"""The statistics of targets ``y + beta`` (differentiable in ``beta``, ``O(m^2)``).

        For either noise model, since interpolation rows sum to one (``W 1 = 1``),
        ``W^T Lambda^{-1} 1 = A 1`` and ``1^T Lambda^{-1} y = 1^T b``, so nothing else
        needs keeping. A constant prior mean is the shift of the targets by its negative.
        ``beta`` is a scalar, or one shift per output (shape ``k`` for ``k x m`` ``b``).
        """
        beta = torch.as_tensor(beta, dtype=self.b.dtype, device=self.b.device)
        A_one = (self.A @ torch.ones_like(self.b).unsqueeze(-1)).squeeze(-1)
        b = self.b + beta.unsqueeze(-1) * A_one
        c = self.c + 2 * beta * self.b.sum(-1) + beta**2 * A_one.sum(-1)
        return replace(self, b=b, c=c)

    def affine(self, alpha: Tensor, beta: Tensor) -> GridStatistics:
        r"""The statistics of targets ``alpha y + beta`` (fixed noise ``alpha^2 lambda``).

        ``O(m^2)``: the targets scaled by ``alpha``, then :meth:`shift` by ``beta``.
        """
        shifted = replace(self, b=alpha * self.b, c=alpha**2 * self.c).shift(beta)
        if not self.fixed_noise:  # raw sums; the learned noise is rescaled by the model
            return shifted
        scale = alpha**-2  # every row's precision
        return replace(
            shifted,
            gram=self.A * scale,
            pending=(),
            b=shifted.b * scale,
            c=shifted.c * scale,
            sum_log_noise=self.sum_log_noise + self.n * torch.log(alpha**2),
            sum_noise=self.sum_noise * alpha**2,
        )

    def select_outputs(self, pick) -> GridStatistics:
        r"""The statistics of some outputs: ``pick(tensor, dim)`` selects them along the
        output dimension ``dim`` of ``b`` and ``c`` (the Gram and noise sums are shared)."""
        return replace(self, b=pick(self.b, -2), c=pick(self.c, -1))

    def apply(self, fn) -> GridStatistics:
        r"""Apply a tensor function (``Module._apply``'s) to every tensor."""
        tensors = ("b", "c", "n", "sum_log_noise", "sum_noise")
        return replace(
            self,
            gram=fn(self.A),  # merged: one tensor to move
            pending=(),
            **{name: fn(getattr(self, name)) for name in tensors},
        )


@dataclass(frozen=True)
class DataStatistics:
    r"""The observed rows themselves, for exact SKI in data space while ``n`` is small.

    Attributes:
        weights: Interpolation rows ``W`` of the ``n`` observations.
        y: ``n`` targets (outcome-transformed), or ``k x n`` for ``k`` outputs.
        noise: ``n`` fixed noise variances, or None for homoskedastic noise.
    """

    weights: InterpolationWeights
    y: Tensor
    noise: Tensor | None

    @staticmethod
    def empty(grid_size: list[int], like: Tensor, fixed_noise: bool) -> DataStatistics:
        r"""No rows yet, on a grid with ``grid_size[j]`` points along axis ``j``."""

        def no_rows(num_grid: int, k: int) -> InterpolationWeights:
            index = torch.zeros(0, k, dtype=torch.long, device=like.device)
            return InterpolationWeights(index, like.new_zeros(0, k), num_grid)

        axes = tuple(no_rows(g, 4) for g in grid_size)
        if len(axes) > 1:  # factored, so that rows added stay factored if they are
            weights = InterpolationWeights(None, None, math.prod(grid_size), axes)
        else:
            weights = no_rows(math.prod(grid_size), 4 ** len(grid_size))
        y = like.new_zeros(*like.shape[:-1], 0)  # k x 0 for k outputs
        return DataStatistics(weights, y, like.new_zeros(0) if fixed_noise else None)

    @property
    def fixed_noise(self) -> bool:
        return self.noise is not None

    @property
    def count(self) -> int:
        return self.y.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.y.dtype

    @property
    def device(self) -> torch.device:
        return self.y.device

    @property
    def n(self) -> Tensor:
        # A fill on the device, not a copy from the host (which synchronises on CUDA).
        return self.y.new_full((), float(self.count))

    @property
    def sum_noise(self) -> Tensor:
        return self.y.new_zeros(()) if self.noise is None else self.noise.sum()

    def add(self, weights: InterpolationWeights, y: Tensor, noise: Tensor | None = None):
        r"""A new object holding these rows and ``q`` more (unbatched)."""
        rows = self.weights.cat(weights)
        new_noise = None
        if self.fixed_noise:
            new_noise = torch.cat([self.noise, noise])
        return DataStatistics(rows, torch.cat([self.y, y], dim=-1), new_noise)

    def to_grid(self, sparse: bool = False, chunk: int = 8192) -> GridStatistics:
        r"""The grid-space statistics of the same rows (in chunks of ``chunk`` rows)."""

        def chunks():
            for start in range(0, self.count, chunk):
                rows = slice(start, start + chunk)
                axes = tuple(
                    InterpolationWeights(a.indices[rows], a.values[rows], a.num_grid)
                    for a in self.weights.axes
                )
                if self.weights.is_factored:
                    weights = InterpolationWeights(None, None, self.weights.num_grid, axes)
                else:
                    weights = InterpolationWeights(
                        self.weights.indices[rows],
                        self.weights.values[rows],
                        self.weights.num_grid,
                        axes,
                    )
                yield weights, self.y[..., rows], None if self.noise is None else self.noise[rows]

        return GridStatistics.of_rows(
            chunks(), self.weights.num_grid, self.y, self.fixed_noise, sparse
        )

    def row_noise(self, noise_variance: Tensor) -> Tensor:
        r"""Each row's noise variance (``noise_variance`` for homoskedastic noise)."""
        return noise_variance.expand(self.count) if self.noise is None else self.noise

    def log_marginal_likelihood(
        self, kernel_root: GridKernelRoot, noise_variance: Tensor, tol: float = DEFAULT_TOLERANCE
    ) -> Tensor:
        r"""Exact SKI ``log p(y)`` in data space: ``O(n^2 sum_j g_j + n^3)``."""
        features = kernel_root.features(self.weights)
        B = features.gram() + torch.diag_embed(self.row_noise(noise_variance))
        return -0.5 * (logdet_plus_quad(B, self.y, 1.0) + self.count * _LOG_2PI)

    def posterior(
        self, kernel_root: GridKernelRoot, noise_variance: Tensor, tol: float = DEFAULT_TOLERANCE
    ) -> DataPosterior:
        r"""The exact data-space posterior (``tol`` is unused: nothing is approximated)."""
        return DataPosterior.build(
            kernel_root, self.weights, self.y, self.row_noise(noise_variance)
        )

    def target_moments(self) -> tuple[Tensor, Tensor]:
        r"""``(sum y, sum y^2)`` of the rows."""
        return self.y.sum(-1), (self.y * self.y).sum(-1)

    def shift(self, beta: Tensor) -> DataStatistics:
        r"""The rows with targets ``y + beta`` (a scalar, or one per output: shape ``k``)."""
        beta = torch.as_tensor(beta, dtype=self.y.dtype, device=self.y.device)
        return replace(self, y=self.y + beta.unsqueeze(-1))

    def affine(self, alpha: Tensor, beta: Tensor) -> DataStatistics:
        r"""The rows with targets ``alpha y + beta`` (and fixed noise ``alpha^2 lambda``)."""
        noise = None if self.noise is None else self.noise * alpha**2
        return DataStatistics(self.weights, alpha * self.y + beta, noise)

    def select_outputs(self, pick) -> DataStatistics:
        r"""The rows with some outputs' targets (``pick(y, -2)``; rows and noise are shared)."""
        return replace(self, y=pick(self.y, -2))

    def apply(self, fn) -> DataStatistics:
        r"""Apply a tensor function (``Module._apply``'s) to every tensor."""
        return DataStatistics(
            self.weights.apply(fn), fn(self.y), None if self.noise is None else fn(self.noise)
        )
