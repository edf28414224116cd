r"""Time of one BO update in 6-20 dimensions as the data grow: additive WISKI vs exact GP.

The high-dimensional sibling of ``update_scaling.py``. Models (``d``-D inputs in
``[0, 1]^d``, an additive kernel ``sum_i s_i k_RBF(x_i, x_i')`` over singleton groups,
fixed hyperparameters: lengthscale 0.3, output scale ``1 / d`` per group, noise 0.01,
learned-constant mean at 0, no outcome transform):

- ``additive_wiski``: :class:`~streamgp.AdditiveWiskiGP` (default singleton groups and
  grids: 64 points per group up to ``d = 10``, ``m = 64 d``; 32 at ``d = 20``, ``m = 640``)
  for n = 10^2 ... 10^5;
- ``exact``: BoTorch ``SingleTaskGP`` with the same additive kernel for n <= 4000
  (gpytorch's default settings, as in ``update_scaling.py``).

Timed operations, each the median over repeats (taken round-robin over n, the first
dropped; by default 21 per update and 6 per likelihood for WISKI, 3 for the exact GP),
with the mean also recorded:

- ``condition``: ``condition_on_observations(X_q, Y_q)`` (q = 3) followed by
  ``posterior(X_test)`` at 16 points with mean and variance evaluated (both models);
- ``observe``: ``observe(X_q, Y_q)`` (in place, the streaming update) followed by the
  same posterior (``additive_wiski`` only). Every call adds fresh points, so the model
  grows by ``3 * repeats``; pending batches are folded into the root every
  ``FOLD_RANK / q`` calls, which the mean includes and the median mostly does not;
- ``mll_grad``: the marginal likelihood and its gradient: ``model.fit_objective()[0]``
  then ``.backward()`` (``additive_wiski``), ``ExactMarginalLogLikelihood`` on the
  training data then ``.backward()`` (``exact``, in training mode).

Build time (construction, hyperparameters, the first prediction) is reported
separately. Results go to ``benchmarks/results/additive_update_scaling.{json,csv}``.

Usage: ``python benchmarks/additive_update_scaling.py [--quick] [--dims 6,10,20]
[--repeats R] [--device cuda] [--sizes 100,...] [--exact-sizes 100,...] [--out DIR]``. Every
timing ends with a device synchronisation, so on CUDA it measures the work, not its launch; a
run on a GPU writes ``additive_update_scaling-<gpu-name>.{json,csv}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import gpytorch
import pandas as pd
import torch
from botorch.models import SingleTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp import AdditiveWiskiGP
from streamgp.models.additive_wiski import additive_kernel, check_groups
from streamgp.utils.machine import device_label, machine_info, synchronize

Q, T = 3, 16
LENGTHSCALE, NOISE = 0.3, 0.01


def data(n, d, tkwargs):
    X = torch.rand(n, d, **tkwargs)
    return X, torch.sin(3 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, **tkwargs)


def time_update(model, d, tkwargs, repeats, streaming=False):
    """Seconds of ``repeats`` updates (condition on / observe q points, then predict at T)."""
    times = []
    for _ in range(repeats):
        Xq, Yq = data(Q, d, tkwargs)
        Xs = torch.rand(T, d, **tkwargs)
        synchronize()
        start = time.perf_counter()
        if streaming:
            updated = model.observe(Xq, Yq)
        else:
            updated = model.condition_on_observations(Xq, Yq)
        post = updated.posterior(Xs)
        post.mean, post.variance  # noqa: B018 (force evaluation)
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def time_mll(model, repeats):
    """Seconds of ``repeats`` marginal likelihood evaluations with their gradients."""
    times = []
    with torch.enable_grad():
        for _ in range(repeats):
            model.zero_grad(set_to_none=True)
            synchronize()
            start = time.perf_counter()
            if isinstance(model, AdditiveWiskiGP):
                value = model.fit_objective()[0]
            else:
                mll = ExactMarginalLogLikelihood(model.likelihood, model)
                X = model.train_inputs[0]
                value = mll(model(X), model.train_targets)
            value.backward()
            synchronize()
            times.append(time.perf_counter() - start)
    return times


def set_hyperparameters(model):
    parts = model.covar_module.kernels
    for part in parts:
        part.base_kernel.lengthscale = LENGTHSCALE
        part.outputscale = 1.0 / len(parts)
    model.likelihood.noise = NOISE


def build(kind, n, d, tkwargs):
    X, Y = data(n, d, tkwargs)
    if kind == "additive_wiski":
        model = AdditiveWiskiGP(X, Y, outcome_transform=None)
    else:
        # The same additive kernel as AdditiveWiskiGP's default (a scaled RBF per dimension).
        kernel = additive_kernel(check_groups("singletons", d), like=X)
        model = SingleTaskGP(X, Y, covar_module=kernel, outcome_transform=None)
    set_hyperparameters(model)
    model.eval()
    model.posterior(X[:2]).variance  # noqa: B018 (warm the prediction caches)
    return model


def git_commit():
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return None, None
    return commit or None, bool(dirty)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--dims", default="6,10,20", help="input dimensions, comma-separated")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--repeats", type=int, default=None, help="timings per size and op")
    parser.add_argument("--device", default="cpu", help="torch device (timings synchronised)")
    parser.add_argument("--sizes", default=None, help="additive WISKI's n values, comma-separated")
    parser.add_argument("--exact-sizes", default=None, help="the exact GP's n values")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tkwargs = {"dtype": torch.float64, "device": torch.device(args.device)}
    torch.manual_seed(0)
    dims = [int(v) for v in args.dims.split(",")]
    sizes = {"additive_wiski": [100, 1000, 10_000, 100_000], "exact": [100, 1000, 4000]}
    # The exact GP at n = 4000, d = 20 takes ~20 s per update and ~50 s per likelihood
    # gradient here, and the WISKI likelihood at m = 1280 some seconds: fewer repeats.
    repeats = {"additive_wiski": 21, "exact": 3}
    mll_repeats = {"additive_wiski": 6, "exact": 3}
    ops = {
        "additive_wiski": ["condition", "mll_grad", "observe"],
        "exact": ["condition", "mll_grad"],
    }
    if args.quick:
        sizes = {"additive_wiski": [100, 1000], "exact": [100, 300]}
        repeats = mll_repeats = {"additive_wiski": 4, "exact": 3}
    if args.repeats is not None:
        repeats = mll_repeats = dict.fromkeys(repeats, args.repeats)
    for kind, given in (("additive_wiski", args.sizes), ("exact", args.exact_sizes)):
        if given is not None:
            sizes[kind] = [int(v) for v in given.split(",") if v]
    rows = []
    torch.set_grad_enabled(False)  # updates: prediction caches without autograd graphs
    for d in dims:
        for kind, ns in sizes.items():
            # All sizes of one model are built first and then timed round-robin (one call
            # per size per round), so drifts in the shared machine's load affect every n
            # alike. The ops run one after another: conditioning and the likelihood on
            # the model as built, then observe (which changes it in place).
            models, build_s = {}, {}
            for n in ns:
                start = time.perf_counter()
                models[n] = build(kind, n, d, tkwargs)
                synchronize()
                build_s[n] = time.perf_counter() - start
                print(f"d={d:>2} {kind:>14} n={n:>7}: built in {build_s[n]:.2f} s", flush=True)
            for op in ops[kind]:
                if op == "mll_grad" and kind == "exact":
                    for model in models.values():
                        model.train()
                times = {n: [] for n in ns}
                for _ in range((mll_repeats if op == "mll_grad" else repeats)[kind]):
                    for n in ns:
                        if op == "mll_grad":
                            times[n].extend(time_mll(models[n], 1))
                        else:
                            streaming = op == "observe"
                            times[n].extend(time_update(models[n], d, tkwargs, 1, streaming))
                for n in ns:
                    kept = times[n][1:]
                    model = models[n]
                    row = {
                        "d": d,
                        "model": kind,
                        "op": op,
                        "n": n,
                        "median_ms": 1e3 * statistics.median(kept),
                        "mean_ms": 1e3 * statistics.fmean(kept),
                        "repeats": len(kept),
                        "build_s": build_s[n],
                        "dtype": "float64",
                    }
                    if kind == "additive_wiski":
                        row["grid_points"] = model.interpolation.num_grid
                        row["space"] = "data" if model.in_data_space else "grid"
                    rows.append(row)
                    print(
                        f"d={d:>2} {kind:>14} {op:>9} n={n:>7}: {row['median_ms']:9.2f} ms "
                        f"(mean {row['mean_ms']:.2f})",
                        flush=True,
                    )
            del models
    frame = pd.DataFrame(rows)
    med = {(r.d, r.model, r.op, r.n): r.median_ms for r in frame.itertuples()}
    summary = {}
    for d in dims:
        for op in ("condition", "observe", "mll_grad"):
            ns = sorted(n for (dd, k, o, n) in med if dd == d and k == "additive_wiski" and o == op)
            if len(ns) > 1:
                ratio = (
                    med[(d, "additive_wiski", op, ns[-1])] / med[(d, "additive_wiski", op, ns[0])]
                )
                summary[f"d{d}_wiski_{op}_t_max_n_over_t_min_n"] = ratio
        for op in ("condition", "mll_grad"):
            common = sorted(
                n
                for (dd, k, o, n) in med
                if dd == d and k == "exact" and o == op and (d, "additive_wiski", op, n) in med
            )
            for n in common:
                summary[f"d{d}_exact_over_wiski_{op}_n{n}"] = (
                    med[(d, "exact", op, n)] / med[(d, "additive_wiski", op, n)]
                )
            cheaper = [
                n for n in common if med[(d, "additive_wiski", op, n)] < med[(d, "exact", op, n)]
            ]
            # Smallest measured n from which on (every larger measured n too) WISKI is cheaper.
            from_n = next(
                (n for i, n in enumerate(common) if all(m in cheaper for m in common[i:])), None
            )
            summary[f"d{d}_wiski_cheaper_{op}_from_n"] = from_n
    commit, src_dirty = git_commit()
    machine = machine_info(
        args.device,
        dtype="float64",
        git_commit=commit,
        src_uncommitted_changes=src_dirty,
        max_cholesky_size=gpytorch.settings.max_cholesky_size.value(),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "additive_update_scaling" + ("_quick" if args.quick else "")
    if tkwargs["device"].type != "cpu":
        stem += "-" + device_label(machine)
    frame.to_csv(args.out / f"{stem}.csv", index=False)
    (args.out / f"{stem}.json").write_text(
        json.dumps({"machine": machine, "summary": summary, "rows": rows}, indent=2)
    )
    table = frame.pivot_table(index=["d", "model", "op"], columns="n", values="median_ms")
    print("\nmedian ms per call (rows: d, model, op; columns: n)")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
