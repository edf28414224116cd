"""``benchmarks/same_data_fit.py``: both models get the exact GP run's data and its start,
maximise the same objective, and the run's checkpoint is left as it was."""

from __future__ import annotations


def test_both_models_fit_the_exact_runs_data_from_one_start(short_exact_run):
    import same_data_fit

    checkpoint = short_exact_run
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
