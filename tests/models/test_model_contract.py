"""The contract every streamgp model keeps with BoTorch, checked model by model.

Posterior shapes (``q = 1``, ``q = 3``, batched), observation noise, input and outcome
transforms, a ``state_dict`` round trip, invalid input (an error, and the model left as
it was), ``condition_on_observations`` against a dense Gaussian oracle, and qNIPV / qKG
values against a dense fantasy oracle (``JointGaussianOracle``: the model's own joint
posterior, conditioned by dense Gaussian algebra).
"""

from __future__ import annotations

import copy

import pytest
import torch
from botorch.acquisition import qKnowledgeGradient, qNegIntegratedPosteriorVariance
from botorch.models.transforms import Normalize, Standardize
from botorch.sampling import SobolQMCNormalSampler
from oracles import DenseSKIModel, JointGaussianOracle, gaussian_conditioning, rel_err

from streamgp.models import (
    AdditiveWiskiGP,
    DecoupledSVGP,
    KissGP,
    LocalGP,
    OnlineSGPR,
    OnlineSoftKIGP,
    OnlineSVGP,
    SoftKIGP,
    WiskiGP,
)

DIM = 2
BUILDERS = {
    "WiskiGP": lambda X, Y, **kw: WiskiGP(X, Y, grid_size=8, **kw),
    "AdditiveWiskiGP": lambda X, Y, **kw: AdditiveWiskiGP(X, Y, grid_size=8, **kw),
    "KissGP": lambda X, Y, **kw: KissGP(X, Y, grid_size=8, **kw),
    "OnlineSGPR": lambda X, Y, **kw: OnlineSGPR(X, Y, num_inducing=8, **kw),
    "OnlineSVGP": lambda X, Y, **kw: OnlineSVGP(X, Y, num_inducing=8, num_init_steps=3, **kw),
    "DecoupledSVGP": lambda X, Y, **kw: DecoupledSVGP(
        X, Y, max_mean_basis=16, max_covar_basis=8, minibatch_size=16, num_init_steps=3, **kw
    ),
    "LocalGP": lambda X, Y, **kw: LocalGP(X, Y, n_max=8, **kw),
    "SoftKIGP": lambda X, Y, **kw: SoftKIGP(X, Y, num_inducing=8, **kw),
    "OnlineSoftKIGP": lambda X, Y, **kw: OnlineSoftKIGP(
        X, Y, num_inducing=8, pretrain_epochs=0, **kw
    ),
}
#: Models whose ``condition_on_observations`` is the exact Gaussian update of their
#: predictive (OnlineSGPR conditions ``q(u)``: its oracle is in test_osgpr.py).
EXACT_CONDITIONING = (
    "WiskiGP",
    "AdditiveWiskiGP",
    "KissGP",
    "OnlineSVGP",
    "DecoupledSVGP",
    "SoftKIGP",
    "OnlineSoftKIGP",
)


