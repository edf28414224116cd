"""OnlineSGPR against dense oracles: exact GP, batch SGPR, Bui et al.'s bound, q(u) updates."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import qKnowledgeGradient, qNegIntegratedPosteriorVariance
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, LinearMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from oracles.sgpr import DenseQuModel, bui_bound, jittered, log_normal, rel_err, titsias

from streamgp.inducing import InducingPointSelector, OnlineInducingPointSelector
from streamgp.mlls import OnlineSGPRBound
from streamgp.models import OnlineSGPR

DTYPE = torch.float64
JITTER = 1e-10


def make_data(n: int, d: int = 2, dtype=DTYPE):
    X = torch.rand(n, d, dtype=dtype)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=dtype)
    return X, Y


def scaled_kernel(d: int, kind: str = "rbf"):
    base = RBFKernel(ard_num_dims=d) if kind == "rbf" else MaternKernel(2.5, ard_num_dims=d)
    kernel = ScaleKernel(base).to(DTYPE)
    kernel.outputscale = 1.3
    base.lengthscale = torch.linspace(0.2, 0.4, d, dtype=DTYPE)
    return kernel


def make_model(X, Y, Z=None, d: int = 2, kernel=None, **kwargs) -> OnlineSGPR:
    """A model with fixed hyperparameters; zero mean and no transform unless given."""
    likelihood = GaussianLikelihood().to(DTYPE)
    likelihood.noise = 0.04
    kwargs.setdefault("jitter", JITTER)
    kwargs.setdefault("outcome_transform", None)
    kwargs.setdefault("mean_module", ZeroMean())
    kernel = scaled_kernel(d) if kernel is None else kernel
    return OnlineSGPR(X, Y, inducing_points=Z, covar_module=kernel, likelihood=likelihood, **kwargs)


def q_u_oracle(model: OnlineSGPR, X, Y) -> DenseQuModel:
    """Dense batch-SGPR q(u) on all data, at the model's inducing points and hyperparameters."""
    noise = model.noise_variance.detach()
    Z = model.inducing_points
    with torch.no_grad():
        _, m, S, K_uu = titsias(model.covar_module, noise, X, Y.squeeze(-1), Z, JITTER)
    return DenseQuModel(model.covar_module, noise, Z, K_uu, m, S)


@pytest.mark.parametrize("d,kind", [(1, "rbf"), (2, "matern")])
def test_inducing_points_at_all_inputs_equal_exact_gp(d, kind):
    X, Y = make_data(25, d)
    model = make_model(X, Y, Z=X, d=d, kernel=scaled_kernel(d, kind))
    gp = SingleTaskGP(X, Y, covar_module=scaled_kernel(d, kind), outcome_transform=None)
    gp.likelihood.noise = model.likelihood.noise.detach()
    gp.eval()
    Xs = torch.rand(3, 6, d, dtype=DTYPE)
    for noise in (False, True):
        p, ref = (
            model.posterior(Xs, observation_noise=noise),
            gp.posterior(Xs, observation_noise=noise),
        )
        assert p.mean.shape == ref.mean.shape == (3, 6, 1)
        assert rel_err(p.mean, ref.mean) < 1e-7
        assert rel_err(p.covariance_matrix, ref.covariance_matrix) < 1e-7


def test_streaming_with_fixed_inducing_points_equals_batch_sgpr():
    X, Y = make_data(60)
    Z = torch.rand(12, 2, dtype=DTYPE)
    model = make_model(X[:15], Y[:15], Z=Z, new_inducing_fraction=0.0)
    for start in range(15, 60, 9):
        model.observe(X[start : start + 9], Y[start : start + 9])
    assert model.num_train == 60
    assert torch.equal(model.inducing_points, Z)
    noise = model.noise_variance.detach()
    with torch.no_grad():
        bound, m, S, K_uu = titsias(model.covar_module, noise, X, Y.squeeze(-1), Z, JITTER)
    assert abs(model.last_bound.item() - bound.item()) < 1e-9 * abs(bound.item())
    m_model, S_model = model.sparse_posterior().q_u()
    assert rel_err(m_model, m) < 1e-9 and rel_err(S_model, S) < 1e-9
    Xs = torch.rand(7, 2, dtype=DTYPE)
    oracle = DenseQuModel(model.covar_module, noise, Z, K_uu, m, S)
    p, ref = model.posterior(Xs), oracle.posterior(Xs)
    assert rel_err(p.mean, ref.mean) < 1e-9
    assert rel_err(p.covariance_matrix, ref.covariance_matrix) < 1e-9


