"""``benchmarks/bo_step_replay.py``: a replay continues a run from its checkpoint, with the
run's own settings, and leaves the checkpoint as it was."""

from __future__ import annotations


def test_a_replay_continues_the_run_and_leaves_its_checkpoint_alone(tmp_path, short_exact_run):
    import bo_step_replay

    # Unfinished runs are not replayed (the table's runs reach STEPS).
    assert bo_step_replay.checkpoint_of(tmp_path, "hartmann6", "exact", 0) is None
    checkpoint = short_exact_run
    before = checkpoint.read_bytes()
    result = bo_step_replay.replay("hartmann6", "exact", 0, checkpoint, steps=1)
    assert result["n_start"] == 12 + 2 * 3 and result["steps"] == 1
    assert result["s_per_step"] > 0 and result["acquisition_s_per_step"] > 0
    assert checkpoint.read_bytes() == before


def test_a_models_runs_can_come_from_another_table(benchmarks_path, tmp_path):
    import pytest
    from bo_step_replay import tables_of

    tables = tables_of(["exact", "wiski"], tmp_path, [f"wiski={tmp_path / 'rerun'}"])
    assert tables == {"exact": tmp_path, "wiski": tmp_path / "rerun"}
    with pytest.raises(ValueError, match="--table-of 'softki=x'"):
        tables_of(["exact", "wiski"], tmp_path, ["softki=x"])
