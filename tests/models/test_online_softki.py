"""OnlineSoftKIGP against a model built at once, the batch SoftKIGP, dense closed forms, BoTorch."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from botorch.acquisition import (
    ExpectedImprovement,
    qKnowledgeGradient,
    qLogExpectedImprovement,
    qNegIntegratedPosteriorVariance,
    qUpperConfidenceBound,
)
from botorch.fit import fit_gpytorch_mll
from botorch.models.transforms import Normalize, Standardize
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, LinearMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.interpolation.grid import grown_grid_bounds
from streamgp.linalg.grid_kernel import cholesky_with_jitter, point_kernel_root
from streamgp.models.online_softki import FarFromPointsWarning, OnlineSoftKIGP
from streamgp.models.softki import SoftKIGP

DTYPE = torch.float64
D = 3
BOUNDS = torch.tensor([[-1.0, 0.0, 0.0], [1.0, 2.0, 1.0]], dtype=DTYPE)
TEMPERATURE = 0.15
NOISE = 0.01


def target(X):
    return torch.sin(3 * X).sum(-1, keepdim=True) + 0.5 * X[..., :1] * X[..., 1:2]


def make_data(n, dtype=DTYPE):
    X = BOUNDS[0].to(dtype) + (BOUNDS[1] - BOUNDS[0]).to(dtype) * torch.rand(n, D, dtype=dtype)
    return X, target(X) + 0.05 * torch.randn(n, 1, dtype=dtype)


def kernel(matern=False):
    base = MaternKernel(nu=2.5, ard_num_dims=D) if matern else RBFKernel(ard_num_dims=D)
    k = ScaleKernel(base).to(DTYPE)
    k.outputscale = 1.3
    k.base_kernel.lengthscale = torch.tensor([0.4, 0.3, 0.5], dtype=DTYPE)
    return k


def likelihood():
    lik = GaussianLikelihood(noise_constraint=GreaterThan(1e-12)).to(DTYPE)
    lik.noise = NOISE
    return lik


def frozen(X, Y, Z, *, matern=False, Yvar=None, **kwargs):
    """An OnlineSoftKIGP with given points, temperature and hyperparameters (no pretraining).

    Zero mean on raw targets (what the dense oracles compute) unless told otherwise.
    """
    kwargs.setdefault("outcome_transform", None)
    kwargs.setdefault("mean_module", ZeroMean())
    return OnlineSoftKIGP(
        X,
        Y,
        train_Yvar=Yvar,
        likelihood=None if Yvar is not None else likelihood(),
        covar_module=kernel(matern),
        input_transform=Normalize(D, bounds=BOUNDS),
        inducing_points=Z,
        temperature=TEMPERATURE,
        pretrain_epochs=0,
        **kwargs,
    )


def dense(model, X, y, Xs, noise=None):
    """Dense n x n GP with the SoftKI kernel W (K_zz + jitter) W^T (transformed spaces)."""
    with torch.no_grad():
        Z = model.inducing_points
        K = model.covar_module(Z).to_dense()
        _, jitter = cholesky_with_jitter(K)
        K = K + jitter * torch.eye(len(Z), dtype=K.dtype)
        W, Ws = (model.interpolation.weights(x).to_dense() for x in (X, Xs))
        lam = model.noise_variance.expand(len(y)) if noise is None else noise
        S = W @ K @ W.mT + torch.diag(lam)
        Ksx = Ws @ K @ W.mT
        mean = Ksx @ torch.linalg.solve(S, y)
        covar = Ws @ K @ Ws.mT - Ksx @ torch.linalg.solve(S, Ksx.mT)
        L = torch.linalg.cholesky(S)
        z = torch.linalg.solve_triangular(L, y.unsqueeze(-1), upper=False).squeeze(-1)
        mll = -0.5 * (z @ z + 2 * L.diagonal().log().sum() + len(y) * math.log(2 * math.pi))
    return mean, covar, mll


def assert_same_posterior(a, b, Xs, atol=1e-8):
    pa, pb = a.posterior(Xs), b.posterior(Xs)
    torch.testing.assert_close(pa.mean, pb.mean, atol=atol, rtol=0)
    torch.testing.assert_close(pa.covariance_matrix, pb.covariance_matrix, atol=atol, rtol=0)


def normalized(X):
    return (X - BOUNDS[0]) / (BOUNDS[1] - BOUNDS[0])


# ------------------------------------------------------------------ exactness
@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("top_k", [None, 6])
def test_observe_in_batches_equals_one_model_of_all_data_and_batch_softki(top_k):
    X, Y = make_data(240)
    Z = torch.rand(24, D, dtype=DTYPE)
    Xs = make_data(5)[0]
    model = frozen(X[:20], Y[:20], Z, top_k=top_k)
    start = 20
    # q <= m / 4 is deferred as a low-rank correction (folded at rank FOLD_RANK = 32),
    # larger batches refactorise from the statistics.
    for q in (1, 5, 1, 40, 6, 6, 6, 6, 6, 6, 100, 37):
        model.posterior(Xs)  # caches valid: the update paths (not a rebuild) are tested
        model.observe(X[start : start + q], Y[start : start + q])
        start += q
    assert start == len(X) and model.num_train == len(X)
    at_once = frozen(X, Y, Z, top_k=top_k)
    assert_same_posterior(model, at_once, Xs)
    torch.testing.assert_close(
        model.fit_objective()[0], at_once.fit_objective()[0], atol=1e-8, rtol=0
    )
    # The dense SoftKI closed form with these weights (top-k or dense).
    mean, covar, mll = dense(model, normalized(X), Y.squeeze(-1), normalized(Xs))
    post = model.posterior(Xs)
    torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(post.covariance_matrix, covar, atol=1e-8, rtol=0)
    torch.testing.assert_close(model.fit_objective()[0], mll, atol=1e-8, rtol=0)
    if top_k is None:  # SoftKI's own QR path on all data, same Z, T, hyperparameters
        batch = SoftKIGP(
            X,
            Y,
            likelihood=likelihood(),
            covar_module=kernel(),
            input_transform=Normalize(D, bounds=BOUNDS),
            outcome_transform=None,
            mean_module=ZeroMean(),
            inducing_points=model.inducing_points,
            temperature=TEMPERATURE,
        )
        assert_same_posterior(model, batch, Xs)
        torch.testing.assert_close(
            model.fit_objective()[0], batch.fit_objective()[0], atol=1e-8, rtol=0
        )


def test_mll_and_its_gradient_equal_the_dense_closed_form_any_kernel_and_known_noise():
    X, Y = make_data(80)
    Yvar = 0.005 + 0.02 * torch.rand(80, 1, dtype=DTYPE)
    Z = torch.rand(16, D, dtype=DTYPE)
    for model, noise in [
        (frozen(X[:30], Y[:30], Z, matern=True), None),
        (frozen(X[:30], Y[:30], Z, Yvar=Yvar[:30]), Yvar.squeeze(-1)),
    ]:
        for start, stop in [(30, 32), (32, 35), (35, 80)]:  # known noise: rank-q root updates
            model.posterior(X[:2])
            rows = slice(start, stop)
            model.observe(X[rows], Y[rows], None if noise is None else Yvar[rows])
        value, n = model.fit_objective()
        assert n.item() == 80
        _, _, expected = dense(model, normalized(X), Y.squeeze(-1), normalized(X[:4]), noise)
        torch.testing.assert_close(value, expected, atol=1e-8, rtol=0)
        # Gradient w.r.t. the kernel hyperparameters: the dense form through autograd.
        raw = model.covar_module.base_kernel.raw_lengthscale
        (grad,) = torch.autograd.grad(value, raw)
        W = model.interpolation.weights(normalized(X)).to_dense()
        root = point_kernel_root(model.covar_module, model.inducing_points).to_dense()
        lam = model.noise_variance.expand(80) if noise is None else noise
        S = W @ root @ root.mT @ W.mT + torch.diag(lam)
        dense_mll = torch.distributions.MultivariateNormal(
            torch.zeros(80, dtype=DTYPE), S
        ).log_prob(Y.squeeze(-1))
        (expected_grad,) = torch.autograd.grad(dense_mll, raw)
        torch.testing.assert_close(grad, expected_grad, atol=1e-7, rtol=1e-7)
        # Batches equal one model of all data with known noise too.
        if noise is not None:
            at_once = frozen(X, Y, Z, Yvar=Yvar)
            assert_same_posterior(model, at_once, X[:4])


def test_condition_on_observations_equals_observe_and_fantasies_batch():
    X, Y = make_data(60)
    model = frozen(X[:50], Y[:50], torch.rand(20, D, dtype=DTYPE))
    Xs = make_data(6)[0]
    conditioned = model.condition_on_observations(X[50:], Y[50:])
    observed = copy.deepcopy(model).observe(X[50:], Y[50:])
    assert_same_posterior(conditioned, observed, Xs)
    # Conditioning a conditioned model again, and batched fantasies.
    twice = conditioned.condition_on_observations(X[:2] + 0.01, Y[:2])
    assert_same_posterior(twice, observed.observe(X[:2] + 0.01, Y[:2]), Xs)
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]))
    fantasy = model.fantasize(make_data(6)[0].reshape(3, 2, D), sampler)
    assert fantasy.batch_shape == (4, 3)
    post = fantasy.posterior(Xs)
    assert post.mean.shape == (4, 3, 6, 1) and torch.isfinite(post.variance).all()


@pytest.mark.usefixtures("ski_prior_variance")
def test_acquisition_functions_on_fantasies_and_qnipv_against_a_dense_oracle():
    X, Y = make_data(70)
    model = frozen(X, Y, torch.rand(20, D, dtype=DTYPE), outcome_transform=None)
    mc_points = make_data(16)[0]
    candidates = make_data(8)[0].reshape(4, 2, D).requires_grad_()
    qnipv = qNegIntegratedPosteriorVariance(model, mc_points=mc_points)
    value = qnipv(candidates)
    assert value.shape == (4,) and torch.isfinite(value).all()
    value.sum().backward()
    assert torch.isfinite(candidates.grad).all() and candidates.grad.abs().sum() > 0
    # Dense oracle: SoftKI GP on the data plus each candidate pair (noise s2).
    for b in range(4):
        X_all = torch.cat([X, candidates[b].detach()])
        _, covar, _ = dense(
            model, normalized(X_all), torch.zeros(len(X_all), dtype=DTYPE), normalized(mc_points)
        )
        expected = -covar.diagonal().mean()
        torch.testing.assert_close(value[b].detach(), expected, atol=1e-8, rtol=0)
    Xb = make_data(8)[0].reshape(4, 2, D)
    best = Y.max()
    for acqf, shape in [
        (qLogExpectedImprovement(model, best_f=best), (4,)),
        (qUpperConfidenceBound(model, beta=2.0), (4,)),
        (ExpectedImprovement(model, best_f=best), (4,)),
    ]:
        out = acqf(Xb[:, :1] if isinstance(acqf, ExpectedImprovement) else Xb)
        assert out.shape == shape and torch.isfinite(out).all()
    qkg = qKnowledgeGradient(model, num_fantasies=3)
    out = qkg(make_data(4 * 5)[0].reshape(4, 5, D))  # q = 2 plus 3 fantasy solutions
    assert out.shape == (4,) and torch.isfinite(out).all()


# ------------------------------------------------------------------ fitting
def test_fit_gpytorch_mll_raises_the_mll_and_keeps_points_and_temperature():
    X, Y = make_data(150)
    model = OnlineSoftKIGP(
        X[:100],
        Y[:100],
        input_transform=Normalize(D, bounds=BOUNDS),
        outcome_transform=Standardize(1),
        num_inducing=20,
        pretrain_epochs=2,
        pretrain_options={"batch_size": 50, "seed": 0},
    )
    model.observe(X[100:], Y[100:])
    Z, T = model.inducing_points.clone(), model.temperature.clone()
    before = model.fit_objective()[0].item()
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(model.likelihood, model),
        optimizer_kwargs={"options": {"maxiter": 30}},
    )
    assert model.fit_objective()[0].item() > before
    assert torch.equal(model.inducing_points, Z) and torch.equal(model.temperature, T)
    assert torch.isfinite(model.posterior(X[:3]).variance).all()


def test_pretraining_learns_points_and_keep_data_refit_equals_a_rebuild():
    X, Y = make_data(120)
    model = OnlineSoftKIGP(
        X[:60],
        Y[:60],
        input_transform=Normalize(D, bounds=BOUNDS),
        outcome_transform=None,
        mean_module=ZeroMean(),
        num_inducing=12,
        pretrain_epochs=2,
        pretrain_options={"batch_size": 30, "seed": 0},
        keep_data=True,
    )
    initial = OnlineSoftKIGP(
        X[:60],
        Y[:60],
        input_transform=Normalize(D, bounds=BOUNDS),
        outcome_transform=None,
        mean_module=ZeroMean(),
        num_inducing=12,
        pretrain_epochs=0,
        keep_data=False,
    )
    assert not torch.equal(model.inducing_points, initial.inducing_points)  # Algorithm 1 ran
    model.observe(X[60:90], Y[60:90])
    model.observe(X[90:], Y[90:])
    X_t, y_t, noise = model.kept_data()
    assert noise is None and torch.equal(X_t, normalized(X)) and torch.equal(y_t, Y.squeeze(-1))
    Z = model.inducing_points.clone()
    model.refit_points(num_epochs=2, batch_size=40, seed=0)
    assert not torch.equal(model.inducing_points, Z)
    rebuilt = OnlineSoftKIGP(
        X,
        Y,
        likelihood=copy.deepcopy(model.likelihood),
        covar_module=copy.deepcopy(model.covar_module),
        input_transform=Normalize(D, bounds=BOUNDS),
        outcome_transform=None,
        mean_module=ZeroMean(),
        inducing_points=model.inducing_points,
        temperature=model.temperature.item(),
        pretrain_epochs=0,
    )
    assert_same_posterior(model, rebuilt, X[:4], atol=1e-10)
    model.refit_points(num_epochs=0, num_inducing=8)  # fresh k-means points, other m
    assert model.num_inducing == 8 and model.statistics.A.shape == (8, 8)
    with pytest.raises(RuntimeError, match="keep_data"):
        initial.refit_points()


def test_restandardize_updates_the_kept_data():
    X, Y = make_data(50)
    Y = 3.0 + 2.0 * Y
    model = frozen(
        X[:10],
        Y[:10],
        torch.rand(10, D, dtype=DTYPE),
        keep_data=True,
        outcome_transform=Standardize(1),
    )
    model.observe(X[10:], Y[10:])
    model.restandardize()
    expected = (Y.squeeze(-1) - Y.mean()) / Y.std()
    torch.testing.assert_close(model.kept_data()[1], expected, atol=1e-12, rtol=0)


# ------------------------------------------------------------------ state
@pytest.mark.parametrize("keep_data", [False, True])
def test_checkpoint_round_trip_is_bit_identical_and_resumes_the_stream(keep_data, tmp_path):
    X, Y = make_data(90)
    Xs = make_data(5)[0]

    def build(X0, Y0):
        return OnlineSoftKIGP(
            X0,
            Y0,
            input_transform=Normalize(D, bounds=BOUNDS),
            outcome_transform=Standardize(1),
            num_inducing=10,
            pretrain_epochs=1,
            pretrain_options={"batch_size": 10, "seed": 0},
            keep_data=keep_data,
        )

    model = build(X[:30], Y[:30])
    model.posterior(Xs)
    model.observe(X[30:33], Y[30:33])  # deferred, folded by the checkpoint
    model.posterior(Xs)
    model.observe(X[33:60], Y[33:60])
    path = tmp_path / "stream.pt"
    torch.save(model.checkpoint(), path)
    other_X, other_Y = make_data(17)  # a different stream: everything is replaced
    resumed = build(other_X, other_Y).restore(torch.load(path, weights_only=True))
    pa, pb = model.posterior(Xs), resumed.posterior(Xs)
    assert torch.equal(pa.mean, pb.mean) and torch.equal(pa.variance, pb.variance)
    assert torch.equal(model.inducing_points, resumed.inducing_points)
    for start, stop in [(60, 61), (61, 80), (80, 90)]:
        model.observe(X[start:stop], Y[start:stop])
        resumed.observe(X[start:stop], Y[start:stop])
        pa, pb = model.posterior(Xs), resumed.posterior(Xs)
        assert torch.equal(pa.mean, pb.mean) and torch.equal(pa.variance, pb.variance)
    assert torch.equal(model.fit_objective()[0], resumed.fit_objective()[0])
    if keep_data:
        for a, b in zip(model.kept_data()[:2], resumed.kept_data()[:2], strict=True):
            assert torch.equal(a, b)


def test_a_move_takes_the_kept_data_along_and_rebuilds_the_same_posterior():
    X, Y = make_data(40)
    model = frozen(X, Y, torch.rand(12, D, dtype=DTYPE), keep_data=True)
    model.observe(*make_data(5))
    X_test = make_data(4)[0]
    before = model.posterior(X_test)
    kept = model.kept_data()
    model.to(DTYPE)  # a no-op move (BoTorch makes them) drops the caches
    assert model._posterior is None and model._hyper_snapshot is None
    after = model.posterior(X_test)
    torch.testing.assert_close(after.mean, before.mean)
    torch.testing.assert_close(after.variance, before.variance)
    model.float()
    X_kept, y_kept, _ = model.kept_data()
    assert X_kept.dtype == y_kept.dtype == model.inducing_points.dtype == torch.float32
    torch.testing.assert_close(X_kept, kept[0].float())
    torch.testing.assert_close(y_kept, kept[1].float())


def test_statistics_do_not_grow_with_n():
    Z = torch.rand(12, D, dtype=DTYPE)
    sizes = []
    for n in (30, 300):
        X, Y = make_data(n)
        model = frozen(X[:20], Y[:20], Z, keep_data=False)
        model.observe(X[20:], Y[20:])
        state = model.state_dict()
        sizes.append({k: tuple(v.shape) for k, v in state.items()})
        assert model.statistics.A.shape == (12, 12) and model.statistics.count == n
    assert sizes[0] == sizes[1]
    assert "_kept" in vars(model) and model._kept == []  # no raw data without keep_data


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_bad_input_raises_naming_the_argument_and_leaves_the_model_unchanged():
    X, Y = make_data(40)
    model = frozen(X[:30], Y[:30], torch.rand(10, D, dtype=DTYPE), keep_data=True)
    model.posterior(X[:2])
    before = _snapshot(model)
    kept = model.kept_data()[0].clone()
    for call, error, match in [
        (lambda: model.observe(X[:2].float(), Y[:2].float()), TypeError, "X"),
        (lambda: model.observe(X[:2, :2], Y[:2]), ValueError, "X"),
        (lambda: model.observe(X[:2], Y[:3]), ValueError, "Y"),
        (lambda: model.observe(X[:2], Y[:2] * math.nan), ValueError, "Y"),
        (lambda: model.observe(X[:2], Y[:2], torch.ones(2, 1, dtype=DTYPE)), ValueError, "Yvar"),
        (lambda: model.posterior(torch.rand(3, 2, dtype=DTYPE)), ValueError, "X"),
        (lambda: model.condition_on_observations(X[:2], Y[:3]), ValueError, "Y"),
        (lambda: model.refit_points(num_epochs=-1), ValueError, "num_epochs"),
        (lambda: model.refit_points(num_epochs=1, lr=-1.0), ValueError, "lr"),
    ]:
        with pytest.raises(error, match=match):
            call()
        after = _snapshot(model)
        assert before.keys() == after.keys() and all(
            torch.equal(before[k], after[k]) for k in before
        )
        assert torch.equal(model.kept_data()[0], kept)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"train_Y": torch.rand(9, 1, dtype=DTYPE)}, ValueError, "train_Y"),
        ({"train_Y": torch.rand(10, 1)}, TypeError, "train_Y"),
        ({"train_Yvar": -torch.ones(10, 1, dtype=DTYPE)}, ValueError, "train_Yvar"),
        ({"num_inducing": 0}, ValueError, "num_inducing"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"top_k": 0}, ValueError, "top_k"),
        ({"top_k": 11}, ValueError, "top_k"),
        ({"inducing_points": torch.rand(4, 2, dtype=DTYPE)}, ValueError, "inducing_points"),
        ({"pretrain_epochs": -1}, ValueError, "pretrain_epochs"),
        ({"pretrain_options": {"num_epochs": 3}}, ValueError, "pretrain_options"),
        ({"keep_data": 1}, TypeError, "keep_data"),
        ({"covar_module": 3}, TypeError, "covar_module"),
        ({"likelihood": "noise"}, TypeError, "likelihood"),
        ({"mean_module": LinearMean(D).to(DTYPE)}, ValueError, "mean_module"),
        ({"mean_module": ConstantMean(batch_shape=torch.Size([2]))}, ValueError, "mean_module"),
        (
            {"train_X": torch.rand(0, 3, dtype=DTYPE), "train_Y": torch.rand(0, 1, dtype=DTYPE)},
            ValueError,
            "inducing_points",
        ),
    ],
)
def test_bad_constructor_inputs_raise(kwargs, error, match):
    args = {"train_X": torch.rand(10, 3, dtype=DTYPE), "train_Y": torch.rand(10, 1, dtype=DTYPE)}
    args.update(kwargs)
    if "num_inducing" not in kwargs and "inducing_points" not in kwargs:
        args["num_inducing"] = 10
    args.setdefault("pretrain_epochs", 0)
    with pytest.raises(error, match=match):
        OnlineSoftKIGP(**args)


# ------------------------------------------------------------------ dtypes, defaults
def test_float32_empty_start_and_default_options():
    X, Y = make_data(200, dtype=torch.float32)
    model = OnlineSoftKIGP(
        X[:100],
        Y[:100],
        input_transform=Normalize(D, bounds=BOUNDS.float()),
        outcome_transform=Standardize(1),
        num_inducing=16,
        pretrain_epochs=1,
    )
    for start in range(100, 200, 25):
        model.observe(X[start : start + 25], Y[start : start + 25])
    post = model.posterior(torch.rand(2, 4, D))
    assert post.mean.dtype == torch.float32 and post.mean.shape == (2, 4, 1)
    assert torch.isfinite(post.mean).all() and (post.variance >= 0).all()
    assert torch.isfinite(model.fit_objective()[0])
    # Starting from no data: given points, SoftKI's default temperature.
    Z = torch.rand(8, D, dtype=DTYPE)
    empty = OnlineSoftKIGP(
        torch.zeros(0, D, dtype=DTYPE), torch.zeros(0, 1, dtype=DTYPE), inducing_points=Z
    )
    assert empty.temperature > 0 and empty.num_train == 0
    X64, Y64 = make_data(20)
    empty.observe(X64, Y64)
    assert empty.num_train == 20 and torch.isfinite(empty.posterior(X64[:2]).mean).all()


def test_known_noise_pretrains_at_the_mean_variance_and_weights_rows_by_their_own():
    X, Y = make_data(60)
    Yvar = 0.001 + 0.01 * torch.rand(60, 1, dtype=DTYPE)
    model = OnlineSoftKIGP(
        X[:40],
        Y[:40],
        train_Yvar=Yvar[:40],
        input_transform=Normalize(D, bounds=BOUNDS),
        outcome_transform=None,
        mean_module=ZeroMean(),
        num_inducing=10,
        pretrain_epochs=1,
        pretrain_options={"batch_size": 20, "seed": 0},
    )
    model.observe(X[40:], Y[40:], Yvar[40:])
    with pytest.raises(ValueError, match="Yvar"):
        model.observe(X[:1], Y[:1])
    _, _, mll = dense(model, normalized(X), Y.squeeze(-1), normalized(X[:2]), Yvar.squeeze(-1))
    torch.testing.assert_close(model.fit_objective()[0], mll, atol=1e-8, rtol=0)


# ------------------------------------------------------------ the constant prior mean
MEAN = 1.7


def constant_mean(value=MEAN):
    mean = ConstantMean().to(DTYPE)
    mean.constant = torch.tensor(value, dtype=DTYPE)  # a float would pass through float32
    return mean


def assert_shifted(with_mean, shifted, Xs, constant=MEAN):
    """``with_mean`` is ``shifted`` (a zero-mean model of ``y - constant``) plus the constant."""
    a, b = with_mean.posterior(Xs), shifted.posterior(Xs)
    torch.testing.assert_close(a.mean, b.mean + constant, atol=1e-10, rtol=0)
    torch.testing.assert_close(a.covariance_matrix, b.covariance_matrix, atol=1e-10, rtol=0)


def assert_same_mll(a, b, atol=1e-10):
    torch.testing.assert_close(a.fit_objective()[0], b.fit_objective()[0], atol=atol, rtol=0)


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("known_noise", [False, True])
def test_constant_mean_is_the_shift_of_the_targets_through_the_stream(known_noise):
    """W 1 = 1: the model with mean c on y is the zero-mean model on y - c, plus c."""
    X, Y = make_data(100)
    Yvar = 0.005 + 0.02 * torch.rand(100, 1, dtype=DTYPE) if known_noise else None
    Z = torch.rand(16, D, dtype=DTYPE)
    Xs = make_data(6)[0]

    def rows(start, stop):
        return (X[start:stop], Y[start:stop]), None if Yvar is None else Yvar[start:stop]

    (X0, Y0), V0 = rows(0, 30)
    with_mean = frozen(X0, Y0, Z, Yvar=V0, mean_module=constant_mean())
    shifted = frozen(X0, Y0 - MEAN, Z, Yvar=V0)
    assert_shifted(with_mean, shifted, Xs)
    assert_same_mll(with_mean, shifted)
    for start, stop in [(30, 31), (31, 36), (36, 100)]:  # root updates, then a refactorisation
        with_mean.posterior(Xs), shifted.posterior(Xs)
        (Xq, Yq), Vq = rows(start, stop)
        with_mean.observe(Xq, Yq, Vq)
        shifted.observe(Xq, Yq - MEAN, Vq)
        assert_shifted(with_mean, shifted, Xs)
        assert_same_mll(with_mean, shifted)
    # The dense closed form of y - c, plus c.
    noise = None if Yvar is None else Yvar.squeeze(-1)
    mean, covar, mll = dense(with_mean, normalized(X), Y.squeeze(-1) - MEAN, normalized(Xs), noise)
    post = with_mean.posterior(Xs)
    torch.testing.assert_close(post.mean.squeeze(-1), mean + MEAN, atol=1e-8, rtol=0)
    torch.testing.assert_close(post.covariance_matrix, covar, atol=1e-8, rtol=0)
    torch.testing.assert_close(with_mean.fit_objective()[0], mll, atol=1e-8, rtol=0)
    # Conditioning and batched fantasy targets: residuals y - c.
    X_q = make_data(2)[0]
    Y_q = torch.randn(4, 2, 1, dtype=DTYPE)
    noise_q = None if Yvar is None else torch.full((2, 1), 0.01, dtype=DTYPE)
    assert_shifted(
        with_mean.condition_on_observations(X_q, Y_q, noise=noise_q),
        shifted.condition_on_observations(X_q, Y_q - MEAN, noise=noise_q),
        Xs,
    )
    if not known_noise:  # SoftKI's own QR path with the same constant
        batch = SoftKIGP(
            X,
            Y,
            likelihood=likelihood(),
            covar_module=kernel(),
            input_transform=Normalize(D, bounds=BOUNDS),
            outcome_transform=None,
            mean_module=constant_mean(),
            inducing_points=Z,
            temperature=TEMPERATURE,
        )
        assert_same_posterior(with_mean, batch, Xs)
        assert_same_mll(with_mean, batch, atol=1e-8)


@pytest.mark.parametrize("known_noise", [False, True])
def test_constant_mean_gradient_matches_finite_differences(known_noise):
    X, Y = make_data(50)
    Yvar = 0.005 + 0.02 * torch.rand(50, 1, dtype=DTYPE) if known_noise else None
    model = frozen(X[:20], Y[:20], torch.rand(12, D, dtype=DTYPE), mean_module=constant_mean())
    if known_noise:
        model = frozen(
            X[:20], Y[:20], model.inducing_points, Yvar=Yvar[:20], mean_module=constant_mean()
        )
    model.observe(X[20:], Y[20:], None if Yvar is None else Yvar[20:])
    mean = model.mean_module
    (grad,) = torch.autograd.grad(model.fit_objective()[0], mean.raw_constant)
    step = 1e-5
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            mean.constant = torch.tensor(MEAN + sign * step, dtype=DTYPE)
            values.append(model.fit_objective()[0])
    fd = (values[0] - values[1]) / (2 * step)
    torch.testing.assert_close(grad, fd.reshape(grad.shape), rtol=1e-6, atol=1e-9)
    assert grad.abs() > 1.0  # a real signal, not a vacuous zero


def test_defaults_are_standardize_and_a_learned_constant_mean():
    """SingleTaskGP's defaults: raw targets like 100 + 10 sin are predicted, not ~0."""
    X = make_data(120)[0]
    f = lambda X: 100 + 10 * torch.sin(3 * X).sum(-1, keepdim=True)  # noqa: E731
    model = OnlineSoftKIGP(
        X[:80],
        f(X[:80]),
        input_transform=Normalize(D, bounds=BOUNDS),
        num_inducing=16,
        pretrain_epochs=2,
        pretrain_options={"batch_size": 40, "seed": 0},
    )
    assert isinstance(model.outcome_transform, Standardize)
    assert type(model.mean_module) is ConstantMean
    assert model.mean_module.constant.item() != 0.0  # the pretraining learned it
    assert "mean_module.raw_constant" in model.state_dict()
    assert not model.is_data_key("mean_module.raw_constant")  # a hyperparameter
    model.observe(X[80:], f(X[80:]))
    Xs = make_data(20)[0]
    assert (model.posterior(Xs).mean - f(Xs)).abs().max() < 10


