r"""Malaria atlas: 2017 *Plasmodium falciparum* incidence in Central Africa.

The data for the active-learning experiment of the WISKI paper (Stanton et al.,
AISTATS 2021, section 5.4): a fixed-noise GP over longitude/latitude, with the
atlas' own uncertainty as the observation noise.

Provenance:
    Malaria Atlas Project (MAP), modelled 2017 *P. falciparum* clinical incidence
    (posterior median, cases per person per year) and its 95% credible-interval
    width, on a 2.5-arcminute grid. Cite: D. J. Weiss, T. C. D. Lucas, M. Nguyen et
    al., "Mapping the global prevalence, incidence, and mortality of *Plasmodium
    falciparum*, 2000-17: a spatial and temporal modelling study", *The Lancet* 394
    (2019) 322-331. The Central-Africa extract comes from the R package ``pixelate``
    (A. R. Taylor, github.com/artaylor85/pixelate, file
    ``data/CentralAfrica_Pf_incidence.rda``, MIT licence for the package, no separate
    data licence stated), converted to CSV for this project (see the project's data
    manifest): no-data cells dropped, ``incidence_std = ci_width / (2 * 1.959964)``.
    ``incidence_std`` is a Gaussian approximation derived by us, not a MAP product.

Licence:
    MAP publishes its modelled burden surfaces as open-access data under a Creative
    Commons Attribution licence (its malaria-burden download page states "Creative
    Commons Attribution 3.0 Unported"; some MAP releases use CC BY 4.0). Attribution
    is required: cite Weiss et al. (2019) and the Malaria Atlas Project. This was
    read from a copy of MAP's web page, not from a licence file shipped with the
    data; check MAP's current terms before redistributing the data further.

Shipped subset (``data/malaria_pf_incidence_2017_central_africa_5arcmin.csv.gz``):
    every second grid cell along longitude and latitude of the full file (a regular
    5-arcmin, about 9 km, sub-grid over the whole region; 64,364 of 256,579 cells),
    columns ``lon, lat, incidence, incidence_std`` with the number tokens copied
    verbatim. Reproduce it with ``scripts/make_malaria_subset.py``.

Extent: longitude 11.73 to 35.48, latitude -13.98 to 5.69 (a Central-Africa box; the
cells outside the source's mask, e.g. water, are absent). The paper's test region,
Nigeria, lies almost entirely outside it.

Example:
    >>> from streamgp.datasets import load_malaria
    >>> malaria = load_malaria()
    >>> malaria.X.shape, malaria.Y.shape, malaria.Yvar.shape
    (torch.Size([64364, 2]), torch.Size([64364, 1]), torch.Size([64364, 1]))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from streamgp.datasets.loaders import _check_dtype
from streamgp.datasets.registry import dataset_path

MALARIA_SUBSET_FILE = "malaria_pf_incidence_2017_central_africa_5arcmin.csv.gz"
MALARIA_SUBSET_SHA256 = "9ca3a2a0c253eb130cebef30f8d9267d6c37256c8df7d8a06a4aa8dc26c41867"
MALARIA_COLUMNS = ("lon", "lat", "incidence", "incidence_std")


@dataclass(frozen=True)
class MalariaData:
    r"""Malaria incidence for a fixed-noise GP.

    Attributes:
        X: ``n x 2`` inputs (longitude, latitude in decimal degrees).
        Y: ``n x 1`` incidence (cases per person per year).
        Yvar: ``n x 1`` noise variances ``incidence_std^2``, floored at
            ``min_noise_variance``.
        frame: The file as a pandas ``DataFrame``.
        source: Path of the file read.
    """

    X: Tensor
    Y: Tensor
    Yvar: Tensor
    frame: pd.DataFrame
    source: Path

    def __len__(self) -> int:
        return self.X.shape[0]


def malaria_subset_path() -> Path:
    r"""Path of the subset shipped inside the package."""
    return Path(str(resources.files("streamgp.datasets").joinpath("data", MALARIA_SUBSET_FILE)))


def load_malaria(
    full: bool = False,
    data_dir: str | os.PathLike | None = None,
    *,
    min_noise_variance: float = 1e-6,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> MalariaData:
    r"""Load the malaria atlas: lon/lat inputs, incidence targets, noise variances.

    Args:
        full: Read the full 256,579-cell file (``malaria_central_africa_2017.csv.gz``,
            registry name ``malaria-full``) from the data directory instead of the
            shipped subset.
        data_dir: Data directory for ``full=True`` (default ``$STREAMGP_DATA``,
            then the user cache).
        min_noise_variance: Floor of the returned noise variances. About 0.8% of
            the cells (zero-incidence areas) have ``incidence_std = 0``, which a
            fixed-noise GP cannot use; 0 returns the raw ``std^2``.
        dtype: Floating dtype of the tensors.
        device: Device of the tensors.

    Returns:
        The inputs, targets and noise variances, with the frame.

    Example:
        >>> malaria = load_malaria(dtype=torch.float32)
        >>> bool((malaria.Yvar > 0).all())
        True
    """
    _check_dtype(dtype)
    if not isinstance(min_noise_variance, int | float) or not min_noise_variance >= 0:
        raise ValueError(f"min_noise_variance must be >= 0, got {min_noise_variance!r}.")
    path = dataset_path("malaria-full", data_dir) if full else malaria_subset_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"The shipped malaria subset {path} is missing: the package was installed without "
            f"its data files (check the package-data setting of pyproject.toml)."
        )
    frame = pd.read_csv(path)
    missing = [c for c in MALARIA_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}; it has {list(frame.columns)}.")
    values = torch.as_tensor(frame[list(MALARIA_COLUMNS)].to_numpy(dtype="float64", copy=True))
    if not torch.isfinite(values).all():
        raise ValueError(f"{path} contains NaN or Inf values.")
    X, Y, std = values[:, :2], values[:, 2:3], values[:, 3:4]
    Yvar = (std * std).clamp_min(min_noise_variance)
    return MalariaData(
        X=X.to(dtype=dtype, device=device),
        Y=Y.to(dtype=dtype, device=device),
        Yvar=Yvar.to(dtype=dtype, device=device),
        frame=frame,
        source=path,
    )
