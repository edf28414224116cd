"""The online protocol: Dirichlet targets, metrics, eq. 18 projection steps, the loop, the CLI."""

import copy
import math
from dataclasses import replace

import pandas as pd
import pytest
import torch
from botorch.models import SingleTaskGP
from helpers_datasets import SHARED_DATA
from scipy.stats import norm

from streamgp.cli import main
from streamgp.datasets import (
    load_streaming_split,
    make_streaming_split,
    synthetic_classification,
    synthetic_regression,
)
from streamgp.inducing import OnlineInducingPointSelector
from streamgp.loops.stream import (
    STREAM_MODELS,
    Learner,
    StreamConfig,
    StreamingLoop,
    classification_metrics,
    dirichlet_probabilities,
    dirichlet_targets,
    evaluations_nearest,
    merge_runs,
    regression_metrics,
    run_stream_experiment,
    summarize_stream,
)
from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models import DecoupledSVGP, ProjectedKernel

FAST = StreamConfig(pretrain_steps=15, num_inducing=16, grid_size=10)
SMALL_SVDGP = {"max_mean_basis": 30, "max_covar_basis": 8, "minibatch_size": 16}


def _regression_split(n=240, d=2, seed=0):
    return make_streaming_split(synthetic_regression(n, d, seed=seed), seed=seed)


# ---------------------------------------------------------------- Dirichlet targets
def test_dirichlet_targets_match_the_closed_form():
    labels = torch.tensor([0.0, 2.0, 1.0, 2.0], dtype=torch.float64)
    targets, noise = dirichlet_targets(labels, 3, alpha_epsilon=0.05)
    for i, label in enumerate([0, 2, 1, 2]):
        for c in range(3):
            alpha = 0.05 + (1.0 if c == label else 0.0)
            s2 = math.log(1 + 1 / alpha)
            assert noise[i, c].item() == pytest.approx(s2, rel=1e-14)
            assert targets[i, c].item() == pytest.approx(math.log(alpha) - s2 / 2, rel=1e-14)
    # The lognormal N(y, s2) matches the Gamma(alpha, 1) mean and variance (Milios et al.).
    alpha = torch.nn.functional.one_hot(labels.long(), 3).double() + 0.05
    torch.testing.assert_close(torch.exp(targets + noise / 2), alpha)
    torch.testing.assert_close((noise.exp() - 1) * alpha**2, alpha)
    assert targets.dtype == noise.dtype == torch.float64


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.tensor([0.0, 1.0]), 1), "num_classes must be an int >= 2"),
        ((torch.tensor([0.0, 2.0]), 2), "integers in \\[0, 1\\]"),
        ((torch.tensor([0.5]), 2), "integers"),
        ((torch.zeros(2, 1), 2), "1-d tensor"),
        ((torch.tensor([0.0]), 2, 0.0), "alpha_epsilon must be a positive number"),
    ],
)
def test_dirichlet_targets_reject_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        dirichlet_targets(*args)


def test_dirichlet_probabilities_without_variance_are_the_softmax():
    mean = torch.randn(5, 3, dtype=torch.float64)
    probabilities = dirichlet_probabilities(mean, torch.zeros_like(mean), 4)
    torch.testing.assert_close(probabilities, mean.softmax(-1))


# ---------------------------------------------------------------- metrics
def test_regression_metrics_match_scipy():
    mean, variance, Y = torch.randn(20, 1), torch.rand(20, 1) + 0.1, torch.randn(20, 1)
    mean, variance, Y = mean.double(), variance.double(), Y.double()
    metrics = regression_metrics(mean, variance, Y)
    expected_nll = -norm.logpdf(Y.numpy(), mean.numpy(), variance.sqrt().numpy()).mean()
    assert metrics["test_nll"] == pytest.approx(expected_nll, rel=1e-12)
    assert metrics["test_rmse"] == pytest.approx(((mean - Y) ** 2).mean().sqrt().item())


def test_classification_metrics():
    probabilities = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]], dtype=torch.float64)
    metrics = classification_metrics(probabilities, torch.tensor([0.0, 1.0, 1.0]))
    assert metrics["test_accuracy"] == pytest.approx(2 / 3)
    assert metrics["test_nll"] == pytest.approx(
        -(math.log(0.9) + math.log(0.7) + math.log(0.4)) / 3
    )


