"""Shared numerical kernels: grid kernel roots and grid-space Woodbury algebra."""

from streamgp.linalg.grid_kernel import grid_kernel_matrix, grid_kernel_root, jittered_cholesky
from streamgp.linalg.love import LanczosRoot, lanczos, lanczos_root, sample_with_root
from streamgp.linalg.woodbury import (
    GridPosterior,
    LowRankCorrection,
    factorize,
    fold_low_rank,
    log_marginal_likelihood,
    update_root,
)

__all__ = [
    "GridPosterior",
    "LanczosRoot",
    "LowRankCorrection",
    "factorize",
    "fold_low_rank",
    "grid_kernel_matrix",
    "grid_kernel_root",
    "jittered_cholesky",
    "lanczos",
    "lanczos_root",
    "log_marginal_likelihood",
    "sample_with_root",
    "update_root",
]
