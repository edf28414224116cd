"""Jittered Cholesky of grid-kernel factors: degenerate matrices raise errors BoTorch handles."""

import math

import pytest
import torch
from linear_operator.utils.errors import NanError

from streamgp.linalg.grid_kernel import (
    DegenerateKernelError,
    GridKernelRoot,
    cholesky_with_jitter,
)

DT = torch.float64


def test_jitter_is_the_smallest_that_works():
    x = torch.linspace(0, 1, 10, dtype=DT)
    K = torch.exp(-((x[:, None] - x[None]) ** 2) / 2)  # lengthscale 1: numerically singular
    L, jitter = cholesky_with_jitter(K)
    assert torch.allclose(L @ L.T, K + jitter * torch.eye(10, dtype=DT))
    assert 0 < jitter.item() <= 1e-8


@pytest.mark.parametrize("fill", [0.0, math.nan, math.inf])
def test_degenerate_matrices_raise_an_error_botorch_treats_as_a_failed_step(fill):
    # A zero matrix comes from an outputscale that underflowed in a line-search step.
    K = torch.full((4, 4), fill, dtype=DT)
    with pytest.raises(DegenerateKernelError, match="NaN/Inf entries or a zero diagonal"):
        cholesky_with_jitter(K)
    # Both a LinAlgError (what callers catch) and a NanError (what BoTorch's
    # fit_gpytorch_mll turns into a NaN loss, so L-BFGS-B backs off).
    assert issubclass(DegenerateKernelError, torch.linalg.LinAlgError)
    assert issubclass(DegenerateKernelError, NanError)


def test_indefinite_matrix_still_raises_linalg_error():
    K = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=DT)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive definite"):
        cholesky_with_jitter(K)


