r"""One command for a GPU: the CUDA tests, then WISKI's speed on the device, in one report.

Sections, in order (each writes its results as soon as it ends, so a run stopped at a
time limit keeps what it finished; one that fails records its error and the next runs):

1. ``tests``: ``tests/test_cuda.py``, ``tests/test_device_sync.py`` and
   ``tests/utils/test_cuda_graphs.py`` (CPU and CUDA cases);
2. ``update_scaling``: WISKI (3-D, RBF, fixed hyperparameters) on ``--grids`` (16^3 and
   32^3 points) at ``--sizes`` (n = 10^3 ... 10^6), float32 and float64: the build, and per step of
   ``hot_path_ops.STEPS`` (posterior; condition + predict; observe + predict) the median
   synchronised time, with the kernel launches, host synchronisations and memory copies
   per call, averaged over 12 calls (torch.profiler); the exact GP (``SingleTaskGP``)
   beside it, from n = 10 (BoTorch's own floor for the same step) to 10^4;
   ``hot_paths``: the same counts on a 16^3 grid at n = 10^5 with and without
   ``skip_value_checks`` (``hot_path_ops.measure``);
   ``cuda_graphs``: the posterior (16 points) and the posterior's value + gradient at an
   acquisition batch (10 x 3 points) on a 16^3 grid at n = 10^5, eager and under
   :class:`streamgp.settings.cuda_graphs`, with launches and syncs per call;
3. ``mll``: the marginal likelihood's value + gradient (``WoodburyMarginalLogLikelihood``,
   ``ScaleKernel(RBF)``): 16^3 at n = 10^4 and 10^5, 32^3 (structured) at 10^4 in float64
   and float32, and the exact GP at 10^4;
4. ``acquisition``: ``optimize_acqf`` (qUCB, q = 3, 10 restarts, 512 raw samples): time
   per posterior call, WISKI at n = 3000 (eager and under ``cuda_graphs``) against
   BoTorch's floor (``SingleTaskGP`` at n = 10);
5. ``malaria``: active learning on the malaria atlas (qNIPV, q = 6), WISKI and the exact
   GP, time per step;
6. ``bo_from_3000``: Levy-3 qUCB from 3000 random points, WISKI and the exact GP;
7. ``levy_from_5``: the WISKI paper's GPU experiment (Levy-3, qUCB, from 5 points),
   time per step against n, for ``--levy-steps`` steps per model.

Writes ``<out>/<gpu-name>.json`` and ``<out>/<gpu-name>.md`` (``--out`` defaults to
``benchmarks/results/gpu``), which the docs' GPU page (docs/gpu.md) quotes. ``--device cpu --quick``
is the dry run of the same code without a GPU (the CUDA tests then skip).

The defaults (grids 16^3 and 32^3, n = 10^3, 10^5, 10^6, ``--levy-steps 6``, ``--bo-steps 3``,
4 test workers) are sized for 5 minutes on an H100 from the sections' measured times (the
tests took 80-101 s with 4 workers and 125-135 s with 6 or 8; three grids and four sizes took
168 s, two of each 63-68 s); ``--sections levy_from_5 --levy-steps 20`` runs the paper's
experiment alone for longer (20 steps: 166 s).

Usage: ``python benchmarks/gpu_check.py [--quick] [--levy-steps 6] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from botorch.acquisition import qUpperConfidenceBound
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.optim.closures import get_loss_closure
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.means import ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from hot_path_ops import (
    STEPS,
    build,
    data,
    measure,
    op_counts,
    step_inputs,
    with_fixed_hyperparameters,
)

from streamgp import WiskiGP, WoodburyMarginalLogLikelihood
from streamgp.settings import cuda_graphs
from streamgp.utils.machine import device_label, machine_info, median_seconds, synchronize

REPO = Path(__file__).resolve().parents[1]
D = 3
#: Calls whose operations are counted together (see :func:`_time_steps`).
COUNTED_CALLS = 12


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    r"""Median synchronised milliseconds of ``repeats`` calls (after one warm-up call)."""
    return 1e3 * median_seconds(fn, repeats=repeats, warmup=True)


# -- 1. the CUDA tests ------------------------------------------------------------------


def run_tests(args, tkwargs) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_cuda.py",
            "tests/test_device_sync.py",
            "tests/utils/test_cuda_graphs.py",
            "-rf",
            "--tb=short",
            f"--junitxml={junit}",
        ]
        try:
            import xdist  # noqa: F401

            command += ["-n", str(args.test_workers)]
        except ImportError:
            pass
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
        completed = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.test_timeout
        )
        suite = ElementTree.parse(junit).getroot()
    (args.out / "pytest.log").write_text(completed.stdout[-500_000:] + completed.stderr[-50_000:])
    cases = list(suite.iter("testcase"))
    failed = {}
    for case in cases:
        for tag in ("failure", "error"):
            problem = case.find(tag)
            if problem is not None:
                name = f"{case.get('classname')}::{case.get('name')}"
                failed[name] = (problem.get("message") or "")[:400]
    skipped = sum(case.find("skipped") is not None for case in cases)
    on_cuda = [case for case in cases if "cuda" in case.get("name")]
    return {
        "cuda cases": len(on_cuda),
        "cuda cases skipped": sum(case.find("skipped") is not None for case in on_cuda),
        "command": " ".join(command[1:]),
        "returncode": completed.returncode,
        "collected": len(cases),
        "passed": len(cases) - len(failed) - skipped,
        "failed": len(failed),
        "skipped": skipped,
        "failures": failed,
        "summary": completed.stdout.strip().splitlines()[-1:] if completed.stdout else [],
    }


# -- 2. update scaling -----------------------------------------------------------------


def _exact(n: int, tkwargs: dict) -> SingleTaskGP:
    X, Y = data(n, tkwargs)
    model = SingleTaskGP(X, Y, covar_module=RBFKernel(ard_num_dims=D), outcome_transform=None)
    return with_fixed_hyperparameters(model, X)


def _time_steps(model, steps: list[str], tkwargs: dict, repeats: int) -> dict:
    row = {}
    device = torch.device(tkwargs["device"])
    for name in steps:
        step = STEPS[name]
        inputs = step_inputs(tkwargs, seed=3)

        def call(step=step, inputs=inputs):
            return step(model, inputs)

        with torch.no_grad():
            row[f"{name} ms"] = median_ms(call, repeats)
            # Per call, averaged over COUNTED_CALLS: observe folds its held rows into the
            # statistics every FOLD_RANK rows, so one call alone may or may not hold a fold.
            counts = op_counts(lambda call=call: [call() for _ in range(COUNTED_CALLS)], device)
        row.update({f"{name} {key}": value / COUNTED_CALLS for key, value in counts.items()})
    return row


def update_scaling(args, tkwargs, report) -> list[dict]:
    rows = []
    dtypes = ["float32", "float64"]
    grids = [int(g) for g in args.grids.split(",")]
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.quick:
        grids, sizes = [g for g in grids if g <= 16], [n for n in sizes if n <= 10_000]
    for dtype in dtypes:
        tk = {**tkwargs, "dtype": getattr(torch, dtype)}
        for grid in grids:
            for n in sizes:
                synchronize()
                start = time.perf_counter()
                model = build(n, grid, tk)
                synchronize()
                row = {"model": f"wiski {grid}^3", "dtype": dtype, "n": n}
                row["build s"] = time.perf_counter() - start
                row.update(_time_steps(model, list(STEPS), tk, args.repeats))
                rows.append(row)
                print(row, flush=True)
                report(rows)
                del model
        # n = 10: BoTorch's own floor for the same step (its Python and launch overhead).
        for n in [10, 1_000, 4_000] if args.quick else [10, 1_000, 4_000, 10_000]:
            model = _exact(n, tk)
            row = {"model": "exact", "dtype": dtype, "n": n}
            row.update(_time_steps(model, ["posterior", "condition + predict"], tk, args.repeats))
            rows.append(row)
            print(row, flush=True)
            report(rows)
            del model
    return rows


def hot_paths(args, tkwargs, report) -> list[dict]:
    rows = []
    for dtype in ("float32", "float64"):
        tk = {**tkwargs, "dtype": getattr(torch, dtype)}
        rows += [
            {"dtype": dtype, **row} for row in measure(1_000 if args.quick else 100_000, 16, tk)
        ]
        report(rows)
    return rows


def _graphs_rows(args, tkwargs: dict) -> list[dict]:
    r"""Eager and graphed posterior timings of one 16^3 model in ``tkwargs``' dtype."""
    device = torch.device(tkwargs["device"])
    model = build(1_000 if args.quick else 100_000, 16, tkwargs)
    generator = torch.Generator().manual_seed(5)
    X = torch.rand(16, D, generator=generator, dtype=tkwargs["dtype"]).to(device)
    X_batch = torch.rand(10, 3, D, generator=generator, dtype=tkwargs["dtype"]).to(device)

    def posterior():
        with torch.no_grad():
            posterior = model.posterior(X)
            return posterior.mean, posterior.variance

    def value_and_grad():
        X_grad = X_batch.clone().requires_grad_(True)
        posterior = model.posterior(X_grad)
        return torch.autograd.grad(posterior.mean.sum() + posterior.variance.sum(), X_grad)

    rows = []
    for on in (False, True):
        row = {"dtype": str(tkwargs["dtype"]).removeprefix("torch."), "cuda_graphs": on}
        with cuda_graphs(on):
            for name, fn in (("posterior", posterior), ("posterior + grad", value_and_grad)):
                row[f"{name} ms"] = median_ms(fn, args.repeats)
                counts = op_counts(lambda fn=fn: [fn() for _ in range(COUNTED_CALLS)], device)
                row.update(
                    {f"{name} {key}": value / COUNTED_CALLS for key, value in counts.items()}
                )
        rows.append(row)
        print(row, flush=True)
    return rows


