"""A WiskiGP on batched training data (``b x n x d``) is ``b`` models, as a batched SingleTaskGP.

Issue 40, item 1 (first slice: learned noise, one output, grid space). Oracles: each batch
member equals an unbatched ``WiskiGP`` on that member's data with that member's
hyperparameters (1e-10), and the batched model equals a batched ``SingleTaskGP`` with the
same hyperparameters on a fine grid (1e-3).
"""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition import qNegIntegratedPosteriorVariance, qUpperConfidenceBound
from botorch.exceptions.errors import UnsupportedError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models import WiskiGP

DTYPE = torch.float64
BATCH = 3
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _data(n: int = 20, d: int = 2, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(BATCH, n, d, dtype=DTYPE, generator=generator)
    level = torch.arange(BATCH, dtype=DTYPE).reshape(-1, 1, 1)
    return X, torch.sin(6 * X).sum(-1, keepdim=True) * (1 + level) + 3 * level


def _set_hyperparameters(model) -> None:
    r"""Distinct lengthscales, noise levels and constants per batch member."""
    members = torch.arange(BATCH, dtype=DTYPE)
    d = model.covar_module.lengthscale.shape[-1]
    with torch.no_grad():
        lengthscale = 0.2 + 0.05 * members.reshape(-1, 1, 1) + 0.03 * torch.arange(d)
        model.covar_module.lengthscale = lengthscale.to(DTYPE)
        model.likelihood.noise = (0.01 + 0.02 * members).reshape(-1, 1)
        model.mean_module.constant.copy_(0.1 * members - 0.1)


def _member(model, X, Y, i: int, **options):
    r"""An unbatched WiskiGP on member ``i``'s data holding member ``i``'s hyperparameters."""
    single = WiskiGP(X[i], Y[i], **options)
    batched = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in single.named_parameters():
            param.copy_(batched[name][i].reshape(param.shape))
    return single


OPTIONS = {"grid_size": 12, "data_space_limit": 0}


@pytest.mark.parametrize("bounded", [False, True])
def test_each_member_is_an_unbatched_model(bounded):
    X, Y = _data()
    if bounded:  # an input transform with fixed bounds (learns nothing from train_X)
        bounds = torch.tensor([[-1.0, 0.0], [1.0, 2.0]], dtype=DTYPE)
        X = bounds[0] + (bounds[1] - bounds[0]) * X
        options = {**OPTIONS, "input_transform": Normalize(2, bounds=bounds)}
    else:
        options = OPTIONS
    model = WiskiGP(X, Y, **options)
    _set_hyperparameters(model)
    assert model.batch_shape == torch.Size([BATCH])
    assert not model.in_data_space
    X_star = X[0, :6].flip(0)
    for observation_noise in (False, True):
        posterior = model.posterior(X_star, observation_noise=observation_noise)
        assert posterior.mean.shape == (BATCH, 6, 1)
        for i in range(BATCH):
            expected = _member(model, X, Y, i, **options).posterior(
                X_star, observation_noise=observation_noise
            )
            torch.testing.assert_close(posterior.mean[i], expected.mean, **TOL)
            torch.testing.assert_close(
                posterior.covariance_matrix[i], expected.covariance_matrix, **TOL
            )
    # test points with the batch dimension: member i is predicted at its own points
    X_batch = X[:, 5:9]
    posterior = model.posterior(X_batch)
    for i in range(BATCH):
        expected = _member(model, X, Y, i, **options).posterior(X_batch[i])
        torch.testing.assert_close(posterior.variance[i], expected.variance, **TOL)


def test_marginal_likelihood_and_gradients_are_each_members():
    X, Y = _data()
    model = WiskiGP(X, Y, **OPTIONS)
    _set_hyperparameters(model)
    model.train()
    value, n = model.fit_objective()
    assert value.shape == (BATCH,) and int(n) == 20
    names = [name for name, _ in model.named_parameters()]
    grads = torch.autograd.grad(value.sum(), list(model.parameters()))
    for i in range(BATCH):
        single = _member(model, X, Y, i, **OPTIONS)
        single.train()
        expected, _ = single.fit_objective()
        torch.testing.assert_close(value[i], expected, **TOL)
        single_names, single_params = zip(*single.named_parameters(), strict=True)
        single_grads = torch.autograd.grad(expected, single_params)
        single_grads = dict(zip(single_names, single_grads, strict=True))
        for name, grad in zip(names, grads, strict=True):
            torch.testing.assert_close(
                grad[i].reshape(single_grads[name].shape), single_grads[name], **TOL
            )
    # The MLL module: one value per member with that member's priors, as gpytorch's
    # ExactMarginalLogLikelihood of a batched model (BoTorch's fit sums them).
    value = WoodburyMarginalLogLikelihood(model.likelihood, model)()
    assert value.shape == (BATCH,)
    for i in range(BATCH):
        single = _member(model, X, Y, i, **OPTIONS)
        single.train()
        expected = WoodburyMarginalLogLikelihood(single.likelihood, single)()
        torch.testing.assert_close(value[i], expected, **TOL)


def test_observe_is_each_members_observe_and_a_rebuild():
    X, Y = _data(n=14)
    model = WiskiGP(X[:, :10], Y[:, :10], **OPTIONS)
    _set_hyperparameters(model)
    singles = [_member(model, X[:, :10], Y[:, :10], i, **OPTIONS) for i in range(BATCH)]
    model.posterior(X[0])  # factorised: the observe updates the root (O(m^2 q))
    model.observe(X[:, 10:], Y[:, 10:])
    assert model.num_train == 14
    X_star = torch.rand(5, 2, dtype=DTYPE)
    posterior = model.posterior(X_star)
    for i, single in enumerate(singles):
        single.posterior(X[0])
        single.observe(X[i, 10:], Y[i, 10:])
        expected = single.posterior(X_star)
        torch.testing.assert_close(posterior.mean[i], expected.mean, **TOL)
        torch.testing.assert_close(posterior.covariance_matrix[i], expected.covariance_matrix)
    # the statistics are those of all rows (the outcome transform frozen on the first 10)
    rebuilt = WiskiGP(X[:, :10], Y[:, :10], **OPTIONS)
    rebuilt.load_state_dict(model.state_dict(), keep_transforms=False)
    torch.testing.assert_close(rebuilt.posterior(X_star).mean, posterior.mean, **TOL)


@pytest.mark.parametrize("given_noise", [False, True])
def test_fantasies_are_each_members(given_noise):
    X, Y = _data()
    model = WiskiGP(X, Y, **OPTIONS)
    _set_hyperparameters(model)
    X_q = torch.rand(BATCH, 2, 2, dtype=DTYPE)  # each member's own conditioning points
    Y_q = torch.randn(4, BATCH, 2, 1, dtype=DTYPE)  # 4 fantasies
    noise = 0.01 + 0.05 * torch.rand(BATCH, 2, 1, dtype=DTYPE) if given_noise else None
    view = model.condition_on_observations(X_q, Y_q, noise=noise)
    assert view.batch_shape == torch.Size([4, BATCH])
    X_star = torch.rand(5, 2, dtype=DTYPE)
    posterior = view.posterior(X_star, observation_noise=True)
    assert posterior.mean.shape == (4, BATCH, 5, 1)
    for i in range(BATCH):
        single = _member(model, X, Y, i, **OPTIONS)
        expected = single.condition_on_observations(
            X_q[i], Y_q[:, i], noise=None if noise is None else noise[i]
        ).posterior(X_star, observation_noise=True)
        torch.testing.assert_close(posterior.mean[:, i], expected.mean, **TOL)
        torch.testing.assert_close(
            posterior.covariance_matrix[:, i], expected.covariance_matrix, **TOL
        )


def test_qnipv_through_fantasies_is_each_members():
    # the posterior variance after fantasies does not depend on the fantasy targets, so
    # qNIPV of a batched model is each member's, whatever samples BoTorch draws
    X, Y = _data()
    model = WiskiGP(X, Y, **OPTIONS)
    _set_hyperparameters(model)
    mc_points = torch.rand(16, 2, dtype=DTYPE)
    candidates = torch.rand(6, 1, 2, 2, dtype=DTYPE)
    value = qNegIntegratedPosteriorVariance(model, mc_points=mc_points)(candidates)
    assert value.shape == (6, BATCH)
    for i in range(BATCH):
        single = _member(model, X, Y, i, **OPTIONS)
        expected = qNegIntegratedPosteriorVariance(single, mc_points=mc_points)(candidates[:, 0])
        torch.testing.assert_close(value[:, i], expected, **TOL)


def test_equals_a_batched_single_task_gp_on_a_fine_grid():
    generator = torch.Generator().manual_seed(1)
    X = torch.rand(BATCH, 25, 1, dtype=DTYPE, generator=generator)
    Y = torch.sin(6 * X) * torch.arange(1, BATCH + 1, dtype=DTYPE).reshape(-1, 1, 1)
    model = WiskiGP(X, Y, grid_size=400)
    oracle = SingleTaskGP(X, Y)
    for m in (model, oracle):
        _set_hyperparameters(m)
    oracle.eval()
    X_star = torch.rand(10, 1, dtype=DTYPE)
    posterior, expected = model.posterior(X_star), oracle.posterior(X_star)
    assert posterior.mean.shape == expected.mean.shape == (BATCH, 10, 1)
    torch.testing.assert_close(posterior.mean, expected.mean, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(
        posterior.covariance_matrix, expected.covariance_matrix, rtol=1e-3, atol=1e-3
    )
    oracle.train()
    model.train()
    mll = ExactMarginalLogLikelihood(oracle.likelihood, oracle)
    reference = mll(oracle(*oracle.train_inputs), oracle.train_targets)
    assert WoodburyMarginalLogLikelihood(model.likelihood, model)().shape == reference.shape
    # the log likelihood itself (the priors: test_marginal_likelihood_and_gradients...)
    value, _ = model.fit_objective()
    reference = oracle.likelihood(oracle(*oracle.train_inputs)).log_prob(oracle.train_targets)
    assert reference.shape == value.shape == (BATCH,)
    torch.testing.assert_close(value, reference, rtol=1e-3, atol=1e-3)


def test_botorch_fit_fits_every_member():
    X, Y = _data()
    model = WiskiGP(X, Y, **OPTIONS)
    before = model.covar_module.lengthscale.detach().clone()
    fit_gpytorch_mll(WoodburyMarginalLogLikelihood(model.likelihood, model))
    after = model.covar_module.lengthscale.detach()
    assert after.shape == before.shape == (BATCH, 1, 2)
    assert (after != before).flatten(1).any(-1).all()  # each member's own lengthscales
    assert model.posterior(X[0]).mean.shape == (BATCH, 20, 1)
    # an MC acquisition function sees the members as a batch, as a batched SingleTaskGP's
    acqf = qUpperConfidenceBound(model, beta=0.1)
    assert acqf(torch.rand(7, 1, 2, 2, dtype=DTYPE)).shape == (7, BATCH)


@pytest.mark.parametrize(
    ("argument", "options"),
    [
        ("train_Yvar", {"train_Yvar": "rows"}),
        ("train_Y", {"outputs": 2}),
        ("input_transform", {"input_transform": Normalize(2)}),  # learned bounds
        ("data_space_limit", {"data_space_limit": 5}),
    ],
)
def test_what_the_slice_does_not_cover_is_refused_by_name(argument, options):
    X, Y = _data()
    options = dict(options)
    if options.pop("outputs", 1) == 2:
        Y = torch.cat([Y, Y.cos()], dim=-1)
    if options.get("train_Yvar") == "rows":
        options["train_Yvar"] = torch.full_like(Y, 0.01)
    with pytest.raises(ValueError, match=f"^{argument}: a WiskiGP with batched training data"):
        WiskiGP(X, Y, grid_size=8, **options)


def test_bad_updates_are_refused_and_leave_the_model_unchanged():
    X, Y = _data()
    model = WiskiGP(X, Y, **OPTIONS)
    X_star = torch.rand(4, 2, dtype=DTYPE)
    before = model.posterior(X_star).mean
    with pytest.raises(ValueError, match="X must have shape 3 x q x d"):
        model.observe(X[0, :2], Y[0, :2])
    with pytest.raises(ValueError, match="batch dimensions must be X's"):
        model.observe(X[:, :2], Y[:2, :2])
    with pytest.raises(ValueError, match="outside"):
        model.observe(X[:, :2] + 2, Y[:, :2])
    with pytest.raises(UnsupportedError, match="batched training data"):
        model.restandardize()
    with pytest.raises(UnsupportedError, match="batched training data"):
        model.subset_output([0])
    assert model.num_train == 20
    torch.testing.assert_close(model.posterior(X_star).mean, before, rtol=0, atol=0)
