r"""Streaming variational baselines on real data, and SVDGP vs SVGP at equal time.

Every model runs the WISKI paper's online protocol
(:class:`streamgp.loops.stream.StreamingLoop`): seeded 90/10 split, inputs scaled to
``[-1, 1]``, targets standardized, pretraining on 5% of the training set (200 Adam
steps), then the rest streamed **one point per step with one optimizer step per
point**; learning rates of the paper's Table C.1 (as ``online_regression.py``).
Test RMSE and NLL (observation noise included) are in standardized target units; the
time per step is the absorb + optimizer step, evaluation excluded.

Model variants (``--models``):

- ``wiski``: the reference (learned 2-D projection, 16 x 16 grid);
- ``osvgp``: O-SVGP (Bui et al. 2017, ``beta = 1e-3``), ``M = 256`` inducing points;
- ``osgpr``: O-SGPR, ``M = 256`` (Bui et al.'s random replacement of inducing points);
- ``osgpr-oips``: O-SGPR whose inducing points are chosen by OIPS (``rho``:
  ``--oips-rho``, at most 256 points);
- ``svdgp``: SVDGP (Cheng & Boots 2017), decoupled bases, ``M_beta = 128``
  covariance points and a mean basis that grows with the stream up to ``M_alpha = 2048``;
  minibatches of ``N_m = 256``, and the KL's mean term estimated from ``N_c = 256``
  sampled columns of ``K_alpha`` (the paper's ``O(N_m M_alpha)`` estimator);
- ``svdgp-exact-kl``: the same with the exact KL mean term (``O(M_alpha^2)`` per step;
  affordable at these ``M_alpha``), which separates the decoupling from the estimator;
- ``svgp``: the same ``DecoupledSVGP`` code with *coupled* bases
  ``M_alpha = M_beta = 256`` (the standard SVGP ELBO), the paper's ``svi`` baseline;
- ``local``: local GPs (``n_max = 256``).

**SVDGP vs SVGP at equal time budget** (the analogue of the SVDGP paper's Table 2,
which compares decoupled ``M_alpha >> M_beta`` with coupled SVGP at a similar cost per
iteration): ``svdgp``, ``svdgp-exact-kl``, ``svgp`` and ``osvgp`` stream the same
points; each run's test
metrics are evaluated ``--num-evals`` times along the stream, with the cumulative
*streaming* time (pretraining excluded) at each evaluation. The budget ``T`` is the
total streaming time of the fastest of them, so every model has a reading at
``T``; each model is read at its last evaluation with streaming time ``<= T`` (and
likewise at ``T / 2``). The table reports RMSE, NLL and how many points each model
had absorbed by then: given the same seconds, which model predicts better.

Writes ``<out>/streaming_baselines.csv`` (final metrics and time per step per
dataset and model), ``streaming_baselines_equal_time.csv``,
``streaming_baselines_curves.csv`` (all evaluations) and ``streaming_baselines.json``
(settings, the machine and load, both tables). A run with ``--max-stream`` or fewer
than 3 trials is marked ``"reduced": true``.

Usage: ``python benchmarks/streaming_baselines.py [--max-stream 1000] [--trials 1]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from streamgp.datasets import load_streaming_split
from streamgp.loops.stream import StreamConfig, StreamingLoop, summarize_stream
from streamgp.utils.machine import machine_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from online_regression import LEARNING_RATES  # noqa: E402  (Table C.1, one home)

DATASETS = ("powerplant", "elevators")
#: Variant -> (protocol model, StreamConfig overrides).
VARIANTS: dict[str, tuple[str, dict]] = {
    "wiski": ("wiski", {}),
    "osvgp": ("osvgp", {}),
    "osgpr": ("osgpr", {}),
    "osgpr-oips": ("osgpr", {"inducing": "oips"}),
    "svdgp": (
        "svdgp",
        {"model_options": {"svdgp": {"max_mean_basis": 2048, "max_covar_basis": 128}}},
    ),
    "svdgp-exact-kl": (
        "svdgp",
        {
            "model_options": {
                "svdgp": {"max_mean_basis": 2048, "max_covar_basis": 128, "kl_columns": 2048}
            }
        },
    ),
    "svgp": (
        "svdgp",
        {"model_options": {"svdgp": {"max_mean_basis": 256, "max_covar_basis": 256}}},
    ),
    "local": ("local", {}),
}
#: The equal-time comparison.
EQUAL_TIME = ("svdgp", "svdgp-exact-kl", "svgp", "osvgp")


def basis_sizes(loop: StreamingLoop) -> dict[str, int | None]:
    r"""Final sizes of the model's bases / inducing set (``None`` where not defined)."""
    model = getattr(loop.learner, "model", None)
    if model is None:
        return {"basis_mean": None, "basis_covar": None}
    if hasattr(model, "mean_basis"):
        return {"basis_mean": len(model.mean_basis), "basis_covar": len(model.covar_basis)}
    if hasattr(model, "inducing_points"):
        size = len(model.inducing_points)
        return {"basis_mean": size, "basis_covar": size}
    return {"basis_mean": None, "basis_covar": None}


