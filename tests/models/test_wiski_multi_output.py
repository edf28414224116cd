r"""Multi-output WiskiGP with shared hyperparameters (``shared_hyperparameters=True``):
``k`` outputs sharing the rows equal ``k`` single-output models.

(The default, outputs with their own hyperparameters as batch members, is tested in
``test_wiski_output_members.py``.) The oracle is ``k`` single-output ``WiskiGP``s with
the same hyperparameters, each built and updated on one column: every posterior,
likelihood, gradient, update and fantasy of the multi-output model must equal theirs
(1e-10, float64), whatever space (data or grid) the model is in.
"""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.settings import fast_pred_var

from streamgp import WiskiGP

DT = torch.float64
K = 3
BOUNDS = torch.tensor([[-1.0, 0.0], [2.0, 3.0]], dtype=DT)


def targets(X: torch.Tensor, noise: float = 0.05) -> torch.Tensor:
    Y = torch.stack(
        [torch.sin(2 * X).sum(-1), torch.cos(X[..., 0]) * X[..., 1], 3.0 * X.sum(-1) + 1.0], -1
    )
    return Y + noise * torch.randn(Y.shape, dtype=DT)


def inputs(n: int) -> torch.Tensor:
    return BOUNDS[0] + (BOUNDS[1] - BOUNDS[0]) * torch.rand(n, 2, dtype=DT)


def build(X, Y, Yvar=None, **kwargs):
    # Known noise needs one variance per row for all outputs after the transform, so
    # the fixed-noise models keep the targets unscaled.
    tf = {"input_transform": Normalize(2, bounds=BOUNDS)}
    tf["outcome_transform"] = Standardize(Y.shape[-1]) if Yvar is None else None
    multi = WiskiGP(X, Y, Yvar, grid_size=12, shared_hyperparameters=True, **tf, **kwargs)
    singles = []
    for j in range(Y.shape[-1]):
        tf = {"input_transform": Normalize(2, bounds=BOUNDS)}
        tf["outcome_transform"] = Standardize(1) if Yvar is None else None
        column = None if Yvar is None else Yvar[:, j : j + 1]
        singles.append(WiskiGP(X, Y[:, j : j + 1], column, grid_size=12, **tf, **kwargs))
    return multi, singles


#: Each output's learned constant prior mean (SingleTaskGP's default, one per output).
CONSTANTS = torch.tensor([0.4, -0.7, 1.1], dtype=DT)


def set_hyperparameters(multi, *singles):
    r"""Shared kernel and noise; output ``j``'s constant mean in ``multi`` and ``singles[j]``."""
    constants = CONSTANTS[: multi.num_outputs]
    for model in (multi, *singles):
        model.covar_module.lengthscale = torch.tensor([[0.3, 0.45]], dtype=DT)
        if not model.fixed_noise:
            model.likelihood.noise = torch.tensor([0.02], dtype=DT)
    multi.mean_module.constant = constants
    for constant, single in zip(constants[: len(singles)], singles, strict=True):
        single.mean_module.constant = constant


def assert_same_posteriors(multi, singles, X, batch=()):
    posterior = multi.posterior(X)
    assert posterior.mean.shape == torch.Size([*batch, X.shape[-2], len(singles)])
    q = X.shape[-2]
    covariance = posterior.distribution.covariance_matrix  # (batch) x kq x kq, output-major
    for j, single in enumerate(singles):
        expected = single.posterior(X)
        torch.testing.assert_close(
            posterior.mean[..., j], expected.mean[..., 0], rtol=0, atol=1e-10
        )
        torch.testing.assert_close(
            posterior.variance[..., j], expected.variance[..., 0], rtol=0, atol=1e-10
        )
        block = covariance[..., j * q : (j + 1) * q, j * q : (j + 1) * q]
        torch.testing.assert_close(
            block, expected.distribution.covariance_matrix, rtol=0, atol=1e-10
        )


@pytest.mark.parametrize("n, limit", [(40, None), (300, 0)], ids=["data space", "grid space"])
def test_posterior_likelihood_and_gradients_equal_single_output_models(n, limit):
    torch.manual_seed(0)
    X = inputs(n)
    multi, singles = build(X, targets(X), data_space_limit=limit)
    set_hyperparameters(multi, *singles)
    assert multi.num_outputs == K and multi.batch_shape == torch.Size([])
    assert multi.in_data_space == (limit is None)
    assert_same_posteriors(multi, singles, inputs(9))
    assert_same_posteriors(multi, singles, inputs(12).reshape(4, 3, 2), batch=(4,))

    value, count = multi.fit_objective()
    grads = torch.autograd.grad(value, multi.covar_module.raw_lengthscale)[0]
    expected_value = 0.0
    expected_grads = torch.zeros_like(grads)
    for single in singles:
        v, _ = single.fit_objective()
        expected_grads += torch.autograd.grad(v, single.covar_module.raw_lengthscale)[0]
        expected_value += v
    assert count == n
    torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("q", [1, 4, 60], ids=["deferred", "held rank", "root update"])
