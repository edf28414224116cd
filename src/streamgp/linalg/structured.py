r"""Grid posteriors for large grids, without any dense ``m x m`` matrix.

For grids of ``m >= 10^4`` points (e.g. ``22^3``) the dense root ``R`` of
:mod:`streamgp.linalg.woodbury` no longer fits. Here the grid posterior is
represented by a rank-``k`` LOVE root (Pleiss et al., ICML 2018; see
:mod:`streamgp.linalg.love`) computed from structured products only:

- ``K_UU = L_K L_K^T`` with ``L_K = c * kron(L_1, ..., L_d)``, the Kronecker
  product of 1-D Cholesky factors (separable kernels), applied to vectors in
  ``O(m sum_i g_i)``;
- the noise-weighted statistic ``A = W^T Lambda^{-1} W`` as a sparse matrix (at most
  ``7^d`` non-zeros per row, whatever ``n`` is).

With ``G = L_K^T A L_K`` the exact posterior covariance of the grid values is
``Sigma_U = L_K (I + G)^{-1} L_K^T``. Two Lanczos passes, neither of which needs a
linear solve:

1. Lanczos on ``G`` gives a Nystrom approximation ``G_N <= G`` with
   ``tr(G - G_N) <= tol``. Then ``Sigma_1 = L_K (I + G_N)^{-1} L_K^T = K - Z Z^T``
   (``Z`` is ``m x k_1``) satisfies ``Sigma_U <= Sigma_1`` and, for every grid
   weight vector ``w``, ``w^T (Sigma_1 - Sigma_U) w <= tol * w^T K w``: variances are
   over-estimated by at most ``tol`` times the prior variance (LOVE's direction of
   error: uncertainty is never under-stated by this step).
2. :func:`~streamgp.linalg.love.block_lanczos_root` on ``Sigma_1`` (products ``K v - Z Z^T v``,
   exact trace ``tr(K) - |Z|_F^2``) gives the root ``R`` (``m x k``) with
   ``0 <= w^T (Sigma_1 - R R^T) w <= |w|^2 tol tr(Sigma_1)``.

The posterior mean ``alpha = L_K C^{-1} L_K^T b`` (``C = I + G``) is computed by
conjugate gradients preconditioned with ``(I + G_N)^{-1}``, which removes the large
eigenvalues of ``C``, so a few iterations suffice. Everything costs
``O(k (nnz(A) + m sum_i g_i + m k))``, independent of ``n``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from streamgp.linalg.grid_kernel import GridKernelRoot
from streamgp.linalg.love import DEFAULT_TOLERANCE, block_lanczos_root
from streamgp.linalg.woodbury import GridPosterior


def conjugate_gradients(
    matmul: Callable[[Tensor], Tensor],
    rhs: Tensor,
    precondition: Callable[[Tensor], Tensor],
    rtol: float,
    max_iter: int,
) -> Tensor:
    r"""Preconditioned CG for an SPD operator, ``m x p`` right-hand sides (column-wise)."""
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    z = precondition(r)
    p = z
    rz = (r * z).sum(0)
    target = rtol * torch.linalg.vector_norm(rhs, dim=0)
    for _ in range(max_iter):
        if (torch.linalg.vector_norm(r, dim=0) <= target).all():
            break
        Ap = matmul(p)
        step = rz / (p * Ap).sum(0).clamp_min(torch.finfo(rhs.dtype).tiny)
        x = x + step * p
        r = r - step * Ap
        z = precondition(r)
        rz_new = (r * z).sum(0)
        p = z + (rz_new / rz.clamp_min(torch.finfo(rhs.dtype).tiny)) * p
        rz = rz_new
    return x


@dataclass(frozen=True)
class StructuredGridPosterior:
    r"""A low-rank grid posterior built from structured products, with its certificate.

    Attributes:
        posterior: ``GridPosterior`` whose ``root`` is ``m x k`` (see module docs).
        whitened_residual: ``tr(G - G_N)``: variances are over-estimated by at most
            this times the prior variance in step 1.
        residual_trace: ``tr(Sigma_1 - R R^T)`` of step 2.
    """

    posterior: GridPosterior
    whitened_residual: Tensor
    residual_trace: Tensor


def structured_grid_posterior(
    L_K: GridKernelRoot,
    A: Tensor,
    b: Tensor,
    *,
    tol: float = DEFAULT_TOLERANCE,
    max_rank: int | None = None,
    cg_rtol: float | None = None,
) -> StructuredGridPosterior:
    r"""LOVE grid posterior ``N(alpha, R R^T)`` without dense ``m x m`` matrices.

    Args:
        L_K: Kronecker root of ``K_UU``.
        A: Sparse (or dense) noise-weighted ``W^T Lambda^{-1} W``.
        b: Noise-weighted ``W^T Lambda^{-1} y``.
        tol: Tolerance of both Lanczos passes (module docs state what it bounds).
        max_rank: Optional cap on each pass's rank.
        cg_rtol: Relative residual tolerance for the mean (default: ``1e-12`` in
            float64, ``1e-5`` in float32).

    Example:
        >>> L_K = grid_kernel_root(kernel, interpolation.grid)
        >>> W = interpolation.weights(X)
        >>> A = W.weighted_gram(torch.ones(len(X)) / noise, sparse=True)
        >>> post = structured_grid_posterior(L_K, A, W.t_matvec(y / noise), tol=1e-6)
    """
    m = L_K.num_grid
    dtype = b.dtype

    # CSR is several times faster than COO for repeated products.
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        A_op = A.coalesce().to_sparse_csr() if A.is_sparse else A

    def G_matmul(V: Tensor) -> Tensor:
        return L_K.t_matmul(A_op @ L_K.matmul(V))

    # tr(G) = tr(A K) = sum_ij A_ij K_ij over the non-zeros of A.
    if A.is_sparse:
        A_c = A.coalesce()
        (rows, cols), vals = A_c.indices(), A_c.values()
    else:
        rows, cols = torch.nonzero(A, as_tuple=True)
        vals = A[rows, cols]
    trace_G = (vals * L_K.kernel_entries(rows, cols)).sum()

    # Step 1: Nystrom root Y of G (G_N = Y Y^T), stopped by an absolute trace gap.
    # The captured trace is a difference of large numbers: ask no more than round-off allows.
    asked = tol / max(float(trace_G), tol) if tol > 0 else 0.0  # tol = 0 with no data: 0
    rel = max(asked, 1e3 * torch.finfo(dtype).eps)
    first = block_lanczos_root(G_matmul, trace_G, m, tol=min(rel, 0.5), max_rank=max_rank)
    Y = first.root
    mu, E = torch.linalg.eigh(Y.mT @ Y)
    keep = mu > Y.shape[-1] * torch.finfo(dtype).eps * mu.amax().clamp_min(0.0)
    mu_safe = torch.where(keep, mu, torch.ones_like(mu))
    Y_orth = (Y @ E) * torch.where(keep, mu_safe.rsqrt(), torch.zeros_like(mu))  # orthonormal
    shrink = torch.where(keep, mu_safe / (1.0 + mu_safe), torch.zeros_like(mu))
    Z = L_K.matmul(Y_orth * shrink.sqrt())  # Sigma_1 = K - Z Z^T

    # Step 2: Nystrom root of Sigma_1.
    def sigma1(V: Tensor) -> Tensor:
        return L_K.matmul(L_K.t_matmul(V)) - Z @ (Z.mT @ V)

    trace_1 = L_K.kernel_trace() - Z.square().sum()
    second = block_lanczos_root(sigma1, trace_1, m, tol=tol, max_rank=max_rank)

    # Mean: alpha = L_K C^{-1} L_K^T b, CG preconditioned by (I + G_N)^{-1}.
    def precondition(V: Tensor) -> Tensor:
        return V - Y_orth @ (shrink.unsqueeze(-1) * (Y_orth.mT @ V))

    rhs = L_K.t_matmul(b.unsqueeze(-1))
    rtol = cg_rtol if cg_rtol is not None else (1e-12 if dtype == torch.float64 else 1e-5)
    solution = conjugate_gradients(lambda V: V + G_matmul(V), rhs, precondition, rtol, m)
    mean = L_K.matmul(solution).squeeze(-1)
    return StructuredGridPosterior(
        posterior=GridPosterior(root=second.root, mean=mean),
        whitened_residual=first.residual_trace,
        residual_trace=second.residual_trace,
    )
