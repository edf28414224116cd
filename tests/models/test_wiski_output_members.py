"""Several outputs the BoTorch way: each with its own hyperparameters, as batch members.

``WiskiGP(X, Y)`` with ``k`` columns is a ``BatchedMultiOutputGPyTorchModel`` as
``SingleTaskGP`` is (issue 40): one kernel, noise and constant mean per output, BoTorch's
``t x k`` posteriors, ``k x n x d`` training inputs. Oracles: output ``j`` equals an
unbatched single-output ``WiskiGP`` on column ``j`` with output ``j``'s hyperparameters
(1e-10, float64), and the model equals a ``SingleTaskGP`` of ``k`` outputs with the same
hyperparameters on a fine grid (1e-3). ``shared_hyperparameters=True`` (one kernel and
noise for all outputs) is tested in ``test_wiski_multi_output.py``.
"""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
from botorch.exceptions.errors import UnsupportedError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.models import WiskiGP

DT = torch.float64
K = 3
TOL = {"rtol": 1e-10, "atol": 1e-10}
OPTIONS = {"grid_size": 12}


def _data(n: int = 24, seed: int = 0, batch: tuple[int, ...] = ()):
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(*batch, n, 2, dtype=DT, generator=generator)
    Y = torch.stack(
        [torch.sin(6 * X).sum(-1), 3 * torch.cos(4 * X[..., 0]) + 5, 10 * X.prod(-1) - 2], -1
    )
    # Noise that differs between the outputs (and so after Standardize too).
    Yvar = (0.01 + 0.05 * torch.rand(Y.shape, dtype=DT, generator=generator)) * torch.tensor(
        [1.0, 4.0, 0.5], dtype=DT
    )
    return X, Y, Yvar


def _set_hyperparameters(model, fixed_noise: bool = False) -> None:
    r"""Distinct lengthscales, noise levels and constants per output (and batch member)."""
    shape = model.covar_module.raw_lengthscale.shape[:-2]  # batch x k
    members = torch.arange(shape.numel(), dtype=DT).reshape(shape)
    with torch.no_grad():
        d = model.covar_module.raw_lengthscale.shape[-1]
        lengthscale = 0.2 + 0.04 * members[..., None, None] + 0.03 * torch.arange(d)
        model.covar_module.lengthscale = lengthscale
        model.mean_module.constant.copy_(0.1 * members - 0.2)
        if not fixed_noise:
            model.likelihood.noise = (0.01 + 0.02 * members).unsqueeze(-1)


def _single(model, X, Y, Yvar, j: int, member: tuple[int, ...] = (), **options):
    r"""Output ``j`` (of batch member ``member``) as an unbatched single-output WiskiGP on
    that column, with its hyperparameters and the model's grid."""
    index = (*member, j)
    single = WiskiGP(
        X[member],
        Y[member][..., j : j + 1],
        None if Yvar is None else Yvar[member][..., j : j + 1],
        grid_size=model.interpolation.grid_size,
        grid_bounds=model.interpolation.bounds.clone(),
        data_space_limit=0,
        **options,
    )
    batched = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in single.named_parameters():
            param.copy_(batched[name][index].reshape(param.shape))
    return single


@pytest.mark.parametrize("fixed_noise", [False, True], ids=["learned-noise", "fixed-noise"])
def test_each_output_is_a_single_output_model_with_its_hyperparameters(fixed_noise):
    X, Y, Yvar = _data()
    Yvar = Yvar if fixed_noise else None
    model = WiskiGP(X, Y, Yvar, **OPTIONS)
    _set_hyperparameters(model, fixed_noise)
    assert model.num_outputs == K and model.batch_shape == torch.Size([])
    assert model._input_batch_shape == torch.Size([]) and model._aug_batch_shape == (K,)
    singles = [_single(model, X, Y, Yvar, j) for j in range(K)]
    X_star = torch.rand(6, 2, dtype=DT)
    for observation_noise in (False, True):
        posterior = model.posterior(X_star, observation_noise=observation_noise)
        assert posterior.mean.shape == (6, K)
        covariance = posterior.distribution.covariance_matrix  # (6 K) x (6 K), by output
        for j, single in enumerate(singles):
            expected = single.posterior(X_star, observation_noise=observation_noise)
            torch.testing.assert_close(posterior.mean[:, j], expected.mean[:, 0], **TOL)
            block = covariance[6 * j : 6 * (j + 1), 6 * j : 6 * (j + 1)]
            torch.testing.assert_close(block, expected.distribution.covariance_matrix, **TOL)
    # The marginal likelihood: one value per output, with that output's priors.
    value, _ = model.fit_objective()
    for j, single in enumerate(singles):
        torch.testing.assert_close(value[j], single.fit_objective()[0], **TOL)
    # Updates, fantasies and BoTorch's training data are each output's too.
    X_new, Y_new, Yvar_new = _data(n=3, seed=1)
    model.observe(X_new, Y_new, Yvar_new if fixed_noise else None)
    X_f = torch.rand(2, 2, dtype=DT)
    Y_f = torch.randn(4, 2, K, dtype=DT)
    fantasy = model.condition_on_observations(X_f, Y_f)
    assert fantasy.batch_shape == torch.Size([4])
    posterior = fantasy.posterior(X_star)
    assert posterior.mean.shape == (4, 6, K)
    for j, single in enumerate(singles):
        single.observe(X_new, Y_new[:, j : j + 1], Yvar_new[:, j : j + 1] if fixed_noise else None)
        expected = single.condition_on_observations(X_f, Y_f[..., j : j + 1]).posterior(X_star)
        torch.testing.assert_close(posterior.mean[..., j], expected.mean[..., 0], **TOL)
        torch.testing.assert_close(posterior.variance[..., j], expected.variance[..., 0], **TOL)
        torch.testing.assert_close(model.train_targets[j], single.train_targets, **TOL)
        if fixed_noise:
            torch.testing.assert_close(model.likelihood.noise[j], single.likelihood.noise, **TOL)
    assert model.train_inputs[0].shape == (K, 27, 2)


