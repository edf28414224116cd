r"""Experiment runners behind ``streamgp bo``, ``streamgp active`` and ``streamgp stream``.

A runner repeats a loop for several models and trials, writes one long-format CSV
(a row per step, with ``model`` and ``trial`` columns), checkpoints each run so an
interrupted experiment resumes where it stopped, and draws the figures.

Each (model, trial[, acquisition]) run is one task: it builds its loop, continues from
its checkpoint if there is one, runs and saves its checkpoint, and returns its curve.
The tasks run on an ``executor`` (:mod:`streamgp.loops.executors`): in this process one
after the other (the default), in local processes, or on a Dask cluster. The curves are
merged in grid order (trial, then model, then acquisition), so the outputs are the same
wherever the tasks ran. Without ``resume``, the checkpoints of the grid's runs are
deleted before the tasks start; a task that is run again after its worker died therefore
resumes from the checkpoint it wrote itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.priors import GammaPrior
from torch import Tensor

from streamgp.loops.acquisition import AcquisitionOptions
from streamgp.loops.active import ActiveLearningLoop
from streamgp.loops.bo import BayesOptLoop, make_test_function
from streamgp.loops.executors import (
    Executor,
    GridTask,
    run_grid,
    run_grid_curves,
    run_grid_task,
    trial_seeds,
)

# The streaming runner lives with its protocol (streamgp.loops.stream); it is named here
# too, as the runner behind ``streamgp stream``.
from streamgp.loops.stream import StreamSplits, run_stream_experiment


def malaria_kernel(dim: int) -> ScaleKernel:
    r"""The WISKI paper's malaria kernel (appendix C.3): scaled ARD Matern-1/2,
    lengthscale prior Gamma(3, 6), outputscale prior Gamma(2, 0.15)."""
    return ScaleKernel(
        MaternKernel(nu=0.5, ard_num_dims=dim, lengthscale_prior=GammaPrior(3.0, 6.0)),
        outputscale_prior=GammaPrior(2.0, 0.15),
    )


def malaria_pool_and_test(full: bool = False, seed: int = 0):
    r"""Pool and test tensors of the malaria atlas for active learning (fixed noise).

    A seeded 90/10 shuffle of the shipped subset (or of the full file from the data
    directory when ``full``). Returns ``pool_X, pool_Y, pool_Yvar, test_X, test_Y``
    with inputs (lon, lat), incidence targets and their noise variances.
    """
    from streamgp.datasets import load_malaria

    data = load_malaria(full=full)
    order = torch.randperm(len(data.X), generator=torch.Generator().manual_seed(seed))
    split = int(0.9 * len(data.X))
    pool, test = order[:split], order[split:]
    return data.X[pool], data.Y[pool], data.Yvar[pool], data.X[test], data.Y[test]


def _bo_loop(function: str, dim: int, noise_std: float | None, **options) -> BayesOptLoop:
    return BayesOptLoop(make_test_function(function, dim=dim, noise_std=noise_std), **options)


def _run_options(
    model: str, trial: int, model_options: dict[str, dict[str, Any]] | None
) -> dict[str, Any]:
    r"""A run's own loop options: its model, that model's options, and its seed."""
    return {"model": model, "model_options": (model_options or {}).get(model), "seed": trial}


def run_bo_experiment(
    function: str = "levy",
    *,
    models: Sequence[str] = ("wiski", "exact"),
    acquisition: str = "qucb",
    steps: int = 100,
    max_steps: dict[str, int] | None = None,
    trials: int = 1,
    first_trial: int = 0,
    dim: int = 3,
    noise_std: float | None = None,
    q: int = 3,
    num_init: int = 5,
    fit_every: int = 1,
    fit_max_iter: int | None = None,
    acquisition_options: AcquisitionOptions | None = None,
    model_options: dict[str, dict[str, Any]] | None = None,
    device: str = "cpu",
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    plots: bool = True,
    checkpoint_every: int = 10,
    executor: Executor | Any | None = None,
) -> pd.DataFrame:
    r"""BO on a noisy test function with each model, ``trials`` seeds each.

    Args:
        function: Test function name (see ``TEST_FUNCTIONS``).
        models: Surrogate names.
        acquisition: Acquisition name.
        steps: BO steps per run.
        max_steps: Optional per-model cap on the steps (e.g. ``{"exact": 300}``).
        trials: Number of seeds; trial ``t`` uses seed ``t`` for every model.
        first_trial: The first trial's seed: the runs are trials ``first_trial ..
            first_trial + trials - 1``, so more seeds can be added to an experiment
            later (in another ``out``) without repeating the ones it has.
        out: Directory for ``bo_<function>_<acquisition>.csv``, the PNG and checkpoints.
        resume: Continue runs from their checkpoints in ``out``.
        checkpoint_every: Steps between checkpoints of a run.
        executor: Where the (model, trial) runs go: ``None`` (in this process, one after
            the other), an :class:`~streamgp.loops.executors.Executor` or a Dask
            ``distributed.Client``. The results do not depend on it.
        Other arguments: as :class:`~streamgp.loops.BayesOptLoop`.

    Returns:
        The long-format results (also written to ``out``).

    Example:
        >>> from streamgp.loops.executors import DaskExecutor
        >>> with DaskExecutor(workers=4) as executor:  # doctest: +SKIP
        ...     run_bo_experiment("levy", trials=8, out="results", executor=executor)
    """
    out = None if out is None else Path(out)
    common = dict(
        function=function,
        dim=dim,
        noise_std=noise_std,
        acquisition=acquisition,
        q=q,
        num_init=num_init,
        fit_every=fit_every,
        fit_max_iter=fit_max_iter,
        acquisition_options=acquisition_options,
        device=device,
    )
    tasks = [
        GridTask.under(
            out,
            f"bo_{function}_{acquisition}_{model}_{trial}",
            build=_bo_loop,
            options={**common, **_run_options(model, trial, model_options)},
            steps=min(steps, (max_steps or {}).get(model, steps)),
            labels={"model": model, "trial": trial, "function": function},
            checkpoint_every=checkpoint_every,
            progress=progress,
        )
        for trial in trial_seeds(trials, first_trial)
        for model in models
    ]
    stem = f"bo_{function}_{acquisition}"
    csv = None if out is None else out / f"{stem}.csv"
    results, _ = run_grid_curves(tasks, executor, resume=resume, progress=progress, csv=csv)
    if out is not None and plots:
        from streamgp.plotting import plot_bo

        plot_bo(results, out / f"{stem}.png", title=f"{function} ({acquisition}, q={q})")
    return results


def run_active_experiment(
    pool_X: Tensor,
    pool_Y: Tensor,
    test_X: Tensor,
    test_Y: Tensor,
    pool_Yvar: Tensor | None = None,
    *,
    name: str = "active",
    models: Sequence[str] = ("wiski", "exact"),
    acquisitions: Sequence[str] = ("qnipv", "random"),
    steps: int = 100,
    max_steps: dict[str, int] | None = None,
    trials: int = 1,
    q: int = 6,
    num_init: int = 10,
    num_mc_points: int = 256,
    candidates_per_step: int | None = None,
    fit_every: int = 1,
    fit_max_iter: int | None = None,
    kernel_factory=None,
    acquisition_options: AcquisitionOptions | None = None,
    model_options: dict[str, dict[str, Any]] | None = None,
    device: str = "cpu",
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    plots: bool = True,
    checkpoint_every: int = 10,
    executor: Executor | Any | None = None,
    malaria_map: bool = False,
) -> pd.DataFrame:
    r"""Active learning on a pool/test split with each model and acquisition.

    Writes ``<name>.csv`` (curves), ``<name>.png`` (RMSE and time per step) and
    ``<name>_queries.png`` (map of the first trial's queries) to ``out``.
    With ``malaria_map`` (inputs are longitude and latitude, as ``streamgp active``'s)
    that map is :func:`~streamgp.plotting.plot_malaria_map`: each first-trial run's
    posterior mean and standard deviation over the pool and test cells with its queries,
    its model restored from the run's checkpoint; otherwise a scatter of the queries
    over the test inputs. Other arguments (``executor`` included): as
    :func:`run_bo_experiment` and :class:`~streamgp.loops.ActiveLearningLoop`.
    """
    out = None if out is None else Path(out)
    common = dict(
        pool_X=pool_X,
        pool_Y=pool_Y,
        test_X=test_X,
        test_Y=test_Y,
        pool_Yvar=pool_Yvar,
        q=q,
        num_init=num_init,
        num_mc_points=num_mc_points,
        candidates_per_step=candidates_per_step,
        fit_every=fit_every,
        fit_max_iter=fit_max_iter,
        kernel_factory=kernel_factory,
        acquisition_options=acquisition_options,
        device=device,
    )
    tasks = [
        GridTask.under(
            out,
            f"{name}_{model}_{acquisition}_{trial}",
            build=ActiveLearningLoop,
            options={
                **common,
                **_run_options(model, trial, model_options),
                "acquisition": acquisition,
            },
            steps=min(steps, (max_steps or {}).get(model, steps)),
            labels={"model": model, "acquisition": acquisition, "trial": trial},
            checkpoint_every=checkpoint_every,
            progress=progress,
            keep_chosen=trial == 0,
        )
        for trial in trial_seeds(trials)
        for model in models
        for acquisition in acquisitions
    ]
    csv = None if out is None else out / f"{name}.csv"
    results, outputs = run_grid_curves(tasks, executor, resume=resume, progress=progress, csv=csv)
    chosen = {
        f"{task.labels['model']} / {task.labels['acquisition']}": indices
        for task, (_, indices) in zip(tasks, outputs, strict=True)
        if task.keep_chosen
    }
    if out is not None and plots:
        from streamgp.plotting import plot_active, plot_malaria_map, plot_queries

        plot_active(results, out / f"{name}.png", title=name)
        if malaria_map:
            runs = {}
            for task in tasks:
                if task.keep_chosen:
                    label = f"{task.labels['model']} / {task.labels['acquisition']}"
                    runs[label] = task.build(**task.options).load(task.checkpoint)
            plot_malaria_map(runs, out / f"{name}_queries.png", title=name)
        else:
            plot_queries(test_X.cpu(), pool_X.cpu(), chosen, num_init, out / f"{name}_queries.png")
    return results


def _group_labels(by: Sequence[str], key: Any) -> dict[str, Any]:
    """The grouping columns' values of one ``groupby`` group, by column name."""
    return dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))


