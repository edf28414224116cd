"""OIPS (Galy-Fajou & Opper, Algorithm 1) against a naive one-point-at-a-time oracle."""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from streamgp.inducing import (
    InducingPointSelector,
    OnlineInducingPointSelector,
    kernel_correlation,
    oips_expected_size_bound,
)

DTYPE = torch.float64


def rbf(lengthscale: float, outputscale: float | None = None):
    base = RBFKernel().to(DTYPE)
    base.lengthscale = lengthscale
    if outputscale is None:
        return base
    kernel = ScaleKernel(base).to(DTYPE)
    kernel.outputscale = outputscale
    return kernel


def naive_oips(kernel, X: torch.Tensor, rho: float) -> tuple[list[int], list[float]]:
    """Algorithm 1 literally: one kernel row per input; returns accepted rows and each d."""
    accepted, d_values = [], []
    with torch.no_grad():
        for i in range(len(X)):
            if accepted:
                d = kernel_correlation(kernel, X[i : i + 1], X[accepted]).max().item()
            else:
                d = -math.inf
            d_values.append(d)
            if d < rho:
                accepted.append(i)
    return accepted, d_values


@pytest.mark.parametrize(
    "kernel", [rbf(0.2), rbf(0.2, outputscale=3.0), MaternKernel(1.5).to(DTYPE)]
)
def test_acceptance_rule_matches_algorithm_1(kernel):
    X = torch.rand(150, 2, dtype=DTYPE)
    rho = 0.6
    selector = OnlineInducingPointSelector(kernel, rho)
    Z = selector.update(X)
    accepted, d_values = naive_oips(kernel, X, rho)
    assert torch.equal(Z, X[accepted])
    # Never accepts a point whose max kernel value to the set is >= rho ...
    for i in accepted:
        assert d_values[i] < rho
    # ... and rejects exactly those (set is pairwise below rho).
    rejected = [i for i in range(len(X)) if i not in set(accepted)]
    assert rejected and all(d_values[i] >= rho for i in rejected)
    corr = kernel_correlation(kernel, Z, Z).detach()
    assert (corr - torch.eye(len(Z), dtype=DTYPE)).max() < rho


def test_output_scale_does_not_change_the_set():
    X = torch.rand(100, 3, dtype=DTYPE)
    a = OnlineInducingPointSelector(rbf(0.3), 0.7).update(X)
    b = OnlineInducingPointSelector(rbf(0.3, outputscale=5.0), 0.7).update(X)
    assert torch.equal(a, b)


def test_deterministic_and_independent_of_batching():
    X = torch.rand(200, 2, dtype=DTYPE)
    kernel = rbf(0.15)
    whole = OnlineInducingPointSelector(kernel, 0.8).update(X)
    again = OnlineInducingPointSelector(kernel, 0.8).update(X.clone())
    streamed = OnlineInducingPointSelector(kernel, 0.8)
    for chunk in X.split(17):
        Z = streamed.update(chunk)
    assert torch.equal(whole, again) and torch.equal(whole, Z)
    assert streamed.num_inducing == len(whole)
    # The returned tensor is a snapshot: later updates do not modify it.
    snapshot = Z.clone()
    streamed.update(torch.rand(50, 2, dtype=DTYPE))
    assert torch.equal(Z, snapshot)


def test_max_size_and_reset():
    X = torch.rand(100, 2, dtype=DTYPE)
    selector = OnlineInducingPointSelector(rbf(0.1), 0.9, max_size=5)
    Z = selector.update(X)
    assert torch.equal(Z, OnlineInducingPointSelector(rbf(0.1), 0.9).update(X)[:5])
    assert len(selector.update(torch.rand(10, 2, dtype=DTYPE))) == 5
    selector.reset()
    assert selector.inducing_points is None and selector.num_inducing == 0
    assert isinstance(selector, InducingPointSelector)


def test_expected_count_respects_theorem_1():
    """Monte Carlo: mean count over R streams <= bound + 3 standard errors (R = 30)."""
    dim, h, rho, n, reps = 2, 0.3, 0.7, 300, 30
    kernel = rbf(h / math.sqrt(2))  # paper's exp(-|x-x'|^2 / h^2)
    counts = torch.tensor(
        [
            OnlineInducingPointSelector(kernel, rho)
            .update(torch.rand(n, dim, dtype=DTYPE))
            .shape[0]
            for _ in range(reps)
        ],
        dtype=DTYPE,
    )
    bound = oips_expected_size_bound(n, dim, h, rho)
    tolerance = 3 * counts.std() / math.sqrt(reps)
    assert counts.mean() <= bound + tolerance
    # Scaling the cube and the lengthscale together leaves the bound unchanged.
    assert math.isclose(oips_expected_size_bound(n, dim, 2 * h, rho, side=2.0), bound)
    # Early in the stream every point is accepted and the bound is ~ N + 1.
    assert oips_expected_size_bound(1, dim, 0.01, rho) == pytest.approx(2.0, rel=1e-3)


def test_bad_arguments_and_inputs_leave_state_unchanged():
    with pytest.raises(ValueError, match="rho"):
        OnlineInducingPointSelector(rbf(0.2), 1.0)
    with pytest.raises(TypeError, match="kernel"):
        OnlineInducingPointSelector("rbf", 0.5)
    with pytest.raises(ValueError, match="max_size"):
        OnlineInducingPointSelector(rbf(0.2), 0.5, max_size=0)
    with pytest.raises(ValueError, match="rho"):
        oips_expected_size_bound(10, 2, 0.3, 1.5)
    selector = OnlineInducingPointSelector(rbf(0.2), 0.5)
    Z = selector.update(torch.rand(20, 2, dtype=DTYPE))
    bad = torch.rand(5, 2, dtype=DTYPE)
    bad[2, 0] = math.nan
    for X, error, match in [
        (bad, ValueError, "X contains NaN"),
        (torch.rand(5, 3, dtype=DTYPE), ValueError, "last dimension 2"),
        (torch.rand(5, 2), TypeError, "dtype"),
        (torch.rand(2, 5, 2, dtype=DTYPE), ValueError, "n x d"),
    ]:
        with pytest.raises(error, match=match):
            selector.update(X)
        assert torch.equal(selector.inducing_points, Z)
