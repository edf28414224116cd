"""``benchmarks/bo_step_replay.py``: a replay continues a run from its checkpoint, with the
run's own settings, and leaves the checkpoint as it was."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_replay_continues_the_run_and_leaves_its_checkpoint_alone(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bo_high_dim", raising=False)
    import bo_step_replay
    from bo_high_dim import run_directory

    from streamgp.loops import AcquisitionOptions
    from streamgp.loops.experiments import run_bo_experiment

    # A short run of the table's settings (one refit every FIT_EVERY steps).
    run_bo_experiment(
        "hartmann",
        models=["exact"],
        acquisition=bo_step_replay.ACQUISITION,
        steps=2,
        dim=6,
        q=3,
        num_init=12,
        fit_every=bo_step_replay.FIT_EVERY,
        fit_max_iter=5,
        acquisition_options=AcquisitionOptions(num_restarts=2, raw_samples=16, maxiter=5),
        out=run_directory(tmp_path, "hartmann6", "exact", 0),
        progress=False,
        plots=False,
    )
    # Unfinished runs are not replayed (the table's runs reach STEPS).
    assert bo_step_replay.checkpoint_of(tmp_path, "hartmann6", "exact", 0) is None
    (checkpoint,) = (run_directory(tmp_path, "hartmann6", "exact", 0) / "checkpoints").glob("*.pt")
    before = checkpoint.read_bytes()
    result = bo_step_replay.replay("hartmann6", "exact", 0, checkpoint, steps=1)
    assert result["n_start"] == 12 + 2 * 3 and result["steps"] == 1
    assert result["s_per_step"] > 0 and result["acquisition_s_per_step"] > 0
    assert checkpoint.read_bytes() == before
