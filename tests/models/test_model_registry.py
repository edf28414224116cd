"""The model registry: entries, options, capabilities, and every entry through the adapter."""

import copy
import math

import pytest
import torch
from botorch.models import SingleTaskGP

from streamgp.inducing.kmeans import KMeansSelector
from streamgp.loops.surrogates import Surrogate
from streamgp.models import WiskiGP
from streamgp.models.registry import (
    AUTO_DATA_SPACE_MAX_OBSERVATIONS,
    CAPABILITIES,
    ModelSpec,
    choose_model,
    get_model_spec,
    points_around_incumbent,
    register_model,
    registered_models,
    restandardize_before_refit,
    unregister_model,
)

DT = torch.float64
#: Small settings per entry, so each runs in well under a second.
SMALL = {
    "wiski": {"grid_size": 8},
    "wiski-additive": {"grid_size": 8},
    "kissgp": {"grid_size": 8},
    "softki": {"num_inducing": 16},
    "osvgp": {"num_inducing": 8, "update_steps": 2, "fit_steps": 2},
}


def _data(n, seed=0, dim=2):
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n, dim, dtype=DT, generator=gen)
    return X, torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=gen)


def test_every_entry_is_a_complete_spec():
    names = registered_models()
    assert {"wiski", "wiski-additive", "kissgp", "softki", "osvgp", "exact"} <= set(names)
    for name in names:
        spec = get_model_spec(name)
        assert spec.name == name and spec.summary
        assert spec.capabilities <= set(CAPABILITIES)
    # Capabilities are what the models do.
    assert set(registered_models("fixed_noise")) >= {"wiski", "kissgp", "exact"}
    assert "osvgp" not in registered_models("fixed_noise")
    assert set(registered_models("high_dim")) >= {"wiski-additive", "softki"}
    assert "exact" not in registered_models("constant_time_update")
    assert get_model_spec("wiski").incremental and get_model_spec("wiski").checkpoints
    assert not get_model_spec("exact").incremental
    # The loops offer what each entry runs in.
    assert "exact-projected" in registered_models(loop="stream")
    assert "exact-projected" not in registered_models(loop="bo")
    assert "kissgp" not in registered_models(loop="stream")
    with pytest.raises(ValueError, match="model must be one of"):
        Surrogate("exact-projected", *_data(5))


@pytest.mark.parametrize("name", registered_models(loop="bo"))
def test_every_entry_runs_through_the_adapter_and_resumes_exactly(name):
    # Build, absorb, refit, save, and restore into a fresh adapter: the restored one
    # predicts as the saved one, and the next batch keeps them equal.
    X, Y = _data(30)
    options = SMALL.get(name, {})
    surrogate = Surrogate(name, X[:10], Y[:10], **options)
    surrogate.update(X[10:20], Y[10:20])
    surrogate.fit(max_iter=3)
    state = surrogate.state_dict()
    resumed = Surrogate(name, X[:10], Y[:10], **options)
    resumed.load_state_dict(state)
    test_X = torch.rand(7, 2, dtype=DT)
    for s in (surrogate, resumed):
        s.update(X[20:], Y[20:])
    means = [s.model.posterior(test_X).mean for s in (surrogate, resumed)]
    assert torch.allclose(means[0], means[1], rtol=1e-9, atol=1e-9)
    assert torch.isfinite(means[0]).all()


def test_options_are_checked_against_the_entry():
    X, Y = _data(8)
    unknown = r"model_options \['grid_sise'\] are not options of 'wiski'"
    with pytest.raises(ValueError, match=unknown):
        Surrogate("wiski", X, Y, grid_sise=8)
    with pytest.raises(ValueError, match="model must be one of"):
        Surrogate("wisky", X, Y)
    with pytest.raises(ValueError, match="osvgp: known observation noise"):
        Surrogate("osvgp", X, Y, torch.full_like(Y, 0.01))
    spec = get_model_spec("wiski")
    assert spec.resolve_options({"grid_size": 5}) == {
        "grid_size": 5,
        "restandardize": True,
        "refine_grid": True,
        "max_grid_points": None,
    }


