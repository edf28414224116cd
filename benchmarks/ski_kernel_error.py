r"""How fine a grid a lengthscale needs: SKI's kernel error against the exact RBF kernel.

WISKI's kernel is ``W K_UU W^T`` with cubic interpolation weights ``W`` on a regular
grid (Wilson & Nickisch, 2015), exact at the grid points and approximate between them.
For an RBF kernel with lengthscale ``l`` on ``[0, 1]`` (the loops' unit cube, which the
grid covers padded by one spacing ``h``), this script measures the largest absolute
error ``max |(W K_UU W^T)_ij - k(x_i, x_j)|`` over ``--points`` random inputs, for each
grid size and lengthscale. A product (ARD) kernel in ``d`` dimensions has at most about
``d`` times the largest per-dimension error, since each factor is at most 1.

Writes ``results/ski_kernel_error.{csv,json}``.

Usage: ``python benchmarks/ski_kernel_error.py [--grid-sizes 10,16,24,32]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch
from gpytorch.kernels import RBFKernel

from streamgp.interpolation.grid import CubicGridInterpolation
from streamgp.utils.machine import machine_info


def kernel_error(grid_size: int, lengthscale: float, X: torch.Tensor) -> tuple[float, float]:
    r"""``(spacing, max abs error)`` of SKI on a ``grid_size`` grid over ``[0, 1]``."""
    bounds = torch.tensor([[0.0], [1.0]], dtype=X.dtype)
    interpolation = CubicGridInterpolation(bounds, grid_size)
    U = interpolation.grid_points()
    W = interpolation.weights(X).to_dense()
    kernel = RBFKernel().to(X)
    kernel.lengthscale = lengthscale
    with torch.no_grad():
        ski = W @ kernel(U).to_dense() @ W.T
        exact = kernel(X).to_dense()
    return (U[1] - U[0]).item(), (ski - exact).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid-sizes", default="10,16,24,32")
    parser.add_argument("--lengthscales", default="0.025,0.05,0.083,0.1,0.2,0.5")
    parser.add_argument("--points", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    X = torch.rand(args.points, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows = []
    for grid_size in (int(g) for g in args.grid_sizes.split(",")):
        for lengthscale in (float(v) for v in args.lengthscales.split(",")):
            spacing, error = kernel_error(grid_size, lengthscale, X)
            rows.append(
                {
                    "grid_size": grid_size,
                    "spacing": spacing,
                    "lengthscale": lengthscale,
                    "lengthscale / spacing": lengthscale / spacing,
                    "max abs error": error,
                }
            )
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "ski_kernel_error.csv", index=False)
    payload = {
        "protocol": "1-D RBF on [0, 1], SKI (cubic, padded grid) vs exact, max abs error",
        "settings": vars(args) | {"out": str(args.out)},
        "machine": machine_info("cpu"),
        "results": rows,
    }
    (args.out / "ski_kernel_error.json").write_text(json.dumps(payload, indent=2) + "\n")
    table = frame.pivot(index="grid_size", columns="lengthscale", values="max abs error")
    print(table.to_string(float_format="%.1e"))


if __name__ == "__main__":
    main()
