r"""WISKI's hot paths without host synchronisation (``streamgp.settings.skip_value_checks``).

On a GPU, reading a tensor value on the host (``bool(t)``, ``t.item()``, the ``info`` of a
checked factorisation) waits for the device. Inside ``skip_value_checks`` a
``WiskiGP``'s ``observe``, ``condition_on_observations``, posterior (mean and the lazy
covariance's variances) and marginal likelihood (value and gradient) must do none:

- everywhere (CPU included), every host read of a tensor and every checked LAPACK call
  raises inside the stream step, so one would fail the test;
- on CUDA (skipped without it), the same steps run under
  ``torch.cuda.set_sync_debug_mode("error")`` in float32 and float64 and agree with CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from botorch.models.transforms import Normalize, Standardize

from streamgp import WiskiGP
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


def build(n: int, limit: int | None, num_outputs: int, **tkwargs) -> WiskiGP:
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
    )
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 0.01
    return model


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

    def points(*shape):
        U = torch.rand(*shape, 2, generator=generator, dtype=torch.float64)
        return (BOUNDS[0].double() + (BOUNDS[1] - BOUNDS[0]).double() * U).to(**tkwargs)

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
    value, _ = model.fit_objective()
    (grad,) = torch.autograd.grad(value, model.covar_module.raw_lengthscale)
    return [*out, value.detach(), grad]


def run_stream_steps(model: WiskiGP, steps: int = 4) -> list[torch.Tensor]:
    return stream_steps(model, stream_inputs(model, steps))


@pytest.mark.parametrize("num_outputs", [1, 2], ids=["one output", "two outputs"])
@pytest.mark.parametrize("n, limit", [(30, None), (200, 0)], ids=["data space", "grid space"])
def test_hot_paths_read_nothing_on_the_host_and_give_the_checked_results(n, limit, num_outputs):
    checked = run_stream_steps(build(n, limit, num_outputs, dtype=torch.float64))
    model = build(n, limit, num_outputs, dtype=torch.float64)
    model.posterior(BOUNDS.to(torch.float64))  # the first factorisation, outside the check
    inputs = stream_inputs(model)
    with skip_value_checks(), no_host_reads():
        unchecked = stream_steps(model, inputs)
    assert len(unchecked) == len(checked)
    for a, b in zip(unchecked, checked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


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
@pytest.mark.parametrize("n, limit", [(30, None), (200, 0)], ids=["data space", "grid space"])
def test_cuda_hot_paths_do_not_synchronise_and_agree_with_cpu(n, limit, dtype):
    expected = run_stream_steps(build(n, limit, 1, dtype=torch.float64))
    model = build(n, limit, 1, dtype=dtype, device="cuda")
    model.posterior(BOUNDS.to(dtype=dtype, device="cuda"))
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
