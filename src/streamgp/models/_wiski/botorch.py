r"""A :class:`~streamgp.models.WiskiGP`'s training data as BoTorch's ``SingleTaskGP`` shows them.

BoTorch reads ``train_inputs``, ``train_targets``, ``likelihood.noise`` (fixed noise),
``_original_train_inputs`` (e.g. as ``X_baseline``) and lays out new data with
``_transform_tensor_args``. A ``WiskiGP`` keeps the raw observations (``keep_data``) rather
than transformed rows, plus the rows it was conditioned on; this mixin assembles those
views on access (``O(n)``), and raises ``AttributeError`` (BoTorch's "not available")
when the model keeps only statistics.
"""

from __future__ import annotations

import torch
from torch import Tensor

from streamgp.linalg.statistics import DataStatistics
from streamgp.models.utils import transform_new_data
from streamgp.models.utils.fixed_noise import concat_row_inputs, concat_rows
from streamgp.utils.validation import check_tensor


class BoTorchDataMixin:
    r"""``train_inputs`` / ``train_targets`` / ``training_noise`` and BoTorch's data plumbing.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    def is_data_key(self, key: str) -> bool:
        # A fixed-noise likelihood holds the mean noise of this model's rows: data too.
        return super().is_data_key(key) or (self.fixed_noise and key.startswith("likelihood."))

    @property
    def batch_shape(self) -> torch.Size:
        r"""BoTorch's batch shape: fantasies', then ``train_X``'s batch dimensions (not
        the member dimension of outputs with their own hyperparameters)."""
        shape = self._internal_batch_shape
        return shape[:-1] if self._output_members else shape

    @property
    def _internal_batch_shape(self) -> torch.Size:
        r"""The batch shape of the algebra: with the outputs' member dimension, if any."""
        shape = super().batch_shape
        if self._data_batch_shape:  # batched training data
            return torch.broadcast_shapes(self._data_batch_shape, shape)
        # A multi-output correction carries the outputs as its last batch dimension.
        return shape[:-1] if self._num_outputs > 1 and self._correction is not None else shape

    def _transform_new_data(
        self, X: Tensor, Y: Tensor | None = None, Yvar: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        r"""Pass new data through the frozen input and outcome transforms (and lay out
        outputs with their own hyperparameters as batch members)."""
        return self._outputs_to_members(*transform_new_data(self, X, Y, Yvar))

    # ------------------------------------------- training rows, as SingleTaskGP shows them
    def _kept_rows(self) -> tuple[Tensor, Tensor, Tensor | None] | None:
        r"""Raw ``(X, Y, Yvar)`` of the rows behind the statistics (views of the kept
        observations, no copy), or None when the model keeps no raw data.

        A view (a conditioned model) reads its parent's store, which only grows, as long
        as its statistics are those it was made with; once it folds rows of its own into
        them (``observe`` on a view) it knows only the statistics, like a model built
        with ``keep_data=False``.
        """
        outputs = None
        if self.observations is not None:
            store, n = self.observations, self._stored_count()
        elif self._row_source is not None and self._row_source[1] is self._statistics:
            store, _, outputs, n = self._row_source
        else:
            return None
        X, Y, Yvar = store.X[..., :n, :], store.Y[..., :n, :], store.Yvar
        Yvar = None if Yvar is None else Yvar[..., :n, :]
        if outputs is not None:
            Y, Yvar = Y[..., outputs], None if Yvar is None else Yvar[..., outputs]
        return X, Y, Yvar

    def _stored_count(self) -> int:
        r"""The kept rows in the statistics: all but the observed rows held back in the
        conditioning log (``FOLD_RANK``), counted on the host (no device read)."""
        return len(self.observations) - sum(entry[0].shape[-2] for entry in self._conditioning_log)

    def _transformed_rows(self) -> tuple[Tensor, Tensor, Tensor | None] | None:
        r""":meth:`_kept_rows` through the frozen transforms (``O(n)``, no gradient)."""
        rows = self._kept_rows()
        if rows is None or rows[0].shape[-2] == 0:
            return rows
        with torch.no_grad():
            return self._transform_new_data(*rows)

    def _log_parts(self, index: int) -> list[Tensor]:
        r"""Entry ``index`` (0: inputs, 1: targets, 2: noise) of every conditioning row
        block, the noise as ``batch x q`` whatever the number of outputs."""
        parts = [entry[index] for entry in self._conditioning_log]
        if index == 2 and self._num_outputs > 1:  # batched rows: batch x 1 x q
            parts = [p.squeeze(-2) if p.dim() > 1 else p for p in parts]
        return parts

    def training_noise(self) -> Tensor:
        r"""Every training row's fixed noise variance, as ``SingleTaskGP``'s ``likelihood.noise``.

        What ``likelihood.noise`` returns for a model built with ``train_Yvar`` (read on
        access: updates never copy it). In the outcome-transformed space, in the order
        the rows arrived, followed by the rows a conditioned (fantasy) model was
        conditioned on: ``batch x n`` (``batch x k x n`` for ``k`` outputs, which share
        each row's noise). Costs ``O(n)`` per call. Where the rows come from:

        - with kept data (``keep_data=True``, the default): the kept ``Yvar`` through
          the frozen outcome transform;
        - otherwise, while the model is in data space: the rows' noise it holds;
        - otherwise (grid statistics only, ``keep_data=False``): the rows are folded
          into sums and their individual noise is gone; each absorbed row then shows
          their mean noise (so the mean, which BoTorch's ``fantasize`` uses for
          fantasy rows, is exact); with batched training data each member's rows show
          that member's mean.

        Example:
            >>> from streamgp.models import WiskiGP
            >>> X = torch.rand(5, 1, dtype=torch.float64)
            >>> Yvar = torch.rand(5, 1, dtype=torch.float64) + 0.1
            >>> model = WiskiGP(X, X, Yvar, outcome_transform=None, grid_size=16)
            >>> bool(torch.equal(model.likelihood.noise, Yvar.squeeze(-1)))
            True
        """
        if not self.fixed_noise:
            raise AttributeError("training_noise: this model learns its noise (no train_Yvar).")
        rows = self._transformed_rows()
        statistics = self._statistics
        if rows is not None:
            noise = rows[2][..., 0]
        elif isinstance(statistics, DataStatistics):
            noise = statistics.noise
        elif self._data_batch_shape:  # each member's mean, batch x n
            level = self._noise_level()
            noise = level.unsqueeze(-1).expand(*level.shape, statistics.count)
        else:
            noise = self._noise_level().expand(statistics.count)
        noise = concat_rows([noise, *self._log_parts(2)], self._internal_batch_shape)
        if self._num_outputs > 1:
            noise = noise.unsqueeze(-2).expand(*noise.shape[:-1], self._num_outputs, -1)
        return noise

    def _rows_or_raise(self, name: str) -> tuple[Tensor, Tensor, Tensor | None]:
        rows = self._transformed_rows()
        if rows is None:
            # An AttributeError: BoTorch's helpers probe hasattr(model, "train_inputs").
            raise AttributeError(
                f"{name}: this model keeps no raw observations (keep_data=False, or an "
                "interpolation that is not a grid), only their statistics."
            )
        return rows

    @property
    def train_inputs(self) -> tuple[Tensor]:
        r"""``(X,)``: the training inputs in the transformed space, as ``SingleTaskGP``'s.

        ``batch x n x d``: the kept observations through the frozen input transform,
        followed by the rows a conditioned (fantasy) model was conditioned on. Assembled
        on access from the kept raw data (``O(n d)``); a model built with
        ``keep_data=False`` keeps no inputs and has no ``train_inputs`` (an
        ``AttributeError``, which BoTorch's helpers treat as "not available"). The
        outputs of a multi-output model share their inputs: no output dimension.
        """
        X_t = self._rows_or_raise("train_inputs")[0]
        parts = [X_t, *(X_q.detach() for X_q in self._log_parts(0))]
        return (concat_row_inputs(parts, self._internal_batch_shape),)

    @property
    def train_targets(self) -> Tensor:
        r"""The training targets in the transformed space, as ``SingleTaskGP``'s.

        ``batch x n`` (``batch x k x n`` for ``k`` outputs), in the order of
        :attr:`train_inputs`; not available with ``keep_data=False`` (see there).
        """
        Y_t = self._rows_or_raise("train_targets")[1]
        k = self._num_outputs
        batch = self._internal_batch_shape
        shape = batch if k == 1 else torch.Size([*batch, k])
        return concat_rows([self._targets(Y_t), *self._log_parts(1)], shape)

    @property
    def _has_transformed_inputs(self) -> bool:
        # BoTorch's flag: train_inputs are in the transformed space (always, here).
        return getattr(self, "input_transform", None) is not None

    @property
    def _original_train_inputs(self) -> Tensor | None:
        r"""The training inputs before the input transform (BoTorch reads them, e.g. as
        ``X_baseline``): the kept raw inputs, then the conditioning rows untransformed."""
        if not self._has_transformed_inputs:
            return None
        self._rows_or_raise("_original_train_inputs")
        X = self._kept_rows()[0]
        if self._conditioning_log and self.observations is not None:
            X = self.observations.X  # observed rows held back (FOLD_RANK) are kept too
        elif self._conditioning_log:
            parts = self._log_parts(0)
            if self._output_members:  # (each output's copy of the same rows)
                parts = [p.select(-3, 0) for p in parts]
            try:
                parts = [self.input_transform.untransform(p.detach()) for p in parts]
            except NotImplementedError as error:
                raise AttributeError(
                    "_original_train_inputs: the input transform cannot be inverted."
                ) from error
            X = concat_row_inputs([X, *parts], self.batch_shape)
        return X

    def _transform_tensor_args(
        self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        r"""BoTorch's layout of training data: the outputs moved before the rows.

        As ``BatchedMultiOutputGPyTorchModel._transform_tensor_args``: outputs with their
        own hyperparameters (the default) get the inputs with an output dimension
        (``batch x k x n x d``); outputs that share them
        (``shared_hyperparameters=True``) share the inputs, see :attr:`train_inputs`.

        Args:
            X: ``batch x n x d`` inputs.
            Y: ``batch x n x k`` targets.
            Yvar: Optional ``batch x n x k`` noise variances.

        Returns:
            ``X`` (``batch x k x n x d`` for outputs with their own hyperparameters), and
            ``Y`` and ``Yvar`` as ``batch x n`` (one output) or ``batch x k x n``.
        """
        k = self.num_outputs
        check_tensor(X, "X", min_dim=2, last_dim=self.interpolation.dim)
        check_tensor(Y, "Y", like=X, min_dim=2, last_dim=k)
        if Y.shape[:-1] != X.shape[:-1]:
            raise ValueError(
                f"Y has shape {tuple(Y.shape)}; expected {tuple(X.shape[:-1])} x {k} for X of "
                f"shape {tuple(X.shape)}."
            )
        if Yvar is not None:
            check_tensor(Yvar, "Yvar", like=X, min_dim=2)
            if Yvar.shape != Y.shape:
                raise ValueError(
                    f"Yvar has shape {tuple(Yvar.shape)}; expected Y's {tuple(Y.shape)}."
                )
        if self._output_members:
            X, Y, Yvar = self._outputs_to_members(X, Y, Yvar)
            return X, Y.squeeze(-1), None if Yvar is None else Yvar.squeeze(-1)
        return X, self._targets(Y), None if Yvar is None else self._targets(Yvar)

    def _check_inputs(self, X: Tensor, name: str, min_dim: int = 2) -> None:
        check_tensor(
            X,
            name,
            like=self.interpolation.bounds,
            min_dim=min_dim,
            last_dim=self.interpolation.dim,
        )
