import re
from pathlib import Path

import pytest
from helpers_datasets import CLASSIFICATION_TEXT, write_canonical

from streamgp.datasets import (
    DATASETS,
    available_datasets,
    dataset_path,
    default_data_dir,
    get_dataset_spec,
    list_datasets,
)
from streamgp.datasets.registry import resolve_data_dir

ALL = ["3droad", "banana", "elevators", "malaria-full", "powerplant", "protein", "skillcraft",
       "svmguide1"]  # fmt: skip


def test_list_datasets_and_task_filter():
    assert list_datasets() == ALL
    assert list_datasets("classification") == ["banana", "svmguide1"]
    assert "powerplant" in list_datasets("regression")
    assert "banana" not in list_datasets("regression")
    with pytest.raises(ValueError, match="task must be"):
        list_datasets("clustering")


def test_get_dataset_spec_names_what_exists():
    assert get_dataset_spec(" PowerPlant ").name == "powerplant"
    with pytest.raises(ValueError, match="Unknown dataset 'nope'.*banana.*svmguide1"):
        get_dataset_spec("nope")
    with pytest.raises(TypeError, match="name must be a str"):
        get_dataset_spec(3)


def test_spec_columns_and_origins():
    assert get_dataset_spec("powerplant").columns == ("x0", "x1", "x2", "x3", "y")
    assert get_dataset_spec("banana").columns == ("x0", "x1", "label", "split")
    assert get_dataset_spec("malaria-full").columns[:3] == ("lon", "lat", "incidence")
    skill = get_dataset_spec("skillcraft")
    assert skill.origin_urls == (
        "https://raw.githubusercontent.com/treforevans/uci_datasets/"
        "f0737523712fe66a1640e4b980b927e8490b58eb/uci_datasets/skillcraft/data.csv.gz",
    )
    assert len(get_dataset_spec("banana").origin_urls) == 4
    assert not get_dataset_spec("3droad").downloadable
    assert not get_dataset_spec("malaria-full").downloadable
    for name in ("skillcraft", "elevators", "protein", "powerplant", "banana", "svmguide1"):
        spec = get_dataset_spec(name)
        assert spec.downloadable and re.fullmatch(r"[0-9a-f]{64}", spec.sha256)
        assert all(url.startswith("https://") for url in spec.origin_urls)


def test_registry_matches_the_data_manifest(shared_data):
    manifest = (shared_data / "MANIFEST.md").read_text()
    for spec in DATASETS.values():
        if spec.sha256 is None:
            continue
        row = next(line for line in manifest.splitlines() if f"`{spec.file_name}`" in line)
        assert f"`{spec.sha256}`" in row, spec.name
        assert f"| {spec.num_rows} " in row.replace(f"{spec.num_rows} (", f"{spec.num_rows} "), (
            spec.name
        )


def test_default_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMGP_DATA", str(tmp_path / "env"))
    assert default_data_dir() == tmp_path / "env"
    monkeypatch.delenv("STREAMGP_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "streamgp"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".cache" / "streamgp"
    assert resolve_data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    with pytest.raises(TypeError, match="data_dir must be"):
        resolve_data_dir(42)


def test_dataset_path_errors_list_what_exists(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*download_dataset"):
        dataset_path("powerplant", tmp_path / "missing")
    write_canonical(tmp_path, "banana.csv.gz", CLASSIFICATION_TEXT)
    assert dataset_path("banana", tmp_path) == tmp_path / "banana.csv.gz"
    assert available_datasets(tmp_path) == ["banana"]
    with pytest.raises(FileNotFoundError, match="holds: banana.*download_dataset"):
        dataset_path("skillcraft", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"load_3droad\(path=...\)"):
        dataset_path("3droad", tmp_path)
    with pytest.raises(ValueError, match="Unknown dataset"):
        dataset_path("banana2", tmp_path)


def test_env_var_selects_the_data_dir(monkeypatch, tmp_path):
    write_canonical(tmp_path, "banana.csv.gz", CLASSIFICATION_TEXT)
    monkeypatch.setenv("STREAMGP_DATA", str(tmp_path))
    assert dataset_path("banana") == Path(tmp_path) / "banana.csv.gz"
    assert available_datasets() == ["banana"]
