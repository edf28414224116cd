"""PosteriorCovariance: variances from factors, the dense matrix only on demand."""

from __future__ import annotations

import pytest
import torch
from botorch.models.transforms import Standardize
from gpytorch.kernels import RBFKernel, ScaleKernel

from streamgp import WiskiGP
from streamgp.linalg.posterior_covariance import PosteriorCovariance

DTYPE = torch.float64


def test_diagonal_matches_dense_without_forming_it():
    A1, A2 = torch.randn(3, 50, 4, dtype=DTYPE), torch.randn(50, 5, dtype=DTYPE)
    N = torch.randn(3, 50, 2, dtype=DTYPE)
    noise = torch.rand(50, dtype=DTYPE)
    covar = PosteriorCovariance((A1, A2), (N,), noise, scale=torch.tensor(2.0, dtype=DTYPE))
    assert covar.shape == (3, 50, 50)
    diag = covar.diagonal()
    assert covar._dense is None  # no 50 x 50 matrix yet
    dense = 2.0 * (A1 @ A1.mT) * (A2 @ A2.mT) - N @ N.mT + torch.diag(noise)
    torch.testing.assert_close(diag, dense.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(covar.to_dense(), dense)
    scaled = covar.scaled(torch.tensor(3.0, dtype=DTYPE)).with_noise(noise)
    torch.testing.assert_close(scaled.to_dense(), 3.0 * dense + torch.diag(noise))


@pytest.mark.parametrize("space_limit", [None, 0])
@pytest.mark.parametrize("observation_noise", [False, True])
def test_model_variances_are_lazy_and_equal_the_joint_covariance(space_limit, observation_noise):
    X = torch.rand(40, 2, dtype=DTYPE)
    Y = 3 + 2 * torch.sin(5 * X).sum(-1, keepdim=True)
    model = WiskiGP(
        X,
        Y,
        grid_size=12,
        covar_module=ScaleKernel(RBFKernel(ard_num_dims=2)),
        outcome_transform=Standardize(1),
        data_space_limit=space_limit,
    )
    Xs = torch.rand(2, 300, 2, dtype=DTYPE)
    for m in (model, model.condition_on_observations(X[:3] * 0.5, Y[:3])):
        post = m.posterior(Xs, observation_noise=observation_noise)
        covar = post.distribution.lazy_covariance_matrix
        assert isinstance(covar, PosteriorCovariance)
        variance = post.variance
        assert covar._dense is None  # variances came from the factors
        full = post.covariance_matrix
        torch.testing.assert_close(variance.squeeze(-1), full.diagonal(dim1=-2, dim2=-1))
        assert (variance > 0).all()


def test_batch_reshapes_and_indexing_match_the_dense_matrix():
    """What ModelListGP (unsqueeze, cat) and cached-Cholesky samplers (indexing) do."""
    root, negative = torch.randn(2, 5, 7, dtype=DTYPE), torch.randn(2, 5, 2, dtype=DTYPE)
    noise = torch.rand(2, 5, dtype=DTYPE)
    covar = PosteriorCovariance((root,), (negative,), noise)
    dense = covar.to_dense()
    torch.testing.assert_close(covar.unsqueeze(0).to_dense(), dense.unsqueeze(0))
    torch.testing.assert_close(
        covar.unsqueeze(1).diagonal(), dense.unsqueeze(1).diagonal(0, -2, -1)
    )
    torch.testing.assert_close(covar.expand(3, 2, 5, 5).to_dense(), dense.expand(3, 2, 5, 5))
    torch.testing.assert_close(covar[..., -2:, :].to_dense(), dense[..., -2:, :])
    torch.testing.assert_close(covar[1].to_dense(), dense[1])
    torch.testing.assert_close(covar.sum(0).to_dense(), dense.sum(0))
    swapped = PosteriorCovariance((root.unsqueeze(0).expand(3, 2, 5, 7),)).permute(1, 0, 2, 3)
    torch.testing.assert_close(swapped.to_dense(), (root @ root.mT).unsqueeze(1).expand(2, 3, 5, 5))
