"""Executors: a grid on Dask / local processes gives the sequential results, survives a
killed worker (the interrupted run resumes from its checkpoint), and errors are clear."""

import os
import signal
import sys
import threading
import time

import pandas as pd
import pytest
import torch

from streamgp.loops import AcquisitionOptions
from streamgp.loops.executors import (
    DaskExecutor,
    ProcessExecutor,
    SequentialExecutor,
    as_executor,
    make_executor,
)
from streamgp.loops.experiments import run_bo_experiment, run_stream_experiment
from streamgp.loops.stream import StreamConfig

TINY = AcquisitionOptions(num_restarts=2, raw_samples=16, batch_limit=2, maxiter=5)
STEPS = 3
MODELS = ("wiski", "exact")
TRIALS = 2
GRID = dict(
    models=MODELS,
    trials=TRIALS,
    steps=STEPS,
    q=2,
    num_init=4,
    fit_max_iter=5,
    acquisition_options=TINY,
    model_options={"wiski": {"grid_size": 6}},
    progress=False,
    plots=False,
)
CSV = "bo_levy_qucb.csv"


def numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """The merged CSV without its wall-clock columns (the rest is fixed by the seeds)."""
    return frame[[c for c in frame if not c.endswith("_time")]]


def check_complete(frame: pd.DataFrame) -> None:
    """Every (model, trial, step) exactly once, in grid order."""
    keys = frame[["trial", "model", "step"]]
    assert not keys.duplicated().any()
    assert len(frame) == len(MODELS) * TRIALS * (STEPS + 1)
    expected = [(t, m, s) for t in range(TRIALS) for m in MODELS for s in range(STEPS + 1)]
    assert list(keys.itertuples(index=False, name=None)) == expected


# ---------------------------------------------------------------------- fast tests
def test_make_executor_and_as_executor_choose_the_right_executor():
    assert isinstance(make_executor(), SequentialExecutor)
    assert make_executor().torch_threads is None
    process = make_executor(processes=3)
    assert isinstance(process, ProcessExecutor) and process.torch_threads == 1
    assert make_executor(processes=2, torch_threads=4).torch_threads == 4
    with pytest.raises(ValueError, match="at most one of"):
        make_executor(workers=2, scheduler="tcp://localhost:8786")
    with pytest.raises(ValueError, match="torch_threads"):
        SequentialExecutor(0)
    executor = SequentialExecutor()
    assert as_executor(executor) is executor
    with pytest.raises(TypeError, match="distributed.Client"):
        as_executor("tcp://localhost:8786")


def test_sequential_executor_sets_and_restores_torch_threads():
    before = torch.get_num_threads()
    seen = SequentialExecutor(torch_threads=1).map(lambda _: torch.get_num_threads(), [0, 1])
    assert seen == [1, 1] and torch.get_num_threads() == before


@pytest.fixture
def one_thread():
    """One torch thread (as the workers; also avoids oversubscribing a busy machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_sequential_executor_gives_the_default_results(tmp_path, one_thread):
    grid = {**GRID, "trials": 1, "models": ["wiski"]}
    default = run_bo_experiment("levy", out=tmp_path / "a", **grid)
    explicit = run_bo_experiment("levy", out=tmp_path / "b", executor=SequentialExecutor(), **grid)
    pd.testing.assert_frame_equal(numbers(default), numbers(explicit))
    # A fresh run (no resume) ignores a stale checkpoint; a resumed one continues it.
    again = run_bo_experiment("levy", out=tmp_path / "a", **grid)
    pd.testing.assert_frame_equal(numbers(default), numbers(again))
    assert not again["step_time"].equals(default["step_time"])
    resumed = run_bo_experiment("levy", out=tmp_path / "a", resume=True, **grid)
    pd.testing.assert_series_equal(resumed["step_time"], again["step_time"])


def test_first_trial_adds_seeds_without_repeating_the_first_ones(tmp_path, one_thread):
    grid = {**GRID, "models": ["wiski"]}
    both = run_bo_experiment("levy", out=tmp_path / "both", **grid)
    later = run_bo_experiment(
        "levy", out=tmp_path / "later", **{**grid, "trials": 1}, first_trial=1
    )
    assert later["trial"].unique().tolist() == [1]
    expected = both[both["trial"] == 1].reset_index(drop=True)
    pd.testing.assert_frame_equal(numbers(later), numbers(expected))
    with pytest.raises(ValueError, match="first_trial"):
        run_bo_experiment("levy", **{**grid, "trials": 1}, first_trial=-1)
    with pytest.raises(ValueError, match="trials"):
        run_bo_experiment("levy", **{**grid, "trials": 0})


def synthetic_split(seed):
    from streamgp.datasets import make_streaming_split, synthetic_regression

    return make_streaming_split(synthetic_regression(200, 2, seed=seed), seed=seed)


STREAM = dict(
    name="synthetic",
    models=["wiski", "exact"],
    trials=2,
    num_evals=2,
    max_stream=6,
    config=StreamConfig(pretrain_steps=10, num_inducing=16, grid_size=10),
    progress=False,
    plots=False,
)


def stream_reference(out):
    """The original sequential streaming runner, with one torch thread as the workers."""
    return run_stream_experiment(
        synthetic_split, out=out, executor=SequentialExecutor(torch_threads=1), **STREAM
    )


def test_missing_dask_names_the_extra(monkeypatch, capsys):
    from streamgp.cli import main

    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    with pytest.raises(ImportError, match=r"streamgp\[cluster\]"):
        DaskExecutor(workers=2)
    with pytest.raises(SystemExit) as error:
        main(["bo", "--workers", "2", "--no-progress"])
    assert "pip install 'streamgp[cluster]'" in str(error.value)


# ---------------------------------------------------------------------- cluster tests
@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    """The reference: the grid run sequentially with one torch thread, as the workers."""
    out = tmp_path_factory.mktemp("sequential")
    run_bo_experiment("levy", out=out, executor=SequentialExecutor(torch_threads=1), **GRID)
    return pd.read_csv(out / CSV)


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip(
        "distributed", reason="Dask executor tests need dask[distributed] (streamgp[cluster])"
    )
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.mark.slow
def test_dask_grid_gives_the_sequential_results(client, sequential, tmp_path):
    returned = run_bo_experiment("levy", out=tmp_path, executor=client, **GRID)
    merged = pd.read_csv(tmp_path / CSV)
    check_complete(merged)
    pd.testing.assert_frame_equal(numbers(merged), numbers(sequential))
    pd.testing.assert_frame_equal(numbers(pd.read_csv(tmp_path / CSV)), numbers(returned))
    # Each task wrote its checkpoint as a sequential run does.
    names = {f"bo_levy_qucb_{m}_{t}.pt" for m in MODELS for t in range(TRIALS)}
    assert {path.name for path in (tmp_path / "checkpoints").iterdir()} == names
    # The tasks ran with one torch thread each.
    assert set(client.run(torch.get_num_threads).values()) == {1}


@pytest.mark.slow
def test_dask_stream_grid_gives_the_sequential_results(client, tmp_path):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ship synthetic_split
    try:
        parallel = run_stream_experiment(synthetic_split, out=tmp_path, executor=client, **STREAM)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    reference = stream_reference(tmp_path / "reference")
    pd.testing.assert_frame_equal(numbers(parallel), numbers(reference))


# Run in each worker: every loop step first sleeps, so a run can be killed mid-way.
SLOW_DOWN = """
import time
from streamgp.loops.base import Loop
if not hasattr(Loop, "_original_step"):
    Loop._original_step = Loop.step
    def step(self):
        time.sleep({delay})
        return Loop._original_step(self)
    Loop.step = step
