r"""Every streamgp BoTorch model's public paths on a device, in float32 and float64, against CPU.

Each case builds a model on the device under test and a float64 CPU reference from the
same data, runs the same public paths on both (:func:`public_paths`) and compares what
they return:

- the posterior mean and variance at test points, and a joint ``q = 3`` covariance;
- the loss BoTorch's ``fit_gpytorch_mll`` minimises and its gradient in every trainable
  parameter (where the model has a marginal likelihood: not on a structured grid);
- one analytic (``LogExpectedImprovement``) and one MC acquisition value
  (``qLogExpectedImprovement``, ``SobolQMCNormalSampler`` with a fixed seed);
- ``condition_on_observations`` (batched) and ``fantasize`` where the model has them;
- ``observe`` (the stream step) where it has one, and the posterior after it.

Two ways onto the device: ``built`` constructs the model from data moved there
(``X.to(device, dtype)``), ``moved`` moves a copy of the CPU reference with
``model.to(device, dtype)``. The device under test is ``"cpu"`` or ``"cuda"``; the
``"cuda"`` cases are skipped without a CUDA device, and the ``"cpu"`` cases run the same
code, so the comparison itself is exercised everywhere (in float64 against an
independently built or copied CPU model, in float32 against the float64 reference).
:func:`test_the_model_keeps_every_tensor_on_the_device` checks where the model's
tensors are (parameters, buffers and the state kept outside them, :func:`_misplaced`);
the paths test checks that its paths leave no new tensor elsewhere.

Tolerances (relative error of each compared tensor, ``max|a - b| / max|b|``:
``oracles.rel_err``):

- float64: ``1e-8`` (rounding differences between devices only);
- float32: ``1e-3`` (single precision through Cholesky factorisations of kernel
  matrices with a noise of ``1e-2``; measured at most 4e-4 on CPU), except
  ``5e-3`` for WiskiGP's structured grid (the rank of its LOVE root depends on the
  precision; measured 8e-4) and ``1e-2`` for OnlineSGPR, OnlineSVGP and DecoupledSVGP,
  whose construction absorbs or trains on the batch in float32 (measured 2e-3 to 5e-3),
  and ``2e-2`` for OnlineSVGP, whose q is set in closed form (a solve with ``K_ZZ``'s
  Cholesky factor in float32) before every step: its loss gradient measured 1.1e-2 to
  1.3e-2.

Streaming models that take optimizer steps at construction or in ``observe``
(OnlineSVGP, DecoupledSVGP) use plain SGD in the paths test: Adam's first steps are
``lr * sign(gradient)``, which rounding can flip for a gradient near 0.

WiskiGP's hot paths without host synchronisation on CUDA are in test_device_sync.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement
from botorch.acquisition.logei import qLogExpectedImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.models.transforms import Normalize, Standardize
from botorch.optim.closures import get_loss_closure
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood
from oracles import rel_err
from test_device_sync import BOUNDS
from test_device_sync import build as build_wiski

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

#: Relative tolerance of each compared tensor, by dtype (see the module doc).
TOLERANCE = {torch.float64: 1e-8, torch.float32: 1e-3}
#: float32 tolerance of the sparse models built from float32 data (OnlineSGPR,
#: OnlineSVGP, DecoupledSVGP): their construction absorbs or trains on the batch in
#: single precision (Cholesky factors of ``K_ZZ`` plus jitter, ``K - Q`` cancellation).
SPARSE_FLOAT32_TOLERANCE = 1e-2
#: Best value for the improvement acquisitions, in the units of ``Y``.
BEST_F = 0.5

cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA is not available: no device to compare with CPU"
)
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=cuda)]
DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.float64, id="float64")]


def _data(n: int, **tkwargs) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``n`` points in ``BOUNDS`` and their targets, drawn in float64 on the CPU."""
    generator = torch.Generator().manual_seed(n)
    U = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    X = BOUNDS[0].double() + (BOUNDS[1] - BOUNDS[0]).double() * U
    Y = torch.sin(3 * X).sum(-1, keepdim=True) + X.prod(-1, keepdim=True)
    return X.to(**tkwargs), Y.to(**tkwargs)


