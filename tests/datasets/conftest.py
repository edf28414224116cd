"""Fixtures for the dataset tests (helpers live in tests/helpers_datasets.py)."""

from pathlib import Path

import pytest
from helpers_datasets import SHARED_DATA, tiny_spec

from streamgp.datasets.registry import DATASETS


@pytest.fixture
def shared_data() -> Path:
    if SHARED_DATA is None:
        pytest.skip(
            "shared benchmark data not found (set STREAMGP_DATA or provide ../shared/data "
            "with its MANIFEST.md); users' machines do not have it"
        )
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _isolated_data_env(monkeypatch, tmp_path):
    # Tests must never read or write a user's real cache: point every default at tmp.
    monkeypatch.delenv("STREAMGP_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def tiny_registry(monkeypatch):
    r"""Register the tiny fixture datasets for the duration of a test."""
    specs = {task: tiny_spec(task) for task in ("regression", "classification")}
    for spec in specs.values():
        monkeypatch.setitem(DATASETS, spec.name, spec)
    return specs
