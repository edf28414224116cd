r"""Grid-space Woodbury algebra for exact SKI inference with O(1)-in-n updates.

This is the numerical core of WISKI (Stanton et al., "Kernel Interpolation for
Scalable Online Gaussian Processes", AISTATS 2021), written in root form: every
covariance is kept as a factor ``R`` with ``Sigma = R R^T`` (the notation below is the
whole of the algebra). All quantities live on the grid of ``m`` points; nothing grows
with the number of observations ``n``.

Notation. ``L_K`` is a root of ``K_UU``. Observations enter only through the
*noise-weighted* statistics ``A = W^T Lambda^{-1} W``, ``b = W^T Lambda^{-1} y`` and
``c = y^T Lambda^{-1} y`` (for homoskedastic noise ``Lambda = s2 I`` and the raw sums
are divided by ``s2``). With ``C = I + L_K^T A L_K = L_C L_C^T``:

- posterior covariance of the grid values ``Sigma_U = L_K C^{-1} L_K^T = R R^T`` with
  ``R = L_K L_C^{-T}``;
- posterior mean on the grid ``alpha = R R^T b``;
- ``log p(y) = -1/2 [c - |R^T b|^2 + log|C| + sum(log lambda_i) + n log 2 pi]``.

Two ways to absorb a batch of ``q`` observations (hyperparameters fixed):

- :func:`update_root` (streaming, in place): ``R`` stays one ``m x m`` root, updated
  by a rank-``q`` square-root update in ``O(m^2 q)`` (only ``q x q`` Cholesky factors
  and triangular solves, so nothing waits on the host).
- :class:`LowRankCorrection` (conditioning inside acquisition functions): the
  parent's ``R`` is kept and the posterior becomes ``R (I - V V^T) R^T`` with ``V``
  of size ``m x Q``; only a ``q x q`` Cholesky is needed, so gradients with respect
  to the conditioning inputs are smooth, and fantasy samples share ``V``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from streamgp.interpolation.grid import InterpolationWeights
from streamgp.linalg.factor import (
    cholesky,
    cholesky_inverse,
    cholesky_inverse_lower,
    cholesky_solve,
)
from streamgp.linalg.grid_kernel import GridKernelRoot
from streamgp.linalg.posterior_covariance import (
    MAX_CACHE_ENTRIES,
    AmortizedCache,
    InterpolatedRoot,
    check_state_shape,
)


@dataclass(frozen=True)
class GridPosterior:
    r"""Posterior of the grid values: ``N(alpha, R R^T)``.

    Attributes:
        root: ``m x m`` root ``R`` of the posterior covariance of the grid values.
        mean: ``m`` posterior mean ``alpha`` of the grid values.
        cache: ``Sigma_U = R R^T`` itself, built by :meth:`grid_covariance` once the
            variance requests it would have sped up have paid for it.
    """

    root: Tensor
    mean: Tensor
    cache: AmortizedCache = field(default_factory=AmortizedCache, compare=False, repr=False)

    def grid_covariance(self, work: float) -> Tensor | None:
        r"""``Sigma_U = R R^T`` if cached, or built now that requests costing ``work``
        (dense multiply-adds) more have added up to its ``O(m^2 r)`` cost.

        Only for full-rank, unbatched roots without a graph and with ``m^2`` within
        :data:`~streamgp.linalg.posterior_covariance.MAX_CACHE_ENTRIES`; a low-rank
        (LOVE) root's own products are already cheaper than the ``m x m`` matrix.
        """
        R = self.root
        m, r = R.shape[-2:]
        if R.dim() != 2 or r < m or R.requires_grad or m * m > MAX_CACHE_ENTRIES:
            return None
        return self.cache.get(work, build_cost=m * m * r, build=lambda: R @ R.mT)

    @functools.cached_property
    def no_correction(self) -> LowRankCorrection:
        r"""The empty :class:`LowRankCorrection` of this posterior (made once: the hot
        paths of a model without conditioning ask for it at every call)."""
        return LowRankCorrection.empty(self.root.shape[-1], self.mean)

    def select_outputs(self, pick) -> GridPosterior:
        r"""The posterior of some outputs' grid values (``pick(mean, -2)``); the root and
        its cache are shared by all outputs."""
        return GridPosterior(root=self.root, mean=pick(self.mean, -2), cache=self.cache)

    def interpolated_root(self, weights: InterpolationWeights) -> InterpolatedRoot:
        r"""The lazy factor ``W_* R`` of the covariance at the rows ``weights``."""
        cached = self.grid_covariance if isinstance(weights, InterpolationWeights) else None
        return InterpolatedRoot(weights, self.root, cached)

    def state(self) -> dict[str, Any]:
        r"""The posterior as tensors and numbers (a checkpoint's): the root and mean that
        rank-``q`` updates built, and the cache's :meth:`~AmortizedCache.state`;
        :meth:`from_state` gives back a posterior that predicts bit for bit as this one
        (a refactorisation of the statistics would agree to rounding only)."""
        return {"root": self.root, "mean": self.mean, "cache": self.cache.state()}

    @staticmethod
    def from_state(state: dict[str, Any], num_grid: int) -> GridPosterior:
        r"""Inverse of :meth:`state`, for a grid of ``num_grid`` points.

        Raises:
            ValueError: If a tensor's shape does not fit the grid (naming it).
        """
        root, mean = state["root"], state["mean"]
        cache = state.get("cache", {})  # (checkpoints written before it have none)
        check_state_shape("root", root, (num_grid, None))
        check_state_shape("mean", mean, (num_grid,))
        if "value" in cache:
            check_state_shape("cache", cache["value"], (num_grid, num_grid))
        return GridPosterior(root, mean, AmortizedCache.from_state(cache))

    def downdated(self, root: Tensor, mean: Tensor, G: Tensor) -> GridPosterior:
        r"""A posterior with ``root`` and ``mean`` whose covariance is ``R R^T - G G^T``,
        keeping a cached ``Sigma_U`` up to date in ``O(m^2 q)`` instead of dropping it."""
        sigma = self.cache.value
        if sigma is None:
            return GridPosterior(root=root, mean=mean)
        return GridPosterior(root=root, mean=mean, cache=AmortizedCache(sigma - G @ G.mT))


def _matrix_C(L_K: GridKernelRoot, A: Tensor, precision: Tensor | None = None) -> Tensor:
    """``C = I + precision * L_K^T A L_K`` (eigenvalues >= 1, so it needs no jitter).

    A scalar ``precision`` (``1 / s2`` for homoskedastic noise) multiplies the
    structured product instead of ``A``, so a gradient with respect to the noise is one
    inner product rather than another ``m x m`` congruence in the backward pass.
    """
    C = L_K.congruence(A, scale=precision)
    C.diagonal(dim1=-2, dim2=-1).add_(1.0)  # in place: one pass fewer over m x m
    return C


def _cholesky_C(L_K: GridKernelRoot, A: Tensor) -> Tensor:
    """Cholesky factor of ``C = I + L_K^T A L_K``."""
    return cholesky(_matrix_C(L_K, A), overwrite_input=True)


class _LogdetPlusQuad(torch.autograd.Function):
    r"""``f(C, z) = log|C| + sign z^T C^{-1} z`` for SPD ``C``, with a closed-form gradient.

    ``df/dC = C^{-1} - sign u u^T`` and ``df/dz = 2 sign u`` with ``u = C^{-1} z``. One
    ``cholesky_inverse`` in the backward pass costs about a third of differentiating
    through the Cholesky factorisation and triangular solve.

    One ``m x m`` ``C`` with a ``k x m`` ``z`` (``k`` outputs sharing ``C``) gives the
    ``k`` values ``log|C| + sign z_j^T C^{-1} z_j`` from one factorisation.
    """

    @staticmethod
    def forward(ctx, C: Tensor, z: Tensor, sign: float) -> Tensor:
        L_C = cholesky(C)
        if _shared(C, z):  # k right-hand sides of one solve
            u = cholesky_solve(z.mT, L_C).mT
        else:
            u = cholesky_solve(z.unsqueeze(-1), L_C).squeeze(-1)
        ctx.save_for_backward(L_C, u)
        ctx.sign = sign
        return 2.0 * L_C.diagonal(dim1=-2, dim2=-1).log().sum(-1) + sign * (z * u).sum(-1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        L_C, u = ctx.saved_tensors
        grad_C = grad_z = None
        if ctx.needs_input_grad[0]:
            # In place on the fresh inverse: each m x m pass here is a fair share of the cost.
            grad_C = cholesky_inverse(L_C)
            if u.dim() == 1:
                grad_C.addr_(u, u, alpha=-ctx.sign)  # one pass, no u u^T temporary
            elif _shared(L_C, u):  # sum_j g_j (C^{-1} - sign u_j u_j^T)
                grad_C.mul_(grad.sum())
                grad_C.addmm_(u.mT * grad, u, alpha=-ctx.sign)
                return grad_C, 2.0 * ctx.sign * grad.unsqueeze(-1) * u, None
            else:
                grad_C.sub_(ctx.sign * u.unsqueeze(-1) * u.unsqueeze(-2))
            grad_C.mul_(grad[..., None, None])
        if ctx.needs_input_grad[1]:
            grad_z = 2.0 * ctx.sign * grad.unsqueeze(-1) * u
        return grad_C, grad_z, None


def _shared(C: Tensor, z: Tensor) -> bool:
    """Whether ``z`` (``k x m``) holds several right-hand sides for one ``m x m`` ``C``."""
    return C.dim() == 2 and z.dim() == 2


def logdet_plus_quad(C: Tensor, z: Tensor, sign: float = 1.0) -> Tensor:
    r"""``log|C| + sign * z^T C^{-1} z`` for SPD ``C`` (one Cholesky); differentiable.

    The data-space marginal likelihood uses ``sign = 1`` (``C = K_SKI + Lambda``), the
    grid-space one ``sign = -1`` (``C = I + L_K^T A L_K``, ``z = L_K^T b``).
    """
    return _LogdetPlusQuad.apply(C, z, sign)


def partial_trace(matrix: Tensor, sizes: list[int], axis: int) -> Tensor:
    r"""``sum over all grid axes but axis`` of the ``m x m`` ``matrix``: ``g_axis x g_axis``.

    Entry ``(a, b)`` sums ``matrix[(.., a, ..), (.., b, ..)]`` over equal indices on every
    other axis (flat grid index, first axis slowest): ``O(m g_axis)`` reads, no copy.
    """
    letters = "abcdefghijklmnopqrstuvwxyz"
    if len(sizes) > 12:
        raise ValueError(f"at most 12 grid axes are supported here; got {len(sizes)}")
    rows = [letters[j] for j in range(len(sizes))]
    cols = list(rows)
    cols[axis] = letters[len(sizes)]
    equation = f"{''.join(rows)}{''.join(cols)}->{rows[axis]}{cols[axis]}"
    return torch.einsum(equation, matrix.reshape(*sizes, *sizes))


def outer_partial_trace(
    vectors: Tensor, weights: Tensor | None, sizes: list[int], axis: int
) -> Tensor:
    r"""``sum_j weights_j`` partial trace (as :func:`partial_trace`) of ``u_j u_j^T``.

    ``vectors`` is ``k x m`` (the ``u_j`` as rows), ``weights`` ``k`` values or None for
    ones. One GEMM of the vectors laid out ``g_axis x (k m / g_axis)`` with their
    transpose (a ``torch.einsum`` over ``k x g_axis x (m / g_axis)`` copied and multiplied
    the whole array per axis first: at ``32^3`` and ``k = 320`` it took 0.33 s per axis on
    one CPU thread, the GEMM about a third of that).
    """

    def axis_first(rows: Tensor) -> Tensor:
        return rows.reshape(-1, *sizes).movedim(axis + 1, 0).reshape(sizes[axis], -1)

    U = axis_first(vectors)
    weighted = U if weights is None else axis_first(weights.unsqueeze(-1) * vectors)
    return weighted @ U.mT


class _KroneckerLogdetMinusQuad(torch.autograd.Function):
    r"""``log|C| - z^T C^{-1} z`` with ``C = I + p L^T A L``, ``z = p L^T b``, ``L = kron(L_i)``.

    The grid-space marginal likelihood with a Kronecker root, differentiated in closed
    form with respect to the factors ``L_i``, the noise precision ``p`` and ``b``,
    never through an ``m x m`` product. For a perturbation ``dL = L E``,
    ``dC = E^T (C - I) + (C - I) E`` and ``dz = E^T z``, so the derivative is
    ``2 tr(H E)`` with ``H = I - C^{-1} - u u^T`` (``u = C^{-1} z``). A factor's
    perturbation ``E = I x .. x L_i^{-1} dL_i x .. x I`` only needs the partial trace
    ``P_i`` of ``H`` over the other axes (``g_i x g_i``):
    ``df / dL_i = 2 L_i^{-T} P_i``. Similarly ``df/dp = (tr H - u^T z) / p`` and
    ``df/db = -2 p L u``. The backward pass is one ``cholesky_inverse`` plus
    ``O(m sum_i g_i)`` work, against two ``m x m`` Kronecker congruences for autograd
    through :meth:`GridKernelRoot.congruence`.

    ``k`` outputs share ``C``: ``b`` is ``k x m`` and the value has ``k`` entries.
    """

    @staticmethod
    def forward(ctx, A: Tensor, b: Tensor, precision: Tensor, *factors: Tensor) -> Tensor:
        L_K = GridKernelRoot(factors)
        rows = b.reshape(-1, b.shape[-1])  # k x m
        z = precision * L_K.t_matmul(rows.mT).mT
        L_C = cholesky(_matrix_C(L_K, A, precision), overwrite_input=True)
        u = cholesky_solve(z.mT, L_C).mT
        value = 2.0 * L_C.diagonal().log().sum() + -(z * u).sum(-1)
        ctx.save_for_backward(L_C, u, z, precision, *factors)
        ctx.single = b.dim() == 1
        return value[0] if ctx.single else value

    @staticmethod
    def backward(ctx, grad: Tensor):
        L_C, u, z, precision, *factors = ctx.saved_tensors
        sizes = [f.shape[-1] for f in factors]
        # Only sums over C^{-1} are needed, so its lower triangle T suffices: a partial
        # trace of T + T^T - diag(T) is P(T) + P(T)^T minus that of the diagonal. T
        # takes the factor's memory (a fresh m x m block costs page faults); it is kept
        # on ctx for a repeated backward (retain_graph), which must not read L_C again.
        if getattr(ctx, "inverse_lower", None) is None:
            ctx.inverse_lower = cholesky_inverse_lower(L_C, overwrite_input=True)
        C_inv_lower = ctx.inverse_lower
        m = C_inv_lower.shape[-1]
        diagonal = C_inv_lower.diagonal()
        # Partial traces of I - C^{-1} over all axes but one, and its trace.
        complement = []
        for axis, size in enumerate(sizes):
            P = partial_trace(C_inv_lower, sizes, axis)
            others = [j for j in range(len(sizes)) if j != axis]
            diagonal_part = diagonal.reshape(sizes).sum(others) if others else diagonal
            P = -(P + P.mT)
            P.diagonal().add_(diagonal_part + m // size)
            complement.append(P)
        grads = kronecker_logdet_minus_quad_backward(
            ctx, grad, u, z, precision, factors, complement, m - diagonal.sum()
        )
        return (None, *grads)


def kronecker_logdet_minus_quad_backward(
    ctx,
    grad: Tensor,
    u: Tensor,
    z: Tensor,
    precision: Tensor,
    factors: Sequence[Tensor],
    complement_partial_traces: Sequence[Tensor],
    complement_trace: Tensor,
    first_factor: int = 3,
) -> tuple[Tensor | None, ...]:
    r"""Gradients of ``log|C| - z^T C^{-1} z`` (:class:`_KroneckerLogdetMinusQuad`'s algebra).

    Given the partial traces of ``I - C^{-1}`` over all grid axes but one (one
    ``g_i x g_i`` matrix per Kronecker factor) and its trace, returns the gradients
    with respect to ``(b, precision, *factors)`` for the autograd ``ctx`` whose
    inputs had ``b`` and ``precision`` at positions 1 and 2 and the factors from
    ``first_factor`` on. Exact
    inverses give the exact gradient; a Nystrom ``(I + G_N)^{-1}`` (large grids) gives
    one within its certified trace gap.
    """
    weights = grad.reshape(-1)  # one per output
    sizes = [f.shape[-1] for f in factors]
    total = weights.sum()
    grad_b = grad_p = None
    factor_grads = []
    for axis, factor in enumerate(factors):
        if not ctx.needs_input_grad[first_factor + axis]:
            factor_grads.append(None)
            continue
        # Partial trace of H = I - C^{-1} - u u^T, then 2 L_i^{-T} P_i.
        P = total * complement_partial_traces[axis] - outer_partial_trace(u, weights, sizes, axis)
        factor_grads.append(2.0 * torch.linalg.solve_triangular(factor.mT, P, upper=True))
    if ctx.needs_input_grad[2]:
        trace_H = total * complement_trace - (weights * u.square().sum(-1)).sum()
        grad_p = (trace_H - (weights * (u * z).sum(-1)).sum()) / precision
    if ctx.needs_input_grad[1]:
        Lu = GridKernelRoot(tuple(factors)).matmul((weights.unsqueeze(-1) * u).mT).mT
        grad_b = -2.0 * precision * Lu
        grad_b = grad_b[0] if ctx.single else grad_b
    return (grad_b, grad_p, *factor_grads)


def factorize(L_K: GridKernelRoot, A: Tensor, b: Tensor) -> GridPosterior:
    r"""Build the grid posterior from a kernel root and noise-weighted statistics.

    Cost ``O(m^3)``, independent of ``n``.

    Args:
        L_K: Root of ``K_UU``.
        A: ``m x m`` noise-weighted ``W^T Lambda^{-1} W`` (``batch x m x m`` for a batch
            of models, with a kernel root of the same batch shape).
        b: ``m`` noise-weighted ``W^T Lambda^{-1} y``, or ``k x m`` for ``k`` outputs
            that share ``A`` (the root is shared; the mean is ``k x m``); ``batch x m``
            for a batch of models.
    """
    L_C = _cholesky_C(L_K, A)
    # R^T = L_C^{-1} L_K^T, a triangular solve instead of an explicit inverse.
    R_t = torch.linalg.solve_triangular(L_C, L_K.to_dense().mT, upper=False)
    root = R_t.mT
    if _batched_vector(A, b):  # one row per batch member
        return GridPosterior(root=root, mean=((b.unsqueeze(-2) @ root) @ R_t).squeeze(-2))
    # alpha = R R^T b, written for a row (or rows) b so that k outputs are one product.
    return GridPosterior(root=root, mean=(b @ root) @ R_t)


def _batched_vector(matrix: Tensor, vector: Tensor) -> bool:
    r"""Whether ``vector`` is one grid vector per batch member of a batched ``matrix``
    (``batch x m`` against ``batch x m x m``): a product needs it as a row (``k``
    outputs' ``batch x k x m`` rows, and unbatched vectors, multiply as they are)."""
    return matrix.dim() > 2 and vector.dim() == matrix.dim() - 1


def log_marginal_likelihood(
    L_K: GridKernelRoot,
    A: Tensor,
    b: Tensor,
    c: Tensor,
    n: Tensor,
    sum_log_noise: Tensor,
    precision: Tensor | None = None,
) -> Tensor:
    r"""Exact SKI ``log p(y)`` from noise-weighted statistics; differentiable.

    ``-1/2 [c - |L_C^{-1} L_K^T b|^2 + log|C| + sum(log noise) + n log(2 pi)]``, in
    ``O(m^3)`` time whatever ``n`` is. ``A, b, c`` may instead be the raw sums with the
    common noise precision passed as ``precision`` (``A, b, c`` are then scaled by it):
    the value is the same, and the backward pass skips a congruence with ``A``.

    ``k`` outputs sharing ``A`` (``b``: ``k x m``, ``c``: ``k``) give ``k`` values from
    one factorisation. A batch of models (``A``: ``batch x m x m``, ``b``: ``batch x m``,
    ``c``, ``sum_log_noise`` and ``precision``: ``batch``, ``L_K`` with batched factors)
    gives one value per member (the dense path: the Kronecker closed form is unbatched).
    """
    if _kronecker_closed_form(L_K, A, b):
        p = torch.ones((), dtype=b.dtype, device=b.device) if precision is None else precision
        logdet_minus_quad = _KroneckerLogdetMinusQuad.apply(A, b, p, *L_K.factors)
        return assemble_log_likelihood(logdet_minus_quad, c, n, sum_log_noise, precision)
    if b.dim() == 2 and A.dim() == 2:  # k outputs: their L_K^T b as rows
        z = L_K.t_matmul(b.mT).mT
    else:
        z = L_K.t_matmul(b.unsqueeze(-1)).squeeze(-1)
    if precision is not None:
        z = (precision if precision.dim() == 0 else precision.unsqueeze(-1)) * z
    logdet_minus_quad = logdet_plus_quad(_matrix_C(L_K, A, precision), z, -1.0)
    return assemble_log_likelihood(logdet_minus_quad, c, n, sum_log_noise, precision)


def assemble_log_likelihood(
    logdet_minus_quad: Tensor,
    c: Tensor,
    n: Tensor,
    sum_log_noise: Tensor,
    precision: Tensor | None,
) -> Tensor:
    r"""``-1/2 [c - z^T C^{-1} z + log|C| + sum(log noise) + n log 2 pi]`` (grid space).

    ``c`` is the raw ``y^T y`` scaled here by ``precision`` when one is given, or the
    noise-weighted sum with ``precision=None``.
    """
    c = c if precision is None else precision * c
    return -0.5 * (c + logdet_minus_quad + sum_log_noise + n * math.log(2.0 * math.pi))


def _kronecker_closed_form(L_K: GridKernelRoot, A: Tensor, b: Tensor) -> bool:
    """Whether :class:`_KroneckerLogdetMinusQuad` applies: a Kronecker root, constant ``A``."""
    return (
        len(L_K.factors) > 1
        and A.dim() == 2
        and not A.requires_grad
        and b.dim() <= 2
        and all(f.dim() == 2 for f in L_K.factors)
    )


def _whitened_downdate(R: Tensor, RV: Tensor, V: Tensor, N: Tensor) -> Tensor:
    r"""``R T`` for the root ``T = I - V (I + N)^{-1} V^T`` of ``I - V V^T`` (``RV = R V``).

    ``N`` is the lower Cholesky factor of ``I - V^T V`` (``V^T V < I``). With
    ``K = (I + N)^{-1}``, ``T T^T = I - V (K + K^T - K V^T V K^T) V^T`` and
    ``K + K^T - K (I - N N^T) K^T = K (I + N + N^T + N N^T) K^T
    = K (I + N)(I + N)^T K^T = I``, so ``T T^T = I - V V^T`` exactly (the block form of
    Potter's and Andrews' square-root updates). ``I + N`` has a diagonal of at least
    one, so its triangular solve is well conditioned; then one fused pass over the
    ``m x m`` root (a rank-``Q`` update is memory-bound).
    """
    eye = torch.eye(N.shape[-1], dtype=N.dtype, device=N.device)
    # K V^T = (I + N)^{-1} V^T, a triangular solve (no inverse).
    KVt = torch.linalg.solve_triangular(eye + N, V.mT, upper=False)
    if R.dim() > 2:  # a batch of roots
        return torch.baddbmm(R, RV, KVt, alpha=-1.0) if R.dim() == 3 else R - RV @ KVt
    return torch.addmm(R, RV, KVt, alpha=-1.0)


def update_root(
    posterior: GridPosterior, W_q: InterpolationWeights, y: Tensor, noise: Tensor
) -> GridPosterior:
    r"""Absorb ``q`` observations into the grid posterior in ``O(m^2 q)``.

    With ``U = R^T W_q^T`` and ``S = U^T U + diag(noise) = D^{1/2} L L^T D^{1/2}``
    (``D = diag(noise)``, ``L`` the Cholesky factor of the whitened ``S``): mean
    ``alpha += R U S^{-1} (y - W_q alpha)``; root ``R <- R T`` with ``T`` the square root
    of ``I - U S^{-1} U^T = I - V V^T``, ``V = U D^{-1/2} L^{-T}``, whose
    ``I - V^T V = L^{-1} L^{-T}`` has the Cholesky factor ``L^{-1}``
    (:func:`_whitened_downdate`; Andrews' square-root update). Only ``q x q``
    factorisations and triangular solves: no SVD, nothing read back on the host.

    Args:
        posterior: Current grid posterior (not modified).
        W_q: Interpolation weights of the ``q`` new inputs (unbatched; ``batch x q``
            rows for a batch of models, whose root is ``batch x m x m``: each member
            absorbs its own rows in ``O(m^2 q)``).
        y: ``q`` new targets (``k x q`` for ``k`` outputs sharing the root; ``batch x q``).
        noise: ``q`` observation noise variances (``batch x q``).
    """
    R, alpha = posterior.root, posterior.mean
    U_t = W_q.matmul(R)  # q x m, rows u_i = R^T w_i
    scale = noise.rsqrt()
    U_white = U_t * scale.unsqueeze(-1)  # D^{-1/2} U^T
    eye = torch.eye(U_t.shape[-2], dtype=U_t.dtype, device=U_t.device)
    L = cholesky(U_white @ U_white.mT + eye)
    V = torch.linalg.solve_triangular(L, U_white, upper=False).mT  # m x q
    # S^{-1} r = D^{-1/2} L^{-T} L^{-1} D^{-1/2} r, as rows for k outputs' residuals.
    residual = (y - W_q.dot(alpha)) * scale
    coef = torch.linalg.solve_triangular(L, residual.unsqueeze(-1), upper=False)
    RV = R @ V
    if _batched_vector(R, alpha):  # alpha + R V L^{-1} D^{-1/2} r, per batch member
        new_mean = alpha + (coef.mT @ RV.mT).squeeze(-2)
    else:  # alpha + R V L^{-1} D^{-1/2} r
        new_mean = alpha + coef.squeeze(-1) @ RV.mT
    N = torch.linalg.solve_triangular(L, eye, upper=False)  # L^{-1}: the factor of I - V^T V
    return posterior.downdated(_whitened_downdate(R, RV, V, N), new_mean, RV)


def fold_low_rank(posterior: GridPosterior, V: Tensor, gamma: Tensor) -> GridPosterior:
    r"""Fold an unbatched :class:`LowRankCorrection` back into a single root (or that of
    a batch of models, ``V``: ``batch x m x Q``, into each member's root).

    ``I - V V^T = T T^T`` with ``T = I - V (I + N)^{-1} V^T``, ``N`` the Cholesky factor
    of ``I - V^T V`` (``V^T V < I`` because ``V V^T`` is a posterior variance reduction
    in whitened coordinates; :func:`_whitened_downdate`). Cost ``O(m^2 Q)``, with only
    ``Q x Q`` factorisations.
    """
    R, alpha = posterior.root, posterior.mean
    eye = torch.eye(V.shape[-1], dtype=V.dtype, device=V.device)
    N = cholesky(eye - V.mT @ V)
    RV = R @ V
    if _batched_vector(R, alpha):  # a batch of models, each with its own V and gamma
        new_mean = alpha + (gamma.unsqueeze(-2) @ RV.mT).squeeze(-2)
    else:
        new_mean = alpha + gamma @ RV.mT
    return posterior.downdated(_whitened_downdate(R, RV, V, N), new_mean, RV)


def _cat_columns(old: Tensor, new: Tensor) -> Tensor:
    r"""``[old, new]`` along the last dimension, the other dimensions broadcast; ``new``
    itself (no copy) when ``old`` has no columns and ``new`` has the broadcast shape."""
    batch = torch.broadcast_shapes(old.shape[:-1], new.shape[:-1])
    if old.shape[-1] == 0 and new.shape[:-1] == batch:
        return new

    def expand(x: Tensor) -> Tensor:  # (no operation where x has the batch already)
        return x if x.shape[:-1] == batch else x.expand(*batch, x.shape[-1])

    return torch.cat([expand(old), expand(new)], -1)


@dataclass(frozen=True)
class LowRankCorrection:
    r"""A rank-``Q`` correction of a parent grid posterior from conditioning.

    The conditioned posterior of the grid values is
    ``N(alpha + R V gamma, R (I - V V^T) R^T)``. ``V`` (``batch x m x Q``) depends
    only on the conditioning inputs, so all fantasy samples share it; ``gamma``
    (``sample x batch x Q``) carries the targets.
    """

    V: Tensor
    gamma: Tensor

    @staticmethod
    def empty(m: int, like: Tensor) -> LowRankCorrection:
        r"""No correction for a grid mean ``like`` (``m``, or ``k x m`` for ``k`` outputs)."""
        return LowRankCorrection(V=like.new_zeros(m, 0), gamma=like.new_zeros(*like.shape[:-1], 0))

    @property
    def rank(self) -> int:
        return self.V.shape[-1]

    def select_outputs(self, pick) -> LowRankCorrection:
        r"""The correction of some outputs (``pick(gamma, -2)``; ``V`` is shared)."""
        return replace(self, gamma=pick(self.gamma, -2))

    def condition(
        self, posterior: GridPosterior, W_q: InterpolationWeights, y: Tensor, noise: Tensor
    ) -> LowRankCorrection:
        r"""Condition on ``q`` more observations in ``O(b m q (Q + q))``.

        Args:
            posterior: The parent's grid posterior ``(R, alpha)``.
            W_q: Interpolation weights of the new inputs, ``batch x q`` rows.
            y: ``sample x batch x q`` targets (batch dims broadcast).
            noise: ``batch x q`` noise variances (broadcastable).
        """
        # With U = R^T W_q^T (batch x m x q), everything is written with its transpose
        # U_t = W_q R (rows u_i = R^T w_i), as the products give it: no transposed copies.
        U_t = W_q.matmul(posterior.root)  # batch x q x m
        prior_mean = W_q.dot(posterior.mean)
        if self.rank == 0:  # the first conditioning: (I - V V^T) U = U, nothing to add
            U_tilde_t = U_t
        else:
            UtV = U_t @ self.V  # batch x q x Q, (V^T U)^T
            U_tilde_t = U_t - UtV @ self.V.mT  # ((I - V V^T) U)^T
            prior_mean = prior_mean + torch.einsum("...qQ,...Q->...q", UtV, self.gamma)
        S = U_t @ U_tilde_t.mT  # U^T (I - V V^T) U
        diagonal = S.diagonal(dim1=-2, dim2=-1)
        if torch.broadcast_shapes(noise.shape, diagonal.shape) == diagonal.shape:
            diagonal.add_(noise)  # S + diag(noise), in place (S is this call's own)
        else:  # noise with more batch dims than S
            S = S + torch.diag_embed(
                noise.expand(torch.broadcast_shapes(noise.shape, diagonal.shape))
            )
        L_S = cholesky(S)
        V_new = torch.linalg.solve_triangular(L_S, U_tilde_t, upper=False).mT
        residual = y - prior_mean
        gamma_new = torch.linalg.solve_triangular(L_S, residual.unsqueeze(-1), upper=False).squeeze(
            -1
        )
        return LowRankCorrection(
            V=_cat_columns(self.V, V_new), gamma=_cat_columns(self.gamma, gamma_new)
        )

    def predict_factors(
        self, posterior: GridPosterior, W_star: InterpolationWeights
    ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
        r"""Mean and the factors of the covariance at ``batch x t`` test points.

        Returns:
            ``mean`` (``sample x batch x t``), ``positive = (U_*,)`` and
            ``negative = (U_* V,)`` (empty without conditioning), with
            ``U_* = W_* R`` (an :class:`InterpolatedRoot`, formed only if needed):
            the covariance is ``U_* U_*^T - (U_* V)(U_* V)^T``
            (see :class:`~streamgp.linalg.posterior_covariance.PosteriorCovariance`).
        """
        U_star = posterior.interpolated_root(W_star)  # batch x t x m, rows R^T w_*, lazy
        mean = W_star.dot(posterior.mean)
        if self.rank == 0:
            return mean, (U_star,), ()
        m, Q = self.V.shape[-2], self.V.shape[-1]
        sparse = isinstance(W_star, InterpolationWeights)
        rows = math.prod(W_star.indices.shape[:-1]) if sparse else 0
        if not sparse or rows * m * (1 + Q) <= m * m * Q:  # few points: (W_* R) V
            UV = U_star.tensor @ self.V
        else:  # many points: R V once, then a k-row gather per point
            UV = W_star.matmul(posterior.root @ self.V)  # batch x t x Q
        mean = mean + torch.einsum("...tQ,...Q->...t", UV, self.gamma)
        return mean, (U_star,), (UV,)

    def predict(
        self, posterior: GridPosterior, W_star: InterpolationWeights
    ) -> tuple[Tensor, Tensor]:
        r"""Joint posterior mean and covariance at ``batch x t`` test points.

        Returns:
            ``mean`` of shape ``sample x batch x t`` and ``covariance`` of shape
            ``batch x t x t`` (without sample dims; broadcast by the caller).
        """
        mean, (U_star,), negative = self.predict_factors(posterior, W_star)
        covar = U_star.gram()
        for N in negative:
            covar = covar - N @ N.mT
        return mean, covar
