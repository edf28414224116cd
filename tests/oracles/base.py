r"""What the dense oracles share: BoTorch's posterior from a dense latent posterior."""

from __future__ import annotations

import torch
from botorch.models.model import FantasizeMixin, Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from gpytorch.means import ZeroMean
from torch import Tensor


def without_defaults() -> dict:
    r"""Constructor options of the bare model the dense oracles describe.

    Models take ``SingleTaskGP``'s defaults (``Standardize`` and a learned constant
    mean); the oracles model the targets as given under a zero prior mean.
    """
    return {"outcome_transform": None, "mean_module": ZeroMean()}


def prior_variance_gap(kernel, Xs: Tensor, prior: Tensor) -> Tensor:
    r"""``diag(max(k(x, x) - prior[x, x], 0))`` at ``batch x t x d`` points ``Xs``.

    ``prior`` is the dense SKI prior covariance ``W_* K_UU W_*^T`` at the points: what
    the models' exact prior variance (:mod:`streamgp.linalg.prior_variance`) adds to the
    SKI posterior covariance, with ``k(x, x)`` from the kernel at every point.
    """
    exact = kernel(Xs, diag=True).expand(prior.shape[:-1])
    return torch.diag_embed((exact - prior.diagonal(dim1=-2, dim2=-1)).clamp_min(0.0))


class DenseOracle(Model, FantasizeMixin):
    r"""A BoTorch model from ``latent(X) -> (mean, covariance)`` and a noise level.

    Subclasses implement :meth:`latent`, :meth:`noise_level` (what
    ``observation_noise=True`` adds) and ``condition_on_observations``.
    """

    @property
    def num_outputs(self) -> int:
        return 1

    def latent(self, Xs: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def noise_level(self) -> Tensor:
        raise NotImplementedError

    def posterior(self, X, observation_noise=False, posterior_transform=None, **kwargs):
        mean, covar = self.latent(X)
        covar = covar.expand(*mean.shape, mean.shape[-1])
        if isinstance(observation_noise, Tensor):
            covar = covar + torch.diag_embed(observation_noise.squeeze(-1).expand(mean.shape))
        elif observation_noise:
            covar = covar + self.noise_level() * torch.eye(mean.shape[-1], dtype=mean.dtype)
        post = GPyTorchPosterior(MultivariateNormal(mean, covar))
        return posterior_transform(post) if posterior_transform is not None else post


def hyperparameter_vector(model) -> Tensor:
    """A scaled-kernel model's lengthscales, output scale, noise and constant mean, flat."""
    kernel = model.covar_module
    return torch.cat(
        [
            kernel.base_kernel.lengthscale.reshape(-1),
            kernel.outputscale.reshape(-1),
            model.likelihood.noise.reshape(-1),
            model.mean_module.constant.reshape(-1),
        ]
    ).detach()


def rel_err(a: Tensor, b: Tensor) -> float:
    """Max absolute error relative to the largest entry of the reference ``b``."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def gaussian_conditioning(
    mean: Tensor, covar: Tensor, q: int, y: Tensor, noise: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Condition a joint Gaussian over ``q + t`` points on noisy values of the first ``q``.

    ``mean`` is ``q + t``, ``covar`` ``(q + t) x (q + t)``, ``y`` and ``noise`` ``q``.
    Returns the mean and covariance of the last ``t`` (dense solves, no structure).
    """
    C_qq = covar[:q, :q] + torch.diag(noise)
    C_sq = covar[q:, :q]
    gain = torch.linalg.solve(C_qq, C_sq.mT).mT
    return mean[q:] + gain @ (y - mean[:q]), covar[q:, q:] - gain @ C_sq.mT
