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

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from gpytorch.kernels.rbf_kernel import postprocess_rbf
from linear_operator.utils.errors import NanError
from torch import Tensor

from streamgp.interpolation.grid import InterpolationWeights
from streamgp.settings import active_value_checks, skip_value_checks

#: Relative jitter tried first, per dtype; raised 10x per failure, at most 4 times.
_BASE_JITTER = {torch.float64: 1e-12, torch.float32: 1e-6}
_MAX_JITTER_TRIES = 5


class DegenerateKernelError(torch.linalg.LinAlgError, NanError):
    r"""A kernel matrix with NaN/Inf entries or a zero diagonal (degenerate hyperparameters).

    It is a ``LinAlgError`` like any failed factorisation, and a ``linear_operator``
    ``NanError``, which BoTorch's ``fit_gpytorch_mll`` treats as a failed evaluation: an
    L-BFGS-B line search that tries an overflowing step backs off instead of aborting.
    """


def jittered_cholesky(K: Tensor) -> Tensor:
    r"""Cholesky factor of ``K + eps * mean(diag K) * I`` with the smallest eps that works.

    Differentiable (the jitter is a constant multiple of the diagonal mean).

    Raises:
        torch.linalg.LinAlgError: If ``K`` is not positive semi-definite enough to
            factor with the largest jitter tried.
    """
    return cholesky_with_jitter(K)[0]


def cholesky_with_jitter(K: Tensor, relative_jitter: float | None = None) -> tuple[Tensor, Tensor]:
    r"""Cholesky factor of ``K + jitter * I`` and the (absolute) ``jitter`` that was added.

    ``jitter = eps * mean(diag K)``, with ``eps`` starting at ``relative_jitter``
    (default: a per-dtype value) and raised 10x per failed factorisation. Callers that
    model the jitter explicitly (e.g. as independent noise on inducing variables)
    need its value. Differentiable in ``K``.

    Returns:
        ``(L, jitter)`` with ``L L^T = K + jitter * I``; ``jitter`` has shape
        ``batch x 1 x 1``.

    Raises:
        DegenerateKernelError: If ``K`` has NaN/Inf entries or a zero diagonal.
        torch.linalg.LinAlgError: If ``K`` cannot be factored with the largest jitter.
    """
    scale = K.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True).unsqueeze(-1)
    eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
    eps = _BASE_JITTER.get(K.dtype, 1e-6) if relative_jitter is None else relative_jitter
    if skip_value_checks.on():  # one attempt, its info unread (streamgp.settings)
        jitter = eps * scale
        return torch.linalg.cholesky_ex(K + jitter * eye)[0], jitter
    checks = active_value_checks()
    if checks is not None and checks.defer_factorisations:
        # One attempt; a degenerate K or a failure is read with the caller's checks,
        # which then repeats its work with this function's checked retries.
        jitter = eps * scale
        L, info = torch.linalg.cholesky_ex(K + jitter * eye)
        degenerate = ~torch.isfinite(K).all() | ~(scale > 0).all()
        checks.record_failure(degenerate | (info > 0).any())
        return L, jitter
    if not torch.isfinite(K).all() or not (scale > 0).all():
        # E.g. an outputscale that underflowed to 0 in a line search's trial step.
        raise DegenerateKernelError(
            "Kernel matrix has NaN/Inf entries or a zero diagonal; check the kernel "
            "hyperparameters."
        )
    for _ in range(_MAX_JITTER_TRIES):
        jitter = eps * scale
        L, info = torch.linalg.cholesky_ex(K + jitter * eye)
        if not torch.any(info):
            return L, jitter
        eps = 10.0 * max(eps, _BASE_JITTER.get(K.dtype, 1e-6))
    raise torch.linalg.LinAlgError(
        f"Kernel matrix is not positive definite even with relative jitter {eps / 10:.1e}; "
        "check the kernel hyperparameters for NaN/Inf."
    )


def _is_separable(kernel: Kernel) -> bool:
    """True for kernels that factor over input dimensions (RBF, scaled RBF) on all of them.

    A kernel on a subset of the inputs (``active_dims``, even a leading one) is not: the
    Kronecker factors span every grid axis and would read the other inputs too.
    """
    if kernel.active_dims is not None:
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


