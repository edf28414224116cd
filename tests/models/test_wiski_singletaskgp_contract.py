"""WiskiGP under SingleTaskGP's contract, with SingleTaskGP as the oracle.

BoTorch's own ``test/models/test_gp_regression.py`` is the statement of what a drop-in
``SingleTaskGP`` does; these tests say the same in this project's words, one cause each:
fixed noise per row (``likelihood.noise`` is ``train_Yvar``), conditioned (fantasy)
models with their own likelihood holding their rows' noise, and BoTorch's model
plumbing (``train_inputs``/``train_targets`` in the transformed space,
``_transform_tensor_args``, ``_original_train_inputs``, an eval-mode ``Standardize``).
"""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition import qUpperConfidenceBound
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim.utils import get_X_baseline
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood
from gpytorch.means import ZeroMean
from oracles import DenseSKIModel, rel_err

from streamgp import WiskiGP

DTYPE = torch.float64


def make_data(n: int = 12, k: int = 1, seed: int = 0):
    """1-D inputs, ``k`` outputs, one known noise variance per row (shared by outputs)."""
    g = torch.Generator().manual_seed(seed)
    X = 0.1 + 0.8 * torch.rand(n, 1, generator=g, dtype=DTYPE)
    Y = torch.cat([torch.sin(6 * X + j) + 3 * j for j in range(k)], -1)
    Yvar = 0.01 + 0.05 * torch.rand(n, 1, generator=g, dtype=DTYPE)
    return X, Y, Yvar.expand(n, k).clone()


def sampler(seed: int = 0) -> SobolQMCNormalSampler:
    return SobolQMCNormalSampler(sample_shape=torch.Size([3]), seed=seed)


OUTPUTS_AND_TRANSFORMS = [(1, "default"), (1, None), (2, None)]


def _transform_kwargs(outcome_transform):
    return {} if outcome_transform == "default" else {"outcome_transform": outcome_transform}


# ----------------------------------------------------------------- fixed noise per row
@pytest.mark.parametrize("k, outcome_transform", OUTPUTS_AND_TRANSFORMS)
def test_likelihood_noise_is_the_rows_train_yvar(k, outcome_transform):
    X, Y, Yvar = make_data(k=k)
    kwargs = _transform_kwargs(outcome_transform)
    model = WiskiGP(X, Y, Yvar, grid_size=32, **kwargs)
    exact = SingleTaskGP(X, Y, Yvar, **kwargs)
    assert isinstance(model.likelihood, FixedNoiseGaussianLikelihood)
    # SingleTaskGP's: n for one output, k x n for k (outcome-transformed).
    noise = model.likelihood.noise
    assert noise.shape == exact.likelihood.noise.shape
    assert rel_err(noise, exact.likelihood.noise) < 1e-12
    # Observed rows join it, through the frozen transform; the likelihood stores
    # nothing itself (no per-row tensor is copied on an update).
    X2, Y2, Yvar2 = make_data(n=3, k=k, seed=1)
    model.observe(X2, Y2, Yvar2)
    transform = getattr(model, "outcome_transform", None)
    Yvar2_t = Yvar2 if transform is None else transform(Y2, Yvar2)[1]
    expected = torch.cat([noise, Yvar2_t.movedim(-1, -2).squeeze(0)], -1)
    assert torch.allclose(model.likelihood.noise, expected, rtol=1e-12, atol=0)
    assert not any(torch.is_tensor(v) for v in model.likelihood.noise_covar.__dict__.values())
    assert not list(model.likelihood.buffers()) and not list(model.likelihood.parameters())


