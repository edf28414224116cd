r"""Loaders for the benchmark datasets of the WISKI paper (Stanton et al., AISTATS 2021).

Regression: skillcraft, powerplant, elevators, protein (UCI, as prepared by Wilson
et al. 2016) and 3droad (user-provided, see :func:`load_3droad`); classification:
banana and svmguide1. Each loader reads the canonical ``.csv.gz`` file (layout in
:mod:`streamgp.datasets.registry`) from the data directory and returns a
:class:`TabularData` with tensors and the pandas frame. For the train/test split,
scaling and the pretraining subset of the paper's protocol, pass the result to
:func:`streamgp.datasets.make_streaming_split`.

Example:
    >>> from streamgp.datasets import load_dataset
    >>> data = load_dataset("powerplant", data_dir="../shared/data")  # doctest: +SKIP
    >>> data.X.shape, data.Y.shape  # doctest: +SKIP
    (torch.Size([9568, 4]), torch.Size([9568, 1]))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from streamgp.datasets.download import download_dataset, gzip_text, write_atomic
from streamgp.datasets.registry import (
    CLASSIFICATION,
    DATASETS,
    REGRESSION,
    DatasetSpec,
    dataset_path,
    get_dataset_spec,
    resolve_data_dir,
)


@dataclass(frozen=True)
class TabularData:
    r"""A loaded dataset: inputs, targets and (optionally) the source's split.

    Attributes:
        name: Dataset name.
        task: ``"regression"`` or ``"classification"``.
        X: ``n x d`` inputs (floating, raw units).
        Y: ``n x 1`` floating targets (regression) or ``n`` integer labels
            ``0..C-1`` (classification, ``torch.long``).
        is_test: ``n`` boolean mask of the source's test rows, or ``None`` when the
            source has no split (then :func:`make_streaming_split` draws one).
        frame: The file as a pandas ``DataFrame`` (``None`` for synthetic data).
    """

    name: str
    task: str
    X: Tensor
    Y: Tensor
    is_test: Tensor | None = None
    frame: pd.DataFrame | None = None

    @property
    def num_features(self) -> int:
        return self.X.shape[-1]

    @property
    def num_classes(self) -> int | None:
        r"""Number of classes (``max label + 1``) or ``None`` for regression."""
        return int(self.Y.max().item()) + 1 if self.task == CLASSIFICATION else None

    def __len__(self) -> int:
        return self.X.shape[0]


def _check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}.")


def _read_frame(path: Path, spec: DatasetSpec) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError, EOFError) as error:
        raise ValueError(f"Could not read {path} as a CSV file: {error}") from None
    if tuple(frame.columns) != spec.columns:
        raise ValueError(
            f"{path} has columns {list(frame.columns)[:8]}..., expected {list(spec.columns)} "
            f"for dataset {spec.name!r}."
        )
    return frame


def frame_to_data(
    frame: pd.DataFrame,
    spec: DatasetSpec,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    source: str = "frame",
) -> TabularData:
    r"""Turn a frame in the canonical layout of ``spec`` into a :class:`TabularData`."""
    _check_dtype(dtype)
    features = [f"x{i}" for i in range(spec.num_features)]
    try:
        X64 = torch.as_tensor(frame[features].to_numpy(dtype="float64", copy=True))
    except (KeyError, ValueError) as error:
        raise ValueError(f"{source}: feature columns are not all numeric ({error}).") from None
    if not torch.isfinite(X64).all():
        raise ValueError(f"{source}: the features contain NaN or Inf values.")
    X = X64.to(dtype=dtype, device=device)
    if spec.task == REGRESSION:
        y = torch.as_tensor(frame["y"].to_numpy(dtype="float64", copy=True))
        if not torch.isfinite(y).all():
            raise ValueError(f"{source}: the target column contains NaN or Inf values.")
        return TabularData(
            spec.name, spec.task, X, y.unsqueeze(-1).to(dtype=dtype, device=device), None, frame
        )
    labels = frame["label"]
    if not pd.api.types.is_integer_dtype(labels) or (labels < 0).any():
        raise ValueError(f"{source}: labels must be non-negative integers 0..C-1.")
    splits = frame["split"].astype(str)
    if not splits.isin(["train", "test"]).all():
        raise ValueError(f"{source}: the split column must hold only 'train' or 'test'.")
    Y = torch.as_tensor(labels.to_numpy(dtype="int64", copy=True), device=device)
    is_test = torch.as_tensor((splits == "test").to_numpy(copy=True), device=device)
    return TabularData(spec.name, spec.task, X, Y, is_test, frame)


def load_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = False,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> TabularData:
    r"""Load a registered dataset from the data directory.

    Args:
        name: Dataset name, one of :func:`~streamgp.datasets.list_datasets`.
        data_dir: Directory holding the files; default ``$STREAMGP_DATA``, then the
            user cache (:func:`~streamgp.datasets.default_data_dir`).
        download: Fetch a missing file from its public origin (sha256-checked).
        dtype: Floating dtype of ``X`` (and ``Y`` for regression).
        device: Device of the tensors.

    Returns:
        The dataset (tensors, the source's split if any, and the frame).

    Raises:
        ValueError: Unknown name (lists what exists) or a malformed file.
        FileNotFoundError: The file is missing (says where it looked and how to
            get it).

    Example:
        >>> data = load_dataset("banana", data_dir="../shared/data")  # doctest: +SKIP
        >>> data.Y.dtype, int(data.is_test.sum())  # doctest: +SKIP
        (torch.int64, 4900)
    """
    spec = get_dataset_spec(name)
    _check_dtype(dtype)
    if spec.loader != "load_dataset":
        raise ValueError(
            f"Dataset {spec.name!r} has its own layout; load it with "
            f"streamgp.datasets.{spec.loader}."
        )
    if download and spec.downloadable:
        path = download_dataset(spec.name, data_dir)
    else:
        path = dataset_path(spec.name, data_dir)
    return frame_to_data(
        _read_frame(path, spec), spec, dtype=dtype, device=device, source=str(path)
    )


def load_skillcraft(data_dir: str | os.PathLike | None = None, **kwargs) -> TabularData:
    r"""SkillCraft1 (UCI): 3338 x 19, regression. See :func:`load_dataset`."""
    return load_dataset("skillcraft", data_dir, **kwargs)


def load_powerplant(data_dir: str | os.PathLike | None = None, **kwargs) -> TabularData:
    r"""Combined Cycle Power Plant (UCI): 9568 x 4, regression. See :func:`load_dataset`."""
    return load_dataset("powerplant", data_dir, **kwargs)


def load_elevators(data_dir: str | os.PathLike | None = None, **kwargs) -> TabularData:
    r"""Elevators (Torgo): 16599 x 18, regression. See :func:`load_dataset`."""
    return load_dataset("elevators", data_dir, **kwargs)


def load_protein(data_dir: str | os.PathLike | None = None, **kwargs) -> TabularData:
    r"""Protein tertiary structure (UCI): 45730 x 9, regression. See :func:`load_dataset`."""
    return load_dataset("protein", data_dir, **kwargs)


def load_banana(data_dir: str | os.PathLike | None = None, **kwargs) -> TabularData:
    r"""Banana: 400 train + 4900 test, 2-D, binary. See :func:`load_dataset`."""
    return load_dataset("banana", data_dir, **kwargs)


def load_svmguide1(data_dir: str | os.PathLike | None = None, **kwargs) -> TabularData:
    r"""svmguide1 (LIBSVM): 3089 train + 4000 test, 4-D, binary. See :func:`load_dataset`."""
    return load_dataset("svmguide1", data_dir, **kwargs)


# --- any regression table: user-provided CSV -------------------------------------------


def load_csv(
    path: str | os.PathLike,
    target: str,
    *,
    features: list[str] | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> TabularData:
    r"""Read a regression table of your own from a CSV file (header row required).

    Args:
        path: CSV file (``.csv`` or ``.csv.gz``) with a header row.
        target: Name of the target column.
        features: Names of the input columns; default: every other column.
        dtype: Floating dtype of ``X`` and ``Y``.
        device: Device of the tensors.

    Returns:
        A regression :class:`TabularData` named after the file (no source split):
        pass ``data.X, data.Y`` to
        :func:`~streamgp.datasets.make_standardized_split` for the SoftKI paper's
        protocol, or ``data`` to :func:`~streamgp.datasets.make_streaming_split`.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If ``target`` or a feature is not a column, a column is not
            numeric, a value is missing or not finite, or no feature is left.

    Example:
        >>> data = load_csv("my_data.csv", target="y")  # doctest: +SKIP
        >>> split = make_standardized_split(data.X, data.Y, seed=0)  # doctest: +SKIP
    """
    _check_dtype(dtype)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path {str(path)!r} is not a file.")
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError, EOFError) as error:
        raise ValueError(f"Could not read path {str(path)!r} as a CSV file: {error}") from None
    if not isinstance(target, str) or target not in frame.columns:
        raise ValueError(f"target {target!r} is not a column of {path}: {list(frame.columns)}.")
    if features is None:
        features = [c for c in frame.columns if c != target]
    missing = [c for c in features if c not in frame.columns]
    if missing or target in features or not features:
        raise ValueError(
            f"features must be a non-empty list of columns of {path} other than the target "
            f"{target!r}; got {features!r} (missing: {missing})."
        )
    source = str(path)
    try:
        X64 = torch.as_tensor(frame[features].to_numpy(dtype="float64", copy=True))
        y = torch.as_tensor(frame[target].to_numpy(dtype="float64", copy=True))
    except ValueError as error:
        raise ValueError(f"{source}: the columns are not all numeric ({error}).") from None
    if not torch.isfinite(X64).all() or not torch.isfinite(y).all():
        raise ValueError(f"{source}: the columns contain missing, NaN or Inf values.")
    name = path.name.removesuffix(".gz").removesuffix(".csv")
    return TabularData(
        name,
        REGRESSION,
        X64.to(dtype=dtype, device=device),
        y.unsqueeze(-1).to(dtype=dtype, device=device),
        None,
        frame,
    )


# --- 3droad: user-provided file --------------------------------------------------------


def read_3droad(path: str | os.PathLike) -> pd.DataFrame:
    r"""Read a user-provided 3D Road Network file into the canonical layout.

    Two formats are accepted:

    - the canonical layout: a CSV (optionally ``.gz``) with header ``x0,x1,y``;
    - the UCI file ``3D_spatial_network.txt`` as distributed by the UCI repository:
      no header, four comma-separated columns ``OSM_ID, LONGITUDE, LATITUDE,
      ALTITUDE``. The road-segment id is an identifier, not a measurement, and is
      dropped: ``x0`` = longitude, ``x1`` = latitude, ``y`` = altitude (metres).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The file is in neither format.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"3droad file {str(path)!r} does not exist. Download 3D_spatial_network.txt from "
            f"the UCI repository (3D Road Network, North Jutland) and pass its path."
        )
    spec = DATASETS["3droad"]
    try:
        head = pd.read_csv(path, header=None, nrows=1)
    except (OSError, ValueError, EOFError) as error:
        raise ValueError(f"Could not read {path} as a CSV file: {error}") from None
    first = [str(v).strip() for v in head.iloc[0]]
    if tuple(first) == spec.columns:
        return _read_frame(path, spec)
    if len(first) == 4:
        try:
            raw = pd.read_csv(path, header=None, dtype="float64")
        except ValueError as error:
            raise ValueError(f"{path}: expected 4 numeric columns ({error}).") from None
        return pd.DataFrame({"x0": raw[1], "x1": raw[2], "y": raw[3]})
    raise ValueError(
        f"{path} is neither the canonical 3droad layout (header x0,x1,y) nor the UCI "
        f"3D_spatial_network.txt format (4 columns: OSM_ID, lon, lat, altitude); its first "
        f"row is {first[:6]}."
    )


