"""``benchmarks/bo_high_dim.py``'s committed traces: a finished run's per-step trace is kept
gzipped (the copy a clone has), and a clone without the loop's ``.csv`` resumes and
summarises from it as from the ``.csv``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module():
    spec = importlib.util.spec_from_file_location("bo_high_dim", BENCHMARKS / "bo_high_dim.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bo_high_dim"] = module
    spec.loader.exec_module(module)
    return module


def _trace(path: Path, steps: int, trial: int) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "step": range(steps + 1),
            "best_value": [0.1 * i for i in range(steps + 1)],
            "step_time": [1.0 + 0.01 * i for i in range(steps + 1)],
            "model": "exact",
            "trial": trial,
        }
    )
    path.parent.mkdir(parents=True)
    frame.to_csv(path, index=False)
    return frame


def test_finished_traces_are_gzipped_and_read_back_without_the_csv(tmp_path):
    bo = _module()
    done = bo.run_directory(tmp_path, "levy10", "exact", 0) / "bo_levy_qlogei.csv"
    partial = bo.run_directory(tmp_path, "levy10", "exact", 1) / "bo_levy_qlogei.csv"
    expected = _trace(done, 200, trial=0)
    _trace(partial, 40, trial=1)

    bo.compress_finished_traces(tmp_path, steps=200)
    packed = done.with_name(done.name + ".gz")
    assert packed.exists() and not partial.with_name(partial.name + ".gz").exists()
    first = packed.read_bytes()
    bo.compress_finished_traces(tmp_path, steps=200)
    assert packed.read_bytes() == first  # no timestamp: an unchanged trace, the same bytes

    with_csv = bo.read_runs(tmp_path)
    done.unlink()  # a fresh clone: the committed .gz only
    assert bo.finished(tmp_path, "levy10", "exact", 0, 200)
    assert not bo.finished(tmp_path, "levy10", "exact", 1, 200)
    without_csv = bo.read_runs(tmp_path)
    pd.testing.assert_frame_equal(without_csv, with_csv)
    read_back = without_csv[without_csv["trial"] == 0].drop(columns="function")
    pd.testing.assert_frame_equal(read_back.reset_index(drop=True), expected)
