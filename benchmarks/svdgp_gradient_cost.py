r"""Cost of one SVDGP ELBO gradient as the mean basis grows (Cheng & Boots 2017, sec. 3.4).

For ``M_alpha`` in 64 ... 4096 at fixed ``M_beta`` (64), minibatch ``N_m`` (256) and
``d`` (4), times one evaluation of the minibatch ELBO of ``DecoupledSVGP`` plus its
backward pass (gradients for ``a``, ``L``, both bases and the hyperparameters), in
two variants:

- ``sampled``: the KL's mean term from ``N_c = N_m`` sampled columns of ``K_alpha``,
  as the model's optimizer steps do; the paper's claim is that this costs
  ``O(N_m M_alpha)``, linear in ``M_alpha``;
- ``exact``: the exact ``1/2 a^T K_alpha a``, ``O(M_alpha^2)``, for contrast.

Each timing is the median over repeats (after one warm-up). The fitted log-log slope
of time against ``M_alpha`` over the largest sizes is written too (1 = linear). The
results, with the thread count, the machine's load average and library versions,
go to ``benchmarks/results/svdgp_gradient_cost.{csv,json}``.

Usage: ``python benchmarks/svdgp_gradient_cost.py [--quick] [--threads N]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import botorch
import gpytorch
import pandas as pd
import torch

from streamgp.models import DecoupledSVGP

D, M_BETA, N_M = 4, 64, 256
RESULTS = Path(__file__).resolve().parent / "results"


def build(m_alpha: int, tkwargs: dict) -> tuple[DecoupledSVGP, torch.Tensor, torch.Tensor]:
    X = torch.rand(N_M, D, **tkwargs)
    Y = torch.sin(3 * X).sum(-1, keepdim=True)
    model = DecoupledSVGP(
        X,
        Y,
        mean_basis=torch.rand(m_alpha, D, **tkwargs),
        covar_basis=torch.rand(M_BETA, D, **tkwargs),
        max_mean_basis=m_alpha,
        max_covar_basis=M_BETA,
        learn_inducing_points=True,
        num_init_steps=0,
        warm_start=False,
        outcome_transform=None,
    )
    with torch.no_grad():
        model.mean_weights.normal_()
    model.train()
    return model, X, Y.squeeze(-1)


def time_gradient(model, X, y, sampled: bool, repeats: int) -> float:
    m_alpha = len(model.mean_basis)
    params = [p for p in model.parameters() if p.requires_grad]
    times = []
    for _ in range(repeats + 1):
        columns = torch.randperm(m_alpha)[:N_M] if sampled and N_M < m_alpha else None
        start = time.perf_counter()
        loss = -model.elbo(X, y, num_data=10 * N_M, kl_columns=columns)
        torch.autograd.grad(loss, params)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def loglog_slope(sizes: list[int], times: list[float]) -> float:
    xs, ys = [math.log(s) for s in sizes], [math.log(t) for t in times]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="M_alpha up to 1024 only")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tkwargs = {"dtype": torch.float64, "device": torch.device("cpu")}
    sizes = [64, 128, 256, 512, 1024] if args.quick else [64, 128, 256, 512, 1024, 2048, 4096]
    repeats = args.repeats or (5 if args.quick else 10)
    load_before = os.getloadavg()
    rows = []
    for m_alpha in sizes:
        model, X, y = build(m_alpha, tkwargs)
        for variant in ("sampled", "exact"):
            seconds = time_gradient(model, X, y, variant == "sampled", repeats)
            rows.append(
                {
                    "M_alpha": m_alpha,
                    "M_beta": M_BETA,
                    "N_m": N_M,
                    "d": D,
                    "variant": variant,
                    "seconds": seconds,
                }
            )
            print(f"M_alpha={m_alpha:5d} {variant:7s} {1e3 * seconds:8.2f} ms", flush=True)
    frame = pd.DataFrame(rows)
    seconds = {(row["variant"], row["M_alpha"]): row["seconds"] for row in rows}
    tail = sizes[-3:]
    slopes = {
        variant: loglog_slope(tail, [seconds[variant, m] for m in tail])
        for variant in ("sampled", "exact")
    }
    meta = {
        "script": "benchmarks/svdgp_gradient_cost.py",
        "quick": args.quick,
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpytorch": gpytorch.__version__,
        "botorch": botorch.__version__,
        "dtype": "float64",
        "repeats": repeats,
        "loglog_slope_over_largest_3": slopes,
        "note": "median time of one minibatch ELBO + backward; sampled = N_m KL columns",
    }
    RESULTS.mkdir(exist_ok=True)
    frame.to_csv(RESULTS / "svdgp_gradient_cost.csv", index=False)
    (RESULTS / "svdgp_gradient_cost.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n"
    )
    print(json.dumps(meta["loglog_slope_over_largest_3"]))


if __name__ == "__main__":
    main()
