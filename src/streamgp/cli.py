r"""The ``streamgp`` command line.

Commands (``streamgp <command> --help`` lists every option):

- ``streamgp bo``: Bayesian optimisation of a noisy BoTorch test function with
  several models; writes ``bo_<function>_<acquisition>.csv`` and a PNG.
- ``streamgp active``: active learning on the malaria atlas (or a CSV file);
  writes the RMSE curves, a PNG and a map of the queried points.
- ``streamgp stream``: the WISKI paper's online regression / classification
  protocol on a benchmark dataset; writes ``stream_<dataset>.csv`` (the curves),
  ``stream_<dataset>_summary.csv`` and a PNG like the paper's Figures 3 / 4.

Each (model, trial) run is one task. By default they run one after the other in this
process; ``--workers N`` runs them on a Dask ``LocalCluster`` of ``N`` single-threaded
worker processes, ``--scheduler ADDRESS`` on a running Dask scheduler (both need
``pip install 'streamgp[cluster]'``) and ``--processes N`` in ``N`` local processes. The
outputs are the same either way; a run whose worker dies is resumed from its checkpoint.

Example:
    ``streamgp bo --function levy --models wiski,exact --steps 300 --out results/``
    ``streamgp bo --function levy --trials 8 --workers 4 --out results/``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import pandas as pd

from streamgp.loops.acquisition import BOX_ACQUISITIONS, POOL_ACQUISITIONS, AcquisitionOptions
from streamgp.loops.bo import TEST_FUNCTIONS
from streamgp.models.registry import (
    AUTO_DATA_SPACE_MAX_OBSERVATIONS,
    choose_model,
    get_model_spec,
    registered_models,
)


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
        if model not in registered_models(loop="bo") or not value.isdigit():
            raise argparse.ArgumentTypeError(
                f"expected model=N with model in {sorted(registered_models(loop='bo'))}, "
                f"got {item!r}"
            )
        caps[model] = int(value)
    return caps


def _int_at_least(text: str, minimum: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a {kind} integer, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "positive")


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "non-negative")


def _first_trial(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--first-trial",
        type=_non_negative_int,
        default=0,
        help="seed of the first trial (add trials to an earlier run)",
    )


def _common(parser: argparse.ArgumentParser, default_q: int, default_init: int) -> None:
    models = _choices_list((*registered_models(loop="bo"), "auto"), "model")
    parser.add_argument(
        "--models",
        type=models,
        default=["wiski", "exact"],
        help="e.g. wiski,exact; auto: the streaming model for the dimension and the run's "
        "length (wiski up to 3-D; above, wiski in data space for runs of at most "
        f"{AUTO_DATA_SPACE_MAX_OBSERVATIONS} observations, else wiski-additive)",
    )
    parser.add_argument("--steps", type=_positive_int, default=100, help="steps per run")
    parser.add_argument(
        "--max-steps", type=_max_steps, default=None, help="per-model caps, e.g. exact=300"
    )
    parser.add_argument("--trials", type=_positive_int, default=1, help="number of seeds")
    parser.add_argument("--q", type=_positive_int, default=default_q, help="batch size")
    parser.add_argument("--num-init", type=_positive_int, default=default_init)
    parser.add_argument("--fit-every", type=int, default=1, help="refit every k steps (0: never)")
    parser.add_argument("--fit-max-iter", type=_positive_int, default=None, help="L-BFGS-B iters")
    parser.add_argument(
        "--grid-size", type=_positive_int, default=None, help="WISKI/KISS-GP grid per dim"
    )
    parser.add_argument(
        "--num-inducing",
        type=_positive_int,
        default=None,
        help="O-SVGP inducing points / SoftKI interpolation points",
    )
    parser.add_argument("--num-restarts", type=_positive_int, default=10)
    parser.add_argument("--raw-samples", type=_positive_int, default=512)
    parser.add_argument("--batch-limit", type=_positive_int, default=5)
    parser.add_argument("--maxiter", type=_positive_int, default=200, help="acquisition L-BFGS-B")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default="results", help="output directory")
    parser.add_argument("--resume", action="store_true", help="continue from checkpoints in --out")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-plots", action="store_true")
    _parallel(parser)


def _parallel(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "parallel runs", "one task per (model, trial); the outputs do not depend on these"
    )
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="start a Dask LocalCluster of N single-threaded worker processes "
        "(needs streamgp[cluster])",
    )
    where.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run on the Dask scheduler at ADDRESS, e.g. tcp://10.0.0.1:8786 "
        "(needs streamgp[cluster])",
    )
    where.add_argument(
        "--processes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="run in N local processes (no Dask)",
    )
    group.add_argument(
        "--torch-threads",
        type=_positive_int,
        default=None,
        metavar="N",
        help="torch threads per task (default: 1 with --workers/--scheduler/--processes, "
        "torch's own otherwise)",
    )


@contextmanager
def _executor(args: argparse.Namespace):
    """The executor that ``--workers/--scheduler/--processes/--torch-threads`` ask for."""
    from streamgp.loops.executors import DaskExecutor, make_executor

    try:
        executor = make_executor(
            workers=args.workers,
            scheduler=args.scheduler,
            processes=args.processes,
            torch_threads=args.torch_threads,
        )
    except (ImportError, OSError) as error:
        raise SystemExit(f"streamgp {args.command}: error: {error}") from None
    with executor:
        if isinstance(executor, DaskExecutor) and not args.no_progress:
            link = executor.dashboard_link
            print(f"Dask: {executor.client}" + (f", dashboard {link}" if link else ""))
        yield executor


def _acquisition_options(args: argparse.Namespace) -> AcquisitionOptions:
    return AcquisitionOptions(
        num_restarts=args.num_restarts,
        raw_samples=args.raw_samples,
        batch_limit=args.batch_limit,
        maxiter=args.maxiter,
        # Only `streamgp active` scores a pool.
        pool_batch_size=getattr(args, "pool_batch_size", AcquisitionOptions.pool_batch_size),
    )


def _final_observations(args: argparse.Namespace) -> int:
    """The observations a run of ``args`` ends with: the initial design, then ``q`` per step
    (the longest run, where ``--max-steps`` caps some models)."""
    return args.num_init + args.steps * args.q


def _resolve_models(models: list[str], dim: int, num_observations: int) -> list[str]:
    """``--models`` with ``auto`` replaced by the rule's model for ``dim`` inputs and a run
    that reaches ``num_observations``."""
    if "auto" not in models:
        return list(dict.fromkeys(models))
    auto = choose_model(dim, num_observations)
    print(f"--models auto: {auto} ({dim}-D inputs, at most {num_observations} observations)")
    resolved = [auto if model == "auto" else model for model in models]
    return list(dict.fromkeys(resolved))  # auto may repeat a model also named


def _model_options(args: argparse.Namespace, **defaults: Any) -> dict[str, dict]:
    """Per-model options from the flags: each registered model gets those it takes.

    ``defaults`` (e.g. ``grid_size=30``) apply where the flag is not given.
    """
    flags = {"grid_size": args.grid_size, "num_inducing": args.num_inducing}
    given = {**defaults, **{k: v for k, v in flags.items() if v is not None}}
    return {
        name: {k: v for k, v in given.items() if k in get_model_spec(name).options}
        for name in registered_models(loop="bo")
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamgp", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    bo = commands.add_parser("bo", help="Bayesian optimisation of a noisy test function")
    bo.add_argument("--function", default="levy", choices=sorted(TEST_FUNCTIONS))
    bo.add_argument("--acquisition", default="qucb", choices=BOX_ACQUISITIONS)
    bo.add_argument("--dim", type=_positive_int, default=3)
    bo.add_argument("--noise-std", type=float, default=None, help="default: the paper's")
    _common(bo, default_q=3, default_init=5)
    _first_trial(bo)

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
    active.add_argument(
        "--pool-batch-size",
        type=_positive_int,
        default=AcquisitionOptions.pool_batch_size,
        help="pool points scored jointly (lower it for exact GPs: their fantasies take "
        "O(batch n^2) memory)",
    )
    _common(active, default_q=6, default_init=10)

    stream_models = registered_models(loop="stream")
    stream = commands.add_parser(
        "stream", help="online regression / classification protocol (WISKI paper section 5)"
    )
    stream.add_argument("--dataset", default="powerplant", help="a registered dataset name")
    stream.add_argument("--data-dir", default=None, help="default: $STREAMGP_DATA or the cache")
    stream.add_argument(
        "--models",
        type=_choices_list(stream_models, "model"),
        default=["wiski", "exact"],
        help=f"comma-separated, from {','.join(stream_models)}",
    )
    stream.add_argument("--trials", type=_positive_int, default=1, help="number of trials")
    _first_trial(stream)
    stream.add_argument("--batch-size", type=_positive_int, default=1, help="points per step")
    stream.add_argument("--max-stream", type=_positive_int, default=None, help="cap the stream")
    stream.add_argument(
        "--exact-max", type=_positive_int, default=5000, help="cap on the exact GP's n (O(n^3))"
    )
    stream.add_argument("--num-evals", type=_positive_int, default=50, help="test evaluations")
    preset = "default: the dataset's (streamgp.loops.stream.DATASET_STREAM_SETTINGS)"
    stream.add_argument(
        "--pretrain-steps", type=int, default=None, help=f"Adam steps on the 5%%; {preset}"
    )
    stream.add_argument("--pretrain-lr", type=float, default=None, help=preset)
    stream.add_argument("--lr", type=float, default=None, help=f"online Adam lr; {preset}")
    stream.add_argument("--grid-size", type=_positive_int, default=16, help="WISKI grid per dim")
    stream.add_argument("--num-inducing", type=_positive_int, default=256)
    stream.add_argument("--projection", default="auto", choices=["auto", "on", "off"])
    stream.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    stream.add_argument("--out", default="results", help="output directory")
    stream.add_argument("--resume", action="store_true", help="continue from checkpoints in --out")
    stream.add_argument("--no-progress", action="store_true")
    stream.add_argument("--no-plots", action="store_true")
    _parallel(stream)
    return parser


def _print_summary(results: pd.DataFrame, by: list[str], value: str) -> None:
    from streamgp.loops.experiments import summarize

    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(summarize(results, by, value).to_string(index=False, float_format="%.4g"))


def _bo(args: argparse.Namespace) -> None:
    from streamgp.loops.experiments import run_bo_experiment

    if args.acquisition == "ei" and args.q != 1:
        raise SystemExit("streamgp bo: error: --acquisition ei (analytic) needs --q 1")
    with _executor(args) as executor:
        results = run_bo_experiment(
            args.function,
            models=_resolve_models(args.models, args.dim, _final_observations(args)),
            acquisition=args.acquisition,
            steps=args.steps,
            max_steps=args.max_steps,
            trials=args.trials,
            first_trial=args.first_trial,
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
            executor=executor,
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
    options = _model_options(args, grid_size=30)
    with _executor(args) as executor:
        results = run_active_experiment(
            pool_X,
            pool_Y,
            test_X,
            test_Y,
            pool_Yvar,
            name=f"active_{args.dataset}",
            models=_resolve_models(args.models, pool_X.shape[-1], _final_observations(args)),
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
            executor=executor,
            malaria_map=True,
        )
    _print_summary(results, ["model", "acquisition"], "test_rmse")
    print(f"results written to {args.out}/")


def _stream(args: argparse.Namespace) -> None:
    from pathlib import Path

    from streamgp import datasets
    from streamgp.loops.stream import (
        StreamConfig,
        StreamSplits,
        run_stream_experiment,
        summarize_stream,
    )

    prefix = "streamgp stream: error:"
    try:
        spec = datasets.get_dataset_spec(args.dataset)
        given = {
            name: getattr(args, name)
            for name in ("pretrain_steps", "pretrain_lr", "lr")
            if getattr(args, name) is not None
        }
        config = StreamConfig.for_dataset(
            spec.name,
            **given,
            grid_size=args.grid_size,
            num_inducing=args.num_inducing,
            projection=args.projection,
            exact_max=args.exact_max,
        )
        datasets.load_dataset(spec.name, args.data_dir)  # fail early on a missing file
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"{prefix} {error}") from None
    if spec.task == "classification":
        classifiers = registered_models("classification", loop="stream")
        unsupported = [m for m in args.models if m not in classifiers]
        if unsupported:
            raise SystemExit(
                f"{prefix} {spec.name} is a classification dataset; models {unsupported} "
                f"have no classification variant (choose from {', '.join(classifiers)})"
            )
    with _executor(args) as executor:
        results = run_stream_experiment(
            StreamSplits(spec.name, args.data_dir),
            name=spec.name,
            models=args.models,
            trials=args.trials,
            first_trial=args.first_trial,
            batch_size=args.batch_size,
            num_evals=args.num_evals,
            max_stream=args.max_stream,
            config=config,
            out=args.out,
            resume=args.resume,
            progress=not args.no_progress,
            plots=not args.no_plots,
            device=args.device,
            executor=executor,
        )
    summary = summarize_stream(results)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    summary.to_csv(Path(args.out) / f"stream_{spec.name}_summary.csv", index=False)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(summary.to_string(index=False, float_format="%.4g"))
    print(f"results written to {args.out}/")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    {"bo": _bo, "active": _active, "stream": _stream}[args.command](args)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