def test_online_bound_matches_bui_et_al_with_new_inducing_points_and_hyperparameters():
    """Eq. 11 of Bui et al. in their parametrisation (D_a from S_a^{-1} - K'_aa^{-1})."""
    X, Y = make_data(40)
    a = torch.rand(8, 2, dtype=DTYPE)
    model = make_model(X[:20], Y[:20], Z=a)
    noise = model.noise_variance.detach()
    with torch.no_grad():
        old_bound, m_a, S_a, K_aa_old = titsias(
            model.covar_module, noise, X[:20], Y[:20].squeeze(-1), a, JITTER
        )
    assert abs(model.last_bound.item() - old_bound.item()) < 1e-9 * abs(old_bound.item())
    # New hyperparameters and a new inducing set (4 old points kept, 6 new ones).
    model.covar_module.outputscale = 0.9
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.35, 0.25], dtype=DTYPE)
    model.likelihood.noise = 0.06
    b = torch.cat([a[:4], torch.rand(6, 2, dtype=DTYPE)]).requires_grad_(True)
    mll = OnlineSGPRBound(model.likelihood, model)
    value = mll(X[20:], Y[20:], inducing_points=b)
    noise = model.noise_variance
    reference, m_b, S_b = bui_bound(
        model.covar_module,
        noise,
        X[20:],
        Y[20:].squeeze(-1),
        b,
        a,
        m_a,
        S_a,
        K_aa_old,
        old_bound,
        JITTER,
    )
    priors = sum(
        prior.log_prob(closure(module)).sum()
        for _, module, prior, closure, _ in model.named_priors()
    )
    expected = (reference + priors) / 40
    assert abs(value.item() - expected.item()) < 1e-7 * abs(expected.item())
    params = [*model.parameters(), b]
    grads = torch.autograd.grad(value, params)
    grads_ref = torch.autograd.grad(expected, params)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert rel_err(g, g_ref) < 1e-5
    # Absorbing the batch with these inducing points gives Bui et al.'s optimal q(b).
    model._absorb(X[20:], Y[20:].squeeze(-1), (b.detach(), torch.tensor([0, 1, 2, 3] + [-1] * 6)))
    m_model, S_model = model.sparse_posterior().q_u()
    assert rel_err(m_model, m_b.detach()) < 1e-6 and rel_err(S_model, S_b.detach()) < 1e-6
    assert abs(model.last_bound.item() - reference.item()) < 1e-7 * abs(reference.item())


def _fantasy_inputs(d: int = 2):
    X_c = torch.rand(3, 2, d, dtype=DTYPE)  # b x q x d
    Y_c = torch.randn(4, 3, 2, 1, dtype=DTYPE)  # s x b x q x 1
    return X_c, Y_c


def test_conditioning_matches_gaussian_update_of_q_u():
    X, Y = make_data(30)
    model = make_model(X, Y, Z=torch.rand(10, 2, dtype=DTYPE))
    oracle = q_u_oracle(model, X, Y)
    X_c, Y_c = _fantasy_inputs()
    noise = 0.02 + 0.05 * torch.rand(3, 2, 1, dtype=DTYPE)
    for kwargs in ({}, {"noise": noise}):
        cond = model.condition_on_observations(X_c, Y_c, **kwargs)
        ref = oracle.condition_on_observations(X_c, Y_c, **kwargs)
        assert cond.batch_shape == torch.Size([4, 3])
        Xs = torch.rand(3, 5, 2, dtype=DTYPE)
        p, r = cond.posterior(Xs), ref.posterior(Xs)
        assert p.mean.shape == r.mean.shape == (4, 3, 5, 1)
        assert rel_err(p.mean, r.mean) < 1e-8
        assert rel_err(p.covariance_matrix, r.covariance_matrix) < 1e-8
        # Conditioning twice (a fantasy model conditioned again).
        X2, Y2 = torch.rand(3, 1, 2, dtype=DTYPE), torch.randn(4, 3, 1, 1, dtype=DTYPE)
        p2 = cond.condition_on_observations(X2, Y2).posterior(Xs)
        r2 = ref.condition_on_observations(X2, Y2).posterior(Xs)
        assert rel_err(p2.mean, r2.mean) < 1e-8
        assert rel_err(p2.covariance_matrix, r2.covariance_matrix) < 1e-8


