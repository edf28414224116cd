"""PosteriorCovariance: variances from factors, the dense matrix only on demand."""

from __future__ import annotations

import pytest
import torch
from botorch.models.transforms import Standardize
from gpytorch.kernels import RBFKernel, ScaleKernel
from torch import Tensor

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


def test_conversions_and_per_output_scales_keep_the_matrix():
    """linear_operator's generic to / clone / detach / type rebuild from the factors, and a
    per-batch scale (one per output) scales each batch entry."""
    root, negative = torch.randn(5, 7, dtype=DTYPE), torch.randn(3, 5, 2, dtype=DTYPE)
    covar = PosteriorCovariance((root,), (negative,), torch.rand(3, 5, dtype=DTYPE))
    scales = torch.tensor([1.0, 4.0, 9.0], dtype=DTYPE)
    scaled = covar.scaled(scales)
    dense = covar.to_dense()
    torch.testing.assert_close(scaled.to_dense(), scales[:, None, None] * dense)
    torch.testing.assert_close(scaled.diagonal(), scales[:, None] * dense.diagonal(0, -2, -1))
    torch.testing.assert_close(scaled.permute(0, 1, 2).to_dense(), scaled.to_dense())
    torch.testing.assert_close(scaled.unsqueeze(0).to_dense()[0], scaled.to_dense())
    for converted in (scaled.clone(), scaled.detach(), scaled.to(torch.float64), scaled.cpu()):
        assert isinstance(converted, PosteriorCovariance)
        torch.testing.assert_close(converted.to_dense(), scaled.to_dense())
    single = scaled.type(torch.float32)
    assert single.dtype == torch.float32
    torch.testing.assert_close(single.to_dense(), scaled.to_dense().float())


def _grid_model(X: Tensor, data_space_limit: int | None) -> WiskiGP:
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = WiskiGP(
        X,
        Y,
        grid_size=12,
        covar_module=ScaleKernel(RBFKernel()),
        outcome_transform=None,
        data_space_limit=data_space_limit,
    )
    model.covar_module.base_kernel.lengthscale = 0.3
    model.likelihood.noise = 0.05
    return model.eval()


@pytest.mark.parametrize("data_space_limit", [0, None], ids=["grid", "data"])
def test_cached_prediction_matrices_match_the_direct_route_and_survive_updates(
    data_space_limit, monkeypatch
):
    """Variances and joint covariances from the cached Sigma_U (grid) or G (data space)
    equal the route through the root / triangular solves, before and after observe."""
    import streamgp.linalg.data_space as data_space
    import streamgp.linalg.posterior_covariance as pc

    torch.manual_seed(3)
    X = torch.rand(30, 2, dtype=DTYPE)
    model = _grid_model(X, data_space_limit)
    posterior = model.exact_posterior()
    expected_type = "GridPosterior" if data_space_limit == 0 else "DataPosterior"
    assert type(posterior).__name__ == expected_type
    Xs = torch.rand(400, 2, dtype=DTYPE)

    # Without caches (a request never pays for one)...
    monkeypatch.setattr(pc, "GATHER_COST_RATIO", 0.0)
    monkeypatch.setattr(data_space, "MAX_CACHE_ENTRIES", 0)
    direct_var = model.posterior(Xs).variance
    direct_joint = model.posterior(Xs[:3]).covariance_matrix
    assert posterior.cache.value is None
    # ... and with them (built by the first large request).
    monkeypatch.undo()
    cached_var = model.posterior(Xs).variance
    assert posterior.cache.value is not None
    cached_joint = model.posterior(Xs[:3]).covariance_matrix
    torch.testing.assert_close(cached_var, direct_var, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(cached_joint, direct_joint, rtol=1e-10, atol=1e-12)

    # observe keeps the cache exact (an O(m^2 q) / O(m n q) update, not a rebuild).
    X_new = torch.rand(5, 2, dtype=DTYPE)
    Y_new = torch.sin(5 * X_new).sum(-1, keepdim=True)
    model.observe(X_new, Y_new)
    assert model.exact_posterior().cache.value is not None
    model.love_grid_posterior()  # folds observations held as a correction
    updated = model.exact_posterior()
    assert updated.cache.value is not None
    fresh = _grid_model(torch.cat([X, X_new]), data_space_limit)
    monkeypatch.setattr(pc, "GATHER_COST_RATIO", 0.0)
    monkeypatch.setattr(data_space, "MAX_CACHE_ENTRIES", 0)
    torch.testing.assert_close(
        model.posterior(Xs).variance, fresh.posterior(Xs).variance, rtol=1e-8, atol=1e-10
    )
    # Conditioning (fantasies) on top of a cached posterior.
    cond = model.condition_on_observations(X_new[:2] * 0.9, Y_new[:2])
    joint = cond.posterior(Xs[:4]).covariance_matrix
    torch.testing.assert_close(
        cond.posterior(Xs[:4]).variance.squeeze(-1), joint.diagonal(), rtol=1e-10, atol=1e-12
    )


def test_amortized_cache_builds_once_the_work_pays_for_it():
    from streamgp.linalg.posterior_covariance import AmortizedCache

    builds = []
    cache = AmortizedCache()

    def build():
        builds.append(1)
        return torch.ones(1)

    assert cache.get(4.0, 10.0, build) is None
    assert cache.get(5.0, 10.0, build) is None
    assert cache.get(1.0, 10.0, build) is not None
    assert cache.get(100.0, 10.0, build) is not None
    assert len(builds) == 1


def test_batched_matmul_of_interpolation_weights_equals_dense():
    from streamgp.interpolation.grid import CubicGridInterpolation

    interp = CubicGridInterpolation(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DTYPE), [8, 9])
    W = interp.weights(torch.rand(3, 1, 6, 2, dtype=DTYPE))
    rhs = torch.randn(4, interp.num_grid, 2, dtype=DTYPE)
    dense = torch.zeros(3, 1, 6, interp.num_grid, dtype=DTYPE)
    dense.scatter_add_(-1, W.indices, W.values)
    torch.testing.assert_close(W.matmul(rhs), dense @ rhs)
