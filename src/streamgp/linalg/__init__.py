"""Shared numerical kernels: grid kernel roots and grid-space Woodbury algebra."""

from streamgp.linalg.grid_kernel import (
    GridKernelRoot,
    grid_kernel_matrix,
    grid_kernel_root,
    jittered_cholesky,
)
from streamgp.linalg.woodbury import (
    GridPosterior,
    LowRankCorrection,
    factorize,
    fold_low_rank,
    log_marginal_likelihood,
    update_root,
)

__all__ = [
    "GridKernelRoot",
    "GridPosterior",
    "LowRankCorrection",
    "factorize",
    "fold_low_rank",
    "grid_kernel_matrix",
    "grid_kernel_root",
    "jittered_cholesky",
    "log_marginal_likelihood",
    "update_root",
]
