r"""Figures of the loops' results (the WISKI paper's Figures 5 and A.6-A.8).

Each function takes the long-format DataFrame the experiment runners write
(one row per step, with ``model`` and ``trial`` columns), draws the mean over
trials with a band of two standard errors, and saves a PNG. matplotlib is an
optional dependency (``pip install streamgp[plots]``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plots need matplotlib: pip install 'streamgp[plots]' (or pass --no-plots)."
        ) from error
    return plt


def _band(ax, frame: pd.DataFrame, x: str, y: str, label: str) -> None:
    stats = frame.groupby(x)[y].agg(["mean", "std", "count"])
    stderr = (stats["std"].fillna(0.0) / stats["count"].pow(0.5)).to_numpy()
    (line,) = ax.plot(stats.index, stats["mean"], label=label)
    ax.fill_between(
        stats.index,
        stats["mean"] - 2 * stderr,
        stats["mean"] + 2 * stderr,
        color=line.get_color(),
        alpha=0.2,
    )


def _binned_median(frame: pd.DataFrame, x: str, y: str, bins: int = 80) -> pd.DataFrame:
    # Per-step times jitter by 10x from step to step on a shared machine; the median
    # per bin of ``x`` (per trial) shows the trend the plot is about.
    if frame[x].nunique() <= bins:
        return frame
    middles = pd.cut(frame[x], bins).map(lambda interval: interval.mid).astype(float)
    keys = ["trial", x] if "trial" in frame else [x]
    return frame.assign(**{x: middles}).groupby(keys, as_index=False)[y].median()


def plot_bo(results: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    r"""Best value vs step and vs cumulative time, and time per step vs step."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for model, frame in results.groupby("model", sort=False):
        _band(axes[0], frame, "step", "best_value", model)
        # Cumulative time differs per trial: plot each trial's curve.
        for trial, run in frame.groupby("trial"):
            axes[1].plot(
                run["cumulative_time"],
                run["best_value"],
                color=axes[0].lines[-1].get_color(),
                alpha=0.7,
                label=model if trial == frame["trial"].min() else None,
            )
        _band(axes[2], frame[frame["step"] > 0], "step", "step_time", model)
    axes[0].set(xlabel="step", ylabel="best true value", title=title)
    axes[1].set(xlabel="cumulative time (s)", ylabel="best true value", xscale="log")
    axes[2].set(xlabel="step", ylabel="time per step (s)", yscale="log")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_active(results: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    r"""Test RMSE vs step, and time per step vs step, per model and acquisition."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (model, acquisition), frame in results.groupby(["model", "acquisition"], sort=False):
        label = f"{model} / {acquisition}"
        _band(axes[0], frame, "step", "test_rmse", label)
        _band(axes[1], frame[frame["step"] > 0], "step", "step_time", label)
    axes[0].set(xlabel="step", ylabel="test RMSE", title=title)
    axes[1].set(xlabel="step", ylabel="time per step (s)", yscale="log")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_queries(
    test_X, pool_X, chosen: dict[str, list[int]], num_init: int, path: str | Path, title: str = ""
) -> Path:
    r"""Map of the test set and the pool points each model chose (Figure 5c)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(chosen), figsize=(5 * len(chosen), 4.5), squeeze=False)
    for ax, (label, indices) in zip(axes[0], chosen.items(), strict=True):
        ax.scatter(test_X[:, 0], test_X[:, 1], s=2, color="navy", alpha=0.3, label="test set")
        picked = pool_X[indices[num_init:]]
        ax.scatter(picked[:, 0], picked[:, 1], s=8, color="orange", label="chosen")
        initial = pool_X[indices[:num_init]]
        ax.scatter(initial[:, 0], initial[:, 1], s=20, color="red", label="initial")
        ax.set(title=f"{title} {label}".strip(), xlabel="x0", ylabel="x1")
        ax.legend(loc="lower left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_stream(results: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    r"""Online regression/classification curves (the WISKI paper's Figures 3 and 4).

    Test NLL and RMSE (regression) or accuracy (classification) against the number of
    observations, and time per step (median per bin of observations) against the
    number of observations.
    """
    plt = _pyplot()
    second = "test_accuracy" if "test_accuracy" in results else "test_rmse"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for model, frame in results.groupby("model", sort=False):
        evaluated = frame.dropna(subset=["test_nll"])
        _band(axes[0], evaluated, "num_observations", "test_nll", model)
        _band(axes[1], evaluated, "num_observations", second, model)
        streamed = frame[frame["step"] > 0]
        if len(streamed):
            binned = _binned_median(streamed, "num_observations", "step_time")
            _band(axes[2], binned, "num_observations", "step_time", model)
    axes[0].set(xlabel="observations", ylabel="test NLL (standardized)", title=title)
    axes[1].set(xlabel="observations", ylabel=second.replace("_", " "))
    axes[2].set(xlabel="observations", ylabel="time per step (s)", yscale="log")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
