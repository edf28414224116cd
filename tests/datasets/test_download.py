import gzip
import http.server
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from helpers_datasets import write_canonical

from streamgp.datasets import (
    ChecksumError,
    download_dataset,
    get_dataset_spec,
    load_dataset,
    verify_dataset,
)
from streamgp.datasets import download as download_module
from streamgp.datasets.download import gzip_text, sha256_bytes, sha256_file, write_atomic
from streamgp.datasets.registry import DATASETS

# --- origin-format writers: the inverse of each converter --------------------------------


def _canonical_rows(text: str) -> list[list[str]]:
    return [line.split(",") for line in text.splitlines()[1:]]


def headerless_csv_gz(text: str, spec) -> dict[str, bytes]:
    body = "".join(",".join(row) + "\n" for row in _canonical_rows(text))
    return {spec.origin_files[0]: gzip.compress(body.encode())}


def powerplant_csv(text: str, spec) -> dict[str, bytes]:
    # The origin is a CSV with a named header and old-Mac CR line endings.
    rows = ["AT,V,AP,RH,PE", *(",".join(r) for r in _canonical_rows(text))]
    return {spec.origin_files[0]: ("\r".join(rows) + "\r").encode()}


def xy_txt_pairs(text: str, spec) -> dict[str, bytes]:
    files = {}
    rows = _canonical_rows(text)
    for split, (x_name, y_name) in zip(
        ("train", "test"), (spec.origin_files[0:2], spec.origin_files[2:4]), strict=True
    ):
        part = [r for r in rows if r[-1] == split]
        files[x_name] = "".join(",".join(r[:-2]) + "\n" for r in part).encode()
        files[y_name] = "".join(("1" if r[-2] == "1" else "-1") + "\n" for r in part).encode()
    return files


def libsvm_pair(text: str, spec) -> dict[str, bytes]:
    files = {}
    rows = _canonical_rows(text)
    for split, name in zip(("train", "test"), spec.origin_files, strict=True):
        lines = [
            r[-2] + " " + " ".join(f"{i + 1}:{v}" for i, v in enumerate(r[:-2]))
            for r in rows
            if r[-1] == split
        ]
        files[name] = ("\n".join(lines) + "\n").encode()
    return files


ORIGIN_WRITERS = {
    "headerless_csv_gz": headerless_csv_gz,
    "powerplant_csv": powerplant_csv,
    "xy_txt_pairs": xy_txt_pairs,
    "libsvm_pair": libsvm_pair,
}