def _transforms(X: torch.Tensor) -> dict:
    return {
        "input_transform": Normalize(2, bounds=BOUNDS.to(X)),
        "outcome_transform": Standardize(1),
    }


def _sgd(lr: float) -> dict:
    return {"optimizer_cls": torch.optim.SGD, "optimizer_kwargs": {"lr": lr}}


@dataclass(frozen=True)
class Case:
    r"""How to build a model (``build(**tkwargs)``) and which public paths it has."""

    build: Callable[..., torch.nn.Module]
    mll: bool = True
    observe: bool = True
    condition: bool = True
    #: Relative tolerance in float32 (float64: ``TOLERANCE``).
    float32_tolerance: float = TOLERANCE[torch.float32]


def _from_data(n: int, factory: Callable) -> Callable[..., torch.nn.Module]:
    def build(**tkwargs):
        X, Y = _data(n, **tkwargs)
        torch.manual_seed(0)
        return factory(X, Y, **_transforms(X))

    return build


def _structured_wiski(**tkwargs) -> WiskiGP:
    # 65^2 = 4225 > MAX_DENSE_GRID = 4096 grid points: the sparse, Kronecker and LOVE path.
    X, Y = _data(100, **tkwargs)
    model = WiskiGP(X, Y, grid_size=65, **_transforms(X))
    assert model.structured and model.interpolation.num_grid > WiskiGP.MAX_DENSE_GRID
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 0.01
    return model


CASES = {
    "WiskiGP data space": Case(lambda **tkwargs: build_wiski(30, None, 1, **tkwargs)),
    "WiskiGP grid space": Case(lambda **tkwargs: build_wiski(200, 0, 1, **tkwargs)),
    "WiskiGP two outputs": Case(lambda **tkwargs: build_wiski(60, None, 2, **tkwargs)),
    "WiskiGP two outputs, own hyperparameters": Case(
        lambda **tkwargs: build_wiski(60, None, 2, shared=False, **tkwargs)
    ),
    "WiskiGP structured grid": Case(_structured_wiski, mll=False, float32_tolerance=5e-3),
    "AdditiveWiskiGP grid space": Case(
        _from_data(80, lambda X, Y, **kw: AdditiveWiskiGP(X, Y, grid_size=16, **kw))
    ),
    "AdditiveWiskiGP data space, one pair": Case(
        _from_data(
            30, lambda X, Y, **kw: AdditiveWiskiGP(X, Y, groups=[[0, 1]], grid_size=12, **kw)
        )
    ),
    "KissGP": Case(_from_data(60, lambda X, Y, **kw: KissGP(X, Y, grid_size=10, **kw))),
    "SoftKIGP": Case(
        _from_data(80, lambda X, Y, **kw: SoftKIGP(X, Y, num_inducing=12, **kw)), observe=False
    ),
    "OnlineSoftKIGP": Case(
        _from_data(
            80,
            lambda X, Y, **kw: OnlineSoftKIGP(X, Y, num_inducing=12, pretrain_epochs=0, **kw),
        )
    ),
    "OnlineSGPR": Case(
        _from_data(80, lambda X, Y, **kw: OnlineSGPR(X, Y, num_inducing=12, **kw)),
        float32_tolerance=SPARSE_FLOAT32_TOLERANCE,
    ),
    "OnlineSVGP": Case(
        _from_data(
            80,
            lambda X, Y, **kw: OnlineSVGP(
                X, Y, num_inducing=12, num_init_steps=3, num_steps=2, **_sgd(1e-2), **kw
            ),
        ),
        float32_tolerance=2 * SPARSE_FLOAT32_TOLERANCE,
    ),
    "DecoupledSVGP": Case(
        _from_data(
            80,
            lambda X, Y, **kw: DecoupledSVGP(
                X,
                Y,
                max_mean_basis=24,
                max_covar_basis=12,
                minibatch_size=32,
                num_init_steps=3,
                num_steps=2,
                **_sgd(1e-2),
                **kw,
            ),
        ),
        float32_tolerance=SPARSE_FLOAT32_TOLERANCE,
    ),
    "LocalGP": Case(
        _from_data(80, lambda X, Y, **kw: LocalGP(X, Y, w_gen=0.3, n_max=30, **kw)),
        condition=False,
    ),
}


