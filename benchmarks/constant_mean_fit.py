r"""What the learned constant mean costs ``AdditiveWiskiGP``'s fits, and a cheap remedy.

On StyblinskiTang-20 (the BO table's noise, sd 20) the maximum-likelihood constant mean is
far from zero (about -5 standardised units; ``SingleTaskGP`` learns about the same) and
weakly identified against the groups' offsets, so L-BFGS-B spends many evaluations moving
it together with the output scales. The marginal likelihood is exactly quadratic in the
constant (it shifts the targets), so three evaluations without gradients give its
optimum for the current kernel: this measures a warm-started refit (as a BO loop's, after
``--extra`` more points) started there instead of at the previous fit's constant.

Rows (``--seeds`` draws of ``n`` uniform points):

- ``fresh``: a fit from the default start, with the learned constant (the default) and
  with ``ZeroMean()``: evaluations, seconds, the marginal likelihood per datum, the test
  RMSE at ``--test`` uniform points and the constant;
- ``warm``: for each of ``--extra``, a model on the points plus that many more, loaded
  with the fresh fit's state and refitted, ``plain`` or ``constant at its optimum``.

Writes ``benchmarks/results/constant_mean_fit.{csv,json}``.

Usage: ``python benchmarks/constant_mean_fit.py [--n 600] [--extra 15,30] [--seeds 0,1]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch
from additive_grid_budget import DIM, counted_fit, styblinskitang_data
from botorch.models.transforms import Normalize
from gpytorch.means import ZeroMean

from streamgp import AdditiveWiskiGP
from streamgp.utils.machine import machine_info


def constant_at_its_optimum(model) -> float:
    r"""Set the scalar constant mean to the maximiser of the model's marginal likelihood
    along it (the objective is quadratic in the constant); returns the new value."""
    raw = model.mean_module.raw_constant
    with torch.no_grad():
        start = raw.item()
        values = []
        for offset in (-1.0, 0.0, 1.0):
            raw.fill_(start + offset)
            values.append(model.fit_objective()[0].item())
        low, middle, high = values
        curvature, slope = 0.5 * (low + high) - middle, 0.5 * (high - low)
        raw.fill_(start - slope / (2 * curvature) if curvature < 0 else start)
    return raw.item()


def rows_for_seed(n: int, extras: list[int], num_test: int, seed: int) -> list[dict]:
    X, Y, X_test, Y_test = styblinskitang_data(n + max(extras), num_test, seed)

    def make(count, **kwargs):
        return AdditiveWiskiGP(X[:count], Y[:count], input_transform=Normalize(DIM), **kwargs)

    rows = []
    fitted = None
    for mean, kwargs in (("learned constant", {}), ("zero", {"mean_module": ZeroMean()})):
        model = make(n, **kwargs)
        evaluations, seconds = counted_fit(model)
        with torch.no_grad():
            rmse = (model.posterior(X_test).mean.squeeze(-1) - Y_test).pow(2).mean().sqrt()
            objective = model.fit_objective()[0].item() / n
        constant = getattr(model.mean_module, "constant", torch.tensor(0.0)).item()
        rows.append(
            {"seed": seed, "fit": "fresh", "mean": mean, "n": n, "evaluations": evaluations}
            | {"seconds": seconds, "mll_per_datum": objective, "test_rmse": rmse.item()}
            | {"constant": constant}
        )
        print(rows[-1], flush=True)
        fitted = model if fitted is None else fitted
    for extra in extras:
        for start in ("plain", "constant at its optimum"):
            model = make(n + extra)
            model.load_state_dict(fitted.state_dict())
            if start != "plain":
                constant_at_its_optimum(model)
            start_constant = model.mean_module.constant.item()
            evaluations, seconds = counted_fit(model)
            with torch.no_grad():
                objective = model.fit_objective()[0].item() / (n + extra)
            rows.append(
                {"seed": seed, "fit": f"warm, +{extra}", "mean": start, "n": n + extra}
                | {"evaluations": evaluations, "seconds": seconds, "mll_per_datum": objective}
                | {"start_constant": start_constant, "constant": model.mean_module.constant.item()}
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--extra", default="15,30", help="points added before each refit")
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    extras = [int(v) for v in args.extra.split(",")]
    rows = [
        row
        for seed in (int(s) for s in args.seeds.split(","))
        for row in rows_for_seed(args.n, extras, args.test, seed)
    ]
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "constant_mean_fit.csv", index=False)
    payload = {"machine": machine_info("cpu", dtype="float64"), "rows": rows}
    payload["settings"] = vars(args) | {"out": str(args.out)}
    (args.out / "constant_mean_fit.json").write_text(json.dumps(payload, indent=2))
    print(frame.to_string())


if __name__ == "__main__":
    main()
