r"""How many L-BFGS-B iterations ``fit_gpytorch_mll`` should spend on a ``SoftKIGP``.

A BoTorch user who swaps ``SingleTaskGP`` for ``SoftKIGP`` fits it with
``fit_gpytorch_mll``: L-BFGS-B on the exact SoftKI marginal likelihood over every
hyperparameter, the ``m x d`` interpolation points included. With few observations
(``m = min(512, n)`` points by default, so as many points as data) that likelihood keeps
improving by overfitting, and L-BFGS-B ran to its limit of about 15,000 iterations.

This runs one unbounded fit per case and snapshots the model at ``--marks`` iterations;
for each snapshot it reports the marginal likelihood per datum (as the fit sees it), the
learned noise, and the test RMSE and mean negative log predictive density at ``--test``
points, so the iteration at which the predictions stop improving can be read off.

Cases (``--cases``, ``n:m``, ``m = 0`` for the default): noisy ``sum_i sin(5 x_i)`` on
``[0, 1]^3`` (noise sd 0.05), ``Normalize`` and ``Standardize``.

Writes ``benchmarks/results/softki_fit_budget.{csv,json}``.

Usage: ``python benchmarks/softki_fit_budget.py [--cases 12:0,50:0,200:0] [--seeds 0,1]``
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.models.transforms import Normalize, Standardize
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.models import SoftKIGP
from streamgp.utils.machine import machine_info

DIM, NOISE_SD = 3, 0.05


def objective(X):
    return torch.sin(5 * X).sum(-1, keepdim=True)


def run_case(n: int, m: int, seed: int, marks: list[int], num_test: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(n + num_test, DIM, generator=generator, dtype=torch.float64)
    noise = NOISE_SD * torch.randn(len(X), 1, generator=generator, dtype=torch.float64)
    Y = objective(X) + noise
    X_test, Y_test = X[n:], objective(X[n:])
    model = SoftKIGP(
        X[:n],
        Y[:n],
        num_inducing=None if m == 0 else m,
        input_transform=Normalize(DIM),
        outcome_transform=Standardize(1),
        seed=seed,
    )
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    snapshots: dict[int, tuple[dict, float, float]] = {}
    start = time.perf_counter()

    def callback(parameters, result):
        if result.step in marks:
            state = copy.deepcopy(model.state_dict())
            snapshots[result.step] = (state, -result.fval, time.perf_counter() - start)

    result = fit_gpytorch_mll_scipy(mll, callback=callback)
    snapshots[result.step] = (copy.deepcopy(model.state_dict()), -result.fval, 0.0)
    snapshots[result.step] = (*snapshots[result.step][:2], time.perf_counter() - start)
    rows = []
    for step, (state, mll_value, seconds) in sorted(snapshots.items()):
        model.load_state_dict(state)
        model.eval()
        with torch.no_grad():
            posterior = model.posterior(X_test, observation_noise=True)
            mean, variance = posterior.mean, posterior.variance
        nlpd = 0.5 * (math.log(2 * math.pi) + variance.log() + (Y_test - mean) ** 2 / variance)
        rows.append(
            {
                "n": n,
                "num_inducing": len(model.inducing_points),
                "seed": seed,
                "iteration": step,
                "final": step == result.step,
                "seconds": seconds,
                "mll_per_datum": mll_value,
                "noise": model.likelihood.noise.item(),
                "test_rmse": (mean - Y_test).pow(2).mean().sqrt().item(),
                "test_nlpd": nlpd.mean().item(),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="12:0,50:0,200:0", help="n:m pairs (m = 0: default)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--marks", default="50,100,200,300,500,1000,2000,5000,10000")
    parser.add_argument("--test", type=int, default=1000, help="test points")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    marks = [int(v) for v in args.marks.split(",")]
    rows = []
    for case in args.cases.split(","):
        n, m = (int(v) for v in case.split(":"))
        for seed in (int(s) for s in args.seeds.split(",")):
            rows += run_case(n, m, seed, marks, args.test)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "softki_fit_budget.csv", index=False)
    (args.out / "softki_fit_budget.json").write_text(
        json.dumps(
            {
                "machine": machine_info("cpu", dtype="float64"),
                "settings": vars(args) | {"out": str(args.out)},
                "rows": rows,
            },
            indent=2,
        )
    )
    print(frame.to_string())


if __name__ == "__main__":
    main()
