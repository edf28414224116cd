"""BoTorch's TuRBO-1 tutorial on Ackley-20, with the GP class as an argument.

Follows BoTorch's tutorial "BO with TuRBO-1 and TS/qEI"
(https://botorch.org/docs/tutorials/turbo_1; Eriksson et al., "Scalable Global
Optimization via Local Bayesian Optimization", NeurIPS 2019), re-implemented here with
the model class swappable, so ``SingleTaskGP`` can be replaced by streamgp's ``WiskiGP``
the way a user would edit the tutorial. Nothing else changes:

- Problem: maximise the negated 20-D Ackley function on [-5, 10]^20; the loop works on
  the unit cube (inputs are unnormalised to evaluate the function). Noiseless.
- Start: 2 d = 40 scrambled Sobol points (the same ones for every model at a seed).
- Every iteration: ``train_Y`` standardised by hand, then
  ``cls(X, train_Y, covar_module=ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=20,
  lengthscale_constraint=Interval(0.005, 4.0))), likelihood=GaussianLikelihood(
  noise_constraint=Interval(1e-8, 1e-3)))`` built afresh and fitted by
  ``fit_gpytorch_mll`` inside ``gpytorch.settings.max_cholesky_size(inf)``; then a batch of
  q = 4 points in the trust region: Thompson sampling (``--acqf ts``, the tutorial's
  default) over min(5000, max(2000, 200 d)) = 4000 candidates that perturb the
  incumbent in a random subset of about 20 coordinates
  (``MaxPosteriorSampling(replacement=False)``: a joint posterior sample at all 4000), or
  qLogEI (``--acqf ei``; ``optimize_acqf`` with 10 restarts and 512 raw samples) over the
  trust region's box.
- The trust region: a box around the best point, side ``length`` scaled per dimension by
  the fitted lengthscales (normalised to geometric mean 1); ``length`` starts at 0.8,
  doubles (up to 1.6) after 10 consecutive improving batches and halves after
  ceil(max(4 / q, d / q)) = 5 consecutive failures; the run ends when it falls below
  0.5^7 (TuRBO's restart) or after ``--max-evals`` evaluations.

Measured for every (model, acquisition, seed, iteration): the best value so far, the
trust region's length, n (the observations the model was built on) and the wall-clock
seconds of the iteration (model build + fit + batch generation; evaluating the function is
not timed). Rows are merged into ``<out>/turbo.csv`` (a rerun of the same model,
acquisition, seed, iteration and machine replaces its rows), then summarised in
``<out>/turbo.md``: per model, the best value at the end (mean ± sd over seeds), the
evaluations made, and the median seconds per iteration overall and for n >= 200.

Usage (one torch thread; on a shared machine run it niced)::

    python benchmarks/turbo.py --model SingleTaskGP --model WiskiGP --seeds 0 1 2
    python benchmarks/turbo.py --model WiskiGP --seeds 0 --max-evals 80   # a quick look
"""

from __future__ import annotations

import argparse
import math
import platform
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gpytorch
import pandas as pd
import torch
from _rows import merge_rows, print_failures, run_recording_failure
from botorch.acquisition import qLogExpectedImprovement
from botorch.exceptions import BadInitialCandidatesWarning
from botorch.fit import fit_gpytorch_mll
from botorch.generation import MaxPosteriorSampling
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.test_functions import Ackley
from botorch.utils.transforms import unnormalize
from gpytorch.constraints import Interval
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch.quasirandom import SobolEngine

from streamgp import WiskiGP

DTYPE = torch.double
DIM = 20
BATCH_SIZE = 4
N_INITIAL = 2 * DIM
N_CANDIDATES = min(5000, max(2000, 200 * DIM))
NUM_RESTARTS = 10
RAW_SAMPLES = 512
MODELS = {cls.__name__: cls for cls in (SingleTaskGP, WiskiGP)}
KEY = ["model", "acquisition", "seed", "iteration", "machine"]

ackley = Ackley(dim=DIM, negate=True, bounds=[(-5.0, 10.0)] * DIM).to(DTYPE)


