r"""What one acquisition call costs in 6-20 dimensions: WISKI's high-d models against the exact GP.

In the d = 6-20 BO table (``bo_high_dim.py``) about three quarters of every model's time
is BoTorch's ``optimize_acqf``, whose L-BFGS-B calls the acquisition's value and gradient
over and over. This script times that call, as the optimiser makes it: ``qLogExpectedImprovement``
(128 Sobol samples) value + gradient at a batch of 10 restarts x q = 3 points, on a model
conditioned on 3 fresh points (a new posterior, as after each BO step; its caches start
empty), 10 calls per conditioned model.

Models (``d``-D inputs in ``[0, 1]^d``, ``sin(3 x)`` summed over dimensions plus noise,
default hyperparameters, no fit): the exact GP (BoTorch ``SingleTaskGP``),
:class:`~streamgp.AdditiveWiskiGP` (default singleton groups and grids) and
:class:`~streamgp.WiskiGP` as a BoTorch user meets it at d >= 4 (in data space, the kernel
evaluated exactly), at n = 100, 300 and 600 (the table's range). Reported: the
median and mean milliseconds per call over ``--repeats`` conditioned models x 10 calls, taken
round-robin over the models, the top-level aten operations of one call, and the ratio to the
exact GP's median.

Writes ``benchmarks/results/acquisition_call_cost.{csv,json}``.

Usage: ``python benchmarks/acquisition_call_cost.py [--dims 6,10,20] [--sizes 100,300,600]
[--repeats 6] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from botorch.acquisition.logei import qLogExpectedImprovement
from botorch.models import SingleTaskGP
from botorch.sampling import SobolQMCNormalSampler
from hot_path_ops import op_counts

from streamgp import AdditiveWiskiGP, WiskiGP
from streamgp.utils.machine import machine_info

RESTARTS, Q, CALLS = 10, 3, 10
MODELS = {"exact": SingleTaskGP, "additive_wiski": AdditiveWiskiGP, "wiski": WiskiGP}


def data(n: int, d: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.rand(n, d, generator=generator, dtype=torch.float64)
    noise = 0.1 * torch.randn(n, 1, generator=generator, dtype=torch.float64)
    return X, torch.sin(3 * X).sum(-1, keepdim=True) + noise


def acquisition_calls(model, d: int, generator: torch.Generator):
    r"""A fresh conditioned model's acquisition and the batches its calls are made at."""
    X_new, Y_new = data(Q, d, generator)
    conditioned = model.condition_on_observations(X_new, Y_new)
    sampler = SobolQMCNormalSampler(torch.Size([128]), seed=0)
    best = model.train_targets.max() if hasattr(model, "train_targets") else Y_new.max()
    acquisition = qLogExpectedImprovement(conditioned, best_f=best, sampler=sampler)
    batches = [
        torch.rand(RESTARTS, Q, d, generator=generator, dtype=torch.float64).requires_grad_()
        for _ in range(CALLS)
    ]
    return acquisition, batches


def value_and_gradient(acquisition, X: torch.Tensor) -> torch.Tensor:
    (gradient,) = torch.autograd.grad(acquisition(X).sum(), X)
    return gradient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="6,10,20")
    parser.add_argument("--sizes", default="100,300,600")
    parser.add_argument("--repeats", type=int, default=6, help="conditioned models per size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for d in [int(v) for v in args.dims.split(",")]:
        models = {}
        for n in [int(v) for v in args.sizes.split(",")]:
            X, Y = data(n, d, generator)
            for name, cls in MODELS.items():
                models[name, n] = model = cls(X, Y).eval()
                model.posterior(X[:2])  # (gpytorch conditions only after a prediction)
        times = {key: [] for key in models}
        for _ in range(args.repeats):  # round-robin: load drifts hit every model alike
            for key, model in models.items():
                acquisition, batches = acquisition_calls(model, d, generator)
                for X in batches:
                    start = time.perf_counter()
                    value_and_gradient(acquisition, X)
                    times[key].append(time.perf_counter() - start)
        for (name, n), model in models.items():
            acquisition, batches = acquisition_calls(model, d, generator)
            value_and_gradient(acquisition, batches[0])  # (caches as in the timed calls)
            call = lambda a=acquisition, X=batches[1]: value_and_gradient(a, X)  # noqa: E731
            ops = op_counts(call, torch.device("cpu"))["aten_ops"]
            rows.append(
                {
                    "d": d,
                    "n": n,
                    "model": name,
                    "median_ms": 1e3 * statistics.median(times[name, n]),
                    "mean_ms": 1e3 * statistics.fmean(times[name, n]),
                    "calls": len(times[name, n]),
                    "aten_ops": ops,
                }
            )
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    exact = frame[frame.model == "exact"].set_index(["d", "n"])["median_ms"]
    frame["ratio_to_exact"] = [
        row.median_ms / exact[row.d, row.n] for row in frame.itertuples(index=False)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "acquisition_call_cost.csv", index=False)
    machine = machine_info("cpu", dtype="float64", threads=args.threads)
    (args.out / "acquisition_call_cost.json").write_text(
        json.dumps({"machine": machine, "rows": frame.to_dict("records")}, indent=2)
    )
    print(frame.pivot_table(index=["d", "n"], columns="model", values="median_ms").to_string())


if __name__ == "__main__":
    main()
