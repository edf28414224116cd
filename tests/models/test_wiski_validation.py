"""Bad input raises a clear error naming the argument and leaves the model unchanged."""

from __future__ import annotations

import warnings

import pytest
import torch
from botorch.models.transforms.input import ChainedInputTransform, InputStandardize, Normalize

from streamgp import KissGP, WiskiGP
from streamgp.interpolation.grid import GridExtrapolationWarning

DTYPE = torch.float64


def _snapshot(model: WiskiGP):
    Xs = torch.linspace(0.1, 0.9, 6, dtype=DTYPE).reshape(3, 2)
    post = model.posterior(Xs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return state, post.mean.detach().clone(), post.variance.detach().clone()


def _assert_unchanged(model: WiskiGP, snapshot) -> None:
    state, mean, var = snapshot
    now = model.state_dict()
    assert state.keys() == now.keys()
    for k in state:
        assert torch.equal(state[k], now[k]), k
    new_state, new_mean, new_var = _snapshot(model)
    assert torch.equal(mean, new_mean) and torch.equal(var, new_var)


@pytest.fixture
def model():
    X = torch.rand(20, 2, dtype=DTYPE)
    return WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10)


@pytest.fixture
def fixed_model():
    X = torch.rand(20, 2, dtype=DTYPE)
    return WiskiGP(X, X.sum(-1, keepdim=True), torch.full((20, 1), 0.1, dtype=DTYPE), grid_size=10)


GOOD_X = torch.full((2, 2), 0.5, dtype=DTYPE)
GOOD_Y = torch.ones(2, 1, dtype=DTYPE)
NAN_X = torch.tensor([[0.5, float("nan")], [0.2, 0.2]], dtype=DTYPE)
INF_Y = torch.tensor([[1.0], [float("inf")]], dtype=DTYPE)
OUTSIDE_X = torch.tensor([[0.5, 1.5], [0.2, 0.2]], dtype=DTYPE)

OBSERVE_CASES = [
    ("nan X", dict(X=NAN_X, Y=GOOD_Y), ValueError, "X contains NaN"),
    ("inf Y", dict(X=GOOD_X, Y=INF_Y), ValueError, "Y contains NaN"),
    ("Y rows", dict(X=GOOD_X, Y=torch.ones(3, 1, dtype=DTYPE)), ValueError, "Y has 3 rows"),
    ("Y outputs", dict(X=GOOD_X, Y=torch.ones(2, 2, dtype=DTYPE)), ValueError, "Y must have shape"),
    (
        "X dims",
        dict(X=torch.rand(2, 3, dtype=DTYPE), Y=GOOD_Y),
        ValueError,
        "X must have last dimension 2",
    ),
    (
        "X batch",
        dict(X=torch.rand(1, 2, 2, dtype=DTYPE), Y=GOOD_Y),
        ValueError,
        "X must have shape q x d",
    ),
    ("dtype", dict(X=GOOD_X.float(), Y=GOOD_Y.float()), TypeError, "X has dtype torch.float32"),
    ("device", dict(X=GOOD_X.to("meta"), Y=GOOD_Y), TypeError, "X is on meta"),
    ("not tensor", dict(X=[[0.5, 0.5]], Y=GOOD_Y), TypeError, "X must be a torch.Tensor"),
    ("int dtype", dict(X=GOOD_X, Y=GOOD_Y.long()), TypeError, "Y must have a floating dtype"),
    (
        "Yvar for learned noise",
        dict(X=GOOD_X, Y=GOOD_Y, Yvar=GOOD_Y),
        ValueError,
        "Yvar must be None",
    ),
]


@pytest.mark.parametrize(
    "case,kwargs,error,match", OBSERVE_CASES, ids=[c[0] for c in OBSERVE_CASES]
)
def test_observe_rejects_bad_input(model, case, kwargs, error, match):
    snap = _snapshot(model)
    with pytest.raises(error, match=match):
        model.observe(**kwargs)
    _assert_unchanged(model, snap)


FIXED_CASES = [
    ("missing Yvar", dict(X=GOOD_X, Y=GOOD_Y), ValueError, "Yvar is required"),
    (
        "zero Yvar",
        dict(X=GOOD_X, Y=GOOD_Y, Yvar=torch.zeros(2, 1, dtype=DTYPE)),
        ValueError,
        "Yvar must be strictly positive",
    ),
    (
        "negative Yvar",
        dict(X=GOOD_X, Y=GOOD_Y, Yvar=-GOOD_Y),
        ValueError,
        "Yvar must be strictly positive",
    ),
    ("nan Yvar", dict(X=GOOD_X, Y=GOOD_Y, Yvar=INF_Y), ValueError, "Yvar contains NaN"),
    (
        "Yvar shape",
        dict(X=GOOD_X, Y=GOOD_Y, Yvar=torch.ones(1, 1, dtype=DTYPE)),
        ValueError,
        "Yvar must have the shape of Y",
    ),
]


