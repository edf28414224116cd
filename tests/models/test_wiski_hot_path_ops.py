"""How many operations WISKI's hot paths run (the setting of ``benchmarks/hot_path_ops.py``).

On a GPU a small update is bound by kernel launches, so the number of top-level aten
operations a step runs on the CPU (what ``torch.profiler`` records; a proxy for the
launches) is held under the budget of issue 36, in the default mode (value checks on):
50 for a posterior mean and variance, 100 for ``condition_on_observations`` and a
prediction, 120 for ``observe`` and a prediction. The counts are of one call after a
warm-up call, as the benchmark's.
"""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import RBFKernel
from gpytorch.means import ZeroMean
from torch.profiler import ProfilerActivity, profile

from streamgp import WiskiGP

BUDGET = {"posterior": 50, "condition + predict": 100, "observe + predict": 120}


def top_level_aten_ops(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::")
        and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))
    )


def data(n: int, generator: torch.Generator):
    X = torch.rand(n, 3, generator=generator, dtype=torch.float64)
    noise = torch.randn(n, 1, generator=generator, dtype=torch.float64)
    return X, torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * noise


def predict(model, X):
    posterior = model.posterior(X)
    return posterior.mean, posterior.variance


STEPS = {
    "posterior": lambda model, i: predict(model, i["X_test"]),
    "condition + predict": lambda model, i: predict(
        model.condition_on_observations(i["X_q"], i["Y_q"]), i["X_test"]
    ),
    "observe + predict": lambda model, i: predict(model.observe(i["X_q"], i["Y_q"]), i["X_test"]),
}


@pytest.fixture(scope="module")
def model():
    generator = torch.Generator().manual_seed(0)
    X, Y = data(1000, generator)
    model = WiskiGP(
        X,
        Y,
        grid_size=10,
        covar_module=RBFKernel(ard_num_dims=3),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 0.01
    model.eval()
    return model


@pytest.mark.parametrize("step", list(STEPS))
def test_hot_paths_stay_within_their_operation_budget(model, step):
    generator = torch.Generator().manual_seed(1)
    inputs = [dict(zip(("X_q", "Y_q"), data(3, generator), strict=True)) for _ in range(2)]
    for i in inputs:
        i["X_test"] = torch.rand(16, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        expected = STEPS[step](model, inputs[0])  # warm-up: caches built
        count = top_level_aten_ops(lambda: STEPS[step](model, inputs[1]))
    assert all(torch.isfinite(t).all() for t in expected)
    assert count <= BUDGET[step], f"{step}: {count} operations"
