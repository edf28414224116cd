"""Streaming k-means and grid selectors behind the InducingPointSelector interface."""

from __future__ import annotations

import pytest
import torch

from streamgp.inducing import GridSelector, InducingPointSelector, KMeansSelector

DTYPE = torch.float64


def clusters(n_per: int, centres: torch.Tensor) -> torch.Tensor:
    points = centres.repeat_interleave(n_per, 0)
    return points + 0.02 * torch.randn(points.shape, dtype=DTYPE)


def test_kmeans_finds_well_separated_clusters_in_a_stream():
    centres = torch.tensor([[0.1, 0.1], [0.9, 0.1], [0.5, 0.9]], dtype=DTYPE)
    X = clusters(40, centres)[torch.randperm(120)]
    selector = KMeansSelector(3, seed=1)
    assert isinstance(selector, InducingPointSelector)
    Z = selector.update(X[:2])
    assert torch.equal(Z, X[:2])  # fewer inputs than centres: every input is a centre
    for chunk in X[2:].split(20):
        Z = selector.update(chunk)
    nearest = torch.cdist(centres, Z).min(dim=-1).values
    assert Z.shape == (3, 2) and (nearest < 0.05).all()
    assert selector.counts.sum().item() == 120
    twin = KMeansSelector(3, seed=1)
    twin.update(X[:2])
    for chunk in X[2:].split(20):
        Z_twin = twin.update(chunk)
    assert torch.equal(Z, Z_twin)


def test_grid_selector_full_and_occupied():
    bounds = torch.tensor([[0.0, -1.0], [1.0, 1.0]], dtype=DTYPE)
    full = GridSelector(bounds, grid_size=[3, 5])
    Z = full.update(torch.rand(4, 2, dtype=DTYPE))
    assert Z.shape == (15, 2)
    assert torch.equal(Z.min(0).values, bounds[0]) and torch.equal(Z.max(0).values, bounds[1])
    occupied = GridSelector(bounds, grid_size=[3, 5], occupied_only=True)
    X = torch.tensor([[0.02, -0.97], [0.51, 0.04], [0.49, -0.02]], dtype=DTYPE)
    Z = occupied.update(X)
    expected = torch.tensor([[0.0, -1.0], [0.5, 0.0]], dtype=DTYPE)
    assert torch.equal(Z, expected)
    Z = occupied.update(torch.tensor([[0.98, 0.99]], dtype=DTYPE))
    assert len(Z) == 3 and torch.equal(Z[-1], bounds[1])
    # Every input's nearest grid point is in the set.
    grid = full.grid
    nearest = grid[torch.cdist(X, grid).argmin(-1)]
    assert (torch.cdist(nearest, Z).min(-1).values == 0).all()


def test_bad_selector_arguments():
    with pytest.raises(ValueError, match="num_inducing"):
        KMeansSelector(0)
    with pytest.raises(ValueError, match="bounds"):
        GridSelector(torch.zeros(3, 2, dtype=DTYPE), 4)
    with pytest.raises(ValueError, match="grid_size"):
        GridSelector(torch.tensor([[0.0], [1.0]], dtype=DTYPE), [4, 4])
    selector = GridSelector(torch.tensor([[0.0], [1.0]], dtype=DTYPE), 4, occupied_only=True)
    with pytest.raises(TypeError, match="dtype"):
        selector.update(torch.rand(3, 1))
