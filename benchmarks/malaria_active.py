r"""Active learning on the malaria atlas: test RMSE per step (WISKI paper, section 5.4).

Fixed-noise WISKI (30 x 30 grid, scaled ARD Matern-1/2 kernel with the paper's Gamma
priors), 10 random initial points, q = 6 points per step chosen by qNIPV (integration
points drawn from the test set) among ``--candidates`` random pool points, refit every
``--fit-every`` steps. Optionally the exact fixed-noise GP (``--models wiski,exact``)
and random selection (``--acquisitions qnipv,random``).

Writes ``benchmarks/results/malaria_active.{csv,json}`` and the figures.

With ``--refine-grid`` (the loops' default) a refit that leaves a lengthscale under two
grid spacings moves WISKI to a finer grid (exact, at most ``--max-grid-points``: by
default the device's default grid budget, 1,024 points on a CPU); ``--no-refine-grid``
keeps the paper's 30 x 30 grid.

Usage: ``python benchmarks/malaria_active.py [--steps 500] [--trials 3] [--quick]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from streamgp.loops.acquisition import AcquisitionOptions
from streamgp.loops.experiments import (
    malaria_kernel,
    malaria_pool_and_test,
    run_active_experiment,
    summarize,
)
from streamgp.utils.machine import machine_info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--models", default="wiski")
    parser.add_argument("--acquisitions", default="qnipv")
    parser.add_argument("--candidates", type=int, default=256)
    parser.add_argument("--num-mc-points", type=int, default=128)
    parser.add_argument("--fit-every", type=int, default=10)
    parser.add_argument(
        "--pool-batch-size",
        type=int,
        default=AcquisitionOptions.pool_batch_size,
        help="pool candidates scored jointly (the exact GP's fantasies need O(batch n^2) memory)",
    )
    parser.add_argument("--trials", type=int, default=1, help="seeds per model/acquisition")
    parser.add_argument(
        "--refine-grid",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="refine WISKI's 30 x 30 grid after a refit that leaves it too coarse",
    )
    parser.add_argument(
        "--max-grid-points",
        type=int,
        default=None,
        help="cap on a refined grid (default: the device's default grid budget)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from checkpoints in --out")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="5 steps (smoke test)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    steps = 5 if args.quick else args.steps
    pool_X, pool_Y, pool_Yvar, test_X, test_Y = malaria_pool_and_test()
    results = run_active_experiment(
        pool_X,
        pool_Y,
        test_X,
        test_Y,
        pool_Yvar,
        name="malaria_active",
        models=args.models.split(","),
        acquisitions=args.acquisitions.split(","),
        steps=steps,
        q=6,
        num_init=10,
        num_mc_points=args.num_mc_points,
        candidates_per_step=args.candidates,
        fit_every=args.fit_every,
        kernel_factory=malaria_kernel,
        acquisition_options=AcquisitionOptions(pool_batch_size=args.pool_batch_size),
        resume=args.resume,
        model_options={
            "wiski": {
                "grid_size": 30,
                "refine_grid": args.refine_grid,
                "max_grid_points": args.max_grid_points,
            }
        },
        trials=args.trials,
        device=args.device,
        out=args.out / "malaria_active_runs",
    )
    table = summarize(results, ["model", "acquisition"], "test_rmse", last=50)
    summary = {
        "table": table.to_dict(orient="records"),
        "initial_rmse": results[results["step"] == 0]
        .groupby(["model", "acquisition"])["test_rmse"]
        .mean()
        .to_dict(),
        "setup": {
            **{k: str(v) for k, v in vars(args).items()},
            "machine": machine_info(args.device),
        },
    }
    summary["initial_rmse"] = {"/".join(k): v for k, v in summary["initial_rmse"].items()}
    args.out.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out / "malaria_active.csv", index=False)
    (args.out / "malaria_active.json").write_text(json.dumps(summary, indent=2, default=str))
    print(table.to_string(index=False, float_format="%.4g"))


if __name__ == "__main__":
    main()
