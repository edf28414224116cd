r"""Inducing points on a regular grid (as in KISS-GP / WISKI), optionally only where data fell.

With ``occupied_only=False`` the set is the whole grid from the start: the classic
fixed grid of structured kernel interpolation. With ``occupied_only=True`` the set is
the grid points nearest to at least one input seen so far, so it grows with the
explored region (useful in BO, where most of a high-resolution grid is never
visited).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from streamgp.inducing.base import InducingPointSelector
from streamgp.utils.validation import check_tensor


class GridSelector(InducingPointSelector):
    r"""Inducing points on a regular grid over ``bounds``.

    Args:
        bounds: ``2 x d`` lower and upper bounds (the grid includes both).
        grid_size: Points per dimension (an int for all dimensions, or one each).
        occupied_only: If True, only grid points that are the nearest grid point of
            some input seen so far (in grid order).

    Example:
        >>> bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
        >>> selector = GridSelector(bounds, grid_size=10, occupied_only=True)
        >>> Z = selector.update(torch.rand(20, 2, dtype=torch.float64))
    """

    def __init__(
        self, bounds: Tensor, grid_size: int | Sequence[int], occupied_only: bool = False
    ) -> None:
        super().__init__()
        check_tensor(bounds, "bounds", min_dim=2)
        if bounds.dim() != 2 or bounds.shape[0] != 2:
            raise ValueError(f"bounds must have shape 2 x d, got {tuple(bounds.shape)}.")
        if not (bounds[1] > bounds[0]).all():
            raise ValueError("bounds must have upper > lower in every dimension.")
        dim = bounds.shape[-1]
        sizes = [grid_size] * dim if isinstance(grid_size, int) else list(grid_size)
        if len(sizes) != dim or any(not isinstance(s, int) or s < 2 for s in sizes):
            raise ValueError(f"grid_size must be an int >= 2 or {dim} of them, got {grid_size!r}.")
        self.bounds = bounds
        self.sizes = sizes
        self.occupied_only = occupied_only
        axes = [
            torch.linspace(float(lo), float(hi), s, dtype=bounds.dtype, device=bounds.device)
            for lo, hi, s in zip(bounds[0], bounds[1], sizes, strict=True)
        ]
        self.grid = torch.cartesian_prod(*axes) if dim > 1 else axes[0].unsqueeze(-1)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._occupied = torch.zeros(self.grid.shape[0], dtype=torch.bool, device=self.grid.device)

    def _check_batch(self, X: Tensor) -> None:
        check_tensor(X, "X", like=self.grid, min_dim=2, last_dim=self.grid.shape[-1])

    def _update(self, X: Tensor) -> Tensor:
        if not self.occupied_only:
            return self.grid.clone()
        lo, hi = self.bounds
        size = torch.tensor(self.sizes, device=X.device)
        cell = ((X - lo) / (hi - lo) * (size - 1)).round().long()
        cell = torch.minimum(cell.clamp_min(0), size - 1)
        # Flat index with the first dimension slowest (cartesian_prod order).
        strides = torch.ones_like(size)
        for i in range(len(self.sizes) - 2, -1, -1):
            strides[i] = strides[i + 1] * size[i + 1]
        occupied = self._occupied.clone()  # state is replaced, never written in place
        occupied[(cell * strides).sum(-1)] = True
        self._occupied = occupied
        return self.grid[occupied].clone()
