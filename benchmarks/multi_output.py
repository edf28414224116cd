r"""One k-output ``WiskiGP`` against k single-output ``WiskiGP``s on the same inputs.

With ``shared_hyperparameters=True`` the outputs of a multi-output WISKI share the
interpolation rows, the Gram statistics ``W^T W``, the kernel and the noise, so the
factorisation (``n x n`` in data space, ``m x m`` on the grid) and every update of it are
done once for all outputs; only
``W^T y``, ``y^T y`` and the means are per output. k single-output models (what a
``ModelListGP`` holds) do all of it k times.

The default mode (``layout`` "members": each output its own kernel and noise, as
``SingleTaskGP``) holds the outputs as batch members on one grid: every factor is per
output, as for k single-output models, but in one batched call.

For d = 3, a 10^3 grid, fixed hyperparameters and k = 1, 2, 4, 8 outputs, at n = 100
(data space; members: grid space) and n = 3000 (grid space), each timed as the median of
``--repeats``:

- ``mll_grad``: one marginal-likelihood value and gradient (all outputs);
- ``first_posterior``: the first prediction at 16 points after building (factorisation);
- ``stream_step``: ``observe`` of 1 point and a prediction at 16 points (mean over a
  stream of ``--steps`` steps);
- ``variances``: the posterior variances at 10^3 points (a warm model).

One torch thread. Results: ``benchmarks/results/multi_output.{json,csv}``.

Usage: ``python benchmarks/multi_output.py [--repeats 5] [--steps 40]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel
from gpytorch.means import ZeroMean

from streamgp import WiskiGP
from streamgp.utils.machine import machine_info, median_seconds

D, GRID, T = 3, 10, 16
OUTPUTS = (1, 2, 4, 8)


def data(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.rand(n, D, dtype=torch.float64)
    phases = torch.arange(k, dtype=torch.float64)
    Y = torch.sin(4 * X.sum(-1, keepdim=True) + phases) + 0.1 * torch.randn(n, k, dtype=X.dtype)
    return X, Y


def build(X: torch.Tensor, Y: torch.Tensor, shared: bool = True) -> WiskiGP:
    k = Y.shape[-1]
    members = {} if shared or k == 1 else {"batch_shape": torch.Size([k])}
    model = WiskiGP(
        X,
        Y,
        grid_size=GRID,
        covar_module=RBFKernel(ard_num_dims=D, **members),
        outcome_transform=None,
        mean_module=ZeroMean(),
        shared_hyperparameters=shared,  # (k = 1 ignores it)
    )
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 0.01
    return model


def models_for(X: torch.Tensor, Y: torch.Tensor, layout: str) -> list[WiskiGP]:
    if layout in ("multi", "members"):
        return [build(X, Y, shared=layout == "multi")]
    return [build(X, Y[:, j : j + 1]) for j in range(Y.shape[-1])]


def predict(models: list[WiskiGP], Xs: torch.Tensor) -> None:
    for model in models:
        posterior = model.posterior(Xs)
        posterior.mean, posterior.variance  # noqa: B018 (force evaluation)


def mll_grad(models: list[WiskiGP]) -> None:
    for model in models:
        value, _ = model.fit_objective()
        value.sum().backward()  # (members: one value per output)


def measure(n: int, k: int, layout: str, repeats: int, steps: int) -> dict:
    X, Y = data(n, k)
    Xs = torch.rand(T, D, dtype=torch.float64)
    X_var = torch.rand(1000, D, dtype=torch.float64)
    models = models_for(X, Y, layout)
    space = "data" if models[0].in_data_space else "grid"
    row = {"n": n, "k": k, "layout": layout, "space": space}
    row["mll_grad_ms"] = 1e3 * median_seconds(lambda: mll_grad(models), repeats)
    row["first_posterior_ms"] = 1e3 * median_seconds(
        lambda: predict(models_for(X, Y, layout), Xs), repeats
    )
    predict(models, Xs)
    stream = []
    for _ in range(steps):
        X_new, Y_new = data(1, k)
        start = time.perf_counter()
        for j, model in enumerate(models):
            model.observe(X_new, Y_new if len(models) == 1 else Y_new[:, j : j + 1])
        predict(models, Xs)
        stream.append(time.perf_counter() - start)
    row["stream_step_ms"] = 1e3 * statistics.mean(stream)
    predict(models, X_var)  # warm caches, as in a loop
    row["variances_ms"] = 1e3 * median_seconds(lambda: predict(models, X_var), repeats)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for n in (100, 3000):
        for k in OUTPUTS:
            for layout in ("multi", "members", "singles") if k > 1 else ("multi",):
                row = measure(n, k, layout, args.repeats, args.steps)
                rows.append(row)
                print(row, flush=True)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "multi_output.csv", index=False)
    payload = {"machine": machine_info(dtype="float64"), "args": vars(args) | {"out": None}}
    payload["rows"] = rows
    (args.out / "multi_output.json").write_text(json.dumps(payload, indent=2))
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
