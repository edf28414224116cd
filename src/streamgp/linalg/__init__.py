"""Shared numerical kernels: grid kernel roots, grid-space Woodbury algebra, sparse-GP algebra."""

from streamgp.linalg.grid_kernel import (
    GridKernelRoot,
    cholesky_with_jitter,
    grid_kernel_matrix,
    grid_kernel_root,
    jittered_cholesky,
)
from streamgp.linalg.sparse_gp import (
    PseudoObservations,
    SparsePosterior,
    sparse_posterior,
    streaming_collapsed_bound,
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
    "PseudoObservations",
    "SparsePosterior",
    "cholesky_with_jitter",
    "LowRankCorrection",
    "factorize",
    "fold_low_rank",
    "grid_kernel_matrix",
    "grid_kernel_root",
    "jittered_cholesky",
    "log_marginal_likelihood",
    "sparse_posterior",
    "streaming_collapsed_bound",
    "update_root",
]
