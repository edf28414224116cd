r"""The large-grid marginal likelihood against its certified gap (``LIKELIHOOD_TOLERANCE``).

On grids above ``MAX_DENSE_GRID`` points ``WiskiGP``'s marginal likelihood takes its
log-determinant from a block-Lanczos Nystrom approximation that stops at an absolute
trace gap ``tol``; the value is then within ``tol / 2`` of exact SKI's. The gap is
``max(love_tolerance, LIKELIHOOD_TOLERANCE * n)`` (``WiskiGP.likelihood_gap``); before
``LIKELIHOOD_TOLERANCE`` it was ``love_tolerance`` (``1e-8``) at every ``n``.

Rows:

- ``value_and_gradient``: the value + gradient (``WoodburyMarginalLogLikelihood``, as
  BoTorch's fit evaluates it; ``ScaleKernel(RBF)``, zero mean, the data of
  ``gpu_check.py``) on a ``--grid``\ ^3 grid at ``--n`` points for each per-observation
  tolerance in ``--tolerances`` (0: the ``love_tolerance`` gap): the gap, the Nystrom
  rank, the median seconds of ``--repeats`` calls, the operations of one call (top-level
  aten ops; on CUDA also kernel launches and host synchronisations), and the value's and
  gradient's differences from the smallest gap's;
- ``fit``: ``fit_gpytorch_mll`` (L-BFGS-B, at most ``--fit-maxiter`` iterations) on a
  ``--fit-grid``\ ^3 grid at ``--fit-n`` points from the same start, for the smallest and
  the default tolerance: evaluations, seconds, the final objective (per datum) and the
  largest relative difference of the fitted hyperparameters.

Writes ``<out>/likelihood_tolerance.{csv,json}``.

Usage: ``python benchmarks/likelihood_tolerance.py [--grid 32 --n 10000] [--device cuda]``
(``--quick``: a 17^3 grid at n = 5,000, about a minute).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.fit import fit_gpytorch_mll
from gpu_check import mll_model, mll_value_and_grad
from hot_path_ops import op_counts

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood, settings
from streamgp.linalg import structured
from streamgp.utils.machine import machine_info, median_seconds


class _NystromRanks:
    r"""Records the rank of every Nystrom approximation made inside the block."""

    def __enter__(self):
        self.ranks: list[int] = []
        self._nystrom = structured.WhitenedStatistic.nystrom
        original, ranks = self._nystrom, self.ranks

        def nystrom(operator, tol, max_rank=None):
            result = original(operator, tol, max_rank)
            ranks.append(result.complement_root.shape[-1])
            return result

        structured.WhitenedStatistic.nystrom = nystrom
        return self

    def __exit__(self, *exc):
        structured.WhitenedStatistic.nystrom = self._nystrom


def _flat_gradient(gradient) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in gradient])


def value_and_gradient_rows(args, tkwargs) -> list[dict]:
    model = mll_model(args.grid, args.n, tkwargs)
    assert model.structured, "the grid must exceed WiskiGP.MAX_DENSE_GRID points"
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    rows, reference = [], None
    for per_observation in sorted(args.tolerances):
        model.LIKELIHOOD_TOLERANCE = per_observation
        model.train()
        with _NystromRanks() as ranks:
            value = mll()
            gradient = _flat_gradient(torch.autograd.grad(value, params))
        call = mll_value_and_grad(model)
        seconds = median_seconds(call, repeats=args.repeats, warmup=True)
        if reference is None:
            reference = (value.detach(), gradient)
        rows.append(
            {
                "part": "value_and_gradient",
                "grid": args.grid,
                "n": args.n,
                "per_observation": per_observation,
                "gap": model.likelihood_gap(args.n),
                "rank": ranks.ranks[0],
                "seconds": seconds,
                # mll() is per datum: the differences are per datum too.
                "value_difference": float(value.detach() - reference[0]),
                "gradient_difference": float((gradient - reference[1]).abs().max()),
                "gradient_scale": float(reference[1].abs().max()),
            }
            | op_counts(call, tkwargs["device"])  # aten ops; on CUDA launches and syncs
        )
        print(rows[-1], flush=True)
    del model.LIKELIHOOD_TOLERANCE
    return rows


def fit_rows(args, tkwargs) -> list[dict]:
    rows, fitted = [], []
    tightest = min(args.tolerances)
    compared = sorted({tightest, settings.LIKELIHOOD_TOLERANCE})  # one fit if they agree
    for per_observation in compared:
        torch.manual_seed(1)  # the same data for both
        model = mll_model(args.fit_grid, args.fit_n, tkwargs)
        model.LIKELIHOOD_TOLERANCE = per_observation
        mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
        evaluations = [0]
        original = mll.forward

        def counted(*a, _original=original, _evaluations=evaluations, **k):
            _evaluations[0] += 1
            return _original(*a, **k)

        mll.forward = counted
        start = time.perf_counter()
        fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": args.fit_maxiter}})
        seconds = time.perf_counter() - start
        mll.forward = original
        model.train()
        with torch.no_grad():
            objective = float(mll())
        fitted.append({k: v.detach().clone() for k, v in model.named_parameters()})
        rows.append(
            {
                "part": "fit",
                "grid": args.fit_grid,
                "n": args.fit_n,
                "per_observation": per_observation,
                "gap": model.likelihood_gap(args.fit_n),
                "evaluations": evaluations[0],
                "seconds": seconds,
                "objective_per_datum": objective,
            }
        )
        print(rows[-1], flush=True)
    if len(fitted) == 1:  # the tightest is the default: nothing to compare
        return rows
    tight, default = fitted
    difference = max(
        float(((default[k] - tight[k]).abs() / tight[k].abs().clamp_min(1e-12)).max())
        for k in tight
    )
    rows[-1]["parameter_relative_difference"] = difference
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--tolerances", default="0,1e-10,1e-9,1e-8", help="per observation")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fit-grid", type=int, default=18)
    parser.add_argument("--fit-n", type=int, default=5_000)
    parser.add_argument("--fit-maxiter", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    args.tolerances = [float(t) for t in args.tolerances.split(",")]
    if args.quick:
        args.grid, args.n, args.fit_grid, args.fit_n, args.fit_maxiter = 17, 5_000, 17, 5_000, 3
        args.repeats = 1
    torch.set_num_threads(args.threads)
    assert args.grid**3 > WiskiGP.MAX_DENSE_GRID and args.fit_grid**3 > WiskiGP.MAX_DENSE_GRID
    tkwargs = {"dtype": torch.float64, "device": torch.device(args.device)}
    torch.manual_seed(0)
    rows = value_and_gradient_rows(args, tkwargs) + fit_rows(args, tkwargs)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.device == "cpu" else f"-{args.device}"
    frame.to_csv(args.out / f"likelihood_tolerance{suffix}.csv", index=False)
    payload = {"machine": machine_info(args.device, dtype="float64"), "rows": rows}
    payload["settings"] = vars(args) | {"out": str(args.out)}
    (args.out / f"likelihood_tolerance{suffix}.json").write_text(json.dumps(payload, indent=2))
    print(frame.to_string())


if __name__ == "__main__":
    main()
