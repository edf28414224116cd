r"""A refit on the same data from the same start: ``WiskiGP`` (d >= 4) against ``SingleTaskGP``.

``bo_step_replay.py`` times each model continuing its own run, so their refits start from
different data and hyperparameters, and the number of L-BFGS-B iterations a refit takes
differs with them (the spread between seeds). This script removes that difference: for
each function and seed of the d = 6-20 table (``bo_high_dim.py``) it takes the exact GP's
data after step 200 (its finished run's checkpoint, n = 2 d + 600), builds both models on
them as the table's loop does (``make_surrogate``: ``Normalize(d)`` without bounds,
``Standardize``, learned noise, the default priors), gives ``WiskiGP`` the exact GP's
initial hyperparameters, and fits each with BoTorch's ``fit_gpytorch_mll_scipy``
(L-BFGS-B, its default options). ``WiskiGP`` there evaluates its kernel exactly, so both
maximise the same objective; what may differ is the cost of one evaluation and, through
round-off, the path.

Recorded per (function, seed, model): iterations, evaluations (closure calls), seconds (the
minimum over ``--repeats`` fits, the models alternated), milliseconds per evaluation, the
final loss, and the ratio of seconds to the exact GP's. Results:
``<out>/same_data_fit.{csv,json,md}``.

Usage: ``python benchmarks/same_data_fit.py [--functions hartmann6 levy10] [--seeds 0 1]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
from bo_high_dim import ACQUISITION, FIT_EVERY, FUNCTIONS, STEPS, Q, num_init, parse_function
from bo_step_replay import checkpoint_of
from botorch.optim.closures import get_loss_closure_with_grads
from botorch.optim.fit import fit_gpytorch_mll_scipy
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.loops import BayesOptLoop, make_surrogate, make_test_function
from streamgp.utils.machine import machine_info

HERE = Path(__file__).parent
MODELS = ("exact", "wiski")


def exact_data(spec: str, seed: int, checkpoint: Path) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The exact GP run's observations from its checkpoint (read from a copy)."""
    function, dim = parse_function(spec)
    loop = BayesOptLoop(
        make_test_function(function, dim=dim),
        model="exact",
        acquisition=ACQUISITION,
        q=Q,
        num_init=num_init(dim),
        fit_every=FIT_EVERY,
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / checkpoint.name
        shutil.copy(checkpoint, copy)
        loop.load(copy)
    return loop.surrogate.X, loop.surrogate.Y


def build(name: str, X: torch.Tensor, Y: torch.Tensor, start: dict | None):
    r"""The table's model ``name`` on ``(X, Y)``, with hyperparameters ``start`` if given."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_surrogate(name, X, Y).model
    if start is not None:
        own = model.state_dict()
        model.load_state_dict({k: v for k, v in start.items() if k in own}, strict=False)
    return model


def hyperparameters(model) -> dict[str, torch.Tensor]:
    r"""The kernel's, likelihood's and mean's entries of ``model``'s state (a fit's start)."""
    keep = ("covar_module.", "likelihood.", "mean_module.")
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(keep)}


def fit(model) -> dict:
    r"""One L-BFGS-B fit of ``model``'s marginal likelihood, as ``fit_gpytorch_mll`` makes it."""
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    named, bounds = get_parameters_and_bounds(mll)
    parameters = {n: p for n, p in named.items() if p.requires_grad}
    loss = get_loss_closure_with_grads(mll, parameters=parameters)
    evaluations = 0

    def closure(**kwargs):
        nonlocal evaluations
        evaluations += 1
        return loss(**kwargs)

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fit_gpytorch_mll_scipy(mll, parameters=parameters, bounds=bounds, closure=closure)
    seconds = time.perf_counter() - start
    mll.eval()
    return {
        "iterations": int(result.step),
        "evaluations": evaluations,
        "seconds": seconds,
        "ms_per_evaluation": 1000 * seconds / max(evaluations, 1),
        "loss": float(result.fval),
    }


def markdown(table: pd.DataFrame) -> str:
    lines = [
        "| function | seed | n | model | iterations | evaluations | s | ms/evaluation | loss "
        "| ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        lines.append(
            f"| {row.function} | {row.seed} | {row.n} | {row.model} | {row.iterations} | "
            f"{row.evaluations} | {row.seconds:.2f} | {row.ms_per_evaluation:.1f} | "
            f"{row.loss:.5f} | {row.ratio_to_exact:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", nargs="+", default=list(FUNCTIONS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", type=Path, default=HERE / "results" / "bo_high_dim")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bo_high_dim")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for spec in args.functions:
        for seed in args.seeds:
            checkpoint = checkpoint_of(args.table, spec, "exact", seed)
            if checkpoint is None:
                print(f"skip {spec} seed {seed}: the exact GP's run is not finished")
                continue
            X, Y = exact_data(spec, seed, checkpoint)
            start = hyperparameters(build("exact", X, Y, None))
            best: dict[str, dict] = {}
            for repeat in range(args.repeats):
                order = MODELS if repeat % 2 == 0 else MODELS[::-1]
                for name in order:
                    result = fit(build(name, X, Y, start))
                    print({"function": spec, "seed": seed, "model": name, **result})
                    if name not in best or result["seconds"] < best[name]["seconds"]:
                        best[name] = result
            for name in MODELS:
                rows.append({"function": spec, "seed": seed, "n": len(X), "model": name,
                             **best[name]})  # fmt: skip
    table = pd.DataFrame(rows)
    exact = table[table.model == "exact"].set_index(["function", "seed"])["seconds"]
    table["ratio_to_exact"] = [
        row.seconds / exact[(row.function, row.seed)] for row in table.itertuples()
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "same_data_fit.csv", index=False)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (args.out / "same_data_fit.json").write_text(
        json.dumps(
            {
                "settings": settings,
                "steps": STEPS,
                "machine": machine_info(),
                "rows": table.to_dict("records"),
            },
            indent=1,
        )  # fmt: skip
    )
    header = (
        "A refit on the exact GP's data after step 200, both models from the same start "
        f"(fit_gpytorch_mll_scipy; minimum over {args.repeats} fits, models alternated; "
        "ratio of seconds to the exact GP's):\n\n"
    )
    (args.out / "same_data_fit.md").write_text(header + markdown(table))
    print(markdown(table))


if __name__ == "__main__":
    main()
