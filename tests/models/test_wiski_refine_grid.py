"""A grid fine enough for the fitted lengthscales: ``WiskiGP.refine_grid`` and the loops.

The oracle of a refinement is a model built at once from all the data on the finer grid
(the same box, frozen transforms and hyperparameters): the two agree to 1e-10 (float64)
in data space and grid space, with fixed and learned noise, and for several outputs.
The loops' refit (the registry's ``wiski`` entry) refines a grid that a fit left too
coarse, and warns only where a cap keeps it coarse.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from regrid_helpers import (
    assert_equal_to_oracle_and_streams_on,
    normalized_model,
    oracle_on_the_grid,
    regrid_cases,
    regrid_data,
)

from streamgp import AdditiveWiskiGP, WiskiGP
from streamgp.models import get_model_spec
from streamgp.models.utils.resolution import CoarseGridWarning, suggested_grid_size

DT = torch.float64
SHORT = torch.tensor([[0.04, 1.0]], dtype=DT)  # under two spacings on axis 0 only


def _short(model: WiskiGP) -> WiskiGP:
    model.covar_module.lengthscale = SHORT
    return model


def _state(model: WiskiGP) -> dict:
    return {
        "grid": (model.interpolation.grid_size, model.interpolation.bounds.clone()),
        "n": len(model.observations) if model.observations is not None else None,
        "state": {k: v.clone() for k, v in model.state_dict().items()},
    }


def _assert_unchanged(model: WiskiGP, before: dict) -> None:
    after = _state(model)
    assert after["grid"][0] == before["grid"][0]
    assert torch.equal(after["grid"][1], before["grid"][1]) and after["n"] == before["n"]
    assert after["state"].keys() == before["state"].keys()
    assert all(torch.equal(after["state"][k], v) for k, v in before["state"].items())


@regrid_cases
def test_refine_grid_equals_a_model_built_on_the_finer_grid(space, fixed_noise, outputs):
    X, Y, Yvar = regrid_data(40, outputs)
    limit = 200 if space == "data" else 0
    model = normalized_model(WiskiGP, X, Y, Yvar, fixed_noise, data_space_limit=limit, grid_size=8)
    X_new, Y_new, Yvar_new = regrid_data(5, outputs, seed=1)
    model.observe(X_new, Y_new, Yvar_new if fixed_noise else None)
    _short(model)
    bounds = model.interpolation.bounds.clone()
    suggested = suggested_grid_size(model.covar_module, model.interpolation)
    assert suggested[0] > 8 and suggested[1] == 8  # only the short axis is refined

    assert model.refine_grid() is model
    assert model.interpolation.grid_size == suggested
    assert torch.equal(model.interpolation.bounds, bounds)  # the same box
    assert model.in_data_space == (space == "data")
    assert suggested_grid_size(model.covar_module, model.interpolation) is None
    X_all, Y_all, Yvar_all = (
        torch.cat([X, X_new]),
        torch.cat([Y, Y_new]),
        torch.cat([Yvar, Yvar_new]),
    )
    oracle = oracle_on_the_grid(model, X_all, Y_all, Yvar_all, data_space_limit=limit)
    X_test = torch.tensor([[2.5, 3.0], [3.0, 4.0], [4.5, 2.5], [2.2, 4.8]], dtype=DT)
    # Equal, and the stream goes on from the finer grid as the oracle's does.
    next_batch = regrid_data(3, outputs, seed=2)
    assert_equal_to_oracle_and_streams_on(model, oracle, X_test, next_batch, fixed_noise)
    # A re-grid (a point past the box) keeps the refined grid_size.
    model.observe(
        torch.tensor([[7.0, 7.0]], dtype=DT),
        torch.zeros(1, outputs, dtype=DT),
        torch.full((1, outputs), 0.01, dtype=DT) if fixed_noise else None,
    )
    assert model.interpolation.grid_size == suggested


def test_refine_grid_sizes_caps_and_no_ops():
    X, Y, Yvar = regrid_data(30)
    model = normalized_model(WiskiGP, X, Y, Yvar, False, grid_size=8)
    model.covar_module.lengthscale = torch.tensor([[1.0, 1.0]], dtype=DT)
    before = _state(model)
    assert model.refine_grid() is model  # long lengthscales: nothing to do
    _assert_unchanged(model, before)
    _short(model)
    suggested = suggested_grid_size(model.covar_module, model.interpolation)
    model.refine_grid(max_grid_points=8 * 20)  # shrunk evenly on the refined axis
    assert model.interpolation.grid_size == [20, 8] and 20 < suggested[0]
    model.refine_grid([24, 9])  # an explicit size
    assert model.interpolation.grid_size == [24, 9]
    model.refine_grid(24)
    assert model.interpolation.grid_size == [24, 24]


@pytest.mark.parametrize(
    "arguments, match",
    [
        (([6, 8],), "grid_size"),  # coarser than the current grid
        (([9],), "grid_size"),  # one size for two axes
        (([9, True],), "grid_size"),
        ((9.5,), "grid_size"),
        (([20, 20],), "max_grid_points"),  # with max_grid_points=100 below
    ],
)
def test_bad_arguments_are_refused_naming_them_and_change_nothing(arguments, match):
    X, Y, Yvar = regrid_data(30)
    model = _short(normalized_model(WiskiGP, X, Y, Yvar, False, grid_size=8))
    before = _state(model)
    cap = {"max_grid_points": 100} if match == "max_grid_points" else {}
    with pytest.raises(ValueError, match=match):
        model.refine_grid(*arguments, **cap)
    with pytest.raises(ValueError, match="max_grid_points"):
        model.refine_grid(max_grid_points=10)  # below the current grid
    _assert_unchanged(model, before)


def test_models_without_kept_data_or_with_their_own_grids_refuse():
    X, Y, Yvar = regrid_data(30)
    unit = (X - 2) / 3
    model = _short(WiskiGP(unit, Y, grid_size=8, keep_data=False))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="keep_data"):
        model.refine_grid()
    assert model.interpolation.grid_size == [8, 8]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    kept = _short(WiskiGP(unit, Y, grid_size=8))
    view = kept.condition_on_observations(unit[:2], Y[:2])
    with pytest.raises(RuntimeError, match="conditioned view"):
        view.refine_grid()
    additive = AdditiveWiskiGP(unit, Y)
    with pytest.raises(NotImplementedError, match="axis_sizes"):
        additive.refine_grid()


def _fast_in_x0(n: int = 150):
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(n, 2, generator=generator, dtype=DT)
    noise = 0.01 * torch.randn(n, 1, generator=generator, dtype=DT)
    return X, torch.sin(25 * X[:, :1]) + noise


def test_the_loops_refit_refines_a_grid_the_fit_left_coarse():
    X, Y = _fast_in_x0()
    spec = get_model_spec("wiski")
    model = spec.make(X, Y, grid_size=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec.fit(model, grid_size=10)
    assert not [w for w in caught if issubclass(w.category, CoarseGridWarning)]
    assert model.interpolation.grid_size[0] > 10 and model.interpolation.grid_size[1] == 10
    assert suggested_grid_size(model.covar_module, model.interpolation) is None
    # Capped below what the lengthscale needs: refined to the cap, and it warns.
    capped = spec.make(X, Y, grid_size=10)
    with pytest.warns(CoarseGridWarning, match="grid_size"):
        spec.fit(capped, grid_size=10, max_grid_points=200)
    assert capped.interpolation.grid_size == [20, 10]
    # A grid at the cap already (here 24 x 24 > 200 points) stays as built, and warns.
    large = spec.make(X, Y, grid_size=24)
    with pytest.warns(CoarseGridWarning):
        spec.fit(large, grid_size=24, max_grid_points=200)
    assert large.interpolation.grid_size == [24, 24]
    # Switched off: the fit warns and the grid stays.
    kept = spec.make(X, Y, grid_size=10)
    with pytest.warns(CoarseGridWarning):
        spec.fit(kept, grid_size=10, refine_grid=False)
    assert kept.interpolation.grid_size == [10, 10]
