r"""Caches keyed on hyperparameters: rebuild derived factors only when a value changed.

The models cache what predictions need (a grid or inducing-point posterior, local
Cholesky factors, gpytorch's variational caches), detached from the hyperparameters
as gpytorch's ``detach_test_caches``. A cache is valid while every hyperparameter
equals the copy taken when it was built: :func:`parameter_snapshot` takes the copy,
:func:`parameters_unchanged` compares. Comparing values (not versions) catches every
way of changing a hyperparameter: optimizer steps, ``load_state_dict``, assignment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor


def parameter_snapshot(parameters: Iterable[Tensor]) -> list[Tensor]:
    r"""Detached copies of ``parameters``, for :func:`parameters_unchanged`."""
    return [p.detach().clone() for p in parameters]


def parameters_unchanged(current: Sequence[Tensor], snapshot: Sequence[Tensor] | None) -> bool:
    r"""Whether ``current`` holds the same tensors (shapes and values) as ``snapshot``.

    False without a snapshot, or when the number of tensors differs.
    """
    return (
        snapshot is not None
        and len(current) == len(snapshot)
        and all(torch.equal(a, b) for a, b in zip(current, snapshot, strict=True))
    )
