"""ObservationStore: amortised appends, state round trips, refusals."""

from __future__ import annotations

import pytest
import torch

from streamgp.models.utils.observations import MIN_CAPACITY, ObservationStore

DT = torch.float64


def test_appends_keep_every_row_and_grow_geometrically():
    X, Y = torch.rand(3, 2, dtype=DT), torch.rand(3, 1, dtype=DT)
    store = ObservationStore(X, Y)
    parts_X, parts_Y, capacities = [X], [Y], set()
    for q in [1, 5, 100, 2, 300]:
        X_q, Y_q = torch.rand(q, 2, dtype=DT), torch.rand(q, 1, dtype=DT)
        store.append(X_q, Y_q)
        parts_X.append(X_q), parts_Y.append(Y_q)
        capacities.add(store._X.shape[0])
    assert torch.equal(store.X, torch.cat(parts_X)) and torch.equal(store.Y, torch.cat(parts_Y))
    assert len(store) == 411 and store.Yvar is None
    # Capacity at least doubles when it grows: few reallocations.
    assert min(capacities) >= MIN_CAPACITY and len(capacities) <= 4
    assert torch.equal(store.bounds, torch.stack([store.X.min(0).values, store.X.max(0).values]))


def test_state_dict_holds_exactly_the_rows_and_loads_into_any_size():
    store = ObservationStore(
        torch.rand(5, 2, dtype=DT), torch.rand(5, 1, dtype=DT), torch.ones(5, 1, dtype=DT)
    )
    store.append(torch.rand(2, 2, dtype=DT), torch.rand(2, 1, dtype=DT), torch.ones(2, 1, dtype=DT))
    state = store.state_dict()
    assert sorted(state) == ["X", "Y", "Yvar"] and state["X"].shape == (7, 2)
    other = ObservationStore(
        torch.rand(1, 2, dtype=DT), torch.rand(1, 1, dtype=DT), torch.ones(1, 1, dtype=DT)
    )
    other.load_state_dict(state)
    assert torch.equal(other.X, store.X) and torch.equal(other.Yvar, store.Yvar)


def test_mismatched_states_and_noise_are_refused():
    store = ObservationStore(torch.rand(5, 2, dtype=DT), torch.rand(5, 1, dtype=DT))
    with pytest.raises(ValueError, match="Yvar must be given exactly"):
        store.append(
            torch.rand(1, 2, dtype=DT), torch.rand(1, 1, dtype=DT), torch.ones(1, 1, dtype=DT)
        )
    wide = ObservationStore(torch.rand(5, 3, dtype=DT), torch.rand(5, 1, dtype=DT))
    with pytest.raises(RuntimeError, match="do not fit"):
        store.load_state_dict(wide.state_dict())
    noisy = ObservationStore(
        torch.rand(5, 2, dtype=DT), torch.rand(5, 1, dtype=DT), torch.ones(5, 1, dtype=DT)
    )
    with pytest.raises(RuntimeError, match="kept noise variances"):
        store.load_state_dict(noisy.state_dict())
    assert len(store) == 5
