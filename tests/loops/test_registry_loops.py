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
from streamgp.loops import AcquisitionOptions, ActiveLearningLoop, BayesOptLoop, make_test_function
from streamgp.models.registry import ModelSpec, register_model, unregister_model

DT = torch.float64


class TinyGP(ExactGP, GPyTorchModel, FantasizeMixin):
    r"""The smallest BoTorch GP: a Matern-5/2 exact GP, no transforms."""

    _num_outputs = 1

    def __init__(self, train_X, train_Y, train_Yvar=None, *, covar_module=None, nu=2.5):
        super().__init__(train_X, train_Y.squeeze(-1), GaussianLikelihood())
        self.mean_module = ConstantMean()
        self.covar_module = covar_module or ScaleKernel(MaternKernel(nu=nu))
        self.to(train_X)

    def forward(self, X):
        return MultivariateNormal(self.mean_module(X), self.covar_module(X))


@pytest.fixture
def tiny():
    register_model(ModelSpec("tiny", TinyGP, "a test's own GP", options={"nu": 2.5}))
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
