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

Any gpytorch kernel is evaluated. (Scaled) RBF kernels, the default, take a fast path:
gpytorch's RBF on squared distances formed as ``|a|^2 + |b|^2 - 2 a^T b`` (centred, as
gpytorch's ``sq_dist``), one matrix product, without gpytorch's lazy kernel call (its
``torch.equal(x1, x2)`` test is a host read that would synchronise a GPU on every call).
Every other kernel (Matern, as BoTorch's TuRBO and SCBO tutorials pass, periodic, sums
and products, ``active_dims``, ...) is evaluated by its own gpytorch call, so its blocks
are gpytorch's; on a GPU such a call may read the host once (that ``torch.equal``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.kernels.rbf_kernel import postprocess_rbf
from linear_operator import to_dense
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


def _constant_copy(module: Kernel, fn: Callable[[Tensor], Tensor] | None = None) -> Kernel:
    r"""A copy of ``module`` with its parameters constant (and ``fn`` applied to its
    tensors): a root made without gradients stays at the hyperparameters it was made at."""
    frozen = copy.deepcopy(module)
    if fn is not None:
        # Integer buffers (``active_dims``) follow the device only: ``fn`` may be a
        # dtype cast (a lazy covariance's ``to``).
        frozen._apply(lambda t: fn(t) if t.is_floating_point() else t.to(fn(t.double()).device))
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    return frozen


@dataclass(frozen=True)
class ExactKernelFeatures:
    r"""A set of rows of a kernel evaluated exactly.

    The interface of :class:`~streamgp.linalg.grid_kernel.KernelFeatures` (blocks,
    diagonal, batch reshapes) with the kernel evaluated exactly.

    Attributes:
        scaled: ``batch x N x d`` inputs, divided by the lengthscales for the RBF fast
            path (``module`` None), as they are for any other kernel.
        outputscale: The RBF kernel's output scale (None for an unscaled kernel, or for
            a ``module``).
        module: Any other gpytorch kernel, whose own call gives the blocks (None: the
            RBF fast path).
    """

    scaled: Tensor
    outputscale: Tensor | None
    module: Kernel | None = None

    @property
    def num_rows(self) -> int:
        return self.scaled.shape[-2]

    @property
    def shape(self) -> torch.Size:
        r"""``batch x N x d``."""
        return self.scaled.shape

    def cross(self, other: ExactKernelFeatures) -> Tensor:
        r"""The kernel between these rows and ``other``'s: ``batch x N x N'``."""
        if self.module is not None:
            a, b = self.scaled, other.scaled
            batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
            return to_dense(self.module(a, b)).expand(*batch, a.shape[-2], b.shape[-2])
        return _scaled_rbf(self.scaled, other.scaled, self.outputscale)

    def diag(self) -> Tensor:
        r"""``k(x_i, x_i)`` of every row: ``batch x N``."""
        if self.module is not None:
            return to_dense(self.module(self.scaled, diag=True)).expand(self.scaled.shape[:-1])
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
        return self._with(torch.cat([a, b], dim=-2))

    def expand(self, *shape: int) -> ExactKernelFeatures:
        r"""Broadcast to ``batch x N x d`` = ``shape``."""
        return self._with(self.scaled.expand(*shape))

    def unsqueeze(self, dim: int) -> ExactKernelFeatures:
        r"""A size-one dimension at ``dim`` of ``batch x N x d``."""
        return self._with(self.scaled.unsqueeze(dim))

    def permute(self, *dims: int) -> ExactKernelFeatures:
        r"""Permute ``batch x N x d`` by ``dims``."""
        return self._with(self.scaled.permute(*dims))

    def apply(self, fn) -> ExactKernelFeatures:
        r"""Apply a tensor function (``to``, ``detach``, ...) to the tensors (a
        ``module``'s parameters too, in a constant copy)."""
        scale = None if self.outputscale is None else fn(self.outputscale)
        module = None if self.module is None else _constant_copy(self.module, fn)
        return ExactKernelFeatures(fn(self.scaled), scale, module)

    def _with(self, scaled: Tensor) -> ExactKernelFeatures:
        return ExactKernelFeatures(scaled, self.outputscale, self.module)


@dataclass(frozen=True)
class ExactKernelRoot:
    r"""A kernel evaluated exactly at fixed hyperparameters, as data space uses a root.

    Made by :meth:`of` from the model's kernel: differentiable in its hyperparameters
    when made with gradients on (the marginal likelihood), constant otherwise (a cached
    posterior), exactly as a :class:`~streamgp.linalg.grid_kernel.GridKernelRoot`.

    Attributes:
        lengthscale: ``1 x d`` lengthscales of an RBF kernel (``batch x 1 x d`` for a
            batched kernel); None for a ``module``.
        outputscale: The RBF kernel's output scale, or None (unscaled, or a ``module``).
        num_grid: The points of the grid the model reports (a data-space posterior
            reads it; nothing is interpolated).
        module: Any other kernel, evaluated by its own gpytorch call (None: RBF).

    Example:
        >>> from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
        >>> X = torch.rand(6, 4, dtype=torch.float64)
        >>> for kernel in (RBFKernel(ard_num_dims=4), MaternKernel(nu=2.5)):
        ...     kernel = ScaleKernel(kernel).double()
        ...     features = ExactKernelRoot.of(kernel, num_grid=0).features(InputRows(X, 0))
        ...     print(bool(torch.allclose(features.gram(), kernel(X).to_dense())))
        True
        True
    """

    lengthscale: Tensor | None
    outputscale: Tensor | None
    num_grid: int
    module: Kernel | None = None

    @staticmethod
    def of(covar_module: Kernel, num_grid: int) -> ExactKernelRoot:
        r"""The root of ``covar_module`` (any gpytorch kernel; RBF and ``ScaleKernel(RBF)``
        on all input dimensions take the fast path)."""
        if not is_separable(covar_module):  # (a kernel on a subset of inputs is not)
            module = covar_module if torch.is_grad_enabled() else _constant_copy(covar_module)
            return ExactKernelRoot(None, None, num_grid, module)
        scaled = isinstance(covar_module, ScaleKernel)
        base = covar_module.base_kernel if scaled else covar_module
        return ExactKernelRoot(
            base.lengthscale, covar_module.outputscale if scaled else None, num_grid
        )

    @property
    def batch_shape(self) -> torch.Size:
        if self.module is not None:
            return self.module.batch_shape
        return self.lengthscale.shape[:-2]

    def features(self, rows: InputRows) -> ExactKernelFeatures:
        r"""The features of ``rows`` (for RBF, their inputs over the lengthscales)."""
        if self.module is not None:
            return ExactKernelFeatures(rows.inputs, None, self.module)
        return ExactKernelFeatures(rows.inputs / self.lengthscale, self.outputscale)
