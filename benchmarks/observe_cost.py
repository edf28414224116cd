r"""In-place ``observe`` against ``condition_on_observations`` and against a rebuild.

For a ``WiskiGP`` (d = 3, 10^3 grid, RBF, fixed hyperparameters) holding n points, one
streamed step is "absorb q points, then predict mean and variance at 16 points":

- ``observe``: the in-place update, timed over a stream of ``steps`` consecutive calls
  on one model (so deferred folds, see ``WiskiGP.FOLD_RANK``, are paid inside the mean);
- ``condition``: ``condition_on_observations`` (a new model sharing the root);
- ``rebuild``: a new model from all the data the streamed model holds plus the batch (what
  a refactorisation costs at that n, in whichever space the rebuilt model is).

n = 300 is in data space (n <= m = 1000), n = 3000 in grid space. One torch thread.
Results: ``benchmarks/results/observe_cost.{json,csv}``.

Usage: ``python benchmarks/observe_cost.py [--steps 30]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel
from gpytorch.means import ZeroMean

from streamgp import WiskiGP
from streamgp.utils.machine import machine_info

D, GRID, T = 3, 10, 16


def data(n: int):
    X = torch.rand(n, D, dtype=torch.float64)
    return X, torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=torch.float64)


def build(X, Y) -> WiskiGP:
    model = WiskiGP(
        X,
        Y,
        grid_size=GRID,
        covar_module=RBFKernel(ard_num_dims=D),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 0.01
    return model


def predict(model: WiskiGP, Xs) -> None:
    post = model.posterior(Xs)
    post.mean, post.variance  # noqa: B018 (force evaluation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="streamed steps per setting")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    Xs = torch.rand(T, D, dtype=torch.float64)
    rows = []
    for n in (300, 3000):
        for q in (3, 30, 300, 3000):
            steps = max(3, args.steps if q <= 30 else args.steps // 10)
            X, Y = data(n)
            model = build(X, Y)
            predict(model, Xs)
            space = "data" if model.in_data_space else "grid"
            times = {"observe": [], "condition": [], "rebuild": []}
            for _ in range(steps):
                Xq, Yq = data(q)
                X, Y = torch.cat([X, Xq]), torch.cat([Y, Yq])  # all the model has seen
                start = time.perf_counter()
                predict(model.condition_on_observations(Xq, Yq), Xs)
                times["condition"].append(time.perf_counter() - start)
                start = time.perf_counter()
                model.observe(Xq, Yq)
                predict(model, Xs)
                times["observe"].append(time.perf_counter() - start)
            for _ in range(3):
                Xq, Yq = data(q)
                start = time.perf_counter()
                # A new model on everything the streamed one holds plus the batch.
                rebuilt = build(torch.cat([X, Xq]), torch.cat([Y, Yq]))
                predict(rebuilt, Xs)
                times["rebuild"].append(time.perf_counter() - start)
            row = {"n": n, "q": q, "space": space, "steps": steps}
            row |= {f"{k}_ms_mean": 1e3 * statistics.mean(v) for k, v in times.items()}
            row |= {f"{k}_ms_median": 1e3 * statistics.median(v) for k, v in times.items()}
            row["observe_over_condition"] = row["observe_ms_mean"] / row["condition_ms_mean"]
            rows.append(row)
            print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / "observe_cost.csv", index=False)
    payload = {"machine": machine_info(), "steps": args.steps, "rows": rows}
    (args.out / "observe_cost.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
