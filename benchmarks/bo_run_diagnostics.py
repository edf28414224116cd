r"""Where each BO run of ``bo_functions.py`` queried, and what its surrogate learned.

For every run checkpoint under ``<runs>/<function>_<label>/checkpoints/`` this reads the
final surrogate and writes one row: best true value, the fitted lengthscales (of the
unit cube) and, per input dimension, the fraction of observations on the domain's
boundary (within ``--tol`` of 0 or 1). A dimension whose lengthscale the fit has made
long looks flat to the surrogate, and qUCB then sends that coordinate to a corner of
the box, where its variance is largest; on a function that is symmetric about the
centre (Rastrigin, Ackley) both faces give the same values, so the data never show
the dimension's effect and the run stays there. The boundary fractions make such
runs visible.

The observed inputs come from the exact GP's training data, and for WISKI from its
statistics while they are still data-space rows (``n <= data_space_limit``): cubic
interpolation reproduces linear functions, so ``W U`` recovers the inputs exactly.
Grid-space statistics keep no rows; their fractions are NaN.

For a WISKI run whose rows are still in data space, the row also says how far its
posterior is from the exact GP's on the same data with the same hyperparameters (a
``SingleTaskGP`` given WISKI's transformed targets, kernel, mean and noise): over
``--test-points`` uniform points of the unit cube, ``ski_mean_error`` is the largest
``|mu_WISKI - mu_exact| / sigma_exact`` and ``ski_sd_error`` the largest
``|sigma_WISKI / sigma_exact - 1|``. This is the grid's approximation error alone, so a
gap between a WISKI run and an exact-GP run that these make small is the trajectory's
(or the hyperparameter fits'), not the grid's.

Writes ``<out>/bo_run_diagnostics.csv``. Rows already there for runs whose checkpoints
are gone (checkpoints are not kept in git) are kept; the runs found are rediagnosed.

Usage: ``python benchmarks/bo_run_diagnostics.py --runs results/bo_functions_runs``
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pandas as pd
import torch
from botorch.models import SingleTaskGP
from gpytorch.means import ZeroMean

from streamgp.linalg.statistics import DataStatistics
from streamgp.loops.surrogates import make_surrogate

DIM = 3


def _surrogate(label: str, state: dict):
    model, _, grid = label.partition("_g")
    options = {}
    if model == "wiski" and grid:
        grid_size, _, flags = grid.partition("_")
        options = {"grid_size": int(grid_size), "restandardize": flags == "restd"}
    placeholder = torch.rand(5, DIM, dtype=torch.float64), torch.rand(5, 1, dtype=torch.float64)
    surrogate = make_surrogate(model, *placeholder, **options)
    surrogate.load_state_dict(state)
    return surrogate


def _inputs(surrogate, state: dict) -> torch.Tensor | None:
    if "X" in state:  # the exact GP keeps its data
        return state["X"]
    statistics = surrogate.model.statistics
    if not isinstance(statistics, DataStatistics):
        return None
    return statistics.weights.to_dense() @ surrogate.model.interpolation.grid_points()


def ski_error(model, X: torch.Tensor, test_points: int) -> dict[str, float]:
    r"""WISKI's posterior against the exact GP's with its hyperparameters, on its data."""
    exact = SingleTaskGP(X, model.statistics.y.unsqueeze(-1), outcome_transform=None)
    exact.covar_module = copy.deepcopy(model.covar_module)
    exact.mean_module = copy.deepcopy(getattr(model, "mean_module", None) or ZeroMean())
    exact.likelihood.noise = model.likelihood.noise.detach()
    exact.eval()
    generator = torch.Generator().manual_seed(0)
    test = torch.rand(test_points, DIM, dtype=X.dtype, generator=generator)
    with torch.no_grad():
        ski = model.posterior(test)  # in the outcome's units, as BoTorch models answer
        oracle = model.outcome_transform.untransform_posterior(exact.posterior(test))
    sd = oracle.variance.sqrt()
    return {
        "ski_mean_error": ((ski.mean - oracle.mean).abs() / sd).max().item(),
        "ski_sd_error": (ski.variance.sqrt() / sd - 1).abs().max().item(),
    }


def diagnose(path: Path, tol: float, test_points: int) -> dict:
    function, _, label = path.parent.parent.name.partition("_")
    payload = torch.load(path, map_location="cpu", weights_only=False)
    state = payload["state"]
    surrogate = _surrogate(label, state["surrogate"])
    kernel = surrogate.model.covar_module
    kernel = getattr(kernel, "base_kernel", kernel)
    X = _inputs(surrogate, state["surrogate"])
    best = state["best_value"]
    wiski_in_data_space = label.startswith("wiski") and X is not None
    row = {
        "function": function,
        "model": label,
        "trial": int(path.stem.rpartition("_")[2]),
        "step": len(payload["history"]) - 1,
        "best_value": float(best),
    }
    for i, lengthscale in enumerate(kernel.lengthscale.detach().flatten().tolist()):
        row[f"lengthscale_{i}"] = lengthscale
    for i in range(DIM):
        on_edge = None if X is None else ((X[:, i] < tol) | (X[:, i] > 1 - tol)).double()
        row[f"boundary_fraction_{i}"] = float("nan") if on_edge is None else on_edge.mean().item()
    nan = {"ski_mean_error": float("nan"), "ski_sd_error": float("nan")}
    row.update(ski_error(surrogate.model, X, test_points) if wiski_in_data_space else nan)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tol", type=float, default=1e-3, help="distance counted as boundary")
    parser.add_argument("--out", type=Path, default=None, help="default: the --runs folder")
    parser.add_argument(
        "--test-points", type=int, default=1024, help="points comparing WISKI with the exact GP"
    )
    args = parser.parse_args()
    paths = sorted(args.runs.glob("*/checkpoints/bo_*.pt"))
    if not paths:
        raise SystemExit(f"no run checkpoints under {args.runs}/*/checkpoints/")
    frame = pd.DataFrame([diagnose(path, args.tol, args.test_points) for path in paths])
    out = args.out or args.runs
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "bo_run_diagnostics.csv"
    if csv.exists():
        key = ["function", "model", "trial"]
        kept = pd.read_csv(csv)
        kept = kept[~kept.set_index(key).index.isin(frame.set_index(key).index)]
        frame = pd.concat([kept, frame], ignore_index=True).sort_values(key, kind="stable")
    frame.to_csv(csv, index=False)
    print(frame.to_string(index=False, float_format="%.3g"))


if __name__ == "__main__":
    main()
