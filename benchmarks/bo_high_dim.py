r"""BO at d = 6-20 (issue 35's table): the exact GP against the high-d streaming models.

Functions (BoTorch's, noisy, negated so that larger is better): Hartmann-6, Ackley-10,
Levy-10, Rosenbrock-10 and StyblinskiTang-20. Models: the exact GP (``exact``), WISKI as a
BoTorch user meets it at d >= 4 (``wiski``: in data space; the table's runs were made
while it was exact SKI there with the kernel factored per axis, it now evaluates the kernel
exactly), the constant-time additive WISKI (``wiski-additive``), SoftKI with points
that follow the search (``softki`` with ``moving_points``) and O-SVGP (``osvgp``).
qLogEI with q = 3, ``2 d`` initial points, warm-started refits every ``--fit-every``
steps, ``--steps`` steps, ``--trials`` seeds (seed t is the same initial design for every
model).

Every (function, model, seed) is its own resumable run under
``<out>/runs/<function><d>_<model>_<seed>/`` (checkpoints every 10 steps; ``--resume``
continues them, and skips a run whose per-step trace ``bo_*.csv`` already reaches
``--steps``), run seed by seed so that a partial table already compares every model. A
finished run's trace is also written gzipped (``bo_*.csv.gz``, a quarter of the size, byte
for byte the same at every rewrite): that copy is committed, the loop's own ``.csv`` and the
checkpoints are not, and a clone without the ``.csv`` reads the ``.gz``.
Every invocation rewrites, from the runs that exist:

- ``<out>/bo_high_dim.csv``: per function and model, the best true value at each of
  ``--report-steps`` over the seeds that reached it (mean, sd, per seed) and the mean time
  per step over observation counts n < 200, 200 <= n < 500 and n >= 500;
- ``<out>/bo_high_dim.md``: the same as Markdown tables (best values; time per step
  against n, with each model's ratio to the exact GP's);
- ``<out>/bo_high_dim.json``: the settings and the machine.

Usage: ``python benchmarks/bo_high_dim.py --resume [--functions hartmann6] [--models exact]``
(several processes may share ``--out`` if their ``--functions`` differ; ``--processes N``
runs N runs at a time, one torch thread each, e.g. on a many-core machine;
``--summarize-only`` runs nothing).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from streamgp.loops.experiments import run_bo_experiment
from streamgp.utils.machine import machine_info

FUNCTIONS = ("hartmann6", "ackley10", "levy10", "rosenbrock10", "styblinskitang20")
MODELS = ("exact", "wiski", "wiski-additive", "softki", "osvgp")
#: Options beyond the registry's defaults: SoftKI's points follow the search (issue 35).
MODEL_OPTIONS = {"softki": {"moving_points": True}}
#: Observation-count bins of the time-per-step table (the target: cheaper from n = 500).
N_BINS = ((0, 200), (200, 500), (500, None))
#: The table's loop settings (``--steps`` and ``--fit-every`` default to STEPS, FIT_EVERY).
ACQUISITION, Q, STEPS, FIT_EVERY = "qlogei", 3, 200, 5


def num_init(dim: int) -> int:
    r"""The initial design's size: ``2 d`` points."""
    return 2 * dim


def parse_function(spec: str) -> tuple[str, int]:
    r"""``"levy10"`` -> ``("levy", 10)``."""
    match = re.fullmatch(r"([a-z]+)(\d+)", spec)
    if match is None:
        raise ValueError(f"--functions entries look like 'levy10', got {spec!r}.")
    return match.group(1), int(match.group(2))


def run_one(spec: str, model: str, trial: int, args: argparse.Namespace) -> None:
    function, dim = parse_function(spec)
    torch.set_num_threads(args.threads)
    run_bo_experiment(
        function,
        models=[model],
        acquisition=ACQUISITION,
        steps=args.steps,
        trials=1,
        first_trial=trial,
        dim=dim,
        q=Q,
        num_init=num_init(dim),
        fit_every=args.fit_every,
        model_options={model: MODEL_OPTIONS[model]} if model in MODEL_OPTIONS else None,
        out=run_directory(args.out, spec, model, trial),
        resume=args.resume,
        progress=False,
        plots=False,
    )


