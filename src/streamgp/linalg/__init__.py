"""Shared numerical kernels: grid kernel roots, SKI statistics (grid and data space), sparse GPs."""

from streamgp.linalg.data_space import DataCorrection, DataPosterior
from streamgp.linalg.exact_kernel import ExactKernelFeatures, ExactKernelRoot
from streamgp.linalg.grid_kernel import (
    GridKernelRoot,
    KernelFeatures,
    cholesky_with_jitter,
    grid_kernel_factors,
    grid_kernel_matrix,
    grid_kernel_root,
    is_scaled_rbf,
    is_separable,
    jittered_cholesky,
    stacked_rbf_roots,
)
from streamgp.linalg.love import (
    LanczosRoot,
    compress_root,
    lanczos,
    lanczos_root,
    sample_with_root,
)
from streamgp.linalg.posterior import Posterior, PosteriorCorrection
from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.linalg.prior_variance import PriorVarianceCorrection, root_covariance
from streamgp.linalg.sparse_gp import (
    PseudoObservations,
    SparsePosterior,
    sparse_posterior,
    streaming_collapsed_bound,
)
from streamgp.linalg.statistics import DataStatistics, GridStatistics, Statistics
from streamgp.linalg.woodbury import (
    GridPosterior,
    LowRankCorrection,
    factorize,
    fold_low_rank,
    log_marginal_likelihood,
    update_root,
)

__all__ = [
    "DataCorrection",
    "DataPosterior",
    "DataStatistics",
    "GridStatistics",
    "Statistics",
    "KernelFeatures",
    "ExactKernelFeatures",
    "ExactKernelRoot",
    "Posterior",
    "PosteriorCorrection",
    "PosteriorCovariance",
    "PriorVarianceCorrection",
    "GridKernelRoot",
    "GridPosterior",
    "LanczosRoot",
    "PseudoObservations",
    "SparsePosterior",
    "cholesky_with_jitter",
    "grid_kernel_factors",
    "is_scaled_rbf",
    "is_separable",
    "stacked_rbf_roots",
    "LowRankCorrection",
    "factorize",
    "fold_low_rank",
    "grid_kernel_matrix",
    "grid_kernel_root",
    "jittered_cholesky",
    "lanczos",
    "compress_root",
    "lanczos_root",
    "log_marginal_likelihood",
    "root_covariance",
    "sample_with_root",
    "sparse_posterior",
    "streaming_collapsed_bound",
    "update_root",
]
