r"""Executors that run the tasks of an experiment grid: in process, in local processes, on Dask.

The experiment runners (:func:`~streamgp.loops.experiments.run_bo_experiment`,
:func:`~streamgp.loops.experiments.run_active_experiment`,
:func:`~streamgp.loops.stream.run_stream_experiment`) split a grid into one task per
(model, trial[, acquisition]): a :class:`GridTask`, run by :func:`run_grid`. Each task
builds its loop, resumes from its checkpoint when one exists, runs, saves its checkpoint
and returns its curve; the runner then merges the curves in grid order, so the CSV and
figures do not depend on where or in which order the tasks ran. An executor only
decides *where* the tasks run:

- :class:`SequentialExecutor` (the default): one after the other in this process.
- :class:`ProcessExecutor`: a pool of local processes (standard library only).
- :class:`DaskExecutor`: the workers of a Dask ``distributed.Client``: a ``LocalCluster``
  it starts (``workers=N``), a running scheduler (``address="tcp://..."``) or a client you
  made (e.g. on a ``dask_jobqueue.SLURMCluster``). Needs ``pip install 'streamgp[cluster]'``.

A task whose worker dies (killed, out of memory, pre-empted) is submitted again and
continues from the last checkpoint its loop wrote (every ``checkpoint_every`` steps), so
no finished step is lost and none is recorded twice. Every executor except the sequential
one sets torch's intra-op threads in each task (``torch_threads``, 1 by default), so ``N``
single-threaded workers do not oversubscribe ``N`` cores.

Example:
    >>> from streamgp.loops.executors import make_executor
    >>> with make_executor(workers=4) as executor:  # doctest: +SKIP
    ...     results = run_bo_experiment("levy", trials=8, out="results", executor=executor)
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamgp.utils.validation import check_count

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

#: Installing this extra provides Dask (``dask[distributed]``).
CLUSTER_EXTRA = "streamgp[cluster]"


def import_distributed():
    r"""Import ``distributed`` (Dask's scheduler), or fail with a message naming the extra.

    Raises:
        ImportError: When Dask's distributed scheduler is not installed.

    Example:
        >>> distributed = import_distributed()  # doctest: +SKIP
        >>> client = distributed.Client("tcp://scheduler:8786")  # doctest: +SKIP
    """
    try:
        import distributed
    except ImportError as error:
        raise ImportError(
            "running experiments on Dask needs dask[distributed]; install it with "
            f"pip install '{CLUSTER_EXTRA}'"
        ) from error
    return distributed


def set_torch_threads(threads: int | None) -> None:
    r"""Set torch's intra-op threads of this process (``None``: leave them as they are).

    Example:
        >>> set_torch_threads(None)  # no change
    """
    if threads is not None:
        import torch

        if threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {threads}.")
        torch.set_num_threads(int(threads))


def _call(fn: Callable[[Any], Any], task: Any, threads: int | None) -> Any:
    # What a worker runs: the task with the requested torch threads.
    set_torch_threads(threads)
    return fn(task)


def _check_threads(torch_threads: int | None) -> int | None:
    if torch_threads is not None and (not isinstance(torch_threads, int) or torch_threads < 1):
        raise ValueError(f"torch_threads must be a positive integer, got {torch_threads!r}.")
    return torch_threads


class Executor(ABC):
    r"""Runs independent tasks of an experiment grid and returns their results in order.

    Subclasses implement :meth:`map`. Executors are context managers: leaving the
    ``with`` block releases what they started (processes, a ``LocalCluster``).

    Attributes:
        in_process: Whether tasks run in this process (then each task may show its own
            progress bar; otherwise the runner shows one bar over the tasks).
    """

    in_process: bool = False

    @abstractmethod
    def map(
        self,
        fn: Callable[[Any], Any],
        tasks: Sequence[Any],
        *,
        names: Sequence[str] | None = None,
        progress: bool = False,
    ) -> list[Any]:
        r"""``[fn(task) for task in tasks]``, wherever the tasks run.

        Args:
            fn: A module-level function (it is pickled by reference for other processes).
            tasks: Its arguments, one per task (picklable for other processes).
            names: Optional task names (logs, Dask keys); default ``task-<i>``.
            progress: Show a progress bar over the tasks.

        Returns:
            The results, in the order of ``tasks``.
        """

    def close(self) -> None:
        r"""Release the resources this executor started (nothing by default)."""
        return None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @staticmethod
    def _names(tasks: Sequence[Any], names: Sequence[str] | None) -> list[str]:
        names = [f"task-{i}" for i in range(len(tasks))] if names is None else list(names)
        if len(names) != len(tasks):
            raise ValueError(f"got {len(names)} names for {len(tasks)} tasks.")
        return names

    @staticmethod
    def _bar(total: int, progress: bool, desc: str):
        if not progress or total == 0:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="task")


class SequentialExecutor(Executor):
    r"""Run the tasks one after the other in this process (the runners' default).

    Args:
        torch_threads: Torch intra-op threads while the tasks run (restored afterwards);
            ``None`` (default) leaves torch's setting alone.

    Example:
        >>> SequentialExecutor().map(abs, [-1, 2, -3])
        [1, 2, 3]
    """

    in_process = True

    def __init__(self, torch_threads: int | None = None) -> None:
        self.torch_threads = _check_threads(torch_threads)

    def map(self, fn, tasks, *, names=None, progress=False):
        self._names(tasks, names)
        if self.torch_threads is None:
            return [fn(task) for task in tasks]
        import torch

        previous = torch.get_num_threads()
        try:
            return [_call(fn, task, self.torch_threads) for task in tasks]
        finally:
            torch.set_num_threads(previous)

    def __repr__(self) -> str:
        return f"SequentialExecutor(torch_threads={self.torch_threads})"


class ProcessExecutor(Executor):
    r"""Run the tasks in a pool of local processes (``spawn``ed; no Dask needed).

    If a process dies, the pool is rebuilt and the unfinished tasks are submitted again
    (they resume from their checkpoints), at most ``max_resubmits`` times.

    Args:
        workers: Number of processes.
        torch_threads: Torch intra-op threads per process (default 1).
        max_resubmits: How many times to rebuild a broken pool before giving up.

    Example:
        >>> with ProcessExecutor(2) as executor:  # doctest: +SKIP
        ...     executor.map(abs, [-1, 2, -3])
        [1, 2, 3]
    """

    def __init__(self, workers: int, torch_threads: int | None = 1, max_resubmits: int = 2):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}.")
        self.workers = workers
        self.torch_threads = _check_threads(torch_threads)
        self.max_resubmits = int(max_resubmits)

    def map(self, fn, tasks, *, names=None, progress=False):
        names = self._names(tasks, names)
        results: dict[int, Any] = {}
        pending = list(range(len(tasks)))
        bar = self._bar(len(tasks), progress, "tasks")
        failures = 0
        try:
            while pending:
                pool = cf.ProcessPoolExecutor(
                    max_workers=min(self.workers, len(pending)),
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=set_torch_threads,
                    initargs=(self.torch_threads,),
                )
                broken = False
                try:
                    futures = {
                        pool.submit(_call, fn, tasks[i], self.torch_threads): i for i in pending
                    }
                    for future in cf.as_completed(futures):
                        index = futures[future]
                        try:
                            results[index] = future.result()
                        except cf.process.BrokenProcessPool:
                            broken = True
                            continue
                        if bar is not None:
                            bar.update(1)
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
                pending = [i for i in pending if i not in results]
                if broken and pending:
                    failures += 1
                    if failures > self.max_resubmits:
                        raise RuntimeError(
                            f"worker processes died {failures} time(s); unfinished tasks: "
                            f"{[names[i] for i in pending]}"
                        )
                    logger.warning(
                        "a worker process died; resubmitting %s (they resume from their "
                        "checkpoints)",
                        [names[i] for i in pending],
                    )
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in range(len(tasks))]

    def __repr__(self) -> str:
        return f"ProcessExecutor(workers={self.workers}, torch_threads={self.torch_threads})"


class DaskExecutor(Executor):
    r"""Run the tasks on the workers of a Dask ``distributed.Client``.

    Give one of ``client`` (yours; left open), ``address`` (a running scheduler, e.g.
    ``"tcp://10.0.0.1:8786"``) or ``workers`` (start a ``LocalCluster`` of that many
    single-threaded worker processes, closed with the executor). Each task runs with
    ``torch_threads`` torch threads. When a worker dies, the scheduler reschedules its task
    (up to ``distributed.scheduler.allowed-failures`` times); if it gives up
    (``KilledWorker``) the task is submitted again, at most ``max_resubmits`` times. Either
    way the task resumes from its checkpoint.

    Args:
        client: An existing ``distributed.Client``.
        address: Scheduler address to connect to.
        workers: Number of ``LocalCluster`` worker processes to start.
        torch_threads: Torch intra-op threads per task (default 1).
        max_resubmits: Resubmissions of a task after ``KilledWorker``.
        cluster_options: Extra keyword arguments of ``LocalCluster`` (e.g.
            ``memory_limit``, ``dashboard_address``).

    Raises:
        ImportError: When ``dask[distributed]`` is missing (``pip install 'streamgp[cluster]'``).

    Example:
        >>> with DaskExecutor(workers=2) as executor:  # doctest: +SKIP
        ...     print(executor.dashboard_link)
        ...     executor.map(abs, [-1, 2, -3])
        [1, 2, 3]
    """

    def __init__(
        self,
        client: Any = None,
        *,
        address: str | None = None,
        workers: int | None = None,
        torch_threads: int | None = 1,
        max_resubmits: int = 2,
        cluster_options: dict[str, Any] | None = None,
    ) -> None:
        given = [name for name, value in (("client", client), ("address", address)) if value]
        if workers is not None:
            given.append("workers")
        if len(given) != 1:
            raise ValueError(f"give exactly one of client, address, workers; got {given or 'none'}")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer, got {workers!r}.")
        self.torch_threads = _check_threads(torch_threads)
        self.max_resubmits = int(max_resubmits)
        self._owned: list[Any] = []
        distributed = import_distributed()
        if client is None and address is not None:
            client = distributed.Client(address)
            self._owned.append(client)
        elif client is None:
            options = {"dashboard_address": ":0", **(cluster_options or {})}
            cluster = distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, **options
            )
            client = distributed.Client(cluster)
            self._owned += [client, cluster]
        self.client = client

    @property
    def dashboard_link(self) -> str | None:
        r"""URL of the Dask dashboard (``None`` without bokeh, which serves it)."""
        import importlib.util

        if importlib.util.find_spec("bokeh") is None:
            return None
        try:
            return self.client.dashboard_link
        except Exception:  # noqa: BLE001 - no dashboard is not an error
            return None

    def map(self, fn, tasks, *, names=None, progress=False):
        distributed = import_distributed()
        from distributed.scheduler import KilledWorker

        names = self._names(tasks, names)
        token = uuid.uuid4().hex[:8]

        def submit(index: int, attempt: int):
            key = f"{names[index]}-{token}" + (f"-retry{attempt}" if attempt else "")
            future = self.client.submit(
                _call, fn, tasks[index], self.torch_threads, key=key, pure=False
            )
            return future, index, attempt

        submitted = [submit(i, 0) for i in range(len(tasks))]
        where = {future.key: (index, attempt) for future, index, attempt in submitted}
        futures = [future for future, _, _ in submitted]
        results: dict[int, Any] = {}
        bar = self._bar(len(tasks), progress, "tasks")
        try:
            completed = distributed.as_completed(futures)
            for future in completed:
                index, attempt = where.pop(future.key)
                try:
                    results[index] = future.result()
                except KilledWorker:
                    if attempt >= self.max_resubmits:
                        raise
                    logger.warning(
                        "%s: its workers kept dying; submitting it again (it resumes from "
                        "its checkpoint)",
                        names[index],
                    )
                    again, _, _ = submit(index, attempt + 1)
                    where[again.key] = (index, attempt + 1)
                    futures.append(again)
                    completed.add(again)
                    continue
                finally:
                    future.release()
                if bar is not None:
                    bar.update(1)
        except BaseException:
            self.client.cancel([f for f in futures if not f.done()])
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in range(len(tasks))]

    def close(self) -> None:
        r"""Close the client and ``LocalCluster`` this executor started (not yours)."""
        while self._owned:
            self._owned.pop(0).close()

    def __repr__(self) -> str:
        return f"DaskExecutor({self.client!r}, torch_threads={self.torch_threads})"


def as_executor(executor: Executor | Any | None) -> Executor:
    r"""An :class:`Executor` for what a runner was given.

    ``None`` gives a :class:`SequentialExecutor`, an executor itself, and a Dask
    ``distributed.Client`` a :class:`DaskExecutor` on it (the client stays yours).

    Example:
        >>> as_executor(None)
        SequentialExecutor(torch_threads=None)
    """
    if executor is None:
        return SequentialExecutor()
    if isinstance(executor, Executor):
        return executor
    if hasattr(executor, "submit") and hasattr(executor, "scheduler_info"):
        return DaskExecutor(executor)
    raise TypeError(
        "executor must be None, a streamgp Executor or a distributed.Client, "
        f"got {type(executor).__name__}."
    )


def make_executor(
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    processes: int | None = None,
    torch_threads: int | None = None,
) -> Executor:
    r"""The executor for the command-line options ``--workers``, ``--scheduler``, ``--processes``.

    Args:
        workers: Start a Dask ``LocalCluster`` with this many single-threaded workers.
        scheduler: Connect to the Dask scheduler at this address.
        processes: Use a pool of this many local processes (no Dask).
        torch_threads: Torch threads per task (default: 1 on workers / processes, the
            current setting when sequential).

    Returns:
        A :class:`SequentialExecutor` when none of ``workers``, ``scheduler``,
        ``processes`` is given, otherwise the executor they ask for.

    Example:
        >>> make_executor()
        SequentialExecutor(torch_threads=None)
        >>> make_executor(processes=2, torch_threads=2)
        ProcessExecutor(workers=2, torch_threads=2)
    """
    chosen = [
        flag
        for flag, value in (
            ("workers", workers),
            ("scheduler", scheduler),
            ("processes", processes),
        )
        if value is not None
    ]
    if len(chosen) > 1:
        raise ValueError(f"give at most one of workers, scheduler, processes; got {chosen}")
    if processes is not None:
        return ProcessExecutor(processes, torch_threads=torch_threads or 1)
    if workers is not None or scheduler is not None:
        return DaskExecutor(address=scheduler, workers=workers, torch_threads=torch_threads or 1)
    return SequentialExecutor(torch_threads)


# ---------------------------------------------------------------------- grids of runs
@dataclass(frozen=True)
class GridTask:
    r"""One run of an experiment grid (picklable, so it can run in another process).

    Attributes:
        name: The run's name (its checkpoint's stem), e.g. ``bo_levy_qucb_wiski_0``.
        build: Module-level callable returning the loop, called with ``options``.
        options: Keyword arguments of ``build``.
        steps: Steps to run (``None``: the loop's default).
        labels: Columns added to the curve (``model``, ``trial``, ...).
        checkpoint: Checkpoint file (``None``: no checkpoint, a rerun starts afresh).
        checkpoint_every: Steps between checkpoints (``None``: the loop's ``eval_every``).
        progress: Show the loop's progress bar.
        keep_chosen: Also return the loop's chosen pool indices (active learning).
    """

    name: str
    build: Callable[..., Any]
    options: dict[str, Any]
    steps: int | None
    labels: dict[str, Any]
    checkpoint: Path | None = None
    checkpoint_every: int | None = 10
    progress: bool = False
    keep_chosen: bool = False

    @classmethod
    def under(cls, out: Path | None, name: str, **fields: Any) -> GridTask:
        r"""A task whose checkpoint is ``out/checkpoints/<name>.pt`` (none without ``out``)."""
        checkpoint = None if out is None else Path(out) / "checkpoints" / f"{name}.pt"
        return cls(name=name, checkpoint=checkpoint, **fields)


def run_grid_task(task: GridTask) -> tuple[pd.DataFrame, list[int] | None]:
    r"""Run one task: build the loop, resume from its checkpoint if present, run, save.

    Returns:
        The curve (the loop's history with ``task.labels`` as columns) and, with
        ``task.keep_chosen``, the loop's chosen pool indices.
    """
    loop = task.build(**task.options)
    if task.checkpoint is not None and task.checkpoint.exists():
        loop.load(task.checkpoint)
        logger.info("%s: resuming from step %d", task.name, len(loop.history) - 1)
    every = task.checkpoint_every or max(getattr(loop, "eval_every", 1), 1)
    run_args = () if task.steps is None else (task.steps,)
    history = loop.run(
        *run_args, checkpoint=task.checkpoint, checkpoint_every=every, progress=task.progress
    )
    chosen = list(loop.chosen) if task.keep_chosen else None
    return history.assign(**task.labels), chosen


def run_grid(
    tasks: Sequence[GridTask],
    executor: Executor | Any | None = None,
    *,
    resume: bool = False,
    progress: bool = True,
) -> list[tuple[pd.DataFrame, list[int] | None]]:
    r"""Run ``tasks`` on ``executor`` and return their results in the order of ``tasks``.

    Without ``resume`` the tasks' checkpoints are deleted first (a fresh experiment), so
    that a task that runs again after its worker died resumes only from its own
    checkpoint. In-process executors show each task's progress bar; the others one bar
    over the tasks.
    """
    executor = as_executor(executor)
    if not resume:
        for task in tasks:
            if task.checkpoint is not None:
                task.checkpoint.unlink(missing_ok=True)
    if not executor.in_process:
        tasks = [replace(task, progress=False) for task in tasks]
    names = [task.name for task in tasks]
    return executor.map(run_grid_task, tasks, names=names, progress=progress)


def trial_seeds(trials: int, first_trial: int = 0) -> range:
    r"""The seeds of ``trials`` trials from ``first_trial`` (both validated, by name)."""
    check_count(trials, "trials", minimum=1)
    check_count(first_trial, "first_trial")
    return range(first_trial, first_trial + trials)


def run_grid_curves(
    tasks: Sequence[GridTask],
    executor: Executor | Any | None = None,
    *,
    resume: bool = False,
    progress: bool = True,
    csv: Path | None = None,
) -> tuple[pd.DataFrame, list[tuple[pd.DataFrame, list[int] | None]]]:
    r""":func:`run_grid`, and its curves concatenated into one long-format frame.

    Returns:
        The frame (also written to ``csv`` when given, its folder created) and the
        per-task outputs of :func:`run_grid`.
    """
    import pandas as pd

    outputs = run_grid(tasks, executor, resume=resume, progress=progress)
    results = pd.concat([frame for frame, _ in outputs], ignore_index=True)
    if csv is not None:
        csv.parent.mkdir(parents=True, exist_ok=True)
        results.to_csv(csv, index=False)
    return results, outputs


__all__ = [
    "CLUSTER_EXTRA",
    "DaskExecutor",
    "Executor",
    "GridTask",
    "ProcessExecutor",
    "SequentialExecutor",
    "as_executor",
    "import_distributed",
    "make_executor",
    "run_grid",
    "run_grid_curves",
    "run_grid_task",
    "set_torch_threads",
    "trial_seeds",
]