# ---------------------------------------------------------------- eq. 18
def _projected_learner():
    split = _regression_split(200, d=5)
    config = StreamConfig(pretrain_steps=3, grid_size=10, lr=0.05)
    learner = Learner("wiski", split.pretrain_X, split.pretrain_Y, None, config)
    return learner, split


def _grid_statistics(model) -> dict[str, torch.Tensor]:
    """W^T W, W^T y, y^T y and n of the model's rows (as stored: frozen weights)."""
    stats = model.statistics.to_grid()
    return {"A": stats.A, "b": stats.b, "c": stats.c, "n": stats.n}


def test_projection_step_leaves_old_statistics_untouched():
    learner, split = _projected_learner()
    assert learner.projection is not None and not learner.projection.training
    model = learner.models[0]
    old = {k: v.clone() for k, v in _grid_statistics(model).items()}
    old_phi = [p.detach().clone() for p in learner.projection.parameters()]
    old_features = learner.projection(split.online_X[:1]).detach()
    X, Y = split.online_X[:1], split.online_Y[:1]
    learner.step(X, Y)
    # The projection moved, so the new point uses different features ...
    new_phi = list(learner.projection.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(old_phi, new_phi, strict=True))
    with torch.no_grad():
        new_features = learner.projection(X)
    assert not torch.allclose(new_features, old_features)
    # ... and the statistics grew by exactly that point's contribution with the *new*
    # projection: the old points' interpolation weights were not recomputed.
    w = model.interpolation.weights(new_features).to_dense().squeeze(0)
    new = _grid_statistics(model)
    torch.testing.assert_close(new["A"], old["A"] + torch.outer(w, w))
    torch.testing.assert_close(new["b"], old["b"] + w * Y.squeeze())
    torch.testing.assert_close(new["c"], old["c"] + Y.squeeze() ** 2)
    assert new["n"].item() == old["n"].item() + 1
    w_old = model.interpolation.weights(old_features).to_dense().squeeze(0)
    assert not torch.allclose(new["A"], old["A"] + torch.outer(w_old, w_old))


def test_streaming_loss_is_the_mll_after_absorbing_with_old_weights_frozen():
    learner, split = _projected_learner()
    X, Y = split.online_X[:2], split.online_Y[:2]
    before = {k: v.clone() for k, v in _grid_statistics(learner.models[0]).items()}
    loss = learner.streaming_loss(X, Y, None)
    for key, value in _grid_statistics(learner.models[0]).items():  # nothing mutated
        assert torch.equal(value, before[key])
    oracle = copy.deepcopy(learner.models[0])
    with torch.no_grad():
        oracle.observe(learner.projection(X), Y)
        expected = -WoodburyMarginalLogLikelihood(oracle.likelihood, oracle)()
    torch.testing.assert_close(loss.detach(), expected)
    loss.backward()
    assert learner.projection.linear.weight.grad.abs().sum() > 0


def test_exact_projected_is_an_exact_gp_on_recomputed_projected_features():
    split = _regression_split(200, d=5)
    config = StreamConfig(pretrain_steps=5, lr=0.05)
    learner = Learner("exact-projected", split.pretrain_X, split.pretrain_Y, None, config)
    projection = learner.model.covar_module.projection
    assert not projection.training  # calibrated running statistics from here on
    running = projection.batch_norm.running_mean.clone()
    old_phi = [p.detach().clone() for p in projection.parameters()]
    X, Y = split.online_X[:3], split.online_Y[:3]
    learner.step(X, Y)
    assert torch.equal(projection.batch_norm.running_mean, running)
    assert any(not torch.equal(a, b) for a, b in zip(old_phi, projection.parameters(), strict=True))
    # Oracle: an exact GP on the features of *all* points under the current projection.
    with torch.no_grad():
        features = projection(torch.cat([split.pretrain_X, X]))
        oracle = SingleTaskGP(
            features,
            torch.cat([split.pretrain_Y, Y]),
            covar_module=learner.model.covar_module.base_kernel,
            mean_module=learner.model.mean_module,
            likelihood=learner.model.likelihood,
            outcome_transform=None,
        ).eval()
        posterior = oracle.posterior(projection(split.test_X[:20]), observation_noise=True)
    mean, variance = learner.predict(split.test_X[:20])
    torch.testing.assert_close(mean, posterior.mean)
    torch.testing.assert_close(variance, posterior.variance)
    # Without a projection (d <= 3, as WISKI) it is the plain exact GP.
    low = _regression_split(100, d=2)
    plain = Learner("exact-projected", low.pretrain_X, low.pretrain_Y, None, config)
    assert not isinstance(plain.model.covar_module, ProjectedKernel)


