r"""``W^T diag(p) W`` of Kronecker-structured interpolation rows, summed cell by cell.

On a ``d``-dimensional regular grid a cubic-interpolation row ``w`` is the Kronecker
product of ``d`` one-dimensional rows ``a_1, ..., a_d`` (first axis slowest), each with
``k`` (= 4) *consecutive* non-zeros starting at grid index ``c_j``; ``c = (c_1, ..., c_d)``
is the row's *cell*. Its Gram contribution ``w w^T = kron_j (a_j a_j^T)`` therefore

- touches only the ``k^d x k^d`` block of grid points ``c + [0, k)^d``, and
- is fixed by ``d`` symmetric ``k x k`` matrices: ``P = k (k + 1) / 2`` numbers per axis.

Scattering the ``k^{2d}`` (4096 at ``d = 3``) products of every row into a sparse COO
matrix and coalescing it sorts ``n k^{2d}`` entries. :class:`CellGram` instead adds
each row's ``P^d`` (1000) products of its axes' upper-triangle entries to its cell's
row of a ``#cells x P^d`` table (a row-wise ``index_add_``: contiguous, no sort), and
spreads the cell sums onto ``A``'s band once, one axis at a time: axis ``j`` maps
(cell ``c_j``, pair ``(r, s)``) to (grid row ``c_j + r``, offset ``s - r``). The band
``A[u, u + delta]``, ``|delta_j| < k``, becomes a coalesced sparse COO matrix with the
pattern of the direct scatter: the pairs that some observed cell covers (explicit zeros
included), so later updates find their entries in it.

Cost: ``O(n P^d)`` for the rows, ``O(#cells P^d)`` once; memory ``O(#cells P^d)``
(``29^3 x 1000`` float64 = 195 MB on a ``32^3`` grid) whatever ``n`` is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from streamgp.settings import skip_value_checks


def _spread_axis(cells: Tensor, axis: int, grid: int, pairs: list[tuple[int, int, int]]):
    r"""Map one axis of a cell table onto the band: ``(c, pair p) -> (c + r, s - r + k - 1)``.

    ``cells`` has that axis's cell index at dim ``axis`` and its pair index at
    ``axis + 1``; ``pairs`` lists ``(r, s, p)`` for every ordered pair of neighbours
    ``r, s`` in ``[0, k)`` with ``p`` the pair's column (symmetric pairs share one).
    Returns the table with those two dims replaced by ``grid`` rows and ``2k - 1`` offsets.
    """
    k = max(r for r, _, _ in pairs) + 1
    moved = cells.movedim((axis, axis + 1), (-2, -1))
    num_cells = moved.shape[-2]
    out = moved.new_zeros(*moved.shape[:-2], grid, 2 * k - 1)
    for r, s, p in pairs:  # k^2 shifted slice additions: exact sums, no index tensors
        out[..., r : r + num_cells, s - r + k - 1] += moved[..., p]
    return out.movedim((-2, -1), (axis, axis + 1))


class CellGram:
    r"""Running ``W^T diag(p) W`` of rows with Kronecker (per-axis) structure.

    Args:
        grid_size: Grid points per axis (``g_1, ..., g_d``; ``m = prod g_j``).
        k: Non-zeros per axis of a row (4 for cubic interpolation).
        like: A tensor with the dtype and device of the sums.

    Example:
        >>> from streamgp.interpolation import CubicGridInterpolation
        >>> grid = CubicGridInterpolation(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), 8)
        >>> w = grid.weights(torch.rand(5, 2))
        >>> gram = CellGram(grid.grid_size, 4, w.values)
        >>> gram.add([a.indices for a in w.axes], [a.values for a in w.axes], torch.ones(5))
        >>> gram.sparse().shape
        torch.Size([64, 64])
    """

    def __init__(self, grid_size: Sequence[int], k: int, like: Tensor) -> None:
        self.grid_size = tuple(int(g) for g in grid_size)
        self.k = k
        self.num_cells = tuple(g - k + 1 for g in self.grid_size)
        if min(self.num_cells) < 1:
            raise ValueError(f"A grid of {self.grid_size} points has no {k}-point cells.")
        upper = torch.triu_indices(k, k, device=like.device)
        self._upper = (upper[0], upper[1])
        num_pairs = upper.shape[1]
        self.sums = like.new_zeros(math.prod(self.num_cells), num_pairs ** len(self.grid_size))
        self.counts = like.new_zeros(math.prod(self.num_cells))

    @property
    def dim(self) -> int:
        return len(self.grid_size)

    def add(self, indices: Sequence[Tensor], values: Sequence[Tensor], weights: Tensor) -> None:
        r"""Add ``N`` rows given by their axes (``N x k`` grid indices and values each) and
        row weights ``weights`` (``N``; a row's noise precision). In place."""
        if len(indices) != self.dim or len(values) != self.dim:
            raise ValueError(f"Expected {self.dim} axes, got {len(indices)}.")
        cell = torch.zeros_like(indices[0][:, 0])
        for idx, cells in zip(indices, self.num_cells, strict=True):
            cell = cell * cells + idx[:, 0]  # first axis slowest, like the grid index
        if not skip_value_checks.on():
            steps = torch.arange(self.k, device=cell.device)
            for idx, cells in zip(indices, self.num_cells, strict=True):
                consecutive = bool((idx == idx[:, :1] + steps).all())
                if not consecutive or not bool(((idx[:, 0] >= 0) & (idx[:, 0] < cells)).all()):
                    raise ValueError("Rows must have k consecutive non-zeros inside the grid.")
        r, s = self._upper
        products = values[0][:, r] * values[0][:, s] * weights.unsqueeze(-1)
        for v in values[1:]:  # Kronecker product over axes, first axis slowest
            products = (products.unsqueeze(-1) * (v[:, r] * v[:, s]).unsqueeze(-2)).flatten(-2)
        self.sums.index_add_(0, cell, products)
        self.counts.index_add_(0, cell, torch.ones_like(weights))

    def _band(self, table: Tensor, pairs: list[tuple[int, int, int]], num_pairs: int) -> Tensor:
        # table: #cells x P^d -> m x (2k - 1)^d band, A[u, u + delta] at [u, delta + k - 1].
        d, width = self.dim, 2 * self.k - 1
        band = table.reshape(*self.num_cells, *([num_pairs] * d))
        band = band.permute(*[i for j in range(d) for i in (j, d + j)])  # (c_1, p_1, c_2, ...)
        for j, grid in enumerate(self.grid_size):
            band = _spread_axis(band, 2 * j, grid, pairs)
        band = band.permute(*range(0, 2 * d, 2), *range(1, 2 * d, 2))
        return band.reshape(math.prod(self.grid_size), width**d)

    def sparse(self) -> Tensor:
        r"""The sum so far as a coalesced ``m x m`` sparse COO matrix."""
        k, device = self.k, self.sums.device
        column = {}
        for p, (r, s) in enumerate(zip(*(t.tolist() for t in self._upper), strict=True)):
            column[(r, s)] = column[(s, r)] = p
        pairs = [(r, s, column[(r, s)]) for r in range(k) for s in range(k)]
        values = self._band(self.sums, pairs, self._upper[0].numel())
        # The pattern: pairs that some observed cell covers (counts spread the same way).
        ones = [(r, s, 0) for r, s, _ in pairs]
        covered = self._band(self.counts.unsqueeze(-1), ones, 1) > 0
        row, offset = covered.nonzero(as_tuple=True)  # row-major: sorted rows and columns
        strides = [math.prod(self.grid_size[j + 1 :]) for j in range(self.dim)]
        deltas = torch.cartesian_prod(*[torch.arange(1 - k, k, device=device)] * self.dim)
        shift = (deltas.reshape(-1, self.dim) * torch.tensor(strides, device=device)).sum(-1)
        m = math.prod(self.grid_size)
        return torch.sparse_coo_tensor(
            torch.stack([row, row + shift[offset]]),
            values[row, offset],
            (m, m),
            is_coalesced=True,
            check_invariants=False,
        )
