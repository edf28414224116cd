r"""What a data-space ``WiskiGP`` (d >= 4) costs as n grows, against the exact and additive GPs.

With its default grid in ``d >= 4`` dimensions ``WiskiGP`` stays in data space and
evaluates its kernel exactly: an exact GP, in answers and in cost. This script measures where that
stops being affordable, for ``streamgp.models.registry.choose_model``'s rule: the value and
gradient of the marginal likelihood (what ``fit_gpytorch_mll`` evaluates at every L-BFGS-B
step, a refit takes 20-100 of them) and the process's peak memory, at ``n`` observations in
``d`` dimensions, for the three models built as a BoTorch user builds them (``Normalize(d)``
without bounds, ``Standardize``, learned noise, default kernels, initial hyperparameters).

Each (model, d, n) runs in its own process, so that the peak resident memory
(``ru_maxrss``) is that configuration's. Results: ``<out>/data_space_scaling.{csv,json}``.

Usage: ``python benchmarks/data_space_scaling.py [--dims 6 10 20] [--n 500 1000 2000 4000]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).parent
MODELS = ("SingleTaskGP", "WiskiGP", "AdditiveWiskiGP")


def measure(model_name: str, dim: int, n: int, repeats: int) -> dict:
    r"""One configuration, in this process: milliseconds per value + gradient, peak memory."""
    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Normalize, Standardize
    from botorch.optim.closures import get_loss_closure
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from streamgp import AdditiveWiskiGP, WiskiGP
    from streamgp.utils.machine import median_seconds

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(n, dim, dtype=torch.float64, generator=generator)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, dtype=torch.float64, generator=generator
    )
    cls = {"SingleTaskGP": SingleTaskGP, "WiskiGP": WiskiGP, "AdditiveWiskiGP": AdditiveWiskiGP}
    model = cls[model_name](
        X, Y, input_transform=Normalize(d=dim), outcome_transform=Standardize(m=1)
    )
    # As a BoTorch user fits it: ExactMarginalLogLikelihood, whose closure is each
    # streamgp model's own objective (compute_custom_loss).
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    loss = get_loss_closure(mll)  # fit_gpytorch_mll's closure

    def step() -> None:
        model.zero_grad()
        loss().backward()

    seconds = median_seconds(step, repeats, warmup=True)  # warm-up: what the model caches
    return {
        "model": model_name,
        "dim": dim,
        "n": n,
        "mll_fwd_bwd_ms": 1e3 * seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[6, 10, 20])
    parser.add_argument("--n", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "DIM", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:  # a child process: one configuration, printed as JSON
        model_name, dim, n = args.one
        print(json.dumps(measure(model_name, int(dim), int(n), args.repeats)))
        return
    from streamgp.utils.machine import machine_info

    rows = []
    for dim in args.dims:
        for n in args.n:
            for model_name in args.models:
                command = [sys.executable, __file__, "--one", model_name, str(dim), str(n),
                           "--repeats", str(args.repeats)]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(done.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(f"{model_name} d={dim} n={n} failed")
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(rows[-1], flush=True)
    results = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out / "data_space_scaling.csv", index=False)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (args.out / "data_space_scaling.json").write_text(
        json.dumps({"settings": settings, "machine": machine_info(), "rows": rows}, indent=1)
    )
    print(results.pivot_table(index=["dim", "n"], columns="model").round(1).to_string())


if __name__ == "__main__":
    main()
