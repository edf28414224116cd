r"""LOVE predictive variances on UCI data (an analogue of Pleiss et al. 2018, Table 2).

For each of skillcraft, elevators, protein and powerplant (streamgp's split, seed 0:
inputs scaled to [-1, 1]^d, targets standardized with training statistics):

1. Inputs are projected to 2-D by a fixed linear map, the first two principal
   components of the (scaled) training inputs, and the projections are mapped
   affinely into the unit square (training min/max -> [0.02, 0.98]; test points are
   clamped into [0, 1]^2).
2. A training subsample S of n_S = min(n_train, 4000) points (seeded) is used by every
   model, so that comparisons with the exact GP isolate the approximation error.
3. Hyperparameters (ScaleKernel(RBF) with ARD, Gaussian noise) are fitted once, by
   BoTorch's ``fit_gpytorch_mll`` on an exact ``SingleTaskGP`` with 1000 points of S,
   and then fixed and shared by all models.
4. Models: ``KissGP`` and ``WiskiGP`` on a 64 x 64 grid (m = 4096, padding included)
   over the unit square, with and without LOVE (``love_tolerance``, default 1e-6); the
   exact GP on S (Cholesky of the n_S x n_S kernel matrix); SGPR (gpytorch's
   ``InducingPointKernel``, 500 inducing points drawn from S).
5. Test points: 10^4 points drawn with replacement from the projected test inputs,
   jittered by N(0, 0.01^2) and clamped into [0, 1]^2.

Reported: variance SMAE = mean |v_hat - v| / mean |v| of LOVE against the same model
without LOVE, and of every model against the exact GP; times for the 10^4 variances
"from scratch" (model construction and every cache included) and "after precompute"
(caches warm; medians of repeats); the LOVE rank k. float64, one torch thread.
Results: ``benchmarks/results/love_variances.{json,csv}``.

Usage: ``python benchmarks/love_variances.py [--datasets a,b] [--love-tolerance 1e-6]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import gpytorch
import pandas as pd
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from gpytorch.kernels import InducingPointKernel, RBFKernel, ScaleKernel
from gpytorch.means import ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from linear_operator.settings import max_cholesky_size

from streamgp import KissGP, WiskiGP
from streamgp.datasets import load_streaming_split
from streamgp.utils.machine import machine_info

DATASETS = ["skillcraft", "elevators", "protein", "powerplant"]
DATA_DIR = "/work/shared/data"
GRID, N_SUBSET, N_FIT, N_INDUCING, N_TEST = 64, 4000, 1000, 500, 10_000
DTYPE = torch.float64
CHUNK = 2500


# ------------------------------------------------------------------ shared helpers
def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Median wall-clock seconds of ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


#: The settings these figures were measured with: raw targets, zero prior mean.
RAW = {"outcome_transform": None, "mean_module": ZeroMean()}


def smae(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    """Scaled mean absolute error: mean |estimate - reference| / mean |reference|."""
    return ((estimate - reference).abs().mean() / reference.abs().mean()).item()


def prepare(name: str, seed: int = 0) -> dict:
    """Projected 2-D data: the subsample S, the 10^4 test points, the targets."""
    split = load_streaming_split(name, data_dir=DATA_DIR, seed=seed, dtype=DTYPE)
    X, Y = split.train_X, split.train_Y
    center = X.mean(0)
    # Fixed linear projection: first two principal components of the training inputs.
    _, _, Vh = torch.linalg.svd(X - center, full_matrices=False)
    P = Vh[:2].T
    Z = (X - center) @ P
    lo, hi = Z.min(0).values, Z.max(0).values

    def to_box(points: torch.Tensor) -> torch.Tensor:
        return (0.02 + 0.96 * ((points - center) @ P - lo) / (hi - lo)).clamp(0.0, 1.0)

    gen = torch.Generator().manual_seed(seed)
    Z_train = to_box(X)
    subset = torch.randperm(len(X), generator=gen)[: min(len(X), N_SUBSET)]
    Z_test = to_box(split.test_X)
    pick = torch.randint(len(Z_test), (N_TEST,), generator=gen)
    jitter = 0.01 * torch.randn(N_TEST, 2, generator=gen, dtype=DTYPE)
    T = (Z_test[pick] + jitter).clamp(0.0, 1.0)
    return {
        "n_train": len(X),
        "d": X.shape[-1],
        "Z_all": Z_train,
        "Y_all": Y,
        "Z": Z_train[subset],
        "Y": Y[subset],
        "T": T,
        "gen": gen,
    }


def fit_hyperparameters(Z: torch.Tensor, Y: torch.Tensor, gen: torch.Generator) -> dict:
    """ScaleKernel(RBF-ARD) and noise from an exact GP on ``N_FIT`` points of ``Z``."""
    idx = torch.randperm(len(Z), generator=gen)[:N_FIT]
    gp = SingleTaskGP(
        Z[idx], Y[idx], covar_module=ScaleKernel(RBFKernel(ard_num_dims=2)), outcome_transform=None
    )
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    return {
        "lengthscale": gp.covar_module.base_kernel.lengthscale.detach().clone(),
        "outputscale": gp.covar_module.outputscale.detach().clone(),
        "noise": gp.likelihood.noise.detach().clone(),
    }


def make_kernel(hypers: dict) -> ScaleKernel:
    kernel = ScaleKernel(RBFKernel(ard_num_dims=2)).to(DTYPE)
    kernel.base_kernel.lengthscale = hypers["lengthscale"]
    kernel.outputscale = hypers["outputscale"]
    return kernel


def build_kissgp(Z, Y, hypers, tol) -> KissGP:
    model = KissGP(Z, Y, grid_size=GRID, covar_module=make_kernel(hypers), **RAW)
    model.likelihood.noise = hypers["noise"]
    model.love_tolerance = tol
    return model.eval()


def build_wiski(Z, Y, hypers, tol) -> WiskiGP:
    model = WiskiGP(Z, Y, grid_size=GRID, covar_module=make_kernel(hypers), **RAW)
    model.likelihood.noise = hypers["noise"]
    model.love_tolerance = tol
    return model.eval()


def love_variances(model, T) -> torch.Tensor:
    with gpytorch.settings.fast_pred_var():
        return model.posterior(T).variance.squeeze(-1)


def exact_variances(model, T) -> torch.Tensor:
    """Without LOVE: the exact dense grid root, one test point per batch, in chunks."""
    parts = [
        model.posterior(T[i : i + CHUNK].unsqueeze(-2)).variance for i in range(0, len(T), CHUNK)
    ]
    return torch.cat(parts).reshape(-1)


class ExactCholesky:
    """Exact GP predictive variances from a Cholesky factor of K_SS + s2 I."""

    def __init__(self, Z, hypers):
        self.Z, self.kernel, self.noise = Z, make_kernel(hypers), hypers["noise"].reshape(())
        K = self.kernel(Z).to_dense()
        self.L = torch.linalg.cholesky(K + self.noise * torch.eye(len(Z), dtype=DTYPE))

    def variances(self, T) -> torch.Tensor:
        parts = []
        for i in range(0, len(T), CHUNK):
            K_st = self.kernel(self.Z, T[i : i + CHUNK]).to_dense()
            V = torch.linalg.solve_triangular(self.L, K_st, upper=False)
            prior = self.kernel(T[i : i + CHUNK], diag=True)
            parts.append(prior - V.square().sum(0))
        return torch.cat(parts)


class SGPR(gpytorch.models.ExactGP):
    """gpytorch's SGPR (Titsias 2009): ``InducingPointKernel`` in an ``ExactGP``."""

    def __init__(self, Z, Y, hypers, inducing):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
        super().__init__(Z, Y.squeeze(-1), likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = InducingPointKernel(
            make_kernel(hypers), inducing_points=inducing.clone(), likelihood=likelihood
        )
        likelihood.noise = hypers["noise"]

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def sgpr_variances(model, T) -> torch.Tensor:
    with gpytorch.settings.fast_pred_var(False), gpytorch.settings.skip_posterior_variances(False):
        return model(T).variance


# --------------------------------------------------------------------------- main
def run_dataset(name: str, tol: float, repeats: int) -> list[dict]:
    data = prepare(name)
    Z, Y, T = data["Z"], data["Y"], data["T"]
    start = time.perf_counter()
    hypers = fit_hyperparameters(Z, Y, data["gen"])
    print(
        f"{name}: n_train={data['n_train']} d={data['d']} n_S={len(Z)}; hyperparameters fitted "
        f"in {time.perf_counter() - start:.1f} s: lengthscale={hypers['lengthscale'].tolist()} "
        f"outputscale={hypers['outputscale'].item():.3g} noise={hypers['noise'].item():.3g}",
        flush=True,
    )
    torch.set_grad_enabled(False)  # timings without autograd graphs
    base = {"dataset": name, "n_train": data["n_train"], "d_original": data["d"], "n_S": len(Z)}
    rows = []

    # Exact GP (the reference).
    t_exact_scratch, exact = median_time(lambda: ExactCholesky(Z, hypers), 1)
    t_solve, v_exact = median_time(lambda: exact.variances(T), max(2, repeats // 2))
    t_exact_scratch += t_solve
    rows.append(
        {**base, "model": "exact GP (Cholesky)", "love": False, "rank": None,
         "scratch_s": t_exact_scratch, "after_precompute_s": t_solve,
         "smae_vs_no_love": None, "smae_vs_exact": 0.0}
    )  # fmt: skip
    print(f"  exact: scratch {t_exact_scratch:.2f} s, after precompute {t_solve:.2f} s", flush=True)

    # Exact GP as BoTorch users get it: SingleTaskGP.posterior switches gpytorch's own
    # LOVE on (fast_pred_var, fixed Lanczos rank max_root_decomposition_size = 100).
    def botorch_exact():
        gp = SingleTaskGP(Z, Y, covar_module=make_kernel(hypers), outcome_transform=None)
        gp.likelihood.noise = hypers["noise"]
        return gp.eval()

    t_gp_scratch, (gp, _) = median_time(lambda: (m := botorch_exact(), exact_variances(m, T)), 1)
    t_gp, v_gp = median_time(lambda gp=gp: exact_variances(gp, T), repeats)
    rows.append(
        {**base, "model": "exact GP (BoTorch default: gpytorch LOVE)", "love": True,
         # gpytorch's LOVE cache is a Cholesky root up to linear_operator's
         # max_cholesky_size (BoTorch sets 4096) and a Lanczos root of fixed rank
         # max_root_decomposition_size above it.
         "rank": len(Z) if len(Z) <= max_cholesky_size.value()
         else gpytorch.settings.max_root_decomposition_size.value(),
         "scratch_s": t_gp_scratch, "after_precompute_s": t_gp,
         "smae_vs_no_love": smae(v_gp, v_exact), "smae_vs_exact": smae(v_gp, v_exact),
         "min_variance": v_gp.min().item()}
    )  # fmt: skip
    print(
        f"  exact GP with gpytorch LOVE: scratch {t_gp_scratch:.2f} s, after {t_gp:.4f} s, "
        f"SMAE vs exact {rows[-1]['smae_vs_exact']:.2e}",
        flush=True,
    )

    # SGPR, 500 inducing points from S.
    inducing = Z[torch.randperm(len(Z), generator=data["gen"])[:N_INDUCING]]

    def sgpr_scratch():
        model = SGPR(Z, Y, hypers, inducing).eval()
        return model, sgpr_variances(model, T)

    t_sgpr_scratch, (sgpr, _) = median_time(sgpr_scratch, repeats)
    t_sgpr, v_sgpr = median_time(lambda: sgpr_variances(sgpr, T), repeats)
    rows.append(
        {**base, "model": f"SGPR (M={N_INDUCING})", "love": False, "rank": None,
         "scratch_s": t_sgpr_scratch, "after_precompute_s": t_sgpr,
         "smae_vs_no_love": None, "smae_vs_exact": smae(v_sgpr.detach(), v_exact)}
    )  # fmt: skip
    print(f"  sgpr: scratch {t_sgpr_scratch:.2f} s, after {t_sgpr:.4f} s", flush=True)

    for label, builder in [("KissGP", build_kissgp), ("WiskiGP", build_wiski)]:
        # Without LOVE (exact dense grid root).
        t_scratch, (model, v_dense) = median_time(
            lambda builder=builder: (m := builder(Z, Y, hypers, tol), exact_variances(m, T)), 1
        )
        t_after, v_dense = median_time(lambda m=model: exact_variances(m, T), repeats)
        rows.append(
            {**base, "model": label, "love": False, "rank": GRID**2,
             "scratch_s": t_scratch, "after_precompute_s": t_after,
             "smae_vs_no_love": 0.0, "smae_vs_exact": smae(v_dense, v_exact)}
        )  # fmt: skip
        # With LOVE.
        t_scratch, (model, _) = median_time(
            lambda builder=builder: (m := builder(Z, Y, hypers, tol), love_variances(m, T)), repeats
        )
        t_after, v_love = median_time(lambda m=model: love_variances(m, T), repeats)
        with gpytorch.settings.fast_pred_var():
            rank = model.love_grid_posterior().root.shape[-1]
        rows.append(
            {**base, "model": label, "love": True, "rank": rank,
             "scratch_s": t_scratch, "after_precompute_s": t_after,
             "smae_vs_no_love": smae(v_love, v_dense), "smae_vs_exact": smae(v_love, v_exact),
             "min_variance": v_love.min().item()}
        )  # fmt: skip
        print(
            f"  {label}: LOVE rank {rank}, scratch {t_scratch:.3f} s, "
            f"after {t_after * 1e3:.2f} ms, "
            f"SMAE vs no-LOVE {rows[-1]['smae_vs_no_love']:.2e}, vs exact "
            f"{rows[-1]['smae_vs_exact']:.2e}; no-LOVE scratch {rows[-2]['scratch_s']:.2f} s",
            flush=True,
        )

    # KissGP with LOVE from scratch on all training points (statistics read all n).
    if data["n_train"] > len(Z):
        t_all, _ = median_time(
            lambda: love_variances(build_kissgp(data["Z_all"], data["Y_all"], hypers, tol), T), 1
        )
        rows.append(
            {**base, "model": "KissGP (all n_train)", "love": True, "rank": None,
             "scratch_s": t_all, "after_precompute_s": None,
             "smae_vs_no_love": None, "smae_vs_exact": None}
        )  # fmt: skip
        print(f"  KissGP LOVE from scratch on all {data['n_train']} points: {t_all:.2f} s")
    for row in rows:
        row["speedup_vs_exact_after_precompute"] = (
            t_solve / row["after_precompute_s"] if row["after_precompute_s"] else None
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--love-tolerance", type=float, default=1e-6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for name in args.datasets.split(","):
        torch.set_grad_enabled(True)  # hyperparameter fitting
        rows.extend(run_dataset(name, args.love_tolerance, args.repeats))
    frame = pd.DataFrame(rows)
    # streamgp's LOVE (the targets); the BoTorch-default exact GP row is reported beside.
    love = frame[frame.love & frame.model.isin(["KissGP", "WiskiGP"])]
    summary = {
        "love_tolerance": args.love_tolerance,
        "max_smae_love_vs_no_love": float(love.smae_vs_no_love.max()),
        "min_speedup_love_vs_exact_after_precompute": float(
            love.speedup_vs_exact_after_precompute.min()
        ),
        "botorch_default_exact_gp_smae_vs_exact": frame.loc[
            frame.model.str.startswith("exact GP (BoTorch"), "smae_vs_exact"
        ].tolist(),
        "targets": {"smae_love_vs_no_love": "<= 1e-4", "speedup_after_precompute": ">= 100x"},
        "setup": __doc__.split("\n\n")[1:3],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "love_variances.csv", index=False)
    (args.out / "love_variances.json").write_text(
        json.dumps(
            {"machine": machine_info(dtype=str(DTYPE)), "summary": summary, "rows": rows}, indent=2
        )
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
