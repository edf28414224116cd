"""Inducing-point selection for streaming sparse GPs: OIPS, streaming k-means, grids."""

from streamgp.inducing.base import InducingPointSelector
from streamgp.inducing.grid import GridSelector
from streamgp.inducing.kmeans import KMeansSelector
from streamgp.inducing.oips import (
    OnlineInducingPointSelector,
    kernel_correlation,
    oips_expected_size_bound,
)

__all__ = [
    "GridSelector",
    "InducingPointSelector",
    "KMeansSelector",
    "OnlineInducingPointSelector",
    "kernel_correlation",
    "oips_expected_size_bound",
]
