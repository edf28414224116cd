"""Summaries of experiment curves (``streamgp.loops.experiments``)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from streamgp.loops.experiments import summarize, summarize_seeds


def _curves() -> pd.DataFrame:
    """Two models; wiski's trial 1 stopped at step 2, the others ran to step 4."""
    rows = []
    for model, trials in (("wiski", {0: 4, 1: 2, 2: 4}), ("exact", {0: 4})):
        for trial, last in trials.items():
            for step in range(last + 1):
                rows.append(
                    {
                        "model": model,
                        "trial": trial,
                        "step": step,
                        "num_observations": 5 + 3 * step,
                        "best_value": 10.0 * trial + step + (100.0 if model == "exact" else 0.0),
                        "step_time": 0.1 * (trial + 1) * step,
                    }
                )
    return pd.DataFrame(rows)


def test_summarize_seeds_reports_each_trial_that_reached_the_step():
    table = summarize_seeds(_curves(), ["model"], "best_value", [2, 4]).set_index(["model", "step"])
    at_two = table.loc[("wiski", 2)]
    assert at_two["trials"] == 3
    assert at_two["values"] == [2.0, 12.0, 22.0]
    assert at_two["mean"] == pytest.approx(12.0)
    assert at_two["sd"] == pytest.approx(10.0)  # ddof = 1
    assert at_two["median"] == 12.0
    # step times of steps 1..2 of every trial: 0.1 (k + 1) s * step
    assert at_two["time/step (s)"] == pytest.approx(
        sum(0.1 * k * s for k in (1, 2, 3) for s in (1, 2)) / 6
    )
    at_four = table.loc[("wiski", 4)]
    assert at_four["trials"] == 2 and at_four["values"] == [4.0, 24.0]
    assert at_four["median"] == pytest.approx(14.0)
    exact = table.loc[("exact", 4)]
    assert exact["trials"] == 1 and exact["mean"] == 104.0 and math.isnan(exact["sd"])


def test_summarize_seeds_skips_steps_no_trial_reached():
    table = summarize_seeds(_curves(), ["model"], "best_value", [4, 9])
    assert sorted(table["step"].unique()) == [4]


def test_summarize_seeds_names_missing_columns():
    with pytest.raises(ValueError, match="step_time"):
        summarize_seeds(_curves().drop(columns="step_time"), ["model"], "best_value", [2])


def test_summarize_takes_the_final_step_of_the_longest_trials():
    table = summarize(_curves(), ["model"], "best_value", last=1).set_index("model")
    assert table.loc["wiski", "steps"] == 4
    assert table.loc["wiski", "observations"] == 17
    assert table.loc["wiski", "best_value"] == pytest.approx((4.0 + 24.0) / 2)
    # first step's times (0.1, 0.2, 0.3) against the last step's (0.4, 1.2)
    assert table.loc["wiski", "last/first"] == pytest.approx(0.8 / 0.2)