def run_directory(out: Path, spec: str, model: str, trial: int) -> Path:
    return out / "runs" / f"{spec}_{model}_{trial}"


def traces(directory: Path) -> list[Path]:
    r"""A run's per-step traces: the loop's ``bo_*.csv``, else their committed ``.csv.gz``."""
    return sorted(directory.glob("bo_*.csv")) or sorted(directory.glob("bo_*.csv.gz"))


def finished(out: Path, spec: str, model: str, trial: int, steps: int) -> bool:
    r"""Whether the run's trace already reaches ``steps``."""
    paths = traces(run_directory(out, spec, model, trial))
    return any(pd.read_csv(path)["step"].max() >= steps for path in paths)


def read_runs(out: Path) -> pd.DataFrame:
    frames = []
    for directory in sorted(path for path in (out / "runs").glob("*") if path.is_dir()):
        for path in traces(directory):
            frame = pd.read_csv(path)
            frame["function"] = directory.name.split("_")[0]
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def compress_finished_traces(out: Path, steps: int) -> None:
    r"""Write ``bo_*.csv.gz`` beside each finished run's ``bo_*.csv`` (the committed copy;
    no timestamp in the header, so an unchanged trace gives the same bytes)."""
    for path in sorted((out / "runs").glob("*/bo_*.csv")):
        text = path.read_bytes()
        if pd.read_csv(path)["step"].max() < steps:
            continue
        target = path.with_name(path.name + ".gz")
        packed = gzip.compress(text, compresslevel=9, mtime=0)
        if not target.exists() or target.read_bytes() != packed:
            target.write_bytes(packed)


def summarize(results: pd.DataFrame, report_steps: list[int]) -> pd.DataFrame:
    rows = []
    for (spec, model), frame in results.groupby(["function", "model"], sort=False):
        row: dict = {"function": spec, "model": model, "seeds": frame["trial"].nunique()}
        for step in report_steps:
            values = frame[frame["step"] == step].sort_values("trial")["best_value"].to_numpy()
            row[f"best@{step} mean"] = values.mean() if len(values) else np.nan
            row[f"best@{step} sd"] = values.std(ddof=1) if len(values) > 1 else np.nan
            row[f"best@{step} seeds"] = len(values)
        stepped = frame[frame["step"] > 0]
        for low, high in N_BINS:
            inside = stepped["num_observations"] >= low
            if high is not None:
                inside &= stepped["num_observations"] < high
            row[_bin_label(low, high)] = stepped[inside]["step_time"].mean()
        row["steps done (min over seeds)"] = int(frame.groupby("trial")["step"].max().min())
        rows.append(row)
    return pd.DataFrame(rows)


def _bin_label(low: int, high: int | None) -> str:
    return f"s/step n>={low}" if high is None else f"s/step {low}<=n<{high}"


#: What each results directory's ``wiski`` runs are (the table, and its re-run of that
#: column after ``WiskiGP`` came to evaluate its kernel exactly at d >= 4).
WISKI_NOTES = {
    "bo_high_dim": "The `wiski` runs were made while `WiskiGP` interpolated its kernel at "
    "d >= 4 (SKI, the kernel factored per axis); it now evaluates the kernel exactly "
    "(`bo_step_replay.md` times steps with the current code; `../bo_high_dim_exact_kernel` "
    "re-runs the column).",
    "bo_high_dim_exact_kernel": "The `wiski` column of `../bo_high_dim/bo_high_dim.md` "
    "again, with `WiskiGP` evaluating its kernel exactly at d >= 4; the other models' "
    "runs are there.",
}


