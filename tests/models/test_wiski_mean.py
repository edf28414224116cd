"""WiskiGP with a learned constant prior mean (``mean_module=ConstantMean()``).

Oracle: a zero-mean WiskiGP on the targets minus the constant is the same GP, so the
marginal likelihood, the posterior variance and every update must agree with it, and the
posterior mean must differ by exactly the constant; the fitted constant must match
``SingleTaskGP``'s.
"""

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Standardize
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.means import ConstantMean, LinearMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from oracles import without_defaults

from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models import WiskiGP

DT = torch.float64
MEAN = 1.7


def _data(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, dtype=DT, generator=gen)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=DT, generator=gen)
    return X, Y


def _pair(X, Y, **options):
    """The model with a constant mean, and the zero-mean model of ``Y - MEAN``."""
    mean = ConstantMean().to(DT)
    mean.constant = torch.tensor(MEAN, dtype=DT)  # a float would pass through float32
    with_mean = WiskiGP(X, Y, grid_size=12, mean_module=mean, outcome_transform=None, **options)
    with_mean.likelihood.noise = 0.05  # well conditioned: the comparisons are to 1e-9
    shifted = WiskiGP(X, Y - MEAN, grid_size=12, **without_defaults(), **options)
    shifted.load_state_dict(
        {k: v for k, v in with_mean.state_dict().items() if not k.startswith("mean_module")},
        strict=False,
    )
    return with_mean, shifted


def _mll(model):
    model.train()
    value = WoodburyMarginalLogLikelihood(model.likelihood, model)()
    model.eval()
    return value


def _assert_same_gp(with_mean, shifted, test_X):
    a, b = with_mean.posterior(test_X), shifted.posterior(test_X)
    assert torch.allclose(a.mean, b.mean + MEAN, atol=1e-9)
    assert torch.allclose(a.variance, b.variance, atol=1e-9)


@pytest.mark.parametrize("data_space_limit", [None, 0], ids=["data space", "grid space"])
def test_constant_mean_is_the_shift_of_the_targets(data_space_limit):
    X, Y = _data(40)
    with_mean, shifted = _pair(X, Y, data_space_limit=data_space_limit)
    assert torch.allclose(_mll(with_mean), _mll(shifted), atol=1e-10)
    test_X = torch.rand(7, 2, dtype=DT)
    _assert_same_gp(with_mean, shifted, test_X)
    # Updates: observe (the root update), then a fantasy batch conditioned on both.
    X_new, Y_new = _data(3, seed=1)
    with_mean.observe(X_new, Y_new)
    shifted.observe(X_new, Y_new - MEAN)
    _assert_same_gp(with_mean, shifted, test_X)
    assert torch.allclose(_mll(with_mean), _mll(shifted), atol=1e-10)
    X_q = torch.rand(2, 2, dtype=DT)
    Y_q = torch.randn(4, 2, 1, dtype=DT)
    fantasy = with_mean.condition_on_observations(X_q, Y_q)
    fantasy_shifted = shifted.condition_on_observations(X_q, Y_q - MEAN)
    _assert_same_gp(fantasy, fantasy_shifted, test_X)


def test_constant_mean_gradient_matches_finite_differences():
    X, Y = _data(30)
    with_mean, _ = _pair(X, Y)
    mean = with_mean.mean_module
    with_mean.train()
    value = WoodburyMarginalLogLikelihood(with_mean.likelihood, with_mean)()
    (grad,) = torch.autograd.grad(value, mean.raw_constant)
    step = 1e-5
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            mean.constant = torch.tensor(MEAN + sign * step, dtype=DT)
        values.append(WoodburyMarginalLogLikelihood(with_mean.likelihood, with_mean)().detach())
    assert torch.allclose(grad, (values[0] - values[1]) / (2 * step), rtol=1e-6)


