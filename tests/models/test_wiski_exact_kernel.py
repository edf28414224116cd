"""WiskiGP from 4-D on with the default grid: the kernel evaluated exactly, an exact GP.

Oracle: BoTorch's ``SingleTaskGP`` with the same data, transforms and hyperparameters
(predictions, the marginal likelihood and its gradient, updates, conditioning, fixed
noise), to 1e-10 in float64. Also: inputs beyond the grid's box neither re-grid nor are
clamped, checkpoints round-trip, and a checkpoint written while the model interpolated
its kernel (SKI rows, ``data/wiski_4d_ski_rows_checkpoint.pt``) is restored from its kept
observations.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize
from gpytorch.constraints import Interval
from gpytorch.kernels import AdditiveKernel, MaternKernel, ProductKernel, RBFKernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from oracles import rel_err

from streamgp import WiskiGP
from streamgp.interpolation.exact import ExactKernelInputs
from streamgp.interpolation.grid import GridExtrapolationWarning
from streamgp.models.wiski import HighDimensionalGridWarning

DTYPE = torch.float64
OLD_CHECKPOINT = Path(__file__).parent / "data" / "wiski_4d_ski_rows_checkpoint.pt"


def make_data(n: int, d: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    X = 2 * torch.rand(n, d, dtype=DTYPE, generator=generator) - 0.5
    Y = torch.sin(3 * X).sum(-1, keepdim=True) + 5.0
    Yvar = 0.01 + 0.05 * torch.rand(n, 1, dtype=DTYPE, generator=generator)
    return X, Y, Yvar


def wiski(X, Y, Yvar=None) -> WiskiGP:
    d = X.shape[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        model = WiskiGP(X, Y, Yvar, input_transform=Normalize(d))
    # ARD lengthscales that differ per dimension catch axis-order mistakes.
    model.covar_module.lengthscale = torch.linspace(0.3, 0.9, d, dtype=DTYPE)
    model.mean_module.constant = 0.2
    if Yvar is None:
        model.likelihood.noise = 0.03
    return model


def singletaskgp_like(model: WiskiGP, X, Y, Yvar=None) -> SingleTaskGP:
    r"""``SingleTaskGP`` on ``(X, Y, Yvar)`` with ``model``'s frozen transforms and its
    hyperparameters."""
    transforms = copy.deepcopy((model.input_transform, model.outcome_transform))
    exact = SingleTaskGP(X, Y, Yvar, input_transform=transforms[0], outcome_transform=transforms[1])
    ours = model.state_dict()
    state = exact.state_dict()
    exact.load_state_dict({key: ours[key] for key in state})
    return exact.eval()


def assert_same_posterior(model, exact, Xs, tol=1e-10):
    pw, pe = model.posterior(Xs), exact.posterior(Xs)
    assert rel_err(pw.mean, pe.mean) < tol
    assert rel_err(pw.mvn.covariance_matrix, pe.mvn.covariance_matrix) < tol


def assert_same_likelihood_and_gradient(model, exact):
    """The marginal likelihood and its gradient in every hyperparameter (both put in
    training mode; the oracle's input transform frozen, as the model's)."""
    model.train(), exact.train()
    exact.input_transform.eval()  # (training mode would relearn it)
    ours = model.compute_custom_loss(ExactMarginalLogLikelihood(model.likelihood, model))
    mll = ExactMarginalLogLikelihood(exact.likelihood, exact)
    theirs = -mll(exact(*exact.train_inputs), exact.train_targets)
    assert abs(ours.item() - theirs.item()) < 1e-10 * abs(theirs.item())
    params = dict(model.named_parameters())
    names = [name for name, p in exact.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(ours, [params[name] for name in names])
    ref = torch.autograd.grad(theirs, [dict(exact.named_parameters())[n] for n in names])
    for name, grad, expected in zip(names, grads, ref, strict=True):
        assert rel_err(grad, expected) < 1e-8, name


@pytest.mark.parametrize("fixed_noise", [False, True])
@pytest.mark.parametrize("d", [4, 10])
def test_it_is_singletaskgp_with_the_same_hyperparameters(d, fixed_noise):
    X, Y, Yvar = make_data(40, d)
    Yvar = Yvar if fixed_noise else None
    model = wiski(X[:30], Y[:30], None if Yvar is None else Yvar[:30]).eval()
    assert model.evaluates_kernel_exactly
    assert isinstance(model.interpolation, ExactKernelInputs)
    # observe: a rank-q extension of the Cholesky factor, not a refactorisation.
    model.observe(X[30:], Y[30:], None if Yvar is None else Yvar[30:])
    exact = singletaskgp_like(model, X, Y, Yvar)
    # Beyond the data's box too (1.5x its extent): the kernel is defined everywhere.
    Xs = 3 * torch.rand(2, 6, d, dtype=DTYPE) - 1
    assert_same_posterior(model, exact, Xs)
    assert_same_likelihood_and_gradient(model, exact)


def test_batched_conditioning_is_singletaskgps():
    X, Y, _ = make_data(30, 6)
    model = wiski(X, Y).eval()
    exact = singletaskgp_like(model, X, Y)
    Xs = torch.rand(3, 5, 6, dtype=DTYPE)
    exact.posterior(Xs)  # (BoTorch conditions a model that predicted once)
    Xc = torch.rand(3, 2, 6, dtype=DTYPE)
    Yc = torch.randn(3, 2, 1, dtype=DTYPE)
    conditioned = model.condition_on_observations(X=Xc, Y=Yc)
    expected = exact.condition_on_observations(X=Xc, Y=Yc)
    assert_same_posterior(conditioned, expected, Xs)


def test_inputs_beyond_the_box_neither_regrid_nor_clamp():
    X, Y, _ = make_data(20, 5)
    model = wiski(X, Y).eval()
    interpolation = model.interpolation
    far = torch.full((2, 5), 4.0, dtype=DTYPE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GridExtrapolationWarning)
        model.posterior(far)
        model.observe(far, torch.zeros(2, 1, dtype=DTYPE))
    assert model.interpolation is interpolation  # no re-grid
    exact = singletaskgp_like(model, torch.cat([X, far]), torch.cat([Y, torch.zeros(2, 1)]))
    assert_same_posterior(model, exact, torch.cat([far, 5 + far]))


def test_bad_input_is_refused_and_the_model_is_unchanged():
    X, Y, _ = make_data(20, 5)
    model = wiski(X, Y).eval()
    Xs = torch.rand(4, 5, dtype=DTYPE)
    before = model.posterior(Xs).mean
    bad = torch.rand(2, 5, dtype=DTYPE)
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match="X contains NaN"):
        model.observe(bad, torch.zeros(2, 1, dtype=DTYPE))
    assert model.num_train == 20 and torch.equal(model.posterior(Xs).mean, before)
    with pytest.raises(RuntimeError, match="evaluates its kernel exactly"):
        model.grid_posterior()


def test_checkpoints_round_trip_bit_for_bit():
    X, Y, _ = make_data(25, 6)
    model = wiski(X[:20], Y[:20]).eval()
    model.observe(X[20:], Y[20:])
    restored = wiski(X[:5], Y[:5])
    restored.restore(model.checkpoint())
    Xs = torch.rand(7, 6, dtype=DTYPE)
    assert torch.equal(restored.posterior(Xs).mean, model.posterior(Xs).mean)
    assert torch.equal(restored.posterior(Xs).variance, model.posterior(Xs).variance)
    # Hyperparameters alone load too (the loops' warm starts), the data left as they were.
    warm = wiski(X[:5], Y[:5])
    kernel = {k: v for k, v in model.state_dict().items() if k.startswith("covar_module.")}
    warm.load_state_dict(kernel, strict=False)
    assert warm.num_train == 5
    assert torch.equal(warm.covar_module.lengthscale, model.covar_module.lengthscale)


def test_a_checkpoint_with_ski_rows_is_restored_from_its_observations():
    """Written by the previous version (SKI in data space, per-axis weights): restored,
    the model is the exact GP of the checkpoint's 15 kept observations."""
    checkpoint = torch.load(OLD_CHECKPOINT, weights_only=False)
    assert "statistics.axis0_values" in checkpoint["state_dict"]
    X, Y, _ = make_data(12, 4)
    model = wiski(X, Y)
    model.restore(checkpoint)
    model.eval()
    store = model.observations
    assert model.num_train == 15 == store.X.shape[-2]
    exact = singletaskgp_like(model, store.X, store.Y)
    assert_same_posterior(model, exact, torch.rand(6, 4, dtype=DTYPE))
    # A model that keeps no data cannot: it refuses, unchanged.
    without = WiskiGP(X, Y, input_transform=Normalize(4), keep_data=False).eval()
    Xs = torch.rand(3, 4, dtype=DTYPE)
    before = without.posterior(Xs).mean
    state = {**checkpoint, "stream": {**checkpoint["stream"], "keep_data": False}}
    state["state_dict"] = {
        k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("observations.")
    }
    state.pop("checksum", None), state.pop("meta", None)
    with pytest.raises(ValueError, match="rebuild the model from its data"):
        without.restore(state)
    assert torch.equal(without.posterior(Xs).mean, before)


