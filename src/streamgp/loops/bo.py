r"""Bayesian optimisation loop over BoTorch test functions (WISKI paper, section 5.3).

The loop works in the unit cube: candidates are mapped to the test function's
bounds only to evaluate it, so every model sees inputs in ``[0, 1]^d`` (WISKI's
default grid bounds). Test functions are maximised (built with ``negate=True``
for minimisation problems, as BoTorch's tutorials do).

Per step: (re)fit the surrogate (every ``fit_every`` steps, warm-started), optimise
the acquisition function, evaluate the noisy objective at the ``q`` candidates
and absorb them into the surrogate. The record of each step has the best true
(noiseless) objective value among the evaluated points, the regret where the
optimum is known, and the seconds spent fitting, optimising and updating.

Reference: Stanton, Maddox, Delbridge, Wilson, "Kernel Interpolation for Scalable
Online Gaussian Processes", AISTATS 2021, section 5.3 and appendix C.2.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.test_functions import (
    Ackley,
    Griewank,
    Hartmann,
    Levy,
    Michalewicz,
    Rastrigin,
    Rosenbrock,
    StyblinskiTang,
)
from botorch.test_functions.synthetic import SyntheticTestFunction
from torch import Tensor

from streamgp.loops.acquisition import (
    AcquisitionOptions,
    check_acquisition,
    optimize_in_unit_cube,
)
from streamgp.loops.base import Loop, Stopwatch
from streamgp.loops.surrogates import check_model_options, make_surrogate

#: Test functions of the WISKI paper's BO experiments with their noise sd (appendix C.2).
TEST_FUNCTIONS: dict[str, tuple[type[SyntheticTestFunction], float]] = {
    "levy": (Levy, 10.0),
    "ackley": (Ackley, 4.0),
    "styblinskitang": (StyblinskiTang, 20.0),
    "rastrigin": (Rastrigin, 10.0),
    "griewank": (Griewank, 4.0),
    "michalewicz": (Michalewicz, 5.0),
    # Not in the WISKI paper: a standard higher-dimensional benchmark (d = 3, 4 or 6) for
    # models without a grid (SoftKI); noise sd 0.1 of its range of about 3.3.
    "hartmann": (Hartmann, 0.1),
    # Not in the WISKI paper: one of BoTorch's d-dimensional benchmarks for the high-d table
    # (benchmarks/bo_high_dim.py); noise sd 10, as Levy's, on a valley floor near 0.
    "rosenbrock": (Rosenbrock, 10.0),
}
#: The six noisy 3-D functions of the WISKI paper's BO experiments.
PAPER_FUNCTIONS = ("levy", "ackley", "styblinskitang", "rastrigin", "griewank", "michalewicz")


def make_test_function(
    name: str, dim: int = 3, noise_std: float | None = None
) -> SyntheticTestFunction:
    r"""A noisy, negated (to be maximised) BoTorch test function by name.

    Args:
        name: A key of ``TEST_FUNCTIONS`` (case-insensitive).
        dim: Input dimension.
        noise_std: Observation noise sd (default: the paper's value for ``name``).
    """
    key = name.lower()
    if key not in TEST_FUNCTIONS:
        raise ValueError(f"function must be one of {sorted(TEST_FUNCTIONS)}, got {name!r}.")
    cls, default_noise = TEST_FUNCTIONS[key]
    return cls(dim=dim, noise_std=default_noise if noise_std is None else noise_std, negate=True)


def known_optimum(objective: SyntheticTestFunction) -> float | None:
    r"""The objective's optimal value (as maximised), or ``None`` where BoTorch knows none.

    BoTorch raises ``NotImplementedError`` for, e.g., Michalewicz in 3-D, whose optimum
    it only tabulates for 2, 5 and 10 dimensions.
    """
    try:
        optimum = objective.optimal_value
    except (AttributeError, NotImplementedError):
        return None
    return None if optimum is None else float(optimum)


class BayesOptLoop(Loop):
    r"""Bayesian optimisation of a BoTorch test function with a streamgp/BoTorch surrogate.

    Args:
        objective: A BoTorch ``SyntheticTestFunction`` to maximise (noisy through
            its ``noise_std``; the record uses its noiseless values).
        model: Surrogate name (``"wiski"``, ``"exact"``, ...; see ``streamgp.models.registry``).
        acquisition: ``"qucb"``, ``"ei"`` (analytic, q=1), ``"qei"``, ``"qlogei"``,
            ``"qnipv"`` or ``"random"``.
        q: Batch size.
        num_init: Size of the random initial design.
        fit_every: Refit hyperparameters every this many steps (0: never refit after
            the initial fit).
        fit_max_iter: L-BFGS-B iterations per refit (``None``: BoTorch's default).
        acquisition_options: Settings of ``optimize_acqf``.
        model_options: Keyword arguments of the surrogate (e.g. ``grid_size``).
        seed: Seed of the loop's private RNG stream.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: Floating dtype.

    Example:
        >>> from streamgp.loops import AcquisitionOptions, BayesOptLoop, make_test_function
        >>> loop = BayesOptLoop(make_test_function("levy"), model="wiski", q=3,
        ...     fit_max_iter=10,  # small settings, to run quickly
        ...     acquisition_options=AcquisitionOptions(num_restarts=2, raw_samples=32))
        >>> history = loop.run(2)
        >>> history[["step", "num_observations"]].values.tolist()
        [[0, 5], [1, 8], [2, 11]]
        >>> bool((history["best_value"].diff().dropna() >= 0).all())  # never gets worse
        True
    """

    def __init__(
        self,
        objective: SyntheticTestFunction,
        *,
        model: str = "wiski",
        acquisition: str = "qucb",
        q: int = 3,
        num_init: int = 5,
        fit_every: int = 1,
        fit_max_iter: int | None = None,
        acquisition_options: AcquisitionOptions | None = None,
        model_options: dict[str, Any] | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        check_model_options(model, model_options)
        check_acquisition(acquisition, q)
        if num_init < 1:
            raise ValueError(f"num_init must be >= 1, got {num_init}.")
        if fit_every < 0:
            raise ValueError(f"fit_every must be >= 0, got {fit_every}.")
        super().__init__(seed=seed, device=device, dtype=dtype)
        self.objective = objective.to(**self.tkwargs)
        self.model_name = model
        self.acquisition = acquisition
        self.q = int(q)
        self.num_init = int(num_init)
        self.fit_every = int(fit_every)
        self.fit_max_iter = fit_max_iter
        self.acquisition_options = acquisition_options or AcquisitionOptions()
        self.model_options = dict(model_options or {})
        self.dim = objective.dim
        self.surrogate = None
        self.best_value = None
        self.best_observed = None
        self.num_observations = 0
        self._mc_points = None

    def describe(self) -> str:
        return f"{type(self.objective).__name__}/{self.model_name}/{self.acquisition}"

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "objective": type(self.objective).__name__,
            "dim": self.dim,
            "model": self.model_name,
            "acquisition": self.acquisition,
            "q": self.q,
            "num_init": self.num_init,
        }

    def progress_fields(self, record: dict[str, Any]) -> dict[str, Any]:
        return {"best": f"{record['best_value']:.3g}", "n": record["num_observations"]}

    # ------------------------------------------------------------------ helpers
    def _evaluate(self, X_unit: Tensor) -> tuple[Tensor, Tensor]:
        r"""Noisy and true objective values at unit-cube inputs."""
        bounds = self.objective.bounds
        X = bounds[0] + (bounds[1] - bounds[0]) * X_unit
        with torch.no_grad():
            noisy = self.objective(X, noise=True)
            true = self.objective(X, noise=False)
        return noisy.unsqueeze(-1), true.unsqueeze(-1)

    def _record(self, Y: Tensor, F: Tensor) -> dict[str, Any]:
        self.num_observations += len(Y)
        batch_best, batch_observed = F.max().item(), Y.max().item()
        self.best_value = (
            batch_best if self.best_value is None else max(self.best_value, batch_best)
        )
        self.best_observed = (
            batch_observed
            if self.best_observed is None
            else max(self.best_observed, batch_observed)
        )
        record = {
            "num_observations": self.num_observations,
            "best_value": self.best_value,
            "best_observed": self.best_observed,
        }
        optimum = known_optimum(self.objective)
        record["regret"] = float("nan") if optimum is None else optimum - self.best_value
        return record

    def _fit(self, watch: Stopwatch, step: int) -> None:
        if step == 0 or (self.fit_every and step % self.fit_every == 0):
            with watch("fit"):
                self.surrogate.fit(self.fit_max_iter)

    # ------------------------------------------------------------------ steps
    def _initialize(self, watch: Stopwatch) -> dict[str, Any]:
        X = torch.rand(self.num_init, self.dim, **self.tkwargs)
        Y, F = self._evaluate(X)
        with watch("update"):
            self.surrogate = make_surrogate(self.model_name, X, Y, **self.model_options)
        self._fit(watch, 0)
        if self.acquisition == "qnipv":
            self._mc_points = torch.rand(
                self.acquisition_options.num_mc_points, self.dim, **self.tkwargs
            )
        return self._record(Y, F)

    def _step(self, watch: Stopwatch) -> dict[str, Any]:
        step = len(self.history)
        self._fit(watch, step)
        with watch("acquisition"):
            model = self.surrogate.model
            best_f = None
            if self.acquisition in ("ei", "qei", "qlogei"):
                # Incumbent: the best posterior mean at the observed points is not
                # available without O(n) storage, so use the best noisy observation.
                best_f = torch.tensor(self.best_observed, **self.tkwargs)
            X = optimize_in_unit_cube(
                self.acquisition,
                model,
                self.q,
                self.dim,
                best_f=best_f,
                mc_points=self._mc_points,
                options=self.acquisition_options,
                tkwargs=self.tkwargs,
            )
        Y, F = self._evaluate(X)
        with watch("update"):
            self.surrogate.update(X, Y)
        return self._record(Y, F)

    # ------------------------------------------------------------------ checkpoints
    def _state(self) -> dict[str, Any]:
        return {
            "surrogate": self.surrogate.state_dict(),
            "best_value": self.best_value,
            "best_observed": self.best_observed,
            "num_observations": self.num_observations,
            "mc_points": self._mc_points,
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        # Build a surrogate of the right kind and shape, then overwrite its state.
        with torch.random.fork_rng(devices=self._rng_devices()):
            X = torch.rand(self.num_init, self.dim, **self.tkwargs)
            Y = torch.rand(self.num_init, 1, **self.tkwargs)
            self.surrogate = make_surrogate(self.model_name, X, Y, **self.model_options)
        self.surrogate.load_state_dict(state["surrogate"])
        self.best_value = state["best_value"]
        self.best_observed = state["best_observed"]
        self.num_observations = state["num_observations"]
        self._mc_points = state["mc_points"]
