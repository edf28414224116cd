r"""Online classification benchmark: the WISKI paper's Figure 4 protocol (banana, svmguide1).

Stanton et al., "Kernel Interpolation for Scalable Online Gaussian Processes"
(AISTATS 2021), section 5.2 / appendix A.5, as implemented by
:class:`streamgp.loops.stream.StreamingLoop`: the sources' train/test splits, inputs
scaled to ``[-1, 1]``, pretraining on 5% of the training set (200 Adam steps at 5e-2),
then one observation and one Adam step (5e-3) at a time. WISKI and the exact GP are
Dirichlet GP classifiers (Milios et al. 2018, ``alpha_epsilon = 0.01``, one GP per
class, class probabilities by Monte Carlo over softmax); O-SVGP uses a Bernoulli
(probit) likelihood with ``m = 256`` inducing points. svmguide1 has 4 features: WISKI
learns a projection to 2-D (the paper used a 4-D grid instead).

Writes ``<out>/online_classification.{csv,json}`` (curves; settings, machine, final
test accuracy and NLL per dataset and model) and one PNG per dataset.

Usage: ``python benchmarks/online_classification.py [--trials 3] [--max-stream N]``
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
    CLASSIFICATION_MODELS,
    StreamConfig,
    run_stream_experiment,
    summarize_stream,
)
from streamgp.utils.machine import machine_info

DATASETS = ("banana", "svmguide1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--models", default=",".join(CLASSIFICATION_MODELS))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--first-trial", type=int, default=0, help="seed of the first trial")
    parser.add_argument("--max-stream", type=int, default=None, help="reduced runs only")
    parser.add_argument("--exact-max", type=int, default=5000)
    parser.add_argument("--num-evals", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--data-dir", default=None, help="default: $STREAMGP_DATA")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    datasets = [name.strip() for name in args.datasets.split(",") if name.strip()]
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    config = StreamConfig(exact_max=args.exact_max)
    args.out.mkdir(parents=True, exist_ok=True)
    frames, summaries = [], []
    for name in datasets:
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
            out=args.out / "online_classification_runs",
            progress=False,
        )
        frames.append(results)
        summaries.append(summarize_stream(results).assign(dataset=name))
        print(f"{name}: {time.perf_counter() - start:.0f} s")
        print(summaries[-1].to_string(index=False, float_format="%.4g"), flush=True)
        pd.concat(frames).to_csv(args.out / "online_classification.csv", index=False)
        payload = {
            "protocol": "WISKI paper section 5.2 (streamgp.loops.stream.StreamingLoop)",
            "units": "test accuracy; NLL = mean -log p(true class)",
            "reduced": args.max_stream is not None or args.trials < 3,
            "settings": {
                "datasets": datasets,
                "models": models,
                "trials": args.trials,
                "first_trial": args.first_trial,
                "max_stream": args.max_stream,
                "num_evals": args.num_evals,
                "config": asdict(config),
            },
            "machine": machine_info(),
            "results": pd.concat(summaries).to_dict(orient="records"),
        }
        (args.out / "online_classification.json").write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
