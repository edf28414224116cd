r"""The identity "interpolation": rows that are the inputs, for a kernel evaluated exactly.

From four input dimensions a product grid cannot reach grid space (cubic interpolation
puts ``4^d`` weights on every point), so a :class:`~streamgp.models.WiskiGP` with the
default grid keeps its rows in data space for good. There the SKI kernel
``w(x)^T K_UU w(x')`` buys nothing: every block is ``n x n`` either way. Evaluating the
kernel itself is exact (no interpolation error) and, in ``d`` dimensions, costs one
``n x n x d`` contraction instead of a per-axis product of ``d`` interpolated blocks.

:class:`ExactKernelInputs` stands in for such a model's grid: it keeps the grid it
replaces (its box and sizes, reported as before) but returns the inputs themselves as
the rows (:class:`InputRows`), and the model's kernel root becomes an
:class:`~streamgp.linalg.exact_kernel.ExactKernelRoot`. The kernel is defined
everywhere, so no point is outside: observations never re-grid and predictions are
never clamped onto a box.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from streamgp.interpolation.grid import CubicGridInterpolation
from streamgp.settings import skip_value_checks, value_check


@dataclass(frozen=True)
class InputRows:
    r"""The rows of a kernel evaluated exactly: the (transformed) inputs themselves.

    The data-space counterpart of :class:`~streamgp.interpolation.grid.InterpolationWeights`
    for :class:`ExactKernelInputs`: it batches, concatenates and moves like them, and
    refuses the grid products (there is no grid).

    Attributes:
        inputs: ``batch_shape x N x d`` inputs.
        num_grid: The points of the grid the rows replace (for reports only).

    Example:
        >>> rows = InputRows(torch.rand(3, 2), num_grid=64)
        >>> rows.cat(InputRows(torch.rand(2, 2), num_grid=64)).num_rows
        5
    """

    inputs: Tensor
    num_grid: int
    #: No per-axis factors (nothing is interpolated).
    axes: tuple = ()
    num_axes: int = 0

    @property
    def batch_shape(self) -> torch.Size:
        return self.inputs.shape[:-2]

    @property
    def num_rows(self) -> int:
        return self.inputs.shape[-2]

    def cat(self, other: InputRows) -> InputRows:
        r"""Rows of ``self`` followed by the rows of ``other`` (batch dims broadcast)."""
        batch = torch.broadcast_shapes(self.batch_shape, other.batch_shape)
        a = self.inputs.expand(*batch, *self.inputs.shape[-2:])
        b = other.inputs.expand(*batch, *other.inputs.shape[-2:])
        return InputRows(torch.cat([a, b], dim=-2), self.num_grid)

    def detach(self) -> InputRows:
        return InputRows(self.inputs.detach(), self.num_grid)

    def apply(self, fn) -> InputRows:
        r"""Apply a tensor function (``Module._apply``'s) to the inputs."""
        return InputRows(fn(self.inputs), self.num_grid)

    def map_rows(self, fn) -> InputRows:
        r"""Apply a function of ``batch_shape x N x d`` tensors (a batch reshape)."""
        return InputRows(fn(self.inputs), self.num_grid)

    def unsqueeze_batch(self) -> InputRows:
        r"""The same rows with one more (size-one) batch dimension, right before the rows."""
        return InputRows(self.inputs.unsqueeze(-3), self.num_grid)

    def _no_grid(self, *args, **kwargs):
        raise TypeError(
            "These rows are inputs of a kernel evaluated exactly (a WiskiGP from 4-D on "
            "with the default grid): there is no grid to interpolate onto."
        )

    matmul = dot = t_matvec = weighted_gram = add_weighted_gram = to_dense = _no_grid


class ExactKernelInputs:
    r"""The interpolation of a model that evaluates its kernel exactly (see the module).

    Args:
        grid: The grid it replaces; its ``bounds``, ``grid_size`` and ``num_grid`` are
            reported as the model's (what a checkpoint's options and the model's
            ``grid_size`` describe).

    Example:
        >>> box = torch.tensor([[0.0] * 4, [1.0] * 4], dtype=torch.float64)
        >>> inputs = ExactKernelInputs(CubicGridInterpolation(box, 8))
        >>> inputs.weights(torch.rand(5, 4, dtype=torch.float64)).num_rows
        5
    """

    def __init__(self, grid: CubicGridInterpolation) -> None:
        self.grid_interpolation = grid

    @property
    def dim(self) -> int:
        return self.grid_interpolation.dim

    @property
    def num_grid(self) -> int:
        return self.grid_interpolation.num_grid

    @property
    def grid_size(self) -> list[int]:
        return self.grid_interpolation.grid_size

    @property
    def bounds(self) -> Tensor:
        return self.grid_interpolation.bounds

    def weights(self, X: Tensor) -> InputRows:
        r"""The rows of ``batch_shape x N x d`` inputs: the inputs themselves."""
        return InputRows(X, self.num_grid)

    def check_inside(self, X: Tensor, name: str = "X") -> None:
        r"""Raise ``ValueError`` naming ``name`` if ``X`` has NaN or Inf values (the kernel
        is defined everywhere else). Not inside :class:`~streamgp.settings.skip_value_checks`."""
        if skip_value_checks.on():
            return
        value_check(
            torch.isfinite(X).all().logical_not(),
            lambda: ValueError(f"{name} contains NaN or Inf values."),
        )

    def any_outside(self, X: Tensor) -> Tensor:
        r"""False (on the device): no point is outside the domain of an exact kernel."""
        return X.new_zeros((), dtype=torch.bool)

    def prediction_inputs(self, X: Tensor, extrapolation: str, name: str = "X") -> Tensor:
        r"""``X`` itself: an exact kernel needs no extrapolation policy."""
        return X

    def to(self, device: torch.device | None = None, dtype: torch.dtype | None = None):
        r"""Return a copy on another device and/or dtype."""
        return ExactKernelInputs(self.grid_interpolation.to(device=device, dtype=dtype))
