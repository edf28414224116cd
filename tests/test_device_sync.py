r"""WISKI's hot paths and host synchronisation.

On a GPU, reading a tensor value on the host (``bool(t)``, ``t.item()``, the ``info`` of a
checked factorisation) waits for the device. A ``WiskiGP``'s (and an ``AdditiveWiskiGP``'s:
singleton groups in grid space, one pair of inputs in data space) ``observe``,
``condition_on_observations``, posterior (mean and the lazy covariance's variances):

- read the host at most once per call by default (their value checks are read together,
  :func:`streamgp.settings.deferred_value_checks`), and none at all inside
  ``skip_value_checks`` (where the marginal likelihood's value and gradient read none
  either; by default the marginal likelihood reads once too). On the CPU every host read
  of a tensor and every checked LAPACK call is counted, or made to raise;
- on CUDA (skipped without it), the same steps run under
  ``torch.cuda.set_sync_debug_mode``: ``"error"`` inside ``skip_value_checks``,
  ``"warn"`` (at most one per call) by default, in float32 and float64, and agree with
  CPU.

Bad input still raises naming the argument, and a failed factorisation whose result was
not read is found at the next call, which rebuilds the factors from the statistics.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest
import torch
from botorch.models.transforms import Normalize, Standardize
from gpytorch.kernels import MaternKernel, ScaleKernel

from streamgp import AdditiveWiskiGP, WiskiGP
from streamgp.models.wiski import HighDimensionalGridWarning
from streamgp.settings import skip_value_checks

BOUNDS = torch.tensor([[-1.0, 0.0], [1.0, 2.0]])
_HOST_READS = ("__bool__", "item", "tolist", "__float__", "__int__")
_CHECKED_LINALG = ("cholesky", "solve", "svd", "eigh", "inv")


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    r"""Make every host read of a tensor value, and every checked factorisation, raise."""

    def refuse(name):
        def raiser(*args, **kwargs):
            raise HostRead(f"host read: {name}")

        return raiser

    saved = {name: getattr(torch.Tensor, name) for name in _HOST_READS}
    saved_linalg = {name: getattr(torch.linalg, name) for name in _CHECKED_LINALG}
    saved_equal = torch.equal
    try:
        for name in _HOST_READS:
            setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
        for name in _CHECKED_LINALG:
            setattr(torch.linalg, name, refuse(f"torch.linalg.{name}"))
        torch.equal = refuse("torch.equal")
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        for name, function in saved_linalg.items():
            setattr(torch.linalg, name, function)
        torch.equal = saved_equal


def box(dim: int) -> torch.Tensor:
    r"""``BOUNDS`` on every pair of ``dim`` input dimensions: ``2 x dim``."""
    return BOUNDS.repeat(1, dim // 2)


def corners(model: WiskiGP, **tkwargs) -> torch.Tensor:
    r"""Two points of the model's input box (a first prediction, outside a check)."""
    return box(model.interpolation.dim).to(**tkwargs)


def build(n: int, limit: int | None, num_outputs: int, shared: bool = True, **tkwargs) -> WiskiGP:
    generator = torch.Generator().manual_seed(n)
    U = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    bounds = BOUNDS.to(torch.float64)
    X = bounds[0] + (bounds[1] - bounds[0]) * U
    Y = torch.stack([torch.sin(3 * X).sum(-1), X.prod(-1)], -1)[:, :num_outputs]
    model = WiskiGP(
        X.to(**tkwargs),
        Y.to(**tkwargs),
        grid_size=12,
        data_space_limit=limit,
        input_transform=Normalize(2, bounds=bounds.to(**tkwargs)),
        outcome_transform=Standardize(num_outputs),
        shared_hyperparameters=shared,
    )
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 0.01
    return model


