r"""Collapsed sparse-GP algebra: the streaming SGPR bound and posterior in whitened form.

This module is the numerical core of :class:`~streamgp.models.OnlineSGPR`: the
collapsed streaming variational bound of Bui, Nguyen & Turner, "Streaming Sparse
Gaussian Process Approximations" (NeurIPS 2017), which for a single batch is
Titsias' (AISTATS 2009) SGPR bound.

Representation. Everything the stream has taught the model is a Gaussian factor on
the inducing values ``u = u(Z)`` (a *pseudo-observation*),
``t(u) = exp(c - 1/2 u^T G G^T u + eta^T u)``, kept in natural parameters with a
root ``G`` of the precision. Bui et al. write the same factor as
``q_old(a) / p(a | theta_old)`` with precision ``D_a^{-1} = S_a^{-1} - K'_aa^{-1}``;
that subtraction is the numerical weak point of O-SGPR (the WISKI paper needed a
jitter of 0.01 in float64 to keep it positive definite). Here the precision is only
ever *accumulated* as a root (``G G^T`` is PSD by construction) and the factor does
not depend on the hyperparameters: the prior ``p(u | theta)`` changes when they are
learned, the pseudo-observations do not.

Streaming step. New data ``(X, y)`` with noise ``s2`` and new inducing points ``b``
(prior ``K_bb``, Cholesky ``L``), old factor on ``a``. With whitened projections
``B_f = L^{-1} K_bf``, ``B_a = L^{-1} K_ba`` and
``C = [B_f / s, B_a G_a]``, ``P = I + C C^T = L_P L_P^T``,
``h = B_f y / s2 + B_a eta_a``, ``z = L_P^{-1} h``, the collapsed bound is

``F = c_a - n/2 log(2 pi s2) - |y|^2 / (2 s2) - log|L_P| + |z|^2 / 2
      - tr(K_ff - Q_ff) / (2 s2) - tr(G_a^T (K_aa - Q_aa) G_a) / 2``

(Bui et al. eq. 11 in natural parameters; the constant ``c_a`` carries the bound of
the data seen before, so ``F`` approximates the log evidence of the whole stream).
The optimal ``q(b)`` is ``N(L P^{-1} h, L P^{-1} L^T)`` and the new factor on ``b`` is
``G_b = L^{-T} C``, ``eta_b = L^{-T} h``, ``c_b = F + log|L_P| - |z|^2 / 2``. With
``b = a`` and fixed hyperparameters both trace terms on ``a`` vanish and the stream
reproduces batch SGPR exactly.

Prior mean. With a prior mean ``m(.)`` (a learned constant in
:class:`~streamgp.models.OnlineSGPR`) the factor stays on the actual inducing values
``u``: Bui et al.'s ``q_old(a) / p(a | theta_old)`` is a likelihood of the old data,
so a new prior mean, like new kernel hyperparameters, changes the prior
``N(m(a), K_aa)`` and not the factor. Each step works on residuals ``u - m(Z)``,
``y - m(X)``, which have the zero-mean algebra above: the factor is translated to the
residuals of ``a`` (:meth:`PseudoObservations.shifted`), the step runs, and the new
factor is translated back to the actual values of ``b``. Translations have unit
Jacobian, so the bound is unchanged by them; it is differentiable in ``m``.

Jitter. Inducing values are modelled as ``u(z) = f(z) + e(z)`` with independent
``e ~ N(0, jitter)`` attached to each inducing point, i.e. ``K_uu = K_ZZ + jitter I``
and ``cov(u_b, u_a) = k(b, a) + jitter [b_j is a_i]``. A point kept from one set to
the next keeps its identity, which keeps ``b = a`` exact.

Posterior and conditioning. In whitened coordinates ``v = L^{-1} u`` the posterior is
``N(mu, R R^T)`` with ``R = L_P^{-T}``, and an observation ``y_q`` at ``X_q`` (online
variational conditioning, Maddox et al., NeurIPS 2021) is the linear-Gaussian
observation ``y_q = A_q v + eps`` with ``A_q = K_qZ L^{-T}``: the same algebra as the
grid posterior of WISKI with dense projection rows instead of interpolation rows, so
conditioning reuses :class:`streamgp.linalg.woodbury.LowRankCorrection`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from streamgp.linalg.grid_kernel import cholesky_with_jitter
from streamgp.linalg.woodbury import GridPosterior, LowRankCorrection


@dataclass(frozen=True)
class PseudoObservations:
    r"""Gaussian factor ``exp(log_norm - 1/2 u^T G G^T u + eta^T u)`` on inducing values.

    Attributes:
        points: ``M x d`` inducing inputs ``Z``.
        root: ``M x r`` root ``G`` of the factor's precision (``r <= M``).
        eta: ``M`` precision-times-mean (natural) parameter.
        log_norm: Scalar ``c``; with it, ``log int p(u) t(u) du`` is the bound of all
            data absorbed so far.
    """

    points: Tensor
    root: Tensor
    eta: Tensor
    log_norm: Tensor

    @staticmethod
    def empty(points: Tensor) -> PseudoObservations:
        r"""No data yet: a flat factor on ``points``."""
        M = points.shape[0]
        return PseudoObservations(
            points=points,
            root=points.new_zeros(M, 0),
            eta=points.new_zeros(M),
            log_norm=points.new_zeros(()),
        )

    @property
    def num_inducing(self) -> int:
        return self.points.shape[0]

    def shifted(self, offset: Tensor) -> PseudoObservations:
        r"""The same factor as a function of ``r = u - offset``: ``r -> t(r + offset)``.

        ``t(r + o) = exp(c' - 1/2 r^T G G^T r + eta'^T r)`` with
        ``eta' = eta - G G^T o`` and ``c' = c + eta^T o - 1/2 |G^T o|^2``; the root is
        unchanged. ``shifted(-o)`` undoes ``shifted(o)``. ``O(M r)``.

        Args:
            offset: ``M`` values ``o`` (e.g. the prior mean at the inducing points).
        """
        Gt_o = self.root.mT @ offset
        return PseudoObservations(
            points=self.points,
            root=self.root,
            eta=self.eta - self.root @ Gt_o,
            log_norm=self.log_norm + self.eta @ offset - 0.5 * (Gt_o * Gt_o).sum(),
        )


@dataclass(frozen=True)
class DenseWeights:
    r"""Dense projection rows ``A`` (``batch x q x M``) with the interface of
    :class:`~streamgp.interpolation.grid.InterpolationWeights` that
    :class:`~streamgp.linalg.woodbury.LowRankCorrection` uses."""

    matrix: Tensor

    def matmul(self, rhs: Tensor) -> Tensor:
        return self.matrix @ rhs

    def dot(self, vec: Tensor) -> Tensor:
        return (self.matrix @ vec.unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class SparsePosterior:
    r"""Collapsed posterior over inducing values, in whitened coordinates.

    Attributes:
        points: ``M x d`` inducing inputs ``Z``.
        chol: ``M x M`` Cholesky factor ``L`` of ``K_ZZ + jitter I``.
        whitened: Posterior of the whitened residuals ``v = L^{-1} (u - m(Z))`` as
            ``N(mean, root root^T)``.
        prior_mean: ``M`` prior mean ``m(Z)`` of ``u`` (None: zero).
    """

    points: Tensor
    chol: Tensor
    whitened: GridPosterior
    prior_mean: Tensor | None = None

    def q_u(self) -> tuple[Tensor, Tensor]:
        r"""Mean and covariance of ``q(u)`` in function space (for inspection and tests)."""
        L, R = self.chol, self.whitened.root
        LR = L @ R
        mean = L @ self.whitened.mean
        if self.prior_mean is not None:
            mean = mean + self.prior_mean
        return mean, LR @ LR.mT


#: A prior mean function: a gpytorch ``Mean`` or any callable mapping ``... x n x d``
#: inputs to ``... x n`` values.
PriorMean = Callable[[Tensor], Tensor]


def _mean_at(prior_mean: PriorMean | None, X: Tensor) -> Tensor | None:
    r"""``m(X)`` (``... x n``), or None for a zero prior mean."""
    if prior_mean is None:
        return None
    return prior_mean(X).expand(X.shape[:-1])


def inducing_cross_covariance(
    kernel: Kernel, Z_new: Tensor, Z_old: Tensor, jitter: Tensor, shared: Tensor | None
) -> Tensor:
    r"""``cov(u(Z_new), u(Z_old)) = k(Z_new, Z_old) + jitter [Z_new_j is Z_old_i]``.

    Args:
        shared: ``M_new`` long tensor, index into ``Z_old`` of the point that each new
            inducing point continues, or ``-1``; None means no shared points.
    """
    K = kernel(Z_new, Z_old).to_dense()
    if shared is None or Z_old.shape[0] == 0:
        return K
    rows = (shared >= 0).nonzero().squeeze(-1)
    identity = torch.zeros_like(K)
    identity[rows, shared[rows]] = 1.0
    return K + jitter.reshape(()) * identity


def match_points(Z_new: Tensor, Z_old: Tensor) -> Tensor:
    r"""For each row of ``Z_new``, the index of an identical row of ``Z_old`` or ``-1``.

    Each old row is matched at most once (first free match in order), so duplicated
    points keep distinct identities.
    """
    shared = torch.full((Z_new.shape[0],), -1, dtype=torch.long, device=Z_new.device)
    if Z_new.shape[0] == 0 or Z_old.shape[0] == 0:
        return shared
    equal = (Z_new.unsqueeze(-2) == Z_old.unsqueeze(-3)).all(-1)
    taken: set[int] = set()
    for j, i in equal.nonzero().tolist():
        if shared[j] < 0 and i not in taken:
            shared[j] = i
            taken.add(i)
    return shared


def _solve_lower(L: Tensor, rhs: Tensor) -> Tensor:
    return torch.linalg.solve_triangular(L, rhs, upper=False)


def _compress_root(C: Tensor) -> Tensor:
    r"""A root with at most ``M`` columns of ``C C^T`` (``M x r``): ``R^T`` from ``QR(C^T)``."""
    if C.shape[-1] <= C.shape[-2]:
        return C
    return torch.linalg.qr(C.mT, mode="r")[1].mT


def streaming_collapsed_bound(
    kernel: Kernel,
    noise: Tensor,
    X: Tensor,
    y: Tensor,
    inducing_points: Tensor,
    previous: PseudoObservations,
    shared: Tensor | None = None,
    relative_jitter: float | None = None,
    prior_mean: PriorMean | None = None,
) -> tuple[Tensor, PseudoObservations]:
    r"""Collapsed streaming SGPR bound of a new batch, and the updated pseudo-observations.

    Differentiable in the kernel hyperparameters, ``noise``, ``inducing_points`` and
    the prior mean's parameters (the returned factor is too, though callers usually
    store it detached). Cost ``O(M_b^2 (n + M_a) + M_b^3)``, independent of the data
    seen before.

    Args:
        kernel: The gpytorch kernel under the new hyperparameters.
        noise: Scalar Gaussian noise variance ``s2``.
        X: ``n x d`` new inputs (``n`` may be 0).
        y: ``n`` new targets.
        inducing_points: ``M_b x d`` new inducing inputs ``b``.
        previous: The factor of all earlier data, on the old inducing inputs ``a``.
        shared: Identity map from ``b`` to ``a`` (see :func:`inducing_cross_covariance`).
        relative_jitter: Jitter relative to ``mean(diag K_bb)``; default per dtype.
        prior_mean: The prior mean function of ``f`` under the new hyperparameters
            (None: zero). Both ``previous`` and the returned factor are on the actual
            inducing values, not on residuals (see the module docstring).

    Returns:
        ``(F, factor)``: the bound (log-evidence approximation of all data so far)
        and the pseudo-observations on ``b`` that summarise it.
    """
    if prior_mean is not None:
        # The zero-mean step on residuals y - m(X), a - m(a), b - m(b).
        m_a = _mean_at(prior_mean, previous.points)
        m_b = _mean_at(prior_mean, inducing_points)
        bound, factor = streaming_collapsed_bound(
            kernel,
            noise,
            X,
            y - _mean_at(prior_mean, X),
            inducing_points,
            previous.shifted(m_a),
            shared=shared,
            relative_jitter=relative_jitter,
        )
        return bound, factor.shifted(-m_b)
    Z, a = inducing_points, previous.points
    M = Z.shape[0]
    eye = torch.eye(M, dtype=Z.dtype, device=Z.device)
    L, jitter = cholesky_with_jitter(kernel(Z).to_dense(), relative_jitter)
    std = noise.sqrt()
    blocks, h = [], Z.new_zeros(M)
    bound = previous.log_norm
    if X.shape[0] > 0:
        B_f = _solve_lower(L, kernel(Z, X).to_dense())
        blocks.append(B_f / std)
        h = h + B_f @ y / noise
        trace_f = kernel(X, diag=True).sum() - (B_f * B_f).sum()
        bound = bound - 0.5 * (
            X.shape[0] * torch.log(2.0 * math.pi * noise) + (y * y).sum() / noise + trace_f / noise
        )
    if previous.root.shape[-1] > 0:
        G_a = previous.root
        B_a = _solve_lower(L, inducing_cross_covariance(kernel, Z, a, jitter, shared))
        BG = B_a @ G_a
        blocks.append(BG)
        h = h + B_a @ previous.eta
        K_aa = kernel(a).to_dense() + jitter.reshape(()) * torch.eye(
            a.shape[0], dtype=a.dtype, device=a.device
        )
        trace_a = ((K_aa @ G_a) * G_a).sum() - (BG * BG).sum()
        bound = bound - 0.5 * trace_a
    C = torch.cat(blocks, dim=-1) if blocks else Z.new_zeros(M, 0)
    L_P = torch.linalg.cholesky(eye + C @ C.mT)  # eigenvalues >= 1: no jitter needed
    z = _solve_lower(L_P, h.unsqueeze(-1)).squeeze(-1)
    half_logdet = L_P.diagonal().log().sum()
    bound = bound - half_logdet + 0.5 * (z * z).sum()
    L_t = L.mT
    factor = PseudoObservations(
        points=Z,
        root=torch.linalg.solve_triangular(L_t, _compress_root(C), upper=True),
        eta=torch.linalg.solve_triangular(L_t, h.unsqueeze(-1), upper=True).squeeze(-1),
        log_norm=bound + half_logdet - 0.5 * (z * z).sum(),
    )
    return bound, factor


def sparse_posterior(
    kernel: Kernel,
    factor: PseudoObservations,
    relative_jitter: float | None = None,
    prior_mean: PriorMean | None = None,
) -> SparsePosterior:
    r"""The collapsed posterior ``q(u)`` implied by pseudo-observations under ``kernel``.

    ``P = I + (L^T G)(L^T G)^T``, whitened mean ``P^{-1} L^T eta`` and root
    ``L_P^{-T}``. ``O(M^3)``. With a ``prior_mean`` (None: zero), the factor on ``u``
    is first translated to the residuals ``u - m(Z)`` (:meth:`PseudoObservations.shifted`),
    whose posterior is the whitened one.
    """
    Z = factor.points
    M = Z.shape[0]
    eye = torch.eye(M, dtype=Z.dtype, device=Z.device)
    m_Z = _mean_at(prior_mean, Z)
    if M == 0:
        return SparsePosterior(Z, eye, GridPosterior(root=eye, mean=Z.new_zeros(0)), m_Z)
    if m_Z is not None:
        factor = factor.shifted(m_Z)
    L, _ = cholesky_with_jitter(kernel(Z).to_dense(), relative_jitter)
    C = L.mT @ factor.root
    L_P = torch.linalg.cholesky(eye + C @ C.mT)
    root = torch.linalg.solve_triangular(L_P.mT, eye, upper=True)  # L_P^{-T}
    mean = root @ (root.mT @ (L.mT @ factor.eta))
    return SparsePosterior(
        points=Z, chol=L, whitened=GridPosterior(root=root, mean=mean), prior_mean=m_Z
    )


def projection_weights(kernel: Kernel, posterior: SparsePosterior, X: Tensor) -> DenseWeights:
    r"""Whitened projection rows ``A = K_XZ L^{-T}`` (``batch x n x M``) of inputs ``X``."""
    K_ZX = kernel(X, posterior.points).to_dense().mT  # batch x M x n
    return DenseWeights(_solve_lower(posterior.chol, K_ZX).mT)


def predict(
    kernel: Kernel,
    posterior: SparsePosterior,
    correction: LowRankCorrection,
    X: Tensor,
    prior_mean: PriorMean | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Joint predictive mean and covariance of ``f`` at ``batch x t x d`` inputs ``X``.

    ``K_XX - A A^T`` (the part of ``f`` not explained by ``u``) plus the whitened
    posterior (with any conditioning correction) pushed through ``A``, plus the prior
    mean ``m(X)`` (None: zero; ``posterior`` must have been built with the same one).

    Returns:
        ``mean`` (``sample x batch x t``) and ``covariance`` (``batch x t x t``).
    """
    K_XX = kernel(X).to_dense()
    if posterior.points.shape[0] == 0:
        mean, covar = K_XX.new_zeros(K_XX.shape[:-1]), K_XX
    else:
        A = projection_weights(kernel, posterior, X)
        mean, covar_u = correction.predict(posterior.whitened, A)
        covar = K_XX - A.matrix @ A.matrix.mT + covar_u
    m_X = _mean_at(prior_mean, X)
    return (mean if m_X is None else mean + m_X), covar
