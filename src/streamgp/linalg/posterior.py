r"""The interfaces of an SKI model's posterior pieces, as ``typing.Protocol``\ s.

A kernel-interpolation model keeps its posterior in one of two spaces, and the same two
pieces in each:

- the **posterior** given its statistics: :class:`~streamgp.linalg.woodbury.GridPosterior`
  (grid space: ``N(alpha, R R^T)`` of the grid values) or
  :class:`~streamgp.linalg.data_space.DataPosterior` (data space: the ``n x n`` factor
  ``L_B`` and ``L_B^{-1} y``), made by :meth:`Statistics.posterior
  <streamgp.linalg.statistics.Statistics.posterior>`;
- its **correction** from conditioning (BoTorch's fantasies):
  :class:`~streamgp.linalg.woodbury.LowRankCorrection` or
  :class:`~streamgp.linalg.data_space.DataCorrection`, which conditions on more rows and
  predicts at test rows *given* a posterior of its space.

A model predicts with ``correction.predict_factors(posterior, rows)`` and conditions with
``correction.condition(posterior, rows, y, noise)`` whatever the space
(:class:`Posterior`, :class:`PosteriorCorrection`); how a posterior absorbs rows for good
differs between the spaces (a rank-``q`` root update or an extended Cholesky factor) and
is not part of the interface. Both protocols are runtime-checkable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Callable

    from streamgp.interpolation.protocols import InterpolationRows
    from streamgp.linalg.posterior_covariance import AmortizedCache


class _PerOutput(Protocol):
    r"""A piece whose outputs can be taken apart (BoTorch's ``subset_output``)."""

    def select_outputs(self, pick: Callable[[Tensor, int], Tensor]) -> Any:
        r"""The piece of some outputs, ``pick(tensor, dim)`` applied to each per-output
        tensor; the factors shared by all outputs stay shared."""


@runtime_checkable
class Posterior(_PerOutput, Protocol):
    r"""The SKI posterior given a model's statistics, in grid space or in data space.

    Example:
        >>> import torch
        >>> from streamgp.linalg import DataPosterior, GridPosterior
        >>> from streamgp.models import WiskiGP
        >>> X = torch.rand(10, 2, dtype=torch.float64)
        >>> data = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=8).exact_posterior()
        >>> isinstance(data, DataPosterior) and isinstance(data, Posterior)
        True
        >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=8, data_space_limit=0)
        >>> grid = model.exact_posterior()
        >>> isinstance(grid, GridPosterior) and isinstance(grid, Posterior)
        True
    """

    @property
    def cache(self) -> AmortizedCache:
        r"""A product built once the predictions it speeds up have paid for it."""


@runtime_checkable
class PosteriorCorrection(_PerOutput, Protocol):
    r"""A correction of a :class:`Posterior` from conditioning on ``Q`` more rows.

    Example:
        >>> import torch
        >>> from streamgp.linalg import DataCorrection, LowRankCorrection
        >>> like = torch.zeros(16, dtype=torch.float64)
        >>> isinstance(LowRankCorrection.empty(16, like), PosteriorCorrection)
        True
        >>> isinstance(DataCorrection.empty(like), PosteriorCorrection)
        True
    """

    @property
    def rank(self) -> int:
        r"""``Q``, the rows conditioned on (0: no correction)."""

    def condition(
        self, posterior: Any, W_q: InterpolationRows, y: Tensor, noise: Tensor
    ) -> PosteriorCorrection:
        r"""The correction after ``q`` more rows (``y``: ``sample x batch x q``)."""

    def predict_factors(
        self, posterior: Any, W_star: InterpolationRows
    ) -> tuple[Tensor, tuple[Any, ...], tuple[Tensor, ...]]:
        r"""The mean and the covariance's positive and negative factors at test rows
        (see :class:`~streamgp.linalg.posterior_covariance.PosteriorCovariance`)."""