@pytest.mark.parametrize(
    "train_Y, options",
    [
        (lambda X: torch.stack([X.sum(-1), X.prod(-1)], -1), {}),
        (lambda X: torch.stack([X.sum(-1), X.prod(-1)], -1), {"shared_hyperparameters": True}),
    ],
    ids=["outputs", "shared-outputs"],
)
def test_several_outputs_from_4d_on_are_refused_naming_the_model_list(train_Y, options):
    X, _, _ = make_data(20, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        with pytest.raises(ValueError, match=r"train_Y has .*ModelListGP"):
            WiskiGP(X, train_Y(X), **options)


class SmallGridWiskiGP(WiskiGP):
    """A 6^4 grid (1,296 points) is Kronecker-factored here, as 35^4 is by default: small
    enough for its grid-space algebra to take milliseconds."""

    MAX_DENSE_GRID = 100


@pytest.mark.parametrize("limit", [14, 5], ids=["data-space", "grid-space"])
def test_a_checkpoint_of_an_interpolating_model_restores_as_one(limit):
    """An explicit ``data_space_limit`` keeps SKI from 4-D on; its checkpoint restored into
    a model that evaluates its kernel exactly gives back the SKI model (its grid and rows),
    in data space and past the switch to grid space alike."""
    X, Y, _ = make_data(20, 4)
    ski = SmallGridWiskiGP(
        X[:12], Y[:12], input_transform=Normalize(4), grid_size=6, data_space_limit=limit
    ).eval()
    assert ski.structured and not ski.evaluates_kernel_exactly
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        model = SmallGridWiskiGP(X[:12], Y[:12], input_transform=Normalize(4)).eval()
    assert model.evaluates_kernel_exactly
    model.restore(ski.checkpoint())
    assert not model.evaluates_kernel_exactly and model.data_space_limit == limit
    Xs = torch.rand(5, 4, dtype=DTYPE)
    for _ in range(2):
        assert torch.equal(model.posterior(Xs).mean, ski.posterior(Xs).mean)
        assert torch.equal(model.posterior(Xs).variance, ski.posterior(Xs).variance)
        ski.observe(X[12:], Y[12:])  # (past the limit: into grid space)
        model.observe(X[12:], Y[12:])
    assert not model.in_data_space


def test_data_space_for_good_whatever_the_limit_and_no_grid_to_refine_or_sum():
    X, Y, _ = make_data(20, 5)
    model = wiski(X[:10], Y[:10]).eval()
    model.data_space_limit = 3  # (the attribute; the model stays an exact GP)
    model.observe(X[10:], Y[10:])
    assert model.in_data_space and model.evaluates_kernel_exactly
    interpolation = model.interpolation
    assert model.refine_grid(grid_size=64) is model and model.interpolation is interpolation
    with pytest.raises(RuntimeError, match="no grid statistics"):
        model.weighted_statistics()


def turbo_kernel(d: int) -> ScaleKernel:
    """BoTorch's TuRBO tutorial's kernel: Matern-5/2 with ARD lengthscales, constrained."""
    kernel = ScaleKernel(
        MaternKernel(nu=2.5, ard_num_dims=d, lengthscale_constraint=Interval(0.005, 4.0))
    ).to(DTYPE)
    kernel.base_kernel.lengthscale = torch.linspace(0.4, 1.2, d, dtype=DTYPE)
    kernel.outputscale = 1.4
    return kernel


def kernel_on_subsets(d: int) -> AdditiveKernel:
    """A sum of kernels on subsets of the inputs (``active_dims``)."""
    first = ScaleKernel(MaternKernel(nu=1.5, active_dims=torch.arange(2)))
    return AdditiveKernel(first, RBFKernel(active_dims=torch.arange(2, d))).to(DTYPE)


KERNELS = {
    "matern": turbo_kernel,  # (no Kronecker grid; a closed form, without gpytorch's call)
    "matern-3/2, unscaled": lambda d: MaternKernel(nu=1.5, ard_num_dims=d).to(DTYPE),
    # An RBF on the first inputs only: not the RBF fast path, which reads all of them.
    "rbf-on-leading-inputs": lambda d: RBFKernel(active_dims=torch.arange(3)).to(DTYPE),
    "sum-on-subsets": kernel_on_subsets,
}


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_any_kernel_is_singletaskgp_with_the_same_kernel(kernel, fixed_noise):
    """Any kernel from 4-D on: evaluated exactly, the model is SingleTaskGP with that
    kernel: predictions, the likelihood and its gradient, ``observe``, batched
    conditioning and checkpoints; its lazy covariance converts as BoTorch's
    ``ModelListGP`` converts it."""
    d = 6
    X, Y, Yvar = make_data(40, d)
    Yvar = Yvar if fixed_noise else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        model = WiskiGP(
            X[:30],
            Y[:30],
            None if Yvar is None else Yvar[:30],
            covar_module=KERNELS[kernel](d),
            input_transform=Normalize(d),
        ).eval()
    if Yvar is None:
        model.likelihood.noise = 0.03
    assert model.evaluates_kernel_exactly
    model.observe(X[30:], Y[30:], None if Yvar is None else Yvar[30:])
    transforms = copy.deepcopy((model.input_transform, model.outcome_transform))
    exact = SingleTaskGP(
        X,
        Y,
        Yvar,
        covar_module=copy.deepcopy(model.covar_module),
        input_transform=transforms[0],
        outcome_transform=transforms[1],
    )
    exact.load_state_dict(model.state_dict(), strict=False)
    exact.eval()
    Xs = 3 * torch.rand(2, 6, d, dtype=DTYPE) - 1
    assert_same_posterior(model, exact, Xs)
    covariance = model.posterior(Xs).mvn.lazy_covariance_matrix
    assert rel_err(covariance.to(DTYPE).to_dense(), covariance.to_dense()) < 1e-15
    Xc, Yc = torch.rand(3, 2, d, dtype=DTYPE), torch.randn(3, 2, 1, dtype=DTYPE)
    noise = {} if Yvar is None else {"noise": torch.full_like(Yc, 0.02)}
    conditioned = model.condition_on_observations(X=Xc, Y=Yc, **noise)
    expected = exact.condition_on_observations(X=Xc, Y=Yc, **noise)
    assert_same_posterior(conditioned, expected, torch.rand(3, 5, d, dtype=DTYPE))
    restored = copy.deepcopy(model)
    restored.restore(model.checkpoint())
    assert torch.equal(restored.posterior(Xs).mean, model.posterior(Xs).mean)
    assert_same_likelihood_and_gradient(model, exact)


def test_a_kernel_without_kronecker_structure_on_an_interpolated_grid_is_refused():
    X, Y, _ = make_data(20, 4)
    with pytest.raises(ValueError, match="MaternKernel.*leave grid_size and data_space_limit"):
        WiskiGP(X, Y, covar_module=MaternKernel(nu=2.5).to(DTYPE), data_space_limit=10)


def test_a_batched_kernel_is_refused_naming_the_model_list():
    X, Y, _ = make_data(20, 5)
    kernel = ScaleKernel(MaternKernel(batch_shape=torch.Size([2])), batch_shape=torch.Size([2]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        with pytest.raises(ValueError, match=r"covar_module has batch_shape \[2\].*ModelListGP"):
            WiskiGP(X, Y, covar_module=kernel.to(DTYPE))


@pytest.mark.parametrize("kernel", ["sum", "product"])
def test_restandardize_rescales_the_output_scales_inside_sums_and_products(kernel):
    """With a learned constant mean, ``restandardize`` leaves the model unchanged: the
    output scales of every term of a sum (one factor of a product) carry the units."""
    d = 5
    X, Y, _ = make_data(30, d)
    parts = (
        ScaleKernel(MaternKernel(nu=2.5, active_dims=torch.arange(2))),
        ScaleKernel(RBFKernel(active_dims=torch.arange(2, d))),
    )
    covar = (
        AdditiveKernel(*parts) if kernel == "sum" else ProductKernel(parts[0], parts[1].base_kernel)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        model = WiskiGP(X[:4], Y[:4], covar_module=covar.to(DTYPE), input_transform=Normalize(d))
    model.likelihood.noise = 0.03
    model.observe(X[4:], 3 * Y[4:] + 2)  # far from the first four's standardisation
    model.eval()
    Xs = torch.rand(6, d, dtype=DTYPE)
    before = model.posterior(Xs)
    model.restandardize()
    after = model.posterior(Xs)
    assert rel_err(after.mean, before.mean) < 1e-10
    assert rel_err(after.variance, before.variance) < 1e-10
