r"""Online regression benchmark: the WISKI paper's Figure 3 protocol on four UCI datasets.

Stanton et al., "Kernel Interpolation for Scalable Online Gaussian Processes"
(AISTATS 2021), section 5.1 / appendix C.1, as implemented by
:class:`streamgp.loops.stream.StreamingLoop`: 90/10 split, inputs scaled to
``[-1, 1]``, targets standardized, pretraining on 5% of the training set, then one
observation and one Adam step at a time. Learning rates follow the paper's Table C.1
(skillcraft, powerplant: 5e-2 pretraining / 5e-3 online; elevators, protein: 1e-2 /
1e-3; projection parameters at a tenth of those). WISKI learns a projection to 2-D
for these ``d > 3`` datasets (grid 16 x 16 = 256 points; ``m = 256`` inducing points
for O-SVGP/O-SGPR, ``n_max = 256`` for local GPs).

Per-dataset settings come from :data:`streamgp.loops.stream.DATASET_STREAM_SETTINGS`
(``StreamConfig.for_dataset``): those learning rates, and 1,000 pretraining steps
for elevators instead of 200 (``--pretrain-steps`` overrides them for all datasets).

Metrics are in standardized target units (the paper's convention). The exact GP's
``O(n^3)`` steps are capped at ``--exact-max`` observations; its final metrics are
then those at the cap, not at the end of the stream.

Writes ``<out>/online_regression.csv`` (curves of all runs), ``online_regression.json``
(the settings, the machine, and per dataset and model the final test NLL/RMSE, mean
and std over trials, and the mean time per step) and one PNG per dataset.

Usage:
    ``python benchmarks/online_regression.py`` (the full protocol: 3 trials, whole
    streams; hours on a CPU) or a reduced run, e.g.
    ``python benchmarks/online_regression.py --max-stream 500 --trials 1``;
    ``--first-trial 1 --trials 2`` adds trials 1 and 2 to an earlier run of trial 0.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from streamgp.datasets import load_streaming_split
from streamgp.loops.stream import (
    DATASET_STREAM_SETTINGS,
    STREAM_MODELS,
    StreamConfig,
    run_stream_experiment,
    summarize_stream,
)
from streamgp.utils.machine import machine_info

DATASETS = ("skillcraft", "powerplant", "elevators", "protein")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--models", default=",".join(STREAM_MODELS))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--first-trial", type=int, default=0, help="seed of the first trial")
    parser.add_argument("--max-stream", type=int, default=None, help="reduced runs only")
    parser.add_argument("--exact-max", type=int, default=5000)
    parser.add_argument(
        "--pretrain-steps", type=int, default=None, help="default: the dataset's setting"
    )
    parser.add_argument("--num-evals", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--data-dir", default=None, help="default: $STREAMGP_DATA")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument(
        "--resume", action="store_true", help="reuse finished or partial runs' checkpoints"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    datasets = [name.strip() for name in args.datasets.split(",") if name.strip()]
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in datasets if name not in DATASET_STREAM_SETTINGS]
    if unknown:
        raise SystemExit(
            f"unknown datasets {unknown}; choose from {', '.join(DATASET_STREAM_SETTINGS)}"
        )
    args.out.mkdir(parents=True, exist_ok=True)

    frames, summaries, settings = [], [], {}
    for name in datasets:
        overrides = {} if args.pretrain_steps is None else {"pretrain_steps": args.pretrain_steps}
        config = StreamConfig.for_dataset(name, exact_max=args.exact_max, **overrides)
        settings[name] = asdict(config)
        start = time.perf_counter()
        results = run_stream_experiment(
            lambda seed, name=name: load_streaming_split(name, seed, args.data_dir),
            name=name,
            models=models,
            trials=args.trials,
            first_trial=args.first_trial,
            num_evals=args.num_evals,
            max_stream=args.max_stream,
            config=config,
            out=args.out / "online_regression_runs",
            resume=args.resume,
            progress=args.progress,
            plots=True,
            device=args.device,
        )
        frames.append(results)
        summary = summarize_stream(results).assign(dataset=name)
        summaries.append(summary)
        print(f"{name}: {time.perf_counter() - start:.0f} s")
        print(summary.to_string(index=False, float_format="%.4g"), flush=True)
        _write(args, frames, summaries, settings, models, datasets)


def _write(args, frames, summaries, settings, models, datasets) -> None:
    pd.concat(frames, ignore_index=True).to_csv(args.out / "online_regression.csv", index=False)
    summary = pd.concat(summaries, ignore_index=True)
    payload = {
        "protocol": "WISKI paper section 5.1 (streamgp.loops.stream.StreamingLoop)",
        "units": "test RMSE and NLL in standardized target units",
        "reduced": args.max_stream is not None or args.trials < 3,
        "settings": {
            "datasets": datasets,
            "models": models,
            "trials": args.trials,
            "first_trial": args.first_trial,
            "max_stream": args.max_stream,
            "exact_max": args.exact_max,
            "num_evals": args.num_evals,
            "per_dataset": settings,
        },
        "machine": machine_info(args.device),
        "results": summary.to_dict(orient="records"),
    }
    (args.out / "online_regression.json").write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
