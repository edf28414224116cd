r"""Registry of the benchmark datasets streamgp knows, and where their files live.

Every dataset has a :class:`DatasetSpec`: its task (``"regression"`` or
``"classification"``), the file name in the data directory, the column layout, the
public origin it can be downloaded from, and the sha256 checksum of the converted
file. The layout of every file is one gzip-compressed CSV with a header row:

- regression: feature columns ``x0 .. x{d-1}``, then the target ``y``;
- classification: ``x0 .. x{d-1}``, an integer ``label`` (classes ``0..C-1``) and a
  ``split`` column (``train`` / ``test``) keeping the split the source shipped.

Data directory (first match wins): the ``data_dir`` argument of a loader, the
``STREAMGP_DATA`` environment variable, ``$XDG_CACHE_HOME/streamgp``, and
``~/.cache/streamgp``.

Download origins: each downloadable dataset is fetched from the exact public git
commit its checksummed file was built from (raw.githubusercontent.com URLs pinned to
a commit, so the bytes cannot change under us); ``upstream`` names the original
host (UCI, LIBSVM, ...) for provenance. The malaria atlas subset ships inside the
package (:mod:`streamgp.datasets.malaria`).

Example:
    >>> from streamgp.datasets import list_datasets, get_dataset_spec
    >>> "powerplant" in list_datasets()
    True
    >>> get_dataset_spec("powerplant").num_features
    4
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DATA_ENV_VAR = "STREAMGP_DATA"

REGRESSION = "regression"
CLASSIFICATION = "classification"

_UCI_DATASETS_COMMIT = "f0737523712fe66a1640e4b980b927e8490b58eb"
_UCI_DATASETS_BASE = (
    f"https://raw.githubusercontent.com/treforevans/uci_datasets/{_UCI_DATASETS_COMMIT}/"
)


@dataclass(frozen=True)
class DatasetSpec:
    r"""Description of one benchmark dataset.

    Attributes:
        name: Registry name (``load_dataset(name)``).
        task: ``"regression"`` or ``"classification"``.
        file_name: File name inside the data directory (a ``.csv.gz`` in the layout
            described in the module docstring).
        num_features: Number of input columns ``d``.
        num_rows: Number of rows of the canonical file, or ``None`` if unknown.
        sha256: Checksum of the canonical file; ``None`` when no verified copy
            exists (then :func:`~streamgp.datasets.download_dataset` refuses).
        source_format: Name of the converter turning the origin files into the
            canonical layout (see :mod:`streamgp.datasets.download`); ``None`` if the
            dataset cannot be downloaded.
        origin_base_url: URL prefix the origin files are fetched from.
        origin_files: Paths of the origin files, relative to ``origin_base_url``.
        upstream: Human-readable original source (for citations).
        citation: Reference to cite when using the data.
        licence: Licence notes as known to this project.
        num_classes: Number of classes (classification only).
        column_names: Columns of a file that does not follow the standard layout
            (``None``: the standard layout).
        loader: Name of the function in :mod:`streamgp.datasets` that loads it.
    """

    name: str
    task: str
    file_name: str
    num_features: int
    num_rows: int | None
    sha256: str | None
    source_format: str | None
    origin_base_url: str | None
    origin_files: tuple[str, ...]
    upstream: str
    citation: str
    licence: str
    num_classes: int | None = None
    column_names: tuple[str, ...] | None = None
    loader: str = "load_dataset"

    @property
    def columns(self) -> tuple[str, ...]:
        r"""Column names of the canonical file, in order."""
        if self.column_names is not None:
            return self.column_names
        features = tuple(f"x{i}" for i in range(self.num_features))
        if self.task == CLASSIFICATION:
            return (*features, "label", "split")
        return (*features, "y")

    @property
    def origin_urls(self) -> tuple[str, ...]:
        r"""Full URLs of the origin files (empty if the dataset is not downloadable)."""
        if self.origin_base_url is None:
            return ()
        return tuple(self.origin_base_url + path for path in self.origin_files)

    @property
    def downloadable(self) -> bool:
        r"""Whether :func:`~streamgp.datasets.download_dataset` can fetch and verify it."""
        return self.source_format is not None and self.sha256 is not None


def _uci_datasets_spec(name: str, d: int, rows: int, sha256: str, upstream: str) -> DatasetSpec:
    return DatasetSpec(
        name=name,
        task=REGRESSION,
        file_name=f"{name}.csv.gz",
        num_features=d,
        num_rows=rows,
        sha256=sha256,
        source_format="headerless_csv_gz",
        origin_base_url=_UCI_DATASETS_BASE,
        origin_files=(f"uci_datasets/{name}/data.csv.gz",),
        upstream=upstream,
        citation="Dua & Graff (2017), UCI Machine Learning Repository; prepared as in "
        "Wilson et al. (2016) via github.com/treforevans/uci_datasets",
        licence="treforevans/uci_datasets is MIT; no separate data licence stated",
    )


_SPECS: tuple[DatasetSpec, ...] = (
    _uci_datasets_spec(
        "skillcraft",
        19,
        3338,
        "45ef40ef3a7cc63fec346fe3d57cf057e92c8a9dd0fa36bf3521fd2778cfeeba",
        "UCI SkillCraft1 Master Table (Thompson et al., PLoS ONE 2013)",
    ),
    _uci_datasets_spec(
        "elevators",
        18,
        16599,
        "0682749cdcd77f253f672fba93dd07a1bf3409dd30bf84c088d50e23eb51c04a",
        "elevators (F-16 aircraft control), L. Torgo's regression collection",
    ),
    _uci_datasets_spec(
        "protein",
        9,
        45730,
        "d2fb98baaf85084f4bc6ccdab873424d2db55d7ee7f982082b5c676d34c4685b",
        "UCI Physicochemical Properties of Protein Tertiary Structure (CASP 5-9)",
    ),
    DatasetSpec(
        name="powerplant",
        task=REGRESSION,
        file_name="powerplant.csv.gz",
        num_features=4,
        num_rows=9568,
        sha256="4c71d655640f13724a2ebe67349d56d2862d987082a5bd4c65a1511ee05facfd",
        source_format="powerplant_csv",
        origin_base_url="https://raw.githubusercontent.com/xiaoyulu2014/GPTmodule/"
        "27bc3a02814c14f27301b433cbbebf765c6f81a3/",
        origin_files=("Folds5x2_pp.csv",),
        upstream="UCI Combined Cycle Power Plant (archive.ics.uci.edu, dataset 294)",
        citation="Tüfekci, Int. J. Electrical Power & Energy Systems 60 (2014)",
        licence="source repo has no licence file; UCI dataset",
    ),
    DatasetSpec(
        name="3droad",
        task=REGRESSION,
        file_name="3droad.csv.gz",
        num_features=2,
        num_rows=None,
        sha256=None,
        source_format=None,
        origin_base_url=None,
        origin_files=(),
        upstream="UCI 3D Road Network (North Jutland, Denmark), file 3D_spatial_network.txt "
        "(archive.ics.uci.edu, dataset 246); user-provided, see load_3droad",
        citation="Kaul, Yang & Jensen, MDM 2013",
        licence="UCI dataset; check the UCI page for its current licence",
    ),
    DatasetSpec(
        name="banana",
        task=CLASSIFICATION,
        file_name="banana.csv.gz",
        num_features=2,
        num_rows=5300,
        sha256="34f7815a27e52073fa13331a426088c1b810eb8fafa6fed50354366941441dc0",
        source_format="xy_txt_pairs",
        origin_base_url="https://raw.githubusercontent.com/thangbui/streaming_sparse_gp/"
        "d95081b8a67316981088172124bc44e3c2235e49/",
        origin_files=(
            "data/banana_train_x.txt",
            "data/banana_train_y.txt",
            "data/banana_test_x.txt",
            "data/banana_test_y.txt",
        ),
        upstream="Banana benchmark of the Rätsch et al. (IDA) collection",
        citation="Rätsch, Onoda & Müller, Machine Learning 42 (2001)",
        licence="thangbui/streaming_sparse_gp is Apache-2.0",
        num_classes=2,
    ),
    DatasetSpec(
        name="svmguide1",
        task=CLASSIFICATION,
        file_name="svmguide1.csv.gz",
        num_features=4,
        num_rows=7089,
        sha256="8479de400442690bb7ec0929711d4b08fe6d388e18dc1ca5d314f5f7819e8919",
        source_format="libsvm_pair",
        origin_base_url="https://raw.githubusercontent.com/lxcnju/svm_gradient_descent/"
        "ffd8d329ca82435a6eff537c1e69ba66f8d61152/",
        origin_files=("data/svmguide1", "data/svmguide1.t"),
        upstream="LIBSVM binary dataset svmguide1 (www.csie.ntu.edu.tw/~cjlin/libsvmtools)",
        citation="Hsu, Chang & Lin, A Practical Guide to Support Vector Classification",
        licence="source repo has no licence file; LIBSVM dataset page",
        num_classes=2,
    ),
    DatasetSpec(
        name="malaria-full",
        task=REGRESSION,
        file_name="malaria_central_africa_2017.csv.gz",
        num_features=2,
        num_rows=256579,
        sha256="b40fe5e29234958a48be1494141e8cd09b5b065db222158e552dd486d63e3ea8",
        source_format=None,
        origin_base_url=None,
        origin_files=(),
        upstream="Malaria Atlas Project, 2017 P. falciparum incidence, Central Africa "
        "(via artaylor85/pixelate data/CentralAfrica_Pf_incidence.rda)",
        citation="Weiss et al., The Lancet 394 (2019) 322-331",
        licence="MAP open-access data (see streamgp.datasets.malaria)",
        column_names=("lon", "lat", "incidence", "incidence_ci_width", "incidence_std"),
        loader="load_malaria(full=True)",
    ),
)

DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in _SPECS}


def list_datasets(task: str | None = None) -> list[str]:
    r"""Names of the registered file-backed datasets, sorted.

    The shipped malaria subset (``load_malaria()``) and the synthetic generators
    (``streamgp.datasets.synthetic``) need no file and are not listed here.

    Args:
        task: If given, only datasets of this task (``"regression"`` or
            ``"classification"``).

    Returns:
        The dataset names.
    """
    if task is not None and task not in (REGRESSION, CLASSIFICATION):
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}.")
    return sorted(name for name, spec in DATASETS.items() if task in (None, spec.task))


def get_dataset_spec(name: str) -> DatasetSpec:
    r"""Look up a dataset by name.

    Raises:
        ValueError: If ``name`` is not registered; the message lists what exists.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}.")
    spec = DATASETS.get(name.strip().lower())
    if spec is None:
        raise ValueError(
            f"Unknown dataset {name!r}. Registered datasets: {', '.join(list_datasets())}."
        )
    return spec


