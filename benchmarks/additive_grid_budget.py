r"""What the additive model's grid budget at d > 10 costs and saves (``ADDITIVE_GRID_POINTS``).

``AdditiveWiskiGP``'s default singleton axes have 64 grid points up to ``d = 10`` and share
640 points beyond (32 per axis at ``d = 20``). This measures the two choices at ``d = 20``
on the BO table's StyblinskiTang-20 (``benchmarks/bo_high_dim.py``: noise sd 20, negated),
with ``SingleTaskGP`` as the reference, all with ``Normalize(d)`` without bounds and the
default ``Standardize``:

- ``fit``: ``fit_gpytorch_mll`` from the default start on ``n`` uniform noisy points:
  marginal-likelihood evaluations, seconds, milliseconds per evaluation, the learned noise
  (standardised) and the test RMSE of the posterior mean against the noiseless function at
  ``--test`` uniform points;
- ``refit``: a model on the same points plus ``--extra`` more, started from the fitted
  hyperparameters (``load_state_dict``, as a BO loop's warm-started refit), refitted.

And, for the grid's accuracy alone: the largest error of the cubic-interpolated 1-D RBF
kernel ``W K_UU W^T`` against the exact one at 400 uniform points of ``[0, 1]``, on the
default box (the data's plus a margin) with 24-64 points, for lengthscales 0.05-0.2.

Writes ``benchmarks/results/additive_grid_budget.{csv,json}``.

Usage: ``python benchmarks/additive_grid_budget.py [--n 600] [--seeds 0,1] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize
from botorch.test_functions import StyblinskiTang
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp import AdditiveWiskiGP
from streamgp.interpolation.grid import CubicGridInterpolation, data_grid_bounds
from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.utils.machine import machine_info

DIM = 20
MODELS = {
    "exact": lambda X, Y: SingleTaskGP(X, Y, input_transform=Normalize(DIM)),
    "additive, 64 per axis (m = 1,280)": lambda X, Y: AdditiveWiskiGP(
        X, Y, input_transform=Normalize(DIM), grid_size=64
    ),
    "additive, default: 32 per axis (m = 640)": lambda X, Y: AdditiveWiskiGP(
        X, Y, input_transform=Normalize(DIM)
    ),
}


def counted_fit(model) -> tuple[int, float]:
    r"""(marginal-likelihood evaluations, seconds) of one ``fit_gpytorch_mll``."""
    if isinstance(model, SingleTaskGP):
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
    else:
        mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    forward, count = mll.forward, [0]

    def counting_forward(*args, **kwargs):
        count[0] += 1
        return forward(*args, **kwargs)

    mll.forward = counting_forward
    start = time.perf_counter()
    fit_gpytorch_mll(mll)
    return count[0], time.perf_counter() - start


def styblinskitang_data(num_train: int, num_test: int, seed: int):
    r"""``num_train`` uniform noisy points of the BO table's StyblinskiTang-20 (noise sd 20,
    negated), and ``num_test`` uniform test points with their noiseless values."""
    function = StyblinskiTang(dim=DIM, noise_std=20.0, negate=True)
    bounds = function.bounds.to(torch.float64)
    generator = torch.Generator().manual_seed(seed)

    def uniform(count):
        unit = torch.rand(count, DIM, generator=generator, dtype=torch.float64)
        return bounds[0] + (bounds[1] - bounds[0]) * unit

    X = uniform(num_train)
    torch.manual_seed(seed)
    Y = function(X).unsqueeze(-1)
    X_test = uniform(num_test)
    return X, Y, X_test, -function.evaluate_true(X_test)  # evaluate_true does not negate


def fit_rows(n: int, extra: int, num_test: int, seed: int) -> list[dict]:
    X, Y, X_test, Y_test = styblinskitang_data(n + extra, num_test, seed)
    rows = []
    for name, make in MODELS.items():
        model = make(X[:n], Y[:n])
        evaluations, seconds = counted_fit(model)
        with torch.no_grad():
            mean = model.posterior(X_test).mean.squeeze(-1)
        rmse = (mean - Y_test).pow(2).mean().sqrt().item()
        warm = make(X, Y)
        warm.load_state_dict(model.state_dict())
        refit_evaluations, refit_seconds = counted_fit(warm)
        row = {
            "seed": seed,
            "model": name,
            "n": n,
            "grid_points": getattr(getattr(model, "interpolation", None), "num_grid", None),
            "fit_evaluations": evaluations,
            "fit_s": seconds,
            "ms_per_evaluation": 1e3 * seconds / evaluations,
            "noise": model.likelihood.noise.mean().item(),
            "test_rmse": rmse,
            "refit_evaluations": refit_evaluations,
            "refit_s": refit_seconds,
        }
        print(row, flush=True)
        rows.append(row)
    return rows


def kernel_error_rows() -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(400, 1, generator=generator, dtype=torch.float64)
    bounds = data_grid_bounds(X, True)
    rows = []
    for size in (24, 32, 40, 48, 64):
        interpolation = CubicGridInterpolation(bounds, size)
        weights = interpolation.weights(X)
        W = torch.zeros(len(X), interpolation.num_grid, dtype=torch.float64)
        W.scatter_add_(1, weights.indices, weights.values)
        U = interpolation.grid_points()
        for lengthscale in (0.05, 0.1, 0.15, 0.2):

            def rbf(a, b, lengthscale=lengthscale):
                return torch.exp(-0.5 * torch.cdist(a, b).pow(2) / lengthscale**2)

            error = (W @ rbf(U, U) @ W.T - rbf(X, X)).abs().max().item()
            rows.append({"grid_points": size, "lengthscale": lengthscale, "max_error": error})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=600, help="training points")
    parser.add_argument("--extra", type=int, default=15, help="points added before the refit")
    parser.add_argument("--test", type=int, default=500, help="test points")
    parser.add_argument("--seeds", default="0,1", help="draws, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = pd.DataFrame(kernel_error_rows())
    print(kernel.pivot(index="grid_points", columns="lengthscale", values="max_error"))
    fits = pd.DataFrame(
        [
            row
            for seed in (int(s) for s in args.seeds.split(","))
            for row in fit_rows(args.n, args.extra, args.test, seed)
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    fits.to_csv(args.out / "additive_grid_budget.csv", index=False)
    (args.out / "additive_grid_budget.json").write_text(
        json.dumps(
            {
                "machine": machine_info("cpu", dtype="float64"),
                "settings": vars(args) | {"out": str(args.out)},
                "fits": fits.to_dict("records"),
                "kernel_error": kernel.to_dict("records"),
            },
            indent=2,
        )
    )
    print(fits.to_string())


if __name__ == "__main__":
    main()
