r"""Hyperparameter fitting and streaming on large grids (m = 16^3 ... 32^3), cost flat in n.

For each grid size and n: one ``WiskiGP`` (d = 3, ``ScaleKernel(RBF)`` with BoTorch's
priors) on noisy ``sin`` data, then

- the time of one marginal-likelihood value + gradient (``WoodburyMarginalLogLikelihood``;
  grids above ``MAX_DENSE_GRID`` = 4096 points use the structured likelihood: block-Lanczos
  Nystrom log-determinant within ``love_tolerance``, CG for the quadratic term);
- ``fit_gpytorch_mll`` with ``--maxiter`` L-BFGS-B iterations (time and evaluations);
- the first posterior after the fit (the LOVE root's build on large grids) and the mean
  time of ``observe`` (q = 3) + posterior mean and variance at 16 points over ``--steps``
  streamed batches.

One torch thread by default. Results go to ``<out>/large_grid_fit.{json,csv}``.

Usage: ``python benchmarks/large_grid_fit.py [--grids 16,20,32] [--n 10000,100000]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.kernels import ScaleKernel
from gpytorch.means import ZeroMean

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood
from streamgp.utils.machine import machine_info

D, Q, T = 3, 3, 16


def data(n: int, tkwargs: dict):
    X = torch.rand(n, D, **tkwargs)
    return X, torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, **tkwargs)


def run(grid: int, n: int, args: argparse.Namespace, tkwargs: dict) -> dict:
    X, Y = data(n, tkwargs)
    covar = ScaleKernel(get_covar_module_with_dim_scaled_prior(ard_num_dims=D))
    start = time.perf_counter()
    model = WiskiGP(
        X,
        Y,
        grid_size=grid,
        covar_module=covar.to(**tkwargs),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    build_s = time.perf_counter() - start
    model.love_tolerance = args.tolerance
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    start = time.perf_counter()
    loss = -mll()
    torch.autograd.grad(loss, params)
    value_grad_s = time.perf_counter() - start
    evaluations = []
    start = time.perf_counter()
    fit_gpytorch_mll(
        mll,
        optimizer_kwargs={
            "options": {"maxiter": args.maxiter},
            "callback": lambda *a: evaluations.append(1),
        },
    )
    fit_s = time.perf_counter() - start
    model.eval()
    Xs = torch.rand(T, D, **tkwargs)
    with torch.no_grad():
        start = time.perf_counter()
        post = model.posterior(Xs)
        post.mean, post.variance  # noqa: B018
        first_posterior_s = time.perf_counter() - start
        steps = []
        for _ in range(args.steps):
            Xq, Yq = data(Q, tkwargs)
            start = time.perf_counter()
            model.observe(Xq, Yq)
            post = model.posterior(Xs)
            post.mean, post.variance  # noqa: B018
            steps.append(time.perf_counter() - start)
    return {
        "grid": grid,
        "m": grid**D,
        "n": n,
        "structured": model.structured,
        "build_s": build_s,
        "mll_value_grad_s": value_grad_s,
        "fit_s": fit_s,
        "fit_evaluations": len(evaluations),
        "first_posterior_s": first_posterior_s,
        "observe_predict_ms": 1e3 * sum(steps[1:]) / max(len(steps) - 1, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", default="16,20,32")
    parser.add_argument("--n", default="10000,100000")
    parser.add_argument("--maxiter", type=int, default=5)
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="love_tolerance")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tkwargs = {"dtype": getattr(torch, args.dtype), "device": torch.device(args.device)}
    rows = []
    for grid in (int(g) for g in args.grids.split(",")):
        for n in (int(v) for v in args.n.split(",")):
            row = run(grid, n, args, tkwargs)
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "large_grid_fit" + ("" if args.device == "cpu" else f"_{args.device}_{args.dtype}")
    pd.DataFrame(rows).to_csv(args.out / f"{stem}.csv", index=False)
    settings = {k: str(v) for k, v in vars(args).items()}
    (args.out / f"{stem}.json").write_text(
        json.dumps(
            {"machine": machine_info(args.device), "settings": settings, "rows": rows}, indent=2
        )
    )


if __name__ == "__main__":
    main()