def graphs(args, tkwargs, report) -> list[dict]:
    rows = []
    for dtype in ("float32", "float64"):
        rows += _graphs_rows(args, {**tkwargs, "dtype": getattr(torch, dtype)})
        report(rows)
    return rows


# -- 3. marginal likelihood ------------------------------------------------------------


def mll_model(grid: int, n: int, tkwargs: dict) -> WiskiGP:
    r"""The marginal likelihood's benchmark model: ``n`` points, ``ScaleKernel(RBF)``, zero
    mean, ``grid^3`` points (structured above ``WiskiGP.MAX_DENSE_GRID`` points)."""
    X, Y = data(n, tkwargs)
    return WiskiGP(
        X,
        Y,
        grid_size=grid,
        covar_module=ScaleKernel(RBFKernel(ard_num_dims=D)).to(**tkwargs),
        outcome_transform=None,
        mean_module=ZeroMean(),
    )


def mll_value_and_grad(
    model, mll_class: type = WoodburyMarginalLogLikelihood
) -> Callable[[], object]:
    r"""One call: the negative marginal likelihood (as BoTorch's fit evaluates it) and its
    gradient in every hyperparameter."""
    mll = mll_class(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    closure = get_loss_closure(mll)
    return lambda: torch.autograd.grad(closure(), params)


def mll(args, tkwargs, report) -> list[dict]:
    rows = []
    cases = [(16, 10_000, "float64"), (16, 100_000, "float64"), (32, 10_000, "float64")]
    cases.append((32, 10_000, "float32"))
    if args.quick:
        cases = [(10, 1_000, "float64"), (10, 1_000, "float32")]
    for grid, n, dtype in cases:
        model = mll_model(grid, n, {**tkwargs, "dtype": getattr(torch, dtype)})
        value_grad = median_ms(mll_value_and_grad(model), args.mll_repeats)
        rows.append(
            {
                "model": f"wiski {grid}^3",
                "dtype": dtype,
                "n": n,
                "structured": model.structured,
                "ms": value_grad,
            }
        )
        print(rows[-1], flush=True)
        report(rows)
    n = 1_000 if args.quick else 10_000
    X, Y = data(n, tkwargs)
    exact = SingleTaskGP(X, Y, outcome_transform=None)
    value_grad = median_ms(mll_value_and_grad(exact, ExactMarginalLogLikelihood), args.mll_repeats)
    rows.append(
        {"model": "exact", "dtype": "float64", "n": n, "structured": False, "ms": value_grad}
    )
    report(rows)
    return rows


# -- 4. acquisition --------------------------------------------------------------------


def acquisition(args, tkwargs, report) -> list[dict]:
    rows = []
    bounds = torch.stack([torch.zeros(D), torch.ones(D)]).to(**tkwargs)
    n_wiski = 300 if args.quick else 3_000
    for name, n, graphed in [
        ("exact", 10, False),
        ("wiski", n_wiski, False),
        ("wiski", n_wiski, True),
    ]:
        model = _exact(n, tkwargs) if name == "exact" else build(n, 10, tkwargs)
        calls = []
        posterior = model.posterior

        def counted(*a, posterior=posterior, calls=calls, **kw):
            calls.append(1)
            return posterior(*a, **kw)

        model.posterior = counted
        sampler = SobolQMCNormalSampler(sample_shape=torch.Size([128]), seed=0)
        acqf = qUpperConfidenceBound(model, beta=2.0, sampler=sampler)
        restarts, raw = (2, 64) if args.quick else (10, 512)
        synchronize()
        start = time.perf_counter()
        with cuda_graphs(graphed):
            optimize_acqf(acqf, bounds, q=3, num_restarts=restarts, raw_samples=raw)
        synchronize()
        seconds = time.perf_counter() - start
        rows.append(
            {
                "model": name + (" (cuda_graphs)" if graphed else ""),
                "n": n,
                "optimize_acqf s": seconds,
                "posterior calls": len(calls),
                "ms per posterior call": 1e3 * seconds / max(len(calls), 1),
            }
        )
        print(rows[-1], flush=True)
        report(rows)
    return rows


# -- 5-7. loops ------------------------------------------------------------------------


def _per_model(results, columns=("step_time",)) -> dict:
    out = {}
    for model, frame in results.groupby("model"):
        timed = frame[frame["step"] > 0]
        out[model] = {
            "steps": int(timed["step"].max()) if len(timed) else 0,
            "n first": int(frame["num_observations"].iloc[0]),
            "n last": int(frame["num_observations"].iloc[-1]),
            **{_label(c): float(timed[c].mean()) for c in columns if c in timed},
        }
    return out


def _label(column: str) -> str:
    return f"mean {column}" + (" s" if column.endswith("time") else "")


def _windows(results, width: int = 10) -> list[dict]:
    r"""Mean time per step over consecutive windows of ``width`` steps, with n."""
    rows = []
    timed = results[results["step"] > 0]
    for (model, _), frame in timed.groupby(["model", (timed["step"] - 1) // width]):
        rows.append(
            {
                "model": model,
                "steps": f"{frame['step'].min()}-{frame['step'].max()}",
                "n": int(frame["num_observations"].iloc[-1]),
                "mean step s": float(frame["step_time"].mean()),
            }
        )
    return rows


def malaria(args, tkwargs, report) -> dict:
    from streamgp.loops.experiments import (
        malaria_kernel,
        malaria_pool_and_test,
        run_active_experiment,
    )

    pool_X, pool_Y, pool_Yvar, test_X, test_Y = malaria_pool_and_test()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_active_experiment(
            pool_X,
            pool_Y,
            test_X,
            test_Y,
            pool_Yvar,
            name="malaria_gpu",
            models=["wiski", "exact"],
            acquisitions=["qnipv"],
            steps=3 if args.quick else 30,
            q=6,
            num_init=10,
            num_mc_points=128,
            candidates_per_step=256,
            fit_every=10,
            kernel_factory=malaria_kernel,
            model_options={"wiski": {"grid_size": 30}},
            device=str(tkwargs["device"]),
            out=tmp,
            progress=False,
            plots=False,
        )
    summary = _per_model(results, ("step_time", "test_rmse"))
    report(summary)
    return summary


def _levy(tkwargs, num_init: int, steps: int, report) -> dict:
    from streamgp.loops.experiments import run_bo_experiment

    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("wiski", "exact"):
            frames.append(
                run_bo_experiment(
                    "levy",
                    models=[model],
                    acquisition="qucb",
                    steps=steps,
                    q=3,
                    num_init=num_init,
                    fit_every=10,
                    device=str(tkwargs["device"]),
                    out=Path(tmp) / model,
                    progress=False,
                    plots=False,
                )
            )
            results = pd.concat(frames, ignore_index=True)
            summary = _per_model(
                results, ("step_time", "fit_time", "acquisition_time", "update_time")
            )
            columns = ["model", "step", "num_observations", "step_time", "best_value"]
            summary["per step"] = results[columns].to_dict(orient="list")
            summary["windows"] = _windows(results)
            report(summary)
    return summary


def bo_from_3000(args, tkwargs, report) -> dict:
    return _levy(tkwargs, 300 if args.quick else 3_000, 2 if args.quick else args.bo_steps, report)


def levy_from_5(args, tkwargs, report) -> dict:
    return _levy(tkwargs, 5, 3 if args.quick else args.levy_steps, report)


# -- the report ------------------------------------------------------------------------


def _table(rows: list[dict], columns: list[str]) -> list[str]:
    def cell(value):
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


#: Entries of a loop's summary that are not a model's row.
_DETAIL = ("per step", "windows")


def markdown(results: dict) -> str:
    machine = results["machine"]
    lines = [
        f"# GPU check: {machine.get('gpu', machine['device'])}",
        "",
        f"torch {machine['torch']}, gpytorch {machine['gpytorch']}, botorch "
        f"{machine['botorch']}; {results.get('elapsed s', 0):.0f} s in all. "
        "Written by `benchmarks/gpu_check.py`.",
        "",
    ]
    sections = results["sections"]
    for name, section in sections.items():
        lines += [f"## {name} ({section.get('seconds', 0):.0f} s)", ""]
        if "error" in section:
            lines += ["```", section["error"][-2000:], "```", ""]
        value = section.get("result")
        if name == "tests" and value:
            lines += [
                f"{value['passed']} passed, {value['failed']} failed, {value['skipped']} "
                f"skipped of {value['collected']}; {value['cuda cases']} CUDA cases, "
                f"{value['cuda cases skipped']} of them skipped (`{value['command']}`).",
                "",
            ]
            lines += [f"- `{test}`: {message}" for test, message in value["failures"].items()]
        elif isinstance(value, list) and value:
            columns = list(dict.fromkeys(key for row in value for key in row))
            lines += _table(value, columns)
        elif isinstance(value, dict):
            rows = [{"model": k, **v} for k, v in value.items() if k not in _DETAIL]
            columns = list(dict.fromkeys(key for row in rows for key in row))
            lines += _table(rows, columns)
            if value.get("windows"):
                lines += ["", "Time per step against n:", ""]
                lines += _table(value["windows"], list(value["windows"][0]))
        lines.append("")
    return "\n".join(lines)


#: In the order they run by default: the CUDA-graph sections last, since a failed
#: capture can leave the process's CUDA random-number state unusable.
SECTIONS = {
    "tests": run_tests,
    "update_scaling": update_scaling,
    "hot_paths": hot_paths,
    "mll": mll,
    "malaria": malaria,
    "bo_from_3000": bo_from_3000,
    "levy_from_5": levy_from_5,
    "cuda_graphs": graphs,
    "acquisition": acquisition,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes (a dry run)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per step")
    parser.add_argument("--grids", default="16,32", help="update_scaling's grid sizes")
    parser.add_argument("--sizes", default="1000,100000,1000000", help="update_scaling's n values")
    parser.add_argument("--mll-repeats", type=int, default=5)
    parser.add_argument("--levy-steps", type=int, default=6, help="Levy-3 steps from 5 points")
    parser.add_argument("--bo-steps", type=int, default=3, help="Levy-3 steps from 3,000 points")
    parser.add_argument("--test-workers", type=int, default=4)
    parser.add_argument("--test-timeout", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    tkwargs = {"dtype": torch.float64, "device": torch.device(args.device)}
    machine = machine_info(args.device)
    name = device_label(machine)
    if args.quick:
        name += "-quick"
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine, "arguments": vars(args) | {"out": str(args.out)}}
    results["sections"] = {}
    began = time.perf_counter()

    def write() -> None:
        results["elapsed s"] = time.perf_counter() - began
        (args.out / f"{name}.json").write_text(json.dumps(results, indent=2, default=str))
        (args.out / f"{name}.md").write_text(markdown(results))

    for section in args.sections.split(","):
        entry = results["sections"][section] = {}
        start = time.perf_counter()

        def report(partial, entry=entry, start=start) -> None:
            entry["result"], entry["seconds"] = partial, time.perf_counter() - start
            write()

        print(f"== {section}", flush=True)
        try:
            function = SECTIONS[section]
            arguments = (args, tkwargs) if section == "tests" else (args, tkwargs, report)
            entry["result"] = function(*arguments)
        except Exception:
            entry["error"] = traceback.format_exc()
            print(entry["error"], flush=True)
        entry["seconds"] = time.perf_counter() - start
        write()
    print(markdown(results))


if __name__ == "__main__":
    main()