def test_condition_equals_observe_with_fixed_inducing_points_and_parent_is_unchanged():
    X, Y = make_data(30)
    Z = torch.rand(10, 2, dtype=DTYPE)
    model = make_model(X[:20], Y[:20], Z=Z, new_inducing_fraction=0.0)
    Xs = torch.rand(6, 2, dtype=DTYPE)
    before = model.posterior(Xs)
    cond = model.condition_on_observations(X[20:], Y[20:])
    after = model.posterior(Xs)
    assert torch.equal(before.mean, after.mean)
    full = make_model(X, Y, Z=Z)
    ref = full.posterior(Xs)
    p = cond.posterior(Xs)
    assert rel_err(p.mean, ref.mean) < 1e-9
    assert rel_err(p.covariance_matrix, ref.covariance_matrix) < 1e-9
    # observe on a conditioned model absorbs the conditioning data with the batch.
    cond.observe(X[:0], Y[:0])
    assert cond.num_train == 30 and cond.batch_shape == torch.Size([])
    assert abs(cond.last_bound.item() - full.last_bound.item()) < 1e-9 * abs(full.last_bound.item())
    with pytest.raises(RuntimeError, match="batched"):
        model.condition_on_observations(*_fantasy_inputs()).observe(X[:2], Y[:2])


def _sampler(n: int = 16):
    return SobolQMCNormalSampler(sample_shape=torch.Size([n]), seed=1)


@pytest.mark.parametrize("name", ["qNIPV", "qKG"])
def test_acquisitions_match_oracle_and_optimize(name):
    d = 2
    X, Y = make_data(30)
    model = make_model(X, Y, Z=torch.rand(12, d, dtype=DTYPE))
    oracle = q_u_oracle(model, X, Y)
    mc_points = torch.rand(16, d, dtype=DTYPE)

    def build(m):
        if name == "qNIPV":
            return qNegIntegratedPosteriorVariance(m, mc_points=mc_points, sampler=_sampler(1)), 2
        return qKnowledgeGradient(
            m, num_fantasies=4, sampler=_sampler(4), inner_sampler=_sampler()
        ), 2

    (acq, q), (acq_ref, _) = build(model), build(oracle)
    q_total = acq.get_augmented_q_batch_size(q) if name == "qKG" else q
    Xc = torch.rand(4, q_total, d, dtype=DTYPE)
    values, reference = acq(Xc), acq_ref(Xc)
    assert values.shape == reference.shape == (4,)
    assert rel_err(values, reference) < 1e-6
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(DTYPE)
    cand, val = optimize_acqf(
        acq, bounds=bounds, q=q, num_restarts=2, raw_samples=16, options={"maxiter": 15}
    )
    assert cand.shape == (q, d) and torch.isfinite(val)
    assert ((cand >= 0) & (cand <= 1)).all()


def test_qnipv_gradients_flow_through_conditioning():
    X, Y = make_data(20)
    model = make_model(X, Y, Z=torch.rand(8, 2, dtype=DTYPE))
    acq = qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(16, 2, dtype=DTYPE))
    Xc = torch.rand(3, 2, 2, dtype=DTYPE, requires_grad=True)
    acq(Xc).sum().backward()
    assert Xc.grad is not None and torch.isfinite(Xc.grad).all() and Xc.grad.abs().sum() > 0


def test_default_rule_mixes_old_inducing_points_with_new_inputs():
    X, Y = make_data(60)
    model = make_model(X[:20], Y[:20], num_inducing=10, new_inducing_fraction=0.3, seed=3)
    assert model.num_inducing == 10
    old = model.inducing_points.clone()
    model.observe(X[20:40], Y[20:40])
    Z = model.inducing_points
    from_old = (Z.unsqueeze(1) == old.unsqueeze(0)).all(-1).any(-1)
    from_new = (Z.unsqueeze(1) == X[20:40].unsqueeze(0)).all(-1).any(-1)
    assert Z.shape == (10, 2) and from_old.sum() == 7 and from_new.sum() == 3
    # Deterministic given the seed.
    twin = make_model(X[:20], Y[:20], num_inducing=10, new_inducing_fraction=0.3, seed=3)
    twin.observe(X[20:40], Y[20:40])
    assert torch.equal(twin.inducing_points, Z)
    # Starting empty, the set grows from the data up to num_inducing.
    empty = make_model(X[:0], Y[:0], num_inducing=10)
    prior = empty.posterior(X[:3])
    assert torch.allclose(prior.mean, torch.zeros_like(prior.mean))
    empty.observe(X[:4], Y[:4])
    assert empty.num_inducing == 4
    empty.observe(X[4:30], Y[4:30])
    assert empty.num_inducing == 10 and empty.num_train == 30