def test_congruence_gradients_equal_the_dense_ones_for_symmetric_use():
    """Differentiating one occurrence of L (doubled) equals differentiating both,
    for any function of the symmetric result; a learned A keeps both occurrences."""
    torch.manual_seed(0)
    sizes = (3, 4)
    factors = [
        torch.tril(torch.randn(g, g, dtype=torch.float64)) + 3 * torch.eye(g, dtype=torch.float64)
        for g in sizes
    ]
    m = 12
    B = torch.randn(m, m, dtype=torch.float64)
    A = B @ B.mT
    S = torch.randn(m, m, dtype=torch.float64)
    S = S + S.mT
    scale = torch.tensor(0.7, dtype=torch.float64)

    def use(C):  # a log-determinant plus a symmetric linear functional
        eye = torch.eye(m, dtype=torch.float64)
        return torch.logdet(eye + C) + (S * C).sum()

    for learned_A in (False, True):
        leaves = [f.clone().requires_grad_(True) for f in factors]
        s = scale.clone().requires_grad_(True)
        A_in = A.clone().requires_grad_(learned_A)
        fast = use(GridKernelRoot(tuple(leaves)).congruence(A_in, scale=s))
        grads = torch.autograd.grad(fast, [*leaves, s] + ([A_in] if learned_A else []))

        dense_leaves = [f.clone().requires_grad_(True) for f in factors]
        ds = scale.clone().requires_grad_(True)
        A_d = A.clone().requires_grad_(learned_A)
        L = torch.kron(dense_leaves[0], dense_leaves[1])
        dense = use(ds * L.mT @ A_d @ L)
        expected = torch.autograd.grad(dense, [*dense_leaves, ds] + ([A_d] if learned_A else []))
        torch.testing.assert_close(fast, dense)
        for a, b in zip(grads, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def _lower_blocks(sizes, batch=()):
    return [
        torch.tril(torch.randn(*batch, g, g, dtype=DT)) + 3 * torch.eye(g, dtype=DT) for g in sizes
    ]


@pytest.mark.parametrize("sizes", [(4, 4, 4), (2, 5, 3)], ids=["equal", "unequal"])
@pytest.mark.parametrize("batch", [(), (2,)], ids=["unbatched", "batched"])
def test_block_diagonal_root_products_equal_the_dense_root(sizes, batch):
    """An additive kernel's root: products through its blocks equal the dense block_diag's."""
    torch.manual_seed(1)
    blocks = _lower_blocks(sizes, batch)
    root = GridKernelRoot.block_diagonal(blocks)
    m = sum(sizes)
    dense = torch.zeros(*batch, m, m, dtype=DT)
    start = 0
    for block, g in zip(blocks, sizes, strict=True):
        dense[..., start : start + g, start : start + g] = block
        start += g
    assert root.num_grid == m
    torch.testing.assert_close(root.to_dense(), dense, rtol=0, atol=0)
    for rhs in (torch.randn(m, dtype=DT), torch.randn(m, 3, dtype=DT), torch.randn(2, m, 3)):
        rhs = rhs.to(DT)
        expected = dense_apply(dense, rhs)
        torch.testing.assert_close(root.matmul(rhs), expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(
            root.t_matmul(rhs), dense_apply(dense.mT, rhs), rtol=1e-12, atol=1e-12
        )
    B = torch.randn(m, m, dtype=DT)
    A = B @ B.mT
    scale = torch.rand(batch, dtype=DT) + 0.5  # one per batch member (or a scalar)
    expected = scale.reshape(*batch, 1, 1) * dense.mT @ A @ dense
    torch.testing.assert_close(root.congruence(A, scale=scale), expected, rtol=1e-12, atol=1e-10)


def dense_apply(dense, rhs):
    return (dense @ rhs.unsqueeze(-1)).squeeze(-1) if rhs.dim() == 1 else dense @ rhs


@pytest.mark.parametrize("sizes", [(4, 4, 4), (2, 5, 3)], ids=["equal", "unequal"])
def test_block_congruence_values_and_gradients_equal_the_dense_ones(sizes):
    """The block path's halved backward (one occurrence of L, doubled) gives the dense
    gradients for a symmetric use, with a learned scale and with a learned A."""
    torch.manual_seed(2)
    m = sum(sizes)
    B = torch.randn(m, m, dtype=DT)
    A = B @ B.mT
    S = torch.randn(m, m, dtype=DT)
    S = S + S.mT
    blocks = _lower_blocks(sizes)

    def use(C):
        return torch.logdet(torch.eye(m, dtype=DT) + C) + (S * C).sum()

    for learned_A in (False, True):
        leaves = [b.clone().requires_grad_(True) for b in blocks]
        s = torch.tensor(0.7, dtype=DT, requires_grad=True)
        A_in = A.clone().requires_grad_(learned_A)
        fast = use(GridKernelRoot.block_diagonal(leaves).congruence(A_in, scale=s))
        grads = torch.autograd.grad(fast, [*leaves, s] + ([A_in] if learned_A else []))

        dense_leaves = [b.clone().requires_grad_(True) for b in blocks]
        ds = torch.tensor(0.7, dtype=DT, requires_grad=True)
        A_d = A.clone().requires_grad_(learned_A)
        L = torch.block_diag(*dense_leaves)
        dense = use(ds * L.mT @ A_d @ L)
        expected = torch.autograd.grad(dense, [*dense_leaves, ds] + ([A_d] if learned_A else []))
        torch.testing.assert_close(fast, dense)
        for a, b in zip(grads, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # Without gradients (statistics of a fitted model): the same matrix.
    with torch.no_grad():
        torch.testing.assert_close(
            GridKernelRoot.block_diagonal(blocks).congruence(A),
            torch.block_diag(*blocks).mT @ A @ torch.block_diag(*blocks),
        )


def test_block_products_carry_gradients_after_a_product_without_them():
    """A product under no_grad first (e.g. a cached prediction) must not strip the graph
    from a later differentiable product of the same root."""
    torch.manual_seed(3)
    leaves = [b.requires_grad_(True) for b in _lower_blocks((3, 3))]
    root = GridKernelRoot.block_diagonal(leaves)
    rhs = torch.randn(6, dtype=DT)
    with torch.no_grad():
        root.matmul(rhs)
    grads = torch.autograd.grad(root.matmul(rhs).sum(), leaves)
    expected = torch.autograd.grad((torch.block_diag(*leaves) @ rhs).sum(), leaves)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_constant_congruence_of_a_batched_dense_root_with_one_statistic():
    """A batch of dense roots (one per member) against one shared m x m statistic, without
    gradients: a batch x m x m result (the preallocated m x m buffers do not apply)."""
    torch.manual_seed(4)
    L = torch.stack(_lower_blocks((5, 5)))  # 2 x 5 x 5
    B = torch.randn(5, 5, dtype=DT)
    A = B @ B.mT
    with torch.no_grad():
        result = GridKernelRoot((L,)).congruence(A)
    torch.testing.assert_close(result, L.mT @ A @ L)


def test_stacked_rbf_roots_equal_one_factorisation_per_kernel_with_their_gradients():
    # An additive kernel's parts: singletons and pairs (two shapes, so two stacks), scaled
    # and unscaled, each with active_dims into a 4-D input (not applied: own coordinates).
    from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

    from streamgp.linalg.grid_kernel import is_scaled_rbf, stacked_rbf_roots

    kernels = [
        ScaleKernel(RBFKernel(active_dims=torch.tensor([0]))),
        RBFKernel(active_dims=torch.tensor([3])),
        ScaleKernel(RBFKernel(ard_num_dims=2, active_dims=torch.tensor([1, 2]))),
        ScaleKernel(RBFKernel(ard_num_dims=2, active_dims=torch.tensor([0, 3]))),
    ]
    for i, kernel in enumerate(kernels):
        kernel.double()
        base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
        base.lengthscale = 0.2 + 0.1 * i * torch.arange(1, base.lengthscale.shape[-1] + 1)
        if isinstance(kernel, ScaleKernel):
            kernel.outputscale = 0.5 + i
    axis = torch.linspace(0, 1, 9, dtype=torch.float64)
    pair = torch.cartesian_prod(axis[:6], axis[:6])
    points = [axis.unsqueeze(-1), axis.unsqueeze(-1), pair, pair]
    assert all(is_scaled_rbf(kernel) for kernel in kernels)
    assert not is_scaled_rbf(ScaleKernel(MaternKernel()))

    stacked = stacked_rbf_roots(kernels, points)
    one_by_one = []  # gpytorch's own evaluation, on the points embedded in 4-D
    for kernel, P in zip(kernels, points, strict=True):
        full = P.new_zeros(len(P), 4)
        full[:, kernel.active_dims] = P
        one_by_one.append(cholesky_with_jitter(kernel(full).to_dense())[0])
    # (L L^T, not L: the trailing columns of a factor of these numerically singular
    # matrices amplify the kernels' last-bit differences to ~1e-8.)
    for a, b in zip(stacked, one_by_one, strict=True):
        torch.testing.assert_close(a @ a.mT, b @ b.mT, rtol=1e-12, atol=1e-12)
    parameters = [p for kernel in kernels for p in kernel.parameters()]

    def loss(roots):
        return sum((L @ L.mT).square().sum() for L in roots)

    grads = torch.autograd.grad(loss(stacked), parameters)
    expected = torch.autograd.grad(loss(one_by_one), parameters)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("factors", "batch"), [(1, ()), (3, ()), (4, (2,))])
def test_feature_gram_values_and_gradients_equal_the_products_of_the_factors(
    factors, batch, monkeypatch
):
    # KernelFeatures.gram's own backward against autograd's through the explicit product
    # of the factors' Gram matrices, including zero columns (zero-padded factors) and a
    # factor whose Gram matrix has zeros (no division anywhere), and second derivatives.
    from streamgp.linalg import grid_kernel
    from streamgp.linalg.grid_kernel import KernelFeatures

    monkeypatch.setattr(grid_kernel, "_FEATURE_GRAM_MIN_ROWS", 1)  # (5 rows here)

    generator = torch.Generator().manual_seed(factors)
    stack = torch.randn(factors, *batch, 5, 3, dtype=DT, generator=generator)
    stack[..., -1] = 0.0
    if factors > 1:
        stack[1, ..., 0, :] = 0.0  # row 0 of factor 1: K_1 has a zero row and column
    weights = torch.randn(*batch, 5, 5, dtype=DT, generator=generator)

    def explicit(s):
        grams = s @ s.mT
        out = grams[0]
        for gram in grams[1:]:
            out = out * gram
        return out

    widths = (3,) * factors
    a = stack.clone().requires_grad_(True)
    b = stack.clone().requires_grad_(True)
    gram = KernelFeatures(a, widths).gram()
    expected = explicit(b)
    torch.testing.assert_close(gram, expected, rtol=1e-14, atol=1e-14)
    (grad_a,) = torch.autograd.grad((gram * weights).sum(), a)
    (grad_b,) = torch.autograd.grad((expected * weights).sum(), b)
    torch.testing.assert_close(grad_a, grad_b, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # no graph: the same values as the cross product
        torch.testing.assert_close(KernelFeatures(stack, widths).gram(), expected.detach())
    small = stack[..., :3, :].clone().requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda s: KernelFeatures(s, widths).gram(), (small,))


@pytest.mark.parametrize("batch", [(3,), (2, 3)])
def test_feature_cross_with_one_side_unbatched_equals_the_broadcast_products(batch):
    # The observed rows (no batch) against batched candidates, both ways round: the batch
    # folded into one product per factor gives the broadcast products' values and gradients.
    from streamgp.linalg.grid_kernel import KernelFeatures

    generator = torch.Generator().manual_seed(len(batch))
    observed = torch.randn(4, 7, 3, dtype=DT, generator=generator)
    candidates = torch.randn(4, *batch, 2, 3, dtype=DT, generator=generator)
    weights = torch.randn(*batch, 7, 2, dtype=DT, generator=generator)

    def explicit(a, b):
        a = a.reshape(a.shape[0], *([1] * len(batch)), *a.shape[1:])
        blocks = a @ b.mT
        out = blocks[0]
        for block in blocks[1:]:
            out = out * block
        return out

    for flip in (False, True):
        a1, b1 = observed.clone().requires_grad_(True), candidates.clone().requires_grad_(True)
        a2, b2 = observed.clone().requires_grad_(True), candidates.clone().requires_grad_(True)
        left, right = KernelFeatures(a1, (3,) * 4), KernelFeatures(b1, (3,) * 4)
        value = right.cross(left).mT if flip else left.cross(right)
        expected = explicit(a2, b2)
        torch.testing.assert_close(value, expected, rtol=1e-13, atol=1e-13)
        grads = torch.autograd.grad((value * weights).sum(), (a1, b1))
        expected_grads = torch.autograd.grad((expected * weights).sum(), (a2, b2))
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_kernel_on_leading_inputs_is_not_factored_over_every_axis():
    """An RBF on the first two of three inputs (``active_dims``, scaled or not) is not
    separable over the three grid axes: its root is gpytorch's kernel on the grid."""
    from gpytorch.kernels import RBFKernel, ScaleKernel

    from streamgp.linalg.grid_kernel import grid_kernel_root, is_separable

    grid = [torch.linspace(0, 1, g, dtype=DT) for g in (4, 5, 3)]
    points = torch.cartesian_prod(*grid)
    for kernel in (
        RBFKernel(active_dims=torch.tensor([0, 1])),
        ScaleKernel(RBFKernel(ard_num_dims=2), active_dims=torch.tensor([0, 1])),
    ):
        kernel = kernel.to(DT)
        assert not is_separable(kernel)
        L = grid_kernel_root(kernel, grid).to_dense()
        torch.testing.assert_close(L @ L.mT, kernel(points).to_dense(), rtol=1e-8, atol=1e-8)
    assert is_separable(ScaleKernel(RBFKernel(ard_num_dims=3)))
