r"""The layout of a :class:`~streamgp.models.WiskiGP`'s outputs and its constant prior mean.

A model of ``k`` outputs observed at the same inputs shares every row-derived factor
(interpolation rows, Gram statistics, roots) between them; only targets, ``W^T y`` and
means are per output. These helpers put targets, noise and rows in that layout
(``... x q`` for one output, ``... x k x q`` for ``k``) and add or remove the constant
prior mean, so that the statistics and posteriors see the GP's residuals.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.models.utils import add_output_dim
from gpytorch.means import ConstantMean
from torch import Tensor

from streamgp.interpolation.grid import InterpolationWeights
from streamgp.linalg.statistics import DataStatistics, GridStatistics
from streamgp.settings import value_check


class OutputsMixin:
    r"""Targets, noise and rows in the algebra's layout; the prior mean.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    @property
    def num_outputs(self) -> int:
        r"""The model's outputs, ``train_Y``'s columns (BoTorch's ``num_outputs``)."""
        return self._output_members or self._num_outputs

    @property
    def _input_batch_shape(self) -> torch.Size:
        r"""``train_X``'s batch dimensions (BoTorch's name; without the outputs' member
        dimension)."""
        batch = self._data_batch_shape
        return batch[:-1] if self._output_members else batch

    @property
    def _aug_batch_shape(self) -> torch.Size:
        r"""Every batch member: ``train_X``'s batch, then the outputs with their own
        hyperparameters (BoTorch's name; its independent per-member fits read it)."""
        return self._data_batch_shape

    def _outputs_to_members(
        self, X: Tensor, Y: Tensor | None = None, Yvar: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        r"""Transformed data in BoTorch's layout (``... x q x d``, ``... x q x k``) as the
        batch members of outputs with their own hyperparameters: ``... x k x q x d`` (a
        view of ``X`` for each output) and ``... x k x q x 1``. Unchanged otherwise."""
        k = self._output_members
        if not k:
            return X, Y, Yvar
        X = X.unsqueeze(-3).expand(*X.shape[:-2], k, *X.shape[-2:])
        Y, Yvar = (None if T is None else T.movedim(-1, -2).unsqueeze(-1) for T in (Y, Yvar))
        return X, Y, Yvar

    def _latent_posterior(self, X_t: Tensor) -> Any:
        r"""The latent posterior at transformed inputs ``X_t``; outputs with their own
        hyperparameters predict as batch members (``... x k x t``), which the posterior's
        assembly lays out as BoTorch's ``t x k``."""
        if self._output_members:  # (BoTorch's check of X's batch against the inputs')
            X_t, _ = add_output_dim(X_t, self._input_batch_shape)
        return self(X_t)

    def _targets(self, Y: Tensor) -> Tensor:
        r"""``... x q x k`` targets in the layout of the algebra: ``... x q`` for one
        output, ``... x k x q`` for ``k`` (the outputs share every row-derived factor)."""
        return Y.squeeze(-1) if self._num_outputs == 1 else Y.movedim(-1, -2)

    def _prior_mean(self) -> Tensor | None:
        r"""The constant prior mean (transformed space): a scalar for one output, one per
        output (shape ``k``) for ``k``, one per batch member for batched data; None for
        ``ZeroMean``."""
        if not isinstance(self.mean_module, ConstantMean):
            return None
        constant = self.mean_module.constant
        batch = self._data_batch_shape
        if batch:  # one constant per batch member (or one for all)
            return constant.reshape(batch) if constant.numel() > 1 else constant.reshape(-1)[0]
        if self._num_outputs == 1:
            return constant.reshape(())
        return constant.reshape(-1).expand(self._num_outputs)

    def _centered(self, statistics: DataStatistics | GridStatistics):
        r"""The statistics of the targets minus the prior mean (the GP's residuals)."""
        mean = self._prior_mean()
        return statistics if mean is None else statistics.shift(-mean)

    def _residuals(self, y: Tensor) -> Tensor:
        r"""Targets minus the prior mean, as the posterior factors take them."""
        return self._plus_prior_mean(y, sign=-1)

    def _shared_noise(self, Yvar: Tensor, name: str) -> Tensor:
        r"""``... x q x k`` (transformed) noise variances as one ``... x q`` noise per row.

        The outputs of a multi-output model share the Gram statistics, so each row must
        have one noise variance for all of them.
        """
        if self._num_outputs > 1:
            value_check(
                (Yvar != Yvar[..., :1]).any(),
                lambda: ValueError(
                    f"{name} differs between outputs (after the outcome transform): the "
                    "outputs of a multi-output WiskiGP share one noise variance per row. Use "
                    "a ModelListGP of single-output models, or an outcome transform that "
                    "scales all outputs alike (outcome_transform=None: the default "
                    "Standardize scales each output by its own deviation)."
                ),
            )
        return Yvar[..., 0]

    def _rows(self, X_t: Tensor) -> InterpolationWeights:
        r"""Interpolation rows of ``batch x q x d`` inputs; a multi-output model's batched
        rows get a size-one output dimension (``batch x 1 x q``) to broadcast against
        its ``batch x k x q`` per-output quantities."""
        weights = self.interpolation.weights(X_t)
        if self._num_outputs > 1 and X_t.dim() > 2:
            return weights.unsqueeze_batch()
        return weights

    def _row_noise(self, noise: Tensor) -> Tensor:
        r"""``batch x q`` conditioning noise in the layout of :meth:`_rows`."""
        if self._num_outputs > 1 and noise.dim() > 1:
            return noise.unsqueeze(-2)
        return noise

    def _plus_prior_mean(self, values: Tensor, sign: int = 1) -> Tensor:
        r"""``values`` (``... x q``, or ``... x k x q`` for ``k`` outputs) plus ``sign``
        times the prior mean."""
        prior_mean = self._prior_mean()
        if prior_mean is None:
            return values
        return values + sign * prior_mean.unsqueeze(-1)
