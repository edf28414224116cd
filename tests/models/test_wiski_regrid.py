"""A grid that follows the data: ``Normalize(d)`` without bounds, kept data, exact re-grids.

The oracle of a re-grid is a model built at once from all the data on the new grid, with
the same frozen transforms and hyperparameters: the two must agree to 1e-10 (float64) in
data space and grid space, with fixed and learned noise, and for several outputs.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from botorch.models.transforms.input import Normalize
from regrid_helpers import (
    assert_equal_to_oracle_and_streams_on,
    assert_same_posterior,
    normalized_model,
    oracle_on_the_grid,
    regrid_cases,
    regrid_data,
)

from streamgp import WiskiGP
from streamgp.interpolation.grid import GRID_GROWTH, GRID_MARGIN

DT = torch.float64
TOL = 1e-10


def _data(n: int, outputs: int = 1, seed: int = 0):
    return regrid_data(n, outputs, seed)


def _model(X, Y, Yvar, fixed_noise: bool, **options) -> WiskiGP:
    return normalized_model(WiskiGP, X, Y, Yvar, fixed_noise, **options)


def _oracle(model: WiskiGP, X, Y, Yvar) -> WiskiGP:
    return oracle_on_the_grid(model, X, Y, Yvar, data_space_limit=model.data_space_limit)


def _assert_same_posterior(model: WiskiGP, oracle: WiskiGP, X_test) -> None:
    assert_same_posterior(model, oracle, X_test, TOL)


def test_normalize_without_bounds_learns_them_and_the_grid_covers_a_margin():
    X, Y, _ = _data(30)
    model = WiskiGP(X, Y, input_transform=Normalize(2))  # as BoTorch's tutorials write it
    # Normalize learned the data's box, so the transformed data fill [0, 1]^2 ...
    X_t = model.input_transform(X)
    assert torch.allclose(X_t.min(0).values, torch.zeros(2, dtype=DT))
    assert torch.allclose(X_t.max(0).values, torch.ones(2, dtype=DT))
    # ... and the grid covers them plus GRID_MARGIN of their extent on each side.
    expected = torch.tensor([[-GRID_MARGIN] * 2, [1 + GRID_MARGIN] * 2], dtype=DT)
    assert torch.allclose(model.interpolation.bounds, expected)
    assert len(model.observations) == 30
    # A rebuild on more data (BoTorch's loop) re-learns the bounds.
    X2, Y2, _ = _data(10, seed=1)
    rebuilt = WiskiGP(torch.cat([X, 2 * X2]), torch.cat([Y, Y2]), input_transform=Normalize(2))
    assert torch.allclose(rebuilt.input_transform(2 * X2).max(0).values, torch.ones(2, dtype=DT))


@regrid_cases
def test_regrid_equals_a_model_built_on_all_data(space, fixed_noise, outputs):
    X, Y, Yvar = _data(40, outputs)
    limit = 200 if space == "data" else 0
    model = _model(X, Y, Yvar, fixed_noise, data_space_limit=limit, grid_size=12)
    X_in, Y_in, Yvar_in = _data(3, outputs, seed=1)  # inside: no re-grid
    model.observe(X_in, Y_in, Yvar_in if fixed_noise else None)
    bounds_before = model.interpolation.bounds.clone()
    # Beyond the data's box on both sides of both axes: a re-grid.
    X_out = torch.tensor([[1.0, 3.0], [6.5, 7.0]], dtype=DT)
    Y_out = torch.sin(2 * X_out).sum(-1, keepdim=True) + torch.arange(outputs, dtype=DT)
    Yvar_out = torch.full_like(Y_out, 0.02)
    model.observe(X_out, Y_out, Yvar_out if fixed_noise else None)
    assert not torch.equal(model.interpolation.bounds, bounds_before)
    assert model.interpolation.grid_size == [12, 12]  # grid_size is kept
    assert model.in_data_space == (space == "data")
    X_all, Y_all = torch.cat([X, X_in, X_out]), torch.cat([Y, Y_in, Y_out])
    Yvar_all = torch.cat([Yvar, Yvar_in, Yvar_out])
    assert torch.equal(model.observations.X, X_all) and torch.equal(model.observations.Y, Y_all)
    oracle = _oracle(model, X_all, Y_all, Yvar_all)
    X_test = torch.tensor([[1.5, 3.0], [3.0, 4.0], [6.0, 6.5], [4.5, 2.5]], dtype=DT)
    # Equal (the marginal likelihood too), and the stream goes on from the new grid as it
    # would from the oracle.
    assert_equal_to_oracle_and_streams_on(
        model, oracle, X_test, _data(2, outputs, seed=2), fixed_noise, TOL
    )


def test_regrid_in_grid_space_after_restandardize_and_pending_rows():
    X, Y, _ = _data(60)
    model = WiskiGP(X, Y + 5, input_transform=Normalize(2), data_space_limit=0, grid_size=12)
    for i in range(3):  # small batches held as a pending low-rank correction (FOLD_RANK)
        X_i, Y_i, _ = _data(1, seed=10 + i)
        model.observe(X_i, Y_i + 5)
    model.restandardize()
    X_out = torch.tensor([[8.0, 3.0]], dtype=DT)
    model.observe(X_out, torch.ones(1, 1, dtype=DT))
    # The oracle sees the targets through the model's (re-estimated, frozen) Standardize.
    model.outcome_transform.eval()
    Y_t = model.outcome_transform(model.observations.Y)[0]
    oracle = WiskiGP(
        model.observations.X,
        Y_t,
        input_transform=copy.deepcopy(model.input_transform),
        outcome_transform=None,
        grid_bounds=model.interpolation.bounds.clone(),
        grid_size=12,
        data_space_limit=0,
    )
    hyperparameters = {
        k: v for k, v in model.state_dict().items() if not k.startswith("outcome_transform.")
    }
    oracle.load_state_dict(hyperparameters)
    X_t = model.input_transform(torch.tensor([[3.0, 3.0], [7.0, 4.0]], dtype=DT))
    model.eval(), oracle.eval()
    with torch.no_grad():
        a, b = model(X_t), oracle(X_t)
    assert torch.allclose(a.mean, b.mean, atol=TOL, rtol=0)
    assert torch.allclose(a.variance, b.variance, atol=TOL, rtol=0)


def test_the_box_grows_geometrically():
    X, Y, _ = _data(20)
    model = WiskiGP(X, Y, input_transform=Normalize(2), grid_size=10)
    extent = (model.interpolation.bounds[1] - model.interpolation.bounds[0])[0].item()
    regrids, last = 0, model.interpolation.bounds.clone()
    for step in range(1, 201):  # a stream creeping to the right, 0.05 (raw) per step
        X_new = torch.tensor([[5.0 + 0.05 * step, 3.0]], dtype=DT)
        model.observe(X_new, torch.sin(X_new).sum(-1, keepdim=True))
        if not torch.equal(model.interpolation.bounds, last):
            regrids, last = regrids + 1, model.interpolation.bounds.clone()
    # The right side moved from 1.2 to past the last point (10 raw = 8/3 transformed
    # beyond the data's box); each re-grid grows the extent by at least GRID_GROWTH.
    final = (last[1] - last[0])[0].item()
    assert last[1, 0] >= model.input_transform(X_new)[0, 0]
    assert regrids <= math.ceil(math.log(final / extent) / math.log(1 + GRID_GROWTH)) + 1
    assert regrids >= 2
    assert len(model.observations) == 220


def test_regrid_checkpoint_round_trips_into_a_model_with_other_grid_options():
    X, Y, Yvar = _data(30)
    model = _model(X, Y, Yvar, fixed_noise=True)
    model.observe(torch.tensor([[9.0, 1.0]], dtype=DT), torch.ones(1, 1, dtype=DT), Yvar[:1])
    checkpoint = model.checkpoint()
    other = WiskiGP(
        X[:5], Y[:5], Yvar[:5], input_transform=Normalize(2), outcome_transform=None, grid_size=16
    )
    other.restore(checkpoint)
    assert other.interpolation.grid_size == model.interpolation.grid_size
    assert torch.equal(other.interpolation.bounds, model.interpolation.bounds)
    assert torch.equal(other.observations.Yvar, model.observations.Yvar)
    X_test = torch.tensor([[3.0, 3.0], [8.0, 1.5]], dtype=DT)
    with torch.no_grad():
        assert torch.equal(other.posterior(X_test).mean, model.posterior(X_test).mean)
    # And the restored stream re-grids from the restored data.
    for m in (model, other):
        m.observe(torch.tensor([[3.0, 12.0]], dtype=DT), torch.ones(1, 1, dtype=DT), Yvar[:1])
    with torch.no_grad():
        assert torch.allclose(other.posterior(X_test).mean, model.posterior(X_test).mean)


def test_a_checkpoint_on_another_grid_is_not_silently_misread():
    # A state without the grid (an older checkpoint, or keep_data=False) must match it.
    X, Y, _ = _data(30)
    source = WiskiGP(X, Y, grid_size=16, grid_bounds=torch.tensor([[2.0, 2.0], [5.0, 5.0]]).to(X))
    state = {k: v for k, v in source.state_dict().items() if not k.startswith("grid.")}
    target = WiskiGP(X, Y, grid_size=8, grid_bounds=source.interpolation.bounds)
    with pytest.raises(RuntimeError, match="grid"):
        target.load_state_dict(state, keep_transforms=False)


def test_views_keep_no_data_and_the_parent_stream_is_unaffected():
    X, Y, _ = _data(30)
    model = WiskiGP(X, Y, input_transform=Normalize(2))
    view = model.condition_on_observations(X[:2], Y[:2])
    assert view.observations is None
    model.observe(torch.tensor([[9.0, 3.0]], dtype=DT), torch.ones(1, 1, dtype=DT))
    assert len(model.observations) == 31
    with pytest.raises(ValueError, match="outside grid_bounds"):
        view.observe(torch.tensor([[-9.0, 3.0]], dtype=DT), torch.ones(1, 1, dtype=DT))


def _fantasy_data(outputs: int):
    # Beyond the data's box [2, 5]^2 on both sides (qKG / qNIPV candidates in a search
    # space wider than the data so far).
    X_f = torch.tensor([[1.0, 3.0], [6.5, 7.0]], dtype=DT)
    Y_f = torch.cos(X_f).sum(-1, keepdim=True) + torch.arange(outputs, dtype=DT)
    return X_f, Y_f


@regrid_cases
def test_conditioning_beyond_the_grid_equals_the_data_on_a_grown_grid(space, fixed_noise, outputs):
    X, Y, Yvar = _data(40, outputs)
    limit = 200 if space == "data" else 0
    model = _model(X, Y, Yvar, fixed_noise, data_space_limit=limit, grid_size=12)
    X_in, Y_in, Yvar_in = _data(2, outputs, seed=1)
    model.observe(X_in, Y_in, Yvar_in if fixed_noise else None)  # held back (FOLD_RANK)
    bounds_before = model.interpolation.bounds.clone()
    X_test = torch.tensor([[1.5, 3.0], [3.0, 4.0], [6.0, 6.5]], dtype=DT)
    with torch.no_grad():
        before = model.posterior(X_test)
    X_f, Y_f = _fantasy_data(outputs)
    noise = torch.full((2, outputs), 0.05, dtype=DT) if fixed_noise else None
    conditioned = model.condition_on_observations(X_f, Y_f, noise=noise)
    # BoTorch's view of its rows: every observation, then the fantasy rows.
    assert conditioned.train_inputs[0].shape[-2] == 44
    # The model itself is unchanged: the same grid, the same predictions bit for bit.
    assert torch.equal(model.interpolation.bounds, bounds_before)
    with torch.no_grad():
        after = model.posterior(X_test)
    assert torch.equal(after.mean, before.mean) and torch.equal(after.variance, before.variance)
    # The conditioned model equals all data on its (grown) grid, then conditioned.
    grid = conditioned.interpolation
    assert not torch.equal(grid.bounds, bounds_before)
    assert bool((grid.bounds[0] <= model.input_transform(X_f).min(0).values).all())
    assert bool((grid.bounds[1] >= model.input_transform(X_f).max(0).values).all())
    X_all, Y_all = torch.cat([X, X_in]), torch.cat([Y, Y_in])
    oracle = _oracle(conditioned, X_all, Y_all, torch.cat([Yvar, Yvar_in]))
    oracle = oracle.condition_on_observations(X_f, Y_f, noise=noise)
    with torch.no_grad():
        a, b = conditioned.posterior(X_test), oracle.posterior(X_test)
    assert torch.allclose(a.mean, b.mean, atol=TOL, rtol=0)
    assert torch.allclose(a.variance, b.variance, atol=TOL, rtol=0)


def test_conditioning_beyond_the_grid_regrids_once_per_growth_and_follows_the_stream():
    X, Y, _ = _data(30)
    model = _model(X, Y, None, fixed_noise=False, grid_size=10)
    X_f, Y_f = _fantasy_data(1)
    model.condition_on_observations(X_f, Y_f)
    sibling = model._regrid_sibling[1]
    # Inside the grown grid: the same re-gridded data serve the next conditioning.
    inside = model.condition_on_observations(X_f[:1] + 0.1, Y_f[:1])
    assert model._regrid_sibling[1] is sibling
    assert torch.equal(inside.interpolation.bounds, sibling.interpolation.bounds)
    # Beyond it: grown again, from the grown grid.
    far = torch.tensor([[12.0, 3.0]], dtype=DT)
    model.condition_on_observations(far, Y_f[:1])
    grown = model._regrid_sibling[1].interpolation.bounds
    assert bool((grown[1] >= sibling.interpolation.bounds[1]).all()) and grown[1, 0] > 2.0
    # An observation makes it stale: the next conditioning sees the new row.
    model.observe(X[:1] + 0.01, Y[:1])
    conditioned = model.condition_on_observations(X_f, Y_f)
    assert model._regrid_sibling[1] is not sibling
    assert conditioned.train_inputs[0].shape[-2] == 31 + 2


def test_conditioning_refuses_nan_inputs_by_name_and_leaves_the_model_unchanged():
    X, Y, _ = _data(20)
    model = _model(X, Y, None, fixed_noise=False, grid_size=10)
    X_bad = torch.tensor([[float("nan"), 3.0]], dtype=DT)
    with pytest.raises(ValueError, match="X"):
        model.condition_on_observations(X_bad, torch.zeros(1, 1, dtype=DT))
    assert model._regrid_sibling is None


def test_knowledge_gradient_with_normalize_without_bounds():
    # qKG fantasizes at candidates anywhere in the search space; with Normalize(d)
    # learned from data in [2, 5]^2 many of them lie beyond the grid. It was refused.
    from botorch.acquisition import qKnowledgeGradient
    from botorch.optim import optimize_acqf

    X, Y, _ = _data(20)
    model = WiskiGP(X, Y, input_transform=Normalize(2), grid_size=12)
    bounds = torch.tensor([[0.0, 0.0], [7.0, 7.0]], dtype=DT)
    acquisition = qKnowledgeGradient(model, num_fantasies=4)
    candidate, value = optimize_acqf(acquisition, bounds, q=1, num_restarts=2, raw_samples=16)
    assert candidate.shape == (1, 2) and torch.isfinite(value)