# ---------------------------------------------------------------- the loop
@pytest.mark.parametrize(
    "model", ["wiski", "exact", "exact-projected", "osvgp", "osgpr", "svdgp", "local"]
)
def test_protocol_end_to_end_on_synthetic_regression(model):
    split = _regression_split()
    loop = StreamingLoop(split, model, config=FAST, num_evals=3, max_stream=30)
    history = loop.run(progress=False)
    assert loop.num_steps == 30 and len(history) == 31
    assert history["num_observations"].tolist() == list(
        range(split.num_pretrain, split.num_pretrain + 31)
    )
    evaluated = history.dropna(subset=["test_rmse"])
    assert evaluated["step"].tolist() == [0, 10, 20, 30]
    assert evaluated[["test_rmse", "test_nll"]].notna().all().all()
    # A smooth function with little noise: every model beats the constant predictor.
    assert evaluated["test_rmse"].iloc[-1] < 0.8
    assert (history.loc[1:, "update_time"] > 0).all() and history.loc[0, "fit_time"] > 0


def test_svdgp_grows_its_bases_and_takes_one_step_per_arrival():
    split = _regression_split()
    config = replace(FAST, model_options={"svdgp": SMALL_SVDGP})
    loop = StreamingLoop(split, "svdgp", config=config, num_evals=2, max_stream=20)
    loop.run(1)  # pretraining and the first arrival
    model = loop.learner.model
    assert isinstance(model, DecoupledSVGP) and model.lr_decay == 0
    # Pretraining: the covariance basis is full, the mean basis holds all the points.
    assert 8 < split.num_pretrain < 30 and len(model.covar_basis) == 8
    assert model.num_optimizer_steps == FAST.pretrain_steps + 1
    assert model.num_observed == split.num_pretrain + 1
    assert len(model.mean_basis) == split.num_pretrain + 1
    # Algorithm 1: the arrival joined the mean basis (the cap on M_beta is reached).
    torch.testing.assert_close(model.mean_basis[-1], split.online_X[0])
    assert model.mean_weights.shape == (split.num_pretrain + 1,)
    assert model.optimizer_kwargs["lr"] == FAST.lr
    assert model.minibatch_size == model.kl_columns == 16  # the paper's estimator
    exact_kl = StreamingLoop(
        split,
        "svdgp",
        config=replace(config, model_options={"svdgp": {**SMALL_SVDGP, "kl_columns": 30}}),
    )
    exact_kl.run(0)
    assert exact_kl.learner.model.kl_columns == 30
    history = loop.run()
    assert len(history) == 21
    assert model.num_optimizer_steps == FAST.pretrain_steps + 20
    assert len(model.mean_basis) == 30 and len(model.covar_basis) == 8  # capped
    # The last arrival that fitted under the cap is the mean basis's last point.
    torch.testing.assert_close(model.mean_basis[-1], split.online_X[30 - split.num_pretrain - 1])
    final = history.dropna(subset=["test_rmse"]).iloc[-1]
    assert final["test_rmse"] < 0.8


