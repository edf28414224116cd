"""Helpers for the dataset tests: the shared data directory and small canonical files."""

import os
from dataclasses import replace
from pathlib import Path

from streamgp.datasets.download import gzip_text
from streamgp.datasets.registry import DATASETS, DatasetSpec

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    r"""``$STREAMGP_DATA`` if set, else ``../shared/data`` next to the repository."""
    env = os.environ.get("STREAMGP_DATA")
    path = Path(env) if env else REPO_ROOT / ".." / "shared" / "data"
    return path.resolve() if (path / "MANIFEST.md").is_file() else None


# Resolved at import, before the tests' autouse fixture clears $STREAMGP_DATA.
SHARED_DATA = shared_data_dir()

REGRESSION_TEXT = "x0,x1,x2,y\n" + "".join(
    f"{i * 0.5},{(i % 7) - 3},{7.25},{i * 0.1 - 1}\n" for i in range(40)
)
CLASSIFICATION_TEXT = "x0,x1,label,split\n" + "".join(
    f"{i * 0.25},{-i},{i % 3 % 2},{'test' if i % 4 == 0 else 'train'}\n" for i in range(24)
)


def tiny_spec(task: str = "regression") -> DatasetSpec:
    r"""Registry entry matching REGRESSION_TEXT or CLASSIFICATION_TEXT (no checksum)."""
    template = DATASETS["skillcraft" if task == "regression" else "banana"]
    name = f"tiny-{task}"
    return replace(
        template,
        name=name,
        file_name=f"{name}.csv.gz",
        num_features=3 if task == "regression" else 2,
        num_rows=None,
        sha256=None,
    )


def write_canonical(directory: Path, file_name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name
    path.write_bytes(gzip_text(text))
    return path
