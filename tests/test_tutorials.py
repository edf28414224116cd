r"""The tutorial notebooks run top to bottom (quick mode) and are stored executed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip(
    "nbclient",
    reason="executing notebooks needs the tutorials extra: pip install 'streamgp[tutorials]'",
)
pytest.importorskip("ipykernel", reason="the tutorials extra provides the kernel (ipykernel)")

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
_spec = importlib.util.spec_from_file_location("run_notebooks", TUTORIALS / "run_notebooks.py")
run_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_notebooks)
NOTEBOOKS = run_notebooks.notebooks()


def test_there_are_tutorials():
    assert NOTEBOOKS, f"no notebooks in {TUTORIALS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_notebook_is_executed_with_outputs(path):
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    # Stored executed in order, top to bottom (make tutorials), with at least one figure.
    counts = [cell.get("execution_count") for cell in code]
    assert all(count is not None for count in counts), f"{path.name} has unexecuted cells"
    assert counts == sorted(counts), f"{path.name} was not executed top to bottom"
    outputs = [out for cell in code for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.get("output_type") == "error"]
    assert any("image/png" in out.get("data", {}) for out in outputs), f"{path.name}: no figure"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path):
    # Quick mode (STREAMGP_TUTORIAL_QUICK=1), in a fresh kernel; a failing cell fails here.
    executed = run_notebooks.execute_notebook(path, quick=True, write=False, timeout=600)
    errors = [
        out
        for cell in executed.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors
