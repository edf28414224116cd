"""A WiskiGP on batched training data (``b x n x d``) is ``b`` models, as a batched SingleTaskGP.

Issue 40, item 1 (learned and fixed noise, one output, grid space). Oracles: each batch
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
from botorch.sampling import SobolQMCNormalSampler
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


def _assert_objective_and_gradients_are_members(model, singles) -> None:
    r"""The fit objective (one value per member) and its gradients are each member's."""
    value, n = model.fit_objective()
    assert value.shape == (BATCH,) and int(n) == model.num_train
    names = [name for name, _ in model.named_parameters()]
    grads = torch.autograd.grad(value.sum(), list(model.parameters()))
    for i, single in enumerate(singles):
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
    _assert_objective_and_gradients_are_members(
        model, [_member(model, X, Y, i, **OPTIONS) for i in range(BATCH)]
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
        ("train_Y", {"outputs": 2, "shared_hyperparameters": True}),
        ("data_space_limit", {"data_space_limit": 5}),
    ],
)
def test_what_the_slice_does_not_cover_is_refused_by_name(argument, options):
    X, Y = _data()
    options = dict(options)
    if options.pop("outputs", 1) == 2:
        Y = torch.cat([Y, Y.cos()], dim=-1)
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
    with pytest.raises(ValueError, match="X contains NaN"):  # (beyond the grid: a re-grid)
        model.observe(X[:, :2] + float("nan"), Y[:, :2])
    with pytest.raises(UnsupportedError, match="batched training data"):
        model.restandardize()
    with pytest.raises(UnsupportedError, match="batched training data"):
        model.subset_output([0])
    assert model.num_train == 20
    torch.testing.assert_close(model.posterior(X_star).mean, before, rtol=0, atol=0)


# ------------------------------------------------------------------ fixed noise (train_Yvar)
def _fixed_noise_data(n: int = 20, seed: int = 0):
    X, Y = _data(n, seed=seed)
    generator = torch.Generator().manual_seed(seed + 100)
    Yvar = 0.01 + 0.05 * torch.rand(BATCH, n, 1, dtype=DTYPE, generator=generator)
    return X, Y, Yvar * (1 + torch.arange(BATCH, dtype=DTYPE).reshape(-1, 1, 1))


def _set_fixed_noise_hyperparameters(model) -> None:
    members = torch.arange(BATCH, dtype=DTYPE)
    d = model.covar_module.lengthscale.shape[-1]
    with torch.no_grad():
        lengthscale = 0.2 + 0.05 * members.reshape(-1, 1, 1) + 0.03 * torch.arange(d)
        model.covar_module.lengthscale = lengthscale.to(DTYPE)
        model.mean_module.constant.copy_(0.1 * members - 0.1)


def test_fixed_noise_each_member_is_an_unbatched_fixed_noise_model():
    X, Y, Yvar = _fixed_noise_data()
    model = WiskiGP(X, Y, Yvar, **OPTIONS)
    _set_fixed_noise_hyperparameters(model)
    assert model.batch_shape == torch.Size([BATCH]) and model.fixed_noise
    singles = [_member(model, X, Y, i, train_Yvar=Yvar[i], **OPTIONS) for i in range(BATCH)]
    # likelihood.noise: b x n, each member's rows' transformed noise (from the kept data)
    noise = model.likelihood.noise
    assert noise.shape == (BATCH, 20)
    for i, single in enumerate(singles):
        torch.testing.assert_close(noise[i], single.likelihood.noise, **TOL)
    # Without kept data the rows are folded into grid sums: each shows its member's mean.
    frozen = WiskiGP(X, Y, Yvar, keep_data=False, **OPTIONS)
    frozen.load_state_dict(model.state_dict())
    mean_noise = frozen.likelihood.noise
    for i, single in enumerate(singles):
        torch.testing.assert_close(mean_noise[i], single.likelihood.noise.mean().expand(20), **TOL)
    X_star = X[0, :6].flip(0)
    for observation_noise in (False, True):
        posterior = model.posterior(X_star, observation_noise=observation_noise)
        assert posterior.mean.shape == (BATCH, 6, 1)
        for i, single in enumerate(singles):
            expected = single.posterior(X_star, observation_noise=observation_noise)
            torch.testing.assert_close(posterior.mean[i], expected.mean, **TOL)
            torch.testing.assert_close(
                posterior.covariance_matrix[i], expected.covariance_matrix, **TOL
            )
    # the marginal likelihood and its gradients, member by member
    model.train()
    _assert_objective_and_gradients_are_members(model, singles)


def test_fixed_noise_observe_is_each_members_observe_with_its_noise():
    X, Y, Yvar = _fixed_noise_data(n=14)
    model = WiskiGP(X[:, :10], Y[:, :10], Yvar[:, :10], **OPTIONS)
    _set_fixed_noise_hyperparameters(model)
    singles = [
        _member(model, X[:, :10], Y[:, :10], i, train_Yvar=Yvar[i, :10], **OPTIONS)
        for i in range(BATCH)
    ]
    model.posterior(X[0])  # factorised: the observe updates the root
    model.observe(X[:, 10:], Y[:, 10:], Yvar[:, 10:])
    assert model.num_train == 14 and model.likelihood.noise.shape == (BATCH, 14)
    X_star = torch.rand(5, 2, dtype=DTYPE)
    for observation_noise in (False, True):
        posterior = model.posterior(X_star, observation_noise=observation_noise)
        for i, single in enumerate(singles):
            if not observation_noise:
                single.posterior(X[0])
                single.observe(X[i, 10:], Y[i, 10:], Yvar[i, 10:])
            expected = single.posterior(X_star, observation_noise=observation_noise)
            torch.testing.assert_close(posterior.mean[i], expected.mean, **TOL)
            torch.testing.assert_close(
                posterior.covariance_matrix[i], expected.covariance_matrix, **TOL
            )
    for i, single in enumerate(singles):
        torch.testing.assert_close(
            model.likelihood.noise[i].mean(), single.likelihood.noise.mean(), **TOL
        )


@pytest.mark.parametrize("given_noise", [False, True])
def test_fixed_noise_fantasies_are_each_members(given_noise):
    X, Y, Yvar = _fixed_noise_data()
    model = WiskiGP(X, Y, Yvar, **OPTIONS)
    _set_fixed_noise_hyperparameters(model)
    X_q = torch.rand(BATCH, 2, 2, dtype=DTYPE)
    Y_q = torch.randn(4, BATCH, 2, 1, dtype=DTYPE)
    noise = 0.01 + 0.05 * torch.rand(BATCH, 2, 1, dtype=DTYPE) if given_noise else None
    view = model.condition_on_observations(X_q, Y_q, noise=noise)
    assert view.batch_shape == torch.Size([4, BATCH])
    # its own likelihood: each member's rows, then its fantasy rows; the parent's is unchanged
    assert view.likelihood is not model.likelihood
    assert view.likelihood.noise.shape == (4, BATCH, 22)
    assert model.likelihood.noise.shape == (BATCH, 20)
    X_star = torch.rand(5, 2, dtype=DTYPE)
    posterior = view.posterior(X_star, observation_noise=True)
    latent = view.posterior(X_star)
    assert posterior.mean.shape == (4, BATCH, 5, 1)
    # a nested conditioning without noise: each member's mean over its rows and fantasy rows
    X_2, Y_2 = torch.rand(BATCH, 1, 2, dtype=DTYPE), torch.randn(4, BATCH, 1, 1, dtype=DTYPE)
    nested = view.condition_on_observations(X_2, Y_2).posterior(X_star, observation_noise=True)
    for i in range(BATCH):
        single = _member(model, X, Y, i, train_Yvar=Yvar[i], **OPTIONS)
        single_view = single.condition_on_observations(
            X_q[i], Y_q[:, i], noise=None if noise is None else noise[i]
        )
        expected = single_view.condition_on_observations(X_2[i], Y_2[:, i])
        expected = expected.posterior(X_star, observation_noise=True)
        torch.testing.assert_close(nested.mean[:, i], expected.mean, **TOL)
        torch.testing.assert_close(nested.variance[:, i], expected.variance, **TOL)
        torch.testing.assert_close(
            view.likelihood.noise[:, i, 20:], single_view.likelihood.noise[..., 20:], **TOL
        )
        for batched, expected in (
            (posterior, single_view.posterior(X_star, observation_noise=True)),
            (latent, single_view.posterior(X_star)),
        ):
            torch.testing.assert_close(batched.mean[:, i], expected.mean, **TOL)
            torch.testing.assert_close(
                batched.covariance_matrix[:, i], expected.covariance_matrix, **TOL
            )
    # BoTorch's fantasize: the fantasy rows get each member's mean training noise
    sampler = SobolQMCNormalSampler(torch.Size([2]), seed=0)
    fantasy = model.fantasize(X_q, sampler)
    assert fantasy.batch_shape == torch.Size([2, BATCH])
    torch.testing.assert_close(
        fantasy.likelihood.noise[..., 20:],
        model.likelihood.noise.mean(-1, keepdim=True).expand(2, BATCH, 2),
        **TOL,
    )
    fantasy_posterior = fantasy.posterior(X_star, observation_noise=True)
    for i in range(BATCH):
        single = _member(model, X, Y, i, train_Yvar=Yvar[i], **OPTIONS)
        expected = single.fantasize(X_q[i], SobolQMCNormalSampler(torch.Size([2]), seed=0))
        # the fantasy targets differ (BoTorch draws them from each model's own posterior
        # shape); the variance does not depend on them
        expected = expected.posterior(X_star, observation_noise=True)
        torch.testing.assert_close(fantasy_posterior.variance[:, i], expected.variance, **TOL)


