"""BoTorch's closed-loop constrained batch BO tutorial, with the GP class as an argument.

Follows BoTorch's tutorial "Closed-loop batch, constrained BO in BoTorch with qLogEI and
qLogNEI" (https://botorch.org/docs/tutorials/closed_loop_botorch_only), re-implemented here
with the model class swappable, so ``SingleTaskGP`` can be replaced by streamgp's models
(``from streamgp import WiskiGP, AdditiveWiskiGP``) the way a user would edit the tutorial:

- Problem: maximise the negated Hartmann-6 function on [0, 1]^6 subject to the outcome
  constraint c(x) = ||x||_1 - 3 <= 0; objective and constraint are both observed with
  Gaussian noise of standard deviation ``--noise-se`` (default 0.5, the standard error the
  tutorial's text states), passed to the models as known noise (``train_Yvar``).
- Start: 10 uniformly random points (the same ones for every model at a given seed).
- Every batch: a ``ModelListGP`` of two models (objective, constraint), each
  ``cls(train_x, train_y, train_yvar, input_transform=Normalize(d=6))`` (``Normalize``
  without bounds, as in the tutorial), warm-started from the previous batch's model with
  ``model.load_state_dict(state_dict)``, fitted by
  ``fit_gpytorch_mll(SumMarginalLogLikelihood(...))``; then q = 3 points from qLogNEI
  (``--acquisitions qNEI``) or qLogEI (``qEI``) with the tutorial's objective (output 0),
  constraint callable (output 1), 256 Sobol QMC samples and
  ``optimize_acqf(num_restarts=10, raw_samples=512, options={"batch_limit": 5,
  "maxiter": 200})``. ``random`` is the tutorial's random baseline (q uniform points per
  batch; no model).

Measured for every (model, acquisition, seed, batch): the best noiseless objective value
among the feasible points evaluated so far (the tutorial's ``weighted_obj``: an infeasible
point counts as 0), the wall-clock seconds of that batch (model build + warm start + fit +
acquisition optimisation; observing the new points is not timed) and n, the number of
observations the batch's model was built on. Rows are merged into
``<out>/closed_loop.csv`` (a rerun of the same model, acquisition, seed, batch, noise and
machine replaces its rows), then a summary over that file is printed: per model and
acquisition, the best value after the last batch (mean ± sd over seeds) and the median
seconds per batch.

Usage (one torch thread; on a shared machine run it niced)::

    nice -n 19 python benchmarks/closed_loop.py --model SingleTaskGP \\
        --model AdditiveWiskiGP --seeds 0 1 2 --batches 20 --acquisitions qNEI
    python benchmarks/closed_loop.py --model WiskiGP --seeds 0 --batches 3
    python benchmarks/closed_loop.py --acquisitions qEI qNEI random --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from _rows import merge_rows, print_failures, run_recording_failure
from botorch.acquisition import qLogExpectedImprovement, qLogNoisyExpectedImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.exceptions import BadInitialCandidatesWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.optim import optimize_acqf
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.test_functions import Hartmann
from gpytorch.mlls import SumMarginalLogLikelihood

from streamgp import AdditiveWiskiGP, WiskiGP

DTYPE = torch.double
DIM = 6
N_INITIAL = 10
BATCH_SIZE = 3
NUM_RESTARTS = 10
RAW_SAMPLES = 512
MC_SAMPLES = 256
OPTIMIZER_OPTIONS = {"batch_limit": 5, "maxiter": 200}
MODELS = {cls.__name__: cls for cls in (SingleTaskGP, WiskiGP, AdditiveWiskiGP)}
ACQUISITIONS = ("qNEI", "qEI", "random")
KEY = ["model", "acquisition", "seed", "batch", "noise_se", "machine"]

BOUNDS = torch.stack([torch.zeros(DIM, dtype=DTYPE), torch.ones(DIM, dtype=DTYPE)])
hartmann = Hartmann(dim=DIM, negate=True)


def constraint_value(X: torch.Tensor) -> torch.Tensor:
    """c(x) = ||x||_1 - 3 on the unit cube; a point is feasible when c(x) <= 0."""
    return X.sum(dim=-1) - 3.0


def feasible_objective(X: torch.Tensor) -> torch.Tensor:
    """The noiseless objective where the constraint holds, 0 where it does not."""
    return hartmann(X) * (constraint_value(X) <= 0).to(X)


def observe(X: torch.Tensor, noise_se: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy objective and constraint observations, each ``n x 1``."""
    obj = hartmann(X).unsqueeze(-1)
    con = constraint_value(X).unsqueeze(-1)
    return obj + noise_se * torch.randn_like(obj), con + noise_se * torch.randn_like(con)


def build_model(cls, train_x, train_obj, train_con, train_yvar, state_dict=None):
    """The tutorial's model: a ModelListGP of objective and constraint models."""
    parts = [
        cls(
            train_x,
            train_y,
            train_yvar.expand_as(train_y),
            input_transform=Normalize(d=train_x.shape[-1]),
        ).to(train_x)
        for train_y in (train_obj, train_con)
    ]
    model = ModelListGP(*parts)
    mll = SumMarginalLogLikelihood(model.likelihood, model)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return mll, model


def pick_objective(Z: torch.Tensor, X: torch.Tensor | None = None) -> torch.Tensor:
    return Z[..., 0]


