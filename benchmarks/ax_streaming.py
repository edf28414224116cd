r"""Time per Ax trial: a streamgp model rebuilt every generation vs kept by StreamingSurrogate.

Ax's Client on 2-D Branin, 5 Sobol trials then qLogNEI (Ax's defaults), ``--trials`` in
all, one trial per ``get_next_trials``: ``plain`` is ``ModelConfig(botorch_model_class=
WiskiGP)`` (Ax rebuilds and refits the model from all trials at every generation);
``streaming`` is :func:`streamgp.ax.streaming_generation_strategy` (the model absorbs
each new trial with ``observe`` and is refitted every ``--refit-every`` trials), and
``streaming_logei`` the same with ``qLogExpectedImprovement`` (no baseline of all
previous trials, so the acquisition's cost does not grow with n either). The
seconds of each ``get_next_trials`` call are recorded (they include Ax's own overhead
and the acquisition optimisation). One torch thread.
Results: ``benchmarks/results/ax_streaming.{json,csv}``.

Usage: ``python benchmarks/ax_streaming.py [--trials 60] [--refit-every 10]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

import pandas as pd
import torch
from ax.adapter.registry import Generators
from ax.api import Client, RangeParameterConfig
from ax.generation_strategy.generation_strategy import GenerationNode, GenerationStrategy
from ax.generation_strategy.generator_spec import GeneratorSpec
from ax.generation_strategy.transition_criterion import MinTrials
from ax.generators.torch.botorch_modular.surrogate import SurrogateSpec
from ax.generators.torch.botorch_modular.utils import ModelConfig
from botorch.acquisition.logei import qLogExpectedImprovement

from streamgp import WiskiGP
from streamgp.ax import streaming_generation_strategy
from streamgp.utils.machine import machine_info

NUM_INITIAL = 5


def branin(x1: float, x2: float) -> float:
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def plain_strategy(model_class: type = WiskiGP, seed: int = 0) -> GenerationStrategy:
    r"""Sobol trials, then Ax's modular BoTorch generator with ``model_class`` (rebuilt and
    refitted from all trials at every generation): ``ModelConfig`` alone, as a user writes it."""
    sobol = GenerationNode(
        name="Sobol",
        generator_specs=[
            GeneratorSpec(generator_enum=Generators.SOBOL, generator_kwargs={"seed": seed})
        ],
        transition_criteria=[
            MinTrials(threshold=NUM_INITIAL, transition_to="MBM", use_all_trials_in_exp=True)
        ],
    )
    spec = SurrogateSpec(model_configs=[ModelConfig(botorch_model_class=model_class)])
    model_based = GenerationNode(
        name="MBM",
        generator_specs=[
            GeneratorSpec(
                generator_enum=Generators.BOTORCH_MODULAR,
                generator_kwargs={"surrogate_spec": spec},
            )
        ],
    )
    return GenerationStrategy(name=f"plain {model_class.__name__}", nodes=[sobol, model_based])


def run(kind: str, trials: int, refit_every: int) -> list[dict]:
    if kind == "plain":
        strategy = plain_strategy()
    else:
        strategy = streaming_generation_strategy(
            WiskiGP,
            num_initial_trials=NUM_INITIAL,
            refit_every=refit_every,
            seed=0,
            botorch_acqf_class=qLogExpectedImprovement if kind == "streaming_logei" else None,
        )
    client = Client(random_seed=0)
    client.configure_experiment(
        name=f"branin_{kind}",
        parameters=[
            RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
            RangeParameterConfig(name="x2", parameter_type="float", bounds=(0.0, 15.0)),
        ],
    )
    client.configure_optimization(objective="-branin")
    client.set_generation_strategy(strategy)
    rows, best = [], math.inf
    for trial in range(trials):
        start = time.perf_counter()
        (index, parameters), *_ = client.get_next_trials(max_trials=1).items()
        seconds = time.perf_counter() - start
        value = branin(parameters["x1"], parameters["x2"])
        client.complete_trial(trial_index=index, raw_data={"branin": value})
        best = min(best, value)
        rows.append({"kind": kind, "trial": trial, "seconds": seconds, "best": best})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--refit-every", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    logging.getLogger("ax").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    kinds = ("plain", "streaming", "streaming_logei")
    rows = [r for kind in kinds for r in run(kind, args.trials, args.refit_every)]
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "ax_streaming.csv", index=False)
    model_based = frame[frame["trial"] >= NUM_INITIAL]
    windows = model_based.assign(window=(model_based["trial"] - NUM_INITIAL) // 10)
    summary = windows.groupby(["kind", "window"])["seconds"].mean().unstack(0)
    print(summary.round(3).to_string())
    payload = {
        "machine": machine_info(),
        "settings": vars(args) | {"out": str(args.out)},
        "rows": rows,
        "mean_seconds_per_10_trials": {
            kind: summary[kind].round(4).tolist() for kind in summary.columns
        },
    }
    (args.out / "ax_streaming.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
