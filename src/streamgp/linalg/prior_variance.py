r"""Exact prior variances for kernel-interpolation predictions.

SKI replaces the kernel by ``k(x, x') ~ w(x)^T K_UU w(x')``. The interpolated prior
variance ``w(x)^T K_UU w(x)`` falls short of ``k(x, x)`` between grid points once the
lengthscale nears the grid spacing ``h``: on a 30 x 30 grid over the unit square
(``h = 1/27``), RBF kernel, the prior variance read at 2,000 random points where
``k(x, x) = 1`` had a minimum of 0.938 at lengthscale 0.05 (1.35 h), 0.746 at 0.03
(0.81 h) and 0.500 at 0.0185 (0.5 h). Maps of the posterior standard deviation then
show the grid as a lattice, and integrated variances (qNIPV) inherit it.

:class:`PriorVarianceCorrection` gives the diagonal

.. math::

    d(x) = \max\{k(x, x) - w(x)^T K_{UU} w(x),\ 0\},

which the models add to the diagonal of the latent posterior covariance at the test
points (marginal variances and the joint covariance alike, so MC acquisition functions,
samples and qNIPV see one model). Their prior variance is then ``k(x, x)`` exactly:
``K_UU`` here is the model's own ``L L^T`` (its Cholesky jitter included). This is the
predictive covariance of the DTC approximation (Seeger et al. 2003; Quinonero-Candela &
Rasmussen 2005, Sec. 5): the SKI model's posterior plus ``k(x*, x*) - q(x*, x*)`` on the
diagonal. The clamp at zero keeps the covariance positive semi-definite where cubic
interpolation overshoots (``w^T K_UU w > k(x, x)``): there the SKI variance is kept.

Cost: ``O(16 d t)`` for ``t`` points on a Kronecker grid root with axes of one size (one
gather of ``4 x 4`` blocks of the stacked axis kernels ``L_i L_i^T``; ``O(t sum_i 4 g_i)``
for axes of different sizes; no ``m``-sized product), ``O(16 G t)`` on the block-diagonal
root of ``G`` one-dimensional groups of one size (an additive kernel's default: one gather
of ``4 x 4`` blocks of each group's ``K_g``, summed), else one sparse product ``W_* L``
(``O(t k m)``, the order of the posterior's own ``W_* R``), or a gather from a cached
``K_UU`` once many predictions have paid for it (:class:`~streamgp.linalg.woodbury.
GridPosterior`'s amortised cache). Nothing depends on ``n``, no value is read on the host,
and ``k(x, x)`` of a stationary kernel is evaluated once per hyperparameter state.

Prediction only, not the marginal likelihood. FITC would put the same diagonal
``diag(K_XX - W K_UU W^T)`` into the likelihood's noise, but then the statistics
``A = W^T Lambda^{-1} W``, ``b = W^T Lambda^{-1} y`` weight every row by
``1 / (lambda_i + d(x_i))``, which changes with the hyperparameters: every refit would
re-read all ``n`` rows, losing the refit whose cost is constant in ``n``. Keeping the
likelihood exact SKI also keeps the data-fit part (posterior mean, the SKI covariance,
conditioning on new observations, fantasies) the exact SKI posterior that the dense
oracles test; the correction is added, at the end, to the variances of test points only.

References:

.. [Seeger2003] M. Seeger, C. K. I. Williams, N. D. Lawrence. Fast Forward Selection to
    Speed Up Sparse Gaussian Process Regression. AISTATS, 2003.
.. [Quinonero2005] J. Quinonero-Candela, C. E. Rasmussen. A Unifying View of Sparse
    Approximate Gaussian Process Regression. Journal of Machine Learning Research 6,
    2005.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel
from linear_operator.operators import (
    DiagLinearOperator,
    LinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from streamgp.linalg.grid_kernel import (
    GridKernelRoot,
    _separable_kernel_matrix,
    is_separable,
    product,
)
from streamgp.linalg.woodbury import GridPosterior


class PriorVarianceCorrection:
    r"""``d(x) = max(k(x, x) - w(x)^T L L^T w(x), 0)`` for one kernel and its root.

    Built once per hyperparameter state (the models keep it with their posterior
    cache); calls cost no host reads.

    Args:
        covar_module: The kernel ``k`` (a stationary one is evaluated once, at
            ``point``; others at every call's inputs).
        root: The model's root ``L`` of ``K_UU`` (``L L^T`` is its SKI prior on the grid
            values), detached.
        point: A ``1 x d`` input at which to evaluate ``k(x, x)`` of a stationary kernel.

    Example:
        >>> from gpytorch.kernels import RBFKernel
        >>> from streamgp.interpolation.grid import CubicGridInterpolation
        >>> from streamgp.linalg.grid_kernel import grid_kernel_root
        >>> interp = CubicGridInterpolation(torch.tensor([[0.0], [1.0]], dtype=torch.float64), 30)
        >>> kernel = RBFKernel().to(torch.float64)
        >>> kernel.lengthscale = 0.02  # half a grid spacing
        >>> with torch.no_grad():
        ...     root = grid_kernel_root(kernel, interp.grid)
        >>> correction = PriorVarianceCorrection(kernel, root, interp.bounds[:1])
        >>> X = torch.linspace(0, 1, 101, dtype=torch.float64).unsqueeze(-1)
        >>> weights = interp.weights(X)
        >>> bool((correction.interpolated(weights) < 0.9).any())  # SKI's prior dips
        True
        >>> ski = correction.interpolated(weights)
        >>> torch.allclose(ski + correction(X, weights), torch.ones(101, dtype=torch.float64))
        True
    """

    def __init__(self, covar_module: Kernel, root: GridKernelRoot, point: Tensor) -> None:
        self.covar_module = covar_module
        self.root = root
        self.point = point
        self.stationary = bool(covar_module.is_stationary)
        self._variance: Tensor | None = None
        # One dense factor: the prior "posterior" N(0, L L^T) of the grid values, whose
        # interpolated variances reuse GridPosterior's sparse / cached-K_UU choice.
        self._prior = None
        # A block-diagonal root of one-dimensional groups of one size (an additive
        # kernel's default singleton groups): w^T K_UU w = sum_g w_g^T K_g w_g, each
        # term a 4 x 4 block of K_g = L_g L_g^T at the point's base on group g's grid,
        # gathered for all groups and points at once (rows with ``group_rows``) instead
        # of the rows' products with the whole m x m root.
        self._group_blocks = None
        blocks = root.blocks
        if (
            blocks is not None
            and all(block.dim() == 2 for block in blocks)
            and len({block.shape for block in blocks}) == 1
            and blocks[0].shape[-1] >= 4
        ):
            stacked = torch.stack(blocks)
            self._group_blocks = _axis_blocks(stacked @ stacked.mT)  # G x (g - 2) x 4 x 4
            self._group_index = torch.arange(len(blocks), device=stacked.device).unsqueeze(-1)
        if len(root.factors) == 1:
            L = root.factors[0]
            self._prior = GridPosterior(root=L, mean=L.new_zeros(L.shape[:-1]))
        # Axes of one size (the default grids): the 4 x 4 blocks of their small kernel
        # matrices K_i = L_i L_i^T that a point's four neighbours on each axis span, for
        # every position of those neighbours, so that w^T (kron_i K_i) w
        # = prod_i w_i^T K_i w_i takes one gather of blocks for all axes and points (a
        # few operations per call, whatever d is).
        self._axis_blocks = None
        if self._prior is None and len({f.shape[-1] for f in root.factors}) == 1:
            # A batch of roots (one per batch member: B = prod(batch)) has B blocks per
            # axis and position; an unbatched root has one (B = 1).
            batch = root.batch_shape
            kernels = torch.stack([(f @ f.mT).reshape(-1, *f.shape[-2:]) for f in root.factors])
            blocks = _axis_blocks(kernels)  # d x B x (g - 2) x 4 x 4
            device = blocks.device
            # (axis i's block of a point is _axis_blocks[i, base_i], of member b's point
            # _axis_blocks[i, b, base_i]: ``d x 1`` and ``batch x 1 x 1 x 1`` against the
            # rows' ``... x batch x t x d x 1`` bases)
            self._axis_blocks = blocks if batch else blocks[:, 0]
            self._axis_index = torch.arange(len(root.factors), device=device).unsqueeze(-1)
            self._member_index = (
                torch.arange(batch.numel(), device=device).reshape(*batch, 1, 1, 1)
                if batch
                else None
            )

    def interpolated(self, weights) -> Tensor:
        r"""SKI's prior variance ``w(x)^T L L^T w(x)`` of every row (``batch x t``)."""
        group_rows = getattr(weights, "group_rows", None)
        if (
            self._group_blocks is not None
            and group_rows is not None
            and group_rows[0].shape[-2] == self._group_blocks.shape[0]
        ):
            base, values = group_rows  # ... x t x G x 1, ... x t x G x 4
            forms = _block_forms(self._group_blocks, (self._group_index,), base, values)
            return forms.sum(-1)  # an additive kernel: the groups' terms add
        if self._prior is not None:
            return self._prior.interpolated_root(weights).row_sq_norms()
        axis_rows = getattr(weights, "axis_rows", None)
        if (
            self._axis_blocks is None
            or axis_rows is None
            or len(axis_rows[2]) != len(self.root.factors)
        ):
            return self.root.features(weights).diag()  # d gathers of 4 x g_i values
        base, values, _ = axis_rows
        index = (self._axis_index,)
        if self._member_index is not None:
            index = (self._axis_index, self._member_index)
        # A product kernel: the axes' terms multiply.
        return product(_block_forms(self._axis_blocks, index, base, values), -1)

    def exact(self, X: Tensor) -> Tensor:
        r"""``k(x, x)``: a scalar for a stationary kernel (``batch_shape x 1`` for a
        kernel with a ``batch_shape``), else ``batch x t``."""
        if not self.stationary:
            return self.covar_module(X, diag=True)
        if self._variance is None:
            with torch.no_grad():
                if is_separable(self.covar_module):
                    # The RBF formula itself: gpytorch's kernel call compares its inputs
                    # with torch.equal, a host read on a GPU.
                    K = _separable_kernel_matrix(self.covar_module, self.point)
                else:  # its kernel root was evaluated with the same call
                    K = self.covar_module(self.point, diag=True)
                batch = self.root.batch_shape  # one variance per batch member
                self._variance = K.reshape(*batch, -1)[..., :1] if batch else K.reshape(-1)[0]
        return self._variance

    def __call__(self, X: Tensor, weights) -> Tensor:
        r"""``d(x)`` at ``batch x t x d`` inputs ``X`` with interpolation rows ``weights``.

        Returns:
            ``weights.batch_shape x t`` (the rows' batch layout, e.g. with a multi-output
            model's size-one output dimension).
        """
        exact = self.exact(X)
        ski = self.interpolated(weights)
        if not self.stationary:
            exact = exact.reshape(ski.shape)
        return (exact - ski).clamp_min(0.0)


