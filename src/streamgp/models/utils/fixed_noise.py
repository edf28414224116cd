r"""Fixed (known) noise as ``SingleTaskGP(X, Y, train_Yvar)`` shows it: one variance per row.

A fixed-noise ``SingleTaskGP`` holds its rows' noise variances in its likelihood:
``model.likelihood.noise`` is the (outcome-transformed) ``train_Yvar``, BoTorch's
``fantasize`` averages it for the fantasy rows' noise, and a fantasy model's likelihood
holds the parent's rows followed by the fantasy rows. A streamgp model keeps its
rows' noise elsewhere (in the statistics it updates in constant time, and in its kept
raw observations), so copying every row into a likelihood at every update would cost
``O(n)`` where the model promises ``O(1)``.

:class:`RowNoiseGaussianLikelihood` is BoTorch's ``FixedNoiseGaussianLikelihood`` (an
instance of it, for every ``isinstance`` check) whose ``noise`` is *read from its
model* when asked (:meth:`RowNoise.noise` calls ``model.training_noise()``): nothing is
stored or copied on the update path, and the ``O(n)`` assembly is paid only by whoever
reads ``likelihood.noise``. Each model, conditioned (fantasy) models included, has its
own likelihood object bound to itself (:func:`bind_row_noise`), so a fantasy's
likelihood holds its own rows' noise and never writes its parent's.
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood
from gpytorch.likelihoods.noise_models import FixedGaussianNoise
from gpytorch.module import Module
from torch import Tensor


class RowNoise(FixedGaussianNoise):
    r"""``FixedGaussianNoise`` whose ``noise`` is its model's per-row noise, read on access.

    Args:
        model: The model whose ``training_noise()`` returns its rows' noise variances
            (``batch x n``, or ``batch x k x n`` for ``k`` outputs). Held as a plain
            reference, not a submodule (the model owns the likelihood).
    """

    def __init__(self, model: Any) -> None:
        Module.__init__(self)  # gpytorch's, skipping FixedGaussianNoise's stored noise
        object.__setattr__(self, "_model", model)

    @property
    def noise(self) -> Tensor:
        r"""The model's rows' noise variances (outcome-transformed space), assembled now."""
        return self._model.training_noise()

    @noise.setter
    def noise(self, value: Tensor) -> None:
        raise AttributeError(
            "likelihood.noise of a fixed-noise streamgp model is its observations' noise: "
            "give it with the data (train_Yvar, observe(X, Y, Yvar), or noise= in "
            "condition_on_observations), not by assignment."
        )

    def _apply(self, fn):  # the noise lives with the model's data, which moves itself
        return Module._apply(self, fn)


class RowNoiseGaussianLikelihood(FixedNoiseGaussianLikelihood):
    r"""A ``FixedNoiseGaussianLikelihood`` whose ``noise`` is its model's rows' noise.

    Args:
        model: The model it belongs to (see :class:`RowNoise`).

    Example:
        >>> from streamgp.models import WiskiGP
        >>> X = torch.rand(6, 1, dtype=torch.float64)
        >>> Yvar = torch.full((6, 1), 0.01, dtype=torch.float64)
        >>> model = WiskiGP(X, X.sin(), Yvar, outcome_transform=None, grid_size=16)
        >>> isinstance(model.likelihood, FixedNoiseGaussianLikelihood)
        True
        >>> bool(torch.equal(model.likelihood.noise, Yvar.squeeze(-1)))
        True
    """

    def __init__(self, model: Any) -> None:
        like = torch.ones(1)
        super().__init__(noise=like)
        self.noise_covar = RowNoise(model)

    @property
    def noise(self) -> Tensor:
        return self.noise_covar.noise

    @noise.setter
    def noise(self, value: Tensor) -> None:
        self.noise_covar.noise = value


def bind_row_noise(model: Any) -> RowNoiseGaussianLikelihood:
    r"""A new :class:`RowNoiseGaussianLikelihood` of ``model``, in its training mode."""
    likelihood = RowNoiseGaussianLikelihood(model)
    likelihood.train(model.training)
    return likelihood


def concat_rows(parts: list[Tensor], batch_shape: torch.Size) -> Tensor:
    r"""Per-row tensors ``... x q_i x ...`` broadcast to ``batch_shape`` and concatenated.

    Args:
        parts: Tensors whose row dimension is ``-1`` (noise, targets) or ``-2`` (inputs,
            given with ``event_dims=2``); see :func:`concat_row_inputs`.
        batch_shape: The batch shape of the result.

    Returns:
        ``batch_shape x sum(q_i)``.
    """
    return torch.cat([p.expand(*batch_shape, p.shape[-1]) for p in parts], dim=-1)


def concat_row_inputs(parts: list[Tensor], batch_shape: torch.Size) -> Tensor:
    r"""Input rows ``... x q_i x d`` broadcast to ``batch_shape`` and concatenated: ``batch_shape
    x sum(q_i) x d``."""
    return torch.cat([p.expand(*batch_shape, *p.shape[-2:]) for p in parts], dim=-2)