def test_specs_are_validated_and_names_are_unique():
    with pytest.raises(ValueError, match="capabilities"):
        ModelSpec("x", SingleTaskGP, "x", frozenset({"telepathy"}))
    with pytest.raises(TypeError, match="model_class"):
        ModelSpec("x", dict, "x")
    with pytest.raises(ValueError, match="is registered"):
        register_model(ModelSpec("wiski", SingleTaskGP, "again"))
    with pytest.raises(ValueError, match="model must be one of"):
        unregister_model("not-a-model")
    with pytest.raises(ValueError, match="capability must be one of"):
        get_model_spec("wiski").supports("telepathy")


def test_choose_model_follows_the_documented_rule():
    assert [choose_model(d) for d in (1, 2, 3, 4, 20)] == ["wiski"] * 3 + ["wiski-additive"] * 2
    # Above 3-D a run of known, short length gets WISKI in data space (an exact GP's
    # answers); a longer or open-ended one the constant-time additive model.
    limit = AUTO_DATA_SPACE_MAX_OBSERVATIONS
    assert [choose_model(d, limit) for d in (3, 4, 20)] == ["wiski"] * 3
    assert [choose_model(d, limit + 1) for d in (3, 4, 20)] == ["wiski"] + ["wiski-additive"] * 2
    with pytest.raises(ValueError, match="dim"):
        choose_model(0)
    with pytest.raises(ValueError, match="num_observations"):
        choose_model(6, 0)


# ------------------------------------------------ softki: points that follow the search
def test_points_around_incumbent_are_local_data_and_global():
    X, _ = _data(40, dim=3)
    incumbent = torch.tensor([0.95, 0.5, 0.02], dtype=DT)  # the box is shifted into the cube
    Z = points_around_incumbent(X, incumbent, 40, seed=3, width=0.2)
    assert Z.shape == (40, 3) and ((Z >= 0) & (Z <= 1)).all()
    lower = torch.tensor([0.8, 0.4, 0.0], dtype=DT)
    assert ((Z[:20] >= lower) & (Z[:20] <= lower + 0.2)).all()  # half in the local box
    torch.testing.assert_close(Z[20:30], KMeansSelector(num_inducing=10, seed=3).update(X))
    assert not ((Z[30:] >= lower) & (Z[30:] <= lower + 0.2)).all()  # the rest: the cube
    assert torch.equal(Z, points_around_incumbent(X, incumbent, 40, seed=3, width=0.2))
    assert points_around_incumbent(X[:2], incumbent, 40, seed=3).shape == (40, 3)  # n < 10
    for kwargs, match in [({"width": 0.0}, "width"), ({"num": 0}, "num")]:
        with pytest.raises(ValueError, match=match):
            points_around_incumbent(X, incumbent, **{"num": 8, "seed": 0, **kwargs})


