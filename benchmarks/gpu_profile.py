r"""Where the time of WISKI's two slowest GPU steps goes: a profile, not a benchmark.

The two steps (issue 36's unmet GPU targets):

- ``mll``: the structured marginal likelihood's value + gradient on a 32^3 grid
  (``WoodburyMarginalLogLikelihood``, ``ScaleKernel(RBF)``, n = 10^4);
- ``update``: condition on q = 3 points, then the posterior mean and variance at 16 points
  (16^3 grid, n = 10^5; ``hot_path_ops.STEPS``).

For each, in float32 and float64: the median synchronised time, the kernel launches,
host synchronisations and memory copies per call, the time the device was busy, the
Python-side time (cProfile's top functions by cumulative time) and torch.profiler's top
operations by device time; for the marginal likelihood also the Lanczos and CG
iteration counts (the products with the whitened statistic and their widths), and its time and
operations with each of ``--block-sizes`` as the Lanczos block size.

Writes ``<out>/gpu_profile-<device>.json`` and ``<out>/gpu_profile-<device>.txt``.
``--device cpu --quick`` is the dry run.

Usage: ``python benchmarks/gpu_profile.py [--device cuda] [--quick] [--out DIR]``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_check import mll_model, mll_value_and_grad
from hot_path_ops import STEPS, build, op_counts, step_inputs
from torch.profiler import ProfilerActivity, profile

from streamgp.linalg import love, structured
from streamgp.utils.machine import device_label, machine_info, median_seconds, synchronize


def _python_profile(fn: Callable[[], object], calls: int, top: int = 30) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    synchronize()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(top)
    return stream.getvalue()


def _device_profile(fn: Callable[[], object], device: torch.device, top: int = 25) -> dict:
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize()
    with profile(activities=activities) as prof:
        fn()
        synchronize()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=top)
    busy_us = None
    if device.type == "cuda":
        busy_us = sum(
            e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA"
        )
    return {"table": table, "device busy ms": None if busy_us is None else busy_us / 1e3}


class _CountProducts:
    r"""Counts the whitened statistic's products and CG iterations during one call."""

    def __init__(self) -> None:
        self.products: list[int] = []
        self.cg_iterations: list[int] = []

    def __enter__(self):
        self._matmul = structured.WhitenedStatistic.matmul
        self._cg = structured.conjugate_gradients
        counter = self

        def matmul(operator, V):
            counter.products.append(V.shape[-1])
            return counter._matmul(operator, V)

        def cg(matmul_fn, rhs, precondition, rtol, max_iter):
            calls = [0]

            def counted(V):
                calls[0] += 1
                return matmul_fn(V)

            out = counter._cg(counted, rhs, precondition, rtol, max_iter)
            counter.cg_iterations.append(calls[0])
            return out

        structured.WhitenedStatistic.matmul = matmul
        structured.conjugate_gradients = cg
        return self

    def __exit__(self, *exc):
        structured.WhitenedStatistic.matmul = self._matmul
        structured.conjugate_gradients = self._cg


def profile_mll(args, tkwargs: dict) -> dict:
    grid, n = (10, 1_000) if args.quick else (32, 10_000)
    model = mll_model(grid, n, tkwargs)
    value_and_grad = mll_value_and_grad(model)

    device = torch.device(tkwargs["device"])
    row = {"grid": grid, "n": n, "structured": model.structured}
    row["ms"] = 1e3 * median_seconds(value_and_grad, repeats=args.repeats, warmup=True)
    row.update(op_counts(value_and_grad, device))
    with _CountProducts() as counted:
        value_and_grad()
    row["whitened products (widths)"] = counted.products
    row["cg iterations"] = counted.cg_iterations
    row["device"] = _device_profile(value_and_grad, device)
    row["python"] = _python_profile(value_and_grad, 3)
    row["by lanczos block size"] = _block_size_sweep(value_and_grad, args, device)
    return row


def _block_size_sweep(value_and_grad: Callable[[], object], args, device) -> list[dict]:
    r"""The same call with other Lanczos block sizes (``love.DEFAULT_BLOCK_SIZE``): wider
    blocks mean fewer block iterations, so fewer launches and host reads, for a rank
    that may overshoot by up to a block (more device work)."""
    rows = []
    default = love.DEFAULT_BLOCK_SIZE
    try:
        for block_size in args.block_sizes:
            love.DEFAULT_BLOCK_SIZE = block_size
            with _CountProducts() as counted:
                value_and_grad()
            sweep = {"block size": block_size, "products": sum(counted.products)}
            sweep["ms"] = 1e3 * median_seconds(value_and_grad, repeats=args.repeats, warmup=True)
            sweep.update(op_counts(value_and_grad, device))
            print("  lanczos block size", sweep, flush=True)
            rows.append(sweep)
    finally:
        love.DEFAULT_BLOCK_SIZE = default
    return rows


def profile_update(args, tkwargs: dict) -> dict:
    grid, n = (10, 1_000) if args.quick else (16, 100_000)
    model = build(n, grid, tkwargs)
    step = STEPS["condition + predict"]
    inputs = step_inputs(tkwargs, seed=3)
    device = torch.device(tkwargs["device"])

    def call():
        with torch.no_grad():
            return step(model, inputs)

    row = {"grid": grid, "n": n}
    row["ms"] = 1e3 * median_seconds(call, repeats=args.repeats, warmup=True)
    row.update(op_counts(call, device))
    row["device"] = _device_profile(call, device)
    row["python"] = _python_profile(call, 20)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--block-sizes",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[64, 128, 256],
        help="Lanczos block sizes the marginal likelihood is also timed with",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    machine = machine_info(args.device)
    name = device_label(machine)
    results = {"machine": machine}
    for dtype in ("float32", "float64"):
        tkwargs = {"dtype": getattr(torch, dtype), "device": torch.device(args.device)}
        for step, fn in (("mll", profile_mll), ("update", profile_update)):
            results[f"{step} {dtype}"] = row = fn(args, tkwargs)
            print(step, dtype, {k: v for k, v in row.items() if k not in ("device", "python")})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_profile-{name}.json").write_text(json.dumps(results, indent=2, default=str))
    text = []
    for key, row in results.items():
        if key == "machine":
            continue
        summary = {k: v for k, v in row.items() if k not in ("device", "python")}
        text += [f"==== {key}", json.dumps(summary, default=str)]
        text += [f"device busy ms: {row['device']['device busy ms']}", row["device"]["table"]]
        text += [row["python"]]
    (args.out / f"gpu_profile-{name}.txt").write_text("\n".join(text))


if __name__ == "__main__":
    main()
