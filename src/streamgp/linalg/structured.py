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

All of it runs in float64 whatever the inputs' dtype, results cast back (the certified
traces lie below float32's resolution; see :func:`_working_precision`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from streamgp.linalg.grid_kernel import GridKernelRoot, axis_indices
from streamgp.linalg.love import (
    DEFAULT_TOLERANCE,
    block_lanczos,
    block_lanczos_root,
)
from streamgp.linalg.woodbury import (
    GridPosterior,
    assemble_log_likelihood,
    kronecker_logdet_minus_quad_backward,
    outer_partial_trace,
)

#: CG stops once no column's residual reached a new minimum for this many iterations.
CG_PATIENCE = 100


#: The working precision of the large-grid algebra (see :func:`_working_precision`).
WORKING_DTYPE = torch.float64


def _working_precision(L_K: GridKernelRoot, *tensors: Tensor | None):
    r"""``L_K`` and ``tensors`` in float64, whatever the model's dtype (a no-op in float64).

    The Lanczos tolerances these roots are certified to (relative ``1e-8`` of traces
    such as ``tr(K) - |Z|^2``, formed by cancellation) lie below float32's resolution:
    in float32 the second pass never met its target and ran to full rank ``m``, the
    first captured ``G`` only to ``1e3 eps tr(G)``, and posterior variances were off by up
    to 24x (``tests/linalg/test_structured.py``; a 32^3 build took 30 s on an H100 against
    0.4 s in float64). Results are cast back to the caller's dtype; the casts are
    differentiable.
    """
    # A root computed in a coarser dtype is Toeplitz only to that dtype's round-off.
    toeplitz = L_K.toeplitz and all(f.dtype == WORKING_DTYPE for f in L_K.factors)
    root = replace(L_K, factors=tuple(f.to(WORKING_DTYPE) for f in L_K.factors), toeplitz=toeplitz)
    device = root.factors[0].device
    return root, *(
        None if t is None else torch.as_tensor(t, device=device).to(WORKING_DTYPE) for t in tensors
    )


def conjugate_gradients(
    matmul: Callable[[Tensor], Tensor],
    rhs: Tensor,
    precondition: Callable[[Tensor], Tensor],
    rtol: float,
    max_iter: int,
    patience: int = CG_PATIENCE,
) -> Tensor:
    r"""Preconditioned CG for an SPD operator, ``m x p`` right-hand sides (column-wise).

    Stops when every column's residual is at most ``rtol`` times its right-hand side,
    or has stagnated: no column's residual reached a new minimum for ``patience``
    iterations (round-off, e.g. float32, can keep the residual above a tolerance the
    arithmetic cannot reach; without this, CG then ran all ``max_iter = m`` iterations).
    Returns each column's iterate of smallest residual. One host read per iteration.
    """
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    z = precondition(r)
    p = z
    rz = (r * z).sum(0)
    tiny = torch.finfo(rhs.dtype).tiny
    target = rtol * torch.linalg.vector_norm(rhs, dim=0)
    best_x, best_norm = x, torch.linalg.vector_norm(r, dim=0)
    if max_iter < 1 or bool((best_norm <= target).all()):
        return best_x
    since_best = 0
    for _ in range(max_iter):
        Ap = matmul(p)
        step = rz / (p * Ap).sum(0).clamp_min(tiny)
        x = x + step * p
        r = r - step * Ap
        z = precondition(r)
        rz_new = (r * z).sum(0)
        p = z + (rz_new / rz.clamp_min(tiny)) * p
        rz = rz_new
        norm = torch.linalg.vector_norm(r, dim=0)
        better = norm < best_norm
        best_x = torch.where(better, x, best_x)
        best_norm = torch.where(better, norm, best_norm)
        converged, improved = torch.stack(
            [(best_norm <= target).all(), (better & (best_norm > target)).any()]
        ).tolist()
        if converged:
            break
        since_best = 0 if improved else since_best + 1
        if since_best >= patience:
            break
    return best_x


