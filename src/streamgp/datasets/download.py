r"""Checksummed download of benchmark datasets from their public origins.

:func:`download_dataset` fetches the origin files of a registered dataset (see
:mod:`streamgp.datasets.registry`), converts them to the canonical layout (one
gzip-compressed CSV with a header row), checks the sha256 of the result against the
registry and only then moves it into the data directory. A wrong checksum raises
:class:`ChecksumError` and writes nothing; the final file appears atomically
(``os.replace`` of a temporary file in the same directory), so an interrupted
download never leaves a partial file under the dataset's name. Only the standard
library is used (``urllib``, ``hashlib``, ``gzip``, ``tempfile``).

The checksum is of the *converted* file: the canonical files are deterministic
(tokens are copied verbatim, gzip level 9 with mtime 0 and no file name), so the
same origin bytes always give the same sha256. The origins are raw
``githubusercontent.com`` URLs pinned to the commit the project's reference files
were built from, so their content cannot drift.

What is verified and what is assumed: the converters were checked by round trip on
the project's reference files (rebuilding each origin format from the reference
file and converting it back reproduces the registered sha256 byte for byte), and
the banana and LIBSVM formats were compared with public copies of the origin files.
The downloads themselves were never run against the internet while this code was
written (no network access), so for the three ``treforevans/uci_datasets`` files
the delimiter (comma) and for the power plant file the header (``AT,V,AP,RH,PE``) and
line endings are taken from the data manifest rather than observed.

Example:
    >>> from streamgp.datasets import download_dataset
    >>> path = download_dataset("powerplant")  # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from streamgp.datasets.registry import DatasetSpec, get_dataset_spec, resolve_data_dir


class ChecksumError(ValueError):
    r"""The sha256 of a downloaded (converted) dataset differs from the registry."""


def sha256_bytes(data: bytes) -> str:
    r"""Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    r"""Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def gzip_text(text: str) -> bytes:
    r"""Deterministic gzip of UTF-8 ``text`` (level 9, mtime 0, no file name).

    These are the settings of the project's reference files, so the same text
    always compresses to the same bytes (and the same sha256).
    """
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(text.encode("utf-8"))
    return buffer.getvalue()


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    r"""Write ``data`` to ``path`` through a temporary file in the same directory.

    The file appears under its name only once complete; on any error the temporary
    file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(
        dir=path.parent, prefix=f".{path.name}.", suffix=".part", delete=False
    )
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # NamedTemporaryFile creates 0600; data files are meant to be readable.
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return path


# --- converters: origin bytes -> canonical CSV text -----------------------------------


