r"""BO in higher dimension: online SoftKI vs the exact GP on Hartmann-6 and noisy Ackley-10.

A thin driver of :func:`streamgp.loops.experiments.run_bo_experiment` (the loop behind
``streamgp bo``): qLogEI with ``q = 3``, 5 random initial points, the surrogates
``softki`` (:class:`~streamgp.models.OnlineSoftKIGP`, ``--num-inducing`` Sobol
points, constant-time updates, softmax temperature ``--temperature-scale`` times the
points' median nearest-neighbour distance, by default SoftKI's 0.5) and ``exact``
(BoTorch's ``SingleTaskGP``, refitted on all data), hyperparameters refitted every
``--fit-every`` steps (warm-started), ``--trials`` seeds (trial ``t`` uses seed ``t``
for every model). Noise sd: the runner's defaults, 0.1 for Hartmann-6 (range about
3.3) and 4.0 for Ackley-10 (the WISKI paper's value; range about 22).

Each function and model runs on its own, with checkpoints (``--resume``) under
``<out>/runs/<function><dim>_<model>/``; each run directory's ``settings.json`` holds
the model's options, and ``--resume`` refuses a run started with other ones. Every
invocation rewrites, from the runs that exist, ``<out>/softki_bo.csv`` (all curves),
``softki_bo.json`` (per function and model: steps actually run, best true value and
regret at the last step, mean time per step over the first and last ``--window``
steps; settings and each run's options; machine), ``softki_bo.md`` (the table) and
``softki_bo.png`` (best value and time per step against the step).

Usage:
    ``python benchmarks/softki_bo.py`` (200 steps, 3 seeds, both functions and models)
    or ``--quick`` (5 steps, 1 seed, into ``<out>/quick``); ``--steps 50 --trials 1``
    for a reduced grid (the JSON and table say how many steps and seeds ran).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import pandas as pd
import torch

from streamgp.loops.bo import TEST_FUNCTIONS
from streamgp.loops.experiments import run_bo_experiment, summarize
from streamgp.models.softki import DEFAULT_RELATIVE_TEMPERATURE
from streamgp.utils.machine import machine_info

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FUNCTIONS = ("hartmann:6", "ackley:10")
MODELS = ("softki", "exact")
ACQUISITION = "qlogei"


def parse_functions(text: str) -> list[tuple[str, int]]:
    out = []
    for item in filter(None, text.split(",")):
        name, _, dim = item.partition(":")
        if name not in TEST_FUNCTIONS:
            raise SystemExit(f"unknown function {name!r}; choose from {', '.join(TEST_FUNCTIONS)}")
        out.append((name, int(dim) if dim else 3))
    return out


def check_settings(run: Path, options: dict, resume: bool) -> None:
    """Write ``run``'s model options; with ``resume``, refuse a run started with others."""
    path = run / "settings.json"
    if resume and path.exists() and json.loads(path.read_text()) != options:
        raise SystemExit(f"{run} was started with {path.read_text().strip()}, not {options}")
    run.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(options) + "\n")


def table(results: pd.DataFrame, window: int) -> pd.DataFrame:
    by = ["function", "dim", "model"]
    best = summarize(results, by, "best_value", last=window)
    regret = summarize(results, by, "regret", last=window)["regret"]
    trials = results.groupby(by, sort=False)["trial"].nunique().to_numpy()
    final = results[results["step"] == results.groupby(by)["step"].transform("max")]
    spread = final.groupby(by, sort=False)["best_value"].std(ddof=0).to_numpy()
    mean_time = results[results["step"] > 0].groupby(by, sort=False)["step_time"].mean().to_numpy()
    return best.assign(
        trials=trials,
        best_value_std=spread,
        regret=regret,
        **{"time/step mean (s)": mean_time},
    )


