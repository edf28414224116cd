r"""Time per BO step as the data grow: WISKI vs exact GP on noisy Levy-3D (qUCB, q=3).

The protocol of the WISKI paper (appendix C.2): a random initial design, then per
step refit (warm-started L-BFGS-B), optimise qUCB with 10 restarts, 512 raw
samples, batch limit 5 and 200 L-BFGS-B iterations, and absorb the batch.
Refitting costs O(m^3) per L-BFGS-B iteration for WISKI and O(n^3) for the exact
GP; by default both refit every 10 steps (``--fit-every``) so that a 300-step run
fits in a CPU session. Both models use BoTorch's default kernel and priors; WISKI
uses its default grid (10^3 points in 3-D, so m = 1000).

The paper starts from 5 points and runs 1500 steps, so that n reaches 4505. On a
CPU an exact GP needs hours for that, so ``--num-init`` starts the 300 steps from
a larger random design instead: with ``--num-init 3000`` the window covers
n = 3000..3900, where the exact GP's cost per step is what it is late in the
paper's runs. With the default 5 points, n stays below m and the two models cost
about the same (both are dominated by ``optimize_acqf``).

Each model can run in its own process (``--models wiski`` / ``--models exact``,
same ``--name``): the runs are written per model under
``results/<name>_runs/<model>/`` (with checkpoints, so ``--resume`` continues an
interrupted run), and every invocation rewrites the summary from the runs that
exist: ``results/<name>.{csv,json}`` with, per model, the mean time per step over
the first and last 50 steps, their ratio, the exact/WISKI ratio over the last 50
steps and the final best values.

Usage: ``python benchmarks/bo_time_per_step.py [--steps 300] [--num-init 5] [--quick]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

from streamgp.loops.experiments import run_bo_experiment
from streamgp.utils.machine import machine_info


def summarize(results: pd.DataFrame, steps: int, window: int) -> dict:
    r"""Per-model timing summary of the BO runs in ``results``."""
    summary = {}
    trial_column = "trial" if "trial" in results else None
    for model, frame in results.groupby("model"):
        timed = frame[frame["step"] > 0]
        windows = (timed["step"] - 1) // window
        per_window = timed.groupby(windows)["step_time"].mean()
        first = timed[timed["step"] <= window]
        last = timed[timed["step"] > steps - window]
        summary[model] = {
            "mean_step_time_first": first["step_time"].mean(),
            "mean_step_time_last": last["step_time"].mean(),
            "last_over_first": last["step_time"].mean() / first["step_time"].mean(),
            "mean_step_time_per_window": [float(v) for v in per_window],
            "final_best_value": (
                frame.groupby(trial_column)["best_value"].last().tolist()
                if trial_column
                else frame["best_value"].iloc[-1]
            ),
            "initial_observations": int(frame["num_observations"].iloc[0]),
            "final_observations": int(frame["num_observations"].iloc[-1]),
            "fit_time_last": last["fit_time"].mean(),
            "acquisition_time_last": last["acquisition_time"].mean(),
            "update_time_last": last["update_time"].mean(),
        }
    if {"exact", "wiski"} <= summary.keys():
        summary["exact_over_wiski_last"] = (
            summary["exact"]["mean_step_time_last"] / summary["wiski"]["mean_step_time_last"]
        )
        summary["exact_over_wiski_per_window"] = [
            e / w
            for e, w in zip(
                summary["exact"]["mean_step_time_per_window"],
                summary["wiski"]["mean_step_time_per_window"],
                strict=False,
            )
        ]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--window", type=int, default=50, help="steps averaged at each end")
    parser.add_argument("--num-init", type=int, default=5, help="random initial design size")
    parser.add_argument("--models", default="wiski,exact", help="comma-separated")
    parser.add_argument("--name", default="bo_time_per_step", help="stem of the result files")
    parser.add_argument("--quick", action="store_true", help="10 steps (smoke test)")
    parser.add_argument("--fit-every", type=int, default=10, help="refit every k steps")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--resume", action="store_true", help="continue from checkpoints")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--trials", type=int, default=1, help="seeds 0 .. trials-1")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    steps, window = (10, 3) if args.quick else (args.steps, args.window)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    runs = args.out / f"{args.name}_runs"
    for model in args.models.split(","):
        run_bo_experiment(
            "levy",
            models=[model],
            acquisition="qucb",
            steps=steps,
            trials=args.trials,
            q=3,
            num_init=args.num_init,
            fit_every=args.fit_every,
            device=args.device,
            out=runs / model,
            resume=args.resume,
            plots=False,
        )
    results = pd.concat(
        [pd.read_csv(path) for path in sorted(runs.glob("*/bo_levy_qucb.csv"))],
        ignore_index=True,
    )
    summary = summarize(results, steps, window)
    summary["setup"] = {
        "steps": steps,
        "window": window,
        "num_init": args.num_init,
        "fit_every": args.fit_every,
        "device": args.device,
        "machine": machine_info(args.device),
    }
    from streamgp.plotting import plot_bo

    plot_bo(results, runs / "bo_levy_qucb.png", title=f"levy (qucb, q=3, {args.num_init} initial)")
    results.to_csv(args.out / f"{args.name}.csv", index=False)
    (args.out / f"{args.name}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
