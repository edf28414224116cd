r"""Cost of fitting hyperparameters as n grows: WISKI against BoTorch's exact GP.

For each n: the time of one marginal-likelihood value + gradient (median of repeats)
and of one full ``fit_gpytorch_mll`` (L-BFGS-B, ``maxiter`` iterations), for

- ``WiskiGP`` (d = 3, 10^3 = 1000-point grid, ``ScaleKernel(RBF)``): in data space
  (``n x n``) while n <= m = 1000, in grid space (``O(m^3)``) beyond;
- ``SingleTaskGP`` (exact, same kernel family, BoTorch's defaults) for n <= 4000.

One thread for torch and for SciPy's OpenBLAS (the grid space's LAPACK calls). Results go
to ``benchmarks/results/fit_cost.{json,csv}``.

Usage: ``python benchmarks/fit_cost.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.kernels import ScaleKernel
from gpytorch.means import ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from threadpoolctl import threadpool_limits

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood
from streamgp.utils.machine import machine_info

D, GRID = 3, 10
FULL_N = [10, 30, 100, 300, 1000, 3000, 10_000, 100_000]
QUICK_N = [10, 30, 100, 300, 1000]
EXACT_MAX_N = 4000
#: The exact GP's full fit is timed up to this n: beyond gpytorch's max_cholesky_size (800)
#: its likelihood switches to CG/Lanczos, and one fit at n = 3000 did not finish in 25 min.
EXACT_FIT_MAX_N = 1000


def data(n: int):
    X = torch.rand(n, D, dtype=torch.float64)
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=torch.float64)
    return X, Y


def build(kind: str, X, Y):
    covar = ScaleKernel(get_covar_module_with_dim_scaled_prior(ard_num_dims=D))
    if kind == "wiski":
        model = WiskiGP(
            X, Y, grid_size=GRID, covar_module=covar, outcome_transform=None, mean_module=ZeroMean()
        )
        return model, WoodburyMarginalLogLikelihood(model.likelihood, model)
    model = SingleTaskGP(X, Y, covar_module=covar)
    return model, ExactMarginalLogLikelihood(model.likelihood, model)


def value_and_grad_seconds(model, mll, repeats: int) -> float:
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    times = []
    for _ in range(repeats + 1):  # the first call is a warm-up
        start = time.perf_counter()
        if isinstance(mll, WoodburyMarginalLogLikelihood):
            loss = -mll()
        else:
            X = model.train_inputs[0]
            loss = -mll(model(X), model.train_targets)
        torch.autograd.grad(loss, params)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def fit_seconds(mll, maxiter: int) -> tuple[float, int]:
    evaluations = []
    start = time.perf_counter()
    fit_gpytorch_mll(
        mll,
        optimizer_kwargs={
            "options": {"maxiter": maxiter},
            "callback": lambda *a: evaluations.append(1),
        },
    )
    return time.perf_counter() - start, len(evaluations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n <= 1000 only")
    parser.add_argument("--maxiter", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    threadpool_limits(1)  # SciPy's BLAS (loaded by now) has its own pool
    torch.manual_seed(0)
    rows = []
    for n in QUICK_N if args.quick else FULL_N:
        X, Y = data(n)
        for kind in ("wiski", "exact"):
            if kind == "exact" and n > EXACT_MAX_N:
                continue
            model, mll = build(kind, X, Y)
            value_grad = value_and_grad_seconds(model, mll, args.repeats)
            fit, steps = float("nan"), 0
            if kind == "wiski" or n <= EXACT_FIT_MAX_N:
                model, mll = build(kind, X, Y)
                fit, steps = fit_seconds(mll, args.maxiter)
            space = ("data" if model.in_data_space else "grid") if kind == "wiski" else "-"
            row = {
                "model": kind,
                "n": n,
                "space": space,
                "value_grad_ms": 1e3 * value_grad,
                "fit_s": fit,
                "fit_iterations": steps,
            }
            rows.append(row)
            print(row, flush=True)
            write(rows, args)  # after every row: a long run leaves what it measured
    print(pd.DataFrame(rows).pivot(index="n", columns="model", values="value_grad_ms").to_string())


def write(rows: list[dict], args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / "fit_cost.csv", index=False)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    payload = {"machine": machine_info(), "settings": settings, "rows": rows}
    (args.out / "fit_cost.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
