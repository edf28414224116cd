"""WiskiGP in d >= 4: data space for good, the kernel evaluated exactly.

A product grid puts ``4^d`` cubic weights on every input, so ``WiskiGP`` never folds
rows into grid statistics there (its default grid has more than ``MAX_DENSE_GRID``
points), and in data space it evaluates its kernel exactly
(``evaluates_kernel_exactly``): it is an exact GP, checked against ``SingleTaskGP`` with
the same hyperparameters and against the dense oracle. With an explicit
``data_space_limit`` it keeps exact SKI instead, its rows factored per axis and never
formed flat: checked against the dense SKI oracle (which does form them).
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from oracles import DenseSKIModel, rel_err, without_defaults

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood
from streamgp.interpolation.grid import InterpolationWeights
from streamgp.models.wiski import UNLIMITED_DATA_SPACE, HighDimensionalGridWarning

DTYPE = torch.float64


class FactoredWiskiGP(WiskiGP):
    """A 6^4 grid (1,296 points) takes the factored path here, as 35^6 does by default:
    small enough for the dense oracle's ``m x m`` kernel matrix."""

    MAX_DENSE_GRID = 100


@contextlib.contextmanager
def factored_only():
    """Fail if any code path forms a row's flat ``4^d`` weights."""
    original = InterpolationWeights._flatten

    def refuse(self):
        raise AssertionError("the flat 4^d interpolation rows were formed")

    InterpolationWeights._flatten = refuse
    try:
        yield
    finally:
        InterpolationWeights._flatten = original


def make_data(n: int, d: int, fixed_noise: bool = False, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, dtype=DTYPE, generator=generator)
    Y = torch.sin(4 * X).sum(-1, keepdim=True)
    Yvar = 0.01 + 0.05 * torch.rand(n, 1, dtype=DTYPE, generator=generator)
    return X, Y, Yvar if fixed_noise else None


def small_model(X, Y, Yvar=None, exact: bool = True) -> FactoredWiskiGP:
    d = X.shape[-1]
    # An explicit data_space_limit keeps SKI (its rows factored per axis).
    limit = {} if exact else {"data_space_limit": 10**6}
    model = FactoredWiskiGP(
        X, Y, Yvar, grid_size=6, covar_module=ScaleKernel(RBFKernel(ard_num_dims=d)),
        **limit, **without_defaults(),
    )  # fmt: skip
    assert model.evaluates_kernel_exactly == exact
    # ARD lengthscales that differ per dimension catch axis-order mistakes.
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 0.7, 0.9], dtype=DTYPE)
    model.covar_module.outputscale = 1.3
    if Yvar is None:
        model.likelihood.noise = 0.04
    return model


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "ski"])
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_posterior_and_mll_match_the_dense_oracle_without_flat_rows(fixed_noise, exact):
    X, Y, Yvar = make_data(25, 4, fixed_noise)
    model = small_model(X, Y, Yvar, exact)
    limit = UNLIMITED_DATA_SPACE if exact else 10**6
    assert model.structured and model.data_space_limit == limit
    noise = None if Yvar is None else Yvar.squeeze(-1)
    oracle = DenseSKIModel(model, X, Y.squeeze(-1), noise, exact_prior_variance=True)
    Xs = torch.rand(2, 5, 4, dtype=DTYPE)
    mean, covar = oracle.latent(Xs)
    params = [p for p in model.parameters() if p.requires_grad]
    mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
    priors = sum(p.log_prob(c(m)).sum() for _, m, p, c, _ in mll.model.named_priors())
    reference = (oracle.log_marginal_likelihood() + priors) / len(X)
    ref_grads = torch.autograd.grad(reference, params)
    with factored_only():
        post = model.posterior(Xs)
        assert rel_err(post.mean.squeeze(-1), mean) < 1e-9
        assert rel_err(post.covariance_matrix, covar) < 1e-9
        value = mll()
        grads = torch.autograd.grad(value, params)
    assert abs(value.item() - reference.item()) < 1e-9 * abs(reference.item())
    for grad, ref in zip(grads, ref_grads, strict=True):
        assert rel_err(grad, ref) < 1e-8