def _block_forms(blocks: Tensor, index: tuple[Tensor, ...], base: Tensor, values: Tensor) -> Tensor:
    r"""``w_r^T B_r w_r`` for each axis or group ``r`` of every row: ``... x t x r``.

    ``B_r = blocks[(*index, base_r)]`` is the ``4 x 4`` block of ``r``'s kernel matrix
    that the row's four neighbours span (see :func:`_axis_blocks`; ``index`` picks the
    axis or group, and the batch member where there are several), ``w_r`` (``values``,
    ``... x t x r x 4``) the row's weights there and ``base`` (``... x t x r x 1``) their
    first neighbour's position.
    """
    block = blocks[(*index, base)]  # ... x t x r x 1 x 4 x 4
    values = values if values.dtype == block.dtype else values.to(block.dtype)
    return torch.einsum("...ri,...rzij,...rj->...r", values, block, values)


def _axis_blocks(kernels: Tensor) -> Tensor:
    r"""``blocks[..., b] = kernels[..., b-1 : b+3, b-1 : b+3]`` for ``... x g x g``
    ``kernels`` (one per axis and batch member): the ``... x (g - 2) x 4 x 4`` blocks of
    every kernel matrix that cubic interpolation's four neighbours ``b - 1 .. b + 2`` span
    (``b`` in ``[1, g - 3]``; row ``0`` is unused, so that a point's ``base`` indexes its
    block directly)."""
    windows = kernels.unfold(-2, 4, 1).unfold(-2, 4, 1)  # ... x (g-3) x (g-3) x 4 x 4
    blocks = windows.diagonal(dim1=-4, dim2=-3).movedim(-1, -3)  # ... x (g-3) x 4 x 4
    return torch.cat([blocks[..., :1, :, :], blocks], dim=-3).contiguous()


def root_covariance(root: Tensor, diagonal: Tensor | None = None) -> LinearOperator:
    r"""``root root^T (+ diag(diagonal))`` as a linear operator that keeps the low rank.

    A ``RootLinearOperator`` without a diagonal (LOVE's covariance), else a
    ``LowRankRootAddedDiagLinearOperator``, whose samples still draw ``rank + t``
    base samples and whose variances cost ``O(rank)`` each.
    """
    if diagonal is None:
        return RootLinearOperator(root)
    diagonal = diagonal.expand(root.shape[:-1])
    return LowRankRootAddedDiagLinearOperator(
        LowRankRootLinearOperator(root), DiagLinearOperator(diagonal)
    )
