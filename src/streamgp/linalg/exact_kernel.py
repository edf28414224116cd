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

Any gpytorch kernel is evaluated. (Scaled) RBF kernels, the default, and Matern-0.5,
1.5 and 2.5 kernels (the Matern-5/2 of BoTorch's TuRBO and SCBO tutorials) take a closed
form: gpytorch's formulas on squared distances formed as ``|a|^2 + |b|^2 - 2 a^T b``
(centred, as gpytorch's ``sq_dist``), one matrix product, without gpytorch's lazy kernel
call (its ``torch.equal(x1, x2)`` test is a host read that would synchronise a GPU on
every call; a Gram matrix is known to be one without it). Every other kernel (periodic,
sums and products, ``active_dims``, ...) is evaluated by its own gpytorch call, so its
blocks are gpytorch's; on a GPU such a call may read the host once (that
``torch.equal``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from gpytorch.kernels.rbf_kernel import postprocess_rbf
from linear_operator import to_dense
from torch import Tensor

from streamgp.interpolation.exact import InputRows

#: Matern smoothness values with a closed form (gpytorch's ``MaternKernel``'s).
MATERN_NUS = (0.5, 1.5, 2.5)


def _squared_distances(a: Tensor, b: Tensor) -> Tensor:
    r"""``|a_i - b_j|^2`` as ``|a|^2 + |b|^2 - 2 a^T b``: one matrix product, centred (the
    cancellation is of ``|a - b|``, not ``|a|``), as gpytorch's ``sq_dist``."""
    shift = a.mean(-2, keepdim=True)
    a, b = a - shift, b - shift
    squared = a.square().sum(-1).unsqueeze(-1) + b.square().sum(-1).unsqueeze(-2) - 2.0 * (a @ b.mT)
    return squared.clamp_min(0.0)


def _scaled_kernel(
    a: Tensor, b: Tensor, outputscale: Tensor | None, nu: float | None, same: bool = False
) -> Tensor:
    r"""``s k(a_i, b_j)`` of lengthscale-divided inputs: RBF (``nu`` None) or Matern-``nu``.

    ``same``: ``b`` is ``a`` (a Gram matrix), whose diagonal distances are then exactly
    zero, as gpytorch makes them when it finds ``x1`` equal to ``x2`` (here known without
    its host-reading test).
    """
    squared = _squared_distances(a, b)
    if nu is None:
        K = postprocess_rbf(squared)
    else:
        if same:  # (in place: clamp_min's backward reads its input, not this output)
            squared.diagonal(dim1=-2, dim2=-1).zero_()
        distance = squared.clamp_min(1e-30).sqrt()  # gpytorch's dist (a zero gradient at 0)
        K = torch.exp(-math.sqrt(2.0 * nu) * distance)
        if nu == 1.5:
            K = K * (1.0 + math.sqrt(3.0) * distance)
        elif nu == 2.5:
            K = K * (1.0 + math.sqrt(5.0) * distance + (5.0 / 3.0) * squared)
    if outputscale is None:
        return K
    return K * (outputscale[..., None, None] if outputscale.dim() else outputscale)


def _closed_form(covar_module: Kernel) -> tuple[Kernel, float | None] | None:
    r"""``(base kernel, nu)`` of an RBF (``nu`` None) or Matern-0.5/1.5/2.5 kernel,
    optionally inside a ``ScaleKernel``, on all inputs; None for any other kernel
    (evaluated by its own gpytorch call)."""
    base = covar_module.base_kernel if isinstance(covar_module, ScaleKernel) else covar_module
    if covar_module.active_dims is not None or base.active_dims is not None:
        return None
    if type(base) is RBFKernel:
        return base, None
    if type(base) is MaternKernel and base.nu in MATERN_NUS:
        return base, float(base.nu)
    return None


def _constant_copy(
    module: Kernel,
    fn: Callable[[Tensor], Tensor] | None = None,
    device: torch.device | None = None,
) -> Kernel:
    r"""A copy of ``module`` with its parameters constant (and ``fn`` applied to its
    floating-point tensors, its integer ones moved to ``device``): a root made without
    gradients stays at the hyperparameters it was made at."""
    frozen = copy.deepcopy(module)
    if fn is not None:
        # Integer buffers (``active_dims``) follow the device only: ``fn`` may be a
        # dtype cast (a lazy covariance's ``to``).
        frozen._apply(lambda t: fn(t) if t.is_floating_point() else t.to(device))
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    return frozen


@dataclass(frozen=True)
class ExactKernelFeatures:
    r"""A set of rows of a kernel evaluated exactly.

    The interface of :class:`~streamgp.linalg.grid_kernel.KernelFeatures` (blocks,
    diagonal, batch reshapes) with the kernel evaluated exactly.

    Attributes:
        scaled: ``batch x N x d`` inputs, divided by the lengthscales for a closed-form
            kernel (RBF, Matern; ``module`` None), as they are for any other kernel.
        outputscale: The closed-form kernel's output scale (None for an unscaled kernel,
            or for a ``module``).
        module: Any other gpytorch kernel, whose own call gives the blocks (None: the
            closed form).
        nu: The Matern smoothness of the closed form (None: RBF).
    """

    scaled: Tensor
    outputscale: Tensor | None
    module: Kernel | None = None
    nu: float | None = None

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
        return _scaled_kernel(self.scaled, other.scaled, self.outputscale, self.nu)

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
        if self.module is not None:
            return self.cross(self)
        return _scaled_kernel(self.scaled, self.scaled, self.outputscale, self.nu, same=True)

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
        scaled = fn(self.scaled)
        scale = None if self.outputscale is None else fn(self.outputscale)
        module = None if self.module is None else _constant_copy(self.module, fn, scaled.device)
        return ExactKernelFeatures(scaled, scale, module, self.nu)

    def _with(self, scaled: Tensor) -> ExactKernelFeatures:
        return ExactKernelFeatures(scaled, self.outputscale, self.module, self.nu)


@dataclass(frozen=True)
class ExactKernelRoot:
    r"""A kernel evaluated exactly at fixed hyperparameters, as data space uses a root.

    Made by :meth:`of` from the model's kernel: differentiable in its hyperparameters
    when made with gradients on (the marginal likelihood), constant otherwise (a cached
    posterior), exactly as a :class:`~streamgp.linalg.grid_kernel.GridKernelRoot`.

    Attributes:
        lengthscale: ``1 x d`` lengthscales of a closed-form kernel (RBF, Matern-0.5,
            1.5 or 2.5; ``batch x 1 x d`` for a batched kernel); None for a ``module``.
        outputscale: Its output scale, or None (unscaled, or a ``module``).
        num_grid: The points of the grid the model reports (a data-space posterior
            reads it; nothing is interpolated).
        module: Any other kernel, evaluated by its own gpytorch call (None: closed form).
        nu: The closed form's Matern smoothness (None: RBF).

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
    nu: float | None = None

    @staticmethod
    def of(covar_module: Kernel, num_grid: int) -> ExactKernelRoot:
        r"""The root of ``covar_module`` (any gpytorch kernel; RBF and Matern-0.5, 1.5
        and 2.5, scaled or not, on all input dimensions take the closed form)."""
        closed_form = _closed_form(covar_module)
        if closed_form is None:
            module = covar_module if torch.is_grad_enabled() else _constant_copy(covar_module)
            return ExactKernelRoot(None, None, num_grid, module)
        base, nu = closed_form
        scale = covar_module.outputscale if isinstance(covar_module, ScaleKernel) else None
        return ExactKernelRoot(base.lengthscale, scale, num_grid, nu=nu)

    @property
    def batch_shape(self) -> torch.Size:
        if self.module is not None:
            return self.module.batch_shape
        return self.lengthscale.shape[:-2]

    def features(self, rows: InputRows) -> ExactKernelFeatures:
        r"""The features of ``rows`` (for a closed form, their inputs over the
        lengthscales)."""
        if self.module is not None:
            return ExactKernelFeatures(rows.inputs, None, self.module)
        return ExactKernelFeatures(rows.inputs / self.lengthscale, self.outputscale, nu=self.nu)