def test_zero_mean_is_the_model_without_a_mean():
    X, Y = make_data(50)
    Z = torch.rand(12, D, dtype=DTYPE)
    zero, at_zero = frozen(X, Y, Z), frozen(X, Y, Z, mean_module=constant_mean(0.0))
    assert type(zero.mean_module) is ZeroMean and zero._prior_mean() is None
    assert not any(name.startswith("mean_module") for name, _ in zero.named_parameters())
    Xs = make_data(5)[0]
    assert_same_posterior(zero, at_zero, Xs, atol=1e-12)
    assert_same_mll(zero, at_zero, atol=1e-12)
    pretrained = OnlineSoftKIGP(
        X,
        Y,
        mean_module=ZeroMean(),
        outcome_transform=None,
        num_inducing=10,
        pretrain_epochs=1,
        pretrain_options={"batch_size": 25, "seed": 0},
    )
    assert type(pretrained.mean_module) is ZeroMean and pretrained._prior_mean() is None


def test_pretraining_online_refits_and_refit_points_learn_the_constant():
    """A large offset, no transform: every fit moves the constant towards the data."""
    X, Y = make_data(120)
    Y = Y + 20.0
    options = {
        "input_transform": Normalize(D, bounds=BOUNDS),
        "outcome_transform": None,
        "num_inducing": 12,
        "keep_data": True,
    }
    pretrained = OnlineSoftKIGP(
        X[:60],
        Y[:60],
        pretrain_epochs=10,
        pretrain_options={"batch_size": 30, "lr": 0.3, "seed": 0},
        **options,
    )
    assert pretrained.mean_module.constant.item() > 2.0  # Adam, at most ~lr per step
    model = OnlineSoftKIGP(X[:60], Y[:60], pretrain_epochs=0, **options)
    assert model.mean_module.constant.item() == 0.0
    model.refit_points(num_epochs=10, batch_size=30, lr=0.3, seed=0)
    assert model.mean_module.constant.item() > 2.0
    model.observe(X[60:], Y[60:])
    Z, T = model.inducing_points.clone(), model.temperature.clone()
    fit_gpytorch_mll(
        ExactMarginalLogLikelihood(model.likelihood, model),
        optimizer_kwargs={"options": {"maxiter": 40}},
    )
    assert abs(model.mean_module.constant.item() - Y.mean().item()) < 2.0
    assert torch.equal(model.inducing_points, Z) and torch.equal(model.temperature, T)
    Xs = make_data(10)[0]
    assert (model.posterior(Xs).mean - target(Xs) - 20.0).abs().max() < 5.0  # not ~0


