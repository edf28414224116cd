r"""Frozen transforms: fitted on the constructor's data, applied unchanged to later data.

A streaming model sees its data once. Its transforms are therefore fitted on the data
given to the constructor and frozen; every later batch (``observe``,
``condition_on_observations``) passes through the frozen transforms. With
``Standardize`` this keeps the first batch's mean and scale for the whole stream,
which is what BoTorch's own ``condition_on_observations`` does.
:class:`FrozenTransformsMixin` tells BoTorch's ``train`` / ``eval`` hooks so.

An input transform with learnable parameters (BoTorch's ``Warp``) is frozen too: the
model keeps a copy with its parameters at their values (``requires_grad`` off) and a
:class:`FrozenInputTransformWarning` says so, since ``SingleTaskGP`` would learn them.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager
from typing import Any

import torch
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from torch import Tensor

from streamgp.models.utils.defaults import _DefaultType, outcome_transform_or_default


class FrozenInputTransformWarning(UserWarning):
    r"""An input transform's learnable parameters (``Warp``'s concentrations, ...) are
    frozen: the model transforms each observation once, when it arrives, and keeps the
    result, so a fit cannot move them as ``SingleTaskGP``'s fit does. To learn a warping,
    fit it with ``SingleTaskGP`` first and pass the fitted transform."""


def _frozen_input_transform(
    model: torch.nn.Module, input_transform: InputTransform
) -> InputTransform:
    r"""``input_transform``, or a frozen copy of it if it has learnable parameters (the
    caller's object is left as it was: it may be a ``SingleTaskGP``'s, still learning)."""
    learnable = [name for name, p in input_transform.named_parameters() if p.requires_grad]
    if not learnable:
        return input_transform
    warnings.warn(
        f"input_transform {type(input_transform).__name__} has learnable parameters "
        f"({', '.join(learnable)}): {type(model).__name__} transforms each observation once "
        "and keeps the result, so it keeps a copy of the transform with them frozen at "
        "their current values. To learn them, fit the transform with SingleTaskGP first "
        "and pass the fitted one.",
        FrozenInputTransformWarning,
        stacklevel=4,
    )
    frozen = copy.deepcopy(input_transform)
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    return frozen


class FrozenTransformsMixin:
    r"""BoTorch's input-transform hooks, as no-ops, for a model with frozen transforms.

    BoTorch's ``Model.eval`` and ``Model.train`` swap a model's stored ``train_inputs``
    between the original and the transformed space (``_set_transformed_inputs``,
    ``_revert_to_original_inputs``). A streamgp model transforms data once, when they
    arrive (:func:`fit_frozen_transforms`, :func:`transform_new_data`), and stores
    only transformed data, if any, so there is nothing to swap. List this mixin before
    ``GPyTorchModel`` in the bases.
    """

    def train(self, mode: bool = True) -> Any:
        # A transform in train mode re-learns from whatever it is given: BoTorch's mll
        # closure calls ``transform_inputs`` on the stored (already transformed) inputs,
        # which would re-fit an unbounded ``Normalize`` to the unit cube. Frozen
        # transforms therefore stay in eval mode whatever the model's mode.
        super().train(mode)  # type: ignore[misc]
        for name in ("input_transform", "outcome_transform"):
            transform = getattr(self, name, None)
            if isinstance(transform, torch.nn.Module):
                transform.eval()
        return self

    def _set_transformed_inputs(self) -> None:
        pass

    def _revert_to_original_inputs(self) -> None:
        pass


@contextmanager
def eval_mode(module: torch.nn.Module | None):
    r"""Temporarily put ``module`` (may be None) in eval mode."""
    if module is None:
        yield
        return
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def fit_frozen_transforms(
    model: torch.nn.Module,
    train_X: Tensor,
    train_Y: Tensor,
    input_transform: InputTransform | None,
    outcome_transform: OutcomeTransform | _DefaultType | None,
    train_Yvar: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    r"""Fit the transforms on ``(train_X, train_Y)``, attach them to ``model``, freeze them.

    ``outcome_transform=DEFAULT`` is ``SingleTaskGP``'s ``Standardize(m)``
    (:func:`~streamgp.models.utils.defaults.outcome_transform_or_default`). As in
    ``SingleTaskGP``, a given outcome transform is put in train mode and fitted on
    ``train_Y`` even if it came in eval mode.

    Returns:
        The transformed ``(train_X, train_Y, train_Yvar)``.
    """
    tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
    if input_transform is not None:
        input_transform = _frozen_input_transform(model, input_transform)
        input_transform.to(**tkwargs)
        with torch.no_grad():
            train_X = input_transform(train_X) if len(train_X) else train_X
        input_transform.to(**tkwargs).eval()
        model.input_transform = input_transform
    outcome_transform = outcome_transform_or_default(outcome_transform, train_Y)
    if outcome_transform is not None:
        outcome_transform.to(**tkwargs)
        if len(train_Y):
            outcome_transform.train()
            train_Y, train_Yvar = outcome_transform(train_Y, train_Yvar, X=train_X)
        # Fitting replaces buffers (BoTorch's ``_is_trained`` flag is made on the CPU);
        # the fitted transform moves with the data, as SingleTaskGP's ``self.to(train_X)``.
        outcome_transform.to(**tkwargs).eval()
        model.outcome_transform = outcome_transform
    return train_X, train_Y, train_Yvar


def transform_new_data(
    model: torch.nn.Module, X: Tensor, Y: Tensor | None = None, Yvar: Tensor | None = None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    r"""Pass new data through ``model``'s frozen input and outcome transforms."""
    input_tf = getattr(model, "input_transform", None)
    outcome_tf = getattr(model, "outcome_transform", None)
    with eval_mode(input_tf), eval_mode(outcome_tf):
        X_t = input_tf(X) if input_tf is not None else X
        if Y is not None and outcome_tf is not None:
            Y, Yvar = outcome_tf(Y, Yvar, X=X_t)
    return X_t, Y, Yvar
