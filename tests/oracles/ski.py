r"""Dense float64 oracles shared by the tests.

``DenseSKIModel`` is a deliberately naive BoTorch model: it stores every
observation and evaluates the SKI posterior ``K_XX ~ W K_UU W^T`` with dense
solves, with ``K_UU`` evaluated by the kernel on all grid points (no jitter,
no Kronecker structure, no Woodbury identity). For a model that evaluates its kernel
exactly (``WiskiGP`` from 4-D on with the default grid) it uses the kernel itself,
through gpytorch's kernel call: a dense exact GP. Conditioning appends data, with
batch dimensions, so it is also the oracle for BoTorch fantasies.

With ``exact_prior_variance=True`` it is the oracle of the models' default predictions
(:mod:`streamgp.linalg.prior_variance`): the same dense SKI posterior plus
``diag(max(k(x, x) - w(x)^T K_UU w(x), 0))`` at the test points, with ``k(x, x)`` from
the kernel at each point; the data fit (mean, conditioning) is SKI's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from oracles.base import DenseOracle, prior_variance_gap
from streamgp.linalg import grid_kernel_matrix


class DenseSKIModel(DenseOracle):
    """Dense SKI posterior over data ``(W, y, noise)``, in the model's transformed space.

    Args:
        wiski: A ``WiskiGP`` whose grid, kernel and noise are used (no transforms).
        X: ``batch x n x d`` inputs; y: ``batch x n`` targets; noise: ``batch x n``
            variances, or None for the WiskiGP's (learned, differentiable) noise level.
        mean: Optional constant prior mean ``c`` (float or 0-d tensor); default zero.
            The posterior is then ``c`` plus the zero-mean one of ``y - c``.
        exact_prior_variance: Add the exact prior variance's diagonal to the latent
            covariance (default False: the exact SKI posterior).
        kernel: The kernel ``k`` whose ``K_UU`` and ``k(x, x)`` are used (default:
            ``wiski.covar_module``; a ``KissGP``'s base kernel).
    """

    def __init__(
        self,
        wiski,
        X: Tensor,
        y: Tensor,
        noise: Tensor,
        mean: Tensor | float | None = None,
        exact_prior_variance: bool = False,
        kernel=None,
    ) -> None:
        super().__init__()
        self.wiski = wiski
        self.X, self.y, self.noise = X, y, noise
        self.mean = 0.0 if mean is None else mean
        self.exact_prior_variance = exact_prior_variance
        self.kernel = wiski.covar_module if kernel is None else kernel

    @property
    def likelihood(self):
        return self.wiski.likelihood

    @property
    def batch_shape(self) -> torch.Size:
        return self.y.shape[:-1]

    def _K(self) -> Tensor:
        interpolation = self.wiski.interpolation
        if hasattr(interpolation, "grid"):
            return grid_kernel_matrix(self.kernel, interpolation.grid)
        return self.kernel(interpolation.points).to_dense()  # SoftKI's points

    def _noise(self) -> Tensor:
        if self.noise is None:
            return self.wiski.noise_variance.expand(self.y.shape)
        return self.noise

    def _W(self, X: Tensor) -> Tensor:
        return self.wiski.interpolation.weights(X).to_dense()

    def _block(self, A: Tensor, B: Tensor) -> Tensor:
        r"""The model's kernel between ``A`` and ``B``: ``W_A K_UU W_B^T``, or the kernel
        itself for a model that evaluates it exactly (``evaluates_kernel_exactly``)."""
        if getattr(self.wiski, "evaluates_kernel_exactly", False):
            return self.kernel(A, B).to_dense()
        return self._W(A) @ self._K() @ self._W(B).mT

    def latent(self, Xs: Tensor) -> tuple[Tensor, Tensor]:
        Kxx = self._block(self.X, self.X) + torch.diag_embed(self._noise())
        Ksx = self._block(Xs, self.X)
        L = torch.linalg.cholesky(Kxx)
        a = torch.cholesky_solve((self.y - self.mean).unsqueeze(-1), L)
        mean = self.mean + (Ksx @ a).squeeze(-1)
        B = torch.linalg.solve_triangular(L, Ksx.mT, upper=False)
        prior = self._block(Xs, Xs)
        covar = prior - B.mT @ B
        if self.exact_prior_variance:
            covar = covar + prior_variance_gap(self.kernel, Xs, prior)
        return mean, covar

    def log_marginal_likelihood(self) -> Tensor:
        Kxx = self._block(self.X, self.X) + torch.diag_embed(self._noise())
        L = torch.linalg.cholesky(Kxx)
        r = (self.y - self.mean).unsqueeze(-1)
        z = torch.linalg.solve_triangular(L, r, upper=False).squeeze(-1)
        n = self.y.shape[-1]
        logdet = 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return -0.5 * ((z * z).sum(-1) + logdet + n * math.log(2 * math.pi))

    def noise_level(self) -> Tensor:
        return self.wiski.noise_variance

    def condition_on_observations(self, X, Y, noise=None, **kwargs):
        y_new = Y.squeeze(-1)
        if noise is None:  # BoTorch's rule (Model.fantasize): the mean of this model's rows'
            mean = self._noise().detach().mean(-1, keepdim=True)
            batch = torch.broadcast_shapes(mean.shape[:-1], X.shape[:-2])
            noise_new = mean.expand(*batch, X.shape[-2])
        else:
            noise_new = noise.squeeze(-1)
        old_noise = self._noise().detach()
        batch = torch.broadcast_shapes(self.y.shape[:-1], y_new.shape[:-1])
        Xb = torch.broadcast_shapes(self.X.shape[:-2], X.shape[:-2], batch)
        X_all = torch.cat(
            [self.X.expand(*Xb, *self.X.shape[-2:]), X.expand(*Xb, *X.shape[-2:])], dim=-2
        )
        y_all = torch.cat(
            [self.y.expand(*batch, self.y.shape[-1]), y_new.expand(*batch, y_new.shape[-1])], -1
        )
        nb = torch.broadcast_shapes(old_noise.shape[:-1], noise_new.shape[:-1], batch)
        noise_all = torch.cat(
            [
                old_noise.expand(*nb, old_noise.shape[-1]),
                noise_new.expand(*nb, noise_new.shape[-1]),
            ],
            -1,
        )
        return DenseSKIModel(
            self.wiski,
            X_all,
            y_all,
            noise_all,
            mean=self.mean,
            exact_prior_variance=self.exact_prior_variance,
            kernel=self.kernel,
        )


def copy_hyperparameters(source, target) -> None:
    """Copy kernel, mean and likelihood hyperparameters (not data) between WiskiGPs."""
    target.covar_module.load_state_dict(source.covar_module.state_dict())
    target.mean_module.load_state_dict(source.mean_module.state_dict())
    if not target.fixed_noise:
        target.likelihood.load_state_dict(source.likelihood.state_dict())
