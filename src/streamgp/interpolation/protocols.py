r"""The interfaces of an interpolation and of its rows, as ``typing.Protocol``\ s.

A kernel-interpolation model (:class:`~streamgp.models.WiskiGP` and its subclasses,
:class:`~streamgp.models.KissGP`) never asks which interpolation it holds: a regular grid
with sparse cubic weights (:class:`~streamgp.interpolation.grid.CubicGridInterpolation`),
one small grid per group of dimensions
(:class:`~streamgp.models.additive_wiski.AdditiveGridInterpolation`), or softmax weights
on learned points (:class:`~streamgp.models.online_softki.SoftmaxPointInterpolation`).
It uses the :class:`Interpolation` interface, and the rows ``W`` it returns through the
:class:`InterpolationRows` interface, sparse
(:class:`~streamgp.interpolation.grid.InterpolationWeights`) or dense
(:class:`~streamgp.interpolation.softmax.DenseInterpolationWeights`). Both protocols are
runtime-checkable: ``isinstance(obj, Interpolation)`` checks that the members exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Callable


@runtime_checkable
class InterpolationRows(Protocol):
    r"""Interpolation rows ``W`` (``batch x N x m``): the products SKI needs from them.

    Example:
        >>> from streamgp.interpolation.grid import CubicGridInterpolation
        >>> from streamgp.interpolation.softmax import DenseInterpolationWeights
        >>> grid = CubicGridInterpolation(torch.tensor([[0.0], [1.0]]), 8)
        >>> isinstance(grid.weights(torch.rand(3, 1)), InterpolationRows)
        True
        >>> isinstance(DenseInterpolationWeights(torch.rand(3, 8)), InterpolationRows)
        True
    """

    @property
    def num_grid(self) -> int:
        r"""``m``, the columns of ``W``."""

    @property
    def batch_shape(self) -> torch.Size: ...

    @property
    def num_rows(self) -> int: ...

    def matmul(self, rhs: Tensor) -> Tensor:
        r"""``W @ rhs`` (``rhs``: ``m x p``)."""

    def dot(self, vec: Tensor) -> Tensor:
        r"""``W @ vec`` for a vector (or ``k x m`` per-output vectors)."""

    def t_matvec(self, vec: Tensor) -> Tensor:
        r"""``W^T @ vec``."""

    def weighted_gram(self, weights: Tensor, sparse: bool = False) -> Tensor:
        r"""``W^T diag(weights) W`` (``m x m``)."""

    def add_weighted_gram(self, A: Tensor, weights: Tensor) -> Tensor:
        r"""``A + W^T diag(weights) W``."""

    def cat(self, other: Any) -> Any:
        r"""The rows of ``self`` followed by those of ``other``."""

    def detach(self) -> Any: ...

    def apply(self, fn: Callable[[Tensor], Tensor]) -> Any:
        r"""Every tensor passed through ``fn`` (a device or dtype move)."""

    def map_rows(self, fn: Callable[[Tensor], Tensor]) -> Any:
        r"""The rows' tensors passed through ``fn`` (e.g. an index into the rows)."""

    def to_dense(self) -> Tensor: ...


@runtime_checkable
class Interpolation(Protocol):
    r"""What a kernel-interpolation model holds as ``interpolation``: inputs to rows ``W``.

    Example:
        >>> from streamgp.interpolation.grid import CubicGridInterpolation
        >>> from streamgp.models.additive_wiski import AdditiveGridInterpolation
        >>> from streamgp.models.online_softki import SoftmaxPointInterpolation
        >>> box = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
        >>> isinstance(CubicGridInterpolation(box, 8), Interpolation)
        True
        >>> isinstance(AdditiveGridInterpolation(box, [[0], [1]], 8), Interpolation)
        True
        >>> points = SoftmaxPointInterpolation(torch.rand(10, 2), torch.tensor(0.1))
        >>> isinstance(points, Interpolation)
        True
    """

    @property
    def dim(self) -> int:
        r"""``d``, the input dimension."""

    @property
    def num_grid(self) -> int:
        r"""``m``, the interpolation points."""

    @property
    def grid_size(self) -> list[int]:
        r"""Points per axis (one entry, ``m``, for points that are not a grid)."""

    @property
    def bounds(self) -> Tensor:
        r"""``2 x d`` box of the interpolation (its dtype and device are the model's)."""

    def weights(self, X: Tensor) -> InterpolationRows:
        r"""The rows ``W`` of ``batch x N x d`` (transformed) inputs."""

    def check_inside(self, X: Tensor, name: str = "X") -> None:
        r"""Raise ``ValueError`` naming ``name`` if inputs lie where ``W`` is not defined."""

    def prediction_inputs(self, X: Tensor, extrapolation: str, name: str = "X") -> Tensor:
        r"""The inputs a prediction at ``X`` interpolates (``extrapolation`` outside)."""

    def to(self, device: torch.device | None = None, dtype: torch.dtype | None = None) -> Any:
        r"""The interpolation on ``device`` in ``dtype``."""
