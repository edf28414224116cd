r"""The streaming experiment: :func:`run_stream_experiment` over models, trials, executors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from streamgp.loops.executors import Executor, GridTask, run_grid_curves, trial_seeds
from streamgp.loops.stream.config import StreamConfig
from streamgp.loops.stream.loop import StreamingLoop


@dataclass(frozen=True)
class StreamSplits:
    r"""Picklable ``seed -> StreamingSplit`` of a registered dataset (for other processes).

    Each task loads its split where it runs, so workers need the dataset file
    (``data_dir``, ``$STREAMGP_DATA`` or the cache) on their machine.

    Example:
        >>> splits = StreamSplits("powerplant")
        >>> split = splits(0)  # doctest: +SKIP
    """

    dataset: str
    data_dir: str | None = None

    def __call__(self, seed: int):
        from streamgp.datasets import load_streaming_split

        return load_streaming_split(self.dataset, seed, self.data_dir)


#: The last split built by :func:`_stream_loop` in this process: the models of a trial
#: share it when their tasks run in the same process (e.g. sequentially).
_LAST_SPLIT: dict[str, Any] = {}


def _stream_loop(split_factory, trial: int, model: str, **options) -> StreamingLoop:
    key = (split_factory, trial)
    try:
        hit = _LAST_SPLIT.get("key") == key
    except TypeError:  # an unhashable / uncomparable factory
        hit = False
    if not hit:
        _LAST_SPLIT.clear()
        _LAST_SPLIT.update(key=key, split=split_factory(trial))
    return StreamingLoop(_LAST_SPLIT["split"], model, seed=trial, **options)


def run_stream_experiment(
    split_factory: Callable[[int], Any],
    *,
    name: str,
    models: Sequence[str] = ("wiski", "exact"),
    trials: int = 1,
    first_trial: int = 0,
    batch_size: int = 1,
    num_evals: int = 50,
    max_stream: int | None = None,
    config: StreamConfig | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    plots: bool = True,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
    executor: Executor | Any | None = None,
) -> pd.DataFrame:
    r"""The protocol for several models and trials; writes ``stream_<name>.csv`` and a PNG.

    Each (model, trial) run is one task (:class:`~streamgp.loops.executors.GridTask`) on
    ``executor``: it builds its :class:`StreamingLoop`, continues from its checkpoint
    ``checkpoints/stream_<name>_<model>_<trial>.pt`` if ``resume``, runs (writing the
    checkpoint every ``eval_every`` steps) and returns its curve. The curves are merged
    in grid order (trial, then model), so the results do not depend on where the tasks
    ran. Each task calls ``split_factory(trial)`` where it runs (the models of a trial
    share the split when their tasks run in one process); for other processes it must be
    picklable (e.g. :class:`StreamSplits`; Dask also accepts lambdas).

    The arguments not listed below are as :class:`StreamingLoop`'s.

    Args:
        split_factory: ``seed -> StreamingSplit`` (trial ``t`` uses split seed ``t``
            and loop seed ``t`` for every model).
        name: Dataset name used in file names.
        trials: Number of trials.
        first_trial: Index (and seed) of the first one: trials ``first_trial, ...,
            first_trial + trials - 1`` run, so more trials can be added to a
            finished experiment without repeating it.
        out: Output directory (CSV of the curves, PNG, checkpoints), or ``None``.
        resume: Continue runs from their checkpoints in ``out`` (otherwise those
            checkpoints are deleted first).
        executor: Where the runs go: ``None`` (in this process, one after the other),
            an :class:`~streamgp.loops.executors.Executor` or a Dask
            ``distributed.Client``.

    Returns:
        The long-format curves (one row per step, with ``model``, ``trial``, ``dataset``).

    Example:
        >>> from streamgp.loops.executors import DaskExecutor
        >>> with DaskExecutor(workers=4) as executor:  # doctest: +SKIP
        ...     run_stream_experiment(StreamSplits("powerplant"), name="powerplant",
        ...                           trials=5, out="results", executor=executor)
    """
    out = None if out is None else Path(out)
    common = dict(
        split_factory=split_factory,
        batch_size=batch_size,
        num_evals=num_evals,
        max_stream=max_stream,
        config=config,
        device=device,
        dtype=dtype,
    )
    tasks = [
        GridTask.under(
            out,
            f"stream_{name}_{model}_{trial}",
            build=_stream_loop,
            options={**common, "trial": trial, "model": model},
            steps=None,
            labels={"model": model, "trial": trial, "dataset": name},
            checkpoint_every=None,
            progress=progress,
        )
        for trial in trial_seeds(trials, first_trial)
        for model in models
    ]
    csv = None if out is None else out / f"stream_{name}.csv"
    results, _ = run_grid_curves(tasks, executor, resume=resume, progress=progress, csv=csv)
    if out is not None and plots:
        from streamgp.plotting import plot_stream

        plot_stream(results, out / f"stream_{name}.png", title=name)
    return results
