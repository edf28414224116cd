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

Batched training data (``batch x n x d``, a batched model) keep their batch dimensions:
every member holds the same number of rows, appended together.
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
        X: ``n x d`` initial inputs, or ``batch x n x d`` for a batched model (the batch
            dimensions are kept: every later append has them too).
        Y: ``n x k`` (``batch x n x k``) initial targets.
        Yvar: ``n x k`` (``batch x n x k``) observed noise variances, or None for a
            learned-noise model (then every later batch has none either).

    Example:
        >>> store = ObservationStore(torch.zeros(2, 3), torch.ones(2, 1))
        >>> store.append(torch.rand(4, 3), torch.rand(4, 1))
        >>> len(store), tuple(store.X.shape)
        (6, (6, 3))
    """

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        super().__init__()
        self.has_noise = Yvar is not None
        self.num_observations = n = X.shape[-2]
        capacity = max(MIN_CAPACITY, n)
        for name, value in self._items(X, Y, Yvar):
            buffer = value.new_empty((*value.shape[:-2], capacity, value.shape[-1]))
            buffer[..., :n, :] = value.detach()
            self.register_buffer(f"_{name}", buffer)

    def _items(self, X: Tensor, Y: Tensor, Yvar: Tensor | None):
        values = {"X": X, "Y": Y, "Yvar": Yvar}
        return [(name, values[name]) for name in _FIELDS if name != "Yvar" or self.has_noise]

    def __len__(self) -> int:
        return self.num_observations

    @property
    def batch_shape(self) -> torch.Size:
        r"""The batch dimensions of the rows (empty for an unbatched model)."""
        return self._X.shape[:-2]

    @property
    def X(self) -> Tensor:
        r"""``(batch x) n x d`` inputs (a view)."""
        return self._X[..., : self.num_observations, :]

    @property
    def Y(self) -> Tensor:
        r"""``(batch x) n x k`` targets (a view)."""
        return self._Y[..., : self.num_observations, :]

    @property
    def Yvar(self) -> Tensor | None:
        r"""``(batch x) n x k`` noise variances (a view), or None."""
        return self._Yvar[..., : self.num_observations, :] if self.has_noise else None

    @property
    def bounds(self) -> Tensor | None:
        r"""``2 x d`` box of the inputs (lower, upper; over every batch member), or None
        without observations."""
        if self.num_observations == 0:
            return None
        X = self.X.reshape(-1, self.X.shape[-1])
        return torch.stack([X.min(0).values, X.max(0).values])

    def append(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        r"""Add ``q`` rows (already validated by the model), doubling capacity when full."""
        if (Yvar is not None) != self.has_noise:
            raise ValueError("Yvar must be given exactly when the store keeps noise variances.")
        n, q = self.num_observations, X.shape[-2]
        capacity = self._X.shape[-2]
        if n + q > capacity:
            capacity = max(2 * capacity, n + q)
            for name, _ in self._items(X, Y, Yvar):
                old = getattr(self, f"_{name}")
                grown = old.new_empty((*old.shape[:-2], capacity, old.shape[-1]))
                grown[..., :n, :] = old[..., :n, :]
                setattr(self, f"_{name}", grown)
        with torch.no_grad():  # (a copy of the values: no graph into the store)
            for name, value in self._items(X, Y, Yvar):
                getattr(self, f"_{name}")[..., n : n + q, :] = value
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
        n = values["X"].shape[-2] if values["X"].dim() >= 2 else -1
        batch = self.batch_shape
        expected = {"X": self._X, "Y": self._Y, "Yvar": getattr(self, "_Yvar", None)}
        if any(v.shape != (*batch, n, expected[name].shape[-1]) for name, v in values.items()):
            lead = "".join(f"{b} x " for b in batch)
            error_msgs.append(
                f"{prefix}: kept observations of shapes "
                f"{[tuple(v.shape) for v in values.values()]} do not fit this model's "
                f"({lead}n x {self._X.shape[-1]} inputs, {lead}n x {self._Y.shape[-1]} "
                "targets)."
            )
            return
        capacity = max(MIN_CAPACITY, n)
        for name, value in values.items():
            old = getattr(self, f"_{name}")
            buffer = old.new_empty((*batch, capacity, old.shape[-1]))
            buffer[..., :n, :] = value.to(old)
            setattr(self, f"_{name}", buffer)
        self.num_observations = n