def _data(n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    X = 0.1 + 0.8 * torch.rand(n, DIM, generator=generator, dtype=torch.float64)
    Y = torch.sin(4 * X).sum(-1, keepdim=True)
    Y = (Y - Y.mean()) / Y.std()  # already standardized: Standardize() is then the identity
    return X, Y


def _build(name: str, X=None, Y=None, **options):
    if X is None:
        X, Y = _data()
    torch.manual_seed(0)
    return BUILDERS[name](X, Y, **options)


def _test_points(*batch: int, q: int = 3, dim: int = DIM) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return 0.1 + 0.8 * torch.rand(*batch, q, dim, generator=generator, dtype=torch.float64)


def _moments(model, X, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        posterior = model.posterior(X, **kwargs)
        return posterior.mean, posterior.variance


@pytest.fixture(scope="module", params=list(BUILDERS))
def built(request):
    return request.param, _build(request.param)


def test_posterior_shapes(built):
    name, model = built
    for X, shape in (
        (_test_points(q=1), (1, 1)),
        (_test_points(q=3), (3, 1)),
        (_test_points(4, q=3), (4, 3, 1)),
    ):
        mean, variance = _moments(model, X)
        assert mean.shape == variance.shape == shape, name
        assert torch.isfinite(mean).all() and (variance > 0).all(), name
        assert model.posterior(X).distribution.covariance_matrix.shape == (*shape[:-1], shape[-2])


def test_observation_noise_adds_the_noise_variance(built):
    name, model = built
    X = _test_points(q=3)
    _, latent = _moments(model, X)
    _, noisy = _moments(model, X, observation_noise=True)
    noise = model.noise_variance.detach()
    assert rel_err(noisy - latent, noise.expand_as(latent)) < 1e-8, name
    given = torch.full((3, 1), 0.25, dtype=torch.float64)
    _, explicit = _moments(model, X, observation_noise=given)
    assert rel_err(explicit - latent, given) < 1e-8, name


@pytest.mark.parametrize("name", list(BUILDERS))
def test_transforms_act_in_the_original_spaces(name):
    # Data given in other units through (fixed-bounds) Normalize and Standardize: the
    # model sees the same transformed data, so it predicts the same, in the new units.
    X, Y = _data()
    low, high, scale, shift = -2.0, 3.0, 7.0, 5.0
    plain = _build(name, X, Y)
    bounds = torch.tensor([[low] * DIM, [high] * DIM], dtype=torch.float64)
    transformed = _build(
        name,
        low + (high - low) * X,
        scale * Y + shift,
        input_transform=Normalize(d=DIM, bounds=bounds),
        outcome_transform=Standardize(m=1),
    )
    X_test = _test_points(q=3)
    mean, variance = _moments(plain, X_test)
    mean_t, variance_t = _moments(transformed, low + (high - low) * X_test)
    assert rel_err(mean_t, scale * mean + shift) < 1e-6, name
    assert rel_err(variance_t, scale**2 * variance) < 1e-6, name


def test_state_dict_round_trip(built):
    name, model = built
    other = _build(name)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.1)
    state = copy.deepcopy(model.state_dict())
    if name == "KissGP":  # a batch model: torch's load_state_dict
        other.load_state_dict(state)
    else:  # restore the whole stream, not only the hyperparameters
        other.load_state_dict(state, keep_transforms=False)
    X = _test_points(2, q=3)
    for a, b in zip(_moments(other, X), _moments(model, X), strict=True):
        assert rel_err(a, b) < 1e-8, name


@pytest.mark.parametrize("bad", ["wrong_d", "nan"])
def test_bad_input_raises_and_leaves_the_model_unchanged(built, bad):
    name, model = built
    X = _test_points(q=3)
    bad_X = _test_points(q=3, dim=DIM + 1) if bad == "wrong_d" else X.clone()
    if bad == "nan":
        bad_X[1, 0] = float("nan")
    Y = torch.zeros(3, 1, dtype=torch.float64)
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    before = _moments(model, X)
    with pytest.raises(ValueError):
        model.posterior(bad_X)
    if hasattr(model, "observe"):
        with pytest.raises(ValueError):
            model.observe(bad_X, Y)
    if name != "LocalGP":
        with pytest.raises(ValueError):
            model.condition_on_observations(bad_X, Y)
    after_state = model.state_dict()
    assert before_state.keys() == after_state.keys(), name
    for key, value in before_state.items():
        assert torch.equal(value, after_state[key]), (name, key)
    for a, b in zip(_moments(model, X), before, strict=True):
        assert torch.equal(a, b), name


# The exact prior variance's diagonal is prediction-only (the data fit stays SKI's), so a
# conditioned model is SKI's Gaussian update plus that diagonal at its test points, not the
# update of the corrected joint: these contracts are of the exact SKI posterior
# (tests/models/test_exact_prior_variance.py tests the default's fantasies).
@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("name", EXACT_CONDITIONING)
def test_conditioning_is_the_gaussian_update_of_the_predictive(name):
    model = _build(name)
    X_q = _test_points(q=3) * 0.5 + 0.2
    Y_q = torch.tensor([[0.3], [-0.2], [0.5]], dtype=torch.float64)
    X_s = _test_points(q=4)
    mean, covar = (
        t.detach()
        for t in (
            model.posterior(torch.cat([X_q, X_s])).mean.squeeze(-1),
            model.posterior(torch.cat([X_q, X_s])).distribution.covariance_matrix,
        )
    )
    noise = model.noise_variance.detach().expand(3)
    expected_mean, expected_covar = gaussian_conditioning(mean, covar, 3, Y_q.squeeze(-1), noise)
    conditioned = model.condition_on_observations(X_q, Y_q)
    posterior = conditioned.posterior(X_s)
    assert rel_err(posterior.mean.squeeze(-1).detach(), expected_mean) < 1e-6, name
    got_covar = posterior.distribution.covariance_matrix.detach()
    assert rel_err(got_covar, expected_covar) < 1e-6, name


#: Models with ``fantasize`` (LocalGP has none). All but OnlineSGPR condition their
#: predictive exactly; OnlineSGPR's observations see ``f`` only through ``u`` (the
#: projected process), so its fantasies are the exact update of the joint of
#: ``[E[f | u](X_c), f(X_s)]``: its predictive minus the Nystrom residual on the blocks
#: of the conditioning points (the oracle's ``residual``).
FANTASIZING = (*EXACT_CONDITIONING, "OnlineSGPR")


def _projected_process_residual(model):
    r"""``K - K_.Z (K_ZZ + jitter)^{-1} K_Z.``: the covariance of ``f`` that ``u`` misses."""
    sparse = model.sparse_posterior()
    Z, L, kernel = sparse.points, sparse.chol, model.covar_module

    def residual(X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        Z_b = Z.expand(*X1.shape[:-2], *Z.shape)
        K_1Z, K_Z2 = kernel(X1, Z_b).to_dense(), kernel(Z_b, X2).to_dense()
        return kernel(X1, X2).to_dense() - K_1Z @ torch.cholesky_solve(K_Z2, L)

    return residual


def _sobol(n: int) -> SobolQMCNormalSampler:
    return SobolQMCNormalSampler(sample_shape=torch.Size([n]), seed=1)


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("acquisition", ["qNIPV", "qKG"])
@pytest.mark.parametrize("name", FANTASIZING)
def test_lookahead_acquisitions_match_the_dense_fantasy_oracle(name, acquisition):
    # Candidates b x q x d (plus qKG's fantasy solutions); the oracle draws the same
    # fantasies (it is the model until conditioned) and conditions them densely.
    model = _build(name)
    residual = _projected_process_residual(model) if name == "OnlineSGPR" else None
    oracle = JointGaussianOracle(model, residual)
    mc_points = _test_points(q=16)

    def build(m):
        if acquisition == "qNIPV":
            return qNegIntegratedPosteriorVariance(m, mc_points=mc_points, sampler=_sobol(1))
        return qKnowledgeGradient(m, num_fantasies=4, sampler=_sobol(4))

    acq, acq_oracle = build(model), build(oracle)
    q = 2
    q_total = acq.get_augmented_q_batch_size(q) if acquisition == "qKG" else q
    X = _test_points(3, q=q_total) * 0.5 + 0.2
    with torch.no_grad():
        values, expected = acq(X), acq_oracle(X)
    assert values.shape == expected.shape == (3,), name
    assert torch.isfinite(values).all(), name
    assert rel_err(values, expected) < 1e-8, (name, rel_err(values, expected))


@pytest.mark.usefixtures("ski_prior_variance")
def test_wiski_conditioning_matches_the_dense_ski_oracle():
    X, Y = _data()
    model = _build("WiskiGP", X, Y)
    oracle = DenseSKIModel(model, X, Y.squeeze(-1), None)
    X_q, Y_q = _test_points(2, q=3), torch.randn(2, 3, 1, dtype=torch.float64)
    X_s = _test_points(q=4)
    got = model.condition_on_observations(X_q, Y_q).posterior(X_s)
    want = oracle.condition_on_observations(X_q, Y_q).posterior(X_s)
    assert rel_err(got.mean.detach(), want.mean.detach()) < 1e-8
    assert rel_err(got.variance.detach(), want.variance.detach()) < 1e-8


@pytest.mark.parametrize(
    ("model_cls", "old_name", "options"),
    [
        (OnlineSVGP, "learn_inducing_locations", {"num_inducing": 4, "num_init_steps": 0}),
        (DecoupledSVGP, "learn_basis_locations", {"max_covar_basis": 4, "num_init_steps": 0}),
    ],
)
def test_one_name_for_learning_inducing_points(model_cls, old_name, options):
    X, Y = _data(12)
    for learn in (False, True):
        model = model_cls(X, Y, learn_inducing_points=learn, **options)
        assert all(p.requires_grad == learn for p in _inducing_parameters(model))
    # The old per-model names are gone (one name, as BoTorch's variational GPs call it).
    with pytest.raises(TypeError, match=old_name):
        model_cls(X, Y, **{old_name: False}, **options)


def _inducing_parameters(model) -> list[torch.Tensor]:
    if isinstance(model, DecoupledSVGP):
        return [model.mean_basis, model.covar_basis]
    return [model.model.variational_strategy.inducing_points]


@pytest.mark.parametrize("noise", ["negative", "nan", "not a tensor"])
def test_bad_observation_noise_raises_naming_it(built, noise):
    # (issue 37, item 9: a negative or NaN observation_noise was accepted by every model)
    name, model = built
    X = _test_points(q=3)
    value = {"negative": -1.0, "nan": float("nan")}.get(noise)
    bad = "0.1" if value is None else torch.full((3, 1), value, dtype=torch.float64)
    error = TypeError if noise == "not a tensor" else ValueError
    with pytest.raises(error, match="observation_noise"):
        model.posterior(X, observation_noise=bad)
    zero = torch.zeros(3, 1, dtype=torch.float64)  # noise-free observations are allowed
    _, latent = _moments(model, X)
    torch.testing.assert_close(_moments(model, X, observation_noise=zero)[1], latent)