def test_svdgp_checkpoint_resume_matches_an_uninterrupted_run(tmp_path):
    # The model's own generator (minibatches, reservoir) is part of the checkpoint.
    split = _regression_split()
    config = replace(FAST, model_options={"svdgp": SMALL_SVDGP})
    kwargs = {"config": config, "num_evals": 2, "max_stream": 10}
    full = StreamingLoop(split, "svdgp", **kwargs).run()
    StreamingLoop(split, "svdgp", **kwargs).run(4, checkpoint=tmp_path / "svdgp.pt")
    rest = StreamingLoop(split, "svdgp", **kwargs).load(tmp_path / "svdgp.pt").run()
    columns = ["num_observations", "test_rmse", "test_nll"]
    pd.testing.assert_frame_equal(rest[columns], full[columns])
    other = StreamingLoop(split, "svdgp", **kwargs, seed=1).run()
    assert not other["test_rmse"].dropna().equals(full["test_rmse"].dropna())


@pytest.mark.parametrize("model", ["osvgp", "osgpr"])
def test_oips_chooses_the_inducing_points_of_osvgp_and_osgpr(model):
    split = _regression_split()
    config = replace(FAST, inducing="oips", oips_rho=0.6, num_inducing=40)
    loop = StreamingLoop(split, model, config=config, num_evals=1, max_stream=30)
    history = loop.run()
    learned = loop.learner.model
    selector = learned.inducing_selector
    assert isinstance(selector, OnlineInducingPointSelector)
    assert selector.kernel is learned.covar_module  # follows the learned kernel
    Z = learned.inducing_points.detach()
    torch.testing.assert_close(Z, selector.inducing_points)
    # Every inducing point is a distinct input seen so far; OIPS keeps a diverse subset
    # (at the kernel of the time each was accepted, so no check under the final kernel).
    seen = torch.cat([split.pretrain_X, split.online_X[:30]])
    assert (torch.cdist(Z, seen).min(-1).values < 1e-12).all()
    distances = torch.cdist(Z, Z) + torch.eye(len(Z), dtype=Z.dtype)
    assert 1 < len(Z) < 40 and distances.min() > 0
    assert history["test_rmse"].dropna().iloc[-1] < 0.8
    default = StreamingLoop(split, model, config=FAST, num_evals=1, max_stream=2)
    default.run()
    assert default.learner.model.inducing_selector is None


def test_wiski_tracks_the_exact_gp_and_exact_max_caps_the_exact_run():
    split = _regression_split(400)
    config = StreamConfig(pretrain_steps=40, grid_size=16, exact_max=60)
    finals = {}
    for model in ("wiski", "exact", "exact-projected"):
        loop = StreamingLoop(split, model, config=config, num_evals=1, max_stream=100)
        finals[model] = loop.run().dropna(subset=["test_rmse"]).iloc[-1]
    assert (
        finals["exact"]["num_observations"] == finals["exact-projected"]["num_observations"] == 60
    )
    assert finals["wiski"]["num_observations"] == split.num_pretrain + 100
    assert finals["wiski"]["test_rmse"] < 1.25 * finals["exact"]["test_rmse"]


def test_batches_and_checkpoint_resume_match_an_uninterrupted_run(tmp_path):
    split = _regression_split()
    loop = StreamingLoop(split, "wiski", config=FAST, batch_size=4, num_evals=2, max_stream=22)
    full = loop.run()
    assert loop.num_steps == 6 and full["num_observations"].iloc[-1] == split.num_pretrain + 22
    first = StreamingLoop(split, "wiski", config=FAST, batch_size=4, num_evals=2, max_stream=22)
    first.run(3, checkpoint=tmp_path / "run.pt")
    resumed = StreamingLoop(split, "wiski", config=FAST, batch_size=4, num_evals=2, max_stream=22)
    rest = resumed.load(tmp_path / "run.pt").run()
    columns = ["num_observations", "test_rmse", "test_nll"]
    pd.testing.assert_frame_equal(rest[columns], full[columns])
    other = StreamingLoop(split, "exact", config=FAST, batch_size=4, max_stream=22)
    with pytest.raises(ValueError, match="settings"):
        other.load(tmp_path / "run.pt")


@pytest.mark.parametrize("model", ["wiski", "softki", "exact", "exact-projected", "osvgp"])
def test_classification_protocol(model):
    split = make_streaming_split(synthetic_classification(300, seed=2), seed=0)
    loop = StreamingLoop(split, model, config=FAST, num_evals=1, max_stream=40)
    final = loop.run().dropna(subset=["test_nll"]).iloc[-1]
    assert 0.6 < final["test_accuracy"] <= 1 and 0 < final["test_nll"] < math.log(2)