def test_fixed_noise_equals_a_batched_fixed_noise_single_task_gp_on_a_fine_grid():
    generator = torch.Generator().manual_seed(1)
    X = torch.rand(BATCH, 25, 1, dtype=DTYPE, generator=generator)
    Y = torch.sin(6 * X) * torch.arange(1, BATCH + 1, dtype=DTYPE).reshape(-1, 1, 1)
    Yvar = (0.01 + 0.05 * torch.rand(BATCH, 25, 1, dtype=DTYPE, generator=generator)) * (
        1 + torch.arange(BATCH, dtype=DTYPE).reshape(-1, 1, 1)
    )
    model = WiskiGP(X, Y, Yvar, grid_size=400)
    oracle = SingleTaskGP(X, Y, Yvar)
    for m in (model, oracle):
        _set_fixed_noise_hyperparameters(m)
    oracle.eval()
    # the per-member mean noise, which observation_noise=True adds, is SingleTaskGP's
    torch.testing.assert_close(
        model.likelihood.noise.mean(-1, keepdim=True),
        oracle.likelihood.noise.mean(-1, keepdim=True),
        **TOL,
    )
    X_star = torch.rand(10, 1, dtype=DTYPE)
    for observation_noise in (False, True):
        posterior = model.posterior(X_star, observation_noise=observation_noise)
        expected = oracle.posterior(X_star, observation_noise=observation_noise)
        assert posterior.mean.shape == expected.mean.shape == (BATCH, 10, 1)
        torch.testing.assert_close(posterior.mean, expected.mean, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(posterior.variance, expected.variance, rtol=1e-3, atol=1e-3)
    # fantasies: the fantasy rows' noise is SingleTaskGP's (each member's mean), and so
    # is the posterior variance after them
    X_q = torch.rand(BATCH, 2, 1, dtype=DTYPE, generator=generator)
    fantasies = [
        m.fantasize(X_q, SobolQMCNormalSampler(torch.Size([2]), seed=0)) for m in (model, oracle)
    ]
    # (SingleTaskGP's is b x (n + q), broadcast over the fantasies; ours carries them)
    noise, expected = (f.likelihood.noise[..., 25:] for f in fantasies)
    assert noise.shape == (2, BATCH, 2)
    torch.testing.assert_close(noise, expected.expand_as(noise), **TOL)
    posterior, expected = (f.posterior(X_star, observation_noise=True) for f in fantasies)
    torch.testing.assert_close(posterior.variance, expected.variance, rtol=1e-3, atol=1e-3)


def test_fixed_noise_bad_noise_is_refused_by_name_and_leaves_the_model_unchanged():
    X, Y, Yvar = _fixed_noise_data()
    with pytest.raises(ValueError, match="train_Yvar"):
        WiskiGP(X, Y, -Yvar, **OPTIONS)
    with pytest.raises(ValueError, match="train_Yvar"):
        WiskiGP(X, Y, Yvar[:2], **OPTIONS)
    with pytest.raises(ValueError, match="train_Yvar"):
        WiskiGP(X, Y, Yvar[:, :5], **OPTIONS)
    model = WiskiGP(X, Y, Yvar, **OPTIONS)
    X_star = torch.rand(4, 2, dtype=DTYPE)
    before = model.posterior(X_star, observation_noise=True)
    noise_before = model.likelihood.noise
    X_new, Y_new = X[:, :2], Y[:, :2]
    for bad in (-Yvar[:, :2], Yvar[:2, :2], Yvar[:, :3], Yvar[0, :2], None):
        with pytest.raises(ValueError, match="Yvar"):
            model.observe(X_new, Y_new, bad)
    assert model.num_train == 20
    after = model.posterior(X_star, observation_noise=True)
    assert torch.equal(after.mean, before.mean) and torch.equal(after.variance, before.variance)
    assert torch.equal(model.likelihood.noise, noise_before)


def test_fixed_noise_checkpoint_round_trip_is_bit_identical():
    X, Y, Yvar = _fixed_noise_data(n=16)
    model = WiskiGP(X[:, :12], Y[:, :12], Yvar[:, :12], **OPTIONS)
    _set_fixed_noise_hyperparameters(model)
    model.observe(X[:, 12:14], Y[:, 12:14], Yvar[:, 12:14])
    checkpoint = model.checkpoint()
    resumed = WiskiGP(X[:, :5], Y[:, :5], Yvar[:, :5], **OPTIONS)
    assert resumed.restore(checkpoint) is resumed
    X_star = torch.rand(5, 2, dtype=DTYPE)
    for _ in range(2):
        for observation_noise in (False, True):
            a = model.posterior(X_star, observation_noise=observation_noise)
            b = resumed.posterior(X_star, observation_noise=observation_noise)
            assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
        assert torch.equal(model.likelihood.noise, resumed.likelihood.noise)
        model.observe(X[:, 14:], Y[:, 14:], Yvar[:, 14:])
        resumed.observe(X[:, 14:], Y[:, 14:], Yvar[:, 14:])


# ------------------------------------------------------- kept data: BoTorch's rows, re-grids
def _member_on(model, X, Y, i: int, Yvar=None):
    r"""Member ``i`` as an unbatched model built on its data on ``model``'s grid."""
    options = {
        **OPTIONS,
        "grid_bounds": model.interpolation.bounds.clone(),
        "grid_size": model.interpolation.grid_size,
    }
    if Yvar is not None:
        options["train_Yvar"] = Yvar[i]
    return _member(model, X, Y, i, **options)


def test_kept_rows_are_botorchs_training_data():
    X, Y, Yvar = _fixed_noise_data(n=12)
    bounds = torch.tensor([[0.0, 0.0], [2.0, 1.0]], dtype=DTYPE)
    oracle = SingleTaskGP(X, Y, Yvar, input_transform=Normalize(2, bounds=bounds)).eval()
    model = WiskiGP(X, Y, Yvar, input_transform=Normalize(2, bounds=bounds), **OPTIONS)
    assert len(model.observations) == 12 and model.observations.batch_shape == (BATCH,)
    torch.testing.assert_close(model.train_inputs[0], oracle.train_inputs[0], **TOL)
    torch.testing.assert_close(model.train_targets, oracle.train_targets, **TOL)
    torch.testing.assert_close(model.likelihood.noise, oracle.likelihood.noise, **TOL)
    assert torch.equal(model._original_train_inputs, X)
    # Observed rows join them, in order, for every member.
    X_new, Y_new, Yvar_new = _fixed_noise_data(n=2, seed=3)
    model.observe(X_new, Y_new, Yvar_new)
    assert model.train_inputs[0].shape == (BATCH, 14, 2)
    torch.testing.assert_close(model.train_inputs[0][:, 12:], X_new / bounds[1], **TOL)
    assert model.likelihood.noise.shape == (BATCH, 14)


@pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"])
def test_a_batch_beyond_the_grid_regrids_every_member_exactly(fixed_noise):
    X, Y, Yvar = _fixed_noise_data(n=16)
    Yvar = Yvar if fixed_noise else None
    model = WiskiGP(X[:, :12], Y[:, :12], None if Yvar is None else Yvar[:, :12], **OPTIONS)
    (_set_fixed_noise_hyperparameters if fixed_noise else _set_hyperparameters)(model)
    assert torch.equal(model.interpolation.bounds[1], torch.ones(2, dtype=DTYPE))
    X_new = X[:, 12:].clone()
    X_new[1, 0, 0] = 1.4  # one member's point beyond the box: the shared grid grows
    model.observe(X_new, Y[:, 12:], None if Yvar is None else Yvar[:, 12:])
    assert model.interpolation.bounds[1, 0] >= 1.4 and model.interpolation.grid_size == [12, 12]
    # Oracle: each member built on the new grid (its Standardize fitted on the first 12
    # rows, as the model's is frozen there), then the 4 rows, inside that grid.
    singles = []
    for i in range(BATCH):
        single = _member_on(model, X[:, :12], Y[:, :12], i, None if Yvar is None else Yvar[:, :12])
        single.observe(X_new[i], Y[i, 12:], None if Yvar is None else Yvar[i, 12:])
        singles.append(single)
    X_star = torch.tensor([[0.2, 0.3], [1.3, 0.5], [0.7, 0.9]], dtype=DTYPE)
    for observation_noise in (False, True):
        posterior = model.posterior(X_star, observation_noise=observation_noise)
        for i, single in enumerate(singles):
            expected = single.posterior(X_star, observation_noise=observation_noise)
            torch.testing.assert_close(posterior.mean[i], expected.mean, **TOL)
            torch.testing.assert_close(posterior.variance[i], expected.variance, **TOL)


def test_batched_training_data_beyond_the_unit_box_get_a_grid_over_them():
    # BoTorch's tests draw inputs a little past [0, 1]; they were refused.
    X, Y = _data()
    X = 1.05 * X - 0.02
    model = WiskiGP(X, Y, **OPTIONS)
    flat = X.reshape(-1, 2)
    assert bool((model.interpolation.bounds[0] <= flat.min(0).values).all())
    assert bool((model.interpolation.bounds[1] >= flat.max(0).values).all())
    _set_hyperparameters(model)
    X_star = X[0, :4]
    posterior = model.posterior(X_star)
    for i in range(BATCH):
        expected = _member_on(model, X, Y, i).posterior(X_star)
        torch.testing.assert_close(posterior.mean[i], expected.mean, **TOL)


def test_fantasies_beyond_the_grid_are_each_members_on_a_grown_grid():
    X, Y = _data()
    model = WiskiGP(X, Y, **OPTIONS)
    _set_hyperparameters(model)
    X_q = torch.rand(BATCH, 2, 2, dtype=DTYPE)
    X_q[0, 1, 1] = 1.3  # beyond the grid
    Y_q = torch.randn(4, BATCH, 2, 1, dtype=DTYPE)
    view = model.condition_on_observations(X_q, Y_q)
    assert view.interpolation.bounds[1, 1] >= 1.3
    assert torch.equal(model.interpolation.bounds[1], torch.ones(2, dtype=DTYPE))  # unchanged
    X_star = torch.rand(5, 2, dtype=DTYPE)
    posterior = view.posterior(X_star)
    for i in range(BATCH):
        single = _member_on(view, X, Y, i)
        expected = single.condition_on_observations(X_q[i], Y_q[:, i]).posterior(X_star)
        torch.testing.assert_close(posterior.mean[:, i], expected.mean, **TOL)
        torch.testing.assert_close(posterior.variance[:, i], expected.variance, **TOL)


def test_a_checkpoint_of_another_batch_size_is_refused_and_the_receiver_is_unchanged():
    X, Y = _data()
    source = WiskiGP(X[:2], Y[:2], **OPTIONS)
    model = WiskiGP(X, Y, **OPTIONS)
    _set_hyperparameters(model)
    X_star = torch.rand(4, 2, dtype=DTYPE)
    before = model.posterior(X_star).mean
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises((RuntimeError, ValueError), match="batch"):
        model.restore(source.checkpoint())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert torch.equal(model.posterior(X_star).mean, before)
