r"""Stream ~5,000 observations into WISKI and an exact BoTorch GP (update cost vs n).

Both models are fitted on an initial design, then absorb the rest of the stream in
batches with fixed hyperparameters (the exact GP only up to ``--exact-max``):
``WiskiGP.observe`` (constant time in ``n``)
versus ``SingleTaskGP.condition_on_observations`` (BoTorch's incremental exact
update, whose cost grows with ``n``). Prints the time per observation and the test
RMSE as the stream grows, and writes them to ``benchmarks/results/stream_updates.csv``.

Run ``python benchmarks/stream_updates.py --help`` for options.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.test_functions import Branin
from gpytorch.means import ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood


def _rmse(model, X, y) -> float:
    with torch.no_grad():
        return (model.posterior(X).mean.squeeze(-1) - y).pow(2).mean().sqrt().item()


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="observations streamed in total")
    parser.add_argument("--batch", type=int, default=10, help="observations per update")
    parser.add_argument("--initial", type=int, default=200, help="initial design size")
    parser.add_argument(
        "--exact-max",
        type=int,
        default=1500,
        help="stop streaming into the exact GP at this n (its updates grow with n)",
    )
    parser.add_argument("--grid-size", type=int, default=32, help="WISKI grid points per dim")
    parser.add_argument("--noise-sd", type=float, default=5.0, help="observation noise sd")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    tkwargs = {"dtype": torch.float64}
    problem = Branin(noise_std=args.noise_sd)
    bounds = problem.bounds.to(**tkwargs)

    def sample(n):
        X = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(n, 2, **tkwargs)
        return X, problem(X).unsqueeze(-1), problem.evaluate_true(X)

    X0, Y0, _ = sample(args.initial)
    X_test, _, f_test = sample(1000)

    wiski = WiskiGP(
        X0,
        Y0,
        grid_size=args.grid_size,
        input_transform=Normalize(2, bounds=bounds),
        outcome_transform=Standardize(1),
        mean_module=ZeroMean(),
    )
    fit_gpytorch_mll(WoodburyMarginalLogLikelihood(wiski.likelihood, wiski))
    exact = SingleTaskGP(
        X0, Y0, input_transform=Normalize(2, bounds=bounds), outcome_transform=Standardize(1)
    )
    fit_gpytorch_mll(ExactMarginalLogLikelihood(exact.likelihood, exact))
    exact.posterior(X_test[:1])  # build the prediction caches used by conditioning

    rows = []
    report_every = max(1, (args.n - args.initial) // args.batch // 10)
    print(
        f"{'n':>6} {'WISKI ms/obs':>13} {'exact ms/obs':>13} {'WISKI RMSE':>11} {'exact RMSE':>11}"
    )
    step, t_wiski, t_exact = 0, 0.0, 0.0
    n = exact_n = args.initial
    while n < args.n:
        X, Y, _ = sample(args.batch)
        start = time.perf_counter()
        wiski.observe(X, Y)
        wiski.posterior(X_test[:16])  # an update is only useful once predictions see it
        t_wiski += time.perf_counter() - start
        if n < args.exact_max:
            start = time.perf_counter()
            exact = exact.condition_on_observations(X, Y)
            exact.posterior(X_test[:16])
            t_exact += time.perf_counter() - start
            exact_n = n + args.batch
        n += args.batch
        step += 1
        if step % report_every == 0 or n >= args.n:
            per_obs = 1e3 / (report_every * args.batch)
            exact_live = exact_n == n
            row = {
                "n": n,
                "wiski_ms_per_obs": t_wiski * per_obs,
                "exact_ms_per_obs": t_exact * per_obs if exact_live else float("nan"),
                "wiski_rmse": _rmse(wiski, X_test, f_test),
                "exact_rmse": _rmse(exact, X_test, f_test) if exact_live else float("nan"),
            }
            rows.append(row)
            cells = [f"{row[k]:>13.2f}" for k in ("wiski_ms_per_obs", "exact_ms_per_obs")]
            cells += [f"{row[k]:>11.3f}" for k in ("wiski_rmse", "exact_rmse")]
            print(f"{n:>6} " + " ".join(c.replace("nan", "  -") for c in cells))
            t_wiski = t_exact = 0.0
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "stream_updates.csv", index=False)
    print(f"wrote {args.out / 'stream_updates.csv'}")
    return frame


if __name__ == "__main__":
    main()