def test_restandardize_moves_the_constant_with_the_standardisation():
    """``alpha y + beta``: the constant becomes ``alpha c + beta``; the model is unchanged."""
    X, Y = make_data(60)
    Y = 3.0 + 2.0 * Y
    model = frozen(
        X[:10],
        Y[:10],
        torch.rand(12, D, dtype=DTYPE),
        keep_data=True,
        outcome_transform=Standardize(1),
        mean_module=constant_mean(0.4),
    )
    model.observe(X[10:], Y[10:])
    Xs = make_data(6)[0]
    before = model.posterior(Xs)
    before_mean, before_covar = before.mean.detach(), before.covariance_matrix.detach()
    old_mean, old_std = model.outcome_transform.means.item(), model.outcome_transform.stdvs.item()
    model.restandardize()
    alpha = old_std / Y.std().item()
    beta = (old_mean - Y.mean().item()) / Y.std().item()
    assert model.mean_module.constant.item() == pytest.approx(alpha * 0.4 + beta, abs=1e-12)
    after = model.posterior(Xs)
    torch.testing.assert_close(after.mean, before_mean, atol=1e-9, rtol=0)
    torch.testing.assert_close(after.covariance_matrix, before_covar, atol=1e-9, rtol=0)


def test_constant_mean_survives_warm_start_and_checkpoint():
    X, Y = make_data(60)
    Z = torch.rand(10, D, dtype=DTYPE)
    model = frozen(X[:40], Y[:40], Z, mean_module=constant_mean())
    model.observe(X[40:], Y[40:])
    other_X, other_Y = make_data(17)
    warm = frozen(other_X, other_Y, Z, mean_module=ConstantMean())
    warm.load_state_dict(model.state_dict())  # the hyperparameters, not the data
    assert warm.mean_module.constant.item() == MEAN and warm.num_train == 17
    resumed = frozen(other_X, other_Y, Z, mean_module=ConstantMean())
    resumed.restore(model.checkpoint())
    assert resumed.mean_module.constant.item() == MEAN
    Xs = make_data(5)[0]
    pa, pb = model.posterior(Xs), resumed.posterior(Xs)
    assert torch.equal(pa.mean, pb.mean) and torch.equal(pa.variance, pb.variance)


