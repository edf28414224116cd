r"""The ``streamgp`` command line.

Commands (``streamgp <command> --help`` lists every option):

- ``streamgp bo``: Bayesian optimisation of a noisy BoTorch test function with
  several models; writes ``bo_<function>_<acquisition>.csv`` and a PNG.
- ``streamgp active``: active learning on the malaria atlas (or a CSV file);
  writes the RMSE curves, a PNG and a map of the queried points.

Example:
    ``streamgp bo --function levy --models wiski,exact --steps 300 --out results/``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import pandas as pd

from streamgp.loops.acquisition import BOX_ACQUISITIONS, POOL_ACQUISITIONS, AcquisitionOptions
from streamgp.loops.bo import TEST_FUNCTIONS
from streamgp.loops.surrogates import SURROGATES


def _choices_list(choices: Sequence[str], what: str):
    """argparse type: a comma-separated list whose items must be in ``choices``."""

    def parse(text: str) -> list[str]:
        items = [item.strip().lower() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in choices]
        if not items or unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {unknown or text!r}; choose from {', '.join(sorted(choices))}"
            )
        return items

    return parse


def _max_steps(text: str) -> dict[str, int]:
    """argparse type: ``model=N[,model=N]``."""
    caps = {}
    for item in text.split(","):
        model, _, value = item.partition("=")
        if model not in SURROGATES or not value.isdigit():
            raise argparse.ArgumentTypeError(
                f"expected model=N with model in {sorted(SURROGATES)}, got {item!r}"
            )
        caps[model] = int(value)
    return caps


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _common(parser: argparse.ArgumentParser, default_q: int, default_init: int) -> None:
    models = _choices_list(tuple(SURROGATES), "model")
    parser.add_argument(
        "--models", type=models, default=["wiski", "exact"], help="e.g. wiski,exact"
    )
    parser.add_argument("--steps", type=_positive_int, default=100, help="steps per run")
    parser.add_argument(
        "--max-steps", type=_max_steps, default=None, help="per-model caps, e.g. exact=300"
    )
    parser.add_argument("--trials", type=_positive_int, default=1, help="seeds 0..trials-1")
    parser.add_argument("--q", type=_positive_int, default=default_q, help="batch size")
    parser.add_argument("--num-init", type=_positive_int, default=default_init)
    parser.add_argument("--fit-every", type=int, default=1, help="refit every k steps (0: never)")
    parser.add_argument("--fit-max-iter", type=_positive_int, default=None, help="L-BFGS-B iters")
    parser.add_argument("--grid-size", type=_positive_int, default=None, help="WISKI grid per dim")
    parser.add_argument("--num-restarts", type=_positive_int, default=10)
    parser.add_argument("--raw-samples", type=_positive_int, default=512)
    parser.add_argument("--batch-limit", type=_positive_int, default=5)
    parser.add_argument("--maxiter", type=_positive_int, default=200, help="acquisition L-BFGS-B")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default="results", help="output directory")
    parser.add_argument("--resume", action="store_true", help="continue from checkpoints in --out")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-plots", action="store_true")


def _acquisition_options(args: argparse.Namespace) -> AcquisitionOptions:
    return AcquisitionOptions(
        num_restarts=args.num_restarts,
        raw_samples=args.raw_samples,
        batch_limit=args.batch_limit,
        maxiter=args.maxiter,
    )


def _model_options(args: argparse.Namespace) -> dict[str, dict]:
    return {"wiski": {} if args.grid_size is None else {"grid_size": args.grid_size}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamgp", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    bo = commands.add_parser("bo", help="Bayesian optimisation of a noisy test function")
    bo.add_argument("--function", default="levy", choices=sorted(TEST_FUNCTIONS))
    bo.add_argument("--acquisition", default="qucb", choices=BOX_ACQUISITIONS)
    bo.add_argument("--dim", type=_positive_int, default=3)
    bo.add_argument("--noise-std", type=float, default=None, help="default: the paper's")
    _common(bo, default_q=3, default_init=5)

    active = commands.add_parser("active", help="active learning on the malaria atlas")
    active.add_argument(
        "--dataset", default="malaria", help="'malaria' (shipped) or 'malaria-full' (shared data)"
    )
    active.add_argument(
        "--acquisitions",
        type=_choices_list(POOL_ACQUISITIONS, "acquisition"),
        default=["qnipv", "random"],
        help="e.g. qnipv,maxvar,random",
    )
    active.add_argument(
        "--num-mc-points", type=_positive_int, default=128, help="qNIPV integration points"
    )
    active.add_argument(
        "--candidates", type=_positive_int, default=256, help="pool points scored per step"
    )
    _common(active, default_q=6, default_init=10)
    return parser


def _print_summary(results: pd.DataFrame, by: list[str], value: str) -> None:
    from streamgp.loops.experiments import summarize

    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(summarize(results, by, value).to_string(index=False, float_format="%.4g"))


def _bo(args: argparse.Namespace) -> None:
    from streamgp.loops.experiments import run_bo_experiment

    if args.acquisition == "ei" and args.q != 1:
        raise SystemExit("streamgp bo: error: --acquisition ei (analytic) needs --q 1")
    results = run_bo_experiment(
        args.function,
        models=args.models,
        acquisition=args.acquisition,
        steps=args.steps,
        max_steps=args.max_steps,
        trials=args.trials,
        dim=args.dim,
        noise_std=args.noise_std,
        q=args.q,
        num_init=args.num_init,
        fit_every=args.fit_every,
        fit_max_iter=args.fit_max_iter,
        acquisition_options=_acquisition_options(args),
        model_options=_model_options(args),
        device=args.device,
        out=args.out,
        resume=args.resume,
        progress=not args.no_progress,
        plots=not args.no_plots,
    )
    _print_summary(results, ["model"], "best_value")
    print(f"results written to {args.out}/")


def _active(args: argparse.Namespace) -> None:
    from streamgp.loops.experiments import (
        malaria_kernel,
        malaria_pool_and_test,
        run_active_experiment,
    )

    if args.dataset not in ("malaria", "malaria-full"):
        raise SystemExit(
            f"streamgp active: error: unknown dataset {args.dataset!r}; "
            "choose from malaria, malaria-full"
        )
    pool_X, pool_Y, pool_Yvar, test_X, test_Y = malaria_pool_and_test(
        full=args.dataset == "malaria-full"
    )
    options = _model_options(args)
    options["wiski"].setdefault("grid_size", 30)
    results = run_active_experiment(
        pool_X,
        pool_Y,
        test_X,
        test_Y,
        pool_Yvar,
        name=f"active_{args.dataset}",
        models=args.models,
        acquisitions=args.acquisitions,
        steps=args.steps,
        max_steps=args.max_steps,
        trials=args.trials,
        q=args.q,
        num_init=args.num_init,
        num_mc_points=args.num_mc_points,
        candidates_per_step=args.candidates,
        fit_every=args.fit_every,
        fit_max_iter=args.fit_max_iter,
        kernel_factory=malaria_kernel,
        acquisition_options=_acquisition_options(args),
        model_options=options,
        device=args.device,
        out=args.out,
        resume=args.resume,
        progress=not args.no_progress,
        plots=not args.no_plots,
    )
    _print_summary(results, ["model", "acquisition"], "test_rmse")
    print(f"results written to {args.out}/")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    {"bo": _bo, "active": _active}[args.command](args)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
