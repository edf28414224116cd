r"""Caches keyed on hyperparameters: rebuild derived factors only when a value changed.

The models cache what predictions need (a grid or inducing-point posterior, local
Cholesky factors, gpytorch's variational caches), detached from the hyperparameters
as gpytorch's ``detach_test_caches``. A cache is valid while every hyperparameter
equals the copy taken when it was built: :func:`parameter_snapshot` takes the copy,
:func:`parameters_unchanged` compares. Comparing values (not versions) catches every
way of changing a hyperparameter: optimizer steps, ``load_state_dict``, assignment.
:class:`CachedPosteriorMixin` is the rest of a model's cache plumbing: which
attributes are caches, and dropping them when they may be stale (a device or dtype
move, a new state, a load of buffers they depend on, :func:`invalidate_after_load`);
:func:`apply_to_tensors` moves the state a model keeps outside its parameters and
buffers with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import fields, is_dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from streamgp.models.utils.views import correction_batch_shape
from streamgp.settings import ValueChecks, skip_value_checks

#: Ids of the models inside a :meth:`CachedPosteriorMixin._verified_call`.
_VERIFIED: ContextVar[frozenset[int]] = ContextVar("streamgp_verified", default=frozenset())


class ParameterSnapshot(list):
    r"""Detached copies of some tensors (a list), with their values also kept flat
    (:attr:`flat`), so that a comparison concatenates only the current tensors.

    The snapshot a :class:`CachedPosteriorMixin` keys its caches on (a model attribute,
    never saved in a checkpoint); :func:`parameter_snapshot` gives a plain list, which a
    checkpoint may hold (``torch.load(weights_only=True)`` reads lists of tensors).
    """

    #: Set by a model that checked the values it derived from these tensors (e.g. a
    #: positive noise variance) when it took the snapshot: while the tensors equal it,
    #: those values need no check again.
    values_checked = False

    def __init__(self, tensors: Iterable[Tensor]) -> None:
        super().__init__(tensors)
        self.flat = _flat(self) if self else None


def _flat(tensors: Sequence[Tensor]) -> Tensor:
    # One 1-D tensor of all values (a reshape only where a tensor is not 1-D already).
    parts = [t if t.dim() == 1 else t.reshape(-1) for t in tensors]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def parameter_snapshot(parameters: Iterable[Tensor]) -> list[Tensor]:
    r"""Detached copies of ``parameters``, for :func:`parameters_unchanged`."""
    return [p.detach().clone() for p in parameters]


def parameters_unchanged(current: Sequence[Tensor], snapshot: Sequence[Tensor] | None) -> bool:
    r"""Whether ``current`` holds the same tensors (shapes and values) as ``snapshot``.

    False without a snapshot, or when the number of tensors differs. One host read (of
    :func:`parameters_changed`'s flag) at most.
    """
    return snapshot is not None and not bool(parameters_changed(current, snapshot))


def parameters_changed(current: Sequence[Tensor], snapshot: Sequence[Tensor]) -> Tensor | bool:
    r"""Whether ``current`` differs from ``snapshot``: True when the shapes differ (known
    on the host), else a boolean tensor computed on the device in one comparison (the
    comparison of :func:`parameters_unchanged` without its host reads)."""
    if len(current) != len(snapshot) or any(
        a.shape != b.shape or a.dtype != b.dtype for a, b in zip(current, snapshot, strict=True)
    ):
        return True
    if not current:
        return False
    saved = getattr(snapshot, "flat", None)
    with torch.no_grad():  # a flag: no graph through the parameters
        return _flat(current).ne(_flat(snapshot) if saved is None else saved).any()


def apply_to_tensors(state: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    r"""``state`` with ``fn`` (``Module._apply``'s) applied to every tensor in it.

    For the state a model keeps outside its parameters and buffers (what
    :meth:`CachedPosteriorMixin._apply_to_state` moves): a tensor, or (nested) tuples,
    named tuples, lists, dicts and dataclasses of tensors; anything else (``None``,
    numbers) is returned as it is. Dataclasses are rebuilt with
    :func:`dataclasses.replace`, containers as new containers of the same type.

    Example:
        >>> state = {"batch": (torch.zeros(2), None), "count": 3}
        >>> apply_to_tensors(state, torch.Tensor.double)["batch"][0].dtype
        torch.float64
    """
    if isinstance(state, Tensor):
        return fn(state)
    if is_dataclass(state) and not isinstance(state, type):
        changes = {
            f.name: apply_to_tensors(getattr(state, f.name), fn) for f in fields(state) if f.init
        }
        return replace(state, **changes)
    if isinstance(state, tuple):
        items = [apply_to_tensors(item, fn) for item in state]
        return type(state)(*items) if hasattr(state, "_fields") else type(state)(items)
    if isinstance(state, list):
        return [apply_to_tensors(item, fn) for item in state]
    if isinstance(state, dict):
        return {key: apply_to_tensors(value, fn) for key, value in state.items()}
    return state


def invalidate_after_load(module: CachedPosteriorMixin, incompatible_keys: Any) -> None:
    r"""A ``load_state_dict`` post-hook: drop ``module``'s caches after a load.

    For models whose cached factors also depend on buffers (a grid, a summary of the
    data), which the hyperparameter snapshot does not cover. Register it with
    ``module.register_load_state_dict_post_hook(invalidate_after_load)``; a module-level
    function (not a bound method) keeps the model picklable and copyable.
    """
    module._invalidate()


class CachedPosteriorMixin:
    r"""The plumbing of a model's cached posterior factors, so the model keeps its mathematics.

    A streamgp model derives what predictions need (a posterior factorisation, a LOVE
    root, grid statistics) from its state and caches it, detached from the
    hyperparameters as gpytorch's ``detach_test_caches``. This mixin owns the rules by
    which those caches are dropped:

    - :meth:`_invalidate` resets each attribute named in :attr:`cached_attributes` to
      ``None`` and forgets the hyperparameter snapshot, so the next prediction
      rebuilds the factors from the state.
    - :meth:`_hyperparameters_unchanged` / :meth:`_snapshot_hyperparameters` key a
      cache on the values of :meth:`_hyperparameters` (:func:`parameters_unchanged`).
    - :meth:`_apply` (torch's hook behind ``.to``, ``.double()``, ``.cuda()``, also
      BoTorch's no-op ``.to`` calls) moves the parameters and buffers, then the state
      the model keeps outside them (:meth:`_apply_to_state`), then invalidates: the
      caches were derived on the old device and dtype.
    - :meth:`_clear_caches` also drops the conditioning (the correction of
      ``condition_on_observations`` and its log), for a new state of the model.

    A model lists it before its torch/BoTorch base classes (so that its ``_apply``
    wraps torch's), names its caches in :attr:`cached_attributes` and calls
    :meth:`_clear_caches` in its constructor. Caches that are not reset to ``None``
    (e.g. a dictionary) are reset by overriding :meth:`_invalidate` (call ``super()``).

    Example:
        >>> class ScaledSum(CachedPosteriorMixin, torch.nn.Module):
        ...     cached_attributes = ("_total",)
        ...
        ...     def __init__(self, data: Tensor) -> None:
        ...         super().__init__()
        ...         self.scale = torch.nn.Parameter(torch.ones(()))
        ...         self.data = data  # state outside parameters and buffers
        ...         self._clear_caches()
        ...
        ...     def _apply_to_state(self, fn) -> None:
        ...         self.data = fn(self.data)
        ...
        ...     def total(self) -> Tensor:
        ...         if self._total is None or not self._hyperparameters_unchanged():
        ...             with torch.no_grad():
        ...                 self._total = self.scale * self.data.sum()
        ...             self._snapshot_hyperparameters()
        ...         return self._total
        >>> model = ScaledSum(torch.arange(3.0))
        >>> model.total()
        tensor(3.)
        >>> _ = model.scale.data.fill_(2.0)  # a new value: the cache is rebuilt
        >>> model.total()
        tensor(6.)
        >>> model.double().total().dtype  # moved with its data, rebuilt
        torch.float64
    """

    #: Attributes holding factors derived from the state; :meth:`_invalidate` sets
    #: them to ``None``.
    cached_attributes: ClassVar[tuple[str, ...]] = ()

    _hyper_snapshot: ParameterSnapshot | None
    _correction: Any
    _conditioning_log: list[tuple[Tensor, Tensor, Tensor]]

    def _invalidate(self) -> None:
        r"""Drop the derived factors; the next prediction rebuilds them from the state."""
        for name in self.cached_attributes:
            setattr(self, name, None)
        self._hyper_snapshot = None

    def _clear_caches(self) -> None:
        r"""Drop the derived factors and the conditioning: the model is its state alone.

        For a new state (construction, absorbed data, a restored checkpoint): any
        conditioning was absorbed into it or belonged to the state it replaces.
        """
        self._invalidate()
        self._correction = None
        # Transformed (X, y, noise) of each conditioning: replayed onto the rebuilt
        # factors after a hyperparameter change.
        self._conditioning_log = []

    def _hyperparameters(self) -> list[Tensor]:
        r"""The tensors the caches are keyed on (default: all parameters)."""
        return list(self.parameters())

    def _hyperparameters_unchanged(self) -> bool:
        r"""Whether :meth:`_hyperparameters` equal the last :meth:`_snapshot_hyperparameters`.

        Inside :class:`~streamgp.settings.skip_value_checks` the values are not compared
        (a host read per check on a GPU): a snapshot stands until :meth:`_invalidate`,
        which a state change, a device move and ``train()`` call (gpytorch's convention).
        """
        if skip_value_checks.on() or self._in_verified_call():
            return self._hyper_snapshot is not None
        return parameters_unchanged(self._hyperparameters(), self._hyper_snapshot)

    @contextlib.contextmanager
    def _verified_call(self, checks: ValueChecks) -> Iterator[None]:
        r"""A call that compares the hyperparameters with the caches' snapshot once, in
        ``checks``' read (dropping the caches there if they changed), and trusts the
        snapshot for the rest of the call (:meth:`_hyperparameters_unchanged` then
        compares nothing). Views made during the call are other objects: not trusted."""
        snapshot = self._hyper_snapshot
        if not skip_value_checks.on() and snapshot is not None:
            changed = parameters_changed(self._hyperparameters(), snapshot)
            if isinstance(changed, bool):
                if changed:
                    self._invalidate()
            else:
                checks.decide(changed, lambda changed: self._invalidate() if changed else None)
        token = _VERIFIED.set(_VERIFIED.get() | {id(self)})
        try:
            yield
        finally:
            _VERIFIED.reset(token)

    def _in_verified_call(self) -> bool:
        return id(self) in _VERIFIED.get()

    def train(self, mode: bool = True) -> Any:
        # Hyperparameters may change in training mode (fit_gpytorch_mll, an optimizer):
        # derived factors are rebuilt on the next prediction, as gpytorch's ExactGP does.
        if mode:
            self._invalidate()
        return super().train(mode)

    def _snapshot_hyperparameters(self) -> None:
        r"""Key the caches on the current values of :meth:`_hyperparameters`."""
        self._hyper_snapshot = ParameterSnapshot(parameter_snapshot(self._hyperparameters()))

    @property
    def batch_shape(self) -> torch.Size:
        r"""The batch shape of the conditioning correction (``[]`` without one)."""
        return correction_batch_shape(self._correction)

    def _after_rollback(self) -> None:
        # A failed update restored the state (models/utils/transaction.py): the factors
        # derived from the state it replaced may be stale, unless the caches and their
        # hyperparameter snapshot were restored with it (then they are kept: the model
        # predicts bit for bit as before, with no refactorisation).
        state = getattr(self, "mutable_state", None)
        restored = set(state.attributes) if state is not None else set()
        if not {*self.cached_attributes, "_hyper_snapshot"} <= restored:
            self._invalidate()
        parent = getattr(super(), "_after_rollback", None)
        if parent is not None:
            parent()

    def _apply_to_state(self, fn: Callable[[Tensor], Tensor]) -> None:
        r"""Apply ``fn`` to the state kept outside parameters and buffers (default: none)."""

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> Any:
        # Every move invalidates, no-op ones included (BoTorch calls ``.to`` freely):
        # ``fn`` is opaque, so whether it changed a tensor is unknown.
        super()._apply(fn, *args, **kwargs)
        self._apply_to_state(fn)
        # Pending (observed or conditioned) rows are replayed by the next rebuild.
        self._conditioning_log = apply_to_tensors(self._conditioning_log, fn)
        self._invalidate()
        return self
