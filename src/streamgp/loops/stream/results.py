r"""Tables of streaming results: merge runs, compare at ``n``, summarise per model."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from streamgp.utils.validation import check_count


def merge_runs(curves: Sequence[pd.DataFrame]) -> pd.DataFrame:
    r"""Concatenate curves of several experiments; a later run replaces an earlier one.

    A run is one dataset (if present), model and trial. Long protocols are often run in
    pieces (``first_trial``, a subset of ``models``) or repeated with other settings;
    this gives one frame with each run once, the latest given.

    Example:
        >>> first = pd.DataFrame({"model": ["wiski", "exact"], "trial": 0, "test_rmse": [1.0, 2.0]})
        >>> again = pd.DataFrame({"model": ["wiski"], "trial": 0, "test_rmse": [0.5]})
        >>> merge_runs([first, again])[["model", "test_rmse"]].values.tolist()
        [['exact', 2.0], ['wiski', 0.5]]
    """
    frames = [frame.assign(_source=index) for index, frame in enumerate(curves)]
    merged = pd.concat(frames, ignore_index=True)
    keys = [key for key in ("dataset", "model", "trial") if key in merged]
    latest = merged.groupby(keys)["_source"].transform("max")
    return merged[merged["_source"] == latest].drop(columns="_source").reset_index(drop=True)


def evaluations_nearest(results: pd.DataFrame, num_observations: int) -> pd.DataFrame:
    r"""Per dataset (if present), model and trial: the test evaluation nearest ``num_observations``.

    Curves are evaluated every few steps, so a comparison "at ``n``" (e.g. at the exact
    GP's cap) reads each run's evaluation whose ``num_observations`` is closest to
    ``n``; a run that stopped earlier (a capped exact GP) gives its last evaluation.

    Args:
        results: Curves of :func:`run_stream_experiment` (possibly several datasets).
        num_observations: The ``n`` to compare at.

    Returns:
        One row of ``results`` per run.

    Example:
        >>> curves = pd.DataFrame({"model": "wiski", "trial": 0,
        ...     "num_observations": [100, 150, 200], "test_rmse": [0.5, None, 0.4]})
        >>> evaluations_nearest(curves, 160)["num_observations"].tolist()
        [200]
    """
    check_count(num_observations, "num_observations")
    metric = "test_rmse" if "test_rmse" in results else "test_accuracy"
    evaluated = results.dropna(subset=[metric])
    keys = [key for key in ("dataset", "model", "trial") if key in evaluated]
    distance = (evaluated["num_observations"] - num_observations).abs()
    nearest = distance.groupby([evaluated[key] for key in keys], sort=False).idxmin()
    return evaluated.loc[nearest.to_numpy()].reset_index(drop=True)


def summarize_stream(results: pd.DataFrame) -> pd.DataFrame:
    r"""Per model: final test metrics (mean and std over trials) and mean time per step."""
    metrics = [c for c in ("test_rmse", "test_nll", "test_accuracy") if c in results]
    rows = []
    for model, frame in results.groupby("model", sort=False):
        finals = frame.dropna(subset=metrics[:1]).sort_values("step").groupby("trial").tail(1)
        streamed = frame[frame["step"] > 0]
        row = {"model": model, "trials": finals["trial"].nunique()}
        row["final_n"] = int(finals["num_observations"].max())
        for metric in metrics:
            row[f"{metric}_mean"] = finals[metric].mean()
            row[f"{metric}_std"] = finals[metric].std(ddof=0)
        row["time_per_step_s"] = streamed["step_time"].mean() if len(streamed) else float("nan")
        row["pretrain_time_s"] = frame.loc[frame["step"] == 0, "fit_time"].mean()
        rows.append(row)
    return pd.DataFrame(rows)
