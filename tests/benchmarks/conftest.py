"""Shared setup of the benchmark scripts' tests: ``benchmarks/`` importable, and a short
run of the d = 6-20 BO table's settings (what the replay scripts read)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def benchmarks_path(monkeypatch):
    r"""``benchmarks/`` on ``sys.path`` (a fresh ``bo_high_dim`` module each test)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bo_high_dim", raising=False)


@pytest.fixture
def short_exact_run(tmp_path, benchmarks_path) -> Path:
    r"""The exact GP's Hartmann-6 run of 2 steps (12 initial points, q = 3) with the
    table's acquisition and refit interval, under ``tmp_path`` as the table lays it out;
    returns its checkpoint."""
    from bo_high_dim import ACQUISITION, FIT_EVERY, run_directory

    from streamgp.loops import AcquisitionOptions
    from streamgp.loops.experiments import run_bo_experiment

    run_bo_experiment(
        "hartmann",
        models=["exact"],
        acquisition=ACQUISITION,
        steps=2,
        dim=6,
        q=3,
        num_init=12,
        fit_every=FIT_EVERY,
        fit_max_iter=5,
        acquisition_options=AcquisitionOptions(num_restarts=2, raw_samples=16, maxiter=5),
        out=run_directory(tmp_path, "hartmann6", "exact", 0),
        progress=False,
        plots=False,
    )
    (checkpoint,) = (run_directory(tmp_path, "hartmann6", "exact", 0) / "checkpoints").glob("*.pt")
    return checkpoint