def test_loop_rejects_bad_arguments():
    split = _regression_split()
    with pytest.raises(ValueError, match="model must be one of"):
        StreamingLoop(split, "svgp")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        StreamingLoop(split, "wiski", batch_size=0)
    with pytest.raises(TypeError, match="split must be a StreamingSplit"):
        StreamingLoop(split.train_X, "wiski")
    classification = make_streaming_split(synthetic_classification(100), seed=0)
    with pytest.raises(ValueError, match="no classification variant"):
        StreamingLoop(classification, "local")
    with pytest.raises(ValueError, match="projection must be"):
        StreamConfig(projection="maybe")
    with pytest.raises(ValueError, match="pretrain_steps must be a non-negative int"):
        StreamConfig(pretrain_steps=-1)
    with pytest.raises(ValueError, match="inducing must be 'default' or 'oips'"):
        StreamConfig(inducing="kmeans")
    with pytest.raises(ValueError, match="oips_rho must be in"):
        StreamConfig(oips_rho=1.0)
    # Per-model options are the registry's, checked by name when the config is made.
    unknown = r"model_options\['svdgp'\] \['covar_basis'\] are not protocol options of 'svdgp'"
    with pytest.raises(ValueError, match=unknown):
        StreamConfig(model_options={"svdgp": {"covar_basis": 8}})
    with pytest.raises(ValueError, match="'kissgp', which the protocol does not run"):
        StreamConfig(model_options={"kissgp": {"grid_size": 8}})
    with pytest.raises(ValueError, match="model must be one of"):
        StreamConfig(model_options={"nope": {}})


def test_experiment_writes_curves_plot_and_summary(tmp_path):
    results = run_stream_experiment(
        lambda seed: _regression_split(seed=seed),
        name="synthetic",
        models=["wiski", "exact"],
        trials=2,
        num_evals=2,
        max_stream=6,
        config=FAST,
        out=tmp_path,
        progress=False,
    )
    written = pd.read_csv(tmp_path / "stream_synthetic.csv")
    assert len(written) == len(results) == 2 * 2 * 7
    assert (tmp_path / "stream_synthetic.png").stat().st_size > 0
    summary = summarize_stream(results)
    assert summary["model"].tolist() == ["wiski", "exact"] and (summary["trials"] == 2).all()
    assert summary["test_rmse_mean"].notna().all() and (summary["time_per_step_s"] > 0).all()


def test_first_trial_reproduces_the_later_trials_of_a_longer_run():
    kwargs = dict(name="synthetic", models=["exact"], num_evals=1, max_stream=5, config=FAST)
    both = run_stream_experiment(lambda seed: _regression_split(seed=seed), trials=2, **kwargs)
    second = run_stream_experiment(
        lambda seed: _regression_split(seed=seed), trials=1, first_trial=1, **kwargs
    )
    assert second["trial"].unique().tolist() == [1]
    expected = both[both["trial"] == 1].reset_index(drop=True)
    pd.testing.assert_series_equal(second["test_rmse"], expected["test_rmse"])
    for argument, value in (("trials", 0), ("first_trial", -1), ("first_trial", 1.0)):
        with pytest.raises(ValueError, match=argument):
            run_stream_experiment(_regression_split, name="x", **{argument: value})


def test_evaluations_nearest_reads_each_run_at_n_or_its_last_evaluation():
    curves = pd.DataFrame(
        {
            "dataset": ["a"] * 7 + ["b"] * 2,
            "model": ["wiski"] * 4 + ["exact"] * 3 + ["wiski"] * 2,
            "trial": 0,
            "num_observations": [100, 150, 190, 300, 100, 120, 150, 100, 400],
            "test_rmse": [0.5, 0.4, float("nan"), 0.3, 0.6, float("nan"), 0.55, 0.7, 0.2],
        }
    )
    nearest = evaluations_nearest(curves, 200)
    assert nearest[["dataset", "model"]].values.tolist() == [
        ["a", "wiski"],
        ["a", "exact"],
        ["b", "wiski"],
    ]
    # 190 is not evaluated; the exact run stopped at 150; b is nearer 100 than 400.
    assert nearest["num_observations"].tolist() == [150, 150, 100]
    with pytest.raises(ValueError, match="num_observations"):
        evaluations_nearest(curves, -1)