@pytest.mark.parametrize("case,kwargs,error,match", FIXED_CASES, ids=[c[0] for c in FIXED_CASES])
def test_fixed_noise_observe_rejects_bad_noise(fixed_model, case, kwargs, error, match):
    snap = _snapshot(fixed_model)
    with pytest.raises(error, match=match):
        fixed_model.observe(**kwargs)
    _assert_unchanged(fixed_model, snap)


def test_observe_outside_the_grid_is_refused_without_kept_data():
    # With keep_data=True (the default) the model re-grids instead (test_wiski_regrid.py).
    X = torch.rand(20, 2, dtype=DTYPE)
    model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10, keep_data=False)
    assert model.observations is None
    snap = _snapshot(model)
    with pytest.raises(ValueError, match="X has points outside grid_bounds"):
        model.observe(OUTSIDE_X, GOOD_Y)
    _assert_unchanged(model, snap)


def test_condition_and_posterior_reject_bad_input(model):
    snap = _snapshot(model)
    # Beyond the grid: its data on a grid grown over X are conditioned (the model keeps
    # its grid); without kept data it is refused.
    assert model.condition_on_observations(OUTSIDE_X, GOOD_Y).interpolation.bounds[1, 1] >= 1.5
    X = model.observations.X
    frozen = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10, keep_data=False)
    with pytest.raises(ValueError, match="X has points outside grid_bounds"):
        frozen.condition_on_observations(OUTSIDE_X, GOOD_Y)
    with pytest.raises(ValueError, match="X contains NaN"):
        model.condition_on_observations(NAN_X, GOOD_Y)
    with pytest.raises(ValueError, match="noise must be strictly positive"):
        model.condition_on_observations(GOOD_X, GOOD_Y, noise=torch.zeros(2, 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="Y has 3 points per batch"):
        model.condition_on_observations(GOOD_X, torch.ones(3, 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="noise must have shape batch x q x 1 with q = 2"):
        model.condition_on_observations(GOOD_X, GOOD_Y, noise=torch.ones(3, 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="X contains NaN"):
        model.posterior(NAN_X)
    with pytest.warns(GridExtrapolationWarning, match="nearest point"):
        model.posterior(OUTSIDE_X)  # the default policy predicts at the nearest box point
    model.extrapolation = "error"
    with pytest.raises(ValueError, match="X has points outside grid_bounds"):
        model.posterior(OUTSIDE_X)
    with pytest.raises(TypeError, match="X has dtype"):
        model.posterior(GOOD_X.float())
    _assert_unchanged(model, snap)


def test_constructor_rejects_bad_input():
    X = torch.rand(5, 2, dtype=DTYPE)
    Y = torch.rand(5, 1, dtype=DTYPE)
    with pytest.raises(ValueError, match="train_X contains NaN"):
        WiskiGP(NAN_X, GOOD_Y)
    with pytest.raises(ValueError, match="train_Y has 4 rows"):
        WiskiGP(X, Y[:4])
    with pytest.raises(TypeError, match="train_Y has dtype"):
        WiskiGP(X, Y.float())
    with pytest.raises(ValueError, match="train_Yvar must be strictly positive"):
        WiskiGP(X, Y, torch.zeros_like(Y))
    with pytest.raises(ValueError, match="train_X has points outside grid_bounds"):
        WiskiGP(X + 2, Y, keep_data=False)
    with pytest.raises(TypeError, match="keep_data must be a bool"):
        WiskiGP(X, Y, keep_data=1)
    with pytest.raises(ValueError, match="grid_size"):
        WiskiGP(X, Y, grid_size=3)
    with pytest.raises(ValueError, match="grid_bounds"):
        WiskiGP(X, Y, grid_bounds=torch.ones(2, 2, dtype=DTYPE))
    # batched training data (issue 40) must have train_X's batch dimensions on train_Y
    with pytest.raises(ValueError, match="its batch dimensions must be train_X's"):
        WiskiGP(X.unsqueeze(0), Y)
    with pytest.raises(ValueError, match="likelihood must be None"):
        from gpytorch.likelihoods import GaussianLikelihood

        WiskiGP(X, Y, torch.ones_like(Y), likelihood=GaussianLikelihood())


def test_input_transforms_that_learn_the_grid_box_are_accepted_by_kissgp():
    # KissGP keeps its data and re-grids, as WiskiGP (test_kissgp_regrid.py).
    cls = KissGP
    X = 2.0 + 3.0 * torch.rand(6, 2, dtype=DTYPE)
    Y = torch.rand(6, 1, dtype=DTYPE)
    chained = ChainedInputTransform(norm=Normalize(2))
    for transform in (Normalize(2), InputStandardize(2), chained):
        model = cls(X, Y, input_transform=transform, grid_size=8)
        X_t = model.input_transform(X)
        # The grid covers the transformed data with a margin on every side.
        assert bool((model.interpolation.bounds[0] < X_t.min(0).values).all())
        assert bool((model.interpolation.bounds[1] > X_t.max(0).values).all())
        # A later point outside the first batch's box is observed (a re-grid).
        model.observe(torch.tensor([[2.0, 9.0]], dtype=DTYPE), torch.zeros(1, 1, dtype=DTYPE))
        assert model.num_train == 7
    # With the search space's bounds, points anywhere in it are accepted later.
    bounds = torch.tensor([[2.0, 2.0], [5.0, 5.0]], dtype=DTYPE)
    model = cls(X, Y, input_transform=Normalize(2, bounds=bounds), grid_size=8)
    model.posterior(torch.tensor([[2.0, 5.0]], dtype=DTYPE))


def test_default_grid_follows_dimension_domain_and_device():
    from streamgp.models.wiski import default_grid_size

    assert default_grid_size(1) == [256] and default_grid_size(3) == [10, 10, 10]
    assert default_grid_size(3, device="cuda") == [16, 16, 16]
    assert default_grid_size(2, device=torch.device("cuda")) == [64, 64]
    wide = torch.tensor([[0.0, -1.0], [1.0, 3.0]], dtype=torch.float64)
    assert default_grid_size(2, wide) == [16, 64]  # one spacing for both axes
    X = torch.rand(20, 2, dtype=torch.float64) * torch.tensor([1.0, 4.0], dtype=torch.float64)
    bounds = wide + torch.tensor([0.0, 1.0], dtype=torch.float64)  # [0, 1] x [0, 4]
    model = WiskiGP(X, X.sum(-1, keepdim=True), grid_bounds=bounds)
    assert model.interpolation.grid_size == [16, 64]
    chosen = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=7, grid_bounds=bounds)
    assert chosen.interpolation.grid_size == [7, 7]  # grid_size stays the override


def test_default_grid_in_four_or_more_dimensions_warns_and_names_the_additive_model():
    from streamgp.models.wiski import HighDimensionalGridWarning

    X = torch.rand(10, 4, dtype=DTYPE)
    Y = X.sum(-1, keepdim=True)
    with pytest.warns(HighDimensionalGridWarning, match=r"4\^4 = 256 weights.*AdditiveWiskiGP"):
        WiskiGP(X, Y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HighDimensionalGridWarning)
        WiskiGP(X, Y, grid_size=5)  # a deliberate grid
        WiskiGP(X[:, :3], Y)  # three dimensions: the product grid is WISKI's own


def test_a_noise_made_invalid_after_the_caches_were_built_is_refused(model):
    # The hot paths trust the noise checked when the caches were built while the
    # hyperparameters equal their snapshot; a changed noise parameter is a changed
    # snapshot: the rebuild checks it, and every call still refuses it.
    snapshot = _snapshot(model)
    with torch.no_grad():
        saved = model.likelihood.noise_covar.raw_noise.clone()
        model.likelihood.noise_covar.raw_noise.fill_(-0.1)
    with pytest.raises(ValueError, match="noise variance"):
        model.posterior(GOOD_X)
    with pytest.raises(ValueError, match="noise variance"):
        model.observe(GOOD_X, GOOD_Y)
    with pytest.raises(ValueError, match="noise variance"):
        model.condition_on_observations(GOOD_X, GOOD_Y)
    with torch.no_grad():
        model.likelihood.noise_covar.raw_noise.copy_(saved)
    _assert_unchanged(model, snapshot)


def test_caches_built_without_checks_have_their_noise_checked_afterwards(model):
    from streamgp.settings import skip_value_checks

    with torch.no_grad():
        model.likelihood.noise_covar.raw_noise.fill_(-0.1)
    with skip_value_checks():
        model.posterior(GOOD_X)  # factorised unchecked: NaNs, no error
    with pytest.raises(ValueError, match="noise variance"):
        model.posterior(GOOD_X)


def test_the_high_dimensional_warning_comes_once_even_when_bo_refits_every_iteration():
    """Python's once-per-location registry is cleared by every filter change (BoTorch's
    fit makes some), so a BO loop rebuilding its model warned every iteration."""
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from streamgp.models.utils import grids
    from streamgp.models.wiski import HighDimensionalGridWarning

    X = torch.rand(12, 7, dtype=DTYPE)
    Y = X.sum(-1, keepdim=True)
    grids._WARNED_HIGH_DIMENSIONAL.discard(("WiskiGP", 7))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            model = WiskiGP(X, Y)
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    high_dim = [w for w in caught if issubclass(w.category, HighDimensionalGridWarning)]
    assert len(high_dim) == 1 and high_dim[0].filename == __file__
    with pytest.warns(HighDimensionalGridWarning):  # an "always" filter still sees it
        WiskiGP(X, Y)
