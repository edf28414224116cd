"""KissGP's grid follows the data: ``Normalize(d)`` without bounds, exact re-grids.

The oracle of a re-grid is a ``KissGP`` built at once from all the data on the new grid,
with the same frozen transforms and hyperparameters: the two must agree to 1e-10
(float64), with fixed and learned noise. The grid round-trips through ``state_dict``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from botorch.models.transforms.input import Normalize
from regrid_helpers import (
    assert_same_posterior,
    normalized_model,
    oracle_on_the_grid,
    regrid_data,
)

from streamgp import KissGP
from streamgp.interpolation.grid import GRID_MARGIN

DT = torch.float64
TOL = 1e-10


def _data(n: int, seed: int = 0):
    return regrid_data(n, seed=seed)


def _model(X, Y, Yvar, fixed_noise: bool, **options) -> KissGP:
    return normalized_model(KissGP, X, Y, Yvar, fixed_noise, **options)


def _oracle(model: KissGP, X, Y, Yvar) -> KissGP:
    return oracle_on_the_grid(model, X, Y, Yvar)


def _assert_same_posterior(model: KissGP, oracle: KissGP, X_test) -> None:
    assert_same_posterior(model, oracle, X_test, TOL)


def test_normalize_without_bounds_is_accepted_and_the_grid_covers_a_margin():
    X, Y, _ = _data(30)
    model = KissGP(X, Y, input_transform=Normalize(2))  # as BoTorch's tutorials write it
    X_t = model.input_transform(X)
    assert torch.allclose(X_t.min(0).values, torch.zeros(2, dtype=DT))
    assert torch.allclose(X_t.max(0).values, torch.ones(2, dtype=DT))
    expected = torch.tensor([[-GRID_MARGIN] * 2, [1 + GRID_MARGIN] * 2], dtype=DT)
    assert torch.allclose(model.interpolation.bounds, expected)
    assert model.covar_module.interpolation is model.interpolation
    # Without a learned transform the default box is still the unit cube.
    plain = KissGP(X / 5, Y)
    assert torch.equal(plain.interpolation.bounds, torch.tensor([[0.0, 0.0], [1.0, 1.0]]).to(X))


@pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"])
def test_regrid_equals_a_model_built_on_all_data(fixed_noise):
    X, Y, Yvar = _data(40)
    model = _model(X, Y, Yvar, fixed_noise, grid_size=12)
    X_in, Y_in, Yvar_in = _data(3, seed=1)  # inside: no re-grid
    model.observe(X_in, Y_in, Yvar_in if fixed_noise else None)
    bounds_before = model.interpolation.bounds.clone()
    kernel_before = model.covar_module
    # Beyond the grid's box on both sides of the first axis and above the second: a re-grid.
    X_out = torch.tensor([[1.0, 3.0], [6.5, 7.0]], dtype=DT)
    Y_out = torch.sin(2 * X_out).sum(-1, keepdim=True)
    Yvar_out = torch.full_like(Y_out, 0.02)
    model.observe(X_out, Y_out, Yvar_out if fixed_noise else None)
    bounds = model.interpolation.bounds
    assert not torch.equal(bounds, bounds_before)  # a larger box, holding the old one
    assert bool((bounds[0] <= bounds_before[0]).all() and (bounds[1] >= bounds_before[1]).all())
    assert model.interpolation.grid_size == [12, 12]  # grid_size is kept
    # The SKI kernel (training) is on the new grid, with the same base kernel.
    assert model.covar_module is not kernel_before
    assert model.covar_module.interpolation is model.interpolation
    assert model.covar_module.base_kernel is kernel_before.base_kernel
    for points, buffer in zip(model.interpolation.grid, model.covar_module.grid, strict=True):
        assert torch.equal(points, buffer)
    X_all, Y_all = torch.cat([X, X_in, X_out]), torch.cat([Y, Y_in, Y_out])
    Yvar_all = torch.cat([Yvar, Yvar_in, Yvar_out])
    assert model.num_train == 45
    oracle = _oracle(model, X_all, Y_all, Yvar_all)
    X_test = torch.tensor([[1.5, 3.0], [3.0, 4.0], [6.0, 6.5], [4.5, 2.5]], dtype=DT)
    _assert_same_posterior(model, oracle, X_test)
    # The marginal likelihood (what fit_gpytorch_mll maximises) on the same data too.
    for m in (model, oracle):
        m.train()
    with torch.no_grad():
        values = [
            m.likelihood(m(*m.train_inputs)).log_prob(m.train_targets) for m in (model, oracle)
        ]
    assert torch.allclose(values[0], values[1], atol=1e-8, rtol=0)
    for m in (model, oracle):
        m.eval()
    # And the stream goes on from the new grid as it would from the oracle.
    X_next, Y_next, Yvar_next = _data(2, seed=2)
    X_next = X_next + 3.0  # beyond the new box too: the oracle re-grids alike
    model.observe(X_next, Y_next, Yvar_next if fixed_noise else None)
    oracle.observe(X_next, Y_next, Yvar_next if fixed_noise else None)
    assert torch.equal(model.interpolation.bounds, oracle.interpolation.bounds)
    _assert_same_posterior(model, oracle, X_test)


def test_regrid_with_the_default_grid_size_takes_the_new_box_default():
    from streamgp.models.wiski import default_grid_size

    X, Y, _ = _data(30)
    model = KissGP(X, Y, input_transform=Normalize(2))
    model.observe(torch.tensor([[12.0, 3.0]], dtype=DT), torch.ones(1, 1, dtype=DT))
    bounds = model.interpolation.bounds
    assert model.interpolation.grid_size == default_grid_size(2, bounds)
    assert model.interpolation.grid_size[0] > model.interpolation.grid_size[1]


def test_a_regrid_folds_the_conditioning_of_an_unbatched_view_and_leaves_views_alone():
    X, Y, _ = _data(30)
    model = _model(X, Y, None, fixed_noise=False, grid_size=10)
    view = model.condition_on_observations(X[:2] + 0.1, Y[:2])
    X_test = torch.tensor([[3.0, 3.0], [4.5, 4.0]], dtype=DT)
    with torch.no_grad():
        before = view.posterior(X_test).mean.clone()
    model.observe(torch.tensor([[9.0, 3.0]], dtype=DT), torch.ones(1, 1, dtype=DT))
    with torch.no_grad():
        assert torch.equal(view.posterior(X_test).mean, before)
    assert not torch.equal(view.interpolation.bounds, model.interpolation.bounds)
    # Views never re-grid on conditioning.
    with pytest.raises(ValueError, match="outside grid_bounds"):
        view.condition_on_observations(torch.tensor([[-9.0, 3.0]], dtype=DT), Y[:1])
    # A view that observes absorbs its conditioning as data, then re-grids as a model.
    view.observe(torch.tensor([[3.0, -6.0]], dtype=DT), torch.ones(1, 1, dtype=DT))
    assert view.num_train == 33 and view.interpolation.bounds[0, 1] < -1.0
    assert model.num_train == 31


def test_state_dict_round_trips_the_grid_into_a_model_with_other_grid_options():
    X, Y, Yvar = _data(30)
    model = _model(X, Y, Yvar, fixed_noise=True, grid_size=12)
    X_out, Y_out = torch.tensor([[9.0, 1.0]], dtype=DT), torch.ones(1, 1, dtype=DT)
    model.observe(X_out, Y_out, Yvar[:1])
    state = model.state_dict()
    assert torch.equal(state["grid.bounds"], model.interpolation.bounds)
    assert state["grid.size"].tolist() == [12, 12]
    # A model of the same data, built with other grid options, adopts the state's grid.
    X_all, Y_all = torch.cat([X, X_out]), torch.cat([Y, Y_out])
    Yvar_all = torch.cat([Yvar, Yvar[:1]])
    other = KissGP(
        X_all,
        Y_all,
        Yvar_all,
        input_transform=copy.deepcopy(model.input_transform),
        outcome_transform=None,
        grid_size=16,
    )
    other.load_state_dict(state, keep_transforms=False)
    assert other.interpolation.grid_size == model.interpolation.grid_size
    assert torch.equal(other.interpolation.bounds, model.interpolation.bounds)
    assert other.covar_module.interpolation is other.interpolation
    X_test = torch.tensor([[3.0, 3.0], [8.0, 1.5]], dtype=DT)
    with torch.no_grad():
        a, b = other.posterior(X_test), model.posterior(X_test)
        assert torch.allclose(a.mean, b.mean, atol=TOL, rtol=0)
        assert torch.allclose(a.variance, b.variance, atol=TOL, rtol=0)
    # And the stream re-grids alike afterwards (the grid_size option came with the state).
    for m in (model, other):
        m.observe(torch.tensor([[3.0, 12.0]], dtype=DT), torch.ones(1, 1, dtype=DT), Yvar[:1])
    assert other.interpolation.grid_size == model.interpolation.grid_size == [12, 12]
    assert torch.equal(other.interpolation.bounds, model.interpolation.bounds)
    with torch.no_grad():
        assert torch.allclose(
            other.posterior(X_test).mean, model.posterior(X_test).mean, atol=TOL, rtol=0
        )


def test_a_warm_start_keeps_the_models_own_grid_and_input_transform():
    # BoTorch's loop: a model rebuilt on all data loads the previous model's state.
    X, Y, _ = _data(30)
    old = _model(X, Y, None, fixed_noise=False, grid_size=12)
    X2 = torch.cat([X, 2.0 * X[:5]])
    Y2 = torch.sin(X2).sum(-1, keepdim=True)
    new = KissGP(X2, Y2, input_transform=Normalize(2), outcome_transform=None)
    bounds, transform = new.interpolation.bounds.clone(), copy.deepcopy(new.input_transform)
    new.load_state_dict(old.state_dict())
    assert torch.equal(new.interpolation.bounds, bounds)
    assert torch.equal(new.input_transform.coefficient, transform.coefficient)
    assert torch.equal(new.base_kernel.lengthscale, old.base_kernel.lengthscale)
    new.posterior(X2[:3])


def test_a_state_on_another_grid_is_not_silently_misread():
    # A state without the grid (written before it was saved) must match the model's.
    X, Y, _ = _data(30)
    box = torch.tensor([[2.0, 2.0], [5.0, 5.0]], dtype=DT)
    source = KissGP(X, Y, grid_size=8, grid_bounds=box)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith("grid.")}
    target = KissGP(X, Y, grid_size=8, grid_bounds=box + torch.tensor([[-1.0], [1.0]], dtype=DT))
    with pytest.raises(RuntimeError, match="grid"):
        target.load_state_dict(state, keep_transforms=False)
    # A state whose grid does not cover this model's data is refused too.
    unit = torch.tensor([[2.0, 2.0], [3.0, 3.0]], dtype=DT)
    small = KissGP(torch.full((1, 2), 2.5, dtype=DT), Y[:1], grid_size=8, grid_bounds=unit)
    with pytest.raises(RuntimeError, match="train_X"):
        source.load_state_dict(small.state_dict(), keep_transforms=False)


@pytest.mark.parametrize("bad", ["nan", "wrong_d", "missing_yvar"])
def test_bad_input_outside_the_box_leaves_the_model_unchanged(bad):
    X, Y, Yvar = _data(30)
    model = _model(X, Y, Yvar, fixed_noise=True, grid_size=10)
    X_test = torch.tensor([[3.0, 3.0], [4.5, 4.0]], dtype=DT)
    with torch.no_grad():
        before = model.posterior(X_test).mean.clone()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    kernel, n = model.covar_module, model.num_train
    X_bad = torch.tensor([[9.0, 3.0], [10.0, 1.0]], dtype=DT)  # outside: would re-grid
    Y_bad, Yvar_bad = torch.ones(2, 1, dtype=DT), torch.full((2, 1), 0.02, dtype=DT)
    if bad == "nan":
        Y_bad[1, 0] = float("nan")
    elif bad == "wrong_d":
        X_bad = torch.cat([X_bad, X_bad[:, :1]], -1)
    else:
        Yvar_bad = None
    with pytest.raises(ValueError):
        model.observe(X_bad, Y_bad, Yvar_bad)
    assert model.covar_module is kernel and model.num_train == n
    after = model.state_dict()
    assert state.keys() == after.keys()
    for key, value in state.items():
        assert torch.equal(value, after[key]), key
    with torch.no_grad():
        assert torch.equal(model.posterior(X_test).mean, before)


def test_a_failed_regrid_leaves_the_model_unchanged():
    # A non-separable kernel cannot have a grid above MAX_DENSE_GRID: a re-grid to a
    # larger one fails, after nothing was changed.
    from gpytorch.kernels import MaternKernel

    X, Y, _ = _data(30)
    model = KissGP(X, Y, covar_module=MaternKernel(), input_transform=Normalize(2))
    model.MAX_DENSE_GRID = 100  # (the default grid has 1024 points)
    bounds, kernel, n = model.interpolation.bounds.clone(), model.covar_module, model.num_train
    with pytest.raises(ValueError, match="MAX_DENSE_GRID"):
        model.observe(torch.tensor([[500.0, 3.0]], dtype=DT), torch.ones(1, 1, dtype=DT))
    assert torch.equal(model.interpolation.bounds, bounds)
    assert model.covar_module is kernel and model.num_train == n
    model.posterior(X[:2])


@pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"])
def test_conditioning_beyond_the_grid_equals_the_data_on_a_grown_grid(fixed_noise):
    X, Y, Yvar = _data(30)
    model = _model(X, Y, Yvar, fixed_noise, grid_size=12)
    bounds_before = model.interpolation.bounds.clone()
    X_test = torch.tensor([[1.5, 3.0], [3.0, 4.0], [6.0, 6.5]], dtype=DT)
    with torch.no_grad():
        before = model.posterior(X_test).mean
    X_f = torch.tensor([[1.0, 3.0], [6.5, 7.0]], dtype=DT)  # beyond the data's box
    Y_f = torch.cos(X_f).sum(-1, keepdim=True)
    noise = torch.full((2, 1), 0.05, dtype=DT) if fixed_noise else None
    conditioned = model.condition_on_observations(X_f, Y_f, noise=noise)
    assert torch.equal(model.interpolation.bounds, bounds_before)  # the model keeps its grid
    with torch.no_grad():
        assert torch.equal(model.posterior(X_test).mean, before)
    assert not torch.equal(conditioned.interpolation.bounds, bounds_before)
    oracle = _oracle(conditioned, X, Y, Yvar).condition_on_observations(X_f, Y_f, noise=noise)
    _assert_same_posterior(conditioned, oracle, X_test)
    # Inside the grown grid the next conditioning reuses it.
    again = model.condition_on_observations(X_f + 0.05, Y_f, noise=noise)
    assert again.interpolation is conditioned.interpolation
