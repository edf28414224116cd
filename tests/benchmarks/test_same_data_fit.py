"""``benchmarks/same_data_fit.py``: both models get the exact GP run's data and its start,
maximise the same objective, and the run's checkpoint is left as it was."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_both_models_fit_the_exact_runs_data_from_one_start(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bo_high_dim", raising=False)
    import same_data_fit
    from bo_high_dim import run_directory

    from streamgp.loops import AcquisitionOptions
    from streamgp.loops.experiments import run_bo_experiment

    run_bo_experiment(
        "hartmann",
        models=["exact"],
        acquisition=same_data_fit.ACQUISITION,
        steps=2,
        dim=6,
        q=3,
        num_init=12,
        fit_every=same_data_fit.FIT_EVERY,
        fit_max_iter=5,
        acquisition_options=AcquisitionOptions(num_restarts=2, raw_samples=16, maxiter=5),
        out=run_directory(tmp_path, "hartmann6", "exact", 0),
        progress=False,
        plots=False,
    )
    (checkpoint,) = (run_directory(tmp_path, "hartmann6", "exact", 0) / "checkpoints").glob("*.pt")
    before = checkpoint.read_bytes()
    X, Y = same_data_fit.exact_data("hartmann6", 0, checkpoint)
    assert X.shape == (12 + 2 * 3, 6) and Y.shape == (18, 1)
    assert checkpoint.read_bytes() == before
    start = same_data_fit.hyperparameters(same_data_fit.build("exact", X, Y, None))
    models = {name: same_data_fit.build(name, X, Y, start) for name in same_data_fit.MODELS}
    assert models["wiski"].evaluates_kernel_exactly
    results = {name: same_data_fit.fit(model) for name, model in models.items()}
    for result in results.values():
        assert result["iterations"] > 0 and result["evaluations"] >= result["iterations"]
    # The same objective from the same start: the same optimum, to the optimiser's tolerance.
    assert abs(results["wiski"]["loss"] - results["exact"]["loss"]) < 1e-4
