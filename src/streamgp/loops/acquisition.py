r"""Acquisition functions by name, optimised over a box or chosen from a pool.

The loops name their acquisition with a string (``"qucb"``, ``"ei"``, ``"qei"``,
``"qlogei"``, ``"qnipv"``, ``"random"``, and for pools ``"maxvar"``); this module
builds the BoTorch acquisition function and optimises it with BoTorch's own
optimisers (:func:`~botorch.optim.optimize_acqf` over the unit cube,
:func:`~botorch.optim.optimize_acqf_discrete` over a candidate pool).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from botorch.acquisition import (
    AcquisitionFunction,
    ExpectedImprovement,
    qExpectedImprovement,
    qLogExpectedImprovement,
    qNegIntegratedPosteriorVariance,
    qUpperConfidenceBound,
)
from botorch.models.model import Model
from botorch.optim import optimize_acqf, optimize_acqf_discrete
from torch import Tensor

#: Acquisitions for optimisation over a box (``"random"`` draws uniformly).
BOX_ACQUISITIONS = ("qucb", "ei", "qei", "qlogei", "qnipv", "random")
#: Acquisitions for choosing from a pool (``"maxvar"``: largest posterior variances).
POOL_ACQUISITIONS = ("qnipv", "maxvar", "random", "qucb", "qei", "qlogei")


@dataclass
class AcquisitionOptions:
    r"""Settings of the acquisition step (defaults as the WISKI paper, appendix C.2).

    Attributes:
        num_restarts: L-BFGS-B restarts of ``optimize_acqf``.
        raw_samples: Raw samples for choosing the restarts.
        batch_limit: Restarts optimised jointly.
        maxiter: L-BFGS-B iterations.
        ucb_beta: ``beta`` of qUCB.
        num_mc_points: Integration points of qNIPV when the loop gives none.
        pool_batch_size: Pool candidates evaluated jointly by the discrete optimiser.
    """

    num_restarts: int = 10
    raw_samples: int = 512
    batch_limit: int = 5
    maxiter: int = 200
    ucb_beta: float = 2.0
    num_mc_points: int = 256
    pool_batch_size: int = 256


def check_acquisition(name: str, q: int, choices: tuple[str, ...] = BOX_ACQUISITIONS) -> None:
    r"""Raise ``ValueError`` naming the argument for an unknown name or a bad ``q``."""
    if name not in choices:
        raise ValueError(f"acquisition must be one of {list(choices)}, got {name!r}.")
    if q < 1:
        raise ValueError(f"q must be a positive integer, got {q}.")
    if name == "ei" and q != 1:
        raise ValueError("acquisition 'ei' (analytic EI) needs q=1; use 'qei' or 'qlogei'.")


def build_acquisition(
    name: str,
    model: Model,
    *,
    best_f: Tensor | float | None = None,
    mc_points: Tensor | None = None,
    options: AcquisitionOptions | None = None,
) -> AcquisitionFunction:
    r"""The BoTorch acquisition function called ``name`` (maximised by the optimisers).

    Args:
        name: One of ``"qucb"``, ``"ei"``, ``"qei"``, ``"qlogei"``, ``"qnipv"``.
        model: A BoTorch model (single output).
        best_f: Incumbent for the improvement-based acquisitions.
        mc_points: ``p x d`` integration points for qNIPV.
        options: Acquisition settings.
    """
    options = options or AcquisitionOptions()
    if name == "qucb":
        return qUpperConfidenceBound(model, beta=options.ucb_beta)
    if name in ("ei", "qei", "qlogei"):
        if best_f is None:
            raise ValueError(f"acquisition {name!r} needs best_f.")
        cls = {
            "ei": ExpectedImprovement,
            "qei": qExpectedImprovement,
            "qlogei": qLogExpectedImprovement,
        }[name]
        return cls(model, best_f=best_f)
    if name == "qnipv":
        if mc_points is None:
            raise ValueError("acquisition 'qnipv' needs mc_points.")
        return qNegIntegratedPosteriorVariance(model, mc_points=mc_points)
    raise ValueError(f"acquisition {name!r} is not a model-based acquisition function.")


def optimize_in_unit_cube(
    name: str,
    model: Model,
    q: int,
    dim: int,
    *,
    best_f: Tensor | float | None = None,
    mc_points: Tensor | None = None,
    options: AcquisitionOptions | None = None,
    tkwargs: dict | None = None,
) -> Tensor:
    r"""``q x dim`` candidates in ``[0, 1]^dim`` maximising acquisition ``name``."""
    options = options or AcquisitionOptions()
    tkwargs = tkwargs or {}
    if name == "random":
        return torch.rand(q, dim, **tkwargs)
    acqf = build_acquisition(name, model, best_f=best_f, mc_points=mc_points, options=options)
    bounds = torch.stack([torch.zeros(dim, **tkwargs), torch.ones(dim, **tkwargs)])
    candidates, _ = optimize_acqf(
        acqf,
        bounds=bounds,
        q=q,
        num_restarts=options.num_restarts,
        raw_samples=options.raw_samples,
        options={"batch_limit": options.batch_limit, "maxiter": options.maxiter},
    )
    return candidates.detach()


def select_from_pool(
    name: str,
    model: Model,
    pool: Tensor,
    q: int,
    *,
    best_f: Tensor | float | None = None,
    mc_points: Tensor | None = None,
    options: AcquisitionOptions | None = None,
) -> Tensor:
    r"""Indices of ``q`` distinct pool rows chosen by acquisition ``name``.

    Model-based acquisitions choose greedily (one point at a time, conditioning on
    the pending ones), as :func:`~botorch.optim.optimize_acqf_discrete` does.
    ``"maxvar"`` takes the ``q`` largest posterior variances; ``"random"`` draws
    uniformly without replacement.
    """
    options = options or AcquisitionOptions()
    if q > len(pool):
        raise ValueError(f"q={q} exceeds the {len(pool)} points left in the pool.")
    if name == "random":
        return torch.randperm(len(pool), device=pool.device)[:q]
    if name == "maxvar":
        with torch.no_grad():
            variance = torch.cat(
                [
                    model.posterior(chunk.unsqueeze(-2)).variance.reshape(-1)
                    for chunk in pool.split(options.pool_batch_size * 8)
                ]
            )
        return variance.topk(q).indices
    acqf = build_acquisition(name, model, best_f=best_f, mc_points=mc_points, options=options)
    candidates, _ = optimize_acqf_discrete(
        acqf, q=q, choices=pool, max_batch_size=options.pool_batch_size, unique=True
    )
    # Map the chosen rows back to pool indices (exact copies of pool rows).
    return torch.cdist(candidates, pool).argmin(-1)
