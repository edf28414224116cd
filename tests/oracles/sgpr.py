r"""Dense float64 oracles for sparse GPs (SGPR, streaming SGPR, conditioning of q(u)).

Written from the textbook formulas in function space with dense solves (no whitening,
no roots, no natural parameters), so they check :mod:`streamgp.linalg.sparse_gp`
independently:

- Titsias (2009): ``q(u) = N(m, S)`` with ``S = K_uu (K_uu + K_uf K_fu / s2)^{-1} K_uu``,
  ``m = S K_uu^{-1} K_uf y / s2``; bound ``log N(y; 0, Q_ff + s2 I) - tr(K_ff - Q_ff) / (2 s2)``.
- Bui et al. (2017), eq. 11, in their own parametrisation (``m_a, S_a, K'_aa``,
  ``D_a = (S_a^{-1} - K'_aa^{-1})^{-1}``, ``y_hat = D_a S_a^{-1} m_a``).
- Conditioning: ``q'(u) ∝ q(u) N(y_q; K_qu K_uu^{-1} u, noise)``, batched.
"""

from __future__ import annotations

import math

import torch
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor

from oracles.base import DenseOracle, rel_err


def jittered(K: Tensor, rel: float) -> Tensor:
    eye = torch.eye(K.shape[-1], dtype=K.dtype)
    return K + rel * K.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None] * eye


def log_normal(y: Tensor, cov: Tensor) -> Tensor:
    L = torch.linalg.cholesky(cov)
    z = torch.linalg.solve_triangular(L, y.unsqueeze(-1), upper=False).squeeze(-1)
    return -0.5 * ((z * z).sum() + 2 * L.diagonal().log().sum() + len(y) * math.log(2 * math.pi))


def titsias(kernel, noise: Tensor, X: Tensor, y: Tensor, Z: Tensor, rel_jitter: float):
    """Batch SGPR: returns (bound, m, S, K_uu) in function space."""
    K_uu = jittered(kernel(Z).to_dense(), rel_jitter)
    K_uf = kernel(Z, X).to_dense()
    K_ff_diag = kernel(X, diag=True)
    Q_ff = K_uf.mT @ torch.linalg.solve(K_uu, K_uf)
    bound = log_normal(y, Q_ff + noise * torch.eye(len(y), dtype=y.dtype))
    bound = bound - (K_ff_diag.sum() - Q_ff.diagonal().sum()) / (2 * noise)
    S = K_uu @ torch.linalg.solve(K_uu + K_uf @ K_uf.mT / noise, K_uu)
    m = S @ torch.linalg.solve(K_uu, K_uf @ y) / noise
    return bound, m, S, K_uu


def bui_bound(
    kernel,
    noise: Tensor,
    X: Tensor,
    y: Tensor,
    b: Tensor,
    a: Tensor,
    m_a: Tensor,
    S_a: Tensor,
    K_aa_old: Tensor,
    old_bound: Tensor,
    rel_jitter: float,
):
    """Bui et al. eq. 11 (collapsed online bound) plus the old bound; returns (F, m_b, S_b)."""
    n, M_a = len(y), len(a)
    K_bb = jittered(kernel(b).to_dense(), rel_jitter)
    K_bf, K_ba = kernel(b, X).to_dense(), kernel(b, a).to_dense()
    K_aa = kernel(a).to_dense()
    S_inv = torch.linalg.inv(S_a)
    D_a = torch.linalg.inv(S_inv - torch.linalg.inv(K_aa_old))
    y_hat = D_a @ S_inv @ m_a
    Kfb_ab = torch.cat([K_bf.mT, K_ba.mT])  # (n + M_a) x M_b
    K_hat = Kfb_ab @ torch.linalg.solve(K_bb, Kfb_ab.mT)
    Sigma = torch.block_diag(noise * torch.eye(n, dtype=y.dtype), D_a)
    F = log_normal(torch.cat([y, y_hat]), K_hat + Sigma)
    Q_ff_diag = (K_bf * torch.linalg.solve(K_bb, K_bf)).sum(0)
    F = F - (kernel(X, diag=True).sum() - Q_ff_diag.sum()) / (2 * noise)
    Q_aa = K_ba.mT @ torch.linalg.solve(K_bb, K_ba)
    F = F - 0.5 * torch.trace(torch.linalg.solve(D_a, K_aa - Q_aa))
    delta = (
        0.5 * y_hat @ torch.linalg.solve(D_a, y_hat)
        - 0.5 * m_a @ S_inv @ m_a
        + 0.5 * torch.logdet(D_a)
        - 0.5 * torch.logdet(S_a)
        + 0.5 * torch.logdet(K_aa_old)
        + 0.5 * M_a * math.log(2 * math.pi)
    )
    Phi_Sinv = torch.cat([K_bf / noise, K_ba @ torch.linalg.inv(D_a)], dim=-1)
    S_b = K_bb @ torch.linalg.solve(K_bb + Phi_Sinv @ Kfb_ab, K_bb)
    m_b = S_b @ torch.linalg.solve(K_bb, Phi_Sinv @ torch.cat([y, y_hat]))
    return F + delta + old_bound, m_b, S_b


class DenseQuModel(DenseOracle):
    r"""Predictive ``p(f* | u) q(u)`` with a dense ``q(u) = N(m, S)`` (batched), no transforms.

    ``condition_on_observations`` applies the exact Gaussian update of ``q(u)`` for
    ``y = K_qu K_uu^{-1} u + eps``; it is the oracle for conditioning and fantasies.
    """

    def __init__(self, kernel, noise: Tensor, Z: Tensor, K_uu: Tensor, m: Tensor, S: Tensor):
        super().__init__()
        self.kernel, self.noise, self.Z, self.K_uu, self.m, self.S = kernel, noise, Z, K_uu, m, S
        self.likelihood = GaussianLikelihood().to(noise)
        self.likelihood.noise = noise.detach()

    @property
    def batch_shape(self) -> torch.Size:
        return self.m.shape[:-1]

    def latent(self, Xs: Tensor) -> tuple[Tensor, Tensor]:
        K_su = self.kernel(Xs, self.Z).to_dense()
        H = torch.linalg.solve(self.K_uu, K_su.mT).mT  # K_su K_uu^{-1}
        mean = (H @ self.m.unsqueeze(-1)).squeeze(-1)
        covar = self.kernel(Xs).to_dense() - H @ K_su.mT + H @ self.S @ H.mT
        return mean, covar

    def noise_level(self) -> Tensor:
        return self.noise

    def condition_on_observations(self, X, Y, noise=None, **kwargs):
        y = Y.squeeze(-1)
        noise_q = self.noise.expand(X.shape[:-1]) if noise is None else noise.squeeze(-1)
        H = torch.linalg.solve(self.K_uu, self.kernel(X, self.Z).to_dense().mT).mT  # b x q x M
        S_inv = torch.linalg.inv(self.S)
        prec = S_inv + H.mT @ (H / noise_q.unsqueeze(-1))
        S_new = torch.linalg.inv(prec)
        rhs = (S_inv @ self.m.unsqueeze(-1)).squeeze(-1) + (
            H.mT @ (y / noise_q).unsqueeze(-1)
        ).squeeze(-1)
        m_new = (S_new @ rhs.unsqueeze(-1)).squeeze(-1)
        return DenseQuModel(self.kernel, self.noise, self.Z, self.K_uu, m_new, S_new)


__all__ = ["DenseQuModel", "bui_bound", "jittered", "log_normal", "rel_err", "titsias"]
