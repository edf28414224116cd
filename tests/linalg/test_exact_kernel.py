"""The exact kernel behind a root's interface (``streamgp.linalg.exact_kernel``).

Oracle: gpytorch's own kernel call, for values and gradients (in the hyperparameters and
in the inputs), batched inputs and concatenated rows: the RBF fast path and any other
kernel (Matern, periodic, a sum over ``active_dims``).
"""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import MaternKernel, PeriodicKernel, RBFKernel, ScaleKernel
from oracles import rel_err

from streamgp.interpolation.exact import InputRows
from streamgp.linalg.exact_kernel import ExactKernelRoot

DTYPE = torch.float64


def kernel(scaled: bool, nu: float | None = None):
    """An ARD RBF kernel (``nu`` None) or Matern-``nu`` kernel on 5 inputs, maybe scaled."""
    base = RBFKernel(ard_num_dims=5) if nu is None else MaternKernel(nu=nu, ard_num_dims=5)
    base = base.to(DTYPE)
    base.lengthscale = torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0], dtype=DTYPE)
    if not scaled:
        return base
    k = ScaleKernel(base).to(DTYPE)
    k.outputscale = 1.7
    return k


def assert_blocks_and_gradients_are_gpytorchs(k) -> ExactKernelRoot:
    """Blocks, diagonal, concatenated and batched rows, and gradients in the
    hyperparameters and the inputs, against ``k``'s own gpytorch call; returns the root."""
    A = torch.rand(7, 5, dtype=DTYPE, requires_grad=True)
    B = 3 * torch.rand(2, 4, 5, dtype=DTYPE)  # batched, partly far away
    root = ExactKernelRoot.of(k, num_grid=0)
    fa, fb = root.features(InputRows(A, 0)), root.features(InputRows(B, 0))
    cross, expected = fa.cross(fb), k(A, B).to_dense()
    assert cross.shape == (2, 7, 4) and rel_err(cross, expected) < 1e-12
    both = fa.cat(fb.expand(2, 4, 5))
    # (Without gradients gpytorch zeroes a Gram matrix's diagonal distances, as the closed
    # forms always do; with gradients it keeps their rounding, about 1e-8, which a
    # Matern-1/2 kernel passes on to its diagonal.)
    with torch.no_grad():
        expected_gram = k(A).to_dense()
        expected_both = k(torch.cat([A.expand(2, 7, 5), B], -2)).to_dense()
    assert rel_err(fa.gram(), expected_gram) < 1e-12
    assert rel_err(fb.diag(), k(B, diag=True)) < 1e-12
    assert rel_err(both.gram(), expected_both) < 1e-12
    # Gradients in the hyperparameters and the inputs.
    params = [p for p in k.parameters()] + [A]
    ours = torch.autograd.grad(cross.square().sum(), params)
    theirs = torch.autograd.grad(expected.square().sum(), params)
    for grad, ref in zip(ours, theirs, strict=True):
        assert rel_err(grad, ref) < 1e-10
    return root


@pytest.mark.parametrize("scaled", [True, False])
def test_blocks_and_gradients_are_gpytorchs(scaled):
    assert_blocks_and_gradients_are_gpytorchs(kernel(scaled))


def test_a_root_made_without_gradients_is_constant():
    k = kernel(True)
    with torch.no_grad():
        root = ExactKernelRoot.of(k, num_grid=0)
    X = torch.rand(4, 5, dtype=DTYPE)
    assert not root.features(InputRows(X, 0)).gram().requires_grad


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_kernels_take_the_closed_form_and_are_gpytorchs(nu, scaled):
    root = assert_blocks_and_gradients_are_gpytorchs(kernel(scaled, nu))
    assert root.module is None and root.nu == nu


def other_kernels():
    """Kernels without a closed form here: evaluated by their own gpytorch call."""
    periodic = ScaleKernel(PeriodicKernel()).to(DTYPE)
    periodic.outputscale = 1.3
    parts = RBFKernel(active_dims=torch.tensor([0, 2])) + MaternKernel(
        nu=1.5, active_dims=torch.tensor([1, 3, 4])
    )
    subset = ScaleKernel(MaternKernel(nu=2.5, active_dims=torch.arange(4)))
    return {
        "periodic": periodic,
        "sum-active-dims": parts.to(DTYPE),
        "matern-on-a-subset": subset.to(DTYPE),
    }


@pytest.mark.parametrize("name", ["periodic", "sum-active-dims", "matern-on-a-subset"])
def test_any_other_kernel_is_its_own_gpytorch_call(name):
    k = other_kernels()[name]
    root = assert_blocks_and_gradients_are_gpytorchs(k)
    assert root.module is k and root.batch_shape == torch.Size([])


def test_any_kernel_made_without_gradients_is_constant_at_its_hyperparameters():
    k = other_kernels()["periodic"]
    X = torch.rand(4, 5, dtype=DTYPE, requires_grad=True)
    with torch.no_grad():
        root = ExactKernelRoot.of(k, num_grid=0)
    before = k(X).to_dense().detach()
    k.base_kernel.lengthscale = 2.0  # later changes do not reach it
    gram = root.features(InputRows(X, 0)).gram()
    assert rel_err(gram, before) < 1e-14
    # Constant in the hyperparameters, still differentiable in the inputs.
    assert all(not p.requires_grad for p in root.module.parameters())
    assert torch.autograd.grad(gram.sum(), X)[0].abs().sum() > 0
    moved = root.features(InputRows(X, 0)).apply(lambda t: t.to(torch.float32))
    assert moved.gram().dtype == torch.float32
