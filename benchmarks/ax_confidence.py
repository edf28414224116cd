r"""How confident Ax is in its best point with a streamgp model against ``SingleTaskGP``.

Ax's Client on 2-D Branin (noiseless; Ax infers the noise), 5 Sobol trials then Ax's
modular BoTorch generator with ``ModelConfig(botorch_model_class=...)`` (qLogNEI) for
``--trials`` trials in all, for ``--seeds`` seeds (the Sobol seed and the Client's).
After the last trial: the best point Ax reports (``get_best_parameterization``, from the
model's predictions), its predicted mean and sem, its true value, and the fitted model's
hyperparameters as Ax left them (noise, constant mean, output scale and lengthscales).
Issue 35 measured sems of 0.55 / 2.38 / 1.39 for WiskiGP against 0.05 / 0.14 / 0.32 for
``SingleTaskGP`` before the models learned a constant mean. One torch thread.

Results: ``benchmarks/results/ax_confidence.{json,csv}``.

Usage: ``python benchmarks/ax_confidence.py [--trials 25] [--seeds 3]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import pandas as pd
import torch
from ax.api import Client, RangeParameterConfig
from ax_streaming import branin, plain_strategy
from botorch.models import SingleTaskGP

from streamgp import WiskiGP
from streamgp.utils.machine import machine_info

MODELS = {"SingleTaskGP": SingleTaskGP, "WiskiGP": WiskiGP}


def _hyperparameters(client: Client) -> dict:
    r"""The fitted model's noise, constant mean, output scale and lengthscales."""
    model = client._generation_strategy.adapter.generator.surrogate.model
    found = {}
    for label, path in (
        ("noise", "likelihood.noise"),
        ("constant mean", "mean_module.constant"),
        ("outputscale", "covar_module.outputscale"),
        ("lengthscale", "covar_module.base_kernel.lengthscale"),
        ("lengthscale", "covar_module.lengthscale"),
    ):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        found.setdefault(label, [round(v, 6) for v in obj.detach().flatten().tolist()])
    return found


def run(name: str, seed: int, trials: int) -> dict:
    client = Client(random_seed=seed)
    client.configure_experiment(
        name=f"branin_{name}_{seed}",
        parameters=[
            RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
            RangeParameterConfig(name="x2", parameter_type="float", bounds=(0.0, 15.0)),
        ],
    )
    client.configure_optimization(objective="-branin")
    client.set_generation_strategy(plain_strategy(MODELS[name], seed))
    best_observed = math.inf
    for _ in range(trials):
        (index, parameters), *_ = client.get_next_trials(max_trials=1).items()
        value = branin(parameters["x1"], parameters["x2"])
        client.complete_trial(trial_index=index, raw_data={"branin": value})
        best_observed = min(best_observed, value)
    parameters, prediction, _, _ = client.get_best_parameterization()
    mean, sem = prediction["branin"]
    return {
        "model": name,
        "seed": seed,
        "predicted mean": mean,
        "predicted sem": sem,
        "true value": branin(parameters["x1"], parameters["x2"]),
        "best observed": best_observed,
        **{f"fitted {k}": v for k, v in _hyperparameters(client).items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    logging.getLogger("ax").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    rows = []
    for seed in range(args.seeds):
        for name in MODELS:
            rows.append(run(name, seed, args.trials))
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "ax_confidence.csv", index=False)
    payload = {
        "machine": machine_info(),
        "settings": vars(args) | {"out": str(args.out)},
        "rows": rows,
    }
    (args.out / "ax_confidence.json").write_text(json.dumps(payload, indent=2, default=str))
    print(frame[["model", "seed", "predicted mean", "predicted sem", "true value"]].to_string())


if __name__ == "__main__":
    main()
