r"""BO on the WISKI paper's six noisy 3-D test functions: WISKI vs exact GP (Figures A.6-A.8).

Levy (noise sd 10), Ackley (4), StyblinskiTang (20), Rastrigin (10), Griewank (4) and
Michalewicz (5), as in the paper's appendix C.2: 5 random initial points, qUCB with
q = 3 and the paper's ``optimize_acqf`` settings (10 restarts, 512 raw samples, batch
limit 5, 200 L-BFGS-B iterations), warm-started refits every ``--fit-every`` steps.
The paper runs 1500 steps on GPUs; the default here is 100 steps (n = 305) so the
whole suite fits in a CPU session, which shows the optimisation quality side by side
(the time-per-step comparison at large n is ``bo_time_per_step.py``'s job).

Each function and model runs on its own (``--functions``, ``--models`` select; runs in
different processes may share ``--out``), with checkpoints (``--resume``) under
``results/bo_functions_runs/<function>_<model>/``. Every invocation rewrites, from
the runs that exist, ``results/bo_functions.csv`` (all curves),
``results/bo_functions.json`` (per function and model: final best true value, regret,
time per step over the first and last ``--window`` steps; settings; machine) and one
figure per function, ``results/bo_functions_runs/bo_<function>.png`` (best value vs step
and vs cumulative time, time per step vs step).

``--wiski-grid-size g`` runs WISKI on a g^3 grid instead of its default 10^3 (runs under
``<function>_wiski_g<g>/``, labelled ``wiski_g<g>``), so grids can be compared side by side:
e.g. ``--models wiski --wiski-grid-size 16`` next to the default runs (issue 19's table).
By default (``--wiski-restandardize``) WISKI re-estimates its outcome standardisation
from all data at each refit with ``SingleTaskGP``'s unscaled kernel and learned constant
mean, i.e. ``SingleTaskGP``'s model on a grid (``WiskiSurrogate(restandardize=True)``, the
loops' default; label suffix ``_restd``); ``--no-wiski-restandardize`` keeps the initial
design's standardisation (unsuffixed labels).
``bo_functions_seeds.{csv,md}`` report every seed's best true value at the
``--report-steps`` (mean ± sd and median over the seeds that reached each step; the docs'
tables).
``--summarize-only`` runs nothing and rewrites the summary and figures from the runs under
``--out`` (e.g. after runs of different lengths were resumed separately).

Usage: ``python benchmarks/bo_functions.py [--steps 100] [--functions levy,ackley]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

from streamgp.loops.bo import PAPER_FUNCTIONS, TEST_FUNCTIONS
from streamgp.loops.experiments import run_bo_experiment, summarize, summarize_seeds
from streamgp.plotting import plot_bo
from streamgp.utils.machine import machine_info


def _read_run(path: Path) -> pd.DataFrame:
    """One run's curves, labelled by its directory ``<function>_<label>`` (``wiski_g16``)."""
    frame = pd.read_csv(path)
    frame["model"] = path.parent.name.partition("_")[2]
    return frame


def _seed_table(seeds: pd.DataFrame) -> str:
    """Markdown: best true value over seeds (mean ± sd, median, each seed's), per step."""
    lines = [
        "| function | model | step | seeds | mean ± sd | median | per seed | time/step (s) |",
        "|---|---|---:|---:|---|---:|---|---:|",
    ]
    for _, row in seeds.iterrows():
        values = ", ".join(f"{v:.4g}" for v in row["values"])
        spread = f"{row['mean']:.4g}" + ("" if pd.isna(row["sd"]) else f" ± {row['sd']:.2g}")
        lines.append(
            f"| {row['function']} | {row['model']} | {row['step']} | {row['trials']} "
            f"| {spread} | {row['median']:.4g} | {values} | {row['time/step (s)']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default=",".join(PAPER_FUNCTIONS))
    parser.add_argument("--models", default="wiski,exact")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument(
        "--first-trial", type=int, default=0, help="seed of the first trial (adds seeds)"
    )
    parser.add_argument("--fit-every", type=int, default=10)
    parser.add_argument("--window", type=int, default=20, help="steps averaged at each end")
    parser.add_argument(
        "--num-inducing", type=int, default=256, help="O-SVGP's M (the paper: 1000, on GPUs)"
    )
    parser.add_argument(
        "--wiski-grid-size", type=int, default=None, help="WISKI points per dimension"
    )
    parser.add_argument(
        "--wiski-restandardize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="WISKI re-estimates its outcome standardisation at each refit (the loops' "
        "default; --no-wiski-restandardize keeps the initial design's)",
    )
    parser.add_argument(
        "--report-steps",
        default="150,300",
        help="steps at which bo_functions_seeds.{csv,md} report every seed's best value",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--resume", action="store_true", help="continue from checkpoints")
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="run nothing; rewrite the summary and figures from the runs under --out",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    functions = [name for name in args.functions.split(",") if name]
    unknown = sorted(set(functions) - set(TEST_FUNCTIONS))
    if unknown:
        raise SystemExit(f"unknown functions {unknown}; choose from {', '.join(TEST_FUNCTIONS)}")
    runs = args.out / "bo_functions_runs"
    grid = args.wiski_grid_size
    options = {"osvgp": {"num_inducing": args.num_inducing}}
    wiski, suffix = {}, ""
    if grid is not None:
        wiski["grid_size"], suffix = grid, f"_g{grid}"
    if args.wiski_restandardize:
        wiski["restandardize"], suffix = True, suffix + "_restd"
    else:  # the frozen standardisation: the unsuffixed runs of earlier sessions
        wiski["restandardize"] = False
    options["wiski"] = wiski
    for function in [] if args.summarize_only else functions:
        for model in args.models.split(","):
            run_bo_experiment(
                function,
                models=[model],
                acquisition="qucb",
                steps=args.steps,
                trials=args.trials,
                first_trial=args.first_trial,
                q=3,
                fit_every=args.fit_every,
                model_options=options,
                device=args.device,
                out=runs / f"{function}_{model}{suffix if model == 'wiski' else ''}",
                resume=args.resume,
                plots=False,
            )
    results = pd.concat(
        [_read_run(path) for path in sorted(runs.glob("*/bo_*_qucb.csv"))], ignore_index=True
    )
    for function, frame in results.groupby("function", sort=False):
        plot_bo(frame, runs / f"bo_{function}.png", title=f"{function} (qUCB, q=3)")
    table = summarize(results, ["function", "model"], "best_value", last=args.window)
    regret = summarize(results, ["function", "model"], "regret", last=args.window)["regret"]
    table = table.assign(regret=regret)
    payload = {
        "protocol": "WISKI paper appendix C.2 (streamgp.loops.BayesOptLoop), qUCB q=3",
        "settings": {
            "steps": None if args.summarize_only else args.steps,  # None: per run, in results
            "trials": None if args.summarize_only else args.trials,
            "fit_every": args.fit_every,
            "window": args.window,
            "osvgp_num_inducing": args.num_inducing,
            "noise_std": {name: TEST_FUNCTIONS[name][1] for name in results["function"].unique()},
        },
        "machine": machine_info(args.device),
        "results": table.to_dict(orient="records"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out / "bo_functions.csv", index=False)
    report_steps = [int(step) for step in args.report_steps.split(",") if step]
    seeds = summarize_seeds(results, ["function", "model"], "best_value", report_steps)
    seeds.to_csv(args.out / "bo_functions_seeds.csv", index=False)
    (args.out / "bo_functions_seeds.md").write_text(_seed_table(seeds))
    (args.out / "bo_functions.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(table.to_string(index=False, float_format="%.4g"))


if __name__ == "__main__":
    main()
