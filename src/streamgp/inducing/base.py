r"""The interface shared by inducing-point selectors.

A selector watches the stream of (transformed) inputs and maintains a set of
inducing-point locations: :meth:`InducingPointSelector.update` takes the next batch
of inputs, processes its rows in order, and returns the current set. Streaming
sparse GPs (:class:`~streamgp.models.OnlineSGPR`) call it once per observed batch,
so the number and placement of inducing points can follow the data.

Selectors hold state (the current set, counts, ...) but no gradients: selection is
a discrete decision, taken under ``torch.no_grad``. Updates *replace* state attributes
rather than writing into them, so a shallow ``copy.copy`` of a selector is an
independent fork (models rely on this to restore a selector after a failed update and
to give conditioned models their own selector).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from streamgp.utils.validation import check_tensor


class InducingPointSelector(ABC):
    r"""Base class: a stateful rule that grows or moves a set of inducing points.

    Subclasses implement :meth:`_update`; the public :meth:`update` validates the
    batch (finite, ``n x d``, same dtype/device and ``d`` as earlier batches) before
    any state changes.
    """

    def __init__(self) -> None:
        self._points: Tensor | None = None

    @property
    def inducing_points(self) -> Tensor | None:
        r"""The current ``M x d`` inducing points, or None before the first update."""
        return self._points

    @property
    def num_inducing(self) -> int:
        r"""Number of current inducing points (0 before the first update)."""
        return 0 if self._points is None else self._points.shape[0]

    def reset(self) -> None:
        r"""Forget the current set (and any other state)."""
        self._points = None

    def update(self, X: Tensor) -> Tensor:
        r"""Process the rows of ``X`` in order and return the current inducing points.

        Args:
            X: ``n x d`` inputs (``n`` may be 0).

        Returns:
            The ``M x d`` current inducing points (a new tensor; later updates do not
            modify it).
        """
        like = self._points
        check_tensor(
            X, "X", like=like, min_dim=2, last_dim=None if like is None else like.shape[-1]
        )
        if X.dim() != 2:
            raise ValueError(f"X must have shape n x d, got {tuple(X.shape)}.")
        self._check_batch(X)
        with torch.no_grad():
            self._points = self._update(X.detach())
        return self._points

    def _check_batch(self, X: Tensor) -> None:
        r"""Extra validation of a batch (subclasses); must not modify state."""
        return None

    @abstractmethod
    def _update(self, X: Tensor) -> Tensor:
        r"""Return the new ``M x d`` set after the validated batch ``X``."""
