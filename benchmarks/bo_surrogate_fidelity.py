r"""How well each BO surrogate models the six-function benchmark's data, BO trajectories aside.

BO outcomes after a few hundred steps vary a lot from seed to seed (a surrogate that is
equally good can land in another basin), so a gap between two models in
``bo_functions.py`` may be the model or the trajectory. This script removes the
trajectory: every model sees the same data, ``n`` uniformly random points of the
noisy function in the unit cube (the loops' domain), absorbed the way the BO loop
absorbs them (built on the first ``--num-init`` points, the rest through the
surrogate's ``update``, then one ``fit``), and is scored on 4,096 fresh points against
the noiseless function:

- ``rmse``: root mean squared error of the posterior mean, divided by the function's
  standard deviation over the test points (1 = no better than a constant);
- ``nll``: mean negative log predictive density of noisy test targets;
- ``argmax_regret``: true optimum over the test points minus the true value at the
  test point where the posterior mean is largest (what a pure exploiter would pick).

Models: the exact ``SingleTaskGP`` and WISKI on each ``--grid-sizes`` grid, with the
initial design's standardisation frozen (``wiski_g<g>``, the default) and re-estimated
from all data before the fit (``wiski_g<g>_restd``, ``restandardize=True``).

Writes ``results/bo_surrogate_fidelity.csv`` (one row per function, n, seed and model)
and ``.json`` (means and sds over seeds, settings, machine). Rows already in the CSV
are kept and not recomputed, so a run can be extended (more seeds, functions, grids).

Usage: ``python benchmarks/bo_surrogate_fidelity.py [--n 455,905] [--seeds 0,1,2]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.utils.transforms import unnormalize

from streamgp.loops.bo import PAPER_FUNCTIONS, make_test_function
from streamgp.loops.stream import regression_metrics
from streamgp.loops.surrogates import make_surrogate
from streamgp.utils.machine import machine_info

DIM = 3
NUM_TEST = 4096


def _models(grid_sizes: list[int]) -> dict[str, tuple[str, dict]]:
    models = {"exact": ("exact", {})}
    for grid in grid_sizes:
        models[f"wiski_g{grid}"] = ("wiski", {"grid_size": grid})
        models[f"wiski_g{grid}_restd"] = ("wiski", {"grid_size": grid, "restandardize": True})
    return models


def _score(model, X: torch.Tensor, f: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        posterior = model.posterior(X, observation_noise=True)
        mean, var = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    against_f, against_y = regression_metrics(mean, var, f), regression_metrics(mean, var, y)
    return {
        "rmse": against_f["test_rmse"] / f.std().item(),
        "nll": against_y["test_nll"],
        "argmax_regret": (f.max() - f[mean.argmax()]).item(),
    }


def run(
    function: str, n: int, seed: int, models: dict, num_init: int, done: set[tuple]
) -> list[dict]:
    objective = make_test_function(function, dim=DIM)
    bounds = objective.bounds.to(torch.float64)
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n + NUM_TEST, DIM, dtype=torch.float64, generator=gen)
    f = objective.evaluate_true(unnormalize(X, bounds))
    y = f + objective.noise_std * torch.randn(len(f), dtype=torch.float64, generator=gen)
    test = slice(n, None)
    X0, Y0 = X[:num_init], y[:num_init, None]
    rows = []
    for label, (name, options) in models.items():
        if (function, n, seed, label) in done:
            continue
        torch.manual_seed(seed)
        start = time.perf_counter()
        surrogate = make_surrogate(name, X0, Y0, **options)
        surrogate.update(X[num_init:n], y[num_init:n, None])
        surrogate.fit()
        elapsed = time.perf_counter() - start
        scores = _score(surrogate.model, X[test], f[test], y[test])
        rows.append(
            {"function": function, "n": n, "seed": seed, "model": label}
            | scores
            | {"time (s)": elapsed}
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default=",".join(PAPER_FUNCTIONS))
    parser.add_argument("--n", default="455,905", help="observations (BO after 150, 300 steps)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--grid-sizes", default="10,16")
    parser.add_argument("--num-init", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    functions = [name for name in args.functions.split(",") if name]
    for name in functions:  # an unknown name fails here, before any run, naming the choices
        make_test_function(name, dim=DIM)
    models = _models([int(g) for g in args.grid_sizes.split(",")])
    path = args.out / "bo_surrogate_fidelity.csv"
    previous = pd.read_csv(path) if path.exists() else pd.DataFrame()
    keys = ["function", "n", "seed", "model"]
    done = set(previous[keys].itertuples(index=False, name=None)) if len(previous) else set()
    rows = [
        row
        for function in functions
        for n in (int(v) for v in args.n.split(","))
        for seed in (int(v) for v in args.seeds.split(","))
        for row in run(function, n, seed, models, args.num_init, done)
    ]
    frame = pd.concat([previous, pd.DataFrame(rows)], ignore_index=True)
    metrics = ["rmse", "nll", "argmax_regret", "time (s)"]
    summary = frame.groupby(["function", "n", "model"], sort=False)[metrics].agg(["mean", "std"])
    summary.columns = [f"{metric} {stat}" for metric, stat in summary.columns]
    summary = summary.reset_index()
    payload = {
        "protocol": "same uniform data for every model; scored on 4,096 fresh points",
        "settings": vars(args) | {"out": str(args.out)},
        "machine": machine_info("cpu"),
        "results": summary.to_dict(orient="records"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    (args.out / "bo_surrogate_fidelity.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(summary.to_string(index=False, float_format="%.4g"))


if __name__ == "__main__":
    main()
