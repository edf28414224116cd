"""Active-learning loop: end to end, qNIPV against brute force, resume, errors."""

import pytest
import torch

from streamgp.loops import AcquisitionOptions, ActiveLearningLoop
from streamgp.loops.acquisition import select_from_pool
from streamgp.models import WiskiGP

DTYPE = torch.float64
TINY = AcquisitionOptions(pool_batch_size=64)
MODEL_OPTIONS = {
    "wiski": {"grid_size": 12},
    "kissgp": {"grid_size": 12},
    "osvgp": {"num_inducing": 16, "update_steps": 3},
}


def data(seed=0, n=120):
    gen = torch.Generator().manual_seed(seed)
    X = 10 * torch.rand(n, 2, generator=gen, dtype=DTYPE)
    Y = torch.sin(X).sum(-1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=gen, dtype=DTYPE)
    return X, Y, torch.full_like(Y, 0.05**2)


def make_loop(model="wiski", acquisition="qnipv", fixed_noise=True, seed=0):
    X, Y, Yvar = data()
    return ActiveLearningLoop(
        X[:80],
        Y[:80],
        X[80:],
        Y[80:],
        pool_Yvar=Yvar[:80] if fixed_noise else None,
        model=model,
        acquisition=acquisition,
        q=3,
        num_init=5,
        num_mc_points=32,
        fit_max_iter=5,
        model_options=MODEL_OPTIONS.get(model, {}),
        acquisition_options=TINY,
        seed=seed,
    )


@pytest.mark.parametrize("model", ["wiski", "kissgp", "osvgp", "exact"])
@pytest.mark.parametrize("acquisition", ["qnipv", "maxvar", "random"])
@pytest.mark.parametrize("fixed_noise", [True, False])
def test_loop_runs_and_never_repeats_a_point(model, acquisition, fixed_noise):
    if model == "osvgp" and fixed_noise:
        # O-SVGP learns a homoskedastic noise; known noise is refused by name.
        with pytest.raises(ValueError, match="osvgp: known observation noise"):
            make_loop(model, acquisition, fixed_noise).run(1)
        return
    loop = make_loop(model, acquisition, fixed_noise)
    history = loop.run(2)
    assert list(history["num_observations"]) == [5, 8, 11]
    assert len(set(loop.chosen)) == 11 and int(loop.available.sum()) == 80 - 11
    assert (history["test_rmse"] > 0).all()


def test_more_queries_reduce_test_error():
    loop = make_loop("wiski", "qnipv")
    history = loop.run(6)
    assert history["test_rmse"].iloc[-1] < 0.8 * history["test_rmse"].iloc[0]


def integrated_variance_after(model, mc_points, chosen):
    """Brute force: mean variance at mc_points after conditioning on `chosen` (closed form)."""
    Z = torch.cat([mc_points, chosen])
    cov = model.posterior(Z).covariance_matrix
    p = len(mc_points)
    noise = model.likelihood.noise.squeeze() * torch.eye(len(chosen), dtype=DTYPE)
    gain = cov[:p, p:] @ torch.linalg.solve(cov[p:, p:] + noise, cov[p:, :p])
    return (cov[:p, :p].diagonal() - gain.diagonal()).mean()


@pytest.mark.parametrize("q", [1, 2])
def test_qnipv_choice_matches_brute_force_variance_reduction(q):
    X, Y, _ = data(n=60)
    X = X / 10
    model = WiskiGP(X[:20], Y[:20], grid_size=12)
    model.covar_module.lengthscale = 0.2
    model.likelihood.noise = 0.05
    model.eval()
    pool, mc_points = X[20:32], X[32:]
    chosen = select_from_pool("qnipv", model, pool, q, mc_points=mc_points, options=TINY)
    with torch.no_grad():
        # Greedy: each pick minimises the integrated variance given the earlier picks.
        expected = []
        for _ in range(q):
            scores = [
                integrated_variance_after(model, mc_points, pool[expected + [i]])
                if i not in expected
                else torch.tensor(float("inf"), dtype=DTYPE)
                for i in range(len(pool))
            ]
            expected.append(int(torch.stack(scores).argmin()))
    assert chosen.tolist() == expected


@pytest.mark.parametrize("resample", [True, False])
def test_qnipv_integration_points_are_redrawn_each_step_unless_fixed(monkeypatch, resample):
    import streamgp.loops.active as active

    seen = []
    original = active.select_from_pool

    def spy(*args, **kwargs):
        seen.append(kwargs["mc_points"].clone())
        return original(*args, **kwargs)

    monkeypatch.setattr(active, "select_from_pool", spy)
    loop = make_loop("wiski", "qnipv")
    loop.resample_mc_points = resample
    loop.run(3)
    assert len(seen) == 3 and all(points.shape == (32, 2) for points in seen)
    # Every integration point is a test input.
    for points in seen:
        assert (points.unsqueeze(-2) == loop.test_X).all(-1).any(-1).all()
    same = [torch.equal(seen[0], points) for points in seen[1:]]
    assert same == ([False, False] if resample else [True, True])


@pytest.mark.parametrize("model", ["wiski", "exact"])
def test_resume_from_checkpoint_reproduces_uninterrupted_run(tmp_path, model):
    full = make_loop(model).run(3)
    path = tmp_path / "active.pt"
    make_loop(model).run(1, checkpoint=path)
    resumed = make_loop(model).load(path)
    history = resumed.run(3)
    assert history["num_observations"].tolist() == full["num_observations"].tolist()
    assert torch.allclose(
        torch.tensor(history["test_rmse"].to_numpy()), torch.tensor(full["test_rmse"].to_numpy())
    )
    reference = make_loop(model)
    reference.run(3)
    assert resumed.chosen == reference.chosen


def test_bad_arguments_name_themselves():
    X, Y, Yvar = data()
    with pytest.raises(ValueError, match="acquisition must be one of"):
        ActiveLearningLoop(X[:80], Y[:80], X[80:], Y[80:], acquisition="ei")
    with pytest.raises(ValueError, match="num_init"):
        ActiveLearningLoop(X[:8], Y[:8], X[80:], Y[80:], num_init=5, q=6)
    with pytest.raises(ValueError, match="pool_Yvar"):
        ActiveLearningLoop(X[:80], Y[:80], X[80:], Y[80:], pool_Yvar=-Yvar[:80])
    with pytest.raises(ValueError, match="test_X"):
        ActiveLearningLoop(X[:80], Y[:80], X[80:, :1], Y[80:])
    with pytest.raises(ValueError, match="pool_Y"):
        ActiveLearningLoop(X[:80], Y[:70], X[80:], Y[80:])