def summarize(results: pd.DataFrame, by: Sequence[str], value: str, last: int = 10) -> pd.DataFrame:
    r"""Per group: final ``value`` (mean over trials), mean step time over the first and
    last ``last`` steps, and their ratio (a flat time per step gives ~1)."""
    rows = []
    for key, frame in results.groupby(list(by), sort=False):
        steps = frame[frame["step"] > 0]
        final_step = frame["step"].max()
        first = steps[steps["step"] <= last]["step_time"].mean()
        tail = steps[steps["step"] > final_step - last]["step_time"].mean()
        rows.append(
            {
                **_group_labels(by, key),
                "steps": int(final_step),
                "observations": int(frame[frame["step"] == final_step]["num_observations"].mean()),
                value: frame[frame["step"] == final_step][value].mean(),
                f"time/step first {last} (s)": first,
                f"time/step last {last} (s)": tail,
                "last/first": tail / first if first else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def summarize_seeds(
    results: pd.DataFrame, by: Sequence[str], value: str, steps: Sequence[int]
) -> pd.DataFrame:
    r"""Per group and step: ``value`` over the trials that reached that step.

    BO runs differ more between seeds than between good surrogates, so a comparison
    needs each seed's value and their spread, not only the mean (:func:`summarize`).
    Trials that stopped before a step are left out of that step's row.

    Args:
        results: Curves with columns ``by``, ``"trial"``, ``"step"``, ``value`` and
            ``"step_time"`` (one row per trial and step, as the loops write them).
        by: Grouping columns (e.g. ``["function", "model"]``).
        value: The column to report (e.g. ``"best_value"``).
        steps: The steps to report.

    Returns:
        One row per group and step with ``trials``, ``mean``, ``sd`` (over trials,
        ``ddof = 1``; NaN for one trial), ``median`` (robust to the one trapped run
        that often decides a BO mean), ``values`` (per trial, in trial order) and
        ``time/step (s)`` (mean step time of those trials up to that step).

    Example:
        >>> curves = pd.DataFrame({"model": "wiski", "trial": [0, 0, 1, 1],
        ...     "step": [0, 1, 0, 1], "best_value": [1.0, 2.0, 1.0, 4.0],
        ...     "step_time": [0.5, 1.0, 0.5, 3.0]})
        >>> summarize_seeds(curves, ["model"], "best_value", [1])[["mean", "sd"]].values
        array([[3.        , 1.41421356]])
    """
    missing = sorted({*by, "trial", "step", value, "step_time"} - set(results.columns))
    if missing:
        raise ValueError(f"results lacks the columns {missing}")
    rows = []
    for key, frame in results.groupby(list(by), sort=False):
        labels = _group_labels(by, key)
        last_step = frame.groupby("trial")["step"].max()
        for step in steps:
            trials = last_step.index[last_step >= step]
            if len(trials) == 0:
                continue
            kept = frame[frame["trial"].isin(trials)]
            final = kept[kept["step"] == step].sort_values("trial")[value]
            timed = kept[(kept["step"] > 0) & (kept["step"] <= step)]
            rows.append(
                {
                    **labels,
                    "step": int(step),
                    "trials": len(trials),
                    "mean": final.mean(),
                    "sd": final.std(),
                    "median": final.median(),
                    "values": final.tolist(),
                    "time/step (s)": timed["step_time"].mean(),
                }
            )
    return pd.DataFrame(rows)


__all__ = [
    "GridTask",
    "StreamSplits",
    "malaria_kernel",
    "malaria_pool_and_test",
    "run_active_experiment",
    "run_bo_experiment",
    "run_grid",
    "run_grid_task",
    "run_stream_experiment",
    "summarize",
    "summarize_seeds",
]
