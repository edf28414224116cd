r"""Time per BO step at n >= 500, replayed from the d = 6-20 table's checkpoints, models alternated.

The time column of ``bo_high_dim.py``'s table comes from runs hours apart, sharing the
cores with different jobs: the same model on the same function differs 2-4x between seeds.
This script measures the same quantity, time per step from n = 500 on, so that models can be
compared: for each function and seed it loads every model's finished run (its checkpoint
after step 200, n = 2 d + 600 observations), runs ``--steps`` more steps (5 by default: one
warm-started refit, as the table's ``fit_every = 5``, and five acquisitions) with the code
of this tree, and repeats that ``--repeats`` times with the models' order alternated, so
that all models of a row share the machine's state. The checkpoints are only read.

Results: ``<out>/bo_step_replay.{csv,json,md}`` (per function, seed and model: the minimum
over the repeats of the mean time per step, its fit and acquisition parts, and the ratio to
the exact GP's).

Usage: ``python benchmarks/bo_step_replay.py [--functions levy10] [--seeds 0 1]
[--models exact wiski wiski-additive] [--add] [--table-of wiski=DIR]`` (``--add`` keeps the
results file's rows of the functions and seeds not replayed now, e.g. to add seeds finished
since; ``--table-of MODEL=DIR`` reads that model's runs from another table, such as the
re-run of the ``wiski`` column in ``results/bo_high_dim_exact_kernel``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
from bo_high_dim import (
    ACQUISITION,
    FIT_EVERY,
    FUNCTIONS,
    MODEL_OPTIONS,
    STEPS,
    Q,
    finished,
    num_init,
    parse_function,
    run_directory,
)

from streamgp.loops import BayesOptLoop, make_test_function
from streamgp.utils.machine import machine_info

HERE = Path(__file__).parent


def checkpoint_of(table: Path, spec: str, model: str, seed: int) -> Path | None:
    r"""The finished run's checkpoint (None while the run is missing or still running)."""
    if not finished(table, spec, model, seed, STEPS):
        return None
    paths = sorted((run_directory(table, spec, model, seed) / "checkpoints").glob("*.pt"))
    return paths[0] if paths else None


def tables_of(models: list[str], table: Path, entries: list[str]) -> dict[str, Path]:
    r"""Each model's table: ``table``, or ``DIR`` for a ``MODEL=DIR`` entry.

    Example:
        >>> tables_of(["exact", "wiski"], Path("a"), ["wiski=b"])
        {'exact': PosixPath('a'), 'wiski': PosixPath('b')}
    """
    tables = dict.fromkeys(models, table)
    for entry in entries:
        model, _, directory = entry.partition("=")
        if model not in tables or not directory:
            raise ValueError(f"--table-of {entry!r}: expected MODEL=DIR with MODEL in --models.")
        tables[model] = Path(directory)
    return tables


def replay(spec: str, model: str, seed: int, checkpoint: Path, steps: int) -> dict:
    r"""Load the run's checkpoint, run ``steps`` more steps, return their mean times."""
    function, dim = parse_function(spec)
    loop = BayesOptLoop(
        make_test_function(function, dim=dim),
        model=model,
        acquisition=ACQUISITION,
        q=Q,
        num_init=num_init(dim),
        fit_every=FIT_EVERY,
        model_options=MODEL_OPTIONS.get(model),
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as scratch:  # never touch the table's own files
        copy = Path(scratch) / checkpoint.name
        shutil.copy(checkpoint, copy)
        loop.load(copy)
    start_step = len(loop.history) - 1
    start = time.perf_counter()
    history = loop.run(start_step + steps)
    wall = time.perf_counter() - start
    new = history.iloc[-steps:]
    return {
        "n_start": int(history["num_observations"].iloc[-steps - 1]),
        "steps": steps,
        "refits": int((new["fit_time"] > 0).sum()),
        "s_per_step": wall / steps,
        "fit_s_per_step": float(new["fit_time"].mean()),
        "acquisition_s_per_step": float(new["acquisition_time"].mean()),
    }


def markdown(table: pd.DataFrame) -> str:
    lines = [
        "| function | seed | n | model | s/step | fit s/step | acquisition s/step | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        lines.append(
            f"| {row.function} | {row.seed} | {row.n_start} | {row.model} | "
            f"{row.s_per_step:.2f} | {row.fit_s_per_step:.2f} | "
            f"{row.acquisition_s_per_step:.2f} | {row.ratio_to_exact:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", nargs="+", default=list(FUNCTIONS))
    parser.add_argument("--models", nargs="+", default=["exact", "wiski", "wiski-additive"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=FIT_EVERY)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--table", type=Path, default=HERE / "results" / "bo_high_dim")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bo_high_dim")
    parser.add_argument(
        "--table-of",
        nargs="+",
        default=[],
        metavar="MODEL=DIR",
        help="read MODEL's runs from the table in DIR instead of --table",
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the results file's other (function, seed) rows, e.g. for seeds finished since",
    )
    args = parser.parse_args()
    if "exact" not in args.models:
        raise ValueError("--models must include 'exact', the reference of the ratios.")
    tables = tables_of(args.models, args.table, args.table_of)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows = []
    for spec in args.functions:
        for seed in args.seeds:
            checkpoints = {m: checkpoint_of(tables[m], spec, m, seed) for m in args.models}
            if any(path is None for path in checkpoints.values()):
                missing = [m for m, path in checkpoints.items() if path is None]
                print(f"{spec} seed {seed}: no finished run of {missing}; skipped", flush=True)
                continue
            for repeat in range(args.repeats):
                order = args.models if repeat % 2 == 0 else args.models[::-1]
                for model in order:
                    result = replay(spec, model, seed, checkpoints[model], args.steps)
                    rows.append({"function": spec, "seed": seed, "model": model,
                                 "repeat": repeat, **result})  # fmt: skip
                    print(rows[-1], flush=True)
    results = args.out / "bo_step_replay.json"
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    invocations = [{"settings": settings, "machine": machine_info()}]
    if args.add and results.exists():  # the earlier rows of what was not measured now
        earlier = json.loads(results.read_text())
        measured = {(row["function"], row["seed"]) for row in rows}
        rows = [r for r in earlier["runs"] if (r["function"], r["seed"]) not in measured] + rows
        invocations = earlier["invocations"] + invocations
    runs = pd.DataFrame(rows)
    best = runs.loc[runs.groupby(["function", "seed", "model"])["s_per_step"].idxmin()]
    exact = best[best.model == "exact"].set_index(["function", "seed"])["s_per_step"]
    best = best.assign(
        ratio_to_exact=[
            row.s_per_step / exact[(row.function, row.seed)] for row in best.itertuples()
        ]
    ).drop(columns="repeat")
    order = {spec: i for i, spec in enumerate(FUNCTIONS)}
    best = best.sort_values(
        ["function", "seed", "model"], key=lambda c: c.map(order) if c.name == "function" else c
    )
    args.out.mkdir(parents=True, exist_ok=True)
    best.to_csv(args.out / "bo_step_replay.csv", index=False)
    (args.out / "bo_step_replay.md").write_text(
        "Time per BO step replayed from the table's checkpoints (minimum over "
        f"{args.repeats} repeats of {args.steps} steps, models alternated; ratio to the "
        "exact GP's):\n\n" + markdown(best)
    )
    results.write_text(json.dumps({"invocations": invocations, "runs": rows}, indent=1))
    print(markdown(best))


if __name__ == "__main__":
    main()
