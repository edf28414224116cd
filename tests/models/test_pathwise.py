"""BoTorch's pathwise (Matheron) sample paths (``streamgp.models.pathwise``).

From 4-D on ``WiskiGP`` evaluates its kernel exactly, so BoTorch's exact-GP path sampler
applies to it: with the same hyperparameters and random draws its paths are
``SingleTaskGP``'s. Models that interpolate or approximate their kernel are refused
with an error naming joint posterior samples.
"""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms import Normalize
from botorch.optim import optimize_acqf
from botorch.sampling.pathwise import draw_matheron_paths, get_matheron_path_model

from streamgp.models import (
    DecoupledSVGP,
    KissGP,
    LocalGP,
    OnlineSGPR,
    OnlineSoftKIGP,
    OnlineSVGP,
    SoftKIGP,
    WiskiGP,
)

DT = torch.float64


def _data(n: int = 30, d: int = 5):
    generator = torch.Generator().manual_seed(0)
    X = 3 * torch.rand(n, d, dtype=DT, generator=generator)
    return X, 3 * X.sin().sum(-1, keepdim=True) + 10


@pytest.mark.parametrize("known_noise", [False, True])
def test_paths_equal_single_task_gp_paths_from_4d_on(known_noise):
    X, Y = _data()
    Yvar = torch.full_like(Y, 0.01) if known_noise else None
    exact = SingleTaskGP(X, Y, Yvar, input_transform=Normalize(5))
    wiski = WiskiGP(X, Y, Yvar, input_transform=Normalize(5))
    wiski.load_state_dict(exact.state_dict(), strict=False)
    exact.eval(), wiski.eval()
    assert wiski.evaluates_kernel_exactly
    X_test = torch.rand(7, 5, dtype=DT)
    torch.manual_seed(1)
    expected = draw_matheron_paths(exact, torch.Size([4]))(X_test)
    torch.manual_seed(1)
    got = draw_matheron_paths(wiski, torch.Size([4]))(X_test)
    assert got.shape == (4, 7)
    assert torch.allclose(got, expected, atol=1e-10)
    # ... and, after observing more data, the paths follow the new posterior.
    wiski.observe(X[:3] + 0.1, Y[:3], None if Yvar is None else Yvar[:3])
    (train_X,) = wiski.train_inputs
    assert train_X.shape[0] == 33
    torch.manual_seed(1)
    mean = draw_matheron_paths(wiski, torch.Size([512]))(X_test).mean(0)
    posterior_mean = wiski.posterior(X_test).mean.squeeze(-1).detach()
    assert (mean - posterior_mean).abs().max() < 0.3  # a Monte Carlo check, 512 paths


def test_pathwise_thompson_sampling_through_optimize_acqf():
    X, Y = _data(d=4, n=20)
    model = ModelListGP(WiskiGP(X, Y), WiskiGP(X, -Y)).eval()
    path_model = get_matheron_path_model(model.models[0])
    assert path_model(torch.rand(3, 4, dtype=DT)).shape == (3, 1)
    acquisition = PathwiseThompsonSampling(model.models[0])
    bounds = torch.stack([torch.zeros(4), 3 * torch.ones(4)]).to(DT)
    candidate, _ = optimize_acqf(acquisition, bounds, q=1, num_restarts=2, raw_samples=16)
    assert candidate.shape == (1, 4) and candidate.isfinite().all()
    assert len(draw_matheron_paths(model, torch.Size([2])).paths) == 2


@pytest.mark.parametrize(
    "build",
    [
        lambda X, Y: WiskiGP(X[:, :2], Y),  # SKI on a grid in 2-D
        lambda X, Y: KissGP(X[:, :2], Y),
        lambda X, Y: OnlineSGPR(X, Y),
        lambda X, Y: OnlineSVGP(X, Y, num_init_steps=0),
        lambda X, Y: LocalGP(X, Y),
        lambda X, Y: OnlineSoftKIGP(X, Y, pretrain_epochs=0),
        lambda X, Y: DecoupledSVGP(X, Y, num_init_steps=0),
        lambda X, Y: SoftKIGP(X, Y),
    ],
    ids=[
        "WiskiGP-grid",
        "KissGP",
        "OnlineSGPR",
        "OnlineSVGP",
        "LocalGP",
        "OnlineSoftKIGP",
        "DecoupledSVGP",
        "SoftKIGP",
    ],
)
def test_models_without_the_exact_kernel_are_refused_naming_joint_samples(build):
    X, Y = _data()
    model = build(X, Y).eval()
    with pytest.raises(NotImplementedError, match="exact-kernel model.*MaxPosteriorSampling"):
        draw_matheron_paths(model, torch.Size([2]))