def test_merge_runs_keeps_each_run_once_the_latest_given():
    def curves(model, trials, value):
        return pd.DataFrame(
            {"dataset": "a", "model": model, "trial": trials, "step": 0, "test_rmse": value}
        )

    merged = merge_runs(
        [curves("wiski", [0, 1], 1.0), curves("exact", [0], 2.0), curves("wiski", [1, 2], 3.0)]
    )
    runs = merged.set_index(["model", "trial"])["test_rmse"].sort_index().to_dict()
    assert runs == {("exact", 0): 2.0, ("wiski", 0): 1.0, ("wiski", 1): 3.0, ("wiski", 2): 3.0}


def test_for_dataset_applies_the_dataset_settings_then_the_overrides():
    elevators = StreamConfig.for_dataset("elevators")
    assert (elevators.pretrain_steps, elevators.pretrain_lr, elevators.lr) == (1000, 1e-2, 1e-3)
    assert StreamConfig.for_dataset("elevators", pretrain_steps=5).pretrain_steps == 5
    assert StreamConfig.for_dataset("protein").pretrain_steps == StreamConfig().pretrain_steps
    assert StreamConfig.for_dataset("banana") == StreamConfig()
    with pytest.raises(ValueError, match="lr must be a positive number"):
        StreamConfig.for_dataset("protein", lr=0)


# ---------------------------------------------------------------- shared data
@pytest.fixture
def shared_data():
    if SHARED_DATA is None:
        pytest.skip(
            "shared benchmark data not found (set STREAMGP_DATA or provide ../shared/data); "
            "users' machines do not have it"
        )
    return SHARED_DATA


def test_protocol_on_powerplant_with_a_small_cap(shared_data):
    split = load_streaming_split("powerplant", seed=0, data_dir=shared_data)
    assert split.num_features == 4  # > 3: WISKI learns a projection
    config = StreamConfig(pretrain_steps=20, exact_max=500)
    for model in ("wiski", "exact", "exact-projected"):
        loop = StreamingLoop(split, model, config=config, num_evals=1, max_stream=20)
        final = loop.run().dropna(subset=["test_rmse"]).iloc[-1]
        assert final["test_rmse"] < 0.5  # standardized units: powerplant is easy
        if model == "wiski":
            assert loop.learner.projection is not None
        if model == "exact-projected":
            assert isinstance(loop.learner.model.covar_module, ProjectedKernel)


# ---------------------------------------------------------------- command line
@pytest.mark.parametrize(
    "argv, message",
    [
        (["stream", "--dataset", "mars"], "Unknown dataset 'mars'. Registered datasets:"),
        (["stream", "--models", "wiski,gpt"], "unknown model ['gpt']"),
        (["stream", "--projection", "always"], "invalid choice: 'always'"),
    ],
)
def test_stream_cli_errors_are_clear(argv, message, capsys):
    with pytest.raises(SystemExit) as error:
        main(argv)
    assert message in capsys.readouterr().err + str(error.value)


