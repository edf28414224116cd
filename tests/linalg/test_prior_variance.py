"""The interpolated prior variance ``w^T K_UU w`` of the exact prior variance correction:
its gather of per-axis kernel blocks against the dense formula."""

import pytest
import torch
from gpytorch.kernels import RBFKernel

from streamgp.interpolation import CubicGridInterpolation
from streamgp.linalg.grid_kernel import grid_kernel_root
from streamgp.linalg.prior_variance import PriorVarianceCorrection

DTYPE = torch.float64


@pytest.mark.parametrize("d", [2, 3])
def test_block_gather_equals_the_dense_interpolated_prior_variance(d):
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(DTYPE)
    interp = CubicGridInterpolation(bounds, 8)
    kernel = RBFKernel(ard_num_dims=d).to(DTYPE)
    kernel.lengthscale = torch.linspace(0.1, 0.3, d, dtype=DTYPE)
    with torch.no_grad():
        root = grid_kernel_root(kernel, interp.grid)
    assert len(root.factors) == d  # the Kronecker path
    correction = PriorVarianceCorrection(kernel, root, bounds[:1])
    X = torch.cat([torch.rand(2, 5, d, dtype=DTYPE), bounds.expand(2, 2, d)], dim=-2)
    weights = interp.weights(X)
    W = weights.to_dense()
    K_UU = root.to_dense() @ root.to_dense().mT
    expected = torch.einsum("...i,ij,...j->...", W, K_UU, W)
    torch.testing.assert_close(correction.interpolated(weights), expected, rtol=1e-12, atol=1e-14)
    # Weights without per-axis rows take the features' path, to the same values.
    plain = weights.map_rows(lambda t: t)
    torch.testing.assert_close(correction.interpolated(plain), expected, rtol=1e-12, atol=1e-14)