def equal_time_table(curves: pd.DataFrame, fractions=(0.5, 1.0)) -> pd.DataFrame:
    r"""Read the ``EQUAL_TIME`` models at equal streaming time (see the module docstring)."""
    rows = []
    evaluated = curves.dropna(subset=["test_rmse"])
    for (dataset, trial), frame in evaluated.groupby(["dataset", "trial"], sort=False):
        frame = frame[frame["model"].isin(EQUAL_TIME)]
        if frame["model"].nunique() < 2:
            continue
        totals = frame.groupby("model")["stream_time"].max()
        budget = totals.min()
        for fraction in fractions:
            for model in [m for m in EQUAL_TIME if m in totals]:
                runs = frame[
                    (frame["model"] == model) & (frame["stream_time"] <= fraction * budget)
                ]
                last = runs.sort_values("step").iloc[-1]
                rows.append(
                    {
                        "dataset": dataset,
                        "trial": trial,
                        "budget_fraction": fraction,
                        "budget_s": fraction * budget,
                        "model": model,
                        "read_at_s": last["stream_time"],
                        "points_streamed": int(last["step"]),
                        "num_observations": int(last["num_observations"]),
                        "test_rmse": last["test_rmse"],
                        "test_nll": last["test_nll"],
                        "total_stream_time_s": totals[model],
                    }
                )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--models", default=",".join(VARIANTS))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-stream", type=int, default=None, help="reduced runs only")
    parser.add_argument("--pretrain-steps", type=int, default=200)
    parser.add_argument("--num-evals", type=int, default=40)
    parser.add_argument("--oips-rho", type=float, default=StreamConfig.oips_rho)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--data-dir", default=None, help="default: $STREAMGP_DATA")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    datasets = [name.strip() for name in args.datasets.split(",") if name.strip()]
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [m for m in models if m not in VARIANTS] + [
        d for d in datasets if d not in LEARNING_RATES
    ]
    if unknown:
        raise SystemExit(f"unknown models/datasets {unknown}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    frames, summaries, sizes, settings = [], [], [], {}
    for dataset in datasets:
        pretrain_lr, lr = LEARNING_RATES[dataset]
        base = StreamConfig(
            pretrain_steps=args.pretrain_steps,
            pretrain_lr=pretrain_lr,
            lr=lr,
            oips_rho=args.oips_rho,
        )
        settings[dataset] = {m: asdict(replace(base, **VARIANTS[m][1])) for m in models}
        for trial in range(args.trials):
            split = load_streaming_split(dataset, seed=trial, data_dir=args.data_dir)
            for name in models:
                protocol_model, overrides = VARIANTS[name]
                loop = StreamingLoop(
                    split,
                    protocol_model,
                    config=replace(base, **overrides),
                    num_evals=args.num_evals,
                    max_stream=args.max_stream,
                    seed=trial,
                )
                start = time.perf_counter()
                history = loop.run(progress=False)
                history = history.assign(
                    model=name,
                    trial=trial,
                    dataset=dataset,
                    stream_time=history["cumulative_time"] - history.loc[0, "step_time"],
                )
                frames.append(history)
                sizes.append(
                    {"dataset": dataset, "model": name, "trial": trial, **basis_sizes(loop)}
                )
                final = history.dropna(subset=["test_rmse"]).iloc[-1]
                print(
                    f"{dataset} trial {trial} {name:10s} rmse {final['test_rmse']:.4f} "
                    f"nll {final['test_nll']:.4f} step {1e3 * history['step_time'][1:].mean():.1f}"
                    f" ms ({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
            curves = pd.concat(frames, ignore_index=True)
            summaries = [
                summarize_stream(frame).assign(dataset=d)
                for d, frame in curves.groupby("dataset", sort=False)
            ]
            _write(args, curves, summaries, sizes, settings, datasets, models, started, load_before)


def _write(args, curves, summaries, sizes, settings, datasets, models, started, load_before):
    summary = pd.concat(summaries, ignore_index=True)
    size_table = (
        pd.DataFrame(sizes).groupby(["dataset", "model"], sort=False).mean(numeric_only=True)
    )
    summary = summary.join(size_table[["basis_mean", "basis_covar"]], on=["dataset", "model"])
    equal = equal_time_table(curves)
    reduced = args.max_stream is not None or args.trials < 3
    stem = args.out / "streaming_baselines"
    summary.assign(reduced=reduced).to_csv(f"{stem}.csv", index=False)
    equal.assign(reduced=reduced).to_csv(f"{stem}_equal_time.csv", index=False)
    # The evaluations only (every step's time is summarised in the main table).
    curves.dropna(subset=["test_rmse"]).to_csv(f"{stem}_curves.csv", index=False)
    payload = {
        "script": "benchmarks/streaming_baselines.py",
        "reduced": reduced,
        "protocol": "WISKI paper section 5.1 (streamgp.loops.stream.StreamingLoop), "
        "one point and one optimizer step per arrival",
        "units": "test RMSE and NLL in standardized target units; times in seconds",
        "equal_time_definition": "budget T = total streaming time (pretraining excluded) of "
        f"the fastest of {list(EQUAL_TIME)}; each model read at its last evaluation with "
        "streaming time <= fraction * T",
        "settings": {
            "datasets": datasets,
            "models": models,
            "trials": args.trials,
            "max_stream": args.max_stream,
            "num_evals": args.num_evals,
            "per_dataset_and_model": settings,
        },
        "machine": {
            **machine_info(dtype="float64"),
            "date_utc_start": started,
            "date_utc_end": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "results": summary.to_dict(orient="records"),
        "equal_time": equal.to_dict(orient="records"),
    }
    Path(f"{stem}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