def test_stream_cli_missing_file_and_classification_models(shared_data, tmp_path):
    with pytest.raises(SystemExit, match="streamgp stream: error:"):
        main(["stream", "--dataset", "protein", "--data-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="no classification variant"):
        main(["stream", "--dataset", "banana", "--models", "osgpr", "--data-dir", str(shared_data)])


def test_stream_cli_writes_outputs(shared_data, tmp_path, capsys):
    argv = f"stream --dataset skillcraft --data-dir {shared_data} --models wiski,exact"
    argv += " --max-stream 4 --num-evals 1 --pretrain-steps 3 --no-progress --out"
    main([*argv.split(), str(tmp_path)])
    for name in ("stream_skillcraft.csv", "stream_skillcraft_summary.csv", "stream_skillcraft.png"):
        assert (tmp_path / name).is_file()
    assert "test_nll_mean" in capsys.readouterr().out


class _Captured(Exception):
    pass


def test_stream_cli_uses_the_dataset_settings_unless_given(shared_data, monkeypatch):
    from streamgp.loops import stream

    calls = []

    def capture(*args, **kwargs):
        calls.append(kwargs)
        raise _Captured

    monkeypatch.setattr(stream, "run_stream_experiment", capture)
    base = ["stream", "--dataset", "elevators", "--data-dir", str(shared_data)]
    for extra in ([], ["--lr", "0.02", "--first-trial", "2"]):
        with pytest.raises(_Captured):
            main(base + extra)
    default, given = (call["config"] for call in calls)
    assert (default.pretrain_steps, default.lr, calls[0]["first_trial"]) == (1000, 1e-3, 0)
    assert (given.pretrain_steps, given.lr, calls[1]["first_trial"]) == (1000, 0.02, 2)


def test_softki_streams_on_all_inputs_and_tracks_the_exact_gp(tmp_path):
    split = _regression_split(400)
    config = StreamConfig(pretrain_steps=40, num_inducing=64, exact_max=100)
    finals = {}
    for model in ("softki", "exact"):
        loop = StreamingLoop(split, model, config=config, num_evals=1, max_stream=100)
        finals[model] = loop.run().dropna(subset=["test_rmse"]).iloc[-1]
    assert finals["softki"]["num_observations"] == split.num_pretrain + 100
    assert finals["softki"]["test_rmse"] < 1.5 * finals["exact"]["test_rmse"]
    kwargs = {"config": FAST, "batch_size": 4, "num_evals": 2, "max_stream": 16}
    full = StreamingLoop(split, "softki", **kwargs).run()
    StreamingLoop(split, "softki", **kwargs).run(2, checkpoint=tmp_path / "softki.pt")
    rest = StreamingLoop(split, "softki", **kwargs).load(tmp_path / "softki.pt").run()
    columns = ["num_observations", "test_rmse", "test_nll"]
    pd.testing.assert_frame_equal(rest[columns], full[columns])


# ---------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("model", list(STREAM_MODELS))
def test_every_model_resumes_from_a_tensor_only_checkpoint(model, tmp_path):
    # The learner's state is each model's own checkpoint (or the data and a state_dict),
    # the projection and the optimizer: read back with weights_only=True, the resumed
    # run is the uninterrupted one.
    split = _regression_split(200, d=4)  # d > 3: WISKI and exact-projected project
    options = {"svdgp": SMALL_SVDGP, "local": {"n_max": 16}}
    config = replace(FAST, pretrain_steps=5, model_options=options)
    kwargs = {"config": config, "num_evals": 2, "max_stream": 6, "batch_size": 2}
    full = StreamingLoop(split, model, **kwargs).run()
    StreamingLoop(split, model, **kwargs).run(1, checkpoint=tmp_path / "run.pt")
    payload = torch.load(tmp_path / "run.pt", weights_only=True)
    assert payload["state"]["learner"]["model"] == model
    rest = StreamingLoop(split, model, **kwargs).load(tmp_path / "run.pt").run()
    columns = ["num_observations", "test_rmse", "test_nll"]
    pd.testing.assert_frame_equal(rest[columns], full[columns])


def test_a_loop_checkpoint_that_is_not_tensors_and_plain_types_is_refused(tmp_path):
    split = _regression_split()
    loop = StreamingLoop(split, "wiski", config=FAST, num_evals=1, max_stream=2)
    loop.run(1, checkpoint=tmp_path / "run.pt")
    payload = torch.load(tmp_path / "run.pt", weights_only=True)
    payload["state"]["extra"] = pd.DataFrame({"a": [1]})  # a pickled object: code on unpickling
    torch.save(payload, tmp_path / "tampered.pt")
    with pytest.raises(ValueError, match="tampered.pt' cannot be read as a streamgp loop"):
        StreamingLoop(split, "wiski", config=FAST, num_evals=1, max_stream=2).load(
            tmp_path / "tampered.pt"
        )
    data = (tmp_path / "run.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated.pt' cannot be read"):
        StreamingLoop(split, "wiski", config=FAST, num_evals=1, max_stream=2).load(
            tmp_path / "truncated.pt"
        )