@pytest.mark.usefixtures("ski_prior_variance")
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "ski"])
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_observe_and_fantasies_match_the_dense_oracle_without_flat_rows(fixed_noise, exact):
    X, Y, Yvar = make_data(30, 4, fixed_noise)
    model = small_model(X[:20], Y[:20], None if Yvar is None else Yvar[:20], exact)
    with factored_only():
        for start in (20, 25):
            part = slice(start, start + 5)
            model.observe(X[part], Y[part], None if Yvar is None else Yvar[part])
    assert model.in_data_space and model.num_train == 30
    oracle = DenseSKIModel(model, X, Y.squeeze(-1), None if Yvar is None else Yvar.squeeze(-1))
    Xf = torch.rand(3, 2, 4, dtype=DTYPE)
    noise = torch.full((3, 2, 1), 0.02, dtype=DTYPE) if fixed_noise else None
    fo = oracle.fantasize(
        Xf, SobolQMCNormalSampler(torch.Size([4]), seed=1), observation_noise=noise
    )
    Xs = torch.rand(3, 5, 4, dtype=DTYPE)
    po = fo.posterior(Xs)
    with factored_only():
        fm = model.fantasize(
            Xf, SobolQMCNormalSampler(torch.Size([4]), seed=1), observation_noise=noise
        )
        pm = fm.posterior(Xs)
        assert rel_err(pm.mean, po.mean) < 1e-8
        assert rel_err(pm.covariance_matrix, po.covariance_matrix) < 1e-8


def test_six_dimensions_by_default_is_the_exact_gp():
    X, Y, _ = make_data(60, 6)
    with pytest.warns(HighDimensionalGridWarning, match="AdditiveWiskiGP"):
        model = WiskiGP(X[:40], Y[:40], **without_defaults())
    assert model.interpolation.grid_size == [35] * 6  # 32 per unit of the unit cube
    assert model.structured and model.in_data_space and model.evaluates_kernel_exactly
    exact = SingleTaskGP(X, Y, outcome_transform=None)
    for m in (model, exact):
        m.covar_module.lengthscale = torch.tensor([0.3, 0.4, 0.5, 0.6, 0.7, 0.8], dtype=DTYPE)
        m.likelihood.noise = 1e-2
    with factored_only():
        model.observe(X[40:], Y[40:])
        Xs = torch.rand(50, 6, dtype=DTYPE)
        pw = model.posterior(Xs)
        pe = exact.posterior(Xs)
        assert (pw.mean - pe.mean).abs().max() < 1e-10
        assert (pw.variance - pe.variance).abs().max() < 1e-10
        # The same check with the lengthscales swapped is far off, so it has teeth.
        model.covar_module.lengthscale = torch.tensor([0.8, 0.7, 0.6, 0.5, 0.4, 0.3])
        assert (model.posterior(Xs).mean - pe.mean).abs().max() > 0.05
    assert model.in_data_space and model.num_train == 60


def test_botorch_loop_step_in_ten_dimensions_never_forms_flat_rows():
    """Normalize(d) without bounds, known noise, a fit, a fantasy, a checkpoint: 4^10 =
    1,048,576 weights a row would need gigabytes; the factored rows need 40."""
    X, Y, _ = make_data(30, 10)
    X = 3 * X - 1  # not in the unit cube: Normalize learns the box
    Yvar = torch.full_like(Y, 0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        model = WiskiGP(X, Y, Yvar, input_transform=Normalize(d=10))
    with factored_only():
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 20}})
        model.observe(3 * torch.rand(3, 10, dtype=DTYPE) - 1, torch.zeros(3, 1, dtype=DTYPE),
                      torch.full((3, 1), 0.01, dtype=DTYPE))  # fmt: skip
        Xs = 3 * torch.rand(4, 2, 10, dtype=DTYPE) - 1
        fantasy = model.fantasize(Xs, SobolQMCNormalSampler(torch.Size([2])))
        assert torch.isfinite(fantasy.posterior(Xs).variance).all()
        state = model.checkpoint()
        assert not any(key.endswith("statistics.indices") for key in state["state_dict"])
        assert "statistics.inputs" in state["state_dict"]  # (the kernel is exact)
        restored = WiskiGP(X, Y, Yvar, input_transform=Normalize(d=10), grid_size=[5] * 10)
        restored.restore(state)
        Xt = 3 * torch.rand(5, 10, dtype=DTYPE) - 1
        assert torch.equal(restored.posterior(Xt).mean, model.posterior(Xt).mean)
        assert torch.equal(restored.posterior(Xt).variance, model.posterior(Xt).variance)
    assert model.in_data_space and model.num_train == 33


def test_twenty_dimensions_build_predict_and_observe():
    X, Y, _ = make_data(20, 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        model = WiskiGP(X, Y)
    with factored_only():
        model.observe(torch.rand(2, 20, dtype=DTYPE), torch.zeros(2, 1, dtype=DTYPE))
        posterior = model.posterior(torch.rand(7, 20, dtype=DTYPE))
        assert torch.isfinite(posterior.mean).all()
        assert (posterior.variance > 0).all()
