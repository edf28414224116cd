r"""LOVE joint posterior samples on UCI data (an analogue of Pleiss et al. 2018, Table 3).

Same data, projection, subsample S (n_S = min(n_train, 4000)), shared hyperparameters
and 10^4 test points as ``benchmarks/love_variances.py`` (see its docstring). For each
dataset, 1000 joint posterior samples of the latent function at the 10^4 test points:

- LOVE: ``KissGP`` and ``WiskiGP`` (64 x 64 grid) under
  ``gpytorch.settings.fast_pred_samples()``: ``posterior(T).rsample`` draws
  ``mean + (W_* R_k) z`` with ``z`` of dimension ``k`` (the LOVE rank for
  ``love_tolerance``, default 1e-6);
- Cholesky: the exact GP on S. The 10^4 x 10^4 predictive covariance is formed from a
  Cholesky factor of ``K_SS + s2 I``, factorised (with the smallest diagonal jitter,
  ``1e-10 * mean variance`` raised 10x per failure, that succeeds; it is recorded), and
  the samples are ``mean + L z``.

Accuracy: on a subset of 500 of the test points, the relative Frobenius error
``|C_hat - C|_F / |C|_F`` of each sample covariance (1000 samples) against the exact GP
covariance ``C``; the same error of the Cholesky samples is the Monte Carlo floor. The
deterministic errors of the SKI covariance (no LOVE) and of the LOVE root covariance
are reported too. Times: "from scratch" (everything, from the training data) and
"after precompute" (LOVE: warm caches; exact GP: Cholesky of ``K_SS + s2 I`` given).
float64, one torch thread. Results: ``benchmarks/results/love_sampling.{json,csv}``.

Usage: ``python benchmarks/love_sampling.py [--datasets a,b] [--love-tolerance 1e-6]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gpytorch
import pandas as pd
import torch
from love_variances import (
    DATASETS,
    DTYPE,
    ExactCholesky,
    build_kissgp,
    build_wiski,
    fit_hyperparameters,
    machine_info,
    median_time,
    prepare,
)

N_SAMPLES, N_SUBSET_COV = 1000, 500


def rel_frobenius(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    return (
        torch.linalg.matrix_norm(estimate - reference) / torch.linalg.matrix_norm(reference)
    ).item()


def sample_covariance(samples: torch.Tensor) -> torch.Tensor:
    centered = samples - samples.mean(0)
    return centered.T @ centered / (len(samples) - 1)


def love_samples(model, T, num: int) -> torch.Tensor:
    with gpytorch.settings.fast_pred_samples():
        return model.posterior(T).rsample(torch.Size([num])).squeeze(-1)


def exact_joint(exact: ExactCholesky, T: torch.Tensor, Y: torch.Tensor):
    """Exact GP predictive mean and t x t covariance from the training Cholesky factor."""
    K_st = exact.kernel(exact.Z, T).to_dense()
    V = torch.linalg.solve_triangular(exact.L, K_st, upper=False)
    alpha = torch.cholesky_solve(Y, exact.L)
    mean = (K_st.T @ alpha).squeeze(-1)
    covar = exact.kernel(T).to_dense()
    covar.addmm_(V.T, V, alpha=-1.0)
    return mean, covar


def cholesky_samples(exact: ExactCholesky, T, Y, num: int, gen: torch.Generator):
    """Joint samples by a Cholesky factor of the t x t predictive covariance."""
    mean, covar = exact_joint(exact, T, Y)
    scale = covar.diagonal().mean()
    eps = 1e-10
    while True:
        L, info = torch.linalg.cholesky_ex(covar + eps * scale * torch.eye(len(T), dtype=DTYPE))
        if info == 0:
            break
        eps *= 10
    z = torch.randn(len(T), num, generator=gen, dtype=DTYPE)
    return (mean.unsqueeze(-1) + L @ z).T, eps


def run_dataset(name: str, tol: float, repeats: int) -> list[dict]:
    data = prepare(name)
    Z, Y, T = data["Z"], data["Y"], data["T"]
    hypers = fit_hyperparameters(Z, Y, data["gen"])
    torch.set_grad_enabled(False)
    sub = slice(0, N_SUBSET_COV)
    base = {"dataset": name, "n_train": data["n_train"], "n_S": len(Z), "t": len(T)}
    gen = torch.Generator().manual_seed(1)

    # Exact GP, Cholesky sampling.
    start = time.perf_counter()
    exact = ExactCholesky(Z, hypers)
    t_train_chol = time.perf_counter() - start
    start = time.perf_counter()
    samples, jitter = cholesky_samples(exact, T, Y, N_SAMPLES, gen)
    t_exact_after = time.perf_counter() - start
    _, C_exact = exact_joint(exact, T[sub], Y)
    chol_err = rel_frobenius(sample_covariance(samples[:, sub]), C_exact)
    del samples
    rows = [
        {**base, "model": "exact GP (Cholesky)", "rank": None,
         "scratch_s": t_train_chol + t_exact_after, "after_precompute_s": t_exact_after,
         "sample_cov_err_vs_exact": chol_err, "root_cov_err_vs_ski": None,
         "ski_cov_err_vs_exact": None, "relative_jitter": jitter}
    ]  # fmt: skip
    print(
        f"{name}: exact Cholesky sampling {t_exact_after:.1f} s (+{t_train_chol:.1f} s), "
        f"jitter {jitter:.0e}, sample-cov error {chol_err:.3f}",
        flush=True,
    )
    for label, builder in [("KissGP", build_kissgp), ("WiskiGP", build_wiski)]:
        t_scratch, (model, _) = median_time(
            lambda builder=builder: (
                m := builder(Z, Y, hypers, tol),
                love_samples(m, T, N_SAMPLES),
            ),
            repeats,
        )
        t_after, samples = median_time(lambda m=model: love_samples(m, T, N_SAMPLES), repeats)
        with gpytorch.settings.fast_pred_var():
            love_post = model.posterior(T[sub])
            rank = love_post.distribution.lazy_covariance_matrix.root.shape[-1]
            C_root = love_post.covariance_matrix
        C_ski = model.posterior(T[sub]).covariance_matrix  # no LOVE
        rows.append(
            {**base, "model": label, "rank": rank, "scratch_s": t_scratch,
             "after_precompute_s": t_after,
             "sample_cov_err_vs_exact": rel_frobenius(sample_covariance(samples[:, sub]), C_exact),
             "root_cov_err_vs_ski": rel_frobenius(C_root, C_ski),
             "ski_cov_err_vs_exact": rel_frobenius(C_ski, C_exact), "relative_jitter": None}
        )  # fmt: skip
        r = rows[-1]
        print(
            f"  {label}: rank {rank}, scratch {t_scratch:.2f} s, after {t_after:.3f} s, "
            f"sample-cov error {r['sample_cov_err_vs_exact']:.3f}, root vs SKI "
            f"{r['root_cov_err_vs_ski']:.1e}, SKI vs exact {r['ski_cov_err_vs_exact']:.1e}",
            flush=True,
        )
    for row in rows:
        row["speedup_vs_exact_after_precompute"] = t_exact_after / row["after_precompute_s"]
    torch.set_grad_enabled(True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--love-tolerance", type=float, default=1e-6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for name in args.datasets.split(","):
        rows.extend(run_dataset(name, args.love_tolerance, args.repeats))
    frame = pd.DataFrame(rows)
    love = frame[frame.model.isin(["KissGP", "WiskiGP"])]
    summary = {
        "love_tolerance": args.love_tolerance,
        "num_samples": N_SAMPLES,
        "num_test_points": int(frame.t.iloc[0]),
        "min_speedup_love_vs_cholesky_after_precompute": float(
            love.speedup_vs_exact_after_precompute.min()
        ),
        "target_speedup": ">= 100x",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "love_sampling.csv", index=False)
    (args.out / "love_sampling.json").write_text(
        json.dumps(
            {"machine": machine_info(dtype=str(DTYPE)), "summary": summary, "rows": rows}, indent=2
        )
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
