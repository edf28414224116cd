r"""BO with online SoftKI: fixed interpolation points against points that follow the search.

SoftKI's posterior mean is a convex combination of its interpolation points' values and
its variance is convex in the softmax weights, so qLogEI / qUCB peak at interpolation
points: with the ``softki`` entry's fixed Sobol design the loop can only rank that
design (README, "SoftKI in BO"). The entry's ``moving_points=True`` draws a fresh set at
each refit (:func:`streamgp.models.registry.points_around_incumbent`: half in a box of
side 0.2 around the incumbent, a quarter at the data, a quarter over the cube). This
script measures, per proposal, its distance to the nearest point of the set the
acquisition saw and to the build-time Sobol design, whether it repeats an earlier
proposal, and the best true value, for ``softki`` (fixed), ``softki-moving`` and
``exact`` (``SingleTaskGP``).

Settings: qLogEI, q = 3, 5 random initial points, refit every ``--fit-every`` steps,
``--steps`` steps, seeds ``0..--trials-1`` (trial ``t``: loop seed ``t`` for every
model), softki ``m = --num-inducing`` at the registry's default temperature; 1 torch
thread. Writes ``<out>/softki_moving_points.{csv,json,md}`` (``csv``: one row per
proposal).

Usage:
    ``python benchmarks/softki_moving_points.py`` (Hartmann-3 and Styblinski-Tang-2,
    3 seeds, 30 steps) or ``--quick`` (3 steps, 1 seed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from torch.quasirandom import SobolEngine

from streamgp.loops import AcquisitionOptions, BayesOptLoop, make_test_function
from streamgp.utils.machine import machine_info

FUNCTIONS = ("hartmann:3", "styblinskitang:2")
MODELS = {
    "softki": ("softki", {}),
    "softki-moving": ("softki", {"moving_points": True}),
    "exact": ("exact", {}),
}
#: A proposal this close (unit cube) to an earlier one counts as a repeat.
REPEAT_TOL = 1e-3


class RecordingLoop(BayesOptLoop):
    r"""A BO loop that records each proposal and the interpolation points it came from."""

    def __init__(self, *args, build_points: torch.Tensor | None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.build_points = build_points
        self.proposals: list[dict] = []
        self._seen: torch.Tensor | None = None

    def _evaluate(self, X_unit):
        noisy, true = super()._evaluate(X_unit)
        if self.surrogate is not None:  # a proposal (not the initial design)
            model = self.surrogate.model
            points = getattr(model, "inducing_points", None)
            for x, f in zip(X_unit, true.squeeze(-1), strict=True):
                row = {"step": len(self.history), "true_value": f.item()}
                if points is not None:
                    row["dist_current_set"] = torch.cdist(x[None], points).min().item()
                    row["dist_build_set"] = torch.cdist(x[None], self.build_points).min().item()
                row["repeat"] = bool(
                    self._seen is not None and torch.cdist(x[None], self._seen).min() < REPEAT_TOL
                )
                self.proposals.append(row)
        self._seen = X_unit if self._seen is None else torch.cat([self._seen, X_unit])
        return noisy, true


def run(function: str, dim: int, label: str, trial: int, args) -> tuple[pd.DataFrame, list]:
    name, options = MODELS[label]
    options = {**options, "num_inducing": args.num_inducing} if name == "softki" else options
    build_points = None
    if name == "softki":  # the build-time design: the entry's Sobol points (seed 0)
        engine = SobolEngine(dim, scramble=True, seed=0)
        build_points = engine.draw(args.num_inducing, dtype=torch.float64)
    loop = RecordingLoop(
        make_test_function(function, dim=dim),
        model=name,
        acquisition="qlogei",
        q=3,
        num_init=5,
        fit_every=args.fit_every,
        acquisition_options=AcquisitionOptions(),
        model_options=options,
        seed=trial,
        build_points=build_points,
    )
    start = time.perf_counter()
    history = loop.run(args.steps, progress=False)
    elapsed = time.perf_counter() - start
    meta = {"function": f"{function}-{dim}", "model": label, "trial": trial}
    rows = [{**meta, **row} for row in loop.proposals]
    summary = {
        **meta,
        "best_value": history["best_value"].iloc[-1],
        "best_value_at_half": history["best_value"].iloc[len(history) // 2],
        "time_s": elapsed,
    }
    return pd.DataFrame(rows), summary


def markdown(table: pd.DataFrame, info: dict, args) -> str:
    lines = [
        "| function | model | seeds | best true value (mean ± sd) | proposals repeating an "
        "earlier one | median distance to the set the acquisition saw | median distance to "
        "the build-time set | s / run |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in table.itertuples():
        lines.append(
            f"| {row.function} | {row.model} | {row.seeds} | {row.best_mean:.3f} ± "
            f"{row.best_sd:.3f} | {100 * row.repeat_fraction:.0f}% | {row.dist_current:.3g} "
            f"| {row.dist_build:.3g} | {row.time_s:.0f} |"
        )
    lines += [
        "",
        f"Machine: {info['platform']}, {info['cpu_count']} CPUs, torch {info['torch']} "
        f"({info['torch_threads']} thread), float64; load average at the end "
        f"{', '.join(f'{v:.2f}' for v in info['load_average'])}. qLogEI, q = 3, 5 initial "
        f"points, {args.steps} steps, refit every {args.fit_every} steps, softki m = "
        f"{args.num_inducing}. Distances in the unit cube; a repeat is within {REPEAT_TOL:g} "
        "of an earlier proposal.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default=",".join(FUNCTIONS), help="name:dim,...")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--fit-every", type=int, default=5)
    parser.add_argument("--num-inducing", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="3 steps, 1 seed")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "softki_moving_points"
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.trials = 3, 1
        args.out = args.out / "quick"
    torch.set_num_threads(1)
    frames, summaries = [], []
    for item in filter(None, args.functions.split(",")):
        function, _, dim = item.partition(":")
        for label in filter(None, args.models.split(",")):
            for trial in range(args.trials):
                rows, summary = run(function, int(dim), label, trial, args)
                frames.append(rows)
                summaries.append(summary)
                print(summary, flush=True)
    proposals = pd.concat(frames, ignore_index=True)
    runs = pd.DataFrame(summaries)
    by = ["function", "model"]
    table = runs.groupby(by, sort=False).agg(
        seeds=("trial", "nunique"),
        best_mean=("best_value", "mean"),
        best_sd=("best_value", lambda v: v.std(ddof=0)),
        time_s=("time_s", "mean"),
    )
    dist = proposals.groupby(by, sort=False).agg(
        repeat_fraction=("repeat", "mean"),
        dist_current=("dist_current_set", "median"),
        dist_build=("dist_build_set", "median"),
    )
    table = table.join(dist).reset_index()
    info = machine_info(dtype="float64")
    args.out.mkdir(parents=True, exist_ok=True)
    proposals.to_csv(args.out / "softki_moving_points.csv", index=False)
    payload = {
        "settings": {
            "steps": args.steps,
            "trials": args.trials,
            "fit_every": args.fit_every,
            "num_inducing": args.num_inducing,
            "acquisition": "qlogei, q=3, 5 initial points",
            "repeat_tol": REPEAT_TOL,
        },
        "machine": info,
        "runs": runs.to_dict(orient="records"),
        "table": table.to_dict(orient="records"),
    }
    (args.out / "softki_moving_points.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / "softki_moving_points.md").write_text(markdown(table, info, args))
    print(table.to_string(index=False, float_format="%.4g"))


if __name__ == "__main__":
    main()