def evaluate(X: torch.Tensor) -> torch.Tensor:
    """Ackley at unit-cube points ``X`` (``n x 1``)."""
    return ackley(unnormalize(X, ackley.bounds)).unsqueeze(-1)


@dataclass
class TrustRegion:
    """TuRBO-1's trust-region state (the tutorial's ``TurboState``)."""

    length: float = 0.8
    length_min: float = 0.5**7
    length_max: float = 1.6
    failure_tolerance: int = math.ceil(max(4.0 / BATCH_SIZE, DIM / BATCH_SIZE))
    success_tolerance: int = 10
    failures: int = 0
    successes: int = 0
    best_value: float = -math.inf

    @property
    def restart(self) -> bool:
        return self.length < self.length_min

    def update(self, Y_next: torch.Tensor) -> None:
        best_next = Y_next.max().item()
        if best_next > self.best_value + 1e-3 * math.fabs(self.best_value):
            self.successes, self.failures = self.successes + 1, 0
        else:
            self.successes, self.failures = 0, self.failures + 1
        if self.successes == self.success_tolerance:
            self.length, self.successes = min(2.0 * self.length, self.length_max), 0
        elif self.failures == self.failure_tolerance:
            self.length, self.failures = self.length / 2.0, 0
        self.best_value = max(self.best_value, best_next)


def build_model(cls, X: torch.Tensor, train_Y: torch.Tensor):
    """The tutorial's model, with ``cls`` in place of ``SingleTaskGP``."""
    likelihood = GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))
    covar_module = ScaleKernel(
        MaternKernel(nu=2.5, ard_num_dims=DIM, lengthscale_constraint=Interval(0.005, 4.0))
    )
    return cls(X, train_Y, covar_module=covar_module, likelihood=likelihood)


def next_batch(state: TrustRegion, model, X, train_Y, acqf: str) -> torch.Tensor:
    """q points in the trust region around the best observation."""
    center = X[train_Y.argmax(), :].clone()
    weights = model.covar_module.base_kernel.lengthscale.squeeze().detach()
    weights = weights / weights.mean()
    weights = weights / torch.prod(weights.pow(1.0 / len(weights)))
    lower = torch.clamp(center - weights * state.length / 2.0, 0.0, 1.0)
    upper = torch.clamp(center + weights * state.length / 2.0, 0.0, 1.0)
    if acqf == "ts":
        sobol = SobolEngine(DIM, scramble=True)
        perturbed = lower + (upper - lower) * sobol.draw(N_CANDIDATES).to(X)
        # Perturb about 20 coordinates of the incumbent per candidate, at least one.
        mask = torch.rand(N_CANDIDATES, DIM, dtype=DTYPE) <= min(20.0 / DIM, 1.0)
        none = torch.where(mask.sum(dim=1) == 0)[0]
        mask[none, torch.randint(0, DIM - 1, size=(len(none),))] = True
        candidates = center.expand(N_CANDIDATES, DIM).clone()
        candidates[mask] = perturbed[mask]
        with torch.no_grad():
            return MaxPosteriorSampling(model=model, replacement=False)(
                candidates, num_samples=BATCH_SIZE
            )
    acquisition = qLogExpectedImprovement(model, train_Y.max())
    batch, _ = optimize_acqf(
        acquisition,
        bounds=torch.stack([lower, upper]),
        q=BATCH_SIZE,
        num_restarts=NUM_RESTARTS,
        raw_samples=RAW_SAMPLES,
    )
    return batch.detach()


