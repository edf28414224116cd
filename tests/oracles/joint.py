r"""A model's own posterior, conditioned on fantasies by dense Gaussian algebra.

``JointGaussianOracle`` needs no training data: unconditioned it *is* the model (its
``posterior``, so BoTorch's samplers draw the same fantasies from both), and
``condition_on_observations`` returns an oracle whose latent posterior at ``X_s`` is the
exact Gaussian update, on ``(X_c, y_c)`` with noise, of the model's joint latent
posterior over ``[X_c, X_s]`` (dense solves). It is the fantasy oracle for qNIPV and qKG
of any model whose conditioning is the Gaussian update of its predictive.

A model whose observations see ``f`` only through inducing values (the projected
process of O-SGPR, whose conditioning updates ``q(u)``) is the Gaussian update of the
joint of ``[g(X_c), f(X_s)]`` with ``g = E[f | u]``: its predictive joint minus the
Nystrom residual ``K - K_.Z K_ZZ^{-1} K_Z.`` on the blocks that involve ``X_c``.
``residual`` supplies that covariance.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from oracles.base import DenseOracle


def batched_gaussian_conditioning(
    mean: Tensor, covar: Tensor, q: int, y: Tensor, noise: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Condition joint Gaussians over ``q + t`` points on noisy values of the first ``q``.

    ``mean`` is ``batch x (q + t)``, ``covar`` ``batch x (q + t) x (q + t)``, ``y`` and
    ``noise`` ``batch x q`` (broadcast). Returns the mean and covariance of the last ``t``.
    """
    C_qq = covar[..., :q, :q] + torch.diag_embed(noise)
    C_sq = covar[..., q:, :q]
    gain = torch.linalg.solve(C_qq, C_sq.mT).mT
    mean_s = mean[..., q:] + (gain @ (y - mean[..., :q]).unsqueeze(-1)).squeeze(-1)
    return mean_s, covar[..., q:, q:] - gain @ C_sq.mT


class JointGaussianOracle(DenseOracle):
    r"""``model``'s posterior, conditioned exactly on ``(X_c, y_c, noise_c)`` if given.

    Args:
        model: A single-output model without outcome transform (its posterior is then its
            latent posterior in the space it conditions in).
        residual: Optional ``(X1, X2) -> covariance`` the model's observations do not see
            (removed from the blocks of the joint that involve the conditioning points).
        conditioning: ``(X_c, y_c, noise_c)``: ``batch x q x d``, ``batch x q``, ``batch x q``.
    """

    def __init__(
        self,
        model,
        residual: Callable[[Tensor, Tensor], Tensor] | None = None,
        conditioning: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.residual = residual
        self.conditioning = conditioning

    @property
    def likelihood(self):
        return self.model.likelihood

    @property
    def batch_shape(self) -> torch.Size:
        if self.conditioning is None:
            return self.model.batch_shape
        X_c, y_c, _ = self.conditioning
        return torch.broadcast_shapes(X_c.shape[:-2], y_c.shape[:-1])

    def noise_level(self) -> Tensor:
        return self.model.noise_variance.detach()

    def posterior(self, X, observation_noise=False, posterior_transform=None, **kwargs):
        if self.conditioning is None:
            return self.model.posterior(X, observation_noise, posterior_transform)
        if observation_noise is not False:
            raise NotImplementedError("the fantasy oracle predicts the latent function only")
        # A lazy covariance: low-rank models (SoftKI) have singular joint covariances,
        # which torch's MultivariateNormal would try to factorise.
        mean, covar = self.latent(X)
        covar = DenseLinearOperator(covar.expand(*mean.shape, mean.shape[-1]))
        posterior = GPyTorchPosterior(MultivariateNormal(mean, covar))
        return posterior if posterior_transform is None else posterior_transform(posterior)

    def latent(self, Xs: Tensor) -> tuple[Tensor, Tensor]:
        X_c, y_c, noise_c = self.conditioning
        q = X_c.shape[-2]
        batch = torch.broadcast_shapes(X_c.shape[:-2], Xs.shape[:-2])
        joint_X = torch.cat(
            [X_c.expand(*batch, *X_c.shape[-2:]), Xs.expand(*batch, *Xs.shape[-2:])], dim=-2
        )
        posterior = self.model.posterior(joint_X)
        mean = posterior.mean.squeeze(-1)
        covar = posterior.distribution.covariance_matrix
        if self.residual is not None:
            R = self.residual(joint_X, joint_X[..., :q, :])  # (q + t) x q
            covar = covar.clone()
            covar[..., :, :q] = covar[..., :, :q] - R
            covar[..., :q, q:] = covar[..., :, :q][..., q:, :].mT
        return batched_gaussian_conditioning(mean, covar, q, y_c, noise_c)

    def condition_on_observations(self, X, Y, noise=None, **kwargs):
        y = Y.squeeze(-1)
        noise_q = self.noise_level().expand(X.shape[:-1]) if noise is None else noise.squeeze(-1)
        if self.conditioning is not None:
            X_old, y_old, noise_old = self.conditioning
            batch = torch.broadcast_shapes(
                X_old.shape[:-2], y_old.shape[:-1], X.shape[:-2], y.shape[:-1]
            )
            X = torch.cat(
                [X_old.expand(*batch, *X_old.shape[-2:]), X.expand(*batch, *X.shape[-2:])], -2
            )
            y = torch.cat([y_old.expand(*batch, -1), y.expand(*batch, -1)], -1)
            noise_q = torch.cat([noise_old.expand(*batch, -1), noise_q.expand(*batch, -1)], -1)
        return JointGaussianOracle(self.model, self.residual, (X, y, noise_q))