@pytest.mark.parametrize("data_space_limit", [None, 0])
def test_likelihood_noise_without_kept_data(data_space_limit):
    """keep_data=False: the rows' noise while in data space, their mean once folded."""
    X, Y, Yvar = make_data()
    model = WiskiGP(
        X, Y, Yvar, outcome_transform=None, grid_size=32, keep_data=False,
        data_space_limit=data_space_limit,
    )  # fmt: skip
    noise = model.likelihood.noise
    assert noise.shape == (len(X),)
    if data_space_limit is None:  # data space: the rows themselves
        assert torch.equal(noise, Yvar.squeeze(-1))
    else:  # grid statistics only: each row shows the rows' mean noise
        assert torch.allclose(noise, Yvar.mean().expand(len(X)), rtol=1e-12, atol=0)
    assert not hasattr(model, "train_inputs")  # no inputs kept


# ---------------------------------------------- conditioned models, own likelihoods
@pytest.mark.parametrize("k, outcome_transform", OUTPUTS_AND_TRANSFORMS)
def test_fantasy_model_has_its_own_likelihood_with_the_fantasy_noise(k, outcome_transform):
    X, Y, Yvar = make_data(k=k)
    kwargs = _transform_kwargs(outcome_transform)
    model = WiskiGP(X, Y, Yvar, grid_size=32, **kwargs)
    exact = SingleTaskGP(X, Y, Yvar, **kwargs)
    parent_noise = model.likelihood.noise.clone()
    X_f = 0.2 + 0.6 * torch.rand(4, 1, dtype=DTYPE)
    fantasy = model.fantasize(X_f, sampler())
    exact_fantasy = exact.fantasize(X_f, sampler())
    assert fantasy.likelihood is not model.likelihood
    assert torch.equal(model.likelihood.noise, parent_noise)  # the parent's is untouched
    # BoTorch's fantasy noise: the parent's rows, then their mean at the fantasy rows.
    # (SingleTaskGP's may leave out the sample dimension the fantasy rows' noise lacks.)
    noise = fantasy.likelihood.noise
    assert noise.shape == (3, *parent_noise.shape[:-1], len(X) + 4)
    assert rel_err(noise, exact_fantasy.likelihood.noise.expand(noise.shape)) < 1e-12
    assert torch.equal(noise[..., : len(X)], parent_noise.expand(*noise.shape[:-1], len(X)))
    mean = parent_noise.mean(-1, keepdim=True)
    assert torch.equal(noise[..., len(X) :], mean.expand(*noise.shape[:-1], 4))
    # A given noise (outcome-transformed, batch x q x k) is what the fantasy rows hold.
    obs_noise = torch.full((4, k), 0.1, dtype=DTYPE)
    noise = model.fantasize(X_f, sampler(), observation_noise=obs_noise).likelihood.noise
    assert torch.equal(noise[..., len(X) :], torch.full_like(noise[..., len(X) :], 0.1))


@pytest.mark.parametrize("k, outcome_transform", OUTPUTS_AND_TRANSFORMS)
def test_a_fantasys_observation_noise_is_the_mean_of_its_own_rows(k, outcome_transform):
    """BoTorch adds ``likelihood.noise.mean(-1)`` of each fantasy batch (its parent's rows
    and its own), not the parent's mean: SingleTaskGP conditioned alike is the oracle."""
    X, Y, Yvar = make_data(k=k)
    kwargs = _transform_kwargs(outcome_transform)
    model = WiskiGP(X, Y, Yvar, grid_size=32, **kwargs)
    exact = SingleTaskGP(X, Y, Yvar, **kwargs)
    exact.posterior(X[:1])  # gpytorch conditions only after a prediction
    X_f = (0.2 + 0.6 * torch.rand(2, 3, 1, dtype=DTYPE)).expand(2, 3, 1)
    Y_f = torch.randn(2, 3, k, dtype=DTYPE)
    # Outcome-transformed noise, very different between the two batches.
    noise = torch.stack([torch.full((3, k), 1e-3), torch.full((3, k), 2.0)]).to(DTYPE)
    views = [m.condition_on_observations(X_f, Y_f, noise=noise) for m in (model, exact)]
    Xs = torch.linspace(0.1, 0.9, 5, dtype=DTYPE).unsqueeze(-1)
    added = [
        v.posterior(Xs, observation_noise=True).variance - v.posterior(Xs).variance for v in views
    ]
    assert added[0].shape == added[1].shape == (2, 5, k)
    assert rel_err(added[0], added[1]) < 1e-9
    assert (added[0][1] > 10 * added[0][0]).all()  # each batch its own mean


