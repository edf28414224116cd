r"""Cost of ``OnlineSoftKIGP.observe`` against ``n``: constant, as WISKI's.

Synthetic ``d = 8`` data, ``m = 256`` interpolation points (k-means on the first 1000
inputs, no pretraining: the timings do not depend on where the points are), RBF
kernel with fixed hyperparameters, float64, one torch thread. One model is grown to
``n = 10^2 ... 10^5`` (bulk chunks); at each ``n`` it absorbs a stream of ``steps``
batches of ``q = 1`` and ``q = 10`` points:

- ``observe``: the in-place update alone (the posterior was used before the stream,
  so low-rank deferral and its folds at ``FOLD_RANK`` are paid inside the mean);
- ``observe_predict``: update, then mean and variance at 16 test points;
- ``softki_refactor``: what the batch ``SoftKIGP`` pays to absorb a batch at that
  ``n`` (its QR factorisation of all data, ``O(n m^2)``), once per ``n``;
- ``state_bytes``: the size of ``state_dict()`` (statistics included), to show it
  does not grow with ``n``.

Results: ``benchmarks/results/online_softki_update.{json,csv}``.

Usage: ``python benchmarks/online_softki_update.py [--steps 40] [--max-n 100000]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ZeroMean

from streamgp.inducing.kmeans import KMeansSelector
from streamgp.models.online_softki import OnlineSoftKIGP
from streamgp.models.softki import SoftKIGP
from streamgp.utils.machine import machine_info

D, M, T = 8, 256, 16
TKWARGS = {"dtype": torch.float64}


def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.rand(n, D, **TKWARGS)
    return X, torch.sin(3 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, **TKWARGS)


def hyperparameters() -> tuple[ScaleKernel, GaussianLikelihood]:
    kernel = ScaleKernel(RBFKernel(ard_num_dims=D)).to(**TKWARGS)
    kernel.base_kernel.lengthscale = 0.8
    likelihood = GaussianLikelihood().to(**TKWARGS)
    likelihood.noise = 0.01
    return kernel, likelihood


def predict(model, Xs) -> None:
    post = model.posterior(Xs)
    post.mean, post.variance  # noqa: B018 (force evaluation)


def time_stream(model, q: int, steps: int, Xs, with_predict: bool, seen: list) -> list[float]:
    predict(model, Xs)  # a valid posterior: observe takes the update paths
    times = []
    for _ in range(steps):
        Xq, Yq = data(q)
        start = time.perf_counter()
        model.observe(Xq, Yq)
        if with_predict:
            predict(model, Xs)
        times.append(time.perf_counter() - start)
        seen.append((Xq, Yq))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="streamed batches per setting")
    parser.add_argument("--max-n", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    Xs = torch.rand(T, D, **TKWARGS)
    X0, Y0 = data(1000)
    Z = KMeansSelector(num_inducing=M, seed=0).update(X0)
    kernel, likelihood = hyperparameters()
    X_all, Y_all = data(100)
    seen = [(X_all, Y_all)]  # everything the model has absorbed (for the batch model)
    model = OnlineSoftKIGP(
        X_all,
        Y_all,
        likelihood=likelihood,
        covar_module=kernel,
        inducing_points=Z,
        pretrain_epochs=0,
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    temperature = model.temperature.item()
    rows = []
    n_values = [n for n in (100, 1_000, 10_000, 100_000) if n <= args.max_n]
    for n in n_values:
        while model.num_train < n:  # grow in bulk chunks (refactorisation path)
            Xc, Yc = data(min(10_000, n - model.num_train))
            model.observe(Xc, Yc)
            seen.append((Xc, Yc))
        # The batch alternative: SoftKIGP's QR of all data at this n.
        X_all, Y_all = (torch.cat(parts) for parts in zip(*seen, strict=True))
        seen = [(X_all, Y_all)]
        batch = SoftKIGP(
            X_all,
            Y_all,
            likelihood=likelihood,
            covar_module=kernel,
            inducing_points=Z,
            temperature=temperature,
            outcome_transform=None,
            mean_module=ZeroMean(),
        )
        start = time.perf_counter()
        predict(batch, Xs)
        refactor = time.perf_counter() - start
        del batch
        state_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
        for q in (1, 10):
            times = {
                "observe": time_stream(model, q, args.steps, Xs, False, seen),
                "observe_predict": time_stream(model, q, args.steps, Xs, True, seen),
            }
            row = {"n": n, "q": q, "m": M, "d": D, "steps": args.steps}
            row |= {f"{k}_ms_mean": 1e3 * statistics.mean(v) for k, v in times.items()}
            row |= {f"{k}_ms_median": 1e3 * statistics.median(v) for k, v in times.items()}
            row["softki_refactor_ms"] = 1e3 * refactor
            row["state_bytes"] = state_bytes
            rows.append(row)
            print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / "online_softki_update.csv", index=False)
    payload = {
        "machine": machine_info(dtype="float64"),
        "d": D,
        "m": M,
        "steps": args.steps,
        "rows": rows,
    }
    (args.out / "online_softki_update.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