def test_streaming_toy_problem_approaches_batch_sgpr():
    """Bui-style resampling / OIPS with fixed hyperparameters stay close to batch SGPR."""
    torch.manual_seed(1)
    X = torch.rand(300, 1, dtype=DTYPE)
    Y = torch.sin(8 * X) + 0.1 * torch.randn(300, 1, dtype=DTYPE)
    Xs = torch.linspace(0, 1, 50, dtype=DTYPE).unsqueeze(-1)
    truth = torch.sin(8 * Xs).squeeze(-1)
    batch = make_model(X, Y, Z=torch.linspace(0, 1, 20, dtype=DTYPE).unsqueeze(-1), d=1)
    kernel = scaled_kernel(1)
    models = {
        "resample": make_model(X[:30], Y[:30], d=1, num_inducing=20, new_inducing_fraction=0.3),
        "oips": make_model(
            X[:30],
            Y[:30],
            d=1,
            kernel=kernel,
            inducing_selector=OnlineInducingPointSelector(kernel, rho=0.95),
        ),
    }
    rmse_batch = (batch.posterior(Xs).mean.squeeze(-1) - truth).pow(2).mean().sqrt()
    for name, model in models.items():
        for start in range(30, 300, 30):
            model.observe(X[start : start + 30], Y[start : start + 30])
        mean = model.posterior(Xs).mean.squeeze(-1)
        rmse = (mean - truth).pow(2).mean().sqrt()
        assert rmse < rmse_batch + 0.03, name
        assert model.last_bound > batch.last_bound - 0.1 * abs(batch.last_bound), name
    assert models["oips"].num_inducing == models["oips"].inducing_selector.num_inducing


def test_optimizer_steps_follow_the_loss_module():
    X, Y = make_data(40)
    Z = torch.rand(8, 2, dtype=DTYPE)
    model = make_model(X[:20], Y[:20], Z=Z, steps_per_batch=5, lr=0.05, new_inducing_fraction=0.0)
    twin = make_model(X[:20], Y[:20], Z=Z, steps_per_batch=5, lr=0.05, new_inducing_fraction=0.0)
    # The same steps with the public loss module and a torch optimizer.
    twin.steps_per_batch = 0
    mll = OnlineSGPRBound(twin.likelihood, twin)
    optimizer = torch.optim.Adam(twin.parameters(), lr=0.05)
    before = -mll(X[20:], Y[20:]).item()
    for _ in range(5):
        optimizer.zero_grad()
        (-mll(X[20:], Y[20:])).backward()
        optimizer.step()
    assert -mll(X[20:], Y[20:]).item() < before
    model.observe(X[20:], Y[20:])
    twin.observe(X[20:], Y[20:])
    for p, p_twin in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p, p_twin, rtol=1e-10, atol=1e-12)
    assert abs(model.last_bound.item() - twin.last_bound.item()) < 1e-8 * abs(
        twin.last_bound.item()
    )


def test_learned_inducing_points_move_and_default_modules_fit():
    X, Y = make_data(40)
    model = OnlineSGPR(
        X[:20], Y[:20], num_inducing=6, learn_inducing_points=True, steps_per_batch=3, lr=0.05
    )
    old = model.inducing_points.clone()
    model.observe(X[20:], Y[20:])
    assert model.num_inducing == 6
    assert not (model.inducing_points.unsqueeze(1) == old.unsqueeze(0)).all(-1).any()
    assert torch.isfinite(model.last_bound) and (model.likelihood.noise > 0).all()


def test_transforms_are_frozen_after_construction():
    lo, hi = -3.0, 5.0
    X, Y = make_data(30)
    X_raw, Y_raw = lo + (hi - lo) * X, 3.0 + 2.0 * Y
    bounds = torch.tensor([[lo, lo], [hi, hi]], dtype=DTYPE)
    model = make_model(
        X_raw[:20],
        Y_raw[:20],
        Z=X[:8],
        input_transform=Normalize(2, bounds=bounds),
        outcome_transform=Standardize(1),
        new_inducing_fraction=0.0,
    )
    model.observe(X_raw[20:], Y_raw[20:])
    mean, std = Y_raw[:20].mean(), Y_raw[:20].std()
    plain = make_model(X, (Y_raw - mean) / std, Z=X[:8])
    Xs = torch.rand(5, 2, dtype=DTYPE)
    p, ref = model.posterior(lo + (hi - lo) * Xs), plain.posterior(Xs)
    assert rel_err(p.mean, mean + std * ref.mean) < 1e-9
    assert rel_err(p.variance, std**2 * ref.variance) < 1e-9