def test_parameters_and_posteriors_are_single_task_gps():
    X, Y, _ = _data(n=30)
    X1 = X[:, :1]  # 1-D: a fine grid
    model = WiskiGP(X1, Y, grid_size=400)
    exact = SingleTaskGP(X1, Y)
    assert {k: v.shape for k, v in model.named_parameters()} == {
        k: v.shape for k, v in exact.named_parameters()
    }
    _set_hyperparameters(model)
    exact.load_state_dict(model.state_dict(), strict=False)
    exact.eval()
    X_star = torch.rand(3, 5, 1, dtype=DT)  # a batch of test sets
    for observation_noise in (False, True):
        a = model.posterior(X_star, observation_noise=observation_noise)
        b = exact.posterior(X_star, observation_noise=observation_noise)
        assert a.mean.shape == b.mean.shape == (3, 5, K)
        torch.testing.assert_close(a.mean, b.mean, rtol=0, atol=1e-3)
        torch.testing.assert_close(a.variance, b.variance, rtol=0, atol=1e-3)
    # BoTorch's layout of the training data.
    ours, theirs = model._transform_tensor_args(X1, Y), exact._transform_tensor_args(X1, Y)
    assert all(torch.equal(a, b) for a, b in zip(ours[:2], theirs[:2], strict=True))
    torch.testing.assert_close(model.train_inputs[0], exact.train_inputs[0], **TOL)
    torch.testing.assert_close(model.train_targets, exact.train_targets, **TOL)


def test_normalize_without_bounds_learns_them_once_for_every_output():
    # BoTorch's tutorials write Normalize(d): the bounds are learned from train_X, and the
    # outputs' shared grid covers the normalised data plus a margin.
    X, Y, _ = _data()
    X = 2.0 + 3.0 * X
    model = WiskiGP(X, Y, input_transform=Normalize(2), **OPTIONS)
    _set_hyperparameters(model)
    assert torch.allclose(model.train_inputs[0][0].amax(0), torch.ones(2, dtype=DT))
    X_star = 2.0 + 3.0 * torch.rand(5, 2, dtype=DT)
    posterior = model.posterior(X_star)
    for j in range(K):
        single = _single(model, X, Y, None, j, input_transform=Normalize(2))
        expected = single.posterior(X_star)
        torch.testing.assert_close(posterior.mean[:, j], expected.mean[:, 0], **TOL)
        torch.testing.assert_close(posterior.variance[:, j], expected.variance[:, 0], **TOL)


