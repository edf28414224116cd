"""The exact kernel behind a root's interface (``streamgp.linalg.exact_kernel``).

Oracle: gpytorch's own kernel call, for values and gradients (in the hyperparameters and
in the inputs), batched inputs and concatenated rows.
"""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from oracles import rel_err

from streamgp.interpolation.exact import InputRows
from streamgp.linalg.exact_kernel import ExactKernelRoot

DTYPE = torch.float64


def kernel(scaled: bool):
    base = RBFKernel(ard_num_dims=5).to(DTYPE)
    base.lengthscale = torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0], dtype=DTYPE)
    if not scaled:
        return base
    k = ScaleKernel(base).to(DTYPE)
    k.outputscale = 1.7
    return k


@pytest.mark.parametrize("scaled", [True, False])
def test_blocks_and_gradients_are_gpytorchs(scaled):
    k = kernel(scaled)
    A = torch.rand(7, 5, dtype=DTYPE, requires_grad=True)
    B = 3 * torch.rand(2, 4, 5, dtype=DTYPE)  # batched, partly far away
    root = ExactKernelRoot.of(k, num_grid=0)
    fa, fb = root.features(InputRows(A, 0)), root.features(InputRows(B, 0))
    cross, expected = fa.cross(fb), k(A, B).to_dense()
    assert cross.shape == (2, 7, 4) and rel_err(cross, expected) < 1e-12
    assert rel_err(fa.gram(), k(A).to_dense()) < 1e-12
    assert rel_err(fb.diag(), k(B, diag=True)) < 1e-12
    both = fa.cat(fb.expand(2, 4, 5))
    assert rel_err(both.gram(), k(torch.cat([A.expand(2, 7, 5), B], -2)).to_dense()) < 1e-12
    # Gradients in the hyperparameters and the inputs.
    params = [p for p in k.parameters()] + [A]
    ours = torch.autograd.grad(cross.square().sum(), params)
    theirs = torch.autograd.grad(expected.square().sum(), params)
    for grad, ref in zip(ours, theirs, strict=True):
        assert rel_err(grad, ref) < 1e-10


def test_a_root_made_without_gradients_is_constant():
    k = kernel(True)
    with torch.no_grad():
        root = ExactKernelRoot.of(k, num_grid=0)
    X = torch.rand(4, 5, dtype=DTYPE)
    assert not root.features(InputRows(X, 0)).gram().requires_grad


def test_other_kernels_are_refused_by_name():
    with pytest.raises(ValueError, match="covar_module MaternKernel"):
        ExactKernelRoot.of(MaternKernel(ard_num_dims=3), num_grid=0)