def test_state_dict_resumes_stream_and_float32_close_to_float64():
    X, Y = make_data(40)
    model = make_model(X[:20], Y[:20], num_inducing=10)
    model.observe(X[20:30], Y[20:30])
    fresh = make_model(X[:5], Y[:5], num_inducing=3)
    fresh.load_state_dict(model.state_dict(), keep_transforms=False)
    Xs = torch.rand(4, 2, dtype=DTYPE)
    assert torch.equal(fresh.posterior(Xs).mean, model.posterior(Xs).mean)
    assert fresh.num_inducing == 10 and fresh.num_train == 30
    model64 = make_model(X[:20], Y[:20], Z=X[:10], jitter=None)
    likelihood = GaussianLikelihood()
    likelihood.noise = 0.04
    model32 = OnlineSGPR(
        X[:20].float(),
        Y[:20].float(),
        inducing_points=X[:10].float(),
        covar_module=scaled_kernel(2).float(),
        likelihood=likelihood,
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    model32.observe(X[20:].float(), Y[20:].float())
    model64.observe(X[20:], Y[20:])
    assert model32.pseudo_eta.dtype == torch.float32
    p32, p64 = model32.posterior(Xs.float()), model64.posterior(Xs)
    assert (p32.mean.double() - p64.mean).abs().max() < 1e-3


def _snapshot(model: OnlineSGPR) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_unchanged(model: OnlineSGPR, snap: dict) -> None:
    now = model.state_dict()
    assert now.keys() == snap.keys()
    for k, v in snap.items():
        assert torch.equal(now[k], v), k


@pytest.mark.parametrize(
    "make_args,match",
    [
        (lambda X, Y: (X.clone().fill_(math.nan), Y), "X contains NaN"),
        (lambda X, Y: (X, Y.clone().fill_(math.inf)), "Y contains NaN or Inf"),
        (lambda X, Y: (X[:, :1], Y), "X must have last dimension 2"),
        (lambda X, Y: (X, Y[:-1]), "Y has 4 rows"),
        (lambda X, Y: (X.float(), Y), "X has dtype torch.float32"),
        (lambda X, Y: (X.unsqueeze(0), Y), "X must have shape q x d"),
        (lambda X, Y: (X, Y.squeeze(-1)), "Y must have at least 2"),
    ],
)
def test_bad_observe_inputs_leave_model_unchanged(make_args, match):
    X, Y = make_data(25)
    selector = OnlineInducingPointSelector(scaled_kernel(2), rho=0.9)
    model = make_model(X[:20], Y[:20], inducing_selector=selector)
    snap, points = _snapshot(model), selector.inducing_points.clone()
    with pytest.raises((ValueError, TypeError), match=match):
        model.observe(*make_args(X[20:], Y[20:]))
    _assert_unchanged(model, snap)
    assert torch.equal(selector.inducing_points, points)


def test_bad_constructor_and_conditioning_arguments():
    X, Y = make_data(10)
    cases = [
        ({"inducing_points": torch.rand(3, 3, dtype=DTYPE)}, ValueError, "inducing_points"),
        (
            {"inducing_points": torch.full((3, 2), math.nan, dtype=DTYPE)},
            ValueError,
            "inducing_points",
        ),
        ({"num_inducing": 0}, ValueError, "num_inducing"),
        ({"new_inducing_fraction": 1.5}, ValueError, "new_inducing_fraction"),
        ({"steps_per_batch": -1}, ValueError, "steps_per_batch"),
        ({"lr": 0.0}, ValueError, "lr"),
        ({"jitter": -1.0}, ValueError, "jitter"),
        ({"inducing_selector": "oips"}, TypeError, "inducing_selector"),
        ({"likelihood": object()}, TypeError, "likelihood"),
        ({"covar_module": object()}, TypeError, "covar_module"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            OnlineSGPR(X, Y, **kwargs)
    with pytest.raises(ValueError, match="train_Y has 9 rows"):
        OnlineSGPR(X, Y[:-1])
    with pytest.raises(ValueError, match="not both"):
        OnlineSGPR(
            X,
            Y,
            inducing_points=X[:3],
            inducing_selector=OnlineInducingPointSelector(RBFKernel(), 0.5),
        )
    model = make_model(X, Y, Z=X[:4])
    snap = _snapshot(model)
    X_c = torch.rand(2, 2, dtype=DTYPE)
    with pytest.raises(ValueError, match="Y has 3 points"):
        model.condition_on_observations(X_c, torch.rand(3, 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="noise must be strictly positive"):
        model.condition_on_observations(
            X_c, torch.rand(2, 1, dtype=DTYPE), noise=-torch.ones(2, 1, dtype=DTYPE)
        )
    with pytest.raises(TypeError, match="X has dtype"):
        model.posterior(X_c.float())
    with pytest.raises(ValueError, match="no inducing points"):
        make_model(X[:0], Y[:0]).condition_on_observations(X_c, torch.rand(2, 1, dtype=DTYPE))
    _assert_unchanged(model, snap)


class _BrokenSelector(InducingPointSelector):
    """Changes its state, then proposes a non-finite inducing point."""

    def _update(self, X):
        points = X[:2].clone()
        if self._points is not None:
            points[0, 0] = math.nan
        return points


def test_failed_update_restores_model_and_selector():
    X, Y = make_data(20)
    selector = _BrokenSelector()
    model = make_model(X[:10], Y[:10], inducing_selector=selector)
    snap, points = _snapshot(model), selector.inducing_points.clone()
    with pytest.raises((ValueError, torch.linalg.LinAlgError)):
        model.observe(X[10:], Y[10:])
    _assert_unchanged(model, snap)
    assert torch.equal(selector.inducing_points, points)
    with pytest.raises(ValueError, match="Yvar must be None"):
        model.observe(X[10:], Y[10:], Yvar=torch.ones_like(Y[10:]))


def test_conditioned_view_has_its_own_selector_and_random_stream():
    X, Y = make_data(40)
    selector = OnlineInducingPointSelector(scaled_kernel(2), rho=0.5)
    model = make_model(X[:10], Y[:10], inducing_selector=selector)
    count = selector.num_inducing
    view = model.condition_on_observations(X[10:12], Y[10:12])
    view.observe(X[12:], Y[12:])
    assert selector.num_inducing == count and model.num_inducing == count
    assert view.inducing_selector.num_inducing == view.num_inducing > count
    assert view.inducing_selector.kernel is selector.kernel  # a fork, same kernel module


# ------------------------------------------------------------------ prior mean
def _mean(kind: str, d: int = 2):
    """A fixed, non-trivial prior mean: a constant or a linear function."""
    if kind == "constant":
        mean = ConstantMean().to(DTYPE)
        mean.constant = torch.tensor(2.7, dtype=DTYPE)
    else:
        mean = LinearMean(d).to(DTYPE)
        mean.weights.data = torch.tensor([[1.5], [-0.8]], dtype=DTYPE)[:d]
        mean.bias.data.fill_(3.1)
    return mean


def _value(mean, X):
    with torch.no_grad():
        return mean(X).unsqueeze(-1)


@pytest.mark.parametrize("kind", ["constant", "linear"])
def test_fixed_mean_equals_zero_mean_model_on_residuals(kind):
    """Prior GP(m, k) = zero-mean model fitted on y - m(X), plus m: the stream, the
    bound, predictions and conditioning, with inducing sets that move (b != a)."""
    X, Y = make_data(60)
    mean = _mean(kind)
    model = make_model(X[:20], Y[:20], num_inducing=12, mean_module=mean, seed=5)
    residual = make_model(X[:20], Y[:20] - _value(mean, X[:20]), num_inducing=12, seed=5)
    for start in range(20, 60, 10):
        rows = slice(start, start + 10)
        model.observe(X[rows], Y[rows])
        residual.observe(X[rows], Y[rows] - _value(mean, X[rows]))
    assert torch.equal(model.inducing_points, residual.inducing_points)
    assert not torch.equal(model.pseudo_eta, residual.pseudo_eta)  # a factor on u, not u - m
    assert abs(model.last_bound.item() - residual.last_bound.item()) < 1e-10 * abs(
        residual.last_bound.item()
    )
    Xs = torch.rand(3, 5, 2, dtype=DTYPE)
    for noise in (False, True):
        p = model.posterior(Xs, observation_noise=noise)
        ref = residual.posterior(Xs, observation_noise=noise)
        assert rel_err(p.mean, ref.mean + _value(mean, Xs)) < 1e-10
        assert rel_err(p.covariance_matrix, ref.covariance_matrix) < 1e-10
    # Conditioning and fantasies: the targets are residuals too.
    X_c, Y_c = _fantasy_inputs()
    cond = model.condition_on_observations(X_c, Y_c)
    cond_ref = residual.condition_on_observations(X_c, Y_c - _value(mean, X_c))
    p, ref = cond.posterior(Xs), cond_ref.posterior(Xs)
    assert rel_err(p.mean, ref.mean + _value(mean, Xs)) < 1e-10
    assert rel_err(p.covariance_matrix, ref.covariance_matrix) < 1e-10
    fantasy = model.fantasize(X_c, _sampler(4))
    assert fantasy.batch_shape == torch.Size([4, 3])


def test_constant_mean_with_inducing_points_at_all_inputs_equals_exact_gp():
    X, Y = make_data(25)
    Y = Y + 5.0
    mean = _mean("constant")
    model = make_model(X, Y, Z=X, mean_module=mean)
    gp = SingleTaskGP(
        X, Y, covar_module=scaled_kernel(2), mean_module=_mean("constant"), outcome_transform=None
    )
    gp.likelihood.noise = model.likelihood.noise.detach()
    gp.eval()
    Xs = torch.rand(3, 6, 2, dtype=DTYPE)
    for noise in (False, True):
        p, ref = (
            model.posterior(Xs, observation_noise=noise),
            gp.posterior(Xs, observation_noise=noise),
        )
        assert rel_err(p.mean, ref.mean) < 1e-7
        assert rel_err(p.covariance_matrix, ref.covariance_matrix) < 1e-7
    far = model.posterior(torch.full((1, 2), 50.0, dtype=DTYPE))  # prior there: the constant
    assert abs(far.mean.item() - 2.7) < 1e-12


def test_constant_mean_streaming_with_fixed_inducing_points_equals_batch_sgpr():
    X, Y = make_data(60)
    Y = Y + 4.0
    Z = torch.rand(12, 2, dtype=DTYPE)
    model = make_model(
        X[:15], Y[:15], Z=Z, mean_module=_mean("constant"), new_inducing_fraction=0.0
    )
    for start in range(15, 60, 9):
        model.observe(X[start : start + 9], Y[start : start + 9])
    noise = model.noise_variance.detach()
    with torch.no_grad():
        bound, m, S, K_uu = titsias(model.covar_module, noise, X, Y.squeeze(-1) - 2.7, Z, JITTER)
    assert abs(model.last_bound.item() - bound.item()) < 1e-9 * abs(bound.item())
    m_model, S_model = model.sparse_posterior().q_u()
    assert rel_err(m_model, m + 2.7) < 1e-9 and rel_err(S_model, S) < 1e-9
    Xs = torch.rand(7, 2, dtype=DTYPE)
    oracle = DenseQuModel(model.covar_module, noise, Z, K_uu, m, S)
    p, ref = model.posterior(Xs), oracle.posterior(Xs)
    assert rel_err(p.mean, ref.mean + 2.7) < 1e-9
    assert rel_err(p.covariance_matrix, ref.covariance_matrix) < 1e-9


def test_new_constant_after_absorbing_changes_only_the_prior_of_the_summary():
    """The summary is a factor on the actual inducing values (Bui et al.'s likelihood of
    the old data): absorbed at c1, then a batch at c2, against a dense oracle."""
    X, Y = make_data(40)
    Y = Y + 3.0
    Z = torch.rand(10, 2, dtype=DTYPE)
    c1, c2 = 2.7, 1.9
    model = make_model(
        X[:20], Y[:20], Z=Z, mean_module=_mean("constant"), new_inducing_fraction=0.0
    )
    model.mean_module.constant = torch.tensor(c2, dtype=DTYPE)
    model.observe(X[20:], Y[20:])
    # Dense: t_1(u) = N(y_1; c1 + A_1 (u - c1), s2) times N(y_2; c2 + A_2 (u - c2), s2)
    # under the prior N(c2, K_uu): the residuals are y_1 - c1 - (c2 - c1) A_1 1, y_2 - c2.
    kernel, noise = model.covar_module, model.noise_variance.detach()
    with torch.no_grad():
        K_uu = jittered(kernel(Z).to_dense(), JITTER)
        K_uf = kernel(Z, X).to_dense()
        A = torch.linalg.solve(K_uu, K_uf).mT
        r = Y.squeeze(-1) - c2
        r[:20] = Y[:20].squeeze(-1) - c1 - (c2 - c1) * A[:20].sum(-1)
        Q = K_uf.mT @ torch.linalg.solve(K_uu, K_uf)
        bound = log_normal(r, Q + noise * torch.eye(40, dtype=DTYPE))
        bound = bound - (kernel(X, diag=True).sum() - Q.diagonal().sum()) / (2 * noise)
        gain = torch.linalg.solve(Q + noise * torch.eye(40, dtype=DTYPE), K_uf.mT)  # (..)^-1 K_fu
        m, S = (
            c2 + K_uf @ torch.linalg.solve(Q + noise * torch.eye(40, dtype=DTYPE), r),
            (K_uu - K_uf @ gain),
        )
    assert abs(model.last_bound.item() - bound.item()) < 1e-9 * abs(bound.item())
    m_model, S_model = model.sparse_posterior().q_u()
    assert rel_err(m_model, m) < 1e-9 and rel_err(S_model, S) < 1e-9


def _constant_gradient(objective, model):
    constant = model.mean_module.raw_constant
    (grad,) = torch.autograd.grad(objective(), constant)
    step = 1e-5
    with torch.no_grad():
        values = []
        for sign in (1, -1):
            constant.add_(sign * step)
            values.append(objective().item())
            constant.sub_(sign * step)
    return grad.item(), (values[0] - values[1]) / (2 * step)


def test_bound_gradient_in_the_constant_matches_finite_differences():
    X, Y = make_data(40)
    Y = Y + 3.0
    model = make_model(X[:20], Y[:20], num_inducing=8, mean_module=_mean("constant"))
    mll = OnlineSGPRBound(model.likelihood, model)
    for objective in (lambda: model.fit_objective()[0], lambda: mll(X[20:], Y[20:])):
        grad, finite = _constant_gradient(objective, model)
        assert abs(grad) > 1e-3
        assert abs(grad - finite) < 1e-6 * abs(grad)


def test_constant_is_learned_by_observe_steps_and_fit_gpytorch_mll():
    X, Y = make_data(60)
    Y = Y + 5.0
    model = make_model(
        X[:30], Y[:30], num_inducing=10, mean_module=ConstantMean(), steps_per_batch=5, lr=0.1
    )
    assert model.mean_module.constant.item() > 0.4  # 5 Adam steps of 0.1 toward 5
    before = model.mean_module.constant.item()
    model.observe(X[30:], Y[30:])
    assert model.mean_module.constant.item() > before + 0.4
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    assert abs(model.mean_module.constant.item() - 5.0) < 1.0
    # The last batch was re-absorbed at the fitted constant.
    fitted = model.last_bound.clone()
    with torch.no_grad():
        assert torch.allclose(model.fit_objective()[0], fitted, rtol=1e-10)


def test_defaults_are_standardize_and_constant_mean():
    X = torch.rand(40, 1, dtype=DTYPE)
    Y = 100 + 10 * torch.sin(6 * X)
    model = OnlineSGPR(X, Y, num_inducing=20)
    assert isinstance(model.outcome_transform, Standardize)
    assert type(model.mean_module) is ConstantMean
    mean = model.posterior(X).mean
    assert (mean - Y).abs().max() < 3.0  # not ~0, as with a zero mean on raw targets
    assert abs(model.posterior(torch.full((1, 1), 20.0, dtype=DTYPE)).mean.item() - 100) < 3.0
    # ZeroMean without a transform: the zero-mean model (prior mean 0, no mean parameter).
    zero = OnlineSGPR(X, Y, num_inducing=20, outcome_transform=None, mean_module=ZeroMean())
    assert not hasattr(zero, "outcome_transform")
    assert not any("mean_module" in name for name, _ in zero.named_parameters())
    assert zero.posterior(torch.full((1, 1), 20.0, dtype=DTYPE)).mean.abs().item() < 1e-6
    empty = OnlineSGPR(X[:0], Y[:0])  # nothing to standardise: no transform
    assert not hasattr(empty, "outcome_transform")


def test_constant_is_a_hyperparameter_in_state_dict_warm_start_and_checkpoint():
    X, Y = make_data(40)
    Y = Y + 3.0
    model = make_model(X[:20], Y[:20], num_inducing=10, mean_module=ConstantMean())
    model.mean_module.constant = torch.tensor(2.5, dtype=DTYPE)
    model.observe(X[20:30], Y[20:30])
    state = model.state_dict()
    assert "mean_module.raw_constant" in state
    assert not model.is_data_key("mean_module.raw_constant")
    # Checkpoint: the stream resumes bit for bit.
    # (Built with the same num_inducing: it shapes the later updates, so a checkpoint of
    # another one is refused; its other data, of another size, are replaced.)
    resumed = make_model(X[:5], Y[:5], num_inducing=10, mean_module=ConstantMean())
    resumed.restore(model.checkpoint())
    Xs = torch.rand(4, 2, dtype=DTYPE)
    assert resumed.mean_module.constant.item() == 2.5
    assert torch.equal(resumed.posterior(Xs).mean, model.posterior(Xs).mean)
    # Warm start: a model on one batch with the loaded constant equals one built with it.
    warm = make_model(X[:20], Y[:20], Z=X[:8], mean_module=ConstantMean())
    warm.load_state_dict(state)
    built_mean = ConstantMean().to(DTYPE)
    built_mean.constant = torch.tensor(2.5, dtype=DTYPE)
    built = make_model(X[:20], Y[:20], Z=X[:8], mean_module=built_mean)
    assert rel_err(warm.posterior(Xs).mean, built.posterior(Xs).mean) < 1e-10
    assert abs(warm.last_bound.item() - built.last_bound.item()) < 1e-10 * abs(
        built.last_bound.item()
    )


def test_bad_mean_module_is_named():
    X, Y = make_data(10)
    cases = [
        ("constant", TypeError, "mean_module must be None"),
        (ConstantMean(batch_shape=torch.Size([2])), ValueError, "mean_module must map"),
        (LinearMean(3), ValueError, "mean_module \\(LinearMean\\) fails"),
    ]
    for mean_module, error, match in cases:
        with pytest.raises(error, match=match):
            OnlineSGPR(X, Y, mean_module=mean_module)
