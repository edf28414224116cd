r"""How many operations WISKI's hot paths run: top-level aten ops on the CPU, launches on CUDA.

On a GPU a small update is bound by kernel launches and host synchronisations, not by
arithmetic. The number of top-level aten operations a step runs on the CPU is a proxy
for its launches that needs no GPU; on CUDA the profiler also counts the kernel
launches, the host synchronisations and the memory copies themselves.

The steps (``WiskiGP`` in 3-D, RBF kernel, fixed hyperparameters, ``grid_size`` points
per axis, ``n`` observations; ``T = 16`` test points, ``q = 3``):

- ``posterior``: the posterior mean and variance at the test points;
- ``condition + predict``: ``condition_on_observations`` on ``q`` points, then the
  conditioned model's posterior mean and variance;
- ``observe + predict``: ``observe`` of ``q`` points, then the posterior mean and
  variance;

each in the default mode and inside ``streamgp.settings.skip_value_checks``. The
counts are of one call after a warm-up call (caches built). :func:`op_counts` and
:data:`STEPS` are shared with ``gpu_check.py``.

Results go to ``<out>/hot_path_ops.{json,csv}``.

Usage: ``python benchmarks/hot_path_ops.py [--n 1000,100000] [--grid 10] [--device cpu]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel
from gpytorch.means import ZeroMean
from torch.profiler import ProfilerActivity, profile

from streamgp import WiskiGP
from streamgp.settings import skip_value_checks
from streamgp.utils.machine import machine_info

D, Q, T = 3, 3, 16
LENGTHSCALE, NOISE = 0.3, 0.01


def data(n: int, tkwargs: dict, generator: torch.Generator | None = None):
    r"""``n`` uniform points in the unit cube (drawn on the device) and noisy targets."""
    X = torch.rand(n, D, generator=generator, **tkwargs)
    noise = torch.randn(n, 1, generator=generator, **tkwargs)
    return X, torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * noise


def build(n: int, grid_size: int, tkwargs: dict) -> WiskiGP:
    r"""A ``WiskiGP`` on ``n`` points with fixed hyperparameters, its caches built."""
    X, Y = data(n, tkwargs)
    model = WiskiGP(
        X,
        Y,
        grid_size=grid_size,
        covar_module=RBFKernel(ard_num_dims=D),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    return with_fixed_hyperparameters(model, X)


def with_fixed_hyperparameters(model, X: torch.Tensor):
    r"""``model`` (an RBF kernel's, WISKI or exact) with this script's lengthscale and
    noise, in eval mode with its prediction caches built at ``X``'s first points."""
    model.covar_module.lengthscale = LENGTHSCALE
    model.likelihood.noise = NOISE
    model.eval()
    with torch.no_grad():
        model.posterior(X[:2]).variance  # noqa: B018 (the prediction caches)
    return model


def _predict(model, X_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    posterior = model.posterior(X_test)
    return posterior.mean, posterior.variance


def _posterior(model, inputs: dict) -> tuple[torch.Tensor, ...]:
    return _predict(model, inputs["X_test"])


def _condition_predict(model, inputs: dict) -> tuple[torch.Tensor, ...]:
    conditioned = model.condition_on_observations(inputs["X_q"], inputs["Y_q"])
    return _predict(conditioned, inputs["X_test"])


def _observe_predict(model, inputs: dict) -> tuple[torch.Tensor, ...]:
    model.observe(inputs["X_q"], inputs["Y_q"])
    return _predict(model, inputs["X_test"])


#: The hot paths: name -> step(model, inputs). ``observe + predict`` grows the model.
STEPS: dict[str, Callable] = {
    "posterior": _posterior,
    "condition + predict": _condition_predict,
    "observe + predict": _observe_predict,
}


def step_inputs(tkwargs: dict, seed: int = 0) -> dict:
    r"""Test points and a batch of ``q`` observations, inside the grid's box."""
    generator = torch.Generator(device=tkwargs.get("device", "cpu")).manual_seed(seed)
    X_q, Y_q = data(Q, tkwargs, generator)
    X_test = torch.rand(T, D, generator=generator, **tkwargs)
    return {"X_q": X_q, "Y_q": Y_q, "X_test": X_test}


def op_counts(fn: Callable[[], object], device: torch.device) -> dict[str, int]:
    r"""Operations of one call of ``fn``: top-level aten ops, and on CUDA the kernel
    launches, host synchronisations and memory copies (torch.profiler)."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.events()
    counts = {
        # An aten op no other aten op called: what Python-level code asked for.
        "aten_ops": sum(
            1
            for e in events
            if e.name.startswith("aten::")
            and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))
        ),
    }
    if device.type == "cuda":
        names = [e.name for e in events]
        counts["launches"] = sum("LaunchKernel" in name for name in names)
        # The profiler's own closing synchronisation is outside ``fn``: not counted.
        counts["syncs"] = sum("Synchronize" in name for name in names) - 1
        counts["memcpys"] = sum("Memcpy" in name for name in names)
    return counts


def checks_mode(skip: bool):
    return skip_value_checks() if skip else contextlib.nullcontext()


def measure(n: int, grid_size: int, tkwargs: dict) -> list[dict]:
    r"""Counts of every step of :data:`STEPS`, with and without value checks."""
    rows = []
    device = torch.device(tkwargs["device"])
    for skip in (False, True):
        model = build(n, grid_size, tkwargs)
        for name, step in STEPS.items():
            with torch.no_grad(), checks_mode(skip):
                step(model, step_inputs(tkwargs, seed=1))  # warm-up (caches, allocator)
                inputs = step_inputs(tkwargs, seed=2)
                counts = op_counts(lambda s=step, i=inputs, m=model: s(m, i), device)
            rows.append(
                {"step": name, "n": n, "grid": grid_size, "skip_value_checks": skip, **counts}
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="1000,100000", help="sizes, comma-separated")
    parser.add_argument("--grid", type=int, default=10, help="grid points per axis")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.manual_seed(0)
    tkwargs = {"dtype": getattr(torch, args.dtype), "device": torch.device(args.device)}
    rows = [
        row for n in (int(v) for v in args.n.split(",")) for row in measure(n, args.grid, tkwargs)
    ]
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "hot_path_ops" + ("" if args.device == "cpu" else f"_{args.device}")
    frame.to_csv(args.out / f"{stem}.csv", index=False)
    summary = {
        "machine": machine_info(args.device, dtype=args.dtype),
        "rows": rows,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(summary, indent=2))
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