def markdown(summary: pd.DataFrame, info: dict, args, run_options: dict) -> str:
    w = args.window
    scales = sorted(
        {opts["relative_temperature"] for opts in run_options.values() if opts}
        or {args.temperature_scale}
    )
    lines = [
        f"| function | model | seeds | steps | n | best value (mean ± std) | regret "
        f"| s/step first {w} | s/step last {w} | s/step mean |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for row in summary.to_dict(orient="records"):
        lines.append(
            f"| {row['function']}-{row['dim']} | {row['model']} | {row['trials']} "
            f"| {row['steps']} | {row['observations']} "
            f"| {row['best_value']:.3f} ± {row['best_value_std']:.3f} | {row['regret']:.3f} "
            f"| {row[f'time/step first {w} (s)']:.2f} | {row[f'time/step last {w} (s)']:.2f} "
            f"| {row['time/step mean (s)']:.2f} |"
        )
    lines += [
        "",
        f"Machine: {info['platform']}, {info['cpu_count']} CPUs, torch {info['torch']} "
        f"({info['torch_threads']} thread), float64. qLogEI, q = 3, {args.num_init} initial "
        f"points, refit every {args.fit_every} steps, softki m = {args.num_inducing}, "
        f"temperature {' / '.join(f'{s:g}' for s in scales)} x the points' median "
        "nearest-neighbour distance. "
        "Timings on a shared machine are noisy.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: pd.DataFrame, path: Path) -> None:
    groups = list(results.groupby(["function", "dim"], sort=False))
    fig, axes = plt.subplots(2, len(groups), figsize=(5 * len(groups), 7), squeeze=False)
    for col, ((function, dim), frame) in enumerate(groups):
        for model, part in frame.groupby("model", sort=False):
            for row, value in enumerate(("best_value", "step_time")):
                data = part if value == "best_value" else part[part["step"] > 0]
                stats = data.groupby("step")[value].agg(["mean", "min", "max"])
                (line,) = axes[row, col].plot(stats.index, stats["mean"], label=model)
                axes[row, col].fill_between(
                    stats.index, stats["min"], stats["max"], alpha=0.2, color=line.get_color()
                )
        axes[0, col].set(title=f"{function}-{dim} (qLogEI, q=3)", ylabel="best true value")
        axes[1, col].set(xlabel="step", ylabel="time per step (s)", yscale="log")
        for ax in axes[:, col]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default=",".join(FUNCTIONS), help="name:dim,...")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--num-init", type=int, default=5)
    parser.add_argument("--fit-every", type=int, default=10)
    parser.add_argument("--num-inducing", type=int, default=256, help="softki's m")
    parser.add_argument(
        "--temperature-scale",
        type=float,
        default=DEFAULT_RELATIVE_TEMPERATURE,
        help="softki's softmax temperature / the points' median nearest-neighbour distance",
    )
    parser.add_argument("--window", type=int, default=20, help="steps averaged at each end")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="5 steps, 1 seed (smoke test)")
    parser.add_argument("--resume", action="store_true", help="continue from checkpoints")
    parser.add_argument(
        "--aggregate-only", action="store_true", help="only rebuild the outputs from finished runs"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "softki_bo")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.trials, args.window = 5, 1, 2
        args.out = args.out / "quick"
    torch.set_num_threads(args.threads)
    functions = parse_functions(args.functions)
    models = [m for m in args.models.split(",") if m]
    runs = args.out / "runs"
    model_options = {
        "softki": {
            "num_inducing": args.num_inducing,
            "relative_temperature": args.temperature_scale,
        }
    }
    for function, dim in [] if args.aggregate_only else functions:
        for model in models:
            run = runs / f"{function}{dim}_{model}"
            check_settings(run, model_options.get(model, {}), args.resume)
            run_bo_experiment(
                function,
                models=[model],
                acquisition=ACQUISITION,
                steps=args.steps,
                trials=args.trials,
                dim=dim,
                q=3,
                num_init=args.num_init,
                fit_every=args.fit_every,
                model_options=model_options,
                device=args.device,
                out=run,
                resume=args.resume,
                plots=False,
            )
    frames = []
    for path in sorted(runs.glob(f"*/bo_*_{ACQUISITION}.csv")):
        frame = pd.read_csv(path)
        dim = int(path.parent.name.split("_")[0].lstrip("abcdefghijklmnopqrstuvwxyz"))
        frames.append(frame.assign(dim=dim))
    results = pd.concat(frames, ignore_index=True)
    summary = table(results, args.window)
    info = machine_info(args.device, dtype="float64")
    run_options = {
        path.parent.name: json.loads(path.read_text())
        for path in sorted(runs.glob("*/settings.json"))
        if any(path.parent.glob(f"bo_*_{ACQUISITION}.csv"))
    }
    payload = {
        "protocol": "streamgp.loops.experiments.run_bo_experiment, qLogEI q=3",
        "settings": {
            "requested_steps": args.steps,
            "requested_trials": args.trials,
            "num_init": args.num_init,
            "fit_every": args.fit_every,
            "softki_num_inducing": args.num_inducing,
            "softki_temperature_scale": args.temperature_scale,
            "window": args.window,
            "noise_std": {name: TEST_FUNCTIONS[name][1] for name, _ in functions},
        },
        "run_options": run_options,
        "machine": info,
        "results": summary.to_dict(orient="records"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out / "softki_bo.csv", index=False)
    (args.out / "softki_bo.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / "softki_bo.md").write_text(markdown(summary, info, args, run_options))
    plot(results, args.out / "softki_bo.png")
    print(summary.to_string(index=False, float_format="%.4g"))


if __name__ == "__main__":
    main()
