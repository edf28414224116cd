r"""``make demo``: a short Bayesian-optimisation run, WISKI vs an exact GP.

Maximises the noisy 3-D Levy function (noise sd 10, negated) with qUCB (q = 3)
from 5 random points, once with :class:`~streamgp.models.WiskiGP` (constant-time
updates and refits) and once with BoTorch's exact ``SingleTaskGP`` (rebuilt on all
data each step). Prints a results table and writes the curves
(``demo_results/bo_levy_qucb.csv``) and the figure (``bo_levy_qucb.png``).

The defaults are lighter than the paper's (fewer restarts, refit every 5 steps) so
that the demo takes under a minute on a laptop CPU; ``streamgp bo`` runs the full
protocol. At these sizes (n <= 50) WISKI works in data space, so a step costs about
what the exact GP's does. Run ``python -m streamgp.demo --help`` for options.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

# The first torch.broadcast_shapes call of a process (BoTorch's acquisition functions make
# one) imports torch._refs and sympy, ~1.5 s; importing it here keeps that one-time cost
# out of the step times of whichever model runs first.
import torch._refs  # noqa: F401

from streamgp.loops.acquisition import AcquisitionOptions
from streamgp.loops.experiments import run_bo_experiment, summarize


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15, help="BO steps per model")
    parser.add_argument("--models", default="wiski,exact", help="comma-separated models")
    parser.add_argument("--out", type=Path, default=Path("demo_results"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    results = run_bo_experiment(
        "levy",
        models=args.models.split(","),
        acquisition="qucb",
        steps=args.steps,
        trials=1,
        q=3,
        fit_every=5,
        fit_max_iter=50,
        acquisition_options=AcquisitionOptions(num_restarts=4, raw_samples=256, maxiter=100),
        out=args.out,
        progress=True,
    )
    table = summarize(results, ["model"], "best_value", last=5)
    print("\nNoisy Levy-3D, qUCB (q=3); best true value (optimum 0):")
    print(table.to_string(index=False, float_format="%.4g"))
    parts = ["step_time", "fit_time", "acquisition_time", "update_time"]
    means = results[results["step"] > 0].groupby("model", sort=False)[parts].mean()
    print("\nMean seconds per step over all steps (fit: refits every 5 steps, averaged):")
    print(means.rename(columns=lambda c: c.replace("_time", "")).to_string(float_format="%.3f"))
    print(f"\ncurves: {args.out / 'bo_levy_qucb.csv'}   figure: {args.out / 'bo_levy_qucb.png'}")
    return results


if __name__ == "__main__":
    main()
