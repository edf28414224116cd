r"""The kernel matrix ``K_UU`` on a regular grid, and a root of it.

``K_UU`` is obtained by evaluating the model's own ``covar_module`` on grid points,
never through gpytorch's ``GridInterpolationKernel`` (which, in gpytorch 1.15.2,
applies ARD lengthscales in reversed dimension order).

Separable kernels (RBF, optionally scaled) factor over dimensions, so
``K_UU = s^{1-d} kron(K_1, ..., K_d)`` where ``K_i`` is the kernel evaluated on the
points of axis ``i`` (all other coordinates held fixed) and ``s = k(x, x)``. The root
is then the Kronecker product of ``d`` small Cholesky factors, which is both cheaper
(``O(sum g_i^3)`` instead of ``O(m^3)``) and better conditioned than a dense one.
Other kernels (Matern, ...) are evaluated densely.

Grid kernel matrices are numerically singular (their spectrum decays
super-exponentially), so a small diagonal jitter, relative to ``k(x, x)``, is added
before factorising; it grows by 10x only if a factorisation fails.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from torch import Tensor

#: Relative jitter tried first, per dtype; raised 10x per failure, at most 4 times.
_BASE_JITTER = {torch.float64: 1e-12, torch.float32: 1e-6}
_MAX_JITTER_TRIES = 5


def jittered_cholesky(K: Tensor) -> Tensor:
    r"""Cholesky factor of ``K + eps * mean(diag K) * I`` with the smallest eps that works.

    Differentiable (the jitter is a constant multiple of the diagonal mean).

    Raises:
        torch.linalg.LinAlgError: If ``K`` is not positive semi-definite enough to
            factor with the largest jitter tried.
    """
    scale = K.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True).unsqueeze(-1)
    eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
    eps = _BASE_JITTER.get(K.dtype, 1e-6)
    for _ in range(_MAX_JITTER_TRIES):
        L, info = torch.linalg.cholesky_ex(K + (eps * scale) * eye)
        if not torch.any(info):
            return L
        eps *= 10.0
    raise torch.linalg.LinAlgError(
        f"Grid kernel matrix is not positive definite even with relative jitter {eps / 10:.1e}; "
        "check the kernel hyperparameters for NaN/Inf."
    )


def _is_separable(kernel: Kernel) -> bool:
    """True for kernels that factor over input dimensions (RBF, scaled RBF)."""
    if kernel.active_dims is not None and not torch.equal(
        kernel.active_dims.cpu(), torch.arange(len(kernel.active_dims))
    ):
        return False
    if isinstance(kernel, ScaleKernel):
        return _is_separable(kernel.base_kernel)
    return type(kernel) is RBFKernel


def _axis_points(grid: list[Tensor], axis: int) -> Tensor:
    """Points that vary along ``axis`` only; the others sit at their first grid value."""
    anchor = torch.stack([g[0] for g in grid])
    pts = anchor.expand(len(grid[axis]), len(grid)).clone()
    pts[:, axis] = grid[axis]
    return pts


def is_separable(covar_module: Kernel) -> bool:
    r"""True when ``K_UU`` of ``covar_module`` is a Kronecker product (RBF, scaled RBF)."""
    return _is_separable(covar_module)


def grid_kernel_factors(covar_module: Kernel, grid: list[Tensor]) -> tuple[list[Tensor], Tensor]:
    r"""1-D Cholesky factors ``L_i`` and ``c`` with ``c kron(L_1, ..., L_d) ~ root of K_UU``.

    Only for separable kernels (:func:`is_separable`); costs ``O(sum_i g_i^3)``.

    Raises:
        ValueError: If the kernel is not separable.
    """
    if not _is_separable(covar_module):
        raise ValueError(
            f"covar_module {type(covar_module).__name__} does not factor over dimensions; "
            "Kronecker roots need an (optionally scaled) RBF kernel."
        )
    factors = [covar_module(_axis_points(grid, i)).to_dense() for i in range(len(grid))]
    diag = factors[0][0, 0]
    roots = [jittered_cholesky(K_i) for K_i in factors]
    return roots, diag.rsqrt() ** (len(grid) - 1)


def grid_kernel_root(covar_module: Kernel, grid: list[Tensor]) -> Tensor:
    r"""Dense ``m x m`` lower-triangular-per-factor root ``L`` with ``L L^T ~ K_UU``.

    Args:
        covar_module: A (non-batched) gpytorch kernel on ``d``-dimensional inputs.
        grid: The ``d`` one-dimensional grids (first dimension slowest).

    Returns:
        ``L`` such that ``L L^T = K_UU + jitter``; differentiable in the kernel's
        hyperparameters.
    """
    if _is_separable(covar_module):
        factors, scale = grid_kernel_factors(covar_module, grid)
        root = factors[0]
        for L_i in factors[1:]:
            root = torch.kron(root, L_i)
        return root * scale
    points = torch.cartesian_prod(*grid) if len(grid) > 1 else grid[0].unsqueeze(-1)
    return jittered_cholesky(covar_module(points).to_dense())


def grid_kernel_matrix(covar_module: Kernel, grid: list[Tensor]) -> Tensor:
    r"""Dense ``K_UU`` (no jitter), evaluated with ``covar_module`` on all grid points.

    Intended for oracles and diagnostics; models use :func:`grid_kernel_root`.
    """
    points = torch.cartesian_prod(*grid) if len(grid) > 1 else grid[0].unsqueeze(-1)
    return covar_module(points).to_dense()
