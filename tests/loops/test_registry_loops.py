"""A model defined here, registered once, runs through every loop by its name."""

import pytest
import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import FantasizeMixin
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from gpytorch.models import ExactGP

from streamgp.cli import main
from streamgp.datasets import make_streaming_split, synthetic_regression
from streamgp.loops import AcquisitionOptions, ActiveLearningLoop, BayesOptLoop, make_test_function
from streamgp.loops.stream import StreamConfig, StreamingLoop
from streamgp.models.registry import ModelSpec, StreamRecipe, register_model, unregister_model

DT = torch.float64


class TinyGP(ExactGP, GPyTorchModel, FantasizeMixin):
    r"""The smallest BoTorch GP: a Matern-5/2 exact GP, no transforms."""

    _num_outputs = 1

    def __init__(
        self,
        train_X,
        train_Y,
        train_Yvar=None,
        likelihood=None,
        covar_module=None,
        *,
        mean_module=None,
        nu=2.5,
    ):
        super().__init__(train_X, train_Y.squeeze(-1), likelihood or GaussianLikelihood())
        self.mean_module = mean_module or ConstantMean()
        self.covar_module = covar_module or ScaleKernel(MaternKernel(nu=nu))
        self.to(train_X)

    def forward(self, X):
        return MultivariateNormal(self.mean_module(X), self.covar_module(X))


def _tiny_under_the_protocol(X, Y, Yvar, *, protocol, reuse, nu):
    # A rebuild on all data keeps the modules, so the protocol's Adam state carries over.
    if reuse is None:
        return TinyGP(X, Y, nu=nu)
    modules = {"likelihood": reuse.likelihood, "covar_module": reuse.covar_module}
    return TinyGP(X, Y, mean_module=reuse.mean_module, **modules)


@pytest.fixture
def tiny():
    recipe = StreamRecipe(_tiny_under_the_protocol, options={"nu": 2.5})
    register_model(ModelSpec("tiny", TinyGP, "a test's own GP", options={"nu": 2.5}, stream=recipe))
    yield "tiny"
    unregister_model("tiny")


TINY_ACQF = AcquisitionOptions(num_restarts=2, raw_samples=16, batch_limit=2, maxiter=5)


def test_a_registered_model_runs_bayesian_optimisation_and_resumes(tiny, tmp_path):
    def loop():
        return BayesOptLoop(
            make_test_function("levy", dim=2),
            model=tiny,
            q=2,
            num_init=4,
            fit_max_iter=5,
            acquisition_options=TINY_ACQF,
            model_options={"nu": 1.5},
        )

    full = loop().run(3)
    assert full["num_observations"].tolist() == [4, 6, 8, 10]
    interrupted = loop()
    interrupted.run(1, checkpoint=tmp_path / "bo.pt")
    resumed = loop().load(tmp_path / "bo.pt").run(3)
    assert torch.allclose(
        torch.tensor(resumed["best_value"].to_numpy()), torch.tensor(full["best_value"].to_numpy())
    )
    model = interrupted.surrogate.model
    assert isinstance(model, TinyGP) and model.covar_module.base_kernel.nu == 1.5


def test_a_registered_model_runs_active_learning(tiny):
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(60, 2, dtype=DT, generator=gen)
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    history = ActiveLearningLoop(
        X[:40], Y[:40], X[40:], Y[40:], model=tiny, q=2, num_init=5, num_mc_points=16
    ).run(2)
    assert history["num_observations"].tolist() == [5, 7, 9]
    assert history["test_rmse"].notna().all()
    # It declares no fixed-noise capability: known noise is refused, naming the model.
    with pytest.raises(ValueError, match="tiny: known observation noise"):
        ActiveLearningLoop(
            X[:40], Y[:40], X[40:], Y[40:], pool_Yvar=torch.full_like(Y[:40], 0.01), model=tiny
        ).run(0)


def test_the_cli_offers_registered_models(tiny, tmp_path, capsys):
    main(
        [
            "bo", "--models", tiny, "--steps", "1", "--dim", "2", "--num-init", "4",
            "--num-restarts", "2", "--raw-samples", "16", "--maxiter", "5",
            "--out", str(tmp_path), "--no-progress", "--no-plots",
        ]
    )  # fmt: skip
    assert "tiny" in capsys.readouterr().out


def test_unknown_model_options_are_refused_before_the_loop_starts(tiny):
    with pytest.raises(
        ValueError, match=r"model_options \['grid_size'\] are not options of 'tiny'"
    ):
        BayesOptLoop(make_test_function("levy", dim=2), model=tiny, model_options={"grid_size": 8})


def test_a_registered_model_runs_the_streaming_protocol_and_resumes(tiny, tmp_path):
    split = make_streaming_split(synthetic_regression(200, 2, seed=0), seed=0)
    config = StreamConfig(pretrain_steps=10, model_options={tiny: {"nu": 1.5}})

    def loop():
        return StreamingLoop(split, tiny, config=config, num_evals=2, max_stream=6)

    full = loop().run()
    assert full["num_observations"].iloc[-1] == split.num_pretrain + 6
    assert full["test_rmse"].dropna().iloc[-1] < 0.8  # it learned the function
    loop().run(2, checkpoint=tmp_path / "stream.pt")
    rest = loop().load(tmp_path / "stream.pt").run()
    columns = ["num_observations", "test_rmse", "test_nll"]
    assert rest[columns].equals(full[columns])
    # The options reached the model; its protocol options are checked by name.
    assert loop().learner is None
    with pytest.raises(ValueError, match="not protocol options of 'tiny'"):
        StreamConfig(model_options={tiny: {"grid_size": 8}})


def test_the_loops_reach_models_only_through_the_registry_and_their_public_api():
    # Layering: nothing under streamgp/loops imports the models' internals.
    import ast
    from pathlib import Path

    import streamgp.loops

    forbidden = ("streamgp.inducing", "streamgp.linalg", "streamgp.models.utils")
    offenders = []
    for path in Path(streamgp.loops.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(forbidden)]
    assert offenders == []
