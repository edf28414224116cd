r"""Transactional updates: a failed update leaves the model as it was.

An update (``observe``, an optimizer's steps, a fit) may fail halfway: a diverging
optimizer, a failed factorisation, an inducing selector returning NaN. The models
declare what their updates may change (:class:`MutableState`) and run them inside
:func:`transaction`, which copies that state first and puts it back if the update
raises (any exception, ``KeyboardInterrupt`` included: an interrupted update is a
failed one), then lets the model drop what it derived from the failed state
(:meth:`_after_rollback`), and re-raises. A retry after the failure therefore starts
from the state before the update and never counts its data twice.

The copies are cheap where the models replace objects rather than writing into them
(state tensors, frozen posteriors, replay sets: kept by reference); what an optimizer
writes into in place (parameters, module states) is cloned.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MutableState:
    r"""What a model's updates may change, by attribute path (``"model.likelihood"``).

    Attributes:
        attributes: Objects an update replaces (state tensors, counters, cached
            posteriors, submodules): kept by reference and assigned back first.
        parameters: ``torch.nn.Parameter`` attributes an optimizer writes into and an
            update may replace (a grown basis): the same parameter objects are put back
            with their old values.
        modules: Modules whose ``state_dict`` is cloned and loaded back (``""`` for the
            model itself), after the attributes, so that resized state is in place.
            torch's ``load_state_dict`` is used: a model's own has warm-start semantics.
            Absent or ``None`` modules (no outcome transform) are skipped.
        generators: ``torch.Generator`` attributes whose state is put back.
        objects: Helper objects (e.g. an inducing selector) whose instance dictionary
            is copied (shallowly) and put back; ``None`` values are skipped.
    """

    attributes: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    generators: tuple[str, ...] = ()
    objects: tuple[str, ...] = ()


class TransactionalMixin:
    r"""A model whose updates run in :func:`transaction`.

    It sets :attr:`mutable_state` and, if it derives caches from that state, overrides
    :meth:`_after_rollback` to drop them.
    """

    mutable_state: MutableState = MutableState()

    def _after_rollback(self) -> None:
        r"""Bring derived state (caches, optimizers, modes) back in line after a rollback."""


def _get(model: Any, path: str) -> Any:
    for name in path.split(".") if path else ():
        model = getattr(model, name)
    return model


def _find(model: Any, path: str) -> Any:
    r"""``_get``, or None where an attribute on the path is absent (no transform)."""
    try:
        return _get(model, path)
    except AttributeError:
        return None


def _set(model: Any, path: str, value: Any) -> None:
    owner, _, name = path.rpartition(".")
    setattr(_get(model, owner), name, value)


def _clone(value: Any) -> Any:
    return value.detach().clone() if torch.is_tensor(value) else value


@dataclass(frozen=True)
class _Snapshot:
    attributes: dict[str, Any]
    parameters: dict[str, tuple[torch.Tensor, torch.Tensor]]
    modules: dict[str, dict[str, Any]]
    generators: dict[str, torch.Tensor]
    objects: dict[str, dict[str, Any]]


def take_snapshot(model: TransactionalMixin, state: MutableState | None = None) -> _Snapshot:
    r"""Copy what ``state`` (default ``model.mutable_state``) names (see :class:`MutableState`)."""
    state = model.mutable_state if state is None else state
    parameters = {}
    for path in state.parameters:
        parameter = _get(model, path)
        parameters[path] = (parameter, parameter.detach().clone())
    objects = {}
    for path in state.objects:
        obj = _get(model, path)
        if obj is not None:
            objects[path] = dict(obj.__dict__)
    return _Snapshot(
        attributes={path: _get(model, path) for path in state.attributes},
        parameters=parameters,
        modules={
            path: {k: _clone(v) for k, v in module.state_dict().items()}
            for path in state.modules
            if (module := _find(model, path)) is not None
        },
        generators={path: _get(model, path).get_state() for path in state.generators},
        objects=objects,
    )


def restore_snapshot(model: TransactionalMixin, snapshot: _Snapshot) -> None:
    r"""Put back what :func:`take_snapshot` copied, then call ``model._after_rollback()``."""
    for path, value in snapshot.attributes.items():
        _set(model, path, value)
    with torch.no_grad():
        for path, (parameter, value) in snapshot.parameters.items():
            parameter.copy_(value)
            _set(model, path, parameter)
    for path, state in snapshot.modules.items():
        torch.nn.Module.load_state_dict(_get(model, path), state)
    for path, generator_state in snapshot.generators.items():
        _get(model, path).set_state(generator_state)
    for path, saved in snapshot.objects.items():
        _get(model, path).__dict__.update(saved)
    model._after_rollback()


@contextmanager
def transaction(model: TransactionalMixin, state: MutableState | None = None) -> Iterator[None]:
    r"""Run the enclosed update; if it raises, restore ``model.mutable_state`` and re-raise.

    Any exception rolls back, ``KeyboardInterrupt`` and ``SystemExit`` included (a
    ``BaseException``), so an interrupted update leaves the model as it was.

    Args:
        model: The model whose state the update may change.
        state: What this update may change, when it is not ``model.mutable_state``
            (e.g. a re-standardisation that also writes into the transforms).

    Example:
        >>> from streamgp.models import OnlineSVGP
        >>> X = torch.rand(20, 1, dtype=torch.float64)
        >>> model = OnlineSVGP(X, torch.sin(6 * X), num_inducing=4, num_init_steps=0)
        >>> try:
        ...     with transaction(model):  # on any exception the model is as before
        ...         model.num_observed += 5
        ...         raise RuntimeError("the update diverged")
        ... except RuntimeError:
        ...     pass
        >>> model.num_observed
        20
    """
    snapshot = take_snapshot(model, state)
    try:
        yield
    except BaseException:
        restore_snapshot(model, snapshot)
        raise