def load_3droad(
    path: str | os.PathLike | None = None,
    data_dir: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> TabularData:
    r"""3D Road Network (UCI), regression of altitude on longitude/latitude.

    3droad (434,874 rows) is not shipped and has no verified download; use a file
    you obtained from the UCI repository.

    Args:
        path: A file in one of the formats of :func:`read_3droad`. If ``None``,
            ``3droad.csv.gz`` is read from the data directory (see
            :func:`import_3droad`).
        data_dir: Data directory used when ``path`` is ``None``.
        dtype: Floating dtype of the tensors.
        device: Device of the tensors.

    Example:
        >>> data = load_3droad("~/Downloads/3D_spatial_network.txt")  # doctest: +SKIP
    """
    _check_dtype(dtype)
    frame = read_3droad(dataset_path("3droad", data_dir) if path is None else path)
    return frame_to_data(frame, DATASETS["3droad"], dtype=dtype, device=device, source="3droad")


def import_3droad(path: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> Path:
    r"""Convert a user-provided 3droad file into ``3droad.csv.gz`` in the data directory.

    Afterwards ``load_dataset("3droad")`` works like any other dataset. The input
    tokens are re-printed by pandas (shortest round-trip float64), so no precision
    is lost.

    Returns:
        Path of the written file.
    """
    frame = read_3droad(path)
    target = resolve_data_dir(data_dir) / DATASETS["3droad"].file_name
    return write_atomic(target, gzip_text(frame.to_csv(index=False, float_format=None)))
