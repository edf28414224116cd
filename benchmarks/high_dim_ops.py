r"""WiskiGP against SingleTaskGP in 6-20 dimensions: operations and time per BoTorch step.

With its default grid in ``d >= 4`` dimensions ``WiskiGP`` stays in data space and evaluates
its kernel exactly (``evaluates_kernel_exactly``; see the ``WiskiGP`` docs). This script
measures what a user who swaps ``SingleTaskGP`` for it pays, on the two calls a BoTorch loop
makes most:

- ``posterior``: the posterior mean and variance at ``T = 16`` points;
- ``qLogNEI fwd+bwd``: the value and gradient of BoTorch's qLogNEI (256 QMC samples,
  ``q = 3``, a batch of 5 candidate sets: what ``optimize_acqf`` evaluates at every
  L-BFGS step) on a ``ModelListGP`` of two models, as in BoTorch's closed-loop tutorial;
- ``mll fwd+bwd``: the value and gradient of both models' marginal likelihoods, the
  closures ``fit_gpytorch_mll`` evaluates at every L-BFGS-B step (in training mode; on a
  ``SumMarginalLogLikelihood`` BoTorch fits each model of the list with its own
  ``ExactMarginalLogLikelihood``, so each model's closure is timed, not the sum's);

each for both models built the tutorial's way (``Normalize(d)`` without bounds, known
noise, fitted with ``fit_gpytorch_mll``) on ``n`` points. Counted: top-level aten
operations (a proxy for kernel launches that needs no GPU) and wall-clock milliseconds
(median of ``--repeats`` calls after a warm-up, one torch thread). Both models are timed
in the same run, alternately, so their ratio is comparable on a shared machine.

Results go to ``<out>/high_dim_ops.{json,csv}``.

Usage: ``python benchmarks/high_dim_ops.py [--dims 6 10 20] [--n 16 64] [--repeats 20]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings
from pathlib import Path

import pandas as pd
import torch
from botorch.acquisition import qLogNoisyExpectedImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms import Normalize
from botorch.optim.closures import get_loss_closure
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood
from torch.utils._python_dispatch import TorchDispatchMode

from streamgp import WiskiGP
from streamgp.utils.machine import device_label, machine_info, median_seconds

T, Q, BATCH, MC = 16, 3, 5, 256
MODELS = {"SingleTaskGP": SingleTaskGP, "WiskiGP": WiskiGP}


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(step) -> int:
    r"""Top-level aten operations one call of ``step`` runs (forward and backward)."""
    with _CountOps() as counter:
        step()
    return counter.count


def median_ms(step, repeats: int) -> float:
    r"""Median milliseconds of ``step``, each call timed to the end of its device work."""
    return 1e3 * median_seconds(step, repeats)


def steps(cls, dim: int, n: int, seed: int, device: str | torch.device = "cpu"):
    r"""The three steps for a ``ModelListGP`` of two ``cls`` models on ``n`` points."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(n, dim, dtype=torch.float64, generator=generator)
    Y = torch.stack([torch.sin(5 * X).sum(-1), X.sum(-1) - dim / 2], -1)
    Y = Y + 0.1 * torch.randn(n, 2, dtype=torch.float64, generator=generator)
    X, Y = X.to(device), Y.to(device)
    parts = [
        cls(X, Y[:, i : i + 1], torch.full((n, 1), 0.01, dtype=torch.float64, device=device),
            input_transform=Normalize(d=dim))
        for i in range(2)
    ]  # fmt: skip
    model = ModelListGP(*parts)
    fit_gpytorch_mll(SumMarginalLogLikelihood(model.likelihood, model))
    test = torch.rand(T, dim, dtype=torch.float64, generator=generator).to(device)
    candidates = torch.rand(BATCH, Q, dim, dtype=torch.float64, generator=generator)
    candidates = candidates.to(device)
    candidates.requires_grad_(True)
    acquisition = qLogNoisyExpectedImprovement(  # the tutorial's objective and constraint
        model,
        X_baseline=X,
        sampler=SobolQMCNormalSampler(torch.Size([MC]), seed=seed),
        objective=GenericMCObjective(lambda Z, X=None: Z[..., 0]),
        constraints=[lambda Z: Z[..., 1]],
    )

    def posterior() -> None:
        post = parts[0].posterior(test)
        post.mean, post.variance  # noqa: B018

    def acquisition_step() -> None:
        acquisition(candidates).sum().backward()

    mlls = [ExactMarginalLogLikelihood(part.likelihood, part) for part in parts]
    losses = [get_loss_closure(mll) for mll in mlls]  # fit_gpytorch_mll's closures

    def likelihood_step() -> None:
        for mll, loss in zip(mlls, losses, strict=True):
            if not mll.training:  # (timed last: the other steps stay in eval mode)
                mll.train()
            loss().backward()

    return {
        "posterior": posterior,
        "qLogNEI fwd+bwd": acquisition_step,
        "mll fwd+bwd": likelihood_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[6, 10, 20])
    parser.add_argument("--n", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (timed synchronised)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows = []
    for dim in args.dims:
        for n in args.n:
            built = {name: steps(cls, dim, n, 0, device) for name, cls in MODELS.items()}
            for step in ("posterior", "qLogNEI fwd+bwd", "mll fwd+bwd"):
                for name in MODELS:
                    built[name][step]()  # warm-up: caches built
                ops = {name: count_ops(built[name][step]) for name in MODELS}
                # Alternate the two models' calls so that both see the same load.
                times: dict[str, list[float]] = {name: [] for name in MODELS}
                for _ in range(args.repeats):
                    for name in MODELS:
                        times[name].append(median_ms(built[name][step], 1))
                for name in MODELS:
                    rows.append(
                        {
                            "d": dim,
                            "n": n,
                            "step": step,
                            "model": name,
                            "aten_ops": ops[name],
                            "median_ms": statistics.median(times[name]),
                        }
                    )
                    print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    # The CPU results keep their name; a GPU's go beside them, named by the device.
    machine = machine_info(device, dtype="float64")
    stem = "high_dim_ops" if device.type == "cpu" else f"high_dim_ops-{device_label(machine)}"
    frame.to_csv(args.out / f"{stem}.csv", index=False)
    payload = {"machine": machine, "rows": rows}
    (args.out / f"{stem}.json").write_text(json.dumps(payload, indent=2, default=str))
    ratio = frame.pivot_table(index=["d", "n", "step"], columns="model", values="median_ms")
    ratio["WiskiGP / SingleTaskGP"] = ratio["WiskiGP"] / ratio["SingleTaskGP"]
    print(ratio.to_string(float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()
