r"""Softmax interpolation onto learned points (SoftKI's ``W``).

Soft kernel interpolation (Camaño & Huang, "High-Dimensional Gaussian Process
Regression with Soft Kernel Interpolation", 2024; Definition 4.1) replaces SKI's
sparse cubic weights on a lattice by a softmax over ``m`` free interpolation points
``Z``:

.. math::

    W_{ij} = \frac{\exp(-\lVert x_i - z_j \rVert / T)}
                  {\sum_{k=1}^m \exp(-\lVert x_i - z_k \rVert / T)},

so every row is a probability vector over the points. The paper's definition is the
case ``T = 1``; the authors' code (and this module) add a temperature ``T > 0``,
which the model learns together with ``Z``. ``squared=True`` uses
``\lVert x_i - z_j \rVert^2 / T`` instead (a Gaussian-shaped weighting).

Two forms are offered:

- :func:`softmax_weights` / :class:`DenseInterpolationWeights`: the dense
  ``batch x N x m`` matrix (SoftKI's own definition: all points contribute);
- :func:`softmax_interpolation` with ``top_k``: the ``k`` largest weights per row,
  renormalised over those ``k``, as an
  :class:`~streamgp.interpolation.grid.InterpolationWeights` (``k`` entries per row),
  so code written for SKI's sparse ``W`` (e.g. ``GridStatistics.add``) takes them
  unchanged. With ``k = m`` it equals the dense form.

Both expose the interpolation-weights interface (``matmul``, ``dot``, ``t_matvec``,
``weighted_gram``, ``add_weighted_gram``, ``to_dense``). All weights are
differentiable in ``X``, ``Z`` and ``T`` and computed with a log-sum-exp, so tiny
temperatures give (numerically) one-hot rows instead of ``0 / 0``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.grid import InterpolationWeights
from streamgp.settings import value_warning

#: Floor on squared distances before the square root: ``sqrt`` has an infinite
#: derivative at 0 (a point sitting exactly on an interpolation point), the floor
#: makes it finite while changing distances by at most ``1e-15``.
_MIN_SQUARED_DISTANCE = 1e-30


class FarFromPointsWarning(UserWarning):
    r"""An input far outside the region the interpolation points cover."""


def far_from_points(X: Tensor, points: Tensor, margin: float = settings.FAR_MARGIN) -> Tensor:
    r"""Whether any row of ``X`` lies more than ``margin`` of the largest side of the
    points' bounding box beyond that box (a boolean tensor, computed on the device).

    There softmax weights fall on the nearest points alone: the point is modelled as if
    it were at them.

    Example:
        >>> Z = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
        >>> bool(far_from_points(torch.tensor([[1.2, 0.5]]), Z)), bool(
        ...     far_from_points(torch.tensor([[3.0, 0.5]]), Z))
        (False, True)
    """
    lower, upper = points.min(-2).values, points.max(-2).values
    pad = margin * (upper - lower).max()
    return ((X < lower - pad) | (X > upper + pad)).any()


def warn_far_predictions(
    X: Tensor, points: Tensor, margin: float = settings.FAR_MARGIN, name: str = "X"
) -> None:
    r"""Warn (:class:`FarFromPointsWarning`, in the call's one read) when SoftKI predicts
    or conditions at inputs far from every interpolation point: its posterior there is
    that of the nearest points (the variance does not revert to the prior's), and an
    observation there is absorbed at them."""

    def warn() -> None:
        warnings.warn(
            f"{name} has points far outside the region of the interpolation points (more "
            f"than {margin:g} of its extent beyond their box): softmax interpolation treats "
            "them as if at their nearest points, so a prediction there is those points' (the "
            "variance does not revert to the prior's) and an observation there is absorbed "
            "at them. Keep the inputs inside the region the points cover, or move the "
            "points (OnlineSoftKIGP.set_points).",
            FarFromPointsWarning,
            stacklevel=6,
        )

    value_warning(far_from_points(X, points, margin), warn)


def softmax_logits(X: Tensor, Z: Tensor, temperature: Tensor | float, squared: bool = False):
    r"""Unnormalised log weights ``-||x_i - z_j|| / T`` (or ``-||x_i - z_j||^2 / T``).

    Args:
        X: ``batch_shape x N x d`` inputs.
        Z: ``m x d`` interpolation points.
        temperature: Positive scalar ``T`` (tensor or float).
        squared: Use squared distances.

    Returns:
        ``batch_shape x N x m`` logits.
    """
    # Shift both sets by the (constant) centre of Z before the |x|^2 - 2 x.z + |z|^2
    # expansion: it cancels less, which matters in float32 for nearby points.
    centre = Z.detach().mean(0)
    Xc, Zc = X - centre, Z - centre
    sq = (
        Xc.square().sum(-1, keepdim=True)
        - 2.0 * Xc @ Zc.mT
        + Zc.square().sum(-1).expand(*Xc.shape[:-2], 1, Zc.shape[0])
    ).clamp_min(0.0)
    distance = sq if squared else sq.clamp_min(_MIN_SQUARED_DISTANCE).sqrt()
    return -distance / temperature


def softmax_weights(
    X: Tensor, Z: Tensor, temperature: Tensor | float, squared: bool = False
) -> Tensor:
    r"""Dense softmax interpolation weights (Definition 4.1 with temperature ``T``).

    Args:
        X: ``batch_shape x N x d`` inputs.
        Z: ``m x d`` interpolation points.
        temperature: Positive scalar ``T``.
        squared: Use squared distances.

    Returns:
        ``batch_shape x N x m`` weights; every row sums to one.

    Example:
        >>> Z = torch.rand(16, 3, dtype=torch.float64)
        >>> W = softmax_weights(torch.rand(5, 3, dtype=torch.float64), Z, 0.1)
        >>> torch.allclose(W.sum(-1), torch.ones(5, dtype=torch.float64))
        True
    """
    return torch.softmax(softmax_logits(X, Z, temperature, squared), dim=-1)


def softmax_interpolation(
    X: Tensor,
    Z: Tensor,
    temperature: Tensor | float,
    top_k: int | None = None,
    squared: bool = False,
) -> DenseInterpolationWeights | InterpolationWeights:
    r"""Softmax interpolation weights with the interpolation-weights interface.

    Args:
        X: ``batch_shape x N x d`` inputs.
        Z: ``m x d`` interpolation points.
        temperature: Positive scalar ``T``.
        top_k: If given, keep only the ``top_k`` largest weights of each row,
            renormalised over them (a softmax over the ``top_k`` largest logits), as a
            sparse :class:`InterpolationWeights`. ``None`` returns the dense weights.
        squared: Use squared distances.

    Returns:
        :class:`DenseInterpolationWeights` (``top_k=None``) or
        :class:`InterpolationWeights` with ``top_k`` entries per row.

    Example:
        >>> Z = torch.rand(64, 4, dtype=torch.float64)
        >>> W = softmax_interpolation(torch.rand(10, 4, dtype=torch.float64), Z, 0.05, top_k=8)
        >>> W.indices.shape, W.num_grid
        (torch.Size([10, 8]), 64)
    """
    m = Z.shape[-2]
    logits = softmax_logits(X, Z, temperature, squared)
    if top_k is None:
        return DenseInterpolationWeights(torch.softmax(logits, dim=-1))
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= m:
        raise ValueError(f"top_k must be an int in [1, {m}] (the number of points), got {top_k!r}.")
    top, indices = logits.topk(top_k, dim=-1)
    # Renormalising over the kept entries is the softmax of the kept logits.
    return InterpolationWeights(indices, torch.softmax(top, dim=-1), m)


@dataclass(frozen=True)
class DenseInterpolationWeights:
    r"""A dense ``batch_shape x N x m`` interpolation matrix ``W``.

    The dense counterpart of :class:`~streamgp.interpolation.grid.InterpolationWeights`
    (same methods), for softmax interpolation where every point has a weight on every
    interpolation point. The products are plain dense matrix products, which is what a
    dense ``W`` costs anyway (``O(N m)`` per vector).

    Attributes:
        values: ``batch_shape x N x m`` weights (differentiable).

    Example:
        >>> W = DenseInterpolationWeights(torch.softmax(torch.randn(5, 7), -1))
        >>> W.t_matvec(torch.ones(5)).shape
        torch.Size([7])
    """

    values: Tensor
    #: No per-axis factors (SKI's Kronecker grids have them; free points do not).
    axes: tuple = ()

    @property
    def num_grid(self) -> int:
        return self.values.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        return self.values.shape[:-2]

    @property
    def num_rows(self) -> int:
        return self.values.shape[-2]

    def matmul(self, rhs: Tensor) -> Tensor:
        r"""``W @ rhs`` for an ``m x p`` matrix ``rhs``."""
        return self.values @ rhs

    def dot(self, vec: Tensor) -> Tensor:
        r"""``W @ vec`` for a vector ``vec`` of length ``m``."""
        return self.values @ vec

    def t_matvec(self, vec: Tensor) -> Tensor:
        r"""``W^T vec`` for ``vec`` of length ``N`` (unbatched weights)."""
        return self.values.mT @ vec

    def weighted_gram(self, weights: Tensor, sparse: bool = False) -> Tensor:
        r"""``W^T diag(weights) W`` (unbatched weights); sparse COO if ``sparse``."""
        gram = self.values.mT @ (weights.unsqueeze(-1) * self.values)
        return gram.to_sparse() if sparse else gram

    def add_weighted_gram(self, A: Tensor, weights: Tensor) -> Tensor:
        r"""``A + W^T diag(weights) W`` for a dense ``m x m`` ``A``."""
        return torch.addmm(A, self.values.mT, weights.unsqueeze(-1) * self.values)

    def cat(self, other: DenseInterpolationWeights) -> DenseInterpolationWeights:
        r"""Rows of ``self`` followed by the rows of ``other`` (batch dims broadcast)."""
        if other.num_grid != self.num_grid:
            raise ValueError(
                f"Cannot stack weights on {self.num_grid} and {other.num_grid} points."
            )
        batch = torch.broadcast_shapes(self.batch_shape, other.batch_shape)
        a = self.values.expand(*batch, *self.values.shape[-2:])
        b = other.values.expand(*batch, *other.values.shape[-2:])
        return DenseInterpolationWeights(torch.cat([a, b], dim=-2))

    def detach(self) -> DenseInterpolationWeights:
        return DenseInterpolationWeights(self.values.detach())

    def apply(self, fn) -> DenseInterpolationWeights:
        r"""Apply a tensor function (``Module._apply``'s) to the values."""
        return DenseInterpolationWeights(fn(self.values))

    def map_rows(self, fn) -> DenseInterpolationWeights:
        r"""Apply a function of ``batch_shape x N x m`` tensors (a batch reshape)."""
        return DenseInterpolationWeights(fn(self.values))

    def to_dense(self) -> Tensor:
        return self.values