def _lines(data: bytes, source: str) -> list[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{source} is not UTF-8 text: {error}.") from None
    # Old-Mac CR, Windows CRLF and Unix LF line endings all occur in the origins.
    return [line.strip() for line in re.split(r"\r\n|\r|\n", text) if line.strip()]


def _rows(text: str) -> str:
    return "".join(line + "\n" for line in text)


def _check_width(fields: list[str], width: int, source: str, line_no: int) -> None:
    if len(fields) != width or any(not f for f in fields):
        raise ValueError(
            f"{source}, line {line_no}: expected {width} comma-separated values, got "
            f"{len(fields)} ({','.join(fields)[:80]!r})."
        )


def convert_headerless_csv_gz(parts: Sequence[bytes], spec: DatasetSpec) -> str:
    r"""``treforevans/uci_datasets`` ``data.csv.gz``: gzip CSV, no header, target last."""
    (data,) = parts
    try:
        raw = gzip.decompress(data)
    except (OSError, EOFError) as error:
        raise ValueError(f"{spec.origin_files[0]} is not a valid gzip file: {error}.") from None
    lines = _lines(raw, spec.origin_files[0])
    width = spec.num_features + 1
    for i, line in enumerate(lines):
        _check_width(line.split(","), width, spec.origin_files[0], i + 1)
    return _rows([",".join(spec.columns), *lines])


def convert_powerplant_csv(parts: Sequence[bytes], spec: DatasetSpec) -> str:
    r"""UCI power plant sheet as CSV with header ``AT,V,AP,RH,PE`` (CR line endings)."""
    (data,) = parts
    lines = _lines(data, spec.origin_files[0])
    expected = "AT,V,AP,RH,PE"
    if not lines or lines[0].replace(" ", "") != expected:
        found = lines[0][:80] if lines else "an empty file"
        raise ValueError(f"{spec.origin_files[0]}: expected header {expected!r}, got {found!r}.")
    for i, line in enumerate(lines[1:]):
        _check_width(line.split(","), 5, spec.origin_files[0], i + 2)
    return _rows([",".join(spec.columns), *lines[1:]])


def _binary_label(token: str, source: str, line_no: int) -> str:
    labels = {"-1": "0", "0": "0", "1": "1", "+1": "1"}
    if token not in labels:
        raise ValueError(f"{source}, line {line_no}: label {token!r} is not one of -1/+1/0/1.")
    return labels[token]


def convert_xy_txt_pairs(parts: Sequence[bytes], spec: DatasetSpec) -> str:
    r"""Banana: ``{train,test}_x.txt`` (comma-separated) and ``_y.txt`` (-1/+1 labels)."""
    rows = [",".join(spec.columns)]
    names = spec.origin_files
    for split, (x_data, y_data), (x_name, y_name) in zip(
        ("train", "test"), (parts[0:2], parts[2:4]), (names[0:2], names[2:4]), strict=True
    ):
        x_lines, y_lines = _lines(x_data, x_name), _lines(y_data, y_name)
        if len(x_lines) != len(y_lines):
            raise ValueError(
                f"{x_name} has {len(x_lines)} rows but {y_name} has {len(y_lines)} labels."
            )
        for i, (x_line, y_line) in enumerate(zip(x_lines, y_lines, strict=True)):
            _check_width(x_line.split(","), spec.num_features, x_name, i + 1)
            rows.append(f"{x_line},{_binary_label(y_line, y_name, i + 1)},{split}")
    return _rows(rows)


def convert_libsvm_pair(parts: Sequence[bytes], spec: DatasetSpec) -> str:
    r"""LIBSVM sparse format (``label idx:value ...``), a train and a test file.

    Missing indices are filled with ``0`` (LIBSVM's convention for sparse rows);
    labels -1/+1 become 0/1, labels 0/1 are kept.
    """
    rows = [",".join(spec.columns)]
    for split, data, name in zip(("train", "test"), parts, spec.origin_files, strict=True):
        for i, line in enumerate(_lines(data, name)):
            label, *entries = line.split()
            values = ["0"] * spec.num_features
            for entry in entries:
                index, sep, value = entry.partition(":")
                if not sep or not index.isdigit() or not value:
                    raise ValueError(f"{name}, line {i + 1}: bad LIBSVM entry {entry!r}.")
                if not 1 <= int(index) <= spec.num_features:
                    raise ValueError(
                        f"{name}, line {i + 1}: feature index {index} outside "
                        f"1..{spec.num_features}."
                    )
                values[int(index) - 1] = value
            rows.append(f"{','.join(values)},{_binary_label(label, name, i + 1)},{split}")
    return _rows(rows)


CONVERTERS: dict[str, Callable[[Sequence[bytes], DatasetSpec], str]] = {
    "headerless_csv_gz": convert_headerless_csv_gz,
    "powerplant_csv": convert_powerplant_csv,
    "xy_txt_pairs": convert_xy_txt_pairs,
    "libsvm_pair": convert_libsvm_pair,
}


# --- download -----------------------------------------------------------------------


def _fetch(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise OSError(f"Could not download {url}: {error}") from error


def download_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    base_url: str | None = None,
    overwrite: bool = False,
    timeout: float = 60.0,
) -> Path:
    r"""Fetch a dataset from its public origin, verify its sha256 and store it.

    Args:
        name: Registered dataset name (see :func:`~streamgp.datasets.list_datasets`).
        data_dir: Target directory (created if needed); default
            :func:`~streamgp.datasets.default_data_dir`.
        base_url: Replaces the origin's URL prefix (a mirror, or a ``file://`` /
            ``http://localhost`` URL in tests); the origin's relative file paths
            are appended to it.
        overwrite: Replace an existing file whose checksum is wrong. A file with
            the right checksum is never downloaded again.
        timeout: Seconds per HTTP request.

    Returns:
        Path of the verified file in the data directory.

    Raises:
        ValueError: Unknown name, or a dataset without a verified origin (3droad,
            the full malaria file).
        ChecksumError: The converted download does not match the registered
            sha256 (nothing is written), or an existing file does not and
            ``overwrite`` is false.
        OSError: The origin could not be reached.

    Example:
        >>> path = download_dataset("banana", "/tmp/streamgp-data")  # doctest: +SKIP
    """
    spec = get_dataset_spec(name)
    if not spec.downloadable:
        raise ValueError(
            f"Dataset {spec.name!r} has no verified download origin ({spec.upstream}); "
            f"place {spec.file_name!r} in the data directory yourself."
        )
    target = resolve_data_dir(data_dir) / spec.file_name
    if target.is_file():
        actual = sha256_file(target)
        if actual == spec.sha256:
            return target
        if not overwrite:
            raise ChecksumError(
                f"{target} exists but its sha256 is {actual}, not {spec.sha256}; pass "
                f"overwrite=True to download it again."
            )
    prefix = spec.origin_base_url if base_url is None else base_url
    if not prefix.endswith("/"):
        prefix += "/"
    urls = [prefix + path for path in spec.origin_files]
    parts = [_fetch(url, timeout) for url in urls]
    data = gzip_text(CONVERTERS[spec.source_format](parts, spec))
    actual = sha256_bytes(data)
    if actual != spec.sha256:
        raise ChecksumError(
            f"Checksum mismatch for {spec.name!r} downloaded from {', '.join(urls)}: "
            f"expected sha256 {spec.sha256}, got {actual}. Nothing was written to {target}."
        )
    return write_atomic(target, data)


def verify_dataset(name: str, data_dir: str | os.PathLike | None = None) -> bool:
    r"""Whether the dataset's file exists and matches its registered sha256.

    Raises:
        ValueError: Unknown name, or the dataset has no registered checksum.
    """
    spec = get_dataset_spec(name)
    if spec.sha256 is None:
        raise ValueError(f"Dataset {spec.name!r} has no registered checksum.")
    path = resolve_data_dir(data_dir) / spec.file_name
    return path.is_file() and sha256_file(path) == spec.sha256