def test_observe_equals_single_output_models_across_the_switch(q):
    torch.manual_seed(1)
    X = inputs(30)
    multi, singles = build(X, targets(X), data_space_limit=60)
    set_hyperparameters(multi, *singles)
    test_X = inputs(8)
    multi.posterior(test_X)  # factorise first, so observe updates the cached posterior
    for single in singles:
        single.posterior(test_X)
    for _ in range(4):
        X_new = inputs(q)
        Y_new = targets(X_new)
        multi.observe(X_new, Y_new)
        for j, single in enumerate(singles):
            single.observe(X_new, Y_new[:, j : j + 1])
        assert_same_posteriors(multi, singles, test_X)
    assert multi.num_train == 30 + 4 * q
    assert multi.in_data_space == (30 + 4 * q <= 60)
    torch.testing.assert_close(
        multi.fit_objective()[0], sum(s.fit_objective()[0] for s in singles), rtol=1e-12, atol=0
    )


@pytest.mark.parametrize("n, limit", [(40, None), (300, 0)], ids=["data space", "grid space"])
def test_fantasies_equal_single_output_models(n, limit):
    torch.manual_seed(2)
    X = inputs(n)
    multi, singles = build(X, targets(X), data_space_limit=limit)
    set_hyperparameters(multi, *singles)
    X_c = inputs(8).reshape(4, 2, 2)
    Y_c = torch.randn(5, 4, 2, K, dtype=DT)
    conditioned = multi.condition_on_observations(X_c, Y_c)
    assert conditioned.batch_shape == torch.Size([5, 4])
    expected = [
        s.condition_on_observations(X_c, Y_c[..., j : j + 1]) for j, s in enumerate(singles)
    ]
    assert_same_posteriors(conditioned, expected, inputs(12).reshape(4, 3, 2), batch=(5, 4))

    # fantasize: BoTorch's sampler, the same base samples for every output's model
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([3]), seed=0)
    fantasy = multi.fantasize(inputs(2), sampler)
    assert fantasy.batch_shape == torch.Size([3]) and fantasy.num_outputs == K
    assert fantasy.posterior(inputs(5)).mean.shape == torch.Size([3, 5, K])


def test_subset_output_and_output_indices_equal_the_single_output_model():
    torch.manual_seed(3)
    X = inputs(300)
    multi, singles = build(X, targets(X), data_space_limit=0)
    set_hyperparameters(multi, *singles)
    X_held = inputs(2)
    multi.posterior(X_held)
    multi.observe(X_held, targets(X_held))  # held as a low-rank correction (deferred)
    test_X = inputs(6)
    pairs = multi.subset_output([2, 0])
    assert pairs.num_outputs == 2
    full = multi.posterior(test_X)
    sub = pairs.posterior(test_X)
    torch.testing.assert_close(sub.mean, full.mean[..., [2, 0]], rtol=0, atol=1e-12)
    torch.testing.assert_close(sub.variance, full.variance[..., [2, 0]], rtol=0, atol=1e-12)
    one = multi.subset_output([1])
    assert one.num_outputs == 1
    torch.testing.assert_close(one.posterior(test_X).mean, full.mean[..., [1]], rtol=0, atol=1e-12)
    by_index = multi.posterior(test_X, output_indices=[1])
    torch.testing.assert_close(by_index.mean, full.mean[..., [1]], rtol=0, atol=1e-12)
    # the subset keeps streaming, and its parent is untouched
    X_new = inputs(3)
    one.observe(X_new, targets(X_new)[:, 1:2])
    assert one.num_train == 305 and multi.num_train == 302
    with pytest.raises(ValueError, match="idcs"):
        multi.subset_output([3])


def test_in_a_model_list_with_a_single_output_model():
    """BoTorch's ModelListGP stacks a multitask and a plain posterior (and moves the
    covariance with ``to``): it equals the separate posteriors."""
    torch.manual_seed(8)
    X = inputs(40)
    multi, singles = build(X, targets(X))
    set_hyperparameters(multi, *singles)
    model_list = ModelListGP(multi.subset_output([0, 1]), singles[2])
    test_X = inputs(5)
    posterior = model_list.posterior(test_X)
    assert posterior.mean.shape == torch.Size([5, K])
    for j, single in enumerate(singles):
        expected = single.posterior(test_X)
        torch.testing.assert_close(
            posterior.mean[..., j], expected.mean[..., 0], atol=1e-10, rtol=0
        )
        torch.testing.assert_close(
            posterior.variance[..., j], expected.variance[..., 0], atol=1e-10, rtol=0
        )


