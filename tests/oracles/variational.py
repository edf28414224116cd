r"""Dense float64 oracles for sparse variational GPs (Titsias 2009; Maddox et al. 2021).

Everything here is written with plain dense solves, independently of
``streamgp.linalg.variational``, so tests compare two separate derivations.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def titsias_optimum(
    K_zz: Tensor, K_zx: Tensor, y: Tensor, noise: float, mean_z: Tensor, mean_x: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Optimal ``q(u) = N(m, S)`` of the SVGP ELBO with a Gaussian likelihood (Titsias).

    ``Sigma = K_zz + K_zx K_xz / noise``, ``m = mean_z + K_zz Sigma^-1 K_zx (y - mean_x) / noise``,
    ``S = K_zz Sigma^-1 K_zz``.
    """
    Sigma = K_zz + K_zx @ K_zx.T / noise
    m = mean_z + K_zz @ torch.linalg.solve(Sigma, K_zx @ (y - mean_x)) / noise
    S = K_zz @ torch.linalg.solve(Sigma, K_zz)
    return m, 0.5 * (S + S.T)


def collapsed_bound(
    K_zz: Tensor, K_zx: Tensor, diag_K_xx: Tensor, y: Tensor, noise: float, mean_x: Tensor
) -> Tensor:
    r"""Titsias' collapsed ELBO ``log N(y; mean, Q + noise I) - tr(K - Q) / (2 noise)``."""
    n = len(y)
    Q = K_zx.T @ torch.linalg.solve(K_zz, K_zx)
    C = Q + noise * torch.eye(n, dtype=y.dtype)
    r = y - mean_x
    log_normal = -0.5 * (r @ torch.linalg.solve(C, r) + torch.logdet(C) + n * math.log(2 * math.pi))
    return log_normal - 0.5 * (diag_K_xx.sum() - Q.diagonal().sum()) / noise


def svgp_predictive(
    m: Tensor, S: Tensor, K_zz: Tensor, K_zx: Tensor, K_xx: Tensor, mean_z: Tensor, mean_x: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Joint ``q(f(X)) = int p(f | u) N(u; m, S) du`` (unwhitened)."""
    A = torch.linalg.solve(K_zz, K_zx)  # K_zz^-1 K_zx
    mean = mean_x + A.T @ (m - mean_z)
    covar = K_xx - K_zx.T @ A + A.T @ S @ A
    return mean, covar


def pseudo_point_conditioning(
    m: Tensor,
    S: Tensor,
    K_zz: Tensor,
    mean_z: Tensor,
    K_all: Tensor,
    mean_all: Tensor,
    num_z: int,
    num_new: int,
    y_new: Tensor,
    noise: float,
) -> tuple[Tensor, Tensor]:
    r"""OVC as an exact GP over pseudo-points (Maddox et al. 2021, Eq. 5).

    ``q(u)`` is the posterior of ``u`` under pseudo-observations ``y_tilde ~ N(u, D)``
    with ``D = (S^-1 - K_zz^-1)^-1`` and ``y_tilde = D S^-1 (m - mean_z) + mean_z``.
    The exact GP on inputs ``[Z, X_new]`` with targets ``[y_tilde, y_new]`` and noise
    ``blockdiag(D, noise I)`` is evaluated at the remaining points of ``K_all``
    (ordered ``[Z, X_new, X_test]``).
    """
    D = torch.linalg.inv(torch.linalg.inv(S) - torch.linalg.inv(K_zz))
    D = 0.5 * (D + D.T)
    y_tilde = D @ torch.linalg.solve(S, m - mean_z) + mean_z
    t = num_z + num_new
    noise_block = torch.block_diag(D, noise * torch.eye(num_new, dtype=K_all.dtype))
    A = K_all[:t, :t] + noise_block
    targets = torch.cat([y_tilde, y_new]) - mean_all[:t]
    K_test = K_all[t:, :t]
    mean = mean_all[t:] + K_test @ torch.linalg.solve(A, targets)
    covar = K_all[t:, t:] - K_test @ torch.linalg.solve(A, K_test.T)
    return mean, covar
