r"""Dense float64 oracles for decoupled variational GPs (Cheng & Boots 2017).

Written from the standard SVGP ELBO (Hensman et al. 2013) with plain dense inverses,
independently of ``streamgp.linalg.decoupled``: with a shared basis ``Z`` the
decoupled parameters ``(a, B)`` correspond to ``q(u) = N(mean_Z + K a, (K^-1 + B)^-1)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def svgp_parameters_from_decoupled(
    K_zz: Tensor, mean_z: Tensor, weights: Tensor, B: Tensor
) -> tuple[Tensor, Tensor]:
    r"""``(m, S)`` of the SVGP equivalent to a decoupled posterior with ``alpha = beta = Z``."""
    m = mean_z + K_zz @ weights
    S = torch.linalg.inv(torch.linalg.inv(K_zz) + B)
    return m, 0.5 * (S + S.T)


def svgp_elbo(
    m: Tensor,
    S: Tensor,
    K_zz: Tensor,
    K_zx: Tensor,
    diag_K_xx: Tensor,
    mean_z: Tensor,
    mean_x: Tensor,
    y: Tensor,
    noise: Tensor,
) -> Tensor:
    r"""``sum_n E_q[log N(y_n; f_n, noise)] - KL(N(m, S) || N(mean_z, K_zz))``."""
    K_inv = torch.linalg.inv(K_zz)
    A = K_inv @ K_zx
    mu = mean_x + A.T @ (m - mean_z)
    var = diag_K_xx - ((K_zz - S) @ A * A).sum(0)
    expected = -0.5 * torch.log(2 * math.pi * noise) - ((y - mu) ** 2 + var) / (2 * noise)
    d = m - mean_z
    kl = 0.5 * (
        torch.trace(K_inv @ S) + d @ K_inv @ d - len(m) + torch.logdet(K_zz) - torch.logdet(S)
    )
    return expected.sum() - kl