def test_fixed_noise_shared_by_the_outputs():
    torch.manual_seed(4)
    X = inputs(50)
    Y = targets(X)
    Yvar = torch.full_like(Y, 0.01)
    Yvar[:10] = 0.05
    multi, singles = build(X, Y, Yvar)
    set_hyperparameters(multi, *singles)
    assert_same_posteriors(multi, singles, inputs(7))
    X_new = inputs(3)
    Y_new = targets(X_new)
    multi.observe(X_new, Y_new, torch.full_like(Y_new, 0.02))
    for j, single in enumerate(singles):
        single.observe(X_new, Y_new[:, j : j + 1], torch.full((3, 1), 0.02, dtype=DT))
    assert_same_posteriors(multi, singles, inputs(7))

    different = Yvar.clone()
    different[0, 1] = 0.3
    with pytest.raises(ValueError, match="train_Yvar differs between outputs"):
        WiskiGP(
            X,
            Y,
            different,
            grid_size=12,
            input_transform=Normalize(2, bounds=BOUNDS),
            shared_hyperparameters=True,
        )
    with pytest.raises(ValueError, match="Yvar differs between outputs"):
        multi.observe(X_new, Y_new, torch.rand_like(Y_new) + 0.01)
    assert multi.num_train == 53


def test_bad_input_names_the_argument_and_leaves_the_model_unchanged():
    torch.manual_seed(5)
    X = inputs(30)
    multi, _ = build(X, targets(X))
    test_X = inputs(4)
    before = multi.posterior(test_X).mean
    with pytest.raises(ValueError, match="Y must have shape n x 3"):
        multi.observe(inputs(2), torch.rand(2, 1, dtype=DT))
    with pytest.raises(ValueError, match="Y"):
        multi.condition_on_observations(inputs(2), torch.rand(2, 2, dtype=DT))
    assert multi.num_train == 30
    torch.testing.assert_close(multi.posterior(test_X).mean, before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="dense grid"):
        WiskiGP(
            torch.rand(5, 3, dtype=DT),
            torch.rand(5, 2, dtype=DT),
            grid_size=20,
            shared_hyperparameters=True,
        )
    with pytest.raises(ValueError, match="restandardize needs a single-output model"):
        multi.restandardize()


def test_love_variances_and_state_round_trip():
    torch.manual_seed(6)
    X = inputs(300)
    multi, _ = build(X, targets(X), data_space_limit=0)
    set_hyperparameters(multi)
    test_X = inputs(20)
    exact = multi.posterior(test_X)
    with fast_pred_var():
        love = multi.posterior(test_X)
    torch.testing.assert_close(love.mean, exact.mean, rtol=0, atol=1e-10)
    assert (exact.variance - love.variance).min() >= -1e-12
    torch.testing.assert_close(love.variance, exact.variance, rtol=0, atol=1e-6)

    restored, _ = build(X[:10], targets(X[:10]))
    restored.restore(multi.checkpoint())
    assert restored.num_train == 300
    torch.testing.assert_close(restored.posterior(test_X).mean, exact.mean, rtol=0, atol=0)


def test_fit_and_a_multi_objective_acquisition_run_through_botorch():
    torch.manual_seed(7)
    X = inputs(20)
    Y = targets(X)[:, :2]
    model = WiskiGP(
        X,
        Y,
        grid_size=12,
        input_transform=Normalize(2, bounds=BOUNDS),
        outcome_transform=Standardize(2),
        shared_hyperparameters=True,
    )
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    before = model.fit_objective()[0].item()
    fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 30}})
    assert model.fit_objective()[0].item() > before
    for _ in range(2):
        acqf = qLogNoisyExpectedHypervolumeImprovement(
            model=model,
            ref_point=Y.min(0).values.tolist(),
            X_baseline=X,
            sampler=SobolQMCNormalSampler(sample_shape=torch.Size([16]), seed=0),
            prune_baseline=True,
        )
        candidate, _ = optimize_acqf(
            acqf, bounds=BOUNDS, q=2, num_restarts=2, raw_samples=32, options={"maxiter": 10}
        )
        model.observe(candidate, targets(candidate)[:, :2])
        X = torch.cat([X, candidate])
    assert model.num_train == 24