def test_fitted_constant_matches_single_task_gp():
    X, Y = _data(120, seed=2)
    Y = Y + 3 * (X[:, :1] > 0.5)  # a step: the data's mean is not the GP's constant
    wiski = WiskiGP(
        X, Y, grid_size=48, mean_module=ConstantMean(), outcome_transform=Standardize(1)
    )
    exact = SingleTaskGP(X, Y, outcome_transform=Standardize(1))
    wiski_mll = WoodburyMarginalLogLikelihood(wiski.likelihood, wiski)
    exact_mll = ExactMarginalLogLikelihood(exact.likelihood, exact)
    fit_gpytorch_mll(wiski_mll)
    fit_gpytorch_mll(exact_mll)
    assert abs(wiski.mean_module.constant.item()) > 0.1  # learned, not left at zero
    # The objectives agree at SingleTaskGP's optimum, hyperpriors included (to SKI's
    # error, 5e-5 per datum here; a prior counted twice is 7e-4 off) ...
    hyperparameters = {k: v for k, v in exact.state_dict().items() if k in _HYPERPARAMETERS}
    wiski.load_state_dict(hyperparameters, strict=False)
    wiski.train()
    exact.train()
    values = [
        mll(m(*m.train_inputs), m.train_targets)
        for m, mll in ((wiski, wiski_mll), (exact, exact_mll))
    ]
    assert abs(values[0].item() - values[1].item()) < 2e-4
    # ... and that optimum is WISKI's too: its fit started there stays there (a fit from
    # the defaults may stop at another local optimum of this flat likelihood).
    fit_gpytorch_mll(wiski_mll)
    assert abs(wiski.mean_module.constant.item() - exact.mean_module.constant.item()) < 0.02
    # The lengthscales agree to the SKI error at the short one (0.09 on a 48-point grid).
    lengthscale = wiski.covar_module.lengthscale
    assert torch.allclose(lengthscale, exact.covar_module.lengthscale, rtol=0.1)


#: SingleTaskGP's hyperparameters that a WiskiGP with the same modules holds.
_HYPERPARAMETERS = (
    "mean_module.raw_constant",
    "covar_module.raw_lengthscale",
    "likelihood.noise_covar.raw_noise",
)


def test_restandardize_carries_the_constant_mean():
    # With the outputscale and the noise rescaled too, re-standardising changes nothing.
    X, Y = _data(50)
    mean = ConstantMean().to(DT)
    mean.constant = torch.tensor(0.4, dtype=DT)
    model = WiskiGP(
        X[:5],
        Y[:5] + 2,
        grid_size=12,
        mean_module=mean,
        covar_module=ScaleKernel(RBFKernel()),
        outcome_transform=Standardize(1),
    )
    model.observe(X[5:], Y[5:] + 2)
    test_X = torch.rand(6, 2, dtype=DT)
    before = model.posterior(test_X)
    before_mean, before_variance = before.mean, before.variance
    model.restandardize()
    after = model.posterior(test_X)
    assert torch.allclose(after.mean, before_mean, atol=1e-9)
    assert torch.allclose(after.variance, before_variance, atol=1e-9)


def test_checkpoint_keeps_the_constant_mean():
    X, Y = _data(20)
    with_mean, _ = _pair(X, Y)
    fresh = WiskiGP(X[:2], Y[:2], grid_size=12, outcome_transform=None)
    fresh.restore(with_mean.checkpoint())
    assert fresh.mean_module.constant.item() == pytest.approx(MEAN)
    test_X = torch.rand(4, 2, dtype=DT)
    assert torch.allclose(fresh.posterior(test_X).mean, with_mean.posterior(test_X).mean)


def test_defaults_are_single_task_gps_and_zero_mean_is_the_old_model():
    X, Y = _data(30)
    model = WiskiGP(X, 50 + Y, grid_size=12)
    assert isinstance(model.outcome_transform, Standardize)
    assert isinstance(model.mean_module, ConstantMean)
    assert "mean_module.raw_constant" in model.state_dict()
    multi = WiskiGP(X, torch.cat([Y, 2 * Y], -1), grid_size=12)
    assert multi.mean_module.constant.shape == (2,)  # one constant per output
    zero = WiskiGP(X, Y, grid_size=12, mean_module=ZeroMean(), outcome_transform=None)
    constant = WiskiGP(X, Y, grid_size=12, outcome_transform=None)
    constant.mean_module.constant = 0.0
    test_X = torch.rand(5, 2, dtype=DT)
    torch.testing.assert_close(zero.posterior(test_X).mean, constant.posterior(test_X).mean)
    assert not any(k.startswith("mean_module") for k in zero.state_dict())


def test_mean_module_is_validated():
    X, Y = _data(10)
    with pytest.raises(ValueError, match="mean_module"):
        WiskiGP(X, Y, grid_size=8, mean_module=LinearMean(2))
    with pytest.raises(ValueError, match="mean_module"):
        WiskiGP(
            X,
            torch.cat([Y, Y], -1),
            grid_size=8,
            mean_module=ConstantMean(batch_shape=torch.Size([3])),
        )
