r"""Time per BO step as the data grow: WISKI vs exact GP on noisy Levy-3D (qUCB, q=3).

The protocol of the WISKI paper (appendix C.2): 5 random initial points, then per
step refit to convergence (warm-started L-BFGS-B), optimise qUCB with 10 restarts,
512 raw samples, batch limit 5 and 200 L-BFGS-B iterations, and absorb the batch.
Refitting to convergence costs O(m^3) per L-BFGS-B iteration for WISKI and O(n^3)
for the exact GP; by default both refit every 10 steps (``--fit-every``) so that a
300-step run fits in a CPU session.
Both models use BoTorch's default kernel and priors; WISKI uses its default grid
(10^3 points in 3-D).

Writes ``benchmarks/results/bo_time_per_step.{csv,json,png}``: the per-step curves,
and per model the mean time per step over the first and last 50 steps, their ratio,
the exact/WISKI ratio over the last 50 steps and the final best values.

Usage: ``python benchmarks/bo_time_per_step.py [--steps 300] [--quick]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from streamgp.loops.experiments import run_bo_experiment
from streamgp.utils.machine import machine_info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--window", type=int, default=50, help="steps averaged at each end")
    parser.add_argument("--quick", action="store_true", help="10 steps (smoke test)")
    parser.add_argument("--fit-every", type=int, default=10, help="refit every k steps")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    steps, window = (10, 3) if args.quick else (args.steps, args.window)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results = run_bo_experiment(
        "levy",
        models=["wiski", "exact"],
        acquisition="qucb",
        steps=steps,
        q=3,
        fit_every=args.fit_every,
        device=args.device,
        out=args.out / "bo_time_per_step_runs",
        plots=True,
    )
    summary = {}
    for model, frame in results.groupby("model"):
        timed = frame[frame["step"] > 0]
        first = timed[timed["step"] <= window]["step_time"].mean()
        last = timed[timed["step"] > steps - window]["step_time"].mean()
        summary[model] = {
            "mean_step_time_first": first,
            "mean_step_time_last": last,
            "last_over_first": last / first,
            "final_best_value": frame["best_value"].iloc[-1],
            "final_observations": int(frame["num_observations"].iloc[-1]),
            "fit_time_last": timed[timed["step"] > steps - window]["fit_time"].mean(),
            "acquisition_time_last": timed[timed["step"] > steps - window][
                "acquisition_time"
            ].mean(),
        }
    summary["exact_over_wiski_last"] = (
        summary["exact"]["mean_step_time_last"] / summary["wiski"]["mean_step_time_last"]
    )
    summary["setup"] = {
        "steps": steps,
        "window": window,
        "fit_every": args.fit_every,
        "device": args.device,
        "machine": machine_info(args.device),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out / "bo_time_per_step.csv", index=False)
    (args.out / "bo_time_per_step.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