def public_paths(model: torch.nn.Module, case: Case) -> dict[str, torch.Tensor]:
    r"""Run the model's public paths (in this order, ``observe`` last); return the results."""
    parameter = next(model.parameters())
    tkwargs = {"dtype": parameter.dtype, "device": parameter.device}
    k = model.num_outputs
    generator = torch.Generator().manual_seed(1)

    def points(*shape: int) -> torch.Tensor:
        U = torch.rand(*shape, 2, generator=generator, dtype=torch.float64)
        return (BOUNDS[0] + (BOUNDS[1] - BOUNDS[0]) * U).to(**tkwargs)

    def targets(X: torch.Tensor) -> torch.Tensor:
        return torch.cos(2 * X[..., :k]) + X[..., 1:2]

    out = {}
    with torch.no_grad():
        posterior = model.posterior(points(16))
        out["mean"], out["variance"] = posterior.mean, posterior.variance
        out["joint covariance (q = 3)"] = model.posterior(points(3)).distribution.covariance_matrix
        out["noisy variance"] = model.posterior(points(4), observation_noise=True).variance

    if case.mll:  # what fit_gpytorch_mll minimises, and its gradient
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        mll.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        loss = get_loss_closure(mll)().sum()  # (batched models: one value per member)
        grads = torch.autograd.grad(loss, trainable, allow_unused=True)
        out["loss"] = loss.detach()
        out["loss gradient"] = torch.cat(
            [
                torch.zeros(p.numel(), **tkwargs) if g is None else g.reshape(-1)
                for p, g in zip(trainable, grads, strict=True)
            ]
        )
        mll.eval()

    with torch.no_grad():
        if k == 1:
            out["LogEI"] = LogExpectedImprovement(model, best_f=BEST_F)(points(5, 1))
            objective = None
        else:  # the first output
            objective = GenericMCObjective(lambda Z, X=None: Z[..., 0])
        sampler = SobolQMCNormalSampler(sample_shape=torch.Size([64]), seed=0)
        qlogei = qLogExpectedImprovement(model, BEST_F, sampler, objective=objective)
        out["qLogEI"] = qlogei(points(4, 2))

        if case.condition:
            X_c = points(2, 3)
            conditioned = model.condition_on_observations(X_c, targets(X_c))
            posterior = conditioned.posterior(points(2, 5))
            out["conditioned mean"] = posterior.mean
            out["conditioned variance"] = posterior.variance
            fantasy_sampler = SobolQMCNormalSampler(sample_shape=torch.Size([3]), seed=0)
            fantasy = model.fantasize(points(2), fantasy_sampler).posterior(points(5))
            out["fantasy mean"], out["fantasy variance"] = fantasy.mean, fantasy.variance

    if case.observe:
        for q in (1, 4):
            X_new = points(q)
            model.observe(X_new, targets(X_new))
        with torch.no_grad():
            posterior = model.posterior(points(6))
            out["observed mean"] = posterior.mean
            out["observed variance"] = posterior.variance
    return out


