r"""Seeded synthetic datasets with known ground truth, for tests and quick demos.

They return the same :class:`~streamgp.datasets.TabularData` as the file loaders,
so everything downstream (splits, scaling, the streaming protocol) can be exercised
without data files. Inputs are deliberately *not* in ``[-1, 1]`` so that the
scaling step matters.

Example:
    >>> from streamgp.datasets import synthetic_classification, synthetic_regression
    >>> synthetic_regression(100, d=3, seed=0).X.shape
    torch.Size([100, 3])
    >>> synthetic_classification(50, seed=0).Y.dtype
    torch.int64
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from streamgp.datasets.loaders import TabularData, _check_dtype
from streamgp.datasets.registry import CLASSIFICATION, REGRESSION
from streamgp.utils.validation import check_count

SYNTHETIC_LOW, SYNTHETIC_HIGH = 0.0, 10.0


def synthetic_function(X: Tensor) -> Tensor:
    r"""The noiseless regression function: ``sum_i sin(0.6 x_i) + 0.5 cos(0.3 x_0 x_{d-1})``.

    Smooth on ``[0, 10]^d`` with a few oscillations per dimension, so a GP with a
    moderate lengthscale fits it well.

    Args:
        X: ``... x d`` inputs.

    Returns:
        ``... x 1`` function values.
    """
    value = torch.sin(0.6 * X).sum(dim=-1) + 0.5 * torch.cos(0.3 * X[..., 0] * X[..., -1])
    return value.unsqueeze(-1)


def synthetic_regression(
    n: int,
    d: int = 2,
    noise_std: float = 0.1,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> TabularData:
    r"""``n`` uniform inputs on ``[0, 10]^d`` and noisy :func:`synthetic_function` targets.

    Args:
        n: Number of rows.
        d: Input dimension.
        noise_std: Standard deviation of the Gaussian observation noise (>= 0).
        seed: Seed of a private generator (the global RNG is untouched).
        dtype: Floating dtype of the tensors.
        device: Device of the tensors.
    """
    check_count(n, "n", minimum=1)
    check_count(d, "d", minimum=1)
    _check_dtype(dtype)
    if not isinstance(noise_std, int | float) or not noise_std >= 0 or math.isinf(noise_std):
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}.")
    generator = torch.Generator().manual_seed(seed)
    X = SYNTHETIC_LOW + (SYNTHETIC_HIGH - SYNTHETIC_LOW) * torch.rand(
        n, d, generator=generator, dtype=torch.float64
    )
    Y = synthetic_function(X) + noise_std * torch.randn(n, 1, generator=generator, dtype=X.dtype)
    return TabularData(
        name=f"synthetic-regression-{d}d",
        task=REGRESSION,
        X=X.to(dtype=dtype, device=device),
        Y=Y.to(dtype=dtype, device=device),
    )


def synthetic_classification(
    n: int,
    num_classes: int = 2,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> TabularData:
    r"""2-D classification with smooth class boundaries, labels ``0..num_classes-1``.

    Inputs are uniform on ``[0, 10]^2``; the label is the index of the largest of
    ``num_classes`` phase-shifted smooth functions (``sin(0.6 x_0 + 2 pi k / C) +
    cos(0.5 x_1 - pi k / C)``), so every class occupies contiguous regions.

    Args:
        n: Number of rows.
        num_classes: Number of classes (>= 2).
        seed: Seed of a private generator.
        dtype: Floating dtype of ``X``.
        device: Device of the tensors.
    """
    check_count(n, "n", minimum=1)
    check_count(num_classes, "num_classes", minimum=2)
    _check_dtype(dtype)
    generator = torch.Generator().manual_seed(seed)
    X = SYNTHETIC_LOW + (SYNTHETIC_HIGH - SYNTHETIC_LOW) * torch.rand(
        n, 2, generator=generator, dtype=torch.float64
    )
    shift = torch.arange(num_classes, dtype=X.dtype) / num_classes
    scores = torch.sin(0.6 * X[:, :1] + 2 * math.pi * shift) + torch.cos(
        0.5 * X[:, 1:] - math.pi * shift
    )
    return TabularData(
        name=f"synthetic-classification-{num_classes}c",
        task=CLASSIFICATION,
        X=X.to(dtype=dtype, device=device),
        Y=scores.argmax(dim=-1).to(device=device),
    )