def build_additive(n: int, groups: str | list[list[int]], **tkwargs) -> AdditiveWiskiGP:
    r"""An additive model on :func:`build`'s data: singleton groups (32 points each, so
    ``m = 64``) or one pair (a 12 x 12 grid), on the unit box of the normalised inputs,
    so the stream steps below neither re-grid nor refactorise (a batch of ``q`` rows is
    absorbed by a rank-``q`` update while ``q <= m / 4``, see ``ROOT_UPDATE_MAX_FRACTION``)."""
    generator = torch.Generator().manual_seed(n)
    U = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    bounds = BOUNDS.to(torch.float64)
    X = bounds[0] + (bounds[1] - bounds[0]) * U
    Y = torch.sin(3 * X).sum(-1, keepdim=True)
    model = AdditiveWiskiGP(
        X.to(**tkwargs),
        Y.to(**tkwargs),
        groups=groups,
        grid_size=32 if groups == "singletons" else 12,
        grid_bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], **tkwargs),
        input_transform=Normalize(2, bounds=bounds.to(**tkwargs)),
        outcome_transform=Standardize(1),
    )
    for part in model.covar_module.kernels:
        part.base_kernel.lengthscale = 0.3
    model.likelihood.noise = 0.01
    return model


def build_exact(n: int, matern: bool = False, **tkwargs) -> WiskiGP:
    r"""``WiskiGP`` on 4-D inputs with its default grid: data space, the kernel exact
    (its default RBF, or the Matern-5/2 of BoTorch's TuRBO tutorial)."""
    generator = torch.Generator().manual_seed(n)
    bounds = box(4).to(torch.float64)
    U = torch.rand(n, 4, generator=generator, dtype=torch.float64)
    X = bounds[0] + (bounds[1] - bounds[0]) * U
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HighDimensionalGridWarning)
        model = WiskiGP(
            X.to(**tkwargs),
            torch.sin(3 * X).sum(-1, keepdim=True).to(**tkwargs),
            covar_module=(
                ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=4)).to(**tkwargs) if matern else None
            ),
            input_transform=Normalize(4, bounds=bounds.to(**tkwargs)),
            outcome_transform=Standardize(1),
        )
    assert model.evaluates_kernel_exactly
    kernel = model.covar_module
    (kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel).lengthscale = 0.3
    model.likelihood.noise = 0.01
    return model


#: Single-output models: WiskiGP in data and grid space, and from 4-D on (the kernel
#: exact); AdditiveWiskiGP with singleton groups (grid space) and with one pair of inputs
#: (data space).
SINGLE_OUTPUT_MODELS = {
    "data space": lambda **tkwargs: build(30, None, 1, **tkwargs),
    "exact kernel, 4-D": lambda **tkwargs: build_exact(30, **tkwargs),
    "exact Matern kernel, 4-D": lambda **tkwargs: build_exact(30, matern=True, **tkwargs),
    "grid space": lambda **tkwargs: build(200, 0, 1, **tkwargs),
    "additive, grid space": lambda **tkwargs: build_additive(200, "singletons", **tkwargs),
    "additive pair, data space": lambda **tkwargs: build_additive(20, [[0, 1]], **tkwargs),
}
MODELS = pytest.mark.parametrize("kind", list(SINGLE_OUTPUT_MODELS))
ADDITIVE_MODELS = pytest.mark.parametrize(
    "kind", [kind for kind in SINGLE_OUTPUT_MODELS if kind.startswith("additive")]
)


def raw_lengthscales(model: WiskiGP) -> list[torch.Tensor]:
    r"""The kernel's raw lengthscale parameters (one per group of an additive kernel)."""
    return [p for name, p in model.named_parameters() if name.endswith("raw_lengthscale")]


#: One output; two sharing their hyperparameters (data or grid space); two with their own
#: (batch members: grid space whatever the limit).
OUTPUT_CASES = pytest.mark.parametrize(
    ("num_outputs", "shared"),
    [(1, True), (2, True), (2, False)],
    ids=["one output", "two outputs", "two outputs, own hyperparameters"],
)


def stream_inputs(model: WiskiGP, steps: int = 4) -> dict:
    r"""The inputs of :func:`stream_steps`, drawn in float64 on the host and moved to the
    model's device and dtype here, before any check of synchronisation starts (a copy
    from the host synchronises)."""
    tkwargs = {
        "dtype": model.interpolation.bounds.dtype,
        "device": model.interpolation.bounds.device,
    }
    k = model.num_outputs
    generator = torch.Generator().manual_seed(1)

    bounds = box(model.interpolation.dim).double()

    def points(*shape):
        U = torch.rand(*shape, bounds.shape[-1], generator=generator, dtype=torch.float64)
        return (bounds[0] + (bounds[1] - bounds[0]) * U).to(**tkwargs)

    inputs = {"test_X": points(16), "steps": []}
    for step in range(steps):
        X_new = points((1, 2, 7)[step % 3])
        fantasy_X = points(4, 3)
        fantasy_Y = torch.randn(4, 3, k, generator=generator, dtype=torch.float64).to(**tkwargs)
        step_inputs = (X_new, torch.sin(X_new[..., :k] * 2), fantasy_X, fantasy_Y, points(4, 5))
        inputs["steps"].append(step_inputs)
    return inputs


