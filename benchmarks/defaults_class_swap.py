"""SingleTaskGP's defaults in every model: the class swap and a drifting stream.

Two measurements, written to ``results/defaults_class_swap.csv`` (one row per model and
setting) and quoted in the docs' "Defaults" section (docs/botorch.md):

- **Class swap**: ``cls(X, Y)`` with nothing else passed, as a BoTorch user writes
  ``SingleTaskGP(X, Y)``, fitted with ``fit_gpytorch_mll(ExactMarginalLogLikelihood)``;
  targets ``100 + 10 sum sin(6 x)``, n = 40 in 2-D, test RMSE on 200 uniform points.
  Also with ``outcome_transform=None, mean_module=ZeroMean()``: the defaults before.
- **Drifting stream**: a 10-point design in the corner [0, 0.25]^2 where the function is
  low, then 10 batches of 6 uniform points whose mean is ten and more standard
  deviations of the design's targets higher; every transform stays frozen on the design,
  one refit at the end. The references are ``SingleTaskGP`` on all the data with the
  design's standardisation (what BoTorch's ``condition_on_observations`` keeps) and
  rebuilt on all data; WISKI also after its exact ``restandardize()``.

The test suite checks the same claims (tests/models/test_defaults.py).

Usage: ``python benchmarks/defaults_class_swap.py [--out benchmarks/results]``
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import pandas as pd
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from gpytorch.means import ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp.models import (
    DecoupledSVGP,
    KissGP,
    LocalGP,
    OnlineSGPR,
    OnlineSoftKIGP,
    OnlineSVGP,
    SoftKIGP,
    WiskiGP,
)

DT = torch.float64
MODELS = [WiskiGP, KissGP, OnlineSGPR, OnlineSVGP, DecoupledSVGP, LocalGP, SoftKIGP, OnlineSoftKIGP]
OLD_DEFAULTS = {"outcome_transform": None, "mean_module": ZeroMean()}


def fit(model) -> None:
    model.train()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    model.eval()


def rmse(prediction: torch.Tensor, Y: torch.Tensor) -> float:
    return (prediction - Y).square().mean().sqrt().item()


def predict(model, X: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.posterior(X).mean


def class_swap(rows: list[dict]) -> None:
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=generator, dtype=DT)
    X_test = torch.rand(200, 2, generator=generator, dtype=DT)

    def f(X):
        return 100 + 10 * torch.sin(6 * X).sum(-1, keepdim=True)

    for cls in [SingleTaskGP, *MODELS]:
        for setting, options in (("defaults", {}), ("old defaults", OLD_DEFAULTS)):
            if cls is SingleTaskGP and options:
                continue
            torch.manual_seed(0)
            model = cls(X, f(X), **options)
            fit(model)
            value = rmse(predict(model, X_test), f(X_test))
            rows.append(
                {
                    "experiment": "class swap",
                    "model": cls.__name__,
                    "setting": setting,
                    "rmse": value,
                }
            )
            print(rows[-1], flush=True)


def drifting_stream(rows: list[dict]) -> None:
    generator = torch.Generator().manual_seed(0)

    def f(X):
        level = torch.sigmoid(12 * (X.sum(-1, keepdim=True) - 0.6))
        return 2 * torch.sin(5 * X).sum(-1, keepdim=True) + 40 * level

    X0 = 0.25 * torch.rand(10, 2, generator=generator, dtype=DT)
    batches = [torch.rand(6, 2, generator=generator, dtype=DT) for _ in range(10)]
    X_test = torch.rand(300, 2, generator=generator, dtype=DT)
    Y0, Y_test = f(X0), f(X_test)
    X_all = torch.cat([X0, *batches])
    Y_all = f(X_all)
    drift = ((Y_all[10:].mean() - Y0.mean()) / Y0.std()).item()

    mean, std = Y0.mean(), Y0.std()
    torch.manual_seed(0)
    frozen = SingleTaskGP(X_all, (Y_all - mean) / std, outcome_transform=None)
    fit(frozen)
    rows.append(
        {
            "experiment": "drift",
            "model": "SingleTaskGP",
            "setting": "design's standardisation",
            "rmse": rmse(mean + std * predict(frozen, X_test), Y_test),
            "drift_sd": drift,
        }
    )
    rebuilt = SingleTaskGP(X_all, Y_all)
    fit(rebuilt)
    rows.append(
        {
            "experiment": "drift",
            "model": "SingleTaskGP",
            "setting": "rebuilt on all data",
            "rmse": rmse(predict(rebuilt, X_test), Y_test),
            "drift_sd": drift,
        }
    )
    print(rows[-2:], flush=True)

    streaming = [WiskiGP, KissGP, OnlineSGPR, OnlineSVGP, DecoupledSVGP, LocalGP, OnlineSoftKIGP]
    for cls in streaming:
        variants = [("defaults", {}, None), ("old defaults", OLD_DEFAULTS, None)]
        if cls is WiskiGP:
            variants.append(("defaults + restandardize()", {}, lambda m: m.restandardize()))
        if cls is OnlineSoftKIGP:  # its points are learned on the design's corner
            variants = [
                ("defaults + refit_points()", {"keep_data": True}, lambda m: m.refit_points()),
                (
                    "old defaults + refit_points()",
                    {"keep_data": True, **OLD_DEFAULTS},
                    lambda m: m.refit_points(),
                ),
            ]
        for setting, options, before_fit in variants:
            torch.manual_seed(0)
            model = cls(X0, Y0, **options)
            for X in batches:
                model.observe(X, f(X))
            if before_fit is not None:
                before_fit(model)
            fit(model)
            rows.append(
                {
                    "experiment": "drift",
                    "model": cls.__name__,
                    "setting": setting,
                    "rmse": rmse(predict(model, X_test), Y_test),
                    "drift_sd": drift,
                }
            )
            print(rows[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[dict] = []
    class_swap(rows)
    drifting_stream(rows)
    frame = pd.DataFrame(rows)
    frame["machine"] = f"{platform.machine()} {platform.system()}, torch {torch.__version__}"
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "defaults_class_swap.csv", index=False)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
