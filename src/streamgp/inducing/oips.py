r"""Online inducing point selection (OIPS).

Galy-Fajou & Opper, "Adaptive Inducing Points Selection for Gaussian Processes"
(Continual Learning Workshop, ICML 2020), Algorithm 1: for every new input ``x`` (in
stream order), compute ``d = max_j k(x, Z_j)`` over the current inducing points ``Z``;
if ``d < rho`` then ``x`` joins ``Z``. The set therefore grows with the data until
every input seen is within kernel value ``rho`` of some inducing point, and no two
inducing points have kernel value ``>= rho`` (a "diverse" set, well conditioned).

The paper states the rule for a unit-variance kernel. For kernels with an output
scale we use the kernel *correlation* ``k(x, z) / sqrt(k(x, x) k(z, z))``, which is
the paper's ``k`` for unit variance and makes ``rho`` independent of the output
scale. The kernel is read at each update, so when a model learns its lengthscales
the acceptance region follows them (as the paper intends).

:func:`oips_expected_size_bound` is the paper's Theorem 1 (bound on the expected
number of selected points for i.i.d. uniform inputs and a squared-exponential kernel).
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from streamgp.inducing.base import InducingPointSelector


def kernel_correlation(kernel: Kernel, X: Tensor, Z: Tensor) -> Tensor:
    r"""``k(x, z) / sqrt(k(x, x) k(z, z))`` for all pairs: an ``n x M`` matrix."""
    cross = kernel(X, Z).to_dense()
    diag_x = kernel(X, diag=True)
    diag_z = kernel(Z, diag=True)
    return cross / (diag_x.unsqueeze(-1) * diag_z.unsqueeze(-2)).sqrt()


class OnlineInducingPointSelector(InducingPointSelector):
    r"""OIPS: accept an input iff its maximum kernel correlation to the set is ``< rho``.

    Deterministic given the stream (no randomness), and independent of how the
    stream is cut into batches: ``update(X)`` gives the same set as
    ``update(X[:k]); update(X[k:])``.

    Args:
        kernel: A gpytorch kernel (stationary, so that ``k(x, x)`` is constant; any
            kernel with positive ``k(x, x)`` works). Typically the model's own
            ``covar_module``, so acceptance follows learned hyperparameters.
        rho: Acceptance threshold in ``(0, 1)``: larger ``rho`` means more points.
        max_size: Optional cap on the number of inducing points; once reached, no
            further points are accepted.

    Example:
        >>> from gpytorch.kernels import RBFKernel, ScaleKernel
        >>> kernel = ScaleKernel(RBFKernel()).to(torch.float64)
        >>> selector = OnlineInducingPointSelector(kernel, rho=0.8)
        >>> Z = selector.update(torch.rand(500, 2, dtype=torch.float64))
        >>> Z_more = selector.update(torch.rand(100, 2, dtype=torch.float64))
        >>> len(Z_more) >= len(Z), Z.shape[-1]  # the set only grows
        (True, 2)
    """

    def __init__(self, kernel: Kernel, rho: float, max_size: int | None = None) -> None:
        super().__init__()
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}.")
        if not isinstance(rho, (int, float)) or not 0.0 < float(rho) < 1.0:
            raise ValueError(f"rho must be a number in (0, 1), got {rho!r}.")
        if max_size is not None and (not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"max_size must be a positive int or None, got {max_size!r}.")
        self.kernel = kernel
        self.rho = float(rho)
        self.max_size = max_size

    def _update(self, X: Tensor) -> Tensor:
        Z = X[:0] if self._points is None else self._points
        n = X.shape[0]
        if n == 0 or (self.max_size is not None and Z.shape[0] >= self.max_size):
            return Z.clone()
        # Max correlation of every batch row to the current set, then a pass in
        # stream order that only adds the correlations to newly accepted points:
        # exactly Algorithm 1, with one vectorised kernel call per accepted point.
        if Z.shape[0] > 0:
            max_corr = kernel_correlation(self.kernel, X, Z).max(dim=-1).values
        else:
            max_corr = torch.full((n,), -math.inf, dtype=X.dtype, device=X.device)
        accepted: list[int] = []
        start = 0
        while start < n:
            below = (max_corr[start:] < self.rho).nonzero()
            if below.numel() == 0:
                break
            idx = start + int(below[0, 0])
            accepted.append(idx)
            if self.max_size is not None and Z.shape[0] + len(accepted) >= self.max_size:
                break
            start = idx + 1
            if start < n:
                corr = kernel_correlation(self.kernel, X[start:], X[idx : idx + 1]).squeeze(-1)
                max_corr[start:] = torch.maximum(max_corr[start:], corr)
        if not accepted:
            return Z.clone()
        index = torch.tensor(accepted, device=X.device)
        return torch.cat([Z, X[index]], dim=0)


def oips_expected_size_bound(
    num_points: int, dim: int, lengthscale: float, rho: float, side: float = 1.0
) -> float:
    r"""Theorem 1 of the OIPS paper: a bound on ``E[M | N]`` for uniform inputs.

    For ``N`` i.i.d. inputs uniform on the cube ``[0, a]^D`` and the squared-exponential
    kernel ``exp(-|x - x'|^2 / l^2)`` (paper's convention; gpytorch's ``RBFKernel``
    with lengthscale ``ell`` has ``l = sqrt(2) ell``),

    ``E[M | N] <= (1 - (1 - alpha)^(N + 1)) / alpha``,
    ``alpha = (l sqrt(-D log rho) / 2)^D``.

    The paper writes the bound for ``a = 1`` (``alpha`` is the probability that an
    input falls in one of the hypercubes of its proof); a cube of side ``a`` is the
    unit cube with lengthscale ``l / a``, which is how ``side`` enters here.

    Args:
        num_points: ``N``, the number of inputs parsed.
        dim: ``D``, the input dimension.
        lengthscale: ``l`` in the paper's kernel convention (see above).
        rho: The acceptance threshold in ``(0, 1)``.
        side: ``a``, the side length of the cube the inputs are drawn from.

    Returns:
        The bound (a float).
    """
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho!r}.")
    if lengthscale <= 0 or side <= 0:
        raise ValueError("lengthscale and side must be positive.")
    alpha = (lengthscale / side * math.sqrt(-dim * math.log(rho)) / 2.0) ** dim
    if alpha >= 1.0:
        return 1.0
    return (1.0 - (1.0 - alpha) ** (num_points + 1)) / alpha
