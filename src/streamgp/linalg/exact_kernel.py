r"""The kernel evaluated exactly, behind the interface of a grid kernel's root.

Data-space SKI (:mod:`streamgp.linalg.data_space`) needs three things of its kernel: the
features of a set of rows (:meth:`ExactKernelRoot.features`), the block between two
sets (:meth:`ExactKernelFeatures.cross`) and the diagonal. A
:class:`~streamgp.linalg.grid_kernel.GridKernelRoot` answers them through the
interpolation, ``k_SKI(x, x') = w(x)^T K_UU w(x')``; :class:`ExactKernelRoot` answers
them with the kernel itself, for the rows of
:class:`~streamgp.interpolation.exact.ExactKernelInputs` (the inputs). The posterior,
its rank-``q`` updates, conditioning (fantasies), the marginal likelihood and
checkpoints are then those of an exact GP, with the same algebra and code.

Only (scaled) RBF kernels are evaluated here (the separable kernels for which a
``WiskiGP`` keeps a Kronecker-factored grid, the only ones that stay in data space for
good): the formula is gpytorch's RBF on squared distances formed as
``|a|^2 + |b|^2 - 2 a^T b`` (centred, as gpytorch's ``sq_dist``), one matrix product,
without gpytorch's lazy kernel call (its ``torch.equal(x1, x2)`` test is a host read that
would synchronise a GPU on every call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.kernels.rbf_kernel import postprocess_rbf
from torch import Tensor

from streamgp.interpolation.exact import InputRows
from streamgp.linalg.grid_kernel import is_separable


def _scaled_rbf(a: Tensor, b: Tensor, outputscale: Tensor | None) -> Tensor:
    r"""``s exp(-|a_i - b_j|^2 / 2)`` of lengthscale-divided inputs ``a`` and ``b``."""
    shift = a.mean(-2, keepdim=True)  # centred: the cancellation is of |a - b|, not |a|
    a, b = a - shift, b - shift
    squared = a.square().sum(-1).unsqueeze(-1) + b.square().sum(-1).unsqueeze(-2) - 2.0 * (a @ b.mT)
    K = postprocess_rbf(squared.clamp_min(0.0))
    if outputscale is None:
        return K
    return K * (outputscale[..., None, None] if outputscale.dim() else outputscale)


@dataclass(frozen=True)
class ExactKernelFeatures:
    r"""A set of rows of an exact (scaled) RBF kernel: their lengthscale-divided inputs.

    The interface of :class:`~streamgp.linalg.grid_kernel.KernelFeatures` (blocks,
    diagonal, batch reshapes) with the kernel evaluated exactly.

    Attributes:
        scaled: ``batch x N x d`` inputs divided by the lengthscales.
        outputscale: The kernel's output scale (None for an unscaled kernel).
    """

    scaled: Tensor
    outputscale: Tensor | None

    @property
    def num_rows(self) -> int:
        return self.scaled.shape[-2]

    @property
    def shape(self) -> torch.Size:
        r"""``batch x N x d``."""
        return self.scaled.shape

    def cross(self, other: ExactKernelFeatures) -> Tensor:
        r"""The kernel between these rows and ``other``'s: ``batch x N x N'``."""
        return _scaled_rbf(self.scaled, other.scaled, self.outputscale)

    def diag(self) -> Tensor:
        r"""``k(x_i, x_i)`` of every row: ``batch x N``."""
        ones = self.scaled.new_ones(self.scaled.shape[:-1])
        if self.outputscale is None:
            return ones
        return ones * (self.outputscale[..., None] if self.outputscale.dim() else self.outputscale)

    def gram(self) -> Tensor:
        r"""The kernel among these rows: ``batch x N x N``."""
        return self.cross(self)

    def row_sq_norms(self) -> Tensor:
        return self.diag()

    def tensors(self) -> tuple[Tensor, ...]:
        r"""The tensors it holds (a lazy covariance's bookkeeping)."""
        return (self.scaled,)

    def cat(self, other: ExactKernelFeatures) -> ExactKernelFeatures:
        r"""These rows followed by ``other``'s (batch dims broadcast)."""
        batch = torch.broadcast_shapes(self.scaled.shape[:-2], other.scaled.shape[:-2])
        a = self.scaled.expand(*batch, *self.scaled.shape[-2:])
        b = other.scaled.expand(*batch, *other.scaled.shape[-2:])
        return ExactKernelFeatures(torch.cat([a, b], dim=-2), self.outputscale)

    def expand(self, *shape: int) -> ExactKernelFeatures:
        r"""Broadcast to ``batch x N x d`` = ``shape``."""
        return ExactKernelFeatures(self.scaled.expand(*shape), self.outputscale)

    def unsqueeze(self, dim: int) -> ExactKernelFeatures:
        r"""A size-one dimension at ``dim`` of ``batch x N x d``."""
        return ExactKernelFeatures(self.scaled.unsqueeze(dim), self.outputscale)

    def permute(self, *dims: int) -> ExactKernelFeatures:
        r"""Permute ``batch x N x d`` by ``dims``."""
        return ExactKernelFeatures(self.scaled.permute(*dims), self.outputscale)

    def apply(self, fn) -> ExactKernelFeatures:
        r"""Apply a tensor function (``to``, ``detach``, ...) to the tensors."""
        scale = None if self.outputscale is None else fn(self.outputscale)
        return ExactKernelFeatures(fn(self.scaled), scale)


@dataclass(frozen=True)
class ExactKernelRoot:
    r"""An exact (scaled) RBF kernel at fixed hyperparameters, as data space uses a root.

    Made by :meth:`of` from the model's kernel: differentiable in its hyperparameters
    when made with gradients on (the marginal likelihood), constant otherwise (a cached
    posterior), exactly as a :class:`~streamgp.linalg.grid_kernel.GridKernelRoot`.

    Attributes:
        lengthscale: ``1 x d`` lengthscales (``batch x 1 x d`` for a batched kernel).
        outputscale: The output scale, or None for an unscaled kernel.
        num_grid: The points of the grid the model reports (a data-space posterior
            reads it; nothing is interpolated).

    Example:
        >>> from gpytorch.kernels import RBFKernel, ScaleKernel
        >>> kernel = ScaleKernel(RBFKernel(ard_num_dims=4)).double()
        >>> X = torch.rand(6, 4, dtype=torch.float64)
        >>> features = ExactKernelRoot.of(kernel, num_grid=0).features(InputRows(X, 0))
        >>> bool(torch.allclose(features.gram(), kernel(X).to_dense()))
        True
    """

    lengthscale: Tensor
    outputscale: Tensor | None
    num_grid: int

    @staticmethod
    def of(covar_module: Kernel, num_grid: int) -> ExactKernelRoot:
        r"""The root of ``covar_module``, an RBF or ``ScaleKernel(RBF)`` kernel.

        Raises:
            ValueError: For any other kernel (naming it).
        """
        if not is_separable(covar_module):  # RBF or ScaleKernel(RBF), on all dimensions
            raise ValueError(
                f"covar_module {type(covar_module).__name__}: an exact kernel in data space "
                "is evaluated for RBF or ScaleKernel(RBF) kernels on all input dimensions."
            )
        scaled = isinstance(covar_module, ScaleKernel)
        base = covar_module.base_kernel if scaled else covar_module
        return ExactKernelRoot(
            base.lengthscale, covar_module.outputscale if scaled else None, num_grid
        )

    @property
    def batch_shape(self) -> torch.Size:
        return self.lengthscale.shape[:-2]

    def features(self, rows: InputRows) -> ExactKernelFeatures:
        r"""The features of ``rows`` (their inputs over the lengthscales)."""
        return ExactKernelFeatures(rows.inputs / self.lengthscale, self.outputscale)