def run_loop(cls, acqf: str, seed: int, max_evals: int, rows: list, common: dict) -> None:
    """One TuRBO-1 run; appends a row per iteration to ``rows``."""
    torch.manual_seed(seed)
    X = SobolEngine(DIM, scramble=True, seed=seed).draw(N_INITIAL).to(DTYPE)
    Y = evaluate(X)
    state = TrustRegion()
    state.best_value = Y.max().item()
    iteration = 0
    while not state.restart and len(X) < max_evals:
        iteration += 1
        n = len(X)
        start = time.perf_counter()
        train_Y = (Y - Y.mean()) / Y.std()
        model = build_model(cls, X, train_Y)
        with gpytorch.settings.max_cholesky_size(float("inf")):
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
            X_next = next_batch(state, model, X, train_Y, acqf)
        seconds = time.perf_counter() - start
        Y_next = evaluate(X_next)
        state.update(Y_next)
        X, Y = torch.cat([X, X_next]), torch.cat([Y, Y_next])
        rows.append(
            {
                "model": cls.__name__,
                "acquisition": acqf,
                "seed": seed,
                "iteration": iteration,
                "n": n,
                "best_value": state.best_value,
                "length": state.length,
                "seconds": seconds,
                "error": "",
                **common,
            }
        )
        print(
            f"{cls.__name__:>12} {acqf} seed {seed} it {iteration:>3} n {n:>4}: best "
            f"{state.best_value:8.4f}, length {state.length:.3g}, {seconds:6.2f} s",
            flush=True,
        )


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    ok = frame[frame["error"].fillna("") == ""]
    out = []
    for (machine, acqf, model), group in ok.groupby(
        ["machine", "acquisition", "model"], sort=False
    ):
        last = group.sort_values("iteration").groupby("seed").tail(1)
        final = last["best_value"]
        late = group[group["n"] >= 200]["seconds"]
        out.append(
            {
                "model": model,
                "acquisition": acqf,
                "seeds": final.size,
                "evaluations": " / ".join(str(int(v)) for v in last["n"] + BATCH_SIZE),
                "best_mean": final.mean(),
                "best_sd": final.std(ddof=1) if final.size > 1 else float("nan"),
                "median_s_per_iteration": group["seconds"].median(),
                "median_s_n_ge_200": late.median() if late.size else float("nan"),
                "machine": machine,
            }
        )
    return pd.DataFrame(out)


def write_markdown(summary: pd.DataFrame, path: Path) -> None:
    lines = [
        "BoTorch's TuRBO-1 tutorial (Ackley-20, Matern-5/2 kernel, q = 4), the model class "
        "swapped (`benchmarks/turbo.py`). Best value at the end (the optimum is 0), mean "
        "± sd over seeds; evaluations per seed; median seconds per iteration (model "
        "build + fit + batch), overall and from n = 200 on.",
        "",
        "| model | acquisition | seeds | evaluations | best value | s/iteration | "
        "s/iteration, n >= 200 | machine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summary.itertuples():
        lines.append(
            f"| {row.model} | {row.acquisition} | {row.seeds} | {row.evaluations} | "
            f"{row.best_mean:.3f} ± {row.best_sd:.3f} | {row.median_s_per_iteration:.2f} | "
            f"{row.median_s_n_ge_200:.2f} | {row.machine} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", action="append", choices=sorted(MODELS), help="repeatable; default all"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--acqf", choices=("ts", "ei"), default="ts")
    parser.add_argument(
        "--max-evals", type=int, default=400, help="stop here if TuRBO has not restarted"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "turbo")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=BadInitialCandidatesWarning)
    warnings.filterwarnings("ignore", category=RuntimeWarning)

    common = {
        "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
        f"{args.threads} thread(s)",
        "botorch": __import__("botorch").__version__,
    }
    rows: list[dict] = []
    failures: list[str] = []
    for seed in args.seeds:
        for name in args.model or list(MODELS):  # models alternate within a seed
            run_recording_failure(
                partial(run_loop, MODELS[name], args.acqf, seed, args.max_evals, rows, common),
                f"{name} seed {seed}",
                {"model": name, "acquisition": args.acqf, "seed": seed, **common},
                "iteration",
                rows,
                failures,
            )

    path = args.out / "turbo.csv"
    frame = merge_rows(rows, path, KEY, ["machine", "acquisition", "model", "seed", "iteration"])
    summary = summarise(frame)
    write_markdown(summary, args.out / "turbo.md")
    print(f"\nwrote {path} ({len(frame)} rows) and turbo.md\n")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print_failures(failures)


if __name__ == "__main__":
    main()