def pick_constraint(Z: torch.Tensor) -> torch.Tensor:
    return Z[..., 1]


def make_acquisition(name, model, train_x, train_obj, train_con):
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([MC_SAMPLES]))
    objective = GenericMCObjective(objective=pick_objective)
    if name == "qEI":
        # best_f: the best noisy objective among observations seen as feasible, as the tutorial
        best_f = (train_obj * (train_con <= 0).to(train_obj)).max()
        return qLogExpectedImprovement(
            model=model,
            best_f=best_f,
            sampler=sampler,
            objective=objective,
            constraints=[pick_constraint],
        )
    return qLogNoisyExpectedImprovement(
        model=model,
        X_baseline=train_x,
        sampler=sampler,
        objective=objective,
        constraints=[pick_constraint],
    )


def run_loop(cls, acquisition: str, seed: int, batches: int, noise_se: float, rows, common):
    """One closed loop; appends a row per batch to ``rows``."""
    torch.manual_seed(seed)
    train_x = torch.rand(N_INITIAL, DIM, dtype=DTYPE)
    train_obj, train_con = observe(train_x, noise_se)
    train_yvar = torch.tensor(noise_se**2, dtype=DTYPE)
    best = feasible_objective(train_x).max().item()
    model_name = cls.__name__ if cls is not None else "random"
    state_dict = None
    for batch in range(1, batches + 1):
        n = len(train_x)
        start = time.perf_counter()
        if acquisition == "random":
            new_x = torch.rand(BATCH_SIZE, DIM, dtype=DTYPE)
        else:
            mll, model = build_model(cls, train_x, train_obj, train_con, train_yvar, state_dict)
            fit_gpytorch_mll(mll)
            acqf = make_acquisition(acquisition, model, train_x, train_obj, train_con)
            candidates, _ = optimize_acqf(
                acq_function=acqf,
                bounds=BOUNDS,
                q=BATCH_SIZE,
                num_restarts=NUM_RESTARTS,
                raw_samples=RAW_SAMPLES,
                options=dict(OPTIMIZER_OPTIONS),
            )
            new_x = candidates.detach()
            state_dict = model.state_dict()
        seconds = time.perf_counter() - start
        new_obj, new_con = observe(new_x, noise_se)
        train_x = torch.cat([train_x, new_x])
        train_obj = torch.cat([train_obj, new_obj])
        train_con = torch.cat([train_con, new_con])
        best = max(best, feasible_objective(new_x).max().item())
        rows.append(
            {
                "model": model_name,
                "acquisition": acquisition,
                "seed": seed,
                "batch": batch,
                "n": n,
                "best_value": best,
                "seconds": seconds,
                "noise_se": noise_se,
                "q": BATCH_SIZE,
                "error": "",
                **common,
            }
        )
        print(
            f"{model_name:>16} {acquisition:>6} seed {seed} batch {batch:>2} n {n:>3}: "
            f"best {best:.4f}, {seconds:7.2f} s",
            flush=True,
        )


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    ok = frame[frame["error"].fillna("") == ""]
    out = []
    for (machine, noise_se, model, acquisition), group in ok.groupby(
        ["machine", "noise_se", "model", "acquisition"], sort=False
    ):
        last = group["batch"].max()
        final = group[group["batch"] == last]["best_value"]
        out.append(
            {
                "model": model,
                "acquisition": acquisition,
                "noise_se": noise_se,
                "seeds": final.size,
                "batches": last,
                "best_mean": final.mean(),
                "best_sd": final.std(ddof=1) if final.size > 1 else float("nan"),
                "median_s_per_batch": group["seconds"].median(),
                "machine": machine,
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", action="append", choices=sorted(MODELS), help="repeatable; default all"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--acquisitions", nargs="+", choices=ACQUISITIONS, default=["qNEI"])
    parser.add_argument("--noise-se", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=BadInitialCandidatesWarning)
    warnings.filterwarnings("ignore", category=RuntimeWarning)

    common = {
        "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
        f"{args.threads} thread(s)",
        "botorch": __import__("botorch").__version__,
    }
    model_names = args.model or list(MODELS)
    runs = []
    for acquisition in args.acquisitions:
        if acquisition == "random":
            runs.append((None, acquisition))
        else:
            runs.extend((MODELS[name], acquisition) for name in model_names)

    rows: list[dict] = []
    failures: list[str] = []
    for cls, acquisition in runs:
        name = cls.__name__ if cls is not None else "random"
        for seed in args.seeds:
            run_recording_failure(
                partial(
                    run_loop, cls, acquisition, seed, args.batches, args.noise_se, rows, common
                ),
                f"{name} {acquisition} seed {seed}",
                {
                    "model": name,
                    "acquisition": acquisition,
                    "seed": seed,
                    "noise_se": args.noise_se,
                    "q": BATCH_SIZE,
                    **common,
                },
                "batch",
                rows,
                failures,
            )

    path = args.out / "closed_loop.csv"
    order = ["machine", "noise_se", "model", "acquisition", "seed", "batch"]
    frame = merge_rows(rows, path, KEY, order)
    print(f"\nwrote {path} ({len(frame)} rows)\n")
    summary = summarise(frame)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print_failures(failures)


if __name__ == "__main__":
    main()