def test_batched_training_data_with_several_outputs():
    X, Y, _ = _data(n=16, batch=(2,))
    model = WiskiGP(X, Y, **OPTIONS)
    _set_hyperparameters(model)
    assert model.batch_shape == (2,) and model._aug_batch_shape == (2, K)
    X_star = torch.rand(5, 2, dtype=DT)
    posterior = model.posterior(X_star)
    assert posterior.mean.shape == (2, 5, K)
    for b in range(2):
        for j in range(K):
            expected = _single(model, X, Y, None, j, member=(b,)).posterior(X_star)
            torch.testing.assert_close(posterior.mean[b, :, j], expected.mean[:, 0], **TOL)
            torch.testing.assert_close(posterior.variance[b, :, j], expected.variance[:, 0], **TOL)
    with pytest.raises(RuntimeError, match="trailing batch dimensions of X"):
        model.posterior(torch.rand(3, 5, 2, dtype=DT))  # a batch of 3 against 2 members
    # One output of every member: a batch of single-output models.
    subset = model.subset_output([1])
    assert subset.batch_shape == (2,) and subset.num_outputs == 1
    part = subset.posterior(X_star)
    torch.testing.assert_close(part.mean, posterior.mean[..., [1]], **TOL)
    torch.testing.assert_close(part.variance, posterior.variance[..., [1]], **TOL)
    # A noise tensor of BoTorch's b x t x 1 layout: the same noise for every output of a
    # member, member by member (it once landed on the outputs' dimension).
    noise = torch.rand(2, 5, 1, dtype=DT)
    noisy = model.posterior(X_star, observation_noise=noise)
    scale = model.outcome_transform.stdvs.square()  # b x 1 x k
    torch.testing.assert_close(noisy.variance, posterior.variance + noise * scale, **TOL)
    model.observe(*_data(n=2, seed=3, batch=(2,))[:2])
    assert model.train_inputs[0].shape == (2, K, 18, 2)


def test_subset_output_and_output_indices_equal_the_chosen_outputs():
    X, Y, Yvar = _data()
    for noise in (None, Yvar):
        model = WiskiGP(X, Y, noise, **OPTIONS)
        _set_hyperparameters(model, fixed_noise=noise is not None)
        X_star = torch.rand(5, 2, dtype=DT)
        full = model.posterior(X_star, observation_noise=True)
        for idcs in ([1], [2, 0]):
            subset = model.subset_output(idcs)
            assert subset.num_outputs == len(idcs)
            part = subset.posterior(X_star, observation_noise=True)
            torch.testing.assert_close(part.mean, full.mean[..., idcs], **TOL)
            torch.testing.assert_close(part.variance, full.variance[..., idcs], **TOL)
        by_index = model.posterior(X_star, output_indices=[2])
        torch.testing.assert_close(by_index.mean, full.mean[..., [2]], **TOL)
    # A model's own tolerances go with its outputs.
    model.love_tolerance, model.LIKELIHOOD_TOLERANCE = 1e-6, 1e-7
    subset = model.subset_output([1])
    assert (subset.love_tolerance, subset.LIKELIHOOD_TOLERANCE) == (1e-6, 1e-7)
    frozen = WiskiGP(X, Y, keep_data=False, **OPTIONS)
    with pytest.raises(UnsupportedError, match="keep_data=False"):
        frozen.subset_output([0])


def test_fit_and_a_multi_objective_acquisition_run_through_botorch():
    X, Y, _ = _data(n=20)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    model = WiskiGP(X, Y[:, :2], input_transform=Normalize(2, bounds=bounds), **OPTIONS)
    before = model.covar_module.lengthscale.detach().clone()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    after = model.covar_module.lengthscale.detach()
    assert (after != before).flatten(1).any(-1).all()  # each output its own lengthscales
    assert not torch.allclose(after[0], after[1])
    acquisition = qLogNoisyExpectedHypervolumeImprovement(
        model,
        ref_point=[-2.0, 0.0],
        X_baseline=X,
        sampler=SobolQMCNormalSampler(torch.Size([16])),
    )
    assert acquisition(torch.rand(4, 2, 2, dtype=DT)).shape == (4,)


def test_checkpoints_round_trip_and_the_two_modes_are_not_mixed():
    X, Y, _ = _data()
    model = WiskiGP(X, Y, **OPTIONS)
    _set_hyperparameters(model)
    model.observe(*_data(n=2, seed=5)[:2])
    restored = WiskiGP(X[:4], Y[:4], **OPTIONS)
    restored.restore(model.checkpoint())
    X_star = torch.rand(5, 2, dtype=DT)
    a, b = model.posterior(X_star), restored.posterior(X_star)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
    shared = WiskiGP(X, Y, shared_hyperparameters=True, **OPTIONS)
    with pytest.raises(ValueError, match="shared_hyperparameters"):
        shared.restore(model.checkpoint())


def test_bad_options_are_refused_by_name():
    X, Y, _ = _data()
    with pytest.raises(TypeError, match="shared_hyperparameters"):
        WiskiGP(X, Y, shared_hyperparameters="no", **OPTIONS)
    with pytest.raises(ValueError, match="^data_space_limit: .*per-output hyperparameters"):
        WiskiGP(X, Y, data_space_limit=50, **OPTIONS)
    model = WiskiGP(X, Y, outcome_transform=Standardize(K), **OPTIONS)
    with pytest.raises(ValueError, match="idcs"):
        model.subset_output([K])
    with pytest.raises(ValueError, match="Y"):
        model.observe(X[:2], Y[:2, :2])
    assert model.num_train == 24
