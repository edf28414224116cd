r"""One table of the online protocol's results, merged from several runs of its benchmarks.

The online-regression and -classification benchmarks are long on a CPU, so their
trials and models are often run separately (``--models``, ``--first-trial``) into
different directories. This script reads their curves (``online_*.csv[.gz]``; a
later file replaces an earlier one's run of the same dataset, model and trial) and
writes, per dataset and model, over trials (mean and sample std):

- the test metrics at the evaluation nearest ``--at`` observations (the exact GPs'
  cap; a capped run gives its last evaluation, see
  :func:`streamgp.loops.stream.evaluations_nearest`) and at the end of the stream;
- the mean time per streamed step (ms), the number of trials, and whether the runs
  stopped before the dataset's longest ones (``stopped_early``: a capped exact GP).

Outputs: ``<out>/stream_table.csv``, ``.json`` (with the inputs), ``.md`` (a
Markdown table: ``mean ± std`` of RMSE / NLL, or accuracy / NLL) and, per dataset,
``stream_<dataset>.png``: the merged curves, mean and band over trials (like the
paper's Figures 3 and 4).

Usage:
    ``python benchmarks/stream_table.py results/a/online_regression.csv.gz
    results/b/online_regression.csv.gz --at 2000 --out results/online_regression_table``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from streamgp.loops.stream import STREAM_MODELS, evaluations_nearest, merge_runs
from streamgp.plotting import plot_stream


def table(curves: pd.DataFrame, at: int) -> pd.DataFrame:
    r"""Per dataset and model: metrics at ``at`` and at the end (mean, std), ms per step."""
    metrics = [m for m in ("test_rmse", "test_accuracy", "test_nll") if m in curves]
    key = ["dataset", "model"]
    at_n = evaluations_nearest(curves, at).groupby(key)
    end = evaluations_nearest(curves, int(curves["num_observations"].max())).groupby(key)
    step_ms = 1e3 * curves[curves["step"] > 0].groupby(key)["step_time"].mean()
    rows = []
    for (dataset, model), runs in at_n:
        row = {"dataset": dataset, "model": model, "trials": len(runs)}
        for label, frame in (("at", runs), ("end", end.get_group((dataset, model)))):
            row[f"n_{label}"] = int(frame["num_observations"].median())
            for metric in metrics:
                row[f"{metric}_{label}_mean"] = frame[metric].mean()
                row[f"{metric}_{label}_std"] = frame[metric].std() if len(frame) > 1 else 0.0
        row["ms_per_step"] = step_ms.get((dataset, model), float("nan"))
        rows.append(row)
    # Datasets in the order first read, models in the protocol's order.
    datasets = list(dict.fromkeys(curves["dataset"]))
    rank = {model: index for index, model in enumerate(STREAM_MODELS)}
    position = {"dataset": datasets.index, "model": rank.get}
    summary = pd.DataFrame(rows)
    longest = summary.groupby("dataset")["n_end"].transform("max")
    summary["stopped_early"] = summary["n_end"] < longest  # e.g. an exact GP at its cap
    summary = summary.sort_values(
        ["dataset", "model"], key=lambda column: column.map(position[column.name])
    )
    return summary.reset_index(drop=True)


def markdown(summary: pd.DataFrame) -> str:
    r"""Markdown rows: dataset, model, trials, metrics at ``at`` and at the end, ms/step."""
    first = "test_rmse" if "test_rmse_at_mean" in summary else "test_accuracy"

    def cell(row, label):
        if label == "end" and row["stopped_early"]:
            return "— (stopped at the cap)"
        values = [
            f"{row[f'{metric}_{label}_mean']:.3f} ± {row[f'{metric}_{label}_std']:.3f}"
            for metric in (first, "test_nll")
        ]
        return f"{' / '.join(values)} (n = {row[f'n_{label}']:,})"

    lines = [
        f"| dataset | model | trials | at the cap ({first[5:]} / NLL) | end | ms/step |",
        "|---|---|---:|---|---|---:|",
    ]
    for _, row in summary.iterrows():
        # No streamed steps: a capped exact GP whose pretraining set already exceeds its cap.
        time = "—" if pd.isna(row["ms_per_step"]) else f"{row['ms_per_step']:.1f}"
        lines.append(
            f"| {row['dataset']} | {row['model']} | {row['trials']} | {cell(row, 'at')} "
            f"| {cell(row, 'end')} | {time} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curves", nargs="+", type=Path, help="online_*.csv[.gz] files, in order")
    parser.add_argument("--at", type=int, default=2000, help="compare at this n (exact GPs' cap)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    curves = merge_runs([pd.read_csv(path) for path in args.curves])
    summary = table(curves, args.at)
    args.out.mkdir(parents=True, exist_ok=True)
    summary.to_csv(args.out / "stream_table.csv", index=False)
    payload = {
        "inputs": [str(path) for path in args.curves],
        "at": args.at,
        "std": "sample standard deviation over trials (0 for one trial)",
        "results": summary.to_dict(orient="records"),
    }
    (args.out / "stream_table.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / "stream_table.md").write_text(markdown(summary))
    for dataset, frame in curves.groupby("dataset", sort=False):
        plot_stream(frame, args.out / f"stream_{dataset}.png", title=dataset)
    print(markdown(summary))


if __name__ == "__main__":
    main()
