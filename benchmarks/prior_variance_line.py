r"""Prior variance along a line through a coarse grid: SKI's lattice, and its two remedies.

A ``WiskiGP`` (2-D, RBF with unit outputscale, one observation far from the line with
a huge noise, so the posterior is the prior to 1e-6) on a 16 x 16 grid over the unit
square, lengthscale 0.8 grid spacings (what a fit on fast-varying data can leave). Along
the line ``x_2 = 0.37``, the predictive variance of:

- exact SKI (``exact_prior_variance(False)``): ``w(x)^T K_UU w(x)``, which dips between
  grid points (the lattice of the malaria notebook's sd maps);
- the default model: SKI plus the exact prior variance ``k(x, x) - w(x)^T K_UU w(x)``
  (:mod:`streamgp.linalg.prior_variance`), flat at ``k(x, x) = 1``;
- exact SKI after ``refine_grid()`` (the grid the loops move to after such a fit).

Writes ``results/prior_variance_line.{csv,png}``.

Usage: ``python benchmarks/prior_variance_line.py``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

from streamgp import WiskiGP
from streamgp.settings import exact_prior_variance

DT = torch.float64


def prior_model(grid_size: int, lengthscale: float) -> WiskiGP:
    r"""A model whose posterior is its prior: one observation with a huge noise."""
    X, Y = torch.tensor([[0.95, 0.95]], dtype=DT), torch.zeros(1, 1, dtype=DT)
    kernel = ScaleKernel(RBFKernel())
    kernel.outputscale = 1.0
    kernel.base_kernel.lengthscale = lengthscale
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    model = WiskiGP(
        X, Y, covar_module=kernel, grid_size=grid_size, grid_bounds=bounds, outcome_transform=None
    )
    model.likelihood.noise = 1e8
    return model.eval()


def variance_along(model: WiskiGP, line: torch.Tensor, exact: bool) -> torch.Tensor:
    with torch.no_grad(), exact_prior_variance(exact):
        return model.posterior(line).variance.squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid-size", type=int, default=16)
    parser.add_argument("--spacings", type=float, default=0.8, help="lengthscale in spacings")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    model = prior_model(args.grid_size, 1.0)
    spacing = float(model.interpolation.grid[0][1] - model.interpolation.grid[0][0])
    model.covar_module.base_kernel.lengthscale = args.spacings * spacing
    t = torch.linspace(0.0, 1.0, 401, dtype=DT)
    line = torch.stack([t, torch.full_like(t, 0.37)], -1)
    frame = pd.DataFrame(
        {
            "x1": t.numpy(),
            "exact SKI": variance_along(model, line, exact=False).numpy(),
            "SKI + exact prior variance (default)": variance_along(model, line, True).numpy(),
        }
    )
    before = list(model.interpolation.grid_size)
    model.refine_grid()
    after = list(model.interpolation.grid_size)
    frame[f"exact SKI, refine_grid() {after}"] = variance_along(model, line, False).numpy()
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "prior_variance_line.csv", index=False)
    print(f"grid {before} -> {after}; lengthscale {args.spacings} spacings of {spacing:.4f}")
    print(frame.drop(columns="x1").describe().loc[["min", "max"]].to_string())

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for column in frame.columns[1:]:
        ax.plot(frame["x1"], frame[column], label=column)
    ax.set_xlabel("x1 (x2 = 0.37)")
    ax.set_ylabel("prior variance")
    ax.set_title(f"{before[0]} x {before[1]} grid, lengthscale {args.spacings} spacings")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out / "prior_variance_line.png", dpi=100)


if __name__ == "__main__":
    main()