def write_origin(root: Path, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root.as_uri() + "/"


# Small canonical texts, one per origin format (tokens in the styles the sources use).
SMALL = {
    "skillcraft": "x0,x1,y\n4178.4,0.87927,-1.9095\n-7.255e-05,2.3496,0.0077056\n",
    "powerplant": "x0,x1,x2,x3,y\n14.96,41.76,1024.07,73.17,463.26\n"
    "25.18,62.96,1020.04,59.08,444.37\n",
    "banana": "x0,x1,label,split\n-0.7808,-0.11324,1,train\n1.3595,-0.1174,0,train\n"
    "0.4261,0.1938,0,test\n",
    "svmguide1": "x0,x1,x2,x3,label,split\n2.617300e+01,5.886700e+01,-1.894697e-01,1.251225e+02,1,"
    "train\n0.000000e+00,1.154780e+02,1.504970e-01,1.096315e+02,0,test\n",
}


@pytest.fixture
def small_origin(monkeypatch, tmp_path):
    r"""Register small versions of four datasets (one per origin format) and write their
    origin files; returns ``name -> (base_url, canonical text)``."""
    out = {}
    for name, text in SMALL.items():
        spec = get_dataset_spec(name)
        d = len(text.splitlines()[0].split(",")) - (2 if spec.task == "classification" else 1)
        spec = replace(spec, num_features=d, sha256=sha256_bytes(gzip_text(text)))
        monkeypatch.setitem(DATASETS, name, spec)
        origin = tmp_path / "origin" / name
        out[name] = (write_origin(origin, ORIGIN_WRITERS[spec.source_format](text, spec)), text)
    return out


@pytest.mark.parametrize("name", sorted(SMALL))
def test_download_from_file_url_converts_and_verifies(small_origin, tmp_path, name):
    base_url, text = small_origin[name]
    data_dir = tmp_path / "data" / "nested"  # created on demand
    path = download_dataset(name, data_dir, base_url=base_url)
    assert path == data_dir / get_dataset_spec(name).file_name
    assert gzip.decompress(path.read_bytes()).decode() == text
    assert verify_dataset(name, data_dir)
    assert sorted(p.name for p in data_dir.iterdir()) == [path.name]  # no temporary left
    assert path.stat().st_mode & 0o444 == 0o444


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_root(tmp_path):
    root = tmp_path / "http"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_QuietHandler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_download_over_http_from_localhost(small_origin, http_root, tmp_path):
    root, url = http_root
    spec = get_dataset_spec("banana")
    write_origin(root, xy_txt_pairs(SMALL["banana"], spec))
    path = download_dataset("banana", tmp_path / "data", base_url=url)
    assert sha256_file(path) == spec.sha256
    # A missing file on the server is an OSError naming the URL; nothing is written.
    with pytest.raises(OSError, match=r"Could not download http://127\.0\.0\.1.*skillcraft"):
        download_dataset("skillcraft", tmp_path / "data2", base_url=url)
    assert not (tmp_path / "data2").exists()


def test_wrong_checksum_raises_and_writes_nothing(small_origin, monkeypatch, tmp_path):
    base_url, _ = small_origin["powerplant"]
    bad = replace(get_dataset_spec("powerplant"), sha256="0" * 64)
    monkeypatch.setitem(DATASETS, "powerplant", bad)
    data_dir = tmp_path / "data"
    with pytest.raises(ChecksumError, match="expected sha256 0{64}, got [0-9a-f]{64}.*Nothing"):
        download_dataset("powerplant", data_dir, base_url=base_url)
    assert not data_dir.exists() or not any(data_dir.iterdir())
    # ChecksumError is a ValueError, so generic handlers catch it.
    assert issubclass(ChecksumError, ValueError)


def test_existing_files_are_checked_not_refetched(small_origin, tmp_path):
    base_url, text = small_origin["skillcraft"]
    data_dir = tmp_path / "data"
    first = download_dataset("skillcraft", data_dir, base_url=base_url)
    # A verified file is returned without touching the (now unreachable) origin.
    assert download_dataset("skillcraft", data_dir, base_url="file:///nonexistent/") == first
    first.write_bytes(b"corrupt")
    with pytest.raises(ChecksumError, match="overwrite=True"):
        download_dataset("skillcraft", data_dir, base_url=base_url)
    assert first.read_bytes() == b"corrupt"  # left alone without overwrite
    assert not verify_dataset("skillcraft", data_dir)
    download_dataset("skillcraft", data_dir, base_url=base_url, overwrite=True)
    assert gzip.decompress(first.read_bytes()).decode() == text


def test_failed_checksum_keeps_an_existing_file(small_origin, monkeypatch, tmp_path):
    base_url, _ = small_origin["banana"]
    data_dir = tmp_path / "data"
    existing = write_canonical(data_dir, "banana.csv.gz", "x0,x1,label,split\n0,0,0,train\n")
    bad = replace(get_dataset_spec("banana"), sha256="f" * 64)
    monkeypatch.setitem(DATASETS, "banana", bad)
    before = existing.read_bytes()
    with pytest.raises(ChecksumError):
        download_dataset("banana", data_dir, base_url=base_url, overwrite=True)
    assert existing.read_bytes() == before
    assert sorted(p.name for p in data_dir.iterdir()) == ["banana.csv.gz"]


def test_datasets_without_verified_origin_are_refused(tmp_path):
    for name in ("3droad", "malaria-full"):
        with pytest.raises(ValueError, match="no verified download origin"):
            download_dataset(name, tmp_path)
    with pytest.raises(ValueError, match="Unknown dataset"):
        download_dataset("mnist", tmp_path)
    with pytest.raises(ValueError, match="no registered checksum"):
        verify_dataset("3droad", tmp_path)


@pytest.mark.parametrize(
    ("name", "files", "message"),
    [
        ("skillcraft", {"uci_datasets/skillcraft/data.csv.gz": b"not gzip"}, "not a valid gzip"),
        (
            "skillcraft",
            {"uci_datasets/skillcraft/data.csv.gz": gzip.compress(b"1,2,3\n4,5\n")},
            "line 2: expected 3 comma-separated values",
        ),
        ("powerplant", {"Folds5x2_pp.csv": b"A,B,C,D,E\r1,2,3,4,5\r"}, "expected header"),
        (
            "banana",
            {
                "data/banana_train_x.txt": b"1,2\n3,4\n",
                "data/banana_train_y.txt": b"1\n",
                "data/banana_test_x.txt": b"1,2\n",
                "data/banana_test_y.txt": b"1\n",
            },
            "has 2 rows but .* has 1 labels",
        ),
        (
            "banana",
            {
                "data/banana_train_x.txt": b"1,2\n",
                "data/banana_train_y.txt": b"2\n",
                "data/banana_test_x.txt": b"1,2\n",
                "data/banana_test_y.txt": b"1\n",
            },
            "label '2' is not one of",
        ),
        ("svmguide1", {"data/svmguide1": b"1 1:2 9:3\n", "data/svmguide1.t": b""}, "index 9"),
        ("svmguide1", {"data/svmguide1": b"1 1-2\n", "data/svmguide1.t": b""}, "bad LIBSVM"),
    ],
)
def test_malformed_origin_files_raise_clear_errors(small_origin, tmp_path, name, files, message):
    base_url = write_origin(tmp_path / "bad", files)
    with pytest.raises(ValueError, match=message):
        download_dataset(name, tmp_path / "data", base_url=base_url)
    assert not (tmp_path / "data").exists()


def test_libsvm_fills_missing_indices_and_maps_minus_one(small_origin, monkeypatch, tmp_path):
    spec = get_dataset_spec("svmguide1")
    files = {"data/svmguide1": b"-1 2:5\n+1 1:1 2:2 3:3 4:4\n", "data/svmguide1.t": b"1 4:7\n"}
    text = download_module.convert_libsvm_pair(list(files.values()), spec)
    assert text.splitlines()[1:] == ["0,5,0,0,0,train", "1,2,3,4,1,train", "0,0,0,7,1,test"]


def test_write_atomic_leaves_nothing_on_failure(monkeypatch, tmp_path):
    target = tmp_path / "file.csv.gz"
    target.write_bytes(b"old")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(download_module.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.csv.gz"]


@pytest.mark.parametrize(
    "name", ["skillcraft", "elevators", "protein", "powerplant", "banana", "svmguide1"]
)
def test_download_reproduces_the_reference_files(shared_data, tmp_path, name):
    # Rebuild the origin files from the reference file, serve them from a file:// URL and
    # download with the *real* registry checksum: the result is byte-identical.
    spec = get_dataset_spec(name)
    text = gzip.decompress((shared_data / spec.file_name).read_bytes()).decode()
    base_url = write_origin(tmp_path / "origin", ORIGIN_WRITERS[spec.source_format](text, spec))
    path = download_dataset(name, tmp_path / "data", base_url=base_url)
    assert path.read_bytes() == (shared_data / spec.file_name).read_bytes()


def test_load_dataset_can_download_a_missing_file(small_origin, monkeypatch, tmp_path):
    base_url, text = small_origin["banana"]
    spec = replace(get_dataset_spec("banana"), origin_base_url=base_url)
    monkeypatch.setitem(DATASETS, "banana", spec)
    with pytest.raises(FileNotFoundError, match="download_dataset"):
        load_dataset("banana", tmp_path / "data")
    data = load_dataset("banana", tmp_path / "data", download=True)
    assert data.Y.tolist() == [1, 0, 0] and data.is_test.tolist() == [False, False, True]
    assert verify_dataset("banana", tmp_path / "data")