def test_a_conditioned_model_observing_leaves_its_parent_alone():
    """A view with fixed noise used to write the likelihood it shared with its parent."""
    X, Y, Yvar = make_data()
    model = WiskiGP(X, Y, Yvar, outcome_transform=None, grid_size=32)
    Xs = torch.linspace(0.1, 0.9, 7, dtype=DTYPE).unsqueeze(-1)
    before = model.posterior(Xs, observation_noise=True)
    noise = model.likelihood.noise.clone()
    X1, Y1, Yvar1 = make_data(n=2, seed=1)
    view = model.condition_on_observations(X1, Y1, noise=Yvar1)
    X2, Y2, Yvar2 = make_data(n=3, seed=2)
    view.observe(X2, Y2, 10 * Yvar2)
    assert torch.equal(model.likelihood.noise, noise)
    after = model.posterior(Xs, observation_noise=True)
    assert torch.allclose(after.mean, before.mean, rtol=1e-12, atol=1e-14)
    assert torch.allclose(after.variance, before.variance, rtol=1e-12, atol=1e-14)
    expected = torch.cat([noise, Yvar1.squeeze(-1), 10 * Yvar2.squeeze(-1)])
    assert torch.equal(view.likelihood.noise, expected)


def test_fixed_noise_fantasies_equal_dense_ski_and_the_exact_gp():
    """The fantasy's data (train_inputs/targets, likelihood.noise) are the data it is
    conditioned on: the dense SKI posterior on them is the fantasy's posterior, and on a
    fine grid it is the exact GP's (SingleTaskGP conditioned on the same rows)."""
    X, Y, Yvar = make_data(n=15)
    plain = {"outcome_transform": None, "mean_module": ZeroMean()}
    model = WiskiGP(X, Y, Yvar, grid_size=400, **plain)
    exact = SingleTaskGP(X, Y, Yvar, **plain)
    for m in (model, exact):
        m.covar_module.lengthscale = torch.tensor([[0.25]], dtype=DTYPE)
    X_f = 0.2 + 0.6 * torch.rand(3, 1, dtype=DTYPE)
    fantasy = model.fantasize(X_f, sampler())
    exact.posterior(X_f)  # gpytorch conditions only after a prediction
    X_all, y_all, noise_all = (
        fantasy.train_inputs[0],
        fantasy.train_targets,
        fantasy.likelihood.noise,
    )
    assert X_all.shape == (3, 18, 1) and y_all.shape == noise_all.shape == (3, 18)
    assert torch.equal(X_all[..., :15, :], X.expand(3, -1, -1))
    assert torch.equal(X_all[..., 15:, :], X_f.expand(3, -1, -1))
    Xs = torch.linspace(0.1, 0.9, 9, dtype=DTYPE).unsqueeze(-1)
    post = fantasy.posterior(Xs)
    oracle = DenseSKIModel(model, X_all, y_all, noise_all, exact_prior_variance=True)
    ref = oracle.posterior(Xs)
    assert rel_err(post.mean, ref.mean) < 1e-9
    assert rel_err(post.covariance_matrix, ref.covariance_matrix) < 1e-9
    exact_fantasy = exact.condition_on_observations(
        X_f.expand(3, -1, -1),
        y_all[..., 15:].unsqueeze(-1),
        noise=noise_all[..., 15:].unsqueeze(-1),
    )
    ref = exact_fantasy.posterior(Xs)
    assert (post.mean - ref.mean).abs().max() < 2e-3
    assert (post.variance - ref.variance).abs().max() < 2e-3


