r"""Algebra of decoupled Gaussian-process posteriors (SVDGP).

Cheng & Boots, "Variational Inference for Gaussian Process Models with Linear
Complexity", NeurIPS 2017, parametrise a Gaussian process posterior with two separate
bases: a mean basis ``alpha`` (``M_alpha`` points, coefficients ``a``) and a covariance
basis ``beta`` (``M_beta`` points, PSD matrix ``B = L L^T``), Eq. (7)-(8):

.. math::

    m(x) = m_0(x) + k_{x\alpha} a, \qquad
    k(x, x') = k_{xx'} - k_{x\beta} (B^{-1} + K_\beta)^{-1} k_{\beta x'},

with ``(B^-1 + K_beta)^-1 = L H^-1 L^T`` and ``H = I + L^T K_beta L`` (footnote 9).
``H >= I``, so its Cholesky factor needs no jitter and ``K_beta`` is never inverted.
The KL divergence to the prior, Eq. (9), is

.. math::

    \mathrm{KL} = \tfrac12 a^T K_\alpha a + \tfrac12 \log|H|
        - \tfrac12 \mathrm{tr}(K_\beta L H^{-1} L^T),

and ``tr(K_beta L H^-1 L^T) = tr(H^-1 (H - I)) = M_beta - tr(H^-1)``. The mean term
costs ``O(M_alpha^2)``; :func:`mean_kl_term` can replace it by the unbiased
column-sampled estimate of section 3.4, whose value and gradients cost
``O(N_c M_alpha)`` for ``N_c`` sampled columns.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from streamgp.linalg.grid_kernel import jittered_cholesky


class DecoupledCovariance(NamedTuple):
    r"""Factors of the covariance part of a decoupled posterior.

    Attributes:
        root: ``L``, the lower-triangular ``M_beta x M_beta`` root of ``B``.
        H_chol: Cholesky factor of ``H = I + L^T K_beta L``.
    """

    root: Tensor
    H_chol: Tensor


def decoupled_covariance(K_beta: Tensor, root: Tensor) -> DecoupledCovariance:
    r"""Factorise ``H = I + L^T K_beta L`` for a covariance basis with root ``L``.

    Args:
        K_beta: ``M_beta x M_beta`` prior covariance of the covariance basis.
        root: ``M_beta x M_beta`` lower-triangular ``L`` (``B = L L^T``).

    Returns:
        The :class:`DecoupledCovariance` used by :func:`decoupled_predictive` and
        :func:`decoupled_kl`.
    """
    eye = torch.eye(root.shape[-1], dtype=root.dtype, device=root.device)
    H = eye + root.mT @ K_beta @ root
    H = 0.5 * (H + H.mT)
    return DecoupledCovariance(root=root, H_chol=torch.linalg.cholesky(H))


def decoupled_predictive(
    prior_mean: Tensor,
    K_x_alpha: Tensor,
    weights: Tensor,
    K_xx: Tensor,
    K_x_beta: Tensor,
    factors: DecoupledCovariance,
) -> tuple[Tensor, Tensor]:
    r"""Mean and covariance of the decoupled posterior at inputs ``X`` (Eq. 8).

    Args:
        prior_mean: ``batch x n`` prior mean ``m_0(X)``.
        K_x_alpha: ``batch x n x M_alpha`` cross-covariance to the mean basis.
        weights: ``M_alpha`` mean coefficients ``a``.
        K_xx: ``batch x n x n`` prior covariance, or its ``batch x n`` diagonal.
        K_x_beta: ``batch x n x M_beta`` cross-covariance to the covariance basis.
        factors: Output of :func:`decoupled_covariance`.

    Returns:
        ``(mean, covar)``: ``batch x n`` and, like ``K_xx``, ``batch x n x n`` or the
        ``batch x n`` variances.
    """
    mean = prior_mean + (K_x_alpha @ weights.unsqueeze(-1)).squeeze(-1)
    # V = C^-1 L^T K_beta_x with C C^T = H, so K_x_beta L H^-1 L^T K_beta_x = V^T V.
    projected = (K_x_beta @ factors.root).mT
    V = torch.linalg.solve_triangular(factors.H_chol, projected, upper=False)
    if K_xx.dim() == mean.dim():
        return mean, K_xx - V.pow(2).sum(-2)
    return mean, K_xx - V.mT @ V


def mean_kl_term(weights: Tensor, K_alpha_columns: Tensor, columns: Tensor | None = None) -> Tensor:
    r"""``1/2 a^T K_alpha a``, exactly or by column sampling (section 3.4).

    Args:
        weights: ``M_alpha`` coefficients ``a``.
        K_alpha_columns: ``M_alpha x N_c`` columns ``K_alpha[:, columns]`` (all of
            ``K_alpha`` when ``columns`` is None).
        columns: ``N_c`` column indices sampled uniformly without replacement, or None.

    Returns:
        The scalar ``1/2 a^T K_alpha a`` or its unbiased estimate
        ``M_alpha / (2 N_c) * a^T K_alpha[:, S] a_S``, whose gradient in ``a`` is an
        unbiased estimate of ``K_alpha a``; both cost ``O(N_c M_alpha)``.
    """
    if columns is None:
        return 0.5 * weights @ (K_alpha_columns @ weights)
    scale = weights.shape[-1] / columns.shape[-1]
    return 0.5 * scale * (weights @ K_alpha_columns) @ weights[columns]


def decoupled_kl(mean_term: Tensor, factors: DecoupledCovariance) -> Tensor:
    r"""``KL(q || p)`` of a decoupled posterior to its prior (Eq. 9).

    Args:
        mean_term: ``1/2 a^T K_alpha a`` (or its estimate) from :func:`mean_kl_term`.
        factors: Output of :func:`decoupled_covariance`.

    Returns:
        ``mean_term + 1/2 log|H| - 1/2 (M_beta - tr(H^-1))``.
    """
    C = factors.H_chol
    eye = torch.eye(C.shape[-1], dtype=C.dtype, device=C.device)
    trace_H_inv = torch.linalg.solve_triangular(C, eye, upper=False).pow(2).sum((-2, -1))
    log_det_H = 2.0 * C.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return mean_term + 0.5 * log_det_H - 0.5 * (C.shape[-1] - trace_H_inv)


def gaussian_optimal_parameters(
    K_alpha: Tensor,
    K_x_alpha: Tensor,
    residual: Tensor,
    K_beta: Tensor,
    K_x_beta: Tensor,
    noise: Tensor,
) -> tuple[Tensor, Tensor]:
    r"""The ``(a, L)`` maximising the decoupled ELBO on ``n`` points, Gaussian likelihood.

    With a Gaussian likelihood the ELBO splits into a mean part in ``a`` and a
    covariance part in ``B`` (section 3.4). The mean part is kernel ridge regression,
    ``(K_alpha,x K_x,alpha + s2 K_alpha) a = K_alpha,x r``; the covariance part is the
    SVGP covariance problem (Titsias 2009), maximised by
    ``B = K_beta^-1 K_beta,x K_x,beta K_beta^-1 / s2``. ``L`` is returned as a
    lower-triangular root of that ``B`` from a QR factorisation, so ``B`` itself is
    never factorised (``K_alpha`` and ``K_beta`` get the smallest jitter that
    factorises them). The ridge system is solved whitened, ``a = L_alpha^-T c`` with
    ``(Phi^T Phi + s2 I) c = Phi^T r``, ``Phi = K_x,alpha L_alpha^-T``: its condition
    number is at most ``1 + ||Phi||^2 / s2``, where the normal equations above square
    that of ``K_alpha`` (with a small noise and a smooth kernel they lose most digits,
    and the ELBO at the result is not a smooth function of the hyperparameters).
    Costs ``O(n M_alpha^2 + M_alpha^3 + n M_beta^2 + M_beta^3)``: meant for warm starts
    and for fitting the hyperparameters with ``(a, L)`` at their optimum, not for every
    streaming step.

    Args:
        K_alpha: ``M_alpha x M_alpha`` prior covariance of the mean basis.
        K_x_alpha: ``n x M_alpha`` cross-covariance of the data to the mean basis.
        residual: ``n`` targets minus the prior mean.
        K_beta: ``M_beta x M_beta`` prior covariance of the covariance basis.
        K_x_beta: ``n x M_beta`` cross-covariance of the data to the covariance basis.
        noise: Scalar noise variance ``s2``.

    Returns:
        ``(a, L)`` of shapes ``M_alpha`` and ``M_beta x M_beta``.
    """
    L_alpha = jittered_cholesky(K_alpha)
    Phi_T = torch.linalg.solve_triangular(L_alpha, K_x_alpha.mT, upper=False)  # L^-1 K_alpha,x
    eye = torch.eye(K_alpha.shape[-1], dtype=K_alpha.dtype, device=K_alpha.device)
    ridge = jittered_cholesky(Phi_T @ Phi_T.mT + noise * eye)
    c = torch.cholesky_solve(Phi_T @ residual.unsqueeze(-1), ridge)
    weights = torch.linalg.solve_triangular(L_alpha.mT, c, upper=True).squeeze(-1)
    m_beta = K_beta.shape[-1]
    # W = K_beta^-1 K_beta,x / s; B = W W^T = R^T R with W^T = Q R.
    W = torch.cholesky_solve(K_x_beta.mT, jittered_cholesky(K_beta)) / noise.sqrt()
    R = torch.linalg.qr(W.mT, mode="r").R  # min(n, M_beta) x M_beta; no n x n Q
    if R.shape[-2] < m_beta:
        R = torch.cat([R, R.new_zeros(m_beta - R.shape[-2], m_beta)], dim=-2)
    return weights, R.mT
