r"""Pool-based active learning (WISKI paper, section 5.4 and appendix C.3).

A simulator answers queries at the locations of a candidate pool with their value
(and, for fixed-noise models, their known noise variance); a held-out test set
measures the model. Each step chooses ``q`` pool points with an acquisition:

- ``"qnipv"``: BoTorch's ``qNegIntegratedPosteriorVariance`` with integration
  points drawn afresh from the test inputs at every step, chosen greedily from the pool (needs
  fantasies: WISKI, exact GPs);
- ``"maxvar"``: the ``q`` largest posterior variances (for models without fantasies);
- ``"random"``: uniform without replacement.

Chosen points leave the pool. Inputs are scaled to the unit cube with the bounds of
pool and test inputs together (WISKI's default grid bounds). Each record holds the
test RMSE, the number of observations and the seconds spent per phase.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from streamgp.loops.acquisition import (
    POOL_ACQUISITIONS,
    AcquisitionOptions,
    check_acquisition,
    select_from_pool,
)
from streamgp.loops.base import Loop, Stopwatch
from streamgp.loops.surrogates import KernelFactory, check_model_options, make_surrogate
from streamgp.utils.validation import check_positive, check_tensor


class ActiveLearningLoop(Loop):
    r"""Choose pool points to query so as to predict a held-out test set well.

    Args:
        pool_X: ``N x d`` candidate locations.
        pool_Y: ``N x 1`` values the simulator returns.
        test_X: ``T x d`` held-out locations.
        test_Y: ``T x 1`` held-out values.
        pool_Yvar: Optional ``N x 1`` known noise variances (fixed-noise models).
        model: Surrogate name (``"wiski"``, ``"exact"``, ...).
        acquisition: ``"qnipv"``, ``"maxvar"`` or ``"random"`` (or a box
            acquisition such as ``"qucb"`` evaluated on the pool).
        q: Points per step.
        num_init: Random initial queries.
        num_mc_points: Test inputs used as qNIPV's integration points.
        resample_mc_points: Draw fresh integration points from the test inputs at
            every step (default), so that over the run qNIPV integrates the variance
            over the whole test set. With ``False`` one set is drawn once and kept;
            with a short-range kernel the queries then cluster around those few
            points (measured on the malaria atlas: test RMSE worse than random
            selection).
        candidates_per_step: If given, each step chooses among this many pool
            points drawn at random from those left (bounds the acquisition cost on
            large pools); ``None``: the whole pool.
        fit_every: Refit every this many steps (0: only the initial fit).
        fit_max_iter: L-BFGS-B iterations per refit (``None``: BoTorch's default).
        kernel_factory: Optional ``d -> Kernel`` for the surrogate.
        model_options: Further surrogate keyword arguments (e.g. ``grid_size``).
        acquisition_options: Acquisition settings.
        seed: As :class:`~streamgp.loops.base.Loop`.
        device: As :class:`~streamgp.loops.base.Loop`.
        dtype: As :class:`~streamgp.loops.base.Loop`.

    Example:
        >>> X = torch.rand(300, 2, dtype=torch.float64)
        >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
        >>> loop = ActiveLearningLoop(X[:200], Y[:200], X[200:], Y[200:], q=2, num_init=5,
        ...     fit_every=0, fit_max_iter=10, candidates_per_step=32, num_mc_points=32)
        >>> history = loop.run(3)
        >>> history[["step", "num_observations"]].values.tolist()
        [[0, 5], [1, 7], [2, 9], [3, 11]]
    """

    PHASES = ("fit", "acquisition", "update", "evaluate")

    def __init__(
        self,
        pool_X: Tensor,
        pool_Y: Tensor,
        test_X: Tensor,
        test_Y: Tensor,
        *,
        pool_Yvar: Tensor | None = None,
        model: str = "wiski",
        acquisition: str = "qnipv",
        q: int = 6,
        num_init: int = 10,
        num_mc_points: int = 256,
        resample_mc_points: bool = True,
        candidates_per_step: int | None = None,
        fit_every: int = 1,
        fit_max_iter: int | None = None,
        kernel_factory: KernelFactory | None = None,
        model_options: dict[str, Any] | None = None,
        acquisition_options: AcquisitionOptions | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        check_tensor(pool_X, "pool_X", min_dim=2)
        check_tensor(pool_Y, "pool_Y", like=pool_X, min_dim=2, last_dim=1)
        check_tensor(test_X, "test_X", like=pool_X, min_dim=2, last_dim=pool_X.shape[-1])
        check_tensor(test_Y, "test_Y", like=pool_X, min_dim=2, last_dim=1)
        if len(pool_Y) != len(pool_X) or len(test_Y) != len(test_X):
            raise ValueError("pool_Y/test_Y must have one row per row of pool_X/test_X.")
        if pool_Yvar is not None:
            check_tensor(pool_Yvar, "pool_Yvar", like=pool_X, min_dim=2, last_dim=1)
            if len(pool_Yvar) != len(pool_X):
                raise ValueError("pool_Yvar must have one row per row of pool_X.")
            check_positive(pool_Yvar, "pool_Yvar")
        check_model_options(model, model_options)
        check_acquisition(acquisition, q, POOL_ACQUISITIONS)
        if num_init < 1 or num_init + q > len(pool_X):
            raise ValueError(
                f"num_init must be >= 1 and num_init + q <= {len(pool_X)} (the pool size); "
                f"got num_init={num_init}, q={q}."
            )
        super().__init__(seed=seed, device=device, dtype=dtype)
        tk = self.tkwargs
        inputs = torch.cat([pool_X, test_X]).to(**tk)
        self.lower = inputs.min(0).values
        self.scale = (inputs.max(0).values - self.lower).clamp_min(torch.finfo(tk["dtype"]).tiny)
        self.pool_X = self._unit(pool_X.to(**tk))
        self.pool_Y = pool_Y.to(**tk)
        self.pool_Yvar = None if pool_Yvar is None else pool_Yvar.to(**tk)
        self.test_X = self._unit(test_X.to(**tk))
        self.test_Y = test_Y.to(**tk)
        self.model_name = model
        self.acquisition = acquisition
        self.q = int(q)
        self.num_init = int(num_init)
        self.num_mc_points = min(int(num_mc_points), len(test_X))
        self.resample_mc_points = bool(resample_mc_points)
        if candidates_per_step is not None and candidates_per_step < q:
            raise ValueError(f"candidates_per_step must be >= q={q}, got {candidates_per_step}.")
        self.candidates_per_step = candidates_per_step
        self.fit_every = int(fit_every)
        self.fit_max_iter = fit_max_iter
        self.kernel_factory = kernel_factory
        self.model_options = dict(model_options or {})
        self.acquisition_options = acquisition_options or AcquisitionOptions()
        self.available = torch.ones(len(pool_X), dtype=torch.bool, device=self.device)
        self.chosen: list[int] = []
        self.surrogate = None
        self._mc_points = None

    def _unit(self, X: Tensor) -> Tensor:
        # Clamp the round-off of the affine map so that extreme points stay inside.
        return ((X - self.lower) / self.scale).clamp(0.0, 1.0)

    def describe(self) -> str:
        return f"active/{self.model_name}/{self.acquisition}"

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "pool": tuple(self.pool_X.shape),
            "test": tuple(self.test_X.shape),
            "model": self.model_name,
            "acquisition": self.acquisition,
            "q": self.q,
            "num_init": self.num_init,
            "num_mc_points": self.num_mc_points,
            "resample_mc_points": self.resample_mc_points,
        }

    def progress_fields(self, record: dict[str, Any]) -> dict[str, Any]:
        return {"rmse": f"{record['test_rmse']:.3g}", "n": record["num_observations"]}

    # ------------------------------------------------------------------ helpers
    def _query(self, indices: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        self.available[indices] = False
        self.chosen.extend(indices.tolist())
        Yvar = None if self.pool_Yvar is None else self.pool_Yvar[indices]
        return self.pool_X[indices], self.pool_Y[indices], Yvar

    def _record(self, watch: Stopwatch) -> dict[str, Any]:
        with watch("evaluate"), torch.no_grad():
            model = self.surrogate.model
            # One point per t-batch: marginal predictions, no t x t covariances.
            mean = torch.cat(
                [
                    model.posterior(chunk.unsqueeze(-2)).mean.reshape(-1, 1)
                    for chunk in self.test_X.split(4096)
                ]
            )
            rmse = (mean - self.test_Y).pow(2).mean().sqrt().item()
        return {"num_observations": len(self.chosen), "test_rmse": rmse}

    def _fit(self, watch: Stopwatch, step: int) -> None:
        if step == 0 or (self.fit_every and step % self.fit_every == 0):
            with watch("fit"):
                self.surrogate.fit(self.fit_max_iter)

    def _surrogate_options(self) -> dict[str, Any]:
        return {"kernel_factory": self.kernel_factory, **self.model_options}

    # ------------------------------------------------------------------ steps
    def _initialize(self, watch: Stopwatch) -> dict[str, Any]:
        indices = torch.randperm(len(self.pool_X), device=self.device)[: self.num_init]
        X, Y, Yvar = self._query(indices)
        with watch("update"):
            self.surrogate = make_surrogate(
                self.model_name, X, Y, Yvar, **self._surrogate_options()
            )
        self._fit(watch, 0)
        self._draw_mc_points()
        return self._record(watch)

    def _draw_mc_points(self) -> None:
        mc = torch.randperm(len(self.test_X), device=self.device)[: self.num_mc_points]
        self._mc_points = self.test_X[mc]

    def _step(self, watch: Stopwatch) -> dict[str, Any]:
        step = len(self.history)
        if int(self.available.sum()) < self.q:
            raise RuntimeError(f"the pool has fewer than q={self.q} points left.")
        self._fit(watch, step)
        with watch("acquisition"):
            if self.resample_mc_points and self.acquisition == "qnipv":
                self._draw_mc_points()
            candidates = self.available.nonzero().squeeze(-1)
            if self.candidates_per_step is not None and len(candidates) > self.candidates_per_step:
                keep = torch.randperm(len(candidates), device=self.device)
                candidates = candidates[keep[: self.candidates_per_step]].sort().values
            best_f = None
            if self.acquisition in ("qei", "qlogei"):
                best_f = self.pool_Y[self.chosen].max()
            local = select_from_pool(
                self.acquisition,
                self.surrogate.model,
                self.pool_X[candidates],
                self.q,
                best_f=best_f,
                mc_points=self._mc_points,
                options=self.acquisition_options,
            )
        X, Y, Yvar = self._query(candidates[local])
        with watch("update"):
            self.surrogate.update(X, Y, Yvar)
        return self._record(watch)

    # ------------------------------------------------------------------ checkpoints
    def _state(self) -> dict[str, Any]:
        return {
            "surrogate": self.surrogate.state_dict(),
            "chosen": list(self.chosen),
            "mc_points": self._mc_points,
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        self.chosen = []
        self.available[:] = True
        initial = torch.tensor(state["chosen"][: self.num_init], device=self.device)
        X, Y, Yvar = self._query(initial)
        self.surrogate = make_surrogate(self.model_name, X, Y, Yvar, **self._surrogate_options())
        self.surrogate.load_state_dict(state["surrogate"])
        rest = torch.tensor(state["chosen"][self.num_init :], dtype=torch.long)
        self._query(rest.to(self.device))
        self._mc_points = state["mc_points"]
