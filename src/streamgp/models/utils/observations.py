r"""The raw observations a streaming model keeps, in amortised ``O(q)`` per batch.

A grid model's statistics are all it needs to predict and to update, whatever ``n``
is. Its grid, however, is chosen from the data: when an observation falls outside it,
the model re-grids, and that needs every observation again. :class:`ObservationStore`
keeps them, untransformed (the model's frozen transforms are applied on use, so
:meth:`~streamgp.models.WiskiGP.restandardize` never invalidates them), in buffers
whose capacity doubles when full: appending ``q`` rows costs ``O(q)`` amortised, never
a copy of all ``n``. Memory is ``O(n (d + 2k))``.

The store is a ``torch.nn.Module``: ``.to()`` moves it with its model, and
``state_dict()`` holds exactly the ``n`` rows (not the spare capacity), so checkpoints
round-trip and load with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Rows allocated by the first append, at least.
MIN_CAPACITY = 64
_FIELDS = ("X", "Y", "Yvar")


class ObservationStore(torch.nn.Module):
    r"""Growing buffers of raw observations ``X`` (``n x d``), ``Y`` and ``Yvar`` (``n x k``).

    Args:
        X: ``n x d`` initial inputs.
        Y: ``n x k`` initial targets.
        Yvar: ``n x k`` observed noise variances, or None for a learned-noise model
            (then every later batch has none either).

    Example:
        >>> store = ObservationStore(torch.zeros(2, 3), torch.ones(2, 1))
        >>> store.append(torch.rand(4, 3), torch.rand(4, 1))
        >>> len(store), tuple(store.X.shape)
        (6, (6, 3))
    """

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        super().__init__()
        self.has_noise = Yvar is not None
        self.num_observations = len(X)
        capacity = max(MIN_CAPACITY, len(X))
        for name, value in self._items(X, Y, Yvar):
            buffer = value.new_empty((capacity, value.shape[-1]))
            buffer[: len(value)] = value.detach()
            self.register_buffer(f"_{name}", buffer)

    def _items(self, X: Tensor, Y: Tensor, Yvar: Tensor | None):
        values = {"X": X, "Y": Y, "Yvar": Yvar}
        return [(name, values[name]) for name in _FIELDS if name != "Yvar" or self.has_noise]

    def __len__(self) -> int:
        return self.num_observations

    @property
    def X(self) -> Tensor:
        r"""``n x d`` inputs (a view)."""
        return self._X[: self.num_observations]

    @property
    def Y(self) -> Tensor:
        r"""``n x k`` targets (a view)."""
        return self._Y[: self.num_observations]

    @property
    def Yvar(self) -> Tensor | None:
        r"""``n x k`` noise variances (a view), or None."""
        return self._Yvar[: self.num_observations] if self.has_noise else None

    @property
    def bounds(self) -> Tensor | None:
        r"""``2 x d`` box of the inputs (lower, upper), or None without observations."""
        if self.num_observations == 0:
            return None
        return torch.stack([self.X.min(0).values, self.X.max(0).values])

    def append(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        r"""Add ``q`` rows (already validated by the model), doubling capacity when full."""
        if (Yvar is not None) != self.has_noise:
            raise ValueError("Yvar must be given exactly when the store keeps noise variances.")
        n, q = self.num_observations, len(X)
        capacity = self._X.shape[0]
        if n + q > capacity:
            capacity = max(2 * capacity, n + q)
            for name, _ in self._items(X, Y, Yvar):
                old = getattr(self, f"_{name}")
                grown = old.new_empty((capacity, old.shape[-1]))
                grown[:n] = old[:n]
                setattr(self, f"_{name}", grown)
        with torch.no_grad():  # (a copy of the values: no graph into the store)
            for name, value in self._items(X, Y, Yvar):
                getattr(self, f"_{name}")[n : n + q] = value
        self.num_observations = n + q

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # Exactly the n rows, not the spare capacity.
        for name in _FIELDS:
            if name != "Yvar" or self.has_noise:
                value = getattr(self, name)
                destination[prefix + name] = value if keep_vars else value.detach()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        names = [name for name in _FIELDS if name != "Yvar" or self.has_noise]
        if prefix + "Yvar" in state_dict and not self.has_noise:
            error_msgs.append(
                f"{prefix}Yvar: the checkpoint kept noise variances (fixed noise), this model "
                "learns its noise."
            )
            return
        missing = [prefix + name for name in names if prefix + name not in state_dict]
        if missing:
            if strict:
                missing_keys.extend(missing)
            return
        values = {name: state_dict[prefix + name] for name in names}
        n = len(values["X"])
        if any(len(v) != n or v.dim() != 2 for v in values.values()) or (
            values["X"].shape[-1] != self._X.shape[-1] or values["Y"].shape[-1] != self._Y.shape[-1]
        ):
            error_msgs.append(
                f"{prefix}: kept observations of shapes "
                f"{[tuple(v.shape) for v in values.values()]} do not fit this model's "
                f"(n x {self._X.shape[-1]} inputs, n x {self._Y.shape[-1]} targets)."
            )
            return
        capacity = max(MIN_CAPACITY, n)
        for name, value in values.items():
            old = getattr(self, f"_{name}")
            buffer = old.new_empty((capacity, old.shape[-1]))
            buffer[:n] = value.to(old)
            setattr(self, f"_{name}", buffer)
        self.num_observations = n