def _misplaced(model: torch.nn.Module, device: str, dtype: torch.dtype) -> list[str]:
    r"""Paths of the tensors the model holds that are not on ``device`` (or, floating
    point, not in ``dtype``).

    Parameters and buffers of every submodule, and the state streamgp's classes keep
    outside them: their attributes, containers, dataclasses, linear operators and the
    optimizer's state. Other libraries' modules are seen through their parameters and
    buffers only (gpytorch keeps e.g. a constraint's ``_initial_value`` on the CPU).
    """
    found, seen = [], set()

    def visit(obj, path: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            wrong_dtype = obj.is_floating_point() and obj.dtype != dtype
            if obj.device.type != device or wrong_dtype:
                found.append(f"{path} ({obj.dtype}, {obj.device})")
        elif isinstance(obj, dict):
            for key, value in obj.items():
                visit(value, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key!r}]")
        elif isinstance(obj, list | tuple):
            for i, value in enumerate(obj):
                visit(value, f"{path}[{i}]")
        elif isinstance(obj, torch.optim.Optimizer):  # not Adam's ``step``: a CPU float32
            for i, state in enumerate(obj.state.values()):
                for key, value in state.items():
                    if key != "step":
                        visit(value, f"{path}.state[{i}].{key}")
        elif type(obj).__module__.startswith(("streamgp", "linear_operator")) and hasattr(
            obj, "__dict__"
        ):
            for key, value in vars(obj).items():
                if key not in ("_parameters", "_buffers", "_modules"):
                    visit(value, f"{path}.{key}")
        if isinstance(obj, torch.nn.Module):
            for key in ("_parameters", "_buffers", "_modules"):
                for name, value in vars(obj)[key].items():
                    visit(value, f"{path}.{name}")

    visit(model, "model")
    return found


def _compare(
    computed: dict, expected: dict, device: str, dtype: torch.dtype, tolerance: float
) -> None:
    assert computed.keys() == expected.keys()
    for name, value in computed.items():
        assert value.device.type == device and value.dtype == dtype, name
        reference = expected[name]
        assert value.shape == reference.shape, name
        error = rel_err(value.double().cpu(), reference)
        assert error < tolerance, f"{name}: relative error {error:.2e} > {tolerance:.0e}"


def _model(case: Case, reference: torch.nn.Module, device: str, dtype: torch.dtype, how: str):
    if how == "built":
        return case.build(dtype=dtype, device=device)
    # A copy of the reference's state, moved (a no-op for cpu / float64).
    return copy.deepcopy(reference).to(device=device, dtype=dtype)


@pytest.mark.parametrize("how", ["built", "moved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_public_paths_on_the_device_agree_with_cpu(name, device, dtype, how):
    case = CASES[name]
    reference = case.build(dtype=torch.float64)
    model = _model(case, reference, device, dtype, how)
    misplaced = _misplaced(model, device, dtype)  # test_the_model_keeps_every_tensor_...
    expected = public_paths(reference, case)
    computed = public_paths(model, case)
    # The paths (caches, observe, optimizer steps) leave nothing new off the device.
    assert set(_misplaced(model, device, dtype)) <= set(misplaced)
    tolerance = case.float32_tolerance if dtype == torch.float32 else TOLERANCE[dtype]
    _compare(computed, expected, device, dtype, tolerance)


#: The placement check also covers the streaming models with their default optimizer
#: (Adam, whose moment estimates are state too).
PLACEMENT_CASES = {
    **CASES,
    "OnlineSVGP (Adam)": Case(
        _from_data(80, lambda X, Y, **kw: OnlineSVGP(X, Y, num_inducing=12, num_init_steps=3, **kw))
    ),
    "DecoupledSVGP (Adam)": Case(
        _from_data(
            80,
            lambda X, Y, **kw: DecoupledSVGP(
                X,
                Y,
                max_mean_basis=24,
                max_covar_basis=12,
                minibatch_size=32,
                num_init_steps=3,
                **kw,
            ),
        )
    ),
}


@pytest.mark.parametrize("how", ["built", "moved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(PLACEMENT_CASES))
def test_the_model_keeps_every_tensor_on_the_device(name, device, dtype, how):
    # Parameters, buffers and the state outside them, after construction (or the move);
    # test_public_paths_on_the_device_agree_with_cpu checks that its paths add nothing.
    case = PLACEMENT_CASES[name]
    reference = case.build(dtype=torch.float64) if how == "moved" else None
    model = _model(case, reference, device, dtype, how)
    assert _misplaced(model, device, dtype) == []
