import gzip

import pytest
import torch
from helpers_datasets import CLASSIFICATION_TEXT, REGRESSION_TEXT, write_canonical

from streamgp.datasets import (
    get_dataset_spec,
    import_3droad,
    load_3droad,
    load_banana,
    load_dataset,
    load_elevators,
    load_powerplant,
    load_protein,
    load_skillcraft,
    load_svmguide1,
    read_3droad,
)


def test_regression_fixture(tiny_registry, tmp_path):
    write_canonical(tmp_path, "tiny-regression.csv.gz", REGRESSION_TEXT)
    data = load_dataset("tiny-regression", tmp_path)
    assert data.task == "regression" and data.name == "tiny-regression"
    assert data.X.shape == (40, 3) and data.Y.shape == (40, 1) and len(data) == 40
    assert data.X.dtype == data.Y.dtype == torch.float64
    assert data.is_test is None and data.num_classes is None and data.num_features == 3
    assert data.X[3].tolist() == [1.5, 0.0, 7.25]
    assert data.Y[:, 0].tolist() == pytest.approx([i * 0.1 - 1 for i in range(40)])
    assert list(data.frame.columns) == ["x0", "x1", "x2", "y"]
    single = load_dataset("tiny-regression", tmp_path, dtype=torch.float32)
    assert single.X.dtype == single.Y.dtype == torch.float32


def test_classification_fixture_keeps_labels_and_split(tiny_registry, tmp_path, monkeypatch):
    write_canonical(tmp_path, "tiny-classification.csv.gz", CLASSIFICATION_TEXT)
    monkeypatch.setenv("STREAMGP_DATA", str(tmp_path))  # found through the env var
    data = load_dataset("tiny-classification")
    assert data.X.shape == (24, 2) and data.Y.shape == (24,)
    assert data.Y.dtype == torch.long and data.num_classes == 2
    assert data.Y.tolist() == [i % 3 % 2 for i in range(24)]
    assert data.is_test.dtype == torch.bool
    assert data.is_test.tolist() == [i % 4 == 0 for i in range(24)]


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("a,b,c,y\n1,2,3,4\n", ValueError, "has columns"),
        ("x0,x1,x2,y\n1,2,3,nan\n", ValueError, "target column contains NaN"),
        ("x0,x1,x2,y\n1,inf,3,4\n", ValueError, "features contain NaN"),
        ("x0,x1,x2,y\n1,abc,3,4\n", ValueError, "not all numeric"),
    ],
)
def test_malformed_regression_files(tiny_registry, tmp_path, text, error, message):
    write_canonical(tmp_path, "tiny-regression.csv.gz", text)
    with pytest.raises(error, match=message):
        load_dataset("tiny-regression", tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x0,x1,label,split\n1,2,0.5,train\n", "labels must be non-negative integers"),
        ("x0,x1,label,split\n1,2,-1,train\n", "labels must be non-negative integers"),
        ("x0,x1,label,split\n1,2,1,valid\n", "only 'train' or 'test'"),
    ],
)
def test_malformed_classification_files(tiny_registry, tmp_path, text, message):
    write_canonical(tmp_path, "tiny-classification.csv.gz", text)
    with pytest.raises(ValueError, match=message):
        load_dataset("tiny-classification", tmp_path)


def test_unreadable_file_and_bad_arguments(tiny_registry, tmp_path):
    (tmp_path / "tiny-regression.csv.gz").write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(ValueError, match="Could not read"):
        load_dataset("tiny-regression", tmp_path)
    with pytest.raises(TypeError, match="dtype must be a floating"):
        load_dataset("tiny-regression", tmp_path, dtype=torch.int64)
    with pytest.raises(ValueError, match="Unknown dataset 'skilcraft'.*skillcraft"):
        load_dataset("skilcraft", tmp_path)
    with pytest.raises(FileNotFoundError, match="needs 'banana.csv.gz'"):
        load_dataset("banana", tmp_path)
    with pytest.raises(ValueError, match=r"load_malaria\(full=True\)"):
        load_dataset("malaria-full", tmp_path)


# --- 3droad: user-provided files ----------------------------------------------------------

UCI_3DROAD = (
    "144552912,9.3498486,56.7408757,17.0527715677876\n"
    "144552912,9.3501884,56.7406785,17.6148496119079\n"
    "125829521,9.3610592,56.7390098,-0.0154016413656\n"
)


