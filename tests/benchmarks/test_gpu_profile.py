"""``benchmarks/gpu_profile.py`` runs on a GPU only when a device is lent (minutes a
session): its CPU dry run here keeps it from failing there on a bug a CPU can catch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_cpu_dry_run_writes_every_section(tmp_path):
    command = [
        sys.executable,
        "gpu_profile.py",
        "--device",
        "cpu",
        "--quick",
        "--repeats",
        "1",
        "--block-sizes",
        "16,32",
        "--out",
        str(tmp_path),
    ]
    subprocess.run(command, cwd=BENCHMARKS, check=True, capture_output=True, timeout=600)
    (result,) = tmp_path.glob("gpu_profile-*.json")
    results = json.loads(result.read_text())
    for dtype in ("float32", "float64"):
        mll = results[f"mll {dtype}"]
        assert mll["aten_ops"] > 0 and mll["ms"] > 0
        sweep = mll["by lanczos block size"]
        assert [row["block size"] for row in sweep] == [16, 32]
        assert all(row["aten_ops"] > 0 and row["ms"] > 0 for row in sweep)
        assert results[f"update {dtype}"]["aten_ops"] > 0
    assert (tmp_path / result.name.replace(".json", ".txt")).read_text().startswith("====")