def markdown(summary: pd.DataFrame, report_steps: list[int], note: str = "") -> str:
    lines = [
        "Best true value (mean ± sd over the seeds that reached the step; seeds). " + note,
        "",
    ]
    head = " | ".join(f"step {s}" for s in report_steps)
    lines += [f"| function | model | {head} |", "|---|---|" + "---|" * len(report_steps)]
    for _, row in summary.iterrows():
        cells = []
        for s in report_steps:
            mean, sd, k = row[f"best@{s} mean"], row[f"best@{s} sd"], row[f"best@{s} seeds"]
            spread = "" if np.isnan(sd) else f" ± {sd:.2g}"
            cells.append("" if k == 0 else f"{mean:.4g}{spread} ({k})")
        lines.append(f"| {row['function']} | {row['model']} | " + " | ".join(cells) + " |")
    bins = [_bin_label(low, high) for low, high in N_BINS]
    lines += [
        "",
        "Seconds per step by observation count n (ratio to the exact GP's). The runs ran hours",
        "apart beside different jobs, so these times vary 2-4x between seeds of one model;",
        "`bo_step_replay.py` times steps at n >= 600 from the runs' checkpoints with the models",
        "alternated (`bo_step_replay.md`).",
        "",
    ]
    lines += [f"| function | model | {' | '.join(bins)} |", "|---|---|" + "---|" * len(bins)]
    for spec, frame in summary.groupby("function", sort=False):
        exact = frame[frame["model"] == "exact"]
        for _, row in frame.iterrows():
            cells = []
            for b in bins:
                value = row[b]
                ratio = exact[b].iloc[0] if len(exact) else np.nan
                cells.append(
                    ""
                    if np.isnan(value)
                    else f"{value:.2f}" + ("" if np.isnan(ratio) else f" ({value / ratio:.2f}x)")
                )
            lines.append(f"| {spec} | {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_summary(args: argparse.Namespace) -> None:
    compress_finished_traces(args.out, args.steps)
    results = read_runs(args.out)
    if results.empty:
        return
    summary = summarize(results, args.report_steps)
    summary.to_csv(args.out / "bo_high_dim.csv", index=False)
    note = WISKI_NOTES.get(args.out.name, "")
    (args.out / "bo_high_dim.md").write_text(markdown(summary, args.report_steps, note))
    settings = {
        key: value
        for key, value in vars(args).items()
        if key not in ("out", "resume", "summarize_only")
    }
    settings.update(acquisition=ACQUISITION, q=Q, num_init="2 d", model_options=MODEL_OPTIONS)
    (args.out / "bo_high_dim.json").write_text(
        json.dumps({"settings": settings, "machine": machine_info()}, indent=2, default=str)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default=",".join(FUNCTIONS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--first-trial", type=int, default=0)
    parser.add_argument("--fit-every", type=int, default=FIT_EVERY)
    parser.add_argument("--report-steps", default="50,100,200")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--processes", type=int, default=1, help="runs at a time")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "bo_high_dim"
    )
    args = parser.parse_args()
    args.report_steps = [int(s) for s in args.report_steps.split(",")]
    args.functions = args.functions.split(",")
    args.models = args.models.split(",")
    for spec in args.functions:
        parse_function(spec)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [
        (spec, model, trial)
        for trial in range(args.first_trial, args.first_trial + args.trials)
        for spec in args.functions
        for model in args.models
    ]
    if args.resume:
        runs = [run for run in runs if not finished(args.out, *run, args.steps)]
    if args.summarize_only:
        runs = []
    if args.processes > 1:
        with ProcessPoolExecutor(max_workers=args.processes) as pool:
            for done in as_completed([pool.submit(run_one, *run, args) for run in runs]):
                done.result()
                write_summary(args)
    else:
        for run in runs:
            run_one(*run, args)
            write_summary(args)
    write_summary(args)


if __name__ == "__main__":
    main()
