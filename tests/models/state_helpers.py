"""Shared test helpers: a model's observable state, compared bit for bit, and faults.

``fingerprint`` takes what a user can see of a model: its ``state_dict`` (read first: a
WiskiGP folds rows it holds back into it) and its posterior at fixed points; two
models are the same when every tensor of both is bit-identical (NaN equal to NaN).
``assert_same_model`` compares two models that way, on copies (the read folds).
``FailAt`` wraps a function to raise at its k-th call, for fault injection.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


def fingerprint(model: Any, X_test: torch.Tensor) -> dict[str, Any]:
    r"""``state_dict`` (cloned) and posterior mean and variance at ``X_test``."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        posterior = model.posterior(X_test)
        mean, variance = posterior.mean.clone(), posterior.variance.clone()
    return {"state": state, "mean": mean, "variance": variance}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and bool(torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan()))
    )


def assert_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    r"""Assert two :func:`fingerprint` results are bit-identical."""
    assert a["state"].keys() == b["state"].keys(), set(a["state"]) ^ set(b["state"])
    for key in a["state"]:
        assert _same(a["state"][key], b["state"][key]), f"state_dict[{key!r}] differs"
    assert _same(a["mean"], b["mean"]), "posterior mean differs"
    assert _same(a["variance"], b["variance"]), "posterior variance differs"


def assert_same_model(model: Any, reference: Any, X_test: torch.Tensor) -> None:
    r"""``model`` behaves bit for bit as ``reference`` (e.g. a copy taken before a call).

    Compared on copies: reading the state folds a WiskiGP's held-back rows, which would
    change the path (not the result) of the models' next updates.
    """
    assert_identical(
        fingerprint(copy_model(model), X_test), fingerprint(copy_model(reference), X_test)
    )


class FailAt:
    r"""Wrap ``function`` to raise ``error`` at its ``k``-th call (1-based; 0: never).

    ``calls`` counts the calls, so a run with ``k=0`` counts how many there are.
    """

    def __init__(
        self, function: Callable[..., Any], k: int, error: type[BaseException] = RuntimeError
    ) -> None:
        self.function, self.k, self.error, self.calls = function, k, error, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.k:
            raise self.error(f"injected fault at call {self.k}")
        return self.function(*args, **kwargs)


def copy_model(model: Any) -> Any:
    r"""An independent copy of ``model`` (its state, caches and random streams)."""
    return copy.deepcopy(model)