@dataclass(frozen=True)
class NystromInverse:
    r"""``G_N = Y Y^T <= G`` with ``tr(G - G_N) = residual_trace``, held by its inverse.

    With the Cholesky factor ``L L^T = I + Y^T Y`` (``k x k``, its eigenvalues at least
    one) and ``B = Y L^{-T}`` (``m x k``), ``(I + G_N)^{-1} = I - B B^T`` and
    ``log|I + G_N| = log|I + Y^T Y|``: no eigendecomposition (on a GPU an ``eigh`` of a
    few hundred rows costs as much as the rest of a marginal likelihood). ``I - B B^T``
    is the preconditioner of :meth:`WhitenedStatistic.solve` and, for large grids,
    stands in for ``(I + G)^{-1}``: the difference is positive semi-definite with trace
    at most ``residual_trace``, and ``0 <= log|I + G| - log|I + G_N| <= residual_trace``.

    Attributes:
        complement_root: ``m x k`` matrix ``B`` with ``B B^T = I - (I + G_N)^{-1}``.
        cholesky: ``k x k`` lower factor ``L`` of ``I + Y^T Y``.
        residual_trace: ``tr(G - G_N)``.
    """

    complement_root: Tensor
    cholesky: Tensor
    residual_trace: Tensor

    def precondition(self, V: Tensor) -> Tensor:
        r"""``(I - (1 - delta) B B^T) V``, i.e. ``(I + G_N)^{-1} V`` floored at ``delta``.

        ``(I + G_N)^{-1}`` has eigenvalues ``1 / (1 + mu)`` down to ``~1e-7`` (``mu`` up to
        ``n / noise``): below float32's round-off of ``I - B B^T``, where computed as is
        the preconditioner was indefinite and CG never converged (``m`` iterations: a
        30 s build on a GPU). The floor keeps it positive definite: ``delta = sqrt(eps)``
        below float64, ``10 eps`` in float64 (the large-grid algebra's working precision),
        where the preconditioned condition number ``1 + delta max(mu)`` stays ~1 (a
        ``sqrt(eps)`` floor there took CG from 2-3 to 8-27 iterations at small noise).
        """
        B = self.complement_root
        eps = torch.finfo(B.dtype).eps
        delta = 10 * eps if B.dtype == torch.float64 else eps**0.5
        return V - (1.0 - delta) * (B @ (B.mT @ V))

    def logdet(self) -> Tensor:
        r"""``log|I + G_N|``."""
        return 2.0 * self.cholesky.diagonal().log().sum()


#: Per sparse statistic ``A`` (held weakly, by identity): its offset sums
#: (:func:`_offset_sums`), keyed by the grid's axis sizes and ``A``'s non-zero count.
_OFFSET_SUMS = WeakIdKeyDictionary()


def _offset_sums(A: Tensor, sizes: tuple[int, ...]) -> Tensor:
    r"""``S[o_1, ..., o_d]``: the sum of ``A``'s entries ``A_jk`` whose grid indices differ by
    ``|j_i - k_i| = o_i`` along every axis ``i`` (``g_1 x ... x g_d``, first axis slowest).

    It does not depend on the hyperparameters, so it is computed once per ``A`` (the
    index arithmetic over all ``nnz(A)`` entries, about 10^7 at ``32^3`` and ``n = 10^4``,
    took a quarter of a CPU marginal-likelihood evaluation) and kept while ``A`` lives.
    """
    key = (sizes, A._nnz())
    cached = _OFFSET_SUMS.get(A)
    if cached is not None and cached[0] == key:
        return cached[1]
    coalesced = A.coalesce()
    (rows, cols), values = coalesced.indices(), coalesced.values()
    flat_offset, stride = torch.zeros_like(rows), 1
    # The last axis varies fastest in the flat index.
    for size, row, col in zip(
        reversed(sizes), axis_indices(rows, sizes), axis_indices(cols, sizes), strict=True
    ):
        flat_offset += stride * (row - col).abs()
        stride *= size
    sums = values.new_zeros(math.prod(sizes)).index_add_(0, flat_offset, values)
    sums = sums.reshape(sizes)
    _OFFSET_SUMS[A] = (key, sums)
    return sums


def _kernel_weighted_sum(L_K: GridKernelRoot, A: Tensor) -> Tensor:
    r"""``tr(A K) = sum_jk A_jk K_jk`` for ``K = L_K L_K^T`` over the non-zeros of ``A``.

    For a Toeplitz-factored root (:attr:`GridKernelRoot.toeplitz`: ``K_jk`` is the product
    over axes of ``kappa_i(|j_i - k_i|)``, the first row of ``L_i L_i^T``) and a sparse ``A``,
    it is the contraction of ``A``'s offset sums (:func:`_offset_sums`, cached) with
    ``kron_i kappa_i``: ``O(m)`` per call instead of ``O(d nnz(A))``. Otherwise each
    non-zero's entry of ``K`` is gathered from the per-axis kernel matrices.
    """
    factors = L_K.factors
    fast = A.is_sparse and L_K.toeplitz and len(factors) > 1
    if fast and all(f.dim() == 2 and f.dtype == A.dtype for f in factors):
        sums = _offset_sums(A, tuple(f.shape[-1] for f in factors))
        for factor in factors:  # contract the slowest remaining axis with its kappa_i
            first_row = factor[:1] @ factor.mT  # (L_i L_i^T)[0, :]
            sums = torch.tensordot(first_row.squeeze(0), sums, dims=([0], [0]))
        return sums
    if A.is_sparse:
        coalesced = A.coalesce()
        (rows, cols), values = coalesced.indices(), coalesced.values()
    else:
        rows, cols = torch.nonzero(A, as_tuple=True)
        values = A[rows, cols]
    return (values * L_K.kernel_entries(rows, cols)).sum()


