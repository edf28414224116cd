r"""Time of one BO update as the data grow: condition on q=3 points, predict at 16.

Models (3-D inputs, RBF kernel, fixed hyperparameters):
- WISKI (``WiskiGP``, 10^3 grid) for n = 10^2 ... 10^6; with ``--grid-sizes 16,32`` also
  on 16^3 and 32^3 grids (``wiski_g16``, ``wiski_g32``; grids above 4096 points take the
  structured large-grid path, whose one-time LOVE root build is reported as build time);
- BoTorch ``SingleTaskGP`` (exact) for n <= 4000;
- gpytorch's own SKI fantasy path (``SingleTaskGP`` with a ``GridInterpolationKernel``
  on the same 10^3 grid), whose ``InterpolatedPredictionStrategy`` rebuilds an
  O(m^3) cache on the first prediction after every update.

Each timing is the median over repeats (taken round-robin over n, the first dropped)
of ``condition_on_observations(X_q, Y_q)`` followed by ``posterior(X_test)`` with mean
and variance evaluated. Results go to ``benchmarks/results/update_scaling.{json,csv}``.

Usage: ``python benchmarks/update_scaling.py [--quick]``, or e.g.
``--models wiski --grid-sizes 16,32 --wiski-n 10000,100000 --tag large_grids`` for the
large-grid rows (and ``--device cuda --dtype float32`` on a GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.models import SingleTaskGP
from gpytorch.kernels import GridInterpolationKernel, RBFKernel
from gpytorch.means import ZeroMean

from streamgp import WiskiGP
from streamgp.utils.machine import machine_info, synchronize

D, GRID, Q, T = 3, 10, 3, 16
LENGTHSCALE, NOISE = 0.3, 0.01


def data(n, tkwargs):
    X = torch.rand(n, D, **tkwargs)
    return X, torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, **tkwargs)


def time_update(model, tkwargs, repeats):
    """Seconds of ``repeats`` updates (condition on q points, then predict at T)."""
    Xq, Yq = data(Q, tkwargs)
    Xs = torch.rand(T, D, **tkwargs)
    times = []
    for _ in range(repeats):
        synchronize()  # on CUDA: time the work, not its launch
        start = time.perf_counter()
        conditioned = model.condition_on_observations(Xq, Yq)
        post = conditioned.posterior(Xs)
        post.mean, post.variance  # noqa: B018 (force evaluation)
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def build(kind, n, tkwargs):
    X, Y = data(n, tkwargs)
    if kind.startswith("wiski"):
        grid = int(kind.removeprefix("wiski_g")) if kind != "wiski" else GRID
        model = WiskiGP(
            X,
            Y,
            grid_size=grid,
            covar_module=RBFKernel(ard_num_dims=D),
            outcome_transform=None,
            mean_module=ZeroMean(),
        )
    elif kind == "exact":
        model = SingleTaskGP(X, Y, covar_module=RBFKernel(ard_num_dims=D), outcome_transform=None)
    else:
        base = RBFKernel(ard_num_dims=D)
        kernel = GridInterpolationKernel(base, grid_size=GRID, num_dims=D, grid_bounds=[(0, 1)] * D)
        model = SingleTaskGP(X, Y, covar_module=kernel, outcome_transform=None)
    kernel = model.covar_module
    (kernel.base_kernel if kind == "gpytorch_ski" else kernel).lengthscale = LENGTHSCALE
    model.likelihood.noise = NOISE
    model.eval()
    model.posterior(X[:2]).variance  # noqa: B018 (warm the prediction caches)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--models", default="wiski,exact,gpytorch_ski", help="comma-separated")
    parser.add_argument(
        "--grid-sizes", default="10", help="WISKI points per dimension, comma-separated"
    )
    parser.add_argument("--wiski-n", default=None, help="WISKI sizes n, comma-separated")
    parser.add_argument("--repeats", type=int, default=None, help="updates timed per size")
    parser.add_argument("--tag", default="", help="suffix of the results files")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tkwargs = {"dtype": getattr(torch, args.dtype), "device": torch.device(args.device)}
    torch.manual_seed(0)
    sizes = {
        "wiski": [100, 1000, 10_000, 100_000, 1_000_000],
        "exact": [100, 1000, 2000, 4000],
        # gpytorch-SKI construction at n = 10^4 takes minutes here; 4000 is the reference n.
        "gpytorch_ski": [100, 1000, 4000],
    }
    repeats = {"wiski": 101, "exact": 7, "gpytorch_ski": 5}
    if args.wiski_n is not None:
        sizes["wiski"] = [int(v) for v in args.wiski_n.split(",")]
    for g in (int(v) for v in args.grid_sizes.split(",")):
        if g != GRID:
            sizes[f"wiski_g{g}"], repeats[f"wiski_g{g}"] = sizes["wiski"], repeats["wiski"]
    if GRID not in [int(v) for v in args.grid_sizes.split(",")]:
        del sizes["wiski"]
    chosen = args.models.split(",")
    sizes = {k: v for k, v in sizes.items() if k.split("_g")[0] in chosen}
    if args.repeats is not None:
        repeats = dict.fromkeys(repeats, args.repeats)
    if args.quick:
        sizes = {k: [v for v in vs if v <= 1000] for k, vs in sizes.items()}
    rows = []
    torch.set_grad_enabled(False)  # all models: prediction caches without autograd graphs
    for kind, ns in sizes.items():
        # All sizes of one model are built first and then timed round-robin (one update
        # per size per round), so drifts in the shared machine's load affect every n
        # alike and the ratios between sizes stay meaningful.
        models, build_s = {}, {}
        for n in ns:
            start = time.perf_counter()
            models[n] = build(kind, n, tkwargs)
            synchronize()
            build_s[n] = time.perf_counter() - start
            print(f"{kind:>13} n={n:>8}: built in {build_s[n]:.1f} s", flush=True)
        times = {n: [] for n in ns}
        for _ in range(repeats[kind]):
            for n in ns:
                times[n].extend(time_update(models[n], tkwargs, 1))
        for n in ns:
            t = statistics.median(times[n][1:])
            # Data-space models (n <= data_space_limit) update without any LOVE root.
            model = models[n]
            large = kind.startswith("wiski") and model.structured and not model.in_data_space
            rows.append(
                {
                    "model": kind,
                    "n": n,
                    "median_ms": 1e3 * t,
                    "build_s": build_s[n],
                    "dtype": args.dtype,
                    # Rank k of a large grid's LOVE root (the update costs O(m k q)).
                    "love_rank": model.grid_posterior().root.shape[-1] if large else None,
                }
            )
            print(f"{kind:>13} n={n:>8}: {1e3 * t:9.2f} ms", flush=True)
        del models
    frame = pd.DataFrame(rows)
    med = {(r.model, r.n): r.median_ms for r in frame.itertuples()}
    summary = {}
    if ("wiski", 100_000) in med and ("wiski", 100) in med:
        summary["wiski_t1e5_over_t1e2"] = med[("wiski", 100_000)] / med[("wiski", 100)]
        summary["wiski_ms_n1e5"] = med[("wiski", 100_000)]
    for kind in sorted({r.model for r in frame.itertuples() if r.model.startswith("wiski")}):
        ns = sorted(n for (k, n) in med if k == kind)
        summary[f"{kind}_t_max_n_over_t_min_n"] = med[(kind, ns[-1])] / med[(kind, ns[0])]
    if ("exact", 4000) in med and ("wiski", 10_000) in med:
        summary["exact_over_wiski_n4000"] = med[("exact", 4000)] / med[("wiski", 10_000)]
    if ("gpytorch_ski", 4000) in med and ("wiski", 10_000) in med:
        summary["gpytorch_ski_over_wiski_n4000"] = (
            med[("gpytorch_ski", 4000)] / med[("wiski", 10_000)]
        )
    machine = machine_info(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = (
        "update_scaling"
        + ("_quick" if args.quick else "")
        + ("" if args.device == "cpu" else f"_{args.device}")
        + ("" if args.dtype == "float64" else f"_{args.dtype}")
        + (f"_{args.tag}" if args.tag else "")
    )
    frame.to_csv(args.out / f"{stem}.csv", index=False)
    (args.out / f"{stem}.json").write_text(
        json.dumps({"machine": machine, "summary": summary, "rows": rows}, indent=2)
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
