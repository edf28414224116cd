r"""Figures of the loops' results (the WISKI paper's Figures 5 and A.6-A.8).

Each curve function takes the long-format DataFrame the experiment runners write
(one row per step, with ``model`` and ``trial`` columns), draws the mean over
trials with a band of two standard errors, and saves a PNG. matplotlib is an
optional dependency (``pip install streamgp[plots]``). :func:`plot_malaria_map` draws
active-learning runs as longitude/latitude maps of their posterior mean and standard
deviation with the queried points (``streamgp active``'s ``<name>_queries.png`` and the
malaria tutorial).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd


def _pyplot():
    try:
        import matplotlib

        # Headless by default (CLI, workers), but never switch the backend of a session
        # that already uses pyplot: in a notebook that would stop inline figures.
        if "matplotlib.pyplot" not in sys.modules:
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


# ---------------------------------------------------------------------- malaria maps
#: Colour-bar label of the malaria atlas' values.
MALARIA_UNITS = "P. falciparum incidence (cases per person per year)"


def _new_figure(path, nrows: int, ncols: int, figsize):
    # A file: a figure outside pyplot (no global state, no backend switch, nothing to
    # close). No file: pyplot's, so that a notebook shows it with its inline backend.
    if path is not None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize, layout="constrained")
        return fig, fig.subplots(nrows, ncols, squeeze=False)
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'streamgp[plots]'.") from error
    return plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, layout="constrained")


def lonlat_image(lonlat, values) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    r"""Cells of a regular longitude/latitude grid as an image for ``pcolormesh``.

    Args:
        lonlat: ``N x 2`` cell centres (longitude, latitude), e.g. the malaria atlas'.
        values: ``N`` values at the cells.

    Returns:
        ``(lon_edges, lat_edges, image)`` with ``image[i, j]`` the value of the cell in
        latitude row ``i`` and longitude column ``j`` (NaN where the grid has no cell,
        e.g. water), or ``None`` when the cells do not lie on one regular grid.

    Example:
        >>> lon, lat = np.meshgrid([10.0, 10.5, 11.0], [0.0, 0.5])
        >>> cells = np.stack([lon.ravel(), lat.ravel()], -1)[:-1]  # one cell missing
        >>> lon_edges, lat_edges, image = lonlat_image(cells, np.arange(5.0))
        >>> lon_edges.tolist(), image.shape, int(np.isnan(image).sum())
        ([9.75, 10.25, 10.75, 11.25], (2, 3), 1)
    """
    lonlat = np.asarray(lonlat, dtype=float)
    values = np.asarray(values, dtype=float).reshape(-1)
    if lonlat.ndim != 2 or lonlat.shape[-1] != 2 or len(lonlat) != len(values):
        raise ValueError(
            f"lonlat must be N x 2 and values N; got {lonlat.shape} and {values.shape}."
        )
    edges, index = [], []
    for column in lonlat.T:
        centres = np.unique(column)
        if len(centres) < 2:
            return None
        step = np.diff(centres).min()
        position = (column - centres[0]) / step
        rounded = np.rint(position)
        if np.abs(position - rounded).max() > 1e-3:
            return None
        count = int(rounded.max()) + 1
        if count > 4 * len(column):  # far too sparse to be one grid
            return None
        edges.append(centres[0] + step * (np.arange(count + 1) - 0.5))
        index.append(rounded.astype(int))
    image = np.full((len(edges[1]) - 1, len(edges[0]) - 1), np.nan)
    if len(np.unique(index[1] * image.shape[1] + index[0])) != len(values):
        return None  # two cells in one pixel: not one grid
    image[index[1], index[0]] = values
    return edges[0], edges[1], image


def _surface(ax, lonlat, values, **style):
    image = lonlat_image(lonlat, values)
    if image is not None:
        return ax.pcolormesh(*image, shading="flat", rasterized=True, **style)
    # Scattered cells: filled contours over their triangulation.
    levels = np.linspace(style.pop("vmin"), style.pop("vmax"), 21)
    return ax.tricontourf(lonlat[:, 0], lonlat[:, 1], values, levels=levels, extend="both", **style)


def _posterior_on(model, X, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    import torch

    means, variances = [], []
    with torch.no_grad():
        for chunk in X.split(batch_size):
            # One point per t-batch: marginal predictions, no t x t covariance.
            posterior = model.posterior(chunk.unsqueeze(-2))
            means.append(posterior.mean.reshape(-1))
            variances.append(posterior.variance.reshape(-1))
    mean = torch.cat(means).cpu().numpy()
    std = torch.cat(variances).clamp_min(0.0).sqrt().cpu().numpy()
    return mean, std


def plot_malaria_map(
    runs,
    path: str | Path | None = None,
    *,
    title: str = "",
    units: str = MALARIA_UNITS,
    batch_size: int = 4096,
):
    r"""Maps of active-learning runs: posterior mean and standard deviation, with the queries.

    One row per run, two maps per row over longitude and latitude: the posterior mean
    of the run's surrogate, and its posterior standard deviation (of the latent surface,
    without observation noise), both in the targets' original units and drawn as
    surfaces over every cell of the pool and the test set (on the malaria atlas, its
    regular 5-arcmin grid, with no colour where the atlas has no cell, e.g. Lake
    Tanganyika); scattered cells are drawn as filled contours instead. The pool points
    the run queried lie on top: the random initial design as red stars, the chosen
    points as white dots. The mean maps share one colour scale (the range of the pool's
    and test set's targets, so they compare with the data), and the standard-deviation
    maps another.

    Args:
        runs: An :class:`~streamgp.loops.ActiveLearningLoop` that has run at least its
            initial design, or a mapping ``label -> loop`` (one row each, e.g.
            ``{"qNIPV": loop_a, "random": loop_b}``). The loops' inputs are
            longitude and latitude (the loop's unit-cube scaling is undone for the map).
        path: PNG file to write. ``None``: return the figure instead (a notebook shows
            it).
        title: Figure title.
        units: Colour-bar label of the targets.
        batch_size: Cells per posterior call.

    Returns:
        ``path`` as a :class:`~pathlib.Path` if given, else the matplotlib ``Figure``.

    Example:
        >>> from streamgp.loops import ActiveLearningLoop
        >>> from streamgp.loops.experiments import malaria_kernel, malaria_pool_and_test
        >>> pool_X, pool_Y, pool_Yvar, test_X, test_Y = malaria_pool_and_test()
        >>> loop = ActiveLearningLoop(pool_X, pool_Y, test_X, test_Y, pool_Yvar=pool_Yvar,
        ...     kernel_factory=malaria_kernel, model_options={"grid_size": 30},
        ...     candidates_per_step=256, num_mc_points=128, fit_every=10)
        >>> history = loop.run(10)  # doctest: +SKIP
        >>> plot_malaria_map({"qNIPV": loop}, "malaria_map.png")  # doctest: +SKIP
        PosixPath('malaria_map.png')
    """
    import torch

    if not isinstance(runs, Mapping):
        runs = {"": runs}
    if not runs:
        raise ValueError("runs is empty: pass an ActiveLearningLoop or a dict of them.")
    for label, loop in runs.items():
        if getattr(loop, "surrogate", None) is None:
            raise ValueError(
                f"run {label!r} has no model yet: call loop.run(...) (or loop.step()) first."
            )
        if loop.pool_X.shape[-1] != 2:
            raise ValueError(
                f"a map needs 2 inputs (longitude, latitude); run {label!r} has "
                f"{loop.pool_X.shape[-1]}."
            )
    maps = []
    for label, loop in runs.items():
        unit = torch.cat([loop.pool_X, loop.test_X])
        mean, std = _posterior_on(loop.surrogate.model, unit, batch_size)
        to_lonlat = lambda X, loop=loop: (loop.lower + loop.scale * X).cpu().numpy()  # noqa: E731
        cells = to_lonlat(unit)
        chosen = to_lonlat(loop.pool_X[loop.chosen])
        targets = torch.cat([loop.pool_Y, loop.test_Y]).reshape(-1).cpu().numpy()
        maps.append((label, loop, cells, mean, std, chosen, targets))
    low = min(float(m[6].min()) for m in maps)
    high = max(float(m[6].max()) for m in maps)
    std_high = max(float(m[4].max()) for m in maps)
    cells = maps[0][2]
    width = 2 * (4.2 * np.ptp(cells[:, 0]) / max(np.ptp(cells[:, 1]), 1e-12) + 1.8)
    fig, axes = _new_figure(path, len(maps), 2, (min(max(width, 8.0), 16.0), 4.5 * len(maps)))
    for row, (label, loop, cells, mean, std, chosen, _) in zip(axes, maps, strict=True):
        n = len(loop.chosen)
        prefix = f"{label}: " if label else ""
        panels = (
            (mean, dict(cmap="viridis", vmin=low, vmax=high), "posterior mean", units),
            (std, dict(cmap="magma", vmin=0.0, vmax=std_high), "posterior sd", "posterior sd"),
        )
        for ax, (values, style, what, bar) in zip(row, panels, strict=True):
            mesh = _surface(ax, cells, values, **style)
            ax.figure.colorbar(mesh, ax=ax, label=bar, shrink=0.9)
            initial, rest = chosen[: loop.num_init], chosen[loop.num_init :]
            ax.scatter(
                rest[:, 0],
                rest[:, 1],
                s=14,
                c="white",
                edgecolors="black",
                linewidths=0.5,
                label=f"chosen ({len(rest)})",
            )
            ax.scatter(
                initial[:, 0],
                initial[:, 1],
                s=70,
                marker="*",
                c="red",
                edgecolors="black",
                linewidths=0.5,
                label=f"initial ({len(initial)})",
            )
            ax.set(
                xlabel="longitude",
                ylabel="latitude",
                aspect="equal",
                title=f"{prefix}{what} (n = {n})",
            )
            ax.legend(loc="lower left", fontsize=8, framealpha=0.8)
    if title:
        fig.suptitle(title)
    if path is None:
        return fig
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
