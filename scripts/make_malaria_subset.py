r"""Derive the malaria atlas subset shipped in ``src/streamgp/datasets/data/``.

Input: ``malaria_central_africa_2017.csv.gz`` from the project's shared data (Malaria
Atlas Project, 2017 *P. falciparum* incidence, Central Africa; 256,579 cells of a
regular 2.5-arcminute grid; see ``streamgp.datasets.malaria`` for provenance).

Transformation (deterministic, no randomness):

1. check the input's sha256 against the registry entry ``malaria-full``;
2. index each cell on the 2.5-arcmin grid (step 1/24 degree) from the smallest
   longitude/latitude in the file, and keep the cells whose longitude *and* latitude
   indices are even: a regular 5-arcmin (about 9 km) sub-grid over the whole region,
   one cell in four;
3. keep the columns ``lon, lat, incidence, incidence_std`` (dropping
   ``incidence_ci_width``, which equals ``incidence_std * 2 * 1.959964``), copying the
   number tokens verbatim (no re-printing, no rounding);
4. write a gzip CSV with level 9, mtime 0 and no file name, so re-running gives the
   same bytes; print the row count and sha256 (recorded in
   ``streamgp.datasets.malaria.MALARIA_SUBSET_SHA256``).

Usage (from the repository root)::

    PYTHONPATH=src python scripts/make_malaria_subset.py \
        [--source ../shared/data/malaria_central_africa_2017.csv.gz]

The default source is ``$STREAMGP_DATA/malaria_central_africa_2017.csv.gz``, else
``../shared/data/`` next to the repository.
"""

from __future__ import annotations

import argparse
import gzip
import os
from pathlib import Path

from streamgp.datasets.download import gzip_text, sha256_bytes, sha256_file, write_atomic
from streamgp.datasets.malaria import MALARIA_SUBSET_FILE, malaria_subset_path
from streamgp.datasets.registry import DATA_ENV_VAR, DATASETS

GRID_STEP_DEGREES = 1.0 / 24.0  # 2.5 arcminutes
STRIDE = 2  # keep every second cell along longitude and latitude
COLUMNS = ("lon", "lat", "incidence", "incidence_std")


def make_subset(source: Path) -> str:
    r"""Return the subset as CSV text (see the module docstring)."""
    expected = DATASETS["malaria-full"].sha256
    actual = sha256_file(source)
    if actual != expected:
        raise SystemExit(f"{source}: sha256 {actual} differs from the registry's {expected}.")
    with gzip.open(source, "rt", encoding="utf-8", newline="") as handle:
        header, *lines = handle.read().splitlines()
    names = header.split(",")
    keep_columns = [names.index(c) for c in COLUMNS]
    lon_i, lat_i = names.index("lon"), names.index("lat")
    rows = [line.split(",") for line in lines]
    lon_min = min(float(r[lon_i]) for r in rows)
    lat_min = min(float(r[lat_i]) for r in rows)
    out = [",".join(COLUMNS)]
    for r in rows:
        i = round((float(r[lon_i]) - lon_min) / GRID_STEP_DEGREES)
        j = round((float(r[lat_i]) - lat_min) / GRID_STEP_DEGREES)
        if i % STRIDE == 0 and j % STRIDE == 0:
            out.append(",".join(r[k] for k in keep_columns))
    return "".join(line + "\n" for line in out)


def main() -> None:
    repo = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(os.environ.get(DATA_ENV_VAR) or repo.parent / "shared" / "data")
    parser.add_argument("--source", type=Path, default=shared / DATASETS["malaria-full"].file_name)
    parser.add_argument("--out", type=Path, default=repo / "src" / "streamgp" / "datasets" / "data")
    args = parser.parse_args()
    data = gzip_text(make_subset(args.source))
    target = write_atomic(args.out / MALARIA_SUBSET_FILE, data)
    rows = gzip.decompress(data).count(b"\n") - 1
    print(f"wrote {target} ({rows} rows, {len(data)} bytes, sha256 {sha256_bytes(data)})")
    if target.resolve() != malaria_subset_path().resolve():
        print(f"note: the package reads {malaria_subset_path()}")


if __name__ == "__main__":
    main()
