"""``benchmarks/turbo.py``: the TuRBO-1 tutorial's trust-region rules, and one iteration
of the loop with ``WiskiGP`` swapped in (a Matern kernel in 20-D)."""

from __future__ import annotations

import math


def test_the_trust_region_follows_turbos_rules(benchmarks_path):
    import torch
    from turbo import TrustRegion

    state = TrustRegion(best_value=-5.0)
    assert state.failure_tolerance == 5 and state.success_tolerance == 10
    for _ in range(4):
        state.update(torch.tensor([-6.0]))
    assert state.length == 0.8  # four failures: not yet
    state.update(torch.tensor([-6.0]))
    assert state.length == 0.4 and state.failures == 0
    for step in range(10):
        state.update(torch.tensor([-4.0 + step]))  # improves by more than 1e-3 relative
    assert state.length == 0.8 and state.best_value == 5.0
    state.length = 0.5**7 / 1.5
    assert state.restart


def test_one_iteration_with_wiskigp_and_the_tutorials_kernel(benchmarks_path):
    import turbo
    from gpytorch.kernels import MaternKernel

    rows: list[dict] = []
    turbo.run_loop(turbo.WiskiGP, "ts", seed=0, max_evals=41, rows=rows, common={"machine": "x"})
    assert len(rows) == 1
    (row,) = rows
    assert row["n"] == turbo.N_INITIAL and row["model"] == "WiskiGP"
    assert math.isfinite(row["best_value"]) and row["best_value"] <= 0.0
    model = turbo.build_model(turbo.WiskiGP, *_initial(turbo))
    assert isinstance(model.covar_module.base_kernel, MaternKernel)
    assert model.evaluates_kernel_exactly


def _initial(turbo):
    from torch.quasirandom import SobolEngine

    X = SobolEngine(turbo.DIM, scramble=True, seed=0).draw(turbo.N_INITIAL).to(turbo.DTYPE)
    Y = turbo.evaluate(X)
    return X, (Y - Y.mean()) / Y.std()


def test_a_failed_run_is_recorded_and_rows_merge_by_key(benchmarks_path, tmp_path):
    from _rows import merge_rows, run_recording_failure

    rows: list[dict] = [{"model": "a", "step": 1, "value": 1.0}]
    failures: list[str] = []

    def run():
        rows.extend([{"model": "b", "step": 1, "value": 2.0}, {"model": "b", "step": 2}])
        raise RuntimeError("diverged\nsecond line")

    run_recording_failure(run, "b seed 0", {"model": "b"}, "step", rows, failures)
    assert rows[-1] == {"model": "b", "step": 3, "error": "RuntimeError: diverged"}
    assert failures == ["b seed 0: RuntimeError: diverged"]
    path = tmp_path / "rows.csv"
    key = ["model", "step"]
    merge_rows(rows, path, key, key)
    frame = merge_rows([{"model": "a", "step": 1, "value": 5.0}], path, key, key)
    assert len(frame) == 4 and frame.loc[frame["model"] == "a", "value"].tolist() == [5.0]
