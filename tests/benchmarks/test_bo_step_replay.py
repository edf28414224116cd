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