def test_3droad_from_the_uci_text_format(tmp_path):
    path = tmp_path / "3D_spatial_network.txt"
    path.write_text(UCI_3DROAD)
    data = load_3droad(path)
    assert data.name == "3droad" and data.task == "regression"
    assert data.X.shape == (3, 2) and data.Y.shape == (3, 1)
    assert data.X[0].tolist() == [9.3498486, 56.7408757]  # lon, lat; OSM id dropped
    assert data.Y[:, 0].tolist() == [17.0527715677876, 17.6148496119079, -0.0154016413656]


def test_3droad_import_then_load_like_any_dataset(tmp_path):
    source = tmp_path / "3D_spatial_network.txt"
    source.write_text(UCI_3DROAD)
    written = import_3droad(source, tmp_path / "data")
    assert written == tmp_path / "data" / get_dataset_spec("3droad").file_name
    assert gzip.decompress(written.read_bytes()).decode().startswith("x0,x1,y\n9.3498486,")
    via_registry = load_dataset("3droad", tmp_path / "data")
    via_loader = load_3droad(data_dir=tmp_path / "data")
    direct = load_3droad(source, dtype=torch.float32)
    assert torch.equal(via_registry.X, via_loader.X)
    # The import re-prints floats in shortest round-trip form: no precision lost.
    assert via_registry.Y[:, 0].tolist() == [17.0527715677876, 17.6148496119079, -0.0154016413656]
    assert torch.equal(via_registry.Y.float(), direct.Y) and direct.X.dtype == torch.float32
    # The canonical layout is accepted as a user file too (gzip or plain).
    plain = tmp_path / "canonical.csv"
    plain.write_text(gzip.decompress(written.read_bytes()).decode())
    assert torch.equal(load_3droad(plain).X, via_registry.X)


def test_3droad_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*3D_spatial_network"):
        load_3droad(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="needs '3droad.csv.gz'"):
        load_3droad(data_dir=tmp_path)
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("1,2,3\n4,5,6\n")
    with pytest.raises(ValueError, match="neither the canonical 3droad layout"):
        read_3droad(wrong)
    text = tmp_path / "text.csv"
    text.write_text("1,2,3,4\n5,a,7,8\n")
    with pytest.raises(ValueError, match="expected 4 numeric columns"):
        read_3droad(text)


# --- the shared reference files -----------------------------------------------------------

SHAPES = {
    load_skillcraft: ("skillcraft", 3338, 19),
    load_powerplant: ("powerplant", 9568, 4),
    load_elevators: ("elevators", 16599, 18),
    load_protein: ("protein", 45730, 9),
}


@pytest.mark.parametrize("loader", list(SHAPES), ids=[v[0] for v in SHAPES.values()])
def test_shared_regression_files(shared_data, loader):
    name, n, d = SHAPES[loader]
    data = loader(shared_data)
    assert data.name == name and data.X.shape == (n, d) and data.Y.shape == (n, 1)
    assert data.X.dtype == torch.float64 and data.is_test is None
    assert torch.isfinite(data.X).all() and torch.isfinite(data.Y).all()


def test_shared_powerplant_values_are_raw_units(shared_data):
    data = load_powerplant(shared_data, dtype=torch.float32)
    assert data.X.dtype == torch.float32
    assert data.X[0].tolist() == pytest.approx([14.96, 41.76, 1024.07, 73.17])
    assert 420.0 < data.Y.min() < data.Y.max() < 496.0


def test_shared_classification_files(shared_data):
    banana = load_banana(shared_data)
    assert banana.X.shape == (5300, 2) and banana.num_classes == 2
    train = ~banana.is_test
    assert int(train.sum()) == 400
    assert torch.bincount(banana.Y[train]).tolist() == [218, 182]
    assert torch.bincount(banana.Y[banana.is_test]).tolist() == [2706, 2194]
    guide = load_svmguide1(shared_data)
    assert guide.X.shape == (7089, 4) and guide.Y.dtype == torch.long
    assert torch.bincount(guide.Y[~guide.is_test]).tolist() == [1089, 2000]
    assert torch.bincount(guide.Y[guide.is_test]).tolist() == [2000, 2000]
