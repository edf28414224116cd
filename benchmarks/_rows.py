"""Rows of a benchmark script's runs: failures recorded beside results, merged into a CSV.

Shared by the scripts that replay BoTorch tutorials with the model class swapped
(``closed_loop.py``, ``turbo.py``); imported as a sibling module (``benchmarks/`` is the
script's directory, so it is on ``sys.path``).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd


def run_recording_failure(
    run: Callable[[], None], label: str, row: dict, counter: str, rows: list, failures: list
) -> None:
    r"""Call ``run`` (which appends its rows to ``rows``); if it raises, print the
    traceback, add ``row`` with the error (``error``) and the failed step's number
    (``counter``: the rows the run added, plus one) to ``rows`` and ``"label: error"``
    to ``failures``, and go on."""
    before = len(rows)
    try:
        run()
    except Exception as error:  # record it and go on with the other runs
        message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        failures.append(f"{label}: {message}")
        traceback.print_exc()
        rows.append({**row, counter: len(rows) - before + 1, "error": message})


def merge_rows(rows: list, path: Path, key: Sequence[str], order: Sequence[str]) -> pd.DataFrame:
    r"""Merge ``rows`` into the CSV at ``path`` (a row with an existing ``key`` replaces
    the old one), sorted by ``order``; returns the whole table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    if path.exists() and path.stat().st_size > 0:
        old = pd.read_csv(path, keep_default_na=False, na_values=[""])
        frame = pd.concat([old, frame], ignore_index=True)
        frame = frame.drop_duplicates(subset=list(key), keep="last")
    frame = frame.sort_values(list(order))
    frame.to_csv(path, index=False)
    return frame


def print_failures(failures: Sequence[str]) -> None:
    if failures:
        print("\nfailed:")
        for line in failures:
            print(" ", line)