def default_data_dir() -> Path:
    r"""The data directory used when no ``data_dir`` argument is given.

    ``$STREAMGP_DATA`` if set, else ``$XDG_CACHE_HOME/streamgp``, else
    ``~/.cache/streamgp``. The directory need not exist.
    """
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "streamgp"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    r"""``data_dir`` as a ``Path`` if given, else :func:`default_data_dir`."""
    if data_dir is None:
        return default_data_dir()
    if not isinstance(data_dir, str | os.PathLike):
        raise TypeError(f"data_dir must be a str or path, got {type(data_dir).__name__}.")
    return Path(data_dir).expanduser()


def available_datasets(data_dir: str | os.PathLike | None = None) -> list[str]:
    r"""Registered datasets whose file is present in the data directory."""
    root = resolve_data_dir(data_dir)
    return [name for name in list_datasets() if (root / DATASETS[name].file_name).is_file()]


def dataset_path(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    r"""Path of an existing dataset file.

    Raises:
        ValueError: Unknown name.
        FileNotFoundError: The file is not in the data directory; the message says
            which directory was searched, which datasets it holds and how to get
            the missing one.
    """
    spec = get_dataset_spec(name)
    root = resolve_data_dir(data_dir)
    path = root / spec.file_name
    if path.is_file():
        return path
    if not root.is_dir():
        where = f"the data directory {str(root)!r} does not exist"
    else:
        present = available_datasets(root)
        where = f"{str(root)!r} holds: {', '.join(present) if present else 'no known datasets'}"
    if spec.downloadable:
        hint = f"download it with streamgp.datasets.download_dataset({spec.name!r})"
    elif spec.name == "3droad":
        hint = "pass the file to load_3droad(path=...) (see its docstring for the format)"
    else:
        hint = "copy the file there"
    raise FileNotFoundError(
        f"Dataset {spec.name!r} needs {spec.file_name!r}, but {where}. Set data_dir= or "
        f"${DATA_ENV_VAR}, or {hint}."
    )