def stream_steps(model: WiskiGP, inputs: dict) -> list[torch.Tensor]:
    r"""observe (q = 1, 2 and 7), a batched fantasy posterior, means, variances and the MLL
    value + gradient, on :func:`stream_inputs`; returns what was computed."""
    out = []
    for X_new, Y_new, fantasy_X, fantasy_Y, fantasy_test_X in inputs["steps"]:
        model.observe(X_new, Y_new)
        posterior = model.posterior(inputs["test_X"])
        out += [posterior.mean, posterior.distribution.lazy_covariance_matrix.diagonal()]
        fantasy = model.condition_on_observations(fantasy_X, fantasy_Y)
        out.append(fantasy.posterior(fantasy_test_X).mean)
    value, _ = model.fit_objective()  # (one value per output with their own hyperparameters)
    grads = torch.autograd.grad(value.sum(), raw_lengthscales(model))
    return [*out, value.detach(), *grads]


def run_stream_steps(model: WiskiGP, steps: int = 4) -> list[torch.Tensor]:
    return stream_steps(model, stream_inputs(model, steps))


def assert_unchecked_steps_read_nothing_and_agree(build_model) -> None:
    r"""The stream steps inside ``skip_value_checks`` read nothing on the host and give
    what they give with the checks on (two models from ``build_model()``)."""
    checked = run_stream_steps(build_model())
    model = build_model()
    # The first factorisation, outside the check.
    model.posterior(corners(model, dtype=torch.float64))
    inputs = stream_inputs(model)
    with skip_value_checks(), no_host_reads():
        unchecked = stream_steps(model, inputs)
    assert len(unchecked) == len(checked)
    for a, b in zip(unchecked, checked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@OUTPUT_CASES
@pytest.mark.parametrize("n, limit", [(30, None), (200, 0)], ids=["data space", "grid space"])
def test_hot_paths_read_nothing_on_the_host_and_give_the_checked_results(
    n, limit, num_outputs, shared
):
    assert_unchecked_steps_read_nothing_and_agree(
        lambda: build(n, limit, num_outputs, shared, dtype=torch.float64)
    )


@ADDITIVE_MODELS
def test_additive_hot_paths_read_nothing_on_the_host_and_give_the_checked_results(kind):
    assert_unchecked_steps_read_nothing_and_agree(
        lambda: SINGLE_OUTPUT_MODELS[kind](dtype=torch.float64)
    )


def test_exact_kernel_hot_paths_read_nothing_unchecked_and_once_per_call_checked():
    build_model = lambda: build_exact(30, dtype=torch.float64)  # noqa: E731
    assert_unchecked_steps_read_nothing_and_agree(build_model)
    model = build_model()
    model.posterior(corners(model, dtype=torch.float64))  # (outside the count)
    assert reads_per_call(model, stream_inputs(model)) == ONE_READ_PER_CALL


def test_the_probe_catches_a_host_read():
    model = build(30, None, 1, dtype=torch.float64)
    with no_host_reads(), pytest.raises(HostRead):  # value checks are on
        run_stream_steps(model, steps=1)


def test_skipped_checks_follow_gpytorchs_cache_convention():
    model = build(30, None, 1, dtype=torch.float64)
    X = BOUNDS.mean(0, keepdim=True).to(torch.float64)
    before = model.posterior(X).mean
    with skip_value_checks():
        model.covar_module.lengthscale = 0.6  # eval mode, by assignment: not seen yet
        torch.testing.assert_close(model.posterior(X).mean, before)
        model.train()  # as fit_gpytorch_mll does: the factors are rebuilt
        after = model.posterior(X).mean
    assert not torch.allclose(after, before)
    model.covar_module.lengthscale = 0.3  # values are compared again outside the context
    torch.testing.assert_close(model.posterior(X).mean, before)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@MODELS
def test_cuda_hot_paths_do_not_synchronise_and_agree_with_cpu(kind, dtype):
    expected = run_stream_steps(SINGLE_OUTPUT_MODELS[kind](dtype=torch.float64))
    model = SINGLE_OUTPUT_MODELS[kind](dtype=dtype, device="cuda")
    model.posterior(corners(model, dtype=dtype, device="cuda"))
    inputs = stream_inputs(model)  # host-to-device copies synchronise: before the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with skip_value_checks():
            computed = stream_steps(model, inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    tolerance = 1e-8 if dtype == torch.float64 else 1e-2
    for a, b in zip(computed, expected, strict=True):
        torch.testing.assert_close(a.double().cpu(), b, rtol=tolerance, atol=tolerance)


@contextlib.contextmanager
def counted_host_reads() -> Iterator[list[str]]:
    r"""Record (not refuse) every host read of a tensor value and checked factorisation."""
    reads: list[str] = []

    def counting(name, original):
        def counted(*args, **kwargs):
            reads.append(name)
            return original(*args, **kwargs)

        return counted

    saved = {name: getattr(torch.Tensor, name) for name in _HOST_READS}
    saved_linalg = {name: getattr(torch.linalg, name) for name in _CHECKED_LINALG}
    saved_equal = torch.equal
    try:
        for name, method in saved.items():
            setattr(torch.Tensor, name, counting(f"Tensor.{name}", method))
        for name, function in saved_linalg.items():
            setattr(torch.linalg, name, counting(f"torch.linalg.{name}", function))
        torch.equal = counting("torch.equal", saved_equal)
        yield reads
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        for name, function in saved_linalg.items():
            setattr(torch.linalg, name, function)
        torch.equal = saved_equal


#: Host reads (CPU) or synchronisations (CUDA) per public call with the value checks on.
ONE_READ_PER_CALL = {
    "observe": 1,
    "posterior": 1,
    "variances": 0,
    "condition_on_observations": 1,
    "fantasy posterior": 1,
}


def reads_per_call(model: WiskiGP, inputs: dict, counter=counted_host_reads) -> dict[str, int]:
    r"""The most host reads (``counter``'s records) any one public call of
    :func:`stream_steps` made, by call."""
    most: dict[str, int] = {}

    def count(name, fn):
        with counter() as reads:
            result = fn()
        most[name] = max(most.get(name, 0), len(reads))
        return result

    for X_new, Y_new, fantasy_X, fantasy_Y, fantasy_test_X in inputs["steps"]:
        count("observe", lambda X_new=X_new, Y_new=Y_new: model.observe(X_new, Y_new))
        posterior = count("posterior", lambda: model.posterior(inputs["test_X"]))
        # (gpytorch's MultivariateNormal.variance reads its minimum on the host, for
        # every model; the variances themselves are the covariance's diagonal)
        covariance = posterior.distribution.lazy_covariance_matrix
        count("variances", lambda covariance=covariance: covariance.diagonal())
        fantasy = count(
            "condition_on_observations",
            lambda X=fantasy_X, Y=fantasy_Y: model.condition_on_observations(X, Y),
        )
        count("fantasy posterior", lambda f=fantasy, X=fantasy_test_X: f.posterior(X).mean)
    return most


@OUTPUT_CASES
@pytest.mark.parametrize("n, limit", [(30, None), (200, 0)], ids=["data space", "grid space"])
def test_checked_hot_paths_read_the_host_at_most_once_per_call(n, limit, num_outputs, shared):
    # Default mode (value checks on): each call's checks are read together, once.
    model = build(n, limit, num_outputs, shared, dtype=torch.float64)
    # The first factorisation, outside the count.
    model.posterior(corners(model, dtype=torch.float64))
    most = reads_per_call(model, stream_inputs(model))
    assert most == ONE_READ_PER_CALL


@ADDITIVE_MODELS
def test_additive_checked_hot_paths_read_the_host_at_most_once_per_call(kind):
    model = SINGLE_OUTPUT_MODELS[kind](dtype=torch.float64)
    # The first factorisation, outside the count.
    model.posterior(corners(model, dtype=torch.float64))
    most = reads_per_call(model, stream_inputs(model))
    assert most == ONE_READ_PER_CALL


def test_checked_hot_paths_still_refuse_bad_input_and_leave_the_model_unchanged():
    model = build(30, None, 1, dtype=torch.float64)
    X = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    before = model.posterior(X).mean
    bad = torch.tensor([[0.0, float("nan")]], dtype=torch.float64)
    with pytest.raises(ValueError, match="X contains NaN"):
        model.observe(bad, torch.ones(1, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="Y contains NaN"):
        model.observe(X, torch.full((1, 1), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match="X contains NaN"):
        model.posterior(bad)
    with pytest.raises(ValueError, match="noise must be strictly positive"):
        model.condition_on_observations(X, X[:, :1], noise=torch.zeros_like(X[:, :1]))
    assert model.num_train == 30
    torch.testing.assert_close(model.posterior(X).mean, before)


def test_a_failed_incremental_factorisation_is_rebuilt_at_the_next_call(monkeypatch):
    # observe's rank-q update factorises without reading the result; a failure is read
    # with the next call, which rebuilds every factor from the exact statistics.
    reference = build(30, None, 1, dtype=torch.float64)
    model = build(30, None, 1, dtype=torch.float64)
    test_X = BOUNDS.mean(0, keepdim=True).to(torch.float64)
    model.posterior(test_X)
    reference.posterior(test_X)
    X_new = torch.tensor([[0.1, 0.7], [-0.4, 1.5]], dtype=torch.float64)
    Y_new = torch.sin(X_new[..., :1])
    cholesky_ex = torch.linalg.cholesky_ex

    def failing(A, **kwargs):
        L, info = cholesky_ex(A, **kwargs)
        return torch.full_like(L, float("nan")), torch.ones_like(info)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", failing)
    model.observe(X_new, Y_new)
    monkeypatch.setattr(torch.linalg, "cholesky_ex", cholesky_ex)
    assert model._pending_failure is not None
    reference.observe(X_new, Y_new)
    torch.testing.assert_close(model.posterior(test_X).mean, reference.posterior(test_X).mean)
    assert model._pending_failure is None


#: What CUDA's sync debug mode says of each synchronising call.
SYNC_WARNING = "called a synchronizing CUDA operation"


@contextlib.contextmanager
def counted_cuda_syncs() -> Iterator[list]:
    r"""Record the synchronisations CUDA's sync debug mode warns of."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode("default")
            # (Only the debug mode's own warnings: autograd warns of a stream mismatch
            # that "may incur unnecessary synchronization" in other words.)
            caught[:] = [w for w in caught if SYNC_WARNING in str(w.message)]


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@MODELS
def test_cuda_checked_hot_paths_synchronise_at_most_once_per_call(kind, dtype):
    model = SINGLE_OUTPUT_MODELS[kind](dtype=dtype, device="cuda")
    model.posterior(corners(model, dtype=dtype, device="cuda"))
    inputs = stream_inputs(model)
    torch.cuda.synchronize()
    most = reads_per_call(model, inputs, counted_cuda_syncs)
    assert most == ONE_READ_PER_CALL


@MODELS
def test_checked_marginal_likelihood_reads_the_host_once(kind):
    model = SINGLE_OUTPUT_MODELS[kind](dtype=torch.float64)
    model.train()
    expected, _ = model.fit_objective()
    with counted_host_reads() as reads:
        value, _ = model.fit_objective()
        grads = torch.autograd.grad(value, raw_lengthscales(model))
    assert len(reads) == 1, reads
    torch.testing.assert_close(value, expected)
    assert all(torch.isfinite(grad).all() for grad in grads)


def test_a_failed_marginal_likelihood_factorisation_is_computed_again_checked(monkeypatch):
    model = build(200, 0, 1, dtype=torch.float64)
    model.train()
    expected, _ = model.fit_objective()
    cholesky_ex = torch.linalg.cholesky_ex
    calls = []

    def failing_once(A, **kwargs):
        L, info = cholesky_ex(A, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            return torch.full_like(L, float("nan")), torch.ones_like(info)
        return L, info

    monkeypatch.setattr(torch.linalg, "cholesky_ex", failing_once)
    value, _ = model.fit_objective()
    assert len(calls) > 1  # computed again after the failure was read
    torch.testing.assert_close(value, expected)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@MODELS
def test_cuda_checked_marginal_likelihood_synchronises_at_most_once(kind, dtype):
    model = SINGLE_OUTPUT_MODELS[kind](dtype=dtype, device="cuda")
    model.train()
    model.fit_objective()
    torch.cuda.synchronize()
    with counted_cuda_syncs() as syncs:
        value, _ = model.fit_objective()
        torch.autograd.grad(value, raw_lengthscales(model))
    assert len(syncs) <= 1