@dataclass(frozen=True)
class GridKernelRoot:
    r"""A root ``L`` of ``K_UU`` (``L L^T = K_UU + jitter``), kept in factored form.

    ``L = kron(factors[0], ..., factors[-1])`` with the first factor slowest, as the
    flat grid index. Separable kernels give one small factor per axis; other kernels
    a single dense ``m x m`` factor. Products with ``L`` cost
    ``O(m p sum_i g_i)`` for ``p`` right-hand sides instead of ``O(m^2 p)``.

    An additive kernel's root is block-diagonal instead (one block per group's grid,
    :meth:`block_diagonal`): one dense factor, with its diagonal blocks kept as
    ``blocks`` so that products cost ``O(p sum_g m_g^2)`` instead of ``O(m^2 p)``.

    Attributes:
        factors: The lower-triangular Kronecker factors.
        blocks: For one block-diagonal factor, its lower-triangular diagonal blocks in
            order (``factors[0]`` is their ``block_diag``); None otherwise.
        toeplitz: Whether every factor's ``L_i L_i^T`` is a Toeplitz matrix (its entries
            depend on ``|j - k|`` only) to float64 round-off: a stationary kernel on an
            evenly spaced axis, with diagonal jitter, computed in float64
            (:func:`grid_kernel_root` with ``evenly_spaced=True``). The large-grid
            likelihood then reads ``tr(A K_UU)`` from a few sums of ``A``
            (:mod:`streamgp.linalg.structured`).
    """

    factors: tuple[Tensor, ...]
    blocks: tuple[Tensor, ...] | None = None
    toeplitz: bool = False

    @staticmethod
    def block_diagonal(blocks: list[Tensor] | tuple[Tensor, ...]) -> GridKernelRoot:
        r"""The root ``diag(L_1, ..., L_G)`` of a block-diagonal ``K_UU`` (each ``L_g``
        ``... x m_g x m_g``, batch dimensions shared).

        Example:
            >>> blocks = [torch.eye(2, dtype=torch.float64), 2 * torch.eye(3, dtype=torch.float64)]
            >>> root = GridKernelRoot.block_diagonal(blocks)
            >>> root.num_grid, root.matmul(torch.ones(5, dtype=torch.float64)).tolist()
            (5, [1.0, 1.0, 2.0, 2.0, 2.0])
        """
        blocks = tuple(blocks)
        if all(block.dim() == 2 for block in blocks):
            dense = torch.block_diag(*blocks)
        else:
            batch = torch.broadcast_shapes(*(block.shape[:-2] for block in blocks))
            size = sum(block.shape[-1] for block in blocks)
            dense = blocks[0].new_zeros(*batch, size, size)
            start = 0
            for block in blocks:
                end = start + block.shape[-1]
                dense[..., start:end, start:end] = block
                start = end
        return GridKernelRoot((dense,), blocks=blocks)

    @property
    def _stacked_blocks(self) -> Tensor | tuple[Tensor, ...]:
        # Blocks of one shape (singleton groups of one grid size, the default) as one
        # ... x G x s x s tensor: every product is then one batched GEMM. Stacked at each
        # use (G s^2 values), never cached: a stack made under no_grad would carry no
        # graph into a later differentiable product.
        blocks = self.blocks
        if len({block.shape for block in blocks}) == 1:
            return torch.stack(blocks, -3)
        return blocks

    @property
    def num_grid(self) -> int:
        return math.prod(f.shape[-1] for f in self.factors)

    def _apply(
        self, factors: list[Tensor], rhs: Tensor, workspace: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        # Apply kron(factors) to the columns of rhs one axis at a time, slowest first:
        # with axis i as the middle of a (before, g_i, after) view, each step is one
        # batched product with the factor expanded over `before` (a stride-0 view).
        # Products from the left keep every step a contiguous, copy-free GEMM; the
        # transposed form (`rhs_view.mT @ factor.mT`) that `torch.matmul` chooses for
        # a 2-D @ 3-D product copies the whole m x p block at every axis.
        # With a `workspace` (two buffers shaped like rhs, neither aliasing it; no
        # autograd) the steps alternate between them instead of allocating: a fresh
        # m x m block is fresh pages from the OS, whose faults cost as much as the GEMM.
        sizes = [f.shape[-1] for f in factors]
        batch = _batch_shape(factors, rhs)
        if batch:
            return _apply_batched(factors, rhs, sizes, batch)
        out = rhs
        for i, factor in enumerate(factors):
            before = math.prod(sizes[:i])
            block = out.reshape(before, sizes[i], -1)
            if workspace is None:
                target = None
            else:
                target = workspace[0] if out.data_ptr() != workspace[0].data_ptr() else workspace[1]
                target = target.view(before, sizes[i], -1)
            if before == 1:
                out = torch.mm(factor, block[0], out=None if target is None else target[0])
            else:
                out = torch.bmm(factor.expand(before, *factor.shape), block, out=target)
        return out.reshape(rhs.shape)

    @property
    def batch_shape(self) -> torch.Size:
        r"""The leading dimensions of the factors (a kernel with ``batch_shape``): one root
        per batch member; empty for one root."""
        return torch.broadcast_shapes(*(f.shape[:-2] for f in self.factors))

    def matmul(self, rhs: Tensor) -> Tensor:
        r"""``L @ rhs`` for ``rhs`` of shape ``m`` or ``m x p`` (``batch x m x p`` with
        batched factors or a batch of right-hand sides; the batch dims broadcast)."""
        if self.blocks is not None:
            return _apply_blocks(self._stacked_blocks, rhs)
        return self._apply(list(self.factors), rhs)

    def t_matmul(self, rhs: Tensor) -> Tensor:
        r"""``L^T @ rhs`` for ``rhs`` of shape ``m`` or ``m x p``."""
        if self.blocks is not None:
            return _apply_blocks(_map_blocks(lambda b: b.mT, self._stacked_blocks), rhs)
        return self._apply([f.mT for f in self.factors], rhs)

    def congruence(self, A: Tensor, scale: Tensor | None = None) -> Tensor:
        r"""``scale * L^T A L`` for a symmetric ``m x m`` ``A``, in ``O(m^2 sum_i g_i)``.

        Two passes of :meth:`t_matmul`: ``L^T A``, then ``L^T (L^T A)^T`` (``A`` is
        symmetric). For a constant ``A`` (statistics), gradients with respect to the
        factors and ``scale`` assume the result is used symmetrically (the gradient
        arriving at it is symmetric, as for any function of a symmetric matrix such
        as a log-determinant): the two occurrences of ``L`` then contribute equally,
        so only the second is differentiated, with doubled factors ``2 L_i - L_i``
        (the same values), which halves the backward pass.
        """
        if self.blocks is not None:
            return self._block_congruence(A, scale)
        factors = list(self.factors)
        differentiable = [A, *factors, *([] if scale is None else [scale])]
        workspace = None
        if (
            A.dim() == 2
            and not self.batch_shape  # (batched factors make a batch x m x m result)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in differentiable))
        ):  # a constant result: two m x m buffers, the passes alternating between them
            workspace = (torch.empty_like(A), torch.empty_like(A))
            first = self._apply([f.mT for f in factors], A, workspace)
            second = workspace[1] if first.data_ptr() == workspace[0].data_ptr() else workspace[0]
            first = second.copy_(first.mT)
        elif A.requires_grad:  # e.g. learned interpolation weights: differentiate both sides
            first = self.t_matmul(A).mT.contiguous()
        else:
            with torch.no_grad():
                first = self.t_matmul(A).mT.contiguous()
            if torch.is_grad_enabled() and any(f.requires_grad for f in factors):
                factors = [2 * f - f.detach() for f in factors]
        if scale is not None:  # on the small first factor, not on an m x m product
            factors[0] = (scale if scale.dim() == 0 else scale[..., None, None]) * factors[0]
        return self._apply([f.mT for f in factors], first, workspace)

    def _block_congruence(self, A: Tensor, scale: Tensor | None) -> Tensor:
        # congruence() for a block-diagonal root, with the same halved backward pass.
        blocks = self._stacked_blocks  # stacked once for both passes
        if A.requires_grad:
            first = _apply_blocks(_map_blocks(lambda b: b.mT, blocks), A).mT.contiguous()
        else:
            with torch.no_grad():
                first = _apply_blocks(_map_blocks(lambda b: b.mT, blocks), A).mT.contiguous()
            if torch.is_grad_enabled() and any(b.requires_grad for b in self.blocks):
                blocks = _map_blocks(lambda b: 2 * b - b.detach(), blocks)
        if scale is not None:
            trailing = 3 if isinstance(blocks, Tensor) else 2
            scale = scale if scale.dim() == 0 else scale.reshape(*scale.shape, *[1] * trailing)
            blocks = _map_blocks(lambda b: scale * b, blocks)
        return _apply_blocks(_map_blocks(lambda b: b.mT, blocks), first)

    def kernel_trace(self) -> Tensor:
        r"""``tr(L L^T) = prod_i |L_i|_F^2``, without forming ``L``."""
        return product(torch.stack([f.square().sum() for f in self.factors]), 0)

    def kernel_entries(self, rows: Tensor, cols: Tensor) -> Tensor:
        r"""Entries ``(L L^T)[rows, cols]`` from the small per-axis kernel matrices."""
        out = torch.ones(rows.shape, dtype=self.factors[0].dtype, device=rows.device)
        sizes = [factor.shape[-1] for factor in self.factors]
        for factor, row, col in zip(
            reversed(self.factors),
            axis_indices(rows, sizes),
            axis_indices(cols, sizes),
            strict=True,
        ):
            out = out * (factor @ factor.mT)[row, col]
        return out

    def to_dense(self) -> Tensor:
        r"""Dense ``m x m`` ``L`` (``batch x m x m`` with batched factors)."""
        if self.batch_shape:
            return functools.reduce(_batched_kron, self.factors)
        return functools.reduce(torch.kron, self.factors)

    def features(self, weights: InterpolationWeights) -> KernelFeatures:
        r"""The rows of ``W L`` (``N x m``), kept as Kronecker factors when ``L`` has them.

        With one factor per axis and per-axis weights, row ``i`` of ``W L`` is
        ``kron_j (w_i^(j))^T L_j``: one gather of ``4 x g_j`` values per axis, all axes
        in one batched product, instead of an ``N x m`` matrix. Otherwise it is the sparse
        product ``W L`` itself.
        """
        if len(self.factors) == 1 or getattr(weights, "num_axes", 0) != len(self.factors):
            dense = weights.matmul(self.to_dense())
            return KernelFeatures(dense.unsqueeze(0), (dense.shape[-1],))
        padded, offsets = self._padded_factors
        idx, val = weights.stacked_axes()  # f x batch x N x 4 each
        val = val if val.dtype == padded.dtype else val.to(padded.dtype)
        offsets = offsets.reshape(-1, *([1] * (idx.dim() - 1)))
        rows = padded[idx + offsets]  # f x batch x N x 4 x w: the 4 rows of each L_j
        # A broadcast product and sum, not f N products of 1 x 4 by 4 x w matrices: those
        # tiny batched GEMMs (and their backward) took 2-7x longer on a CPU.
        stack = (val.unsqueeze(-1) * rows).sum(-2)
        return KernelFeatures(stack, tuple(f.shape[-1] for f in self.factors))

    @functools.cached_property
    def _padded_factors(self) -> tuple[Tensor, Tensor]:
        # The factors' rows, stacked and zero-padded to the widest (zeros change no inner
        # product), as one (sum_j g_j) x w table, and each axis's first row in it.
        width = max(f.shape[-1] for f in self.factors)
        table = torch.cat(
            [torch.nn.functional.pad(f, (0, width - f.shape[-1])) for f in self.factors]
        )
        starts = [0]
        for f in self.factors[:-1]:
            starts.append(starts[-1] + f.shape[-2])
        # Each entry filled on the device (a kernel argument): a tensor made from the
        # list, or an item assigned, is a host-to-device copy (a GPU synchronisation).
        starts = [table.new_full((1,), start, dtype=torch.long) for start in starts]
        return table, torch.cat(starts)


def _batch_shape(factors: list[Tensor], rhs: Tensor) -> torch.Size:
    # The batch of a product with batched factors or a batched m x p rhs (a 1-D rhs has none).
    rhs_batch = rhs.shape[:-2] if rhs.dim() > 2 else torch.Size()
    return torch.broadcast_shapes(rhs_batch, *(f.shape[:-2] for f in factors))


def _apply_batched(
    factors: list[Tensor], rhs: Tensor, sizes: list[int], batch: torch.Size
) -> Tensor:
    # GridKernelRoot._apply over batch dims: the same per-axis steps, each a broadcast
    # matmul of the batch x g_i x g_i factor with a batch x before x g_i x rest block.
    vector = rhs.dim() == 1
    out = rhs.unsqueeze(-1) if vector else rhs
    out = out.expand(*batch, *out.shape[-2:])
    width = out.shape[-1]
    for i, factor in enumerate(factors):
        before = math.prod(sizes[:i])
        block = out.reshape(*batch, before, sizes[i], -1)
        out = factor.unsqueeze(-3) @ block
    out = out.reshape(*batch, -1, width)
    return out.squeeze(-1) if vector else out


def _map_blocks(fn, blocks: Tensor | tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
    # A block-wise map on stacked blocks (one tensor) or a tuple of blocks.
    return fn(blocks) if isinstance(blocks, Tensor) else tuple(fn(b) for b in blocks)


def _apply_blocks(blocks: Tensor | tuple[Tensor, ...], rhs: Tensor) -> Tensor:
    r"""``diag(B_1, ..., B_G) @ rhs`` for ``rhs`` of shape ``m``, ``m x p`` or
    ``batch x m x p``: one batched GEMM for stacked blocks, else one GEMM per block."""
    vector = rhs.dim() == 1
    out = rhs.unsqueeze(-1) if vector else rhs
    if isinstance(blocks, Tensor):  # ... x G x s x s
        groups, size = blocks.shape[-3], blocks.shape[-1]
        out = blocks @ out.reshape(*out.shape[:-2], groups, size, out.shape[-1])
        out = out.reshape(*out.shape[:-3], groups * size, out.shape[-1])
    else:
        pieces, start = [], 0
        for block in blocks:
            end = start + block.shape[-1]
            pieces.append(block @ out[..., start:end, :])
            start = end
        batch = torch.broadcast_shapes(*(piece.shape[:-2] for piece in pieces))
        out = torch.cat([piece.expand(*batch, *piece.shape[-2:]) for piece in pieces], -2)
    return out.squeeze(-1) if vector else out


def _batched_kron(a: Tensor, b: Tensor) -> Tensor:
    r"""``torch.kron`` of the last two dimensions, batch dims broadcast."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = a[..., :, None, :, None] * b[..., None, :, None, :]
    return out.reshape(*batch, a.shape[-2] * b.shape[-2], a.shape[-1] * b.shape[-1])


def product(tensor: Tensor, dim: int) -> Tensor:
    r"""``tensor.prod(dim)``, as a chain of multiplications where it needs a gradient.

    The same values, but a gradient without a host read: ``prod``'s backward counts the
    zeros on the host (``.item()``), a synchronisation on a GPU that also makes the
    gradient impossible to capture in a CUDA graph. The dimension is short here (the
    Kronecker factors or the input dimensions). Without a gradient, one ``prod``.

    Example:
        >>> x = torch.tensor([[1.0, 2.0, 3.0], [0.0, 4.0, 5.0]])
        >>> product(x, -1)
        tensor([6., 0.])
    """
    if not (tensor.requires_grad and torch.is_grad_enabled()):
        return tensor.prod(dim)
    return functools.reduce(torch.mul, tensor.unbind(dim))


#: Rows from which :meth:`KernelFeatures.gram` takes :class:`_FeatureGram`'s per-factor
#: backward (a likelihood's ``n x n`` kernel). Below, autograd's batched chain: a few
#: operations for all factors, where the per-factor loop's ``O(f)`` small operations
#: (an acquisition's ``q x q`` blocks) would cost more in launches than they save.
_FEATURE_GRAM_MIN_ROWS = 128


class _FeatureGram(torch.autograd.Function):
    r"""``prod_j Phi_j Phi_j^T`` of a ``f x batch x N x w`` stack, with a symmetric backward.

    Autograd's own backward of the chain ``Phi_1 Phi_1^T * Phi_2 Phi_2^T * ...`` takes
    two products per factor (one per side of each Gram matrix) and stacks ``f``
    gradients of ``N x N``. Each factor's Gram matrix ``K_j`` is symmetric, so
    ``dPhi_j = [(G + G^T) * prod_{i != j} K_i] Phi_j``: one product per factor, the
    products of the other factors from suffix and prefix products (no division, so exact
    where a factor is zero). The ``N x N`` blocks are kept per factor, never as one
    ``f x N x N`` tensor: an allocation that large is fresh memory at every call (the
    allocator maps it anew), and touching it cost as much as the arithmetic. The
    likelihood's value and gradient at ``d = 20``, ``n = 512`` took 155-208 ms instead of 420
    (two models; ``benchmarks/high_dim_ops.py``'s ``mll fwd+bwd``).
    """

    @staticmethod
    def forward(ctx, stack: Tensor) -> Tensor:
        grams = [factor @ factor.mT for factor in stack.unbind(0)]
        ctx.save_for_backward(stack, *grams)
        out = grams[0].clone()
        for gram in grams[1:]:
            out.mul_(gram)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        stack, *grams = ctx.saved_tensors
        count = len(grams)
        differentiable = torch.is_grad_enabled()  # a graph of the gradient is being built
        if differentiable:  # the saved Gram matrices are not functions of the stack
            grams = [factor @ factor.mT for factor in stack.unbind(0)]
        # others[j] = (G + G^T) * prod_{i > j} K_i, then times prod_{i < j} K_i.
        others = [grad + grad.mT]
        for gram in reversed(grams[1:]):
            others.append(others[-1] * gram)
        others.reverse()
        if differentiable:  # out-of-place operations
            prefix = grams[0]
            for j in range(1, count):
                others[j] = others[j] * prefix
                prefix = prefix * grams[j]
            return torch.stack([a @ b for a, b in zip(others, stack.unbind(0), strict=True)])
        out = torch.empty_like(stack)
        prefix = None
        for j in range(count):
            if j == 1:
                prefix = grams[0].clone()
            elif j > 1:
                prefix.mul_(grams[j - 1])
            other = others[j] if prefix is None else others[j].mul_(prefix)
            torch.matmul(other, stack[j], out=out[j])
        return out


def _unbatched(stack: Tensor) -> bool:
    return all(size == 1 for size in stack.shape[1:-2])


def _folded_blocks(a: Tensor, b: Tensor) -> Tensor:
    r"""``a @ b.mT`` (``f x batch x N x N'``) for an ``a`` without batch (size-one dims):
    ``b``'s batch is folded into the columns of one product per factor. Broadcasting
    ``a`` instead copies it into every batch member and runs ``f x batch`` small products
    (an acquisition's candidates against the ``n`` observed rows), forward and backward."""
    f, rows, width = a.shape[0], a.shape[-2], a.shape[-1]
    batch, columns = b.shape[1:-2], b.shape[-2]
    # b's rows first, so that the batch splits off as a view (no copy either way round).
    blocks = b.reshape(f, -1, width) @ a.reshape(f, rows, width).mT  # f x (batch N') x N
    return blocks.reshape(f, *batch, columns, rows).mT


@dataclass(frozen=True)
class KernelFeatures:
    r"""Rows ``phi(x) = L^T w(x)`` of ``W L`` in Kronecker-factored form.

    The SKI kernel is ``k_SKI(x, x') = w(x)^T L L^T w(x') = phi(x)^T phi(x')``, and for
    a Kronecker root ``phi(x) = kron_j phi_j(x)``, so
    ``k_SKI(x, x') = prod_j phi_j(x)^T phi_j(x')``: an ``N x N'`` block costs
    ``O(N N' sum_j g_j)`` and never an ``m``-sized product. The factors are stacked, so
    every product is one batched operation whatever the number of axes.

    Attributes:
        stack: ``f x batch x N x w`` tensor: the rows' features for each of the ``f``
            Kronecker factors of ``L`` (one for a dense root), zero-padded to the widest.
        widths: Each factor's own width ``g_j``.
    """

    stack: Tensor
    widths: tuple[int, ...]

    @property
    def factors(self) -> tuple[Tensor, ...]:
        r"""The per-factor ``batch x N x g_j`` features."""
        return tuple(self.stack[j, ..., :w] for j, w in enumerate(self.widths))

    @property
    def num_rows(self) -> int:
        return self.stack.shape[-2]

    @property
    def shape(self) -> torch.Size:
        r"""``batch x N x w``: the shape of one factor's (padded) features."""
        return self.stack.shape[1:]

    def cross(self, other: KernelFeatures) -> Tensor:
        r"""``k_SKI`` between these rows and ``other``'s: ``batch x N x N'``."""
        ndim = max(self.stack.dim(), other.stack.dim())
        a, b = self._aligned(ndim), other._aligned(ndim)
        if _unbatched(a) and not _unbatched(b):
            return product(_folded_blocks(a, b), 0)
        if _unbatched(b) and not _unbatched(a):
            return product(_folded_blocks(b, a).mT, 0)
        return product(a @ b.mT, 0)

    def _aligned(self, ndim: int) -> Tensor:
        # The stack with size-one batch dims added behind the leading factor dim, so that
        # batch dims broadcast as a single factor's would.
        stack = self.stack
        if stack.dim() == ndim:
            return stack
        return stack.reshape(stack.shape[0], *([1] * (ndim - stack.dim())), *stack.shape[1:])

    def diag(self) -> Tensor:
        r"""``k_SKI(x_i, x_i)`` of every row: ``batch x N``."""
        return product(torch.linalg.vector_norm(self.stack, dim=-1).square(), 0)

    # The interface of a positive factor of PosteriorCovariance (a lazy Gram matrix).
    def gram(self) -> Tensor:
        r"""``k_SKI`` among these rows: ``batch x N x N`` (symmetric; see :meth:`cross`)."""
        if (
            self.stack.requires_grad
            and torch.is_grad_enabled()
            and self.num_rows >= _FEATURE_GRAM_MIN_ROWS
        ):
            return _FeatureGram.apply(self.stack)
        return self.cross(self)

    def row_sq_norms(self) -> Tensor:
        return self.diag()

    def cat(self, other: KernelFeatures) -> KernelFeatures:
        r"""These rows followed by ``other``'s (same batch shape)."""
        return KernelFeatures(torch.cat([self.stack, other.stack], dim=-2), self.widths)

    def expand(self, *shape: int) -> KernelFeatures:
        r"""Broadcast to ``batch x N x w`` = ``shape``."""
        stack = self._aligned(len(shape) + 1)
        return KernelFeatures(stack.expand(stack.shape[0], *shape), self.widths)

    def unsqueeze(self, dim: int) -> KernelFeatures:
        r"""A size-one dimension at ``dim`` of ``batch x N x w``."""
        return KernelFeatures(self.stack.unsqueeze(dim if dim < 0 else dim + 1), self.widths)

    def permute(self, *dims: int) -> KernelFeatures:
        r"""Permute ``batch x N x w`` by ``dims`` (the factor dimension stays first)."""
        ndim = self.stack.dim() - 1
        return KernelFeatures(self.stack.permute(0, *((d % ndim) + 1 for d in dims)), self.widths)

    def apply(self, fn) -> KernelFeatures:
        r"""Apply a tensor function (``to``, ``detach``, ...) to the features."""
        return KernelFeatures(fn(self.stack), self.widths)

    def to_dense(self) -> Tensor:
        r"""The rows as one dense ``batch x N x m`` matrix (row-wise Kronecker product)."""
        factors = self.factors
        out = factors[0]
        for a in factors[1:]:
            out = (out.unsqueeze(-1) * a.unsqueeze(-2)).flatten(-2)
        return out


def axis_indices(flat: Tensor, sizes: list[int] | tuple[int, ...]):
    r"""The per-axis grid indices of flat grid indices ``flat`` (first axis slowest), last
    axis first: yields ``flat``'s index along ``sizes[-1]``, then ``sizes[-2]``, ...

    Example:
        >>> [i.tolist() for i in axis_indices(torch.tensor([0, 5, 11]), [3, 4])]
        [[0, 1, 3], [0, 1, 2]]
    """
    for size in reversed(sizes):
        yield flat % size
        flat = flat // size


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
    sizes = {len(axis) for axis in grid}
    if len(sizes) == 1 and len(grid) > 1:
        # Equal axis sizes: one batched kernel evaluation and one batched Cholesky
        # (fewer autograd nodes and Python calls, which dominate at small n).
        points = torch.stack([_axis_points(grid, i) for i in range(len(grid))])
        K = _separable_kernel_matrix(covar_module, points)
        roots = list(jittered_cholesky(K).unbind(0))
        diag = K[0, ..., 0, 0]
    else:
        factors = [
            _separable_kernel_matrix(covar_module, _axis_points(grid, i)) for i in range(len(grid))
        ]
        diag = factors[0][..., 0, 0]
        roots = [jittered_cholesky(K_i) for K_i in factors]
    return roots, diag.rsqrt() ** (len(grid) - 1)


def _separable_kernel_matrix(covar_module: Kernel, points: Tensor) -> Tensor:
    r"""``K(points, points)`` of an (optionally scaled) RBF kernel, batched over axes.

    The RBF formula itself (gpytorch's ``postprocess_rbf`` of squared distances) rather
    than ``Kernel.__call__``/``forward``: it skips the lazy-tensor machinery (about half
    the cost of a small kernel matrix) and gpytorch's ``torch.equal(x1, x2)`` test, a
    host read that would synchronise a GPU on every marginal-likelihood evaluation.
    Separable kernels have no active_dims to apply. A kernel with ``batch_shape`` gives
    ``points.shape[:-2] x batch_shape x g x g``: one matrix per batch member.
    """
    base = covar_module.base_kernel if isinstance(covar_module, ScaleKernel) else covar_module
    lengthscale = base.lengthscale  # batch_shape x 1 x d
    batch = lengthscale.shape[:-2]
    if isinstance(covar_module, ScaleKernel):
        batch = torch.broadcast_shapes(batch, covar_module.outputscale.shape)
    if batch:  # the points' leading dims (axes) go before the kernel's batch dims
        lead = points.shape[:-2]
        points = points.reshape(*lead, *([1] * len(batch)), *points.shape[-2:])
    K = _rbf_matrix(points, lengthscale)
    if isinstance(covar_module, ScaleKernel):
        scale = covar_module.outputscale
        K = K * (scale[..., None, None] if batch else scale.reshape(()))
    return K


def _rbf_matrix(points: Tensor, lengthscale: Tensor) -> Tensor:
    r"""``exp(-|x - x'|^2 / 2)`` of ``points / lengthscale`` (gpytorch's RBF formula)."""
    x = points / lengthscale
    return postprocess_rbf((x.unsqueeze(-2) - x.unsqueeze(-3)).square().sum(-1))


def is_scaled_rbf(kernel: Kernel) -> bool:
    r"""True for an RBF kernel, optionally scaled, with no batch shape (any ``active_dims``)."""
    base = _base_kernel(kernel)
    return type(base) is RBFKernel and not kernel.batch_shape and not base.batch_shape


def stacked_rbf_roots(kernels: Sequence[Kernel], points: Sequence[Tensor]) -> list[Tensor]:
    r"""Jittered Cholesky factors of ``k_i(P_i, P_i)`` for (scaled) RBF kernels, batched.

    ``points[i]`` (``g_i x d_i``) are in kernel ``i``'s own coordinates: its
    ``active_dims`` are not applied. Kernels whose points have one shape share one
    batched kernel evaluation (the RBF formula, without gpytorch's ``torch.equal(x1, x2)``
    host read) and one batched :func:`cholesky_with_jitter`, so the ``G`` groups of an
    additive kernel cost a few launches instead of ``G`` kernel calls and factorisations.
    The jitter is relative to each matrix's own diagonal, as one at a time; a failed
    factorisation raises it for every matrix of its stack. Differentiable in the
    hyperparameters.

    Args:
        kernels: RBF or ``ScaleKernel(RBF)`` kernels (:func:`is_scaled_rbf`).
        points: One ``g_i x d_i`` tensor per kernel.

    Returns:
        The lower Cholesky factors, one ``g_i x g_i`` tensor per kernel, in order.

    Example:
        >>> from gpytorch.kernels import RBFKernel, ScaleKernel
        >>> scaled, plain = ScaleKernel(RBFKernel()).double(), RBFKernel().double()
        >>> axis = torch.linspace(0, 1, 5, dtype=torch.float64).unsqueeze(-1)
        >>> first, second = stacked_rbf_roots([scaled, plain], [axis, axis])
        >>> K = scaled(axis).to_dense()
        >>> bool(torch.allclose(first @ first.mT, K, atol=1e-9))
        True
    """
    roots: list[Tensor] = [points[0]] * len(kernels)  # (each replaced below)
    by_shape: dict[torch.Size, list[int]] = {}
    for i, P in enumerate(points):
        by_shape.setdefault(P.shape, []).append(i)
    for members in by_shape.values():
        P = torch.stack([points[i] for i in members])
        lengthscales = torch.stack([_base_kernel(kernels[i]).lengthscale for i in members])
        K = _rbf_matrix(P, lengthscales)
        if any(isinstance(kernels[i], ScaleKernel) for i in members):
            one = P.new_ones(())
            scales = [
                kernels[i].outputscale if isinstance(kernels[i], ScaleKernel) else one
                for i in members
            ]
            K = K * torch.stack(scales)[:, None, None]
        for i, root in zip(members, jittered_cholesky(K).unbind(0), strict=True):
            roots[i] = root
    return roots


def _base_kernel(kernel: Kernel) -> Kernel:
    return kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel


def grid_kernel_root(
    covar_module: Kernel, grid: list[Tensor], *, evenly_spaced: bool = False
) -> GridKernelRoot:
    r"""Root ``L`` of ``K_UU`` in Kronecker form for separable kernels, dense otherwise.

    Args:
        covar_module: A gpytorch kernel on ``d``-dimensional inputs; with a
            ``batch_shape`` (one set of hyperparameters per batch member, as BoTorch's
            batched models build them) every factor is ``batch_shape x g_i x g_i``.
        grid: The ``d`` one-dimensional grids (first dimension slowest).
        evenly_spaced: Whether every axis of ``grid`` is evenly spaced (as a
            :class:`~streamgp.interpolation.grid.CubicGridInterpolation`'s are); the
            Kronecker factors of the (stationary) separable kernels are then marked
            :attr:`GridKernelRoot.toeplitz` when they are float64 (float32's rounding leaves
            them Toeplitz only to about ``1e-8``, more than the large-grid likelihood's
            float32 trace gap). Not checked here (that would read the grid on the host at
            every call).

    Returns:
        ``L`` such that ``L L^T = K_UU + jitter`` (per batch member, each jittered
        relative to its own diagonal); differentiable in the kernel's hyperparameters.
    """
    if _is_separable(covar_module):
        factors, scale = grid_kernel_factors(covar_module, grid)
        scale = scale if scale.dim() == 0 else scale[..., None, None]  # batched kernel
        toeplitz = evenly_spaced and factors[0].dtype == torch.float64
        return GridKernelRoot((factors[0] * scale, *factors[1:]), toeplitz=toeplitz)
    points = torch.cartesian_prod(*grid) if len(grid) > 1 else grid[0].unsqueeze(-1)
    return GridKernelRoot((jittered_cholesky(covar_module(points).to_dense()),))


def grid_kernel_matrix(covar_module: Kernel, grid: list[Tensor]) -> Tensor:
    r"""Dense ``K_UU`` (no jitter), evaluated with ``covar_module`` on all grid points.

    Intended for oracles and diagnostics; models use :func:`grid_kernel_root`.
    """
    points = torch.cartesian_prod(*grid) if len(grid) > 1 else grid[0].unsqueeze(-1)
    return covar_module(points).to_dense()


def point_kernel_root(covar_module: Kernel, points: Tensor) -> GridKernelRoot:
    r"""Root ``L`` of ``K_ZZ`` at explicit points ``Z`` (not a grid): one dense factor.

    :func:`grid_kernel_root` needs a grid's axes (its Kronecker path evaluates the kernel
    along each axis); models whose interpolation points are free, such as SoftKI's
    learned points, use this instead. The result is a :class:`GridKernelRoot` with a
    single ``m x m`` Cholesky factor, which every grid-space routine
    (:mod:`streamgp.linalg.woodbury`, :mod:`streamgp.linalg.statistics`) accepts as it
    is. The jitter follows :func:`cholesky_with_jitter`, so ``L L^T`` is the same
    ``K_ZZ + jitter`` that :class:`~streamgp.models.SoftKIGP` factorises.

    Args:
        covar_module: A (non-batched) gpytorch kernel on ``d``-dimensional inputs.
        points: ``m x d`` points ``Z``.

    Returns:
        ``L`` with ``L L^T = K_ZZ + jitter``; differentiable in the hyperparameters.

    Example:
        >>> from gpytorch.kernels import RBFKernel
        >>> Z = torch.rand(10, 3, dtype=torch.float64)
        >>> root = point_kernel_root(RBFKernel().to(Z), Z)
        >>> root.num_grid
        10
    """
    return GridKernelRoot((jittered_cholesky(covar_module(points).to_dense()),))