def test_an_observation_far_from_the_points_warns():
    # (issue 37: an observation at x = 1e6 was absorbed silently, moving the mean by ~25)
    X = 0.1 + 0.8 * torch.rand(
        30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    Y = torch.sin(4 * X).sum(-1, keepdim=True)
    model = OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0, keep_data=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FarFromPointsWarning)
        model.observe(X[:3] * 1.1, Y[:3])  # near the data: no warning
    far = torch.tensor([[1e6, 1e6]], dtype=torch.float64)
    with pytest.warns(FarFromPointsWarning, match="far outside the region"):
        model.observe(far, torch.tensor([[50.0]], dtype=torch.float64))
    assert model.num_train == 34  # absorbed (and said), not lost


@pytest.mark.parametrize("cls", [SoftKIGP, OnlineSoftKIGP], ids=lambda c: c.__name__)
def test_a_prediction_far_from_every_point_warns(cls):
    # (issue 37: far from its points SoftKI predicts as at the nearest ones, a variance
    # of 0.005-0.03 at x = 1e6 where the prior's is about 1: said, not silent)
    X = 0.1 + 0.8 * torch.rand(
        30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    model = cls(X, torch.sin(4 * X).sum(-1, keepdim=True), num_inducing=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FarFromPointsWarning)
        model.posterior(torch.rand(5, 2, dtype=torch.float64) * 1.2 - 0.1)  # near: silent
    far = torch.tensor([[1e6, 1e6]], dtype=torch.float64)
    with pytest.warns(FarFromPointsWarning, match="does not revert to the prior"):
        model.posterior(far)
    with pytest.warns(FarFromPointsWarning, match="absorbed"):  # a fantasy there too
        model.condition_on_observations(far, torch.tensor([[50.0]], dtype=torch.float64))


def _far_stream():
    generator = torch.Generator().manual_seed(0)
    X = 0.1 + 0.8 * torch.rand(30, 2, dtype=DTYPE, generator=generator)
    f = lambda X: torch.sin(4 * X).sum(-1, keepdim=True)  # noqa: E731
    X_far = torch.tensor([[3.0, 0.5], [2.6, 0.3], [2.8, -1.5]], dtype=DTYPE)
    return (X, f(X)), (X_far, f(X_far))


def test_a_far_batch_moves_the_points_over_it_exactly():
    # Issue 35 item 1: the points follow the data, as the grid models' grids do.
    (X, Y), (X_far, Y_far) = _far_stream()
    # Keeps the data and follows it by default; no transform, so that the oracle below
    # (a model built at once) standardises nothing differently.
    model = OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0, outcome_transform=None)
    old_points, old_box = model.inducing_points.clone(), model.interpolation.bounds
    assert model.interpolation.far(X_far)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FarFromPointsWarning)  # followed, not warned
        model.observe(X_far, Y_far)
    # The points' box is the grown box over the batch, the points its affine image.
    new_box = grown_grid_bounds(old_box, X_far)
    torch.testing.assert_close(model.interpolation.bounds, new_box, rtol=0, atol=1e-12)
    scale = (new_box[1] - new_box[0]) / (old_box[1] - old_box[0])
    torch.testing.assert_close(
        model.inducing_points, new_box[0] + (old_points - old_box[0]) * scale, rtol=0, atol=1e-12
    )
    assert not model.interpolation.far(X_far)
    # The model equals one built on all the data with these points and hyperparameters.
    X_all, Y_all = torch.cat([X, X_far]), torch.cat([Y, Y_far])
    rebuilt = OnlineSoftKIGP(
        X_all,
        Y_all,
        covar_module=copy.deepcopy(model.covar_module),
        likelihood=copy.deepcopy(model.likelihood),
        outcome_transform=None,
        mean_module=copy.deepcopy(model.mean_module),
        inducing_points=model.inducing_points,
        temperature=model.temperature.item(),
        pretrain_epochs=0,
    )
    X_test = torch.rand(20, 2, dtype=DTYPE) * 3 - 0.5
    with torch.no_grad():
        a, b = model.posterior(X_test), rebuilt.posterior(X_test)
    torch.testing.assert_close(a.mean, b.mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(a.variance, b.variance, rtol=0, atol=1e-10)


def test_points_stay_for_a_batch_near_them_and_without_follow_data():
    (X, Y), (X_far, Y_far) = _far_stream()
    model = OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0)
    points = model.inducing_points.clone()
    model.observe(X[:3] * 1.1, Y[:3])
    assert torch.equal(model.inducing_points, points)
    still = OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0, follow_data=False)
    with pytest.warns(FarFromPointsWarning, match="far outside the region"):
        still.observe(X_far, Y_far)
    assert torch.equal(still.inducing_points, points) and still.num_train == 33
    with pytest.raises(TypeError, match="follow_data must be a bool"):
        OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0, follow_data=1)