# ------------------------------------------------------------------ BoTorch's plumbing
@pytest.mark.parametrize("k", [1, 2])
def test_train_inputs_and_targets_are_single_task_gps(k):
    X, Y, _ = make_data(k=k)
    X = 5 * X
    bounds = torch.tensor([[0.0], [5.0]], dtype=DTYPE)
    kwargs = {"input_transform": Normalize(d=1, bounds=bounds)}
    model = WiskiGP(X, Y, grid_size=32, **kwargs)
    exact = SingleTaskGP(X, Y, **kwargs).eval()
    train_X, train_Y, train_Yvar = model._transform_tensor_args(X, Y)
    exact_X, exact_Y, _ = exact._transform_tensor_args(X, Y)
    assert train_Yvar is None and torch.equal(train_X, exact_X) and torch.equal(train_Y, exact_Y)
    # Transformed inputs; k outputs with their own hyperparameters each have a copy
    # (SingleTaskGP's k x n x d layout).
    assert torch.allclose(model.train_inputs[0], model.input_transform(train_X))
    assert model.train_inputs[0].shape == exact.train_inputs[0].shape
    assert torch.allclose(model.train_inputs[0], exact.train_inputs[0], rtol=1e-12, atol=1e-14)
    assert torch.allclose(model.train_targets, exact.train_targets, rtol=1e-12, atol=1e-12)
    assert torch.equal(model._original_train_inputs, X)
    # BoTorch reads the original inputs as X_baseline (in the inputs' own space).
    if k == 1:
        assert torch.equal(get_X_baseline(qUpperConfidenceBound(model, beta=1.0)), X)
    # After fantasize: the fantasy rows, transformed, at the end (BoTorch's check).
    X_f = 5 * torch.rand(4, 1, dtype=DTYPE)
    fantasy = model.fantasize(X_f, sampler())
    inputs = fantasy.train_inputs[0]
    members = () if k == 1 else (k,)
    assert inputs.shape == (3, *members, len(X) + 4, 1)
    expected = model.input_transform(X_f).expand(3, *members, -1, -1)
    assert torch.allclose(inputs[..., -4:, :], expected)
    assert torch.allclose(fantasy._original_train_inputs[:, -4:], X_f.expand(3, -1, -1))
    shape = (3, len(X) + 4) if k == 1 else (3, k, len(X) + 4)
    assert fantasy.train_targets.shape == shape
    # Observed rows join them.
    model.observe(X[:2], Y[:2])
    assert model.train_inputs[0].shape == (*members, len(X) + 2, 1)
    assert model.train_targets.shape[-1] == len(X) + 2


def test_transform_tensor_args_refuses_bad_shapes():
    X, Y, Yvar = make_data(k=2)
    model = WiskiGP(X, Y, Yvar, outcome_transform=None, grid_size=32)
    before = model.likelihood.noise.clone()
    with pytest.raises(ValueError, match="Y"):
        model._transform_tensor_args(X, Y[:, :1])
    with pytest.raises(ValueError, match="Yvar"):
        model._transform_tensor_args(X, Y, Yvar[:3])
    with pytest.raises(ValueError, match="Y has shape"):
        model._transform_tensor_args(X, Y[:3])
    assert torch.equal(model.likelihood.noise, before)


def test_an_eval_mode_standardize_is_fitted_as_single_task_gp_fits_it():
    X, Y, _ = make_data()
    Y = 10 + 3 * Y
    model = WiskiGP(X, Y, outcome_transform=Standardize(m=1).eval(), grid_size=32)
    exact = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1).eval())
    for name in ("means", "stdvs"):
        mine, theirs = (
            getattr(model.outcome_transform, name),
            getattr(exact.outcome_transform, name),
        )
        assert torch.allclose(mine, theirs, rtol=1e-12, atol=0)
    assert not model.outcome_transform.training
