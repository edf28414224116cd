import gzip
import importlib.util
from fnmatch import fnmatch

import pytest
import tomllib
import torch
from helpers_datasets import REPO_ROOT

from streamgp.datasets import load_malaria, malaria_subset_path
from streamgp.datasets.download import gzip_text, sha256_file
from streamgp.datasets.malaria import MALARIA_SUBSET_FILE, MALARIA_SUBSET_SHA256


def test_shipped_subset_is_in_the_package_and_small():
    path = malaria_subset_path()
    assert path.is_file() and path.name == MALARIA_SUBSET_FILE
    assert path.parent.parent == REPO_ROOT / "src" / "streamgp" / "datasets"
    assert path.stat().st_size < 3_000_000
    assert sha256_file(path) == MALARIA_SUBSET_SHA256


def test_pyproject_ships_the_subset_as_package_data():
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["streamgp.datasets"]
    assert any(fnmatch(f"data/{MALARIA_SUBSET_FILE}", pattern) for pattern in patterns)


def test_load_shipped_subset_without_shared_data(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMGP_DATA", str(tmp_path / "empty"))  # nothing to find there
    malaria = load_malaria()
    n = len(malaria)
    assert n == 64364 and malaria.source == malaria_subset_path()
    assert malaria.X.shape == (n, 2) and malaria.Y.shape == (n, 1) and malaria.Yvar.shape == (n, 1)
    assert malaria.X.dtype == malaria.Y.dtype == malaria.Yvar.dtype == torch.float64
    lon, lat = malaria.X[:, 0], malaria.X[:, 1]
    assert 11.7 < lon.min() < lon.max() < 35.5 and -14.0 < lat.min() < lat.max() < 5.7
    assert 0 <= malaria.Y.min() and malaria.Y.max() < 0.6
    # A regular 5-arcmin grid: every second cell of the 2.5-arcmin atlas.
    spacing = torch.diff(lon.unique()).median().item()
    assert spacing == pytest.approx(1 / 12, abs=1e-6)
    # Noise variances are std^2, floored for the zero-uncertainty cells.
    std = torch.as_tensor(malaria.frame["incidence_std"].to_numpy(copy=True)).unsqueeze(-1)
    assert torch.equal(malaria.Yvar, (std**2).clamp_min(1e-6))
    assert (std == 0).any() and (malaria.Yvar > 0).all()
    raw = load_malaria(min_noise_variance=0.0, dtype=torch.float32)
    assert raw.Yvar.dtype == torch.float32 and (raw.Yvar == 0).any()
    assert torch.equal(raw.Yvar, (std**2).float())


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="min_noise_variance must be >= 0"):
        load_malaria(min_noise_variance=-1.0)
    with pytest.raises(TypeError, match="dtype must be a floating"):
        load_malaria(dtype=torch.long)
    with pytest.raises(FileNotFoundError, match="malaria_central_africa_2017.csv.gz"):
        load_malaria(full=True, data_dir=tmp_path)
    bad = tmp_path / "malaria_central_africa_2017.csv.gz"
    bad.write_bytes(gzip_text("lon,lat,z\n1,2,3\n"))
    with pytest.raises(ValueError, match="lacks the columns"):
        load_malaria(full=True, data_dir=tmp_path)


def test_full_file_and_subset_derivation(shared_data):
    full = load_malaria(full=True, data_dir=shared_data)
    assert len(full) == 256579 and full.X.shape == (256579, 2)
    # Every shipped row is a row of the full file, with identical values.
    subset = load_malaria()
    key = ["lon", "lat"]
    merged = subset.frame.merge(full.frame, on=key, suffixes=("", "_full"), how="left")
    assert (merged["incidence"] == merged["incidence_full"]).all()
    assert (merged["incidence_std"] == merged["incidence_std_full"]).all()
    # The derivation script reproduces the shipped file byte for byte.
    spec = importlib.util.spec_from_file_location(
        "make_malaria_subset", REPO_ROOT / "scripts" / "make_malaria_subset.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = script.make_subset(shared_data / "malaria_central_africa_2017.csv.gz")
    assert gzip_text(text) == malaria_subset_path().read_bytes()
    assert gzip.decompress(gzip_text(text)).count(b"\n") == len(subset) + 1
