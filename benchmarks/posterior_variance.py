r"""``posterior(X).variance`` at many test points, without LOVE switches.

2-D ``WiskiGP`` (ScaleKernel(RBF), fixed hyperparameters) on g x g grids, n = 4000
observations (grid space) and n = 500 (data space, posterior on the grid or in data
space by the default rule), 10^4 test points. The posterior's covariance is lazy
(``PosteriorCovariance``), so the variances cost ``O(t 4^d m)`` and no ``t x t`` matrix
is formed; the "dense" column times the diagonal of the full covariance matrix at
2,000 points for comparison (what ``posterior(X).variance`` cost before). "first" is
the first variance request after the factorisation (the posterior's prediction caches
cold: it pays ``W_* R`` or, when that already costs more, builds the cached grid
covariance); "steady" is the median of 3 repeats after a warm-up, i.e. what every
further request costs once the caches have paid for themselves. One torch thread.
Results: ``benchmarks/results/posterior_variance.{json,csv}``.

Usage: ``python benchmarks/posterior_variance.py``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.means import ZeroMean

from streamgp import WiskiGP
from streamgp.utils.machine import machine_info, median_seconds

T, T_DENSE = 10_000, 2_000


def seconds(fn) -> float:
    return median_seconds(fn, repeats=3, warmup=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for grid in (32, 40, 64):
        for n in (500, 4000):
            X = torch.rand(n, 2, dtype=torch.float64)
            Y = torch.sin(5 * X).sum(-1, keepdim=True)
            model = WiskiGP(
                X,
                Y,
                grid_size=grid,
                covar_module=ScaleKernel(RBFKernel()),
                outcome_transform=None,
                mean_module=ZeroMean(),
            )
            model.covar_module.base_kernel.lengthscale = 0.2
            model.likelihood.noise = 0.01
            Xs = torch.rand(T, 2, dtype=torch.float64)
            model.eval()
            model.exact_posterior()  # factorise outside the timings
            start = time.perf_counter()
            _ = model.posterior(Xs).variance
            first = time.perf_counter() - start
            calls_to_cache = 1
            while model.exact_posterior().cache.value is None and calls_to_cache < 20:
                _ = model.posterior(Xs).variance
                calls_to_cache += 1
            lazy = seconds(lambda: model.posterior(Xs).variance)  # noqa: B023
            dense = seconds(
                lambda: model.posterior(Xs[:T_DENSE]).covariance_matrix.diagonal(dim1=-2, dim2=-1)  # noqa: B023
            )
            posterior = model.exact_posterior()
            row = {
                "grid": f"{grid}x{grid}",
                "m": model.interpolation.num_grid,
                "n": n,
                "statistics": "data" if model.in_data_space else "grid",
                "posterior": "grid" if hasattr(posterior, "root") else "data",
                "first_call_ms_10k_points": 1e3 * first,
                "calls_until_cached": calls_to_cache,
                "variance_ms_10k_points": 1e3 * lazy,
                "dense_covariance_ms_2k_points": 1e3 * dense,
            }
            rows.append(row)
            print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / "posterior_variance.csv", index=False)
    payload = {"machine": machine_info(), "test_points": T, "rows": rows}
    (args.out / "posterior_variance.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