class WhitenedStatistic:
    r"""``G = L_K^T A L_K`` for a Kronecker root and a sparse (or dense) ``A``, by products.

    Each product costs ``O(p (nnz(A) + m sum_i g_i))`` for ``p`` vectors; ``tr(G)`` is
    exact from the non-zeros of ``A`` and the per-axis kernel matrices.

    Args:
        L_K: Root of ``K_UU``.
        A: ``m x m`` noise-weighted statistic (sparse COO or dense), without gradients.
        scale: Optional scalar multiplying ``A`` (e.g. the noise precision).
        input_dtype: The dtype the statistics were accumulated in, if coarser than the
            arithmetic's (float32 statistics in float64 algebra): it sets the finest trace
            gap :meth:`nystrom` asks for.
    """

    def __init__(
        self,
        L_K: GridKernelRoot,
        A: Tensor,
        scale: Tensor | None = None,
        input_dtype: torch.dtype | None = None,
    ) -> None:
        self.L_K = L_K
        self.scale = scale
        self.input_dtype = A.dtype if input_dtype is None else input_dtype
        # CSR is several times faster than COO for repeated products.
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            self._A = A.coalesce().to_sparse_csr() if A.is_sparse else A
        trace = _kernel_weighted_sum(L_K, A)  # tr(G) = tr(A K)
        self.trace = trace if scale is None else scale * trace

    @property
    def size(self) -> int:
        return self.L_K.num_grid

    def matmul(self, V: Tensor) -> Tensor:
        r"""``G V`` for ``V`` of shape ``m x p``."""
        out = self.L_K.t_matmul(self._A @ self.L_K.matmul(V))
        return out if self.scale is None else self.scale * out

    def nystrom(self, tol: float, max_rank: int | None = None) -> NystromInverse:
        r"""Nystrom approximation of ``G`` by block Lanczos, to an absolute trace gap ``tol``.

        The captured trace is a difference of large numbers, so no more than round-off
        allows is asked: the gap is at most ``max(tol, 1e3 eps tr(G))``, and for
        statistics accumulated in float32 at most ``0.1 eps_32 tr(G)`` (``1.2e-8``): finer
        gaps resolve the statistics' own rounding (every entry carries ``~eps_32``) at up to
        5x the rank (24^3 grid, n = 10^4: 2,496 against 512) and move the value by ``1e-7``
        of the ``6e-5`` by which float32 statistics already differ from float64 ones.
        """
        floor = max(
            1e3 * torch.finfo(self.trace.dtype).eps, 0.1 * torch.finfo(self.input_dtype).eps
        )
        trace = float(self.trace)
        asked = tol / max(trace, tol) if tol > 0 else 0.0  # tol = 0 with no data: 0
        rel = min(max(asked, floor), 0.5)
        krylov = block_lanczos(self.matmul, self.trace, self.size, tol=rel, max_rank=max_rank)
        # The Nystrom root is Y = Q F + N F_N (block_lanczos_root), with Gram matrix
        # Y^T Y = F^T F + F_N^T (N^T N) F_N: all k x k but one m x k x k product (B,
        # below; Y itself is never formed).
        F, F_N = krylov.nystrom_factors()
        N = krylov.remainder
        gram = F.mT @ F + F_N.mT @ ((N.mT @ N) @ F_N)
        gram = 0.5 * (gram + gram.mT)
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        L = torch.linalg.cholesky(gram + eye)
        # B = Y L^{-T} = Q (F L^{-T}) + N (F_N L^{-T}).
        B = krylov.expand(
            torch.linalg.solve_triangular(L, F.mT, upper=False).mT,
            torch.linalg.solve_triangular(L, F_N.mT, upper=False).mT,
        )
        residual = (self.trace - gram.diagonal().sum()).clamp_min(0.0)  # tr(G) - |Y|_F^2
        return NystromInverse(B, L, residual)

    def solve(self, rhs: Tensor, nystrom: NystromInverse, rtol: float | None = None) -> Tensor:
        r"""``(I + G)^{-1} rhs`` by CG preconditioned with ``(I + G_N)^{-1}``.

        The preconditioner removes the large eigenvalues of ``I + G``, so a few
        iterations suffice. ``rtol`` defaults to ``1e-12`` in float64, ``1e-5`` in float32.
        """
        if rtol is None:
            rtol = 1e-12 if rhs.dtype == torch.float64 else 1e-5
        return conjugate_gradients(
            lambda V: V + self.matmul(V), rhs, nystrom.precondition, rtol, self.size
        )


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
        >>> from gpytorch.kernels import RBFKernel
        >>> from streamgp.interpolation import CubicGridInterpolation
        >>> from streamgp.linalg import grid_kernel_root
        >>> bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
        >>> interpolation = CubicGridInterpolation(bounds, 10)  # 10 x 10 grid
        >>> kernel = RBFKernel().to(torch.float64)
        >>> X = torch.rand(50, 2, dtype=torch.float64)
        >>> y, noise = torch.sin(4 * X).sum(-1), torch.full((50,), 0.01, dtype=torch.float64)
        >>> with torch.no_grad():
        ...     L_K = grid_kernel_root(kernel, interpolation.grid)
        ...     W = interpolation.weights(X)
        ...     A = W.weighted_gram(1 / noise, sparse=True)
        ...     post = structured_grid_posterior(L_K, A, W.t_matvec(y / noise), tol=1e-6)
        >>> post.posterior.mean.shape, post.posterior.root.shape[0]
        (torch.Size([100]), 100)
        >>> bool(0 <= post.whitened_residual <= 1e-6)
        True
    """
    dtype = b.dtype
    L_K, A, b = _working_precision(L_K, A, b)
    operator = WhitenedStatistic(L_K, A, input_dtype=dtype)
    nystrom = operator.nystrom(tol, max_rank)
    # Sigma_1 = K - Z Z^T, with Z^T kept row-major: block_lanczos passes blocks as
    # transposed row-major p x m arrays and wants them back so, and "- C^T Z^T" into
    # a row-major p x m output is a GEMM about twice as fast as "- Z C" into m x p.
    Z_t = L_K.matmul(nystrom.complement_root).mT.contiguous()

    # Step 2: Nystrom root of Sigma_1.
    def sigma1(V: Tensor) -> Tensor:
        prior = L_K.matmul(L_K.t_matmul(V))
        return torch.addmm(prior.mT, V.mT @ Z_t.mT, Z_t, alpha=-1).mT

    trace_1 = L_K.kernel_trace() - Z_t.square().sum()
    second = block_lanczos_root(sigma1, trace_1, L_K.num_grid, tol=tol, max_rank=max_rank)

    # Mean: alpha = L_K C^{-1} L_K^T b.
    solution = operator.solve(L_K.t_matmul(b.unsqueeze(-1)), nystrom, cg_rtol)
    mean = L_K.matmul(solution).squeeze(-1)
    return StructuredGridPosterior(
        posterior=GridPosterior(root=second.root.to(dtype), mean=mean.to(dtype)),
        whitened_residual=nystrom.residual_trace.to(dtype),
        residual_trace=second.residual_trace.to(dtype),
    )


class _NystromLogdetMinusQuad(torch.autograd.Function):
    r"""``log|C| - z^T C^{-1} z`` (``C = I + p L^T A L``, ``z = p L^T b``) for large grids.

    :class:`~streamgp.linalg.woodbury._KroneckerLogdetMinusQuad` without any ``m x m``
    matrix: ``log|C|`` is ``log|I + G_N|`` of the block-Lanczos Nystrom approximation
    ``G_N <= G`` (:meth:`WhitenedStatistic.nystrom`), which under-estimates it by at most
    the certified gap ``tr(G - G_N)``; ``u = C^{-1} z`` is solved by preconditioned CG;
    the gradient uses the same closed form with ``(I + G_N)^{-1}`` for ``C^{-1}``, whose
    partial traces cost ``O(m k)``.
    """

    @staticmethod
    def forward(ctx, A, b, precision, tol, max_rank, input_dtype, toeplitz, *factors):
        L_K = GridKernelRoot(factors, toeplitz=toeplitz)
        operator = WhitenedStatistic(L_K, A, scale=precision, input_dtype=input_dtype)
        nystrom = operator.nystrom(tol, max_rank)
        z = precision * L_K.t_matmul(b.unsqueeze(-1))
        u = operator.solve(z, nystrom)
        z, u = z.mT, u.mT  # one row per output, as the dense path keeps them
        ctx.save_for_backward(u, z, precision, nystrom.complement_root, *factors)
        ctx.single = True
        ctx.gap = nystrom.residual_trace
        return nystrom.logdet() - (z * u).sum()

    @staticmethod
    def backward(ctx, grad):
        u, z, precision, B, *factors = ctx.saved_tensors
        sizes = [f.shape[-1] for f in factors]
        # I - (I + G_N)^{-1} = B B^T: its partial traces are O(m k).
        complement = [outer_partial_trace(B.mT, None, sizes, axis) for axis in range(len(sizes))]
        grads = kronecker_logdet_minus_quad_backward(
            ctx, grad, u, z, precision, factors, complement, B.square().sum(), first_factor=7
        )
        return (None, *grads[:2], None, None, None, None, *grads[2:])


def structured_log_marginal_likelihood(
    L_K: GridKernelRoot,
    A: Tensor,
    b: Tensor,
    c: Tensor,
    n: Tensor,
    sum_log_noise: Tensor,
    precision: Tensor | None = None,
    *,
    tol: float = DEFAULT_TOLERANCE,
    max_rank: int | None = None,
) -> Tensor:
    r"""SKI ``log p(y)`` on a large grid from sparse statistics; differentiable.

    The same quantity as :func:`streamgp.linalg.woodbury.log_marginal_likelihood`,
    ``-1/2 [c - z^T C^{-1} z + log|C| + sum(log noise) + n log 2 pi]``, without any
    ``m x m`` matrix (cost independent of ``n``): the log-determinant from a Nystrom
    approximation of ``G = p L_K^T A L_K`` of absolute trace gap ``tol`` (at least
    ``1e3 eps tr(G)``), which bounds the error of the value (``0 <= error <= gap / 2``);
    the quadratic term by preconditioned CG (relative residual ``1e-12`` in float64);
    gradients in closed form (:class:`_NystromLogdetMinusQuad`). Single output, Kronecker
    root (separable kernels) only.

    Args:
        L_K: Kronecker root of ``K_UU`` (one factor per axis).
        A: Sparse raw (or noise-weighted, with ``precision=None``) ``W^T W``.
        b, c, n, sum_log_noise: The other statistics (:func:`log_marginal_likelihood`).
        precision: Common noise precision ``1 / s2`` (homoskedastic noise), or None.
        tol: Absolute bound on ``tr(G - G_N)``.
        max_rank: Optional cap on the Nystrom rank (the gap then says what was reached).

    Example:
        >>> from gpytorch.kernels import RBFKernel
        >>> from streamgp.interpolation import CubicGridInterpolation
        >>> from streamgp.linalg import grid_kernel_root, log_marginal_likelihood
        >>> bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
        >>> interpolation = CubicGridInterpolation(bounds, 10)
        >>> L_K = grid_kernel_root(RBFKernel().to(torch.float64), interpolation.grid)
        >>> X = torch.rand(50, 2, dtype=torch.float64)
        >>> y, n = torch.sin(4 * X).sum(-1), torch.tensor(50.0, dtype=torch.float64)
        >>> noise = torch.tensor(0.01, dtype=torch.float64)  # homoskedastic: raw sums
        >>> W = interpolation.weights(X)
        >>> A = W.weighted_gram(torch.ones(50, dtype=torch.float64), sparse=True)
        >>> b, c, logs = W.t_matvec(y), y @ y, n * noise.log()
        >>> value = structured_log_marginal_likelihood(L_K, A, b, c, n, logs, 1 / noise, tol=1e-6)
        >>> exact = log_marginal_likelihood(L_K, A.to_dense(), b, c, n, logs, 1 / noise)
        >>> bool(-1e-9 <= value - exact <= 1e-6 / 2)  # log|C| under-estimated by <= tol
        True
    """
    if len(L_K.factors) < 2 and L_K.num_grid > 1:
        raise ValueError("structured_log_marginal_likelihood needs a Kronecker root (d >= 2).")
    if b.dim() != 1:
        raise ValueError(f"b must be a vector of length m (one output); got {tuple(b.shape)}.")
    dtype = b.dtype
    L_K, A, b, c, n, sum_log_noise, precision = _working_precision(
        L_K, A, b, c, n, sum_log_noise, precision
    )
    p = torch.ones((), dtype=b.dtype, device=b.device) if precision is None else precision
    logdet_minus_quad = _NystromLogdetMinusQuad.apply(
        A, b, p, tol, max_rank, dtype, L_K.toeplitz, *L_K.factors
    )
    value = assemble_log_likelihood(logdet_minus_quad, c, n, sum_log_noise, precision)
    return value.to(dtype)
