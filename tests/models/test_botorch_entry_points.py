"""Every streamgp model through BoTorch's own entry points, as client code written for SingleTaskGP.

BoTorch's closed-loop tutorial: objective and constraint as a ``ModelListGP``, fitted with
``fit_gpytorch_mll(SumMarginalLogLikelihood(...))``, qLogEI and qLogNEI with constraints,
and a rebuild on all data warm-started with ``load_state_dict``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from botorch.acquisition.logei import qLogExpectedImprovement, qLogNoisyExpectedImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.optim.closures import get_loss_closure
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood
from oracles import without_defaults
from oracles.sgpr import rel_err, titsias

from streamgp.interpolation.grid import GridExtrapolationWarning
from streamgp.models import (
    DecoupledSVGP,
    KissGP,
    LocalGP,
    OnlineSGPR,
    OnlineSoftKIGP,
    OnlineSVGP,
    SoftKIGP,
    WiskiGP,
)

DTYPE = torch.float64
BOUNDS = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=DTYPE)

FACTORIES = {
    "WiskiGP": lambda X, Y, **kw: WiskiGP(X, Y, grid_size=8, **kw),
    "KissGP": lambda X, Y, **kw: KissGP(X, Y, grid_size=8, **kw),
    "OnlineSGPR": lambda X, Y, **kw: OnlineSGPR(X, Y, num_inducing=8, **kw),
    "OnlineSVGP": lambda X, Y, **kw: OnlineSVGP(X, Y, num_inducing=6, num_init_steps=30, **kw),
    "DecoupledSVGP": lambda X, Y, **kw: DecoupledSVGP(X, Y, num_init_steps=30, **kw),
    "LocalGP": lambda X, Y, **kw: LocalGP(X, Y, w_gen=0.3, n_max=40, **kw),
    "SoftKIGP": lambda X, Y, **kw: SoftKIGP(X, Y, num_inducing=8, **kw),
    "OnlineSoftKIGP": lambda X, Y, **kw: OnlineSoftKIGP(
        X, Y, num_inducing=8, pretrain_epochs=2, **kw
    ),
}
#: State kept from the receiving model's data but re-optimised for the loaded
#: hyperparameters (tested in test_osvgp.py and test_svdgp.py).
REOPTIMISED_AFTER_WARM_START = {
    "OnlineSVGP": ("model.variational_strategy._variational_distribution.",),
    "DecoupledSVGP": ("mean_weights", "covar_root"),
}
LEARNED_NOISE_ONLY = ["OnlineSGPR", "OnlineSVGP", "DecoupledSVGP", "LocalGP", "SoftKIGP"]


def _problem(X):
    objective = -(X - 0.4).square().sum(-1, keepdim=True) + 0.05 * torch.randn(len(X), 1)
    constraint = X.sum(-1, keepdim=True) - 1.5  # feasible when <= 0
    return objective.to(DTYPE), constraint


def _build(name, X, Y):
    kw = {"input_transform": Normalize(3, bounds=BOUNDS), "outcome_transform": Standardize(1)}
    return FACTORIES[name](X, Y, **kw)


def _num_data(model) -> int:
    if isinstance(model, KissGP | WiskiGP | OnlineSGPR):  # OnlineSoftKIGP is a WiskiGP
        return model.num_train
    if isinstance(model, LocalGP):
        return int(model.counts.sum())
    if isinstance(model, SoftKIGP):
        return len(model.train_X_t)
    return model.num_observed


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FACTORIES))
def test_closed_loop_tutorial_pattern(name):
    X = torch.rand(12, 3, dtype=DTYPE)
    Y = torch.cat(_problem(X), dim=-1)
    state_dict = None
    objective = GenericMCObjective(lambda Z, X=None: Z[..., 0])
    constraints = [lambda Z: Z[..., 1]]
    for _ in range(2):
        model = ModelListGP(*[_build(name, X, Y[:, i : i + 1]) for i in range(2)])
        if state_dict is not None:
            model.load_state_dict(state_dict)
            assert all(_num_data(m) == len(X) for m in model.models)  # nothing lost
        fit_gpytorch_mll(SumMarginalLogLikelihood(model.likelihood, model))
        assert not model.training
        sampler = SobolQMCNormalSampler(torch.Size([16]))
        feasible = Y[:, 1] <= 0
        best = Y[feasible, 0].max() if feasible.any() else Y[:, 0].min()
        candidates = []
        for acqf in (
            qLogExpectedImprovement(
                model, best, sampler, objective=objective, constraints=constraints
            ),
            qLogNoisyExpectedImprovement(
                model, X, sampler, objective=objective, constraints=constraints
            ),
        ):
            new_X, value = optimize_acqf(acqf, BOUNDS, q=2, num_restarts=2, raw_samples=16)
            assert new_X.shape == (2, 3) and torch.isfinite(value)
            candidates.append(new_X)
        new_X = torch.cat(candidates)
        X, Y = torch.cat([X, new_X]), torch.cat([Y, torch.cat(_problem(new_X), dim=-1)])
        state_dict = model.state_dict()
    # The list's joint posterior is the models' posteriors, output by output.
    Xs = torch.rand(4, 3, dtype=DTYPE)
    post = model.posterior(Xs[None].expand(2, 4, 3))
    for i, sub in enumerate(model.models):
        single = sub.posterior(Xs[None].expand(2, 4, 3))
        assert rel_err(post.mean[..., i], single.mean[..., 0]) < 1e-12
        assert rel_err(post.variance[..., i], single.variance[..., 0]) < 1e-12
    if name == "LocalGP":  # local experts do not condition on fantasies
        return
    # Fantasies through the list (what qKG / qNIPV do): one batch per fantasy.
    fantasy = model.fantasize(Xs[:2], SobolQMCNormalSampler(torch.Size([3])))
    assert fantasy.posterior(Xs).mean.shape == (3, 4, 2)


@pytest.mark.parametrize("name", ["WiskiGP", "SoftKIGP", "OnlineSGPR", "OnlineSoftKIGP"])
def test_gpytorch_hand_written_loop_is_refused_and_the_named_loop_fits(name):
    # Their forward is the posterior: -mll(model(train_x), train_y) scored it, silently,
    # with no gradient in the kernel (on a ModelListGP through the summed likelihood too).
    X = torch.rand(15, 3, dtype=DTYPE)
    model = _build(name, X, _problem(X)[0])
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    state = copy.deepcopy(model.state_dict())
    X_t = model.transform_inputs(X)
    y_t = torch.zeros(len(X), dtype=DTYPE)  # (refused before the targets are read)
    with pytest.raises(RuntimeError, match=f"{name}.X. was called in training mode"):
        mll(model(X_t), y_t)
    with pytest.raises(RuntimeError, match="call model.eval"):
        model(X_t).mean  # noqa: B018
    listed = ModelListGP(_build(name, X, _problem(X)[0]), _build(name, X, _problem(X)[1]))
    summed = SumMarginalLogLikelihood(listed.likelihood, listed)
    summed.train()
    with pytest.raises(RuntimeError, match="compute_custom_loss"):
        summed(listed(X_t, X_t), [y_t, y_t])
    for key, value in model.state_dict().items():  # nothing changed
        assert torch.equal(value, state[key]), key
    # The loop the message names: the model's objective, as fit_gpytorch_mll's closure.
    # (BoTorch's noise constraint has no transform: a plain optimizer must leave it alone.)
    kernel = [p for n, p in model.named_parameters() if "noise" not in n and p.requires_grad]
    optimizer = torch.optim.Adam(kernel, lr=0.05)
    before = model.compute_custom_loss(mll).item()
    assert before == pytest.approx(get_loss_closure(mll)().item(), rel=1e-12)
    for _ in range(10):
        optimizer.zero_grad()
        model.compute_custom_loss(mll).backward()
        optimizer.step()
    assert model.compute_custom_loss(mll).item() < before
    model.eval()  # in eval mode the forward is the posterior (of the transformed outcome)
    assert torch.isfinite(model(model.transform_inputs(X)).mean).all()


@pytest.mark.parametrize("name", ["OnlineSVGP", "DecoupledSVGP", "LocalGP"])
@pytest.mark.parametrize("training", [True, False])
def test_models_without_a_latent_forward_refuse_model_x_naming_posterior(name, training):
    X = torch.rand(15, 3, dtype=DTYPE)
    model = _build(name, X, _problem(X)[0])
    model.train(training)
    with pytest.raises(NotImplementedError, match=rf"{name}\(X\).*model.posterior\(X\)"):
        model(X)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_loss_closure_is_the_models_objective_and_fitting_improves_it(name):
    X = torch.rand(15, 3, dtype=DTYPE)
    model = _build(name, X, _problem(X)[0])
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    loss = get_loss_closure(mll)()
    if name == "KissGP":  # an ExactGP: gpytorch's own SKI likelihood on train_inputs
        reference = -mll(model(*model.train_inputs), model.train_targets)
    else:
        value, n = model.fit_objective()
        priors = sum(
            prior.log_prob(closure(module)).sum()
            for _, module, prior, closure, _ in model.named_priors()  # once each, as gpytorch
        )
        reference = -(value + priors) / n
    assert torch.allclose(loss, reference, rtol=1e-12)
    fit_gpytorch_mll(mll)
    mll.train()
    assert get_loss_closure(mll)().item() < loss.item()


def test_online_sgpr_fit_is_the_sgpr_fit_of_its_last_batch():
    """Built from one batch, the fit maximises Titsias' bound and the posterior follows."""
    X = torch.rand(30, 2, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(30, 1, dtype=DTYPE)
    model = OnlineSGPR(X, Y, inducing_points=X[:10], jitter=1e-10, **without_defaults())
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    value, n = model.fit_objective()
    with torch.no_grad():
        bound, *_ = titsias(
            model.covar_module, model.noise_variance, X, Y.squeeze(-1), X[:10], 1e-10
        )
    assert rel_err(value, bound) < 1e-10 and n == 30
    fit_gpytorch_mll(mll)
    # Re-absorbed at the fitted hyperparameters: a fresh model built with them.
    fresh = OnlineSGPR(
        X,
        Y,
        inducing_points=X[:10],
        jitter=1e-10,
        **without_defaults(),
        covar_module=copy.deepcopy(model.covar_module),
        likelihood=copy.deepcopy(model.likelihood),
    )
    Xs = torch.rand(6, 2, dtype=DTYPE)
    p, ref = model.posterior(Xs), fresh.posterior(Xs)
    assert rel_err(p.mean, ref.mean) < 1e-10
    assert rel_err(p.variance, ref.variance) < 1e-10
    assert rel_err(model.fit_objective()[0], fresh.fit_objective()[0]) < 1e-10


@pytest.mark.parametrize("name", list(FACTORIES))
def test_warm_start_loads_hyperparameters_and_keeps_the_data(name):
    X = torch.rand(30, 3, dtype=DTYPE)
    Y = _problem(X)[0]
    old = _build(name, X[:12], Y[:12])
    fit_gpytorch_mll(ExactMarginalLogLikelihood(old.likelihood, old))
    new = _build(name, X, Y)
    own_data = {k: v.clone() for k, v in new.state_dict().items() if _is_data(new, k)}
    new.load_state_dict(old.state_dict())
    assert _num_data(new) == 30
    state = new.state_dict()
    for key, value in old.state_dict().items():
        if _is_data(new, key):
            if name == "OnlineSGPR" and key.startswith("pseudo_"):
                continue  # its last batch is re-absorbed at the loaded values (next test)
            if key.startswith(REOPTIMISED_AFTER_WARM_START.get(name, ())):
                continue  # its q is re-set to its optimum at the loaded hyperparameters
            assert torch.equal(state[key], own_data[key]), key
        else:
            assert torch.equal(state[key], value), key


def _is_data(model, key: str) -> bool:
    # KissGP is an ExactGP holding its data: BoTorch's own load_state_dict loads the
    # transforms too and re-transforms the data with them.
    return model.is_data_key(key) if hasattr(model, "is_data_key") else False


@pytest.mark.parametrize("name", ["WiskiGP", "OnlineSGPR"])
def test_warm_started_predictions_equal_a_fresh_model_with_those_hyperparameters(name):
    X = torch.rand(30, 3, dtype=DTYPE)
    Y = _problem(X)[0]
    old = _build(name, X[:12], Y[:12])
    fit_gpytorch_mll(ExactMarginalLogLikelihood(old.likelihood, old))
    new = _build(name, X, Y)
    new.load_state_dict(old.state_dict())
    fresh = _build(name, X, Y)
    hyperparameters = {k: v for k, v in old.state_dict().items() if not _is_data(fresh, k)}
    torch.nn.Module.load_state_dict(fresh, hyperparameters, strict=False)
    if isinstance(fresh, OnlineSGPR):  # absorb at those values from the start
        fresh = OnlineSGPR(
            X,
            Y,
            num_inducing=8,
            covar_module=copy.deepcopy(fresh.covar_module),
            likelihood=copy.deepcopy(fresh.likelihood),
            mean_module=copy.deepcopy(fresh.mean_module),
            input_transform=Normalize(3, bounds=BOUNDS),
            outcome_transform=Standardize(1),
        )
    new.eval(), fresh.eval()
    Xs = torch.rand(6, 3, dtype=DTYPE)
    p, ref = new.posterior(Xs), fresh.posterior(Xs)
    assert rel_err(p.mean, ref.mean) < 1e-10
    assert rel_err(p.variance, ref.variance) < 1e-10


@pytest.mark.parametrize("name", LEARNED_NOISE_ONLY)
def test_known_noise_on_a_learned_noise_model_fails_at_construction(name):
    X = torch.rand(10, 3, dtype=DTYPE)
    Y = _problem(X)[0]
    with pytest.raises(ValueError, match="train_Yvar"):
        FACTORIES[name](X, Y, train_Yvar=torch.full_like(Y, 0.01))


@pytest.mark.parametrize("name", ["WiskiGP", "KissGP"])
def test_grid_models_predict_outside_the_box_at_its_nearest_point(name):
    X = torch.rand(12, 3, dtype=DTYPE)
    model = _build(name, X, _problem(X)[0])
    Xs = torch.tensor([[-0.05, 0.5, 1.1], [0.2, 0.3, 0.4]], dtype=DTYPE)
    with pytest.warns(GridExtrapolationWarning, match="nearest point"):
        outside = model.posterior(Xs)
    inside = model.posterior(Xs.clamp(0.0, 1.0))
    assert torch.equal(outside.mean, inside.mean)
    assert torch.equal(outside.variance, inside.variance)
    strict = FACTORIES[name](
        X, _problem(X)[0], input_transform=Normalize(3, bounds=BOUNDS), extrapolation="error"
    )
    with pytest.raises(ValueError, match="outside grid_bounds"):
        strict.posterior(Xs)
    with pytest.raises(ValueError, match="extrapolation"):
        FACTORIES[name](X, _problem(X)[0], extrapolation="linear")


@pytest.mark.parametrize("name", ["WiskiGP", "KissGP"])
def test_constrained_qlognei_without_a_feasible_point(name):
    """qLogNEI then estimates an infeasible cost from points beyond the search box."""
    X = torch.rand(10, 3, dtype=DTYPE)
    X[0], X[1] = 0.0, 1.0  # the data's box is the search box; the probe pads it by 10%
    objective_values = _problem(X)[0]
    infeasible = X.sum(-1, keepdim=True) + 5.0  # no point satisfies <= 0
    model = ModelListGP(*[_build(name, X, Y) for Y in (objective_values, infeasible)])
    fit_gpytorch_mll(SumMarginalLogLikelihood(model.likelihood, model))
    with pytest.warns(GridExtrapolationWarning):  # the infeasible-cost probe left the box
        acqf = qLogNoisyExpectedImprovement(
            model,
            X,
            SobolQMCNormalSampler(torch.Size([16])),
            objective=GenericMCObjective(lambda Z, X=None: Z[..., 0]),
            constraints=[lambda Z: Z[..., 1]],
            prune_baseline=False,
        )
    new_X, value = optimize_acqf(acqf, BOUNDS, q=2, num_restarts=2, raw_samples=16)
    assert new_X.shape == (2, 3) and torch.isfinite(value)


@pytest.mark.parametrize("name", [n for n in FACTORIES if n != "LocalGP"])
def test_model_list_condition_on_observations_conditions_every_member(name):
    # BoTorch's ModelListGP.condition_on_observations outcome-transforms the targets
    # itself and calls gpytorch's get_fantasy_model on every member.
    X = torch.rand(15, 3, dtype=DTYPE)
    Y = torch.cat(_problem(X), dim=-1)
    members = [_build(name, X, Y[:, [i]]) for i in range(2)]
    model_list = ModelListGP(*members).eval()
    X_new = torch.rand(2, 4, 3, dtype=DTYPE)  # a batch, as fantasies have
    Y_new = torch.rand(2, 4, 2, dtype=DTYPE)
    conditioned = model_list.condition_on_observations([X_new, X_new], Y_new)
    X_test = torch.rand(5, 3, dtype=DTYPE)
    with torch.no_grad():
        got = conditioned.posterior(X_test)
        for i, member in enumerate(members):
            expected = member.condition_on_observations(X_new, Y_new[..., [i]]).posterior(X_test)
            assert torch.allclose(got.mean[..., i], expected.mean[..., 0], atol=1e-10)
            assert torch.allclose(got.variance[..., i], expected.variance[..., 0], atol=1e-10)


@pytest.mark.parametrize("known_noise", [False, True])
def test_model_list_condition_on_observations_equals_single_task_gp_from_4d_on(known_noise):
    from botorch.models import SingleTaskGP

    X = torch.rand(20, 4, dtype=DTYPE)
    Y = torch.stack([X.sum(-1), X.prod(-1)], dim=-1)
    Yvar = torch.full_like(Y[:, :1], 1e-3) if known_noise else None
    exact = ModelListGP(*[SingleTaskGP(X, Y[:, [i]], Yvar) for i in range(2)])
    wiski = ModelListGP(*[WiskiGP(X, Y[:, [i]], Yvar) for i in range(2)])
    wiski.load_state_dict(exact.state_dict(), strict=False)
    exact.eval(), wiski.eval()
    X_new, X_test = torch.rand(3, 4, dtype=DTYPE), torch.rand(5, 4, dtype=DTYPE)
    Y_new = torch.rand(3, 2, dtype=DTYPE)
    # ModelListGP takes the noise in the targets' units and transforms it with them.
    noise = {"noise": torch.full_like(Y_new, 2e-3)} if known_noise else {}
    exact.posterior(X_test)  # SingleTaskGP needs a prediction before conditioning
    with torch.no_grad():
        expected = exact.condition_on_observations([X_new, X_new], Y_new, **noise)
        got = wiski.condition_on_observations([X_new, X_new], Y_new, **noise)
        expected, got = expected.posterior(X_test), got.posterior(X_test)
    assert torch.allclose(got.mean, expected.mean.squeeze(0), atol=1e-9)
    assert torch.allclose(got.variance, expected.variance.squeeze(0), atol=1e-9)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_subset_output_of_the_one_output_is_an_independent_copy(name):
    X = torch.rand(12, 3, dtype=DTYPE)
    model = _build(name, X, _problem(X)[0]).eval()
    subset = model.subset_output([0])
    assert subset is not model and type(subset) is type(model)
    X_test = torch.rand(4, 3, dtype=DTYPE)
    with torch.no_grad():
        assert torch.allclose(subset.posterior(X_test).mean, model.posterior(X_test).mean)
    with pytest.raises(ValueError, match=r"idcs must"):
        model.subset_output([1])
