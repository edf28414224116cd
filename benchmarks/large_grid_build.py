r"""Building a ``WiskiGP`` on a large grid (32^3 = 32,768 points) from up to 10^6 points.

For each n: ``WiskiGP(X, Y, grid_size=32, covar_module=RBFKernel(ard_num_dims=3),
outcome_transform=None, mean_module=ZeroMean())`` on X uniform in the unit cube
(grids above ``MAX_DENSE_GRID`` = 4096 points take the structured path, whose
statistics ``A = W^T W`` is a sparse matrix), timed as

- ``build_s``: the constructor (interpolation rows and grid statistics, in
  ``STATISTICS_CHUNK`` chunks; ``A`` summed cell by cell,
  :class:`streamgp.linalg.grid_gram.CellGram`);
- ``first_posterior_s``: the first ``posterior(X[:2]).variance`` with fixed
  hyperparameters (lengthscale 0.3, noise 0.01): the LOVE root of the grid posterior,
  independent of n;
- with ``--direct-n``: ``direct_statistics_s``, the same statistics summed the previous
  way (a coalesced sparse COO of the ``4096`` pairs of every row per chunk, merged into
  ``A``; still the path of small ``GridStatistics.add`` calls), and the largest relative
  difference of the two ``A``.

One torch thread by default. Results go to ``<out>/large_grid_build.{json,csv}``
(``large_grid_build_<tag>`` with ``--tag``). Each row records the two variances, so runs
of two versions of the code can be compared for equality as well as time: ``--label``
names the version in the rows and ``--append`` adds the rows to an existing results
file (each run's machine information is kept, in order), e.g. before and after a change:

``PYTHONPATH=<old>/src python benchmarks/large_grid_build.py --label before --tag love``
``PYTHONPATH=src python benchmarks/large_grid_build.py --label after --tag love --append``

Usage: ``python benchmarks/large_grid_build.py [--n 100000,1000000] [--direct-n 100000]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel
from gpytorch.means import ZeroMean

from streamgp import WiskiGP
from streamgp.linalg.statistics import GridStatistics
from streamgp.utils.machine import machine_info

D = 3
LENGTHSCALE, NOISE = 0.3, 0.01


def data(n: int, tkwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.rand(n, D, **tkwargs)
    return X, torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, **tkwargs)


def direct_statistics(model: WiskiGP, X: torch.Tensor, Y: torch.Tensor) -> GridStatistics:
    r"""The previous accumulation: one sparse Gram matrix per chunk, merged into ``A``."""
    y = Y.squeeze(-1)
    stats = GridStatistics.empty(model.interpolation.num_grid, y, False, sparse=True)
    for start in range(0, len(y), model.STATISTICS_CHUNK):
        rows = slice(start, start + model.STATISTICS_CHUNK)
        stats = stats.add(model.interpolation.weights(X[rows]), y[rows])
    return stats


def run(n: int, grid: int, direct: bool, tkwargs: dict, label: str = "") -> dict:
    X, Y = data(n, tkwargs)
    start = time.perf_counter()
    model = WiskiGP(
        X,
        Y,
        grid_size=grid,
        covar_module=RBFKernel(ard_num_dims=D).to(**tkwargs),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    build_s = time.perf_counter() - start
    row = {"label": label, "grid": grid, "m": model.interpolation.num_grid, "n": n}
    row["build_s"] = build_s
    row["structured"] = model.structured
    row["points_per_s"] = n / build_s
    if direct:
        start = time.perf_counter()
        reference = direct_statistics(model, X, Y).A
        row["direct_statistics_s"] = time.perf_counter() - start
        A = model.statistics.A
        row["same_pattern"] = bool(torch.equal(A.indices(), reference.indices()))
        scale = reference.values().abs().max()
        row["A_max_rel_diff"] = float((A.values() - reference.values()).abs().max() / scale)
        del reference
    model.covar_module.lengthscale = LENGTHSCALE
    model.likelihood.noise = NOISE
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        variance = model.posterior(X[:2]).variance  # the LOVE root
    row["first_posterior_s"] = time.perf_counter() - start
    row["variance"] = variance.squeeze(-1).tolist()
    row["build_plus_first_posterior_s"] = build_s + row["first_posterior_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="100000,1000000")
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--direct-n", default="", help="n at which to time the old path too")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="")
    parser.add_argument("--label", default="", help="names the code version in the rows")
    parser.add_argument("--append", action="store_true", help="add to an existing file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tkwargs = {"dtype": torch.float64, "device": torch.device("cpu")}
    direct_n = {int(v) for v in args.direct_n.split(",") if v}
    rows = []
    for n in (int(v) for v in args.n.split(",")):
        torch.manual_seed(args.seed)
        rows.append(run(n, args.grid, n in direct_n, tkwargs, args.label))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "large_grid_build" + (f"_{args.tag}" if args.tag else "")
    info = machine_info("cpu", dtype="float64", seed=args.seed)
    info["label"] = args.label
    machines = [info]
    if args.append and (out / f"{name}.json").exists():
        previous = json.loads((out / f"{name}.json").read_text())
        machines = previous.get("machines", [previous.get("machine")]) + machines
        rows = previous["rows"] + rows
    result = {"machine": info, "machines": machines, "rows": rows}
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    pd.DataFrame(rows).to_csv(out / f"{name}.csv", index=False)


if __name__ == "__main__":
    main()