"""
RESTORE = """
from streamgp.loops.base import Loop
if hasattr(Loop, "_original_step"):
    Loop.step = Loop._original_step
    del Loop._original_step
"""


@pytest.mark.slow
def test_killed_worker_task_resumes_from_its_checkpoint(client, sequential, tmp_path):
    names = [f"bo_levy_qucb_{m}_{t}" for t in range(TRIALS) for m in MODELS]
    client.run(exec, SLOW_DOWN.replace("{delay}", "1.0"), {})
    outcome = {}

    def run():
        try:
            outcome["results"] = run_bo_experiment(
                "levy", out=tmp_path, executor=client, checkpoint_every=1, **GRID
            )
        except BaseException as error:  # noqa: BLE001 - reported below
            outcome["error"] = error

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        # Find a run that is processing and has checkpointed steps 0 and 1 but not finished.
        victim = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline and runner.is_alive():
            for address, keys in client.processing().items():
                for key in keys:
                    name = next((n for n in names if str(key).startswith(n + "-")), None)
                    checkpoint = tmp_path / "checkpoints" / f"{name}.pt"
                    if name is None or not checkpoint.exists():
                        continue
                    try:
                        history = torch.load(checkpoint, weights_only=False)["history"]
                    except Exception:  # noqa: BLE001 - being replaced; look again
                        continue
                    if 2 <= len(history) <= STEPS:
                        victim = address, name, history
            time.sleep(0.05)
        assert victim is not None, "no run was caught mid-way"
        address, name, snapshot = victim
        pid = client.run(os.getpid, workers=[address])[address]
        os.kill(pid, signal.SIGKILL)
        runner.join(timeout=120)
        assert not runner.is_alive(), "the grid did not finish after a worker was killed"
    finally:
        client.run(exec, RESTORE, {}, on_error="ignore")
    if "error" in outcome:
        raise outcome["error"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker really died

    merged = pd.read_csv(tmp_path / CSV)
    check_complete(merged)  # nothing lost, nothing twice
    pd.testing.assert_frame_equal(numbers(merged), numbers(sequential))
    # The interrupted run kept the steps of its checkpoint (their own timings): it resumed.
    model, trial = name.split("_")[-2], int(name.split("_")[-1])
    run_rows = merged[(merged["model"] == model) & (merged["trial"] == trial)]
    kept = [record["step_time"] for record in snapshot]
    assert run_rows["step_time"].iloc[: len(kept)].tolist() == pytest.approx(kept, rel=1e-12)


@pytest.mark.slow
def test_process_executor_gives_the_sequential_results_and_resubmits(sequential, tmp_path):
    with ProcessExecutor(2) as executor:
        run_bo_experiment("levy", out=tmp_path, executor=executor, **GRID)
    pd.testing.assert_frame_equal(numbers(pd.read_csv(tmp_path / CSV)), numbers(sequential))
    # A task that kills its process every time is resubmitted once, then reported.
    with pytest.raises(RuntimeError, match=r"died 2 time\(s\)"):
        ProcessExecutor(1, max_resubmits=1).map(os._exit, [3])