def test_softki_moving_points_are_drawn_around_the_incumbent_at_each_refit():
    X, Y = _data(40, dim=2)
    fixed = Surrogate("softki", X[:10], Y[:10], num_inducing=24)
    moving = Surrogate("softki", X[:10], Y[:10], num_inducing=24, moving_points=True)
    start = moving.model.inducing_points.clone()
    assert torch.equal(start, fixed.model.inducing_points)  # the same Sobol design at build
    for s in (fixed, moving):
        s.update(X[10:30], Y[10:30])
    before = copy.deepcopy(moving.model)
    moving.fit(max_iter=3)
    fixed.fit(max_iter=3)
    assert torch.equal(fixed.model.inducing_points, start)  # the default: fixed points
    # Oracle: the incumbent is the kept input of highest posterior mean before the refit.
    with torch.no_grad():
        incumbent = X[:30][before.posterior(X[:30].unsqueeze(-2)).mean.reshape(-1).argmax()]
    expected = points_around_incumbent(X[:30], incumbent, 24, seed=0 + 30)
    torch.testing.assert_close(moving.model.inducing_points, expected, rtol=0, atol=0)
    distance = torch.cdist(expected, expected).fill_diagonal_(math.inf).min(-1).values.median()
    assert moving.model.temperature.item() == pytest.approx(0.5 * distance.item())
    # A resumed loop draws the same points at the next refit and predicts the same.
    resumed = Surrogate("softki", X[:10], Y[:10], num_inducing=24, moving_points=True)
    resumed.load_state_dict(moving.state_dict())
    test_X = torch.rand(5, 2, dtype=DT)
    for s in (moving, resumed):
        s.update(X[30:], Y[30:])
        s.fit(max_iter=3)
    assert torch.equal(moving.model.inducing_points, resumed.model.inducing_points)
    means = [s.model.posterior(test_X).mean for s in (moving, resumed)]
    torch.testing.assert_close(means[0], means[1], rtol=1e-9, atol=1e-9)
    with pytest.raises(TypeError, match="moving_points"):
        Surrogate("softki", X[:10], Y[:10], moving_points=1)


def test_softki_moves_its_points_by_default_from_three_dimensions():
    # The entry's default (moving_points=None) follows the measurement: on from 3-D.
    for dim, moves in ((2, False), (3, True)):
        X, Y = _data(30, dim=dim)
        surrogate = Surrogate("softki", X[:10], Y[:10], num_inducing=16)
        start = surrogate.model.inducing_points.clone()
        surrogate.update(X[10:], Y[10:])
        surrogate.fit(max_iter=2)
        assert surrogate.model.keep_data is moves
        assert (not torch.equal(surrogate.model.inducing_points, start)) is moves


def test_the_streaming_protocol_keeps_the_papers_first_order_variational_steps():
    # The protocol's quoted O-SVGP / SVDGP figures were measured with per-arrival Adam
    # steps on the variational parameters; the models' defaults now hold them at their
    # closed-form optimum instead (BoTorch users' observe after a fit).
    protocol = {
        "num_inducing": 8,
        "inducing": "kmeans",
        "classification": False,
        "pretrain_steps": 2,
        "pretrain_lr": 0.01,
        "lr": 0.01,
    }
    X = torch.rand(20, 2, dtype=torch.float64)
    y = X.sum(-1, keepdim=True)
    for name in ("osvgp", "svdgp"):
        recipe = get_model_spec(name).stream
        model = recipe.build(X, y, None, protocol=protocol, reuse=None, **recipe.options)
        assert model.hold_variational_optimum is False, name
    assert model.holds_optimum is False and model.warm_start  # SVDGP's initial warm start


def test_a_kept_model_is_restandardised_before_its_refit():
    # Standardize fitted on the Sobol trials alone is far off once better trials arrive
    # (Ax's streaming refit found noise 3.4 on Hartmann-6, against 0.0065 on all trials).
    X = torch.rand(16, 3, dtype=torch.float64)
    Y = torch.cat([0.1 * torch.rand(6, 1), -2 + 0.1 * torch.rand(10, 1)]).to(X)
    model = WiskiGP(X[:6], Y[:6]).observe(X[6:], Y[6:])
    restandardize_before_refit(model)
    assert torch.allclose(model.outcome_transform.means, Y.mean(), atol=1e-12)
    assert torch.allclose(model.outcome_transform.stdvs, Y.std(), atol=1e-12)
    known = WiskiGP(X[:6], Y[:6], torch.full_like(Y[:6], 1e-3))
    means = known.outcome_transform.means.clone()
    restandardize_before_refit(known)  # known noise: only noise-weighted sums are kept
    assert torch.equal(known.outcome_transform.means, means)
