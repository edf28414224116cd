r"""Uniform validation of tensors at the public boundary of streamgp models.

Every check raises ``TypeError`` (wrong type, dtype or device) or ``ValueError``
(wrong shape or values) with a message that names the offending argument. Checks
never modify their inputs, so callers validate everything before touching state.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_tensor(
    value: object,
    name: str,
    *,
    like: Tensor | None = None,
    min_dim: int = 1,
    last_dim: int | None = None,
) -> Tensor:
    r"""Check that ``value`` is a finite floating tensor compatible with ``like``.

    Args:
        value: The object to check.
        name: Argument name used in error messages.
        like: If given, ``value`` must have the same dtype and device.
        min_dim: Minimum number of dimensions.
        last_dim: If given, the required size of the last dimension.

    Returns:
        ``value`` itself.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}.")
    if not value.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {value.dtype}.")
    if like is not None:
        if value.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {value.dtype} but the model uses {like.dtype}.")
        if value.device != like.device:
            raise TypeError(f"{name} is on {value.device} but the model is on {like.device}.")
    if value.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimension(s), got shape {tuple(value.shape)}."
        )
    if last_dim is not None and value.shape[-1] != last_dim:
        raise ValueError(
            f"{name} must have last dimension {last_dim}, got shape {tuple(value.shape)}."
        )
    if not torch.isfinite(value).all():
        raise ValueError(f"{name} contains NaN or Inf values.")
    return value


def check_positive(value: Tensor, name: str) -> Tensor:
    r"""Check that every entry of ``value`` is strictly positive."""
    if not (value > 0).all():
        raise ValueError(
            f"{name} must be strictly positive (noise variances); got min {value.min().item():.3g}."
        )
    return value


def check_targets(Y: Tensor, name: str, num_points: int, batch_ok: bool = False) -> Tensor:
    r"""Check a ``... x n x 1`` target tensor against ``num_points`` rows."""
    if Y.dim() < 2 or Y.shape[-1] != 1:
        raise ValueError(f"{name} must have shape n x 1 (single output), got {tuple(Y.shape)}.")
    if Y.shape[-2] != num_points:
        raise ValueError(f"{name} has {Y.shape[-2]} rows but the inputs have {num_points} points.")
    if not batch_ok and Y.dim() != 2:
        raise ValueError(f"{name} must be 2-dimensional (n x 1), got shape {tuple(Y.shape)}.")
    return Y
