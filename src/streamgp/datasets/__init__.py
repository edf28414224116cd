r"""Benchmark datasets for online GP regression and classification.

- :func:`load_dataset` / ``load_<name>``: the WISKI paper's benchmarks (skillcraft,
  powerplant, elevators, protein, 3droad; banana, svmguide1) from a data directory
  (``data_dir=``, else ``$STREAMGP_DATA``, else ``~/.cache/streamgp``);
- :func:`download_dataset`: fetch a missing file from its public origin, sha256-checked;
- :func:`load_malaria`: the Malaria Atlas Project incidence subset shipped with the
  package (or the full file from the data directory);
- :func:`make_streaming_split`: seeded 90/10 split, ``[-1, 1]`` input scaling,
  standardized targets, 5% pretraining set (WISKI appendix C.1);
- :func:`load_csv` and :func:`make_standardized_split`: a regression table of your own,
  split and standardised as in the SoftKI paper's Table 1 protocol;
- :mod:`~streamgp.datasets.synthetic`: seeded synthetic data for tests.
"""

from streamgp.datasets.download import ChecksumError, download_dataset, verify_dataset
from streamgp.datasets.loaders import (
    TabularData,
    import_3droad,
    load_3droad,
    load_banana,
    load_csv,
    load_dataset,
    load_elevators,
    load_powerplant,
    load_protein,
    load_skillcraft,
    load_svmguide1,
    read_3droad,
)
from streamgp.datasets.malaria import MalariaData, load_malaria, malaria_subset_path
from streamgp.datasets.preprocessing import (
    StandardizedSplit,
    StreamingSplit,
    load_streaming_split,
    make_standardized_split,
    make_streaming_split,
)
from streamgp.datasets.registry import (
    DATA_ENV_VAR,
    DATASETS,
    DatasetSpec,
    available_datasets,
    dataset_path,
    default_data_dir,
    get_dataset_spec,
    list_datasets,
)
from streamgp.datasets.synthetic import (
    synthetic_classification,
    synthetic_function,
    synthetic_regression,
)

__all__ = [
    "DATASETS",
    "DATA_ENV_VAR",
    "ChecksumError",
    "DatasetSpec",
    "MalariaData",
    "StandardizedSplit",
    "StreamingSplit",
    "TabularData",
    "available_datasets",
    "dataset_path",
    "default_data_dir",
    "download_dataset",
    "get_dataset_spec",
    "import_3droad",
    "list_datasets",
    "load_3droad",
    "load_banana",
    "load_csv",
    "load_dataset",
    "load_elevators",
    "load_malaria",
    "load_powerplant",
    "load_protein",
    "load_skillcraft",
    "load_streaming_split",
    "load_svmguide1",
    "make_standardized_split",
    "make_streaming_split",
    "malaria_subset_path",
    "read_3droad",
    "synthetic_classification",
    "synthetic_function",
    "synthetic_regression",
    "verify_dataset",
]