def test_following_survives_a_checkpoint():
    (X, Y), (X_far, Y_far) = _far_stream()
    model = OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0)
    receiver = OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0, follow_data=False)
    receiver.restore(model.checkpoint())
    assert receiver.follow_data
    for m in (model, receiver):
        m.observe(X_far, Y_far)
    assert torch.equal(model.inducing_points, receiver.inducing_points)


# ------------------------------------------------------------- moving the points
@pytest.mark.usefixtures("ski_prior_variance")
def test_set_points_equals_a_model_built_on_the_kept_data_with_those_points():
    X, Y = make_data(80)
    model = frozen(X[:50], Y[:50], torch.rand(10, D, dtype=DTYPE), keep_data=True)
    model.observe(X[50:], Y[50:])
    Z = torch.rand(17, D, dtype=DTYPE)
    hyper = {k: v.clone() for k, v in model.state_dict().items() if not model.is_data_key(k)}
    assert model.set_points(Z, 0.07) is model
    assert model.num_inducing == 17 and model.temperature.item() == pytest.approx(0.07)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in hyper.items())  # unchanged
    rebuilt = OnlineSoftKIGP(
        X,
        Y,
        likelihood=likelihood(),
        covar_module=kernel(),
        input_transform=Normalize(D, bounds=BOUNDS),
        outcome_transform=None,
        mean_module=ZeroMean(),
        inducing_points=Z,
        temperature=0.07,
        pretrain_epochs=0,
    )
    Xs = torch.rand(5, D, dtype=DTYPE)
    assert_same_posterior(model, rebuilt, Xs)
    # ... and the dense SoftKI closed form on all (transformed) data with the new points.
    mean, covar, mll = dense(model, normalized(X), Y.squeeze(-1), normalized(Xs))
    posterior = model.posterior(Xs)
    torch.testing.assert_close(posterior.mean.squeeze(-1), mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(posterior.covariance_matrix, covar, atol=1e-8, rtol=0)
    torch.testing.assert_close(model.fit_objective()[0], mll, atol=1e-8, rtol=0)
    # The stream goes on from the moved points; None keeps the temperature.
    model.observe(X[:3], Y[:3])
    model.set_points(Z[:9])
    assert model.temperature.item() == pytest.approx(0.07) and model.num_inducing == 9


def test_set_points_refuses_bad_input_and_leaves_the_model_unchanged():
    X, Y = make_data(30)
    model = frozen(X, Y, torch.rand(10, D, dtype=DTYPE), keep_data=True)
    model.posterior(X[:2])
    before, Z = _snapshot(model), torch.rand(6, D, dtype=DTYPE)
    for call, error, match in [
        (lambda: model.set_points(Z.float()), TypeError, "points"),
        (lambda: model.set_points(Z[:, :2]), ValueError, "points"),
        (lambda: model.set_points(Z[:0]), ValueError, "points"),
        (lambda: model.set_points(Z * math.nan), ValueError, "points"),
        (lambda: model.set_points(Z, -1.0), ValueError, "temperature"),
        (lambda: model.set_points(Z, torch.tensor([0.1, 0.2])), ValueError, "temperature"),
    ]:
        with pytest.raises(error, match=match):
            call()
        after = _snapshot(model)
        assert before.keys() == after.keys() and all(
            torch.equal(before[k], after[k]) for k in before
        )
    with pytest.raises(RuntimeError, match="keep_data"):
        frozen(X, Y, Z, keep_data=False).set_points(Z)
    with pytest.raises(RuntimeError, match="condition_on_observations"):
        model.condition_on_observations(X[:2], Y[:2]).set_points(Z)
