"""LocalGP against exact GPs (BoTorch's SingleTaskGP) on the data of each local model."""

from __future__ import annotations

import io
import math

import pytest
import torch
from botorch.acquisition import qUpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Standardize
from botorch.optim import optimize_acqf
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.models import LocalGP

DT = torch.float64


def _data(n: int, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, dtype=DT, generator=gen)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=DT, generator=gen)
    return X, Y


def _modules(lengthscale: float = 0.3):
    kernel = ScaleKernel(RBFKernel())
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = 1.7
    likelihood = GaussianLikelihood()
    likelihood.noise = 0.05
    mean = ConstantMean()
    mean.constant.data.fill_(0.3)
    return {"covar_module": kernel, "likelihood": likelihood, "mean_module": mean}


def _exact(X: torch.Tensor, Y: torch.Tensor, modules: dict) -> SingleTaskGP:
    """Exact GP with the same (shared) hyperparameter modules."""
    model = SingleTaskGP(X, Y, outcome_transform=None, **modules)
    model.eval()
    return model


def _local_data(local: LocalGP, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Local model k's data as an exact GP's (n x d, n x 1) training set."""
    X_k, y_k = local.local_data(k)
    return X_k, y_k.unsqueeze(-1)


def _joint(posterior):
    return posterior.mean.squeeze(-1), posterior.distribution.covariance_matrix


def test_single_local_model_equals_exact_gp():
    X, Y = _data(40)
    modules = _modules()
    X_test = torch.rand(3, 4, 2, dtype=DT)
    local = LocalGP(X[:25], Y[:25], w_gen=0.0, n_max=64, outcome_transform=None, **modules)
    local.observe(X[25:], Y[25:])
    assert local.num_local_models == 1 and int(local.counts[0]) == 40
    exact = _exact(X, Y, modules)
    with torch.no_grad():
        for noise in (False, True):
            mean, cov = _joint(local.posterior(X_test, observation_noise=noise))
            mean_ref, cov_ref = _joint(exact.posterior(X_test, observation_noise=noise))
            assert torch.allclose(mean, mean_ref, atol=1e-10)
            assert torch.allclose(cov, cov_ref, atol=1e-10)
        K = modules["covar_module"](X).to_dense() + 0.05 * torch.eye(40, dtype=DT)
        reference = torch.distributions.MultivariateNormal(torch.full((40,), 0.3, dtype=DT), K)
        assert torch.allclose(local.log_marginal_likelihood(), reference.log_prob(Y.squeeze(-1)))


def test_n_max_respected_oldest_points_dropped():
    X, Y = _data(30, d=1)
    modules = _modules()
    local = LocalGP(X[:5], Y[:5], w_gen=0.0, n_max=10, outcome_transform=None, **modules)
    for start in range(5, 30, 5):
        local.observe(X[start : start + 5], Y[start : start + 5])
    assert local.num_local_models == 1 and int(local.counts[0]) == 10
    X_k, y_k = local.local_data(0)
    assert torch.equal(X_k, X[-10:]) and torch.equal(y_k, Y[-10:].squeeze(-1))
    assert torch.allclose(local.centres[0], X[-10:].mean(0))
    # The local model is the exact GP on the points it holds.
    X_test = torch.rand(5, 1, dtype=DT)
    with torch.no_grad():
        mean, cov = _joint(local.posterior(X_test))
        mean_ref, cov_ref = _joint(_exact(X[-10:], Y[-10:], modules).posterior(X_test))
    assert torch.allclose(mean, mean_ref, atol=1e-10) and torch.allclose(cov, cov_ref, atol=1e-10)


def _two_region_model(num_nearest: int):
    modules = _modules(lengthscale=0.1)
    X = torch.tensor([[0.0], [0.05], [1.0], [0.95], [0.02], [1.02]], dtype=DT)
    Y = torch.sin(3 * X)
    local = LocalGP(
        X, Y, w_gen=0.5, n_max=10, num_nearest=num_nearest, outcome_transform=None, **modules
    )
    return local, modules, X, Y


def test_distant_points_start_new_local_models():
    local, modules, X, Y = _two_region_model(num_nearest=1)
    assert local.num_local_models == 2
    X_0, _ = local.local_data(0)
    X_1, _ = local.local_data(1)
    assert torch.equal(X_0, X[[0, 1, 4]]) and torch.equal(X_1, X[[2, 3, 5]])
    # With M = 1 a point near the first region is predicted by its local GP alone.
    X_test = torch.tensor([[0.03], [0.1]], dtype=DT)
    with torch.no_grad():
        mean, cov = _joint(local.posterior(X_test))
        mean_ref, cov_ref = _joint(_exact(X[[0, 1, 4]], Y[[0, 1, 4]], modules).posterior(X_test))
    assert torch.allclose(mean, mean_ref, atol=1e-10) and torch.allclose(cov, cov_ref, atol=1e-10)


def test_weighted_prediction_matches_documented_formula():
    local, modules, X, Y = _two_region_model(num_nearest=2)
    X_test = torch.tensor([[0.3], [0.5], [0.8]], dtype=DT)
    experts = [_exact(X[idx], Y[idx], modules) for idx in ([0, 1, 4], [2, 3, 5])]
    centres = torch.stack([X[[0, 1, 4]].mean(0), X[[2, 3, 5]].mean(0)])
    kernel = modules["covar_module"]
    with torch.no_grad():
        mean, cov = _joint(local.posterior(X_test))
        w = kernel(X_test, centres).to_dense() / kernel.outputscale  # RBF correlation
        v = w / w.sum(-1, keepdim=True)
        means, covs = zip(*(_joint(e.posterior(X_test)) for e in experts), strict=True)
    mean_ref = sum(v[:, k] * means[k] for k in range(2))
    cov_ref = sum(torch.outer(v[:, k].sqrt(), v[:, k].sqrt()) * covs[k] for k in range(2))
    assert torch.allclose(mean, mean_ref, atol=1e-10)
    assert torch.allclose(cov, cov_ref, atol=1e-10)
    assert torch.linalg.eigvalsh(cov).min() > -1e-12


def test_top_m_experts_joint_posterior_matches_formula_with_many_local_models():
    # K > M, so test points share all, some or none of their M local models.
    X, Y = _data(80, d=1, seed=3)
    modules = _modules(lengthscale=0.1)
    local = LocalGP(X, Y, w_gen=0.8, n_max=30, num_nearest=2, outcome_transform=None, **modules)
    K = local.num_local_models
    assert K > 3
    X_test = torch.linspace(-0.1, 1.1, 9, dtype=DT).unsqueeze(-1)
    kernel = modules["covar_module"]
    with torch.no_grad():
        mean, cov = _joint(local.posterior(X_test))
        w = kernel(X_test, local.centres).to_dense() / kernel.outputscale
        top = w.topk(2, dim=-1)
        v = torch.zeros_like(w).scatter(-1, top.indices, top.values / top.values.sum(-1, True))
        experts = [_exact(*_local_data(local, k), modules) for k in range(K)]
        means, covs = zip(*(_joint(e.posterior(X_test)) for e in experts), strict=True)
    assert (v > 0).sum(-1).eq(2).all() and (v > 0).any(0).sum() > 2
    mean_ref = sum(v[:, k] * means[k] for k in range(K))
    cov_ref = sum(torch.outer(v[:, k].sqrt(), v[:, k].sqrt()) * covs[k] for k in range(K))
    assert torch.allclose(mean, mean_ref, atol=1e-10)
    assert torch.allclose(cov, cov_ref, atol=1e-10)


def test_posterior_batches_and_acquisition():
    X, Y = _data(60, d=2)
    local = LocalGP(
        X,
        Y,
        w_gen=0.6,
        n_max=15,
        num_nearest=2,
        outcome_transform=None,
        **_modules(lengthscale=0.2),
    )
    assert local.num_local_models > 2 and int(local.counts.max()) <= 15
    with torch.no_grad():
        posterior = local.posterior(torch.rand(4, 3, 5, 2, dtype=DT))
    assert posterior.mean.shape == (4, 3, 5, 1)
    cov = posterior.distribution.covariance_matrix
    assert torch.linalg.eigvalsh(cov).min() > -1e-10
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    candidate, value = optimize_acqf(
        qUpperConfidenceBound(local, beta=2.0),
        bounds,
        q=2,
        num_restarts=2,
        raw_samples=16,
        options={"maxiter": 5},
    )
    assert candidate.shape == (2, 2) and torch.isfinite(value)


def test_empty_model_predicts_prior_and_transforms():
    from botorch.models.transforms import Normalize, Standardize

    X, Y = _data(20, d=1)
    empty = LocalGP(X[:0], Y[:0], **_modules())
    with torch.no_grad():
        posterior = empty.posterior(X[:3])
    assert torch.allclose(posterior.mean, torch.full((3, 1), 0.3, dtype=DT))
    # Frozen transforms: same as a model on manually transformed data.
    Y_raw = 5 * Y + 2
    bounds = torch.tensor([[0.0], [10.0]], dtype=DT)
    scaled = LocalGP(
        10 * X[:12],
        Y_raw[:12],
        w_gen=0.5,
        n_max=8,
        input_transform=Normalize(1, bounds=bounds),
        outcome_transform=Standardize(1),
        **_modules(),
    )
    scaled.observe(10 * X[12:], Y_raw[12:])
    mu, sd = Y_raw[:12].mean(), Y_raw[:12].std()
    plain = LocalGP(
        X[:12], (Y_raw[:12] - mu) / sd, w_gen=0.5, n_max=8, outcome_transform=None, **_modules()
    )
    plain.observe(X[12:], (Y_raw[12:] - mu) / sd)
    X_test = torch.rand(2, 3, 1, dtype=DT)
    with torch.no_grad():
        a, b = scaled.posterior(10 * X_test), plain.posterior(X_test)
    assert torch.allclose(a.mean, b.mean * sd + mu, atol=1e-10)
    assert torch.allclose(a.variance, b.variance * sd**2, atol=1e-10)


def test_bad_inputs_raise_and_leave_model_unchanged():
    X, Y = _data(10)
    local = LocalGP(X, Y, w_gen=0.3, **_modules())
    state = {k: v.clone() for k, v in local.state_dict().items()}
    X_new, Y_new = torch.rand(3, 2, dtype=DT), torch.rand(3, 1, dtype=DT)
    bad = [
        ((X_new.clone().fill_(math.nan), Y_new), ValueError, "X contains NaN"),
        ((X_new, Y_new.clone().fill_(math.inf)), ValueError, "Y contains NaN or Inf"),
        ((X_new.float(), Y_new), TypeError, "X has dtype"),
        ((X_new, Y_new[:2]), ValueError, "Y has 2 rows"),
        ((torch.rand(3, 3, dtype=DT), Y_new), ValueError, "X must have last dimension 2"),
        ((X_new[None], Y_new), ValueError, "X must have shape q x d"),
        ((X_new, Y_new, torch.ones_like(Y_new)), ValueError, "Yvar must be None: LocalGP"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            local.observe(*args)
    with pytest.raises(ValueError, match="X contains NaN"):
        local.posterior(X_new.clone().fill_(math.nan))
    new_state = local.state_dict()
    assert state.keys() == new_state.keys()
    assert all(torch.equal(state[k], new_state[k]) for k in state)
    for kwargs, message in [
        ({"w_gen": 1.0}, "w_gen"),
        ({"n_max": 0}, "n_max"),
        ({"num_nearest": 1.5}, "num_nearest"),
    ]:
        with pytest.raises(ValueError, match=message):
            LocalGP(X, Y, **kwargs)
    with pytest.raises(TypeError, match="likelihood must be"):
        LocalGP(X, Y, likelihood=torch.nn.Module())


def test_pickle_drops_factor_cache_and_predicts_the_same():
    X, Y = _data(300, d=2)
    local = LocalGP(X, Y, w_gen=0.9, n_max=64, **_modules(lengthscale=0.1))
    X_test = torch.rand(5, 2, dtype=DT)
    with torch.no_grad():
        before = _joint(local.posterior(X_test))
    assert local._factors is not None  # cached by the prediction
    buffer = io.BytesIO()
    torch.save(local, buffer)
    factor_bytes = sum(t.numel() * t.element_size() for t in local._factors)
    assert buffer.tell() < factor_bytes  # the K x n_max x n_max cache is not written
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=False)
    assert restored._factors is None and local._factors is not None
    with torch.no_grad():
        after = _joint(restored.posterior(X_test))
    for a, b in zip(before, after, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


# ------------------------------------------------------- defaults and the prior mean
def test_defaults_are_standardize_and_a_constant_mean_learned_by_fit_gpytorch_mll():
    X, Y = _data(60, d=1)
    model = LocalGP(X, 100 + 10 * Y, w_gen=0.3, n_max=30)
    assert isinstance(model.outcome_transform, Standardize)
    assert type(model.mean_module) is ConstantMean
    far = torch.full((1, 1), 20.0, dtype=DT)
    with torch.no_grad():
        assert abs(model.posterior(far).mean.item() - (100 + 10 * Y).mean().item()) < 1e-6
    zero = LocalGP(X, 100 + 10 * Y, outcome_transform=None, mean_module=ZeroMean())
    assert not hasattr(zero, "outcome_transform")
    assert not any("mean_module" in name for name, _ in zero.named_parameters())
    with torch.no_grad():
        assert abs(zero.posterior(far).mean.item()) < 1e-6
    # The constant is a hyperparameter of the local marginal likelihoods.
    raw = LocalGP(X, Y + 5.0, w_gen=0.3, n_max=30, outcome_transform=None)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(raw.likelihood, raw))
    assert abs(raw.mean_module.constant.item() - 5.0) < 0.5
    with torch.no_grad():
        assert (raw.posterior(X).mean - (Y + 5.0)).abs().max() < 0.5


def test_no_conditioning_and_an_empty_posterior():
    # (issue 37: AttributeError 'get_fantasy_model', and torch.cat of nothing)
    X, Y = _data(20)
    local = LocalGP(X, Y, w_gen=0.5, n_max=8)
    with pytest.raises(NotImplementedError, match="LocalGP has no condition_on_observations"):
        local.condition_on_observations(X[:2], Y[:2])
    posterior = local.posterior(X[:0])
    assert posterior.mean.shape == (0, 1) and posterior.variance.shape == (0, 1)


def test_fantasize_is_refused_with_the_same_message():
    # qKnowledgeGradient / qNegIntegratedPosteriorVariance call fantasize directly.
    X, Y = _data(20)
    local = LocalGP(X, Y, w_gen=0.5, n_max=8)
    with pytest.raises(NotImplementedError, match="LocalGP has no condition_on_observations"):
        local.fantasize(X[:2])


def test_joint_posterior_gradients_are_finite_where_an_expert_weight_underflows():
    # Two far-apart experts and a short lengthscale: near one of them the other's weight
    # underflows to exactly 0, where sqrt's slope is infinite (NaN in q > 1 gradients).
    local, _, _, _ = _two_region_model(num_nearest=2)
    local.covar_module.base_kernel.lengthscale = 0.02
    local.eval()
    X_q = torch.tensor([[0.05], [0.06]], dtype=DT, requires_grad=True)
    covariance = local.posterior(X_q).mvn.covariance_matrix
    (gradient,) = torch.autograd.grad(covariance.sum(), X_q)
    assert gradient.isfinite().all()
    # ... and it is the true gradient (here only the near expert contributes).
    assert torch.autograd.gradcheck(
        lambda X: local.posterior(X).mvn.covariance_matrix, (X_q.detach().clone().requires_grad_(),)
    )
