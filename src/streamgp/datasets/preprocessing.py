r"""Train/test splits and scaling for the online regression/classification protocol.

Data preparation as in appendix C.1 of Stanton, Maddox, Delbridge & Wilson, "Kernel
Interpolation for Scalable Online Gaussian Processes" (AISTATS 2021):

- if the source has no train/test split, a seeded random 10% of the rows form the
  test set (banana and svmguide1 keep the split they ship with);
- inputs are scaled to ``[-1, 1]^d`` and regression targets standardized to zero
  mean and unit variance, both with statistics of the *training* rows only (so no
  test information leaks into the stream; test inputs can fall slightly outside
  ``[-1, 1]``);
- the first 5% of the (shuffled) training rows are for pretraining, the remaining
  95% are streamed one at a time.

The statistics are kept on the returned :class:`StreamingSplit`, so predictions
can be reported in original units.

Example:
    >>> from streamgp.datasets import make_streaming_split, synthetic_regression
    >>> split = make_streaming_split(synthetic_regression(200, seed=1), seed=0)
    >>> split.train_X.shape, split.test_X.shape, split.num_pretrain
    (torch.Size([180, 2]), torch.Size([20, 2]), 9)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from streamgp.datasets.loaders import TabularData, _check_dtype, load_dataset
from streamgp.datasets.registry import CLASSIFICATION, REGRESSION


@dataclass(frozen=True)
class StreamingSplit:
    r"""A dataset prepared for streaming: scaled train/test tensors and their statistics.

    The training rows are in stream order (a seeded shuffle): the first
    ``num_pretrain`` are the pretraining set, the rest arrive one at a time.

    Attributes:
        name: Dataset name.
        task: ``"regression"`` or ``"classification"``.
        seed: Seed of the split and shuffle.
        train_X: ``n_train x d`` inputs scaled to ``[-1, 1]``.
        train_Y: ``n_train x 1`` standardized targets, or ``n_train`` labels.
        test_X: ``n_test x d`` inputs scaled with the training statistics.
        test_Y: ``n_test x 1`` standardized targets, or ``n_test`` labels.
        num_pretrain: Number of leading training rows used for pretraining.
        x_min: ``d`` minima of the training inputs (they map to -1).
        x_max: ``d`` maxima of the training inputs (they map to +1). A constant
            column ``c`` gets ``x_min, x_max = c - 1, c + 1``, so it maps to 0.
        y_mean: Training target mean (``1 x 1``), ``None`` for classification.
        y_std: Training target standard deviation (``1 x 1``), ``None`` for
            classification.
        train_index: Row indices of the training rows in the source, stream order.
        test_index: Row indices of the test rows in the source.
    """

    name: str
    task: str
    seed: int
    train_X: Tensor
    train_Y: Tensor
    test_X: Tensor
    test_Y: Tensor
    num_pretrain: int
    x_min: Tensor
    x_max: Tensor
    y_mean: Tensor | None
    y_std: Tensor | None
    train_index: Tensor
    test_index: Tensor

    @property
    def pretrain_X(self) -> Tensor:
        r"""Pretraining inputs (a view of the first ``num_pretrain`` training rows)."""
        return self.train_X[: self.num_pretrain]

    @property
    def pretrain_Y(self) -> Tensor:
        return self.train_Y[: self.num_pretrain]

    @property
    def online_X(self) -> Tensor:
        r"""Inputs streamed after pretraining (a view), in stream order."""
        return self.train_X[self.num_pretrain :]

    @property
    def online_Y(self) -> Tensor:
        return self.train_Y[self.num_pretrain :]

    @property
    def num_features(self) -> int:
        return self.train_X.shape[-1]

    @property
    def num_classes(self) -> int | None:
        r"""``1 + max label`` over train and test, or ``None`` for regression."""
        if self.task != CLASSIFICATION:
            return None
        return int(torch.cat([self.train_Y, self.test_Y]).max().item()) + 1

    def scale_X(self, X: Tensor) -> Tensor:
        r"""Scale raw inputs with the training statistics (as ``train_X`` was)."""
        return _scale(X, self.x_min.to(X), self.x_max.to(X))

    def unscale_X(self, X: Tensor) -> Tensor:
        r"""Map scaled inputs back to raw units."""
        x_min, x_max = self.x_min.to(X), self.x_max.to(X)
        return (X + 1) / 2 * (x_max - x_min) + x_min

    def unstandardize_Y(self, Y: Tensor) -> Tensor:
        r"""Map standardized targets (or predictive means) back to original units.

        A predictive standard deviation maps by ``* y_std``; an RMSE likewise, and
        a Gaussian NLL per point by ``+ log(y_std)``.
        """
        if self.y_mean is None:
            raise ValueError(f"{self.name!r} is a classification split: labels are not scaled.")
        return Y * self.y_std.to(Y) + self.y_mean.to(Y)


def _scale(X: Tensor, x_min: Tensor, x_max: Tensor) -> Tensor:
    # This form maps x_min to exactly -1 and x_max to exactly +1 in floating point.
    return 2 * (X - x_min) / (x_max - x_min) - 1


def _check_fraction(value: float, name: str) -> None:
    if not isinstance(value, int | float) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}.")


def make_streaming_split(
    data: TabularData,
    seed: int = 0,
    *,
    test_fraction: float = 0.1,
    pretrain_fraction: float = 0.05,
    use_source_split: bool = True,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> StreamingSplit:
    r"""Split, scale and order a dataset for the online protocol (WISKI appendix C.1).

    Args:
        data: A loaded dataset (:func:`~streamgp.datasets.load_dataset`).
        seed: Seed of the test split (when drawn) and of the stream order.
        test_fraction: Fraction of rows held out when the source has no split.
        pretrain_fraction: Fraction of the training rows used for pretraining
            (at least one row).
        use_source_split: Keep the source's train/test split when it has one
            (banana, svmguide1); if false, draw one as for regression data.
        dtype: Floating dtype of the outputs (default: that of ``data.X``).
        device: Device of the outputs (default: that of ``data.X``).

    Returns:
        The split (see :class:`StreamingSplit`). The same ``data`` and ``seed``
        always give the same split, on any device.

    Example:
        >>> from streamgp.datasets import load_dataset  # doctest: +SKIP
        >>> split = make_streaming_split(load_dataset("powerplant"), seed=3)  # doctest: +SKIP
        >>> model = WiskiGP(split.pretrain_X, split.pretrain_Y)  # doctest: +SKIP
    """
    if not isinstance(data, TabularData):
        raise TypeError(f"data must be a TabularData, got {type(data).__name__}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}.")
    _check_fraction(test_fraction, "test_fraction")
    _check_fraction(pretrain_fraction, "pretrain_fraction")
    dtype = data.X.dtype if dtype is None else dtype
    _check_dtype(dtype)
    device = data.X.device if device is None else torch.device(device)
    n = len(data)

    # Index bookkeeping on the CPU with a CPU generator: identical splits everywhere.
    generator = torch.Generator().manual_seed(seed)
    if use_source_split and data.is_test is not None:
        is_test = data.is_test.cpu()
        test_index = torch.nonzero(is_test).squeeze(-1)
        train_pool = torch.nonzero(~is_test).squeeze(-1)
        train_index = train_pool[torch.randperm(train_pool.numel(), generator=generator)]
    else:
        perm = torch.randperm(n, generator=generator)
        num_test = round(test_fraction * n)
        test_index = perm[:num_test].sort().values
        train_index = perm[num_test:]
    if train_index.numel() < 2 or test_index.numel() < 1:
        raise ValueError(
            f"{data.name!r} has {n} rows: too few for a split with at least 2 training rows "
            f"and 1 test row (test_fraction={test_fraction})."
        )
    num_pretrain = max(1, round(pretrain_fraction * train_index.numel()))

    # Statistics in float64 on the training rows only, then cast.
    X64 = data.X.detach().cpu().to(torch.float64)
    train_X64, test_X64 = X64[train_index], X64[test_index]
    x_min, x_max = train_X64.min(dim=0).values, train_X64.max(dim=0).values
    # A constant column carries no information; map it to 0 instead of dividing by 0.
    constant = x_max <= x_min
    x_min, x_max = torch.where(constant, x_min - 1, x_min), torch.where(constant, x_max + 1, x_max)
    # Inside [x_min, x_max] the rounding of _scale stays within [-1, 1]; clamp to be sure.
    train_X = _scale(train_X64, x_min, x_max).clamp(-1.0, 1.0)
    test_X = _scale(test_X64, x_min, x_max)
    Y = data.Y.detach().cpu()
    y_mean = y_std = None
    if data.task == REGRESSION:
        Y64 = Y.to(torch.float64)
        train_Y64 = Y64[train_index]
        y_mean = train_Y64.mean(dim=0, keepdim=True)
        y_std = train_Y64.std(dim=0, keepdim=True)
        y_std = torch.where(y_std > 0, y_std, torch.ones_like(y_std))
        train_Y = ((train_Y64 - y_mean) / y_std).to(dtype=dtype, device=device)
        test_Y = ((Y64[test_index] - y_mean) / y_std).to(dtype=dtype, device=device)
        y_mean, y_std = y_mean.to(dtype=dtype, device=device), y_std.to(dtype=dtype, device=device)
    else:
        train_Y, test_Y = Y[train_index].to(device), Y[test_index].to(device)

    def out(t: Tensor) -> Tensor:
        return t.to(dtype=dtype, device=device)

    return StreamingSplit(
        name=data.name,
        task=data.task,
        seed=seed,
        train_X=out(train_X),
        train_Y=train_Y,
        test_X=out(test_X),
        test_Y=test_Y,
        num_pretrain=num_pretrain,
        x_min=out(x_min),
        x_max=out(x_max),
        y_mean=y_mean,
        y_std=y_std,
        train_index=train_index.to(device),
        test_index=test_index.to(device),
    )


def load_streaming_split(
    name: str,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = False,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    **kwargs,
) -> StreamingSplit:
    r""":func:`~streamgp.datasets.load_dataset` followed by :func:`make_streaming_split`.

    Example:
        >>> split = load_streaming_split("skillcraft", seed=0)  # doctest: +SKIP
    """
    data = load_dataset(name, data_dir, download=download, dtype=dtype, device=device)
    return make_streaming_split(data, seed, **kwargs)


# ------------------------------------------------ SoftKI's Table 1 protocol on any arrays
@dataclass(frozen=True)
class StandardizedSplit:
    r"""A random train/test split standardised with the training statistics.

    The SoftKI paper's Table 1 protocol (Camaño & Huang 2024, section 5.1): inputs
    and targets shifted and scaled by the training rows' mean and (unbiased) standard
    deviation, so test RMSE and NLL are in standardised target units.

    Attributes:
        train_X: ``n_train x d`` standardised inputs.
        train_Y: ``n_train x 1`` standardised targets.
        test_X: ``n_test x d`` inputs standardised with the training statistics.
        test_Y: ``n_test x 1`` targets standardised with the training statistics.
        x_mean: ``d`` training input means.
        x_std: ``d`` training input standard deviations (1 for a constant column).
        y_mean: Training target mean (a scalar tensor).
        y_std: Training target standard deviation (a scalar tensor; 1 if constant).
        train_index: Row indices of the training rows in the source.
        test_index: Row indices of the test rows in the source.
    """

    train_X: Tensor
    train_Y: Tensor
    test_X: Tensor
    test_Y: Tensor
    x_mean: Tensor
    x_std: Tensor
    y_mean: Tensor
    y_std: Tensor
    train_index: Tensor
    test_index: Tensor

    def unstandardize_Y(self, Y: Tensor) -> Tensor:
        r"""Map standardised targets (or predictive means) back to original units.

        A predictive standard deviation or an RMSE maps by ``* y_std``, a Gaussian NLL
        per point by ``+ log(y_std)``.
        """
        return Y * self.y_std.to(Y) + self.y_mean.to(Y)


def _as_float64(value: object, name: str) -> Tensor:
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{name} must be a numeric array or tensor ({error}).") from None
    if not (tensor.dtype.is_floating_point or tensor.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{name} must be numeric, got dtype {tensor.dtype}.")
    tensor = tensor.detach().cpu().to(torch.float64)
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} contains NaN or Inf values.")
    return tensor


def make_standardized_split(
    X: Tensor | object,
    Y: Tensor | object,
    seed: int = 0,
    *,
    train_fraction: float = 0.9,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> StandardizedSplit:
    r"""The SoftKI paper's Table 1 split of your own arrays: seeded, standardised.

    A seeded random permutation of the rows; the first ``int(train_fraction * n)``
    train, the rest test (``torch.randperm`` with a CPU generator seeded by ``seed``:
    the same split on every machine). Inputs and targets are standardised with the
    *training* rows' mean and unbiased standard deviation (a constant column is
    shifted only). ``benchmarks/softki_uci.py`` uses it for elevators and protein and
    for ``--data file.csv --target column``.

    Args:
        X: ``n x d`` inputs (a tensor or anything ``torch.as_tensor`` takes: numpy,
            lists).
        Y: ``n`` or ``n x 1`` targets.
        seed: Seed of the permutation.
        train_fraction: Fraction of the rows that train, in ``(0, 1)``.
        dtype: Floating dtype of the outputs (default: ``X``'s if floating, else
            float64). The statistics are computed in float64.
        device: Device of the outputs (default: ``X``'s for a tensor, else the CPU).

    Returns:
        The :class:`StandardizedSplit`.

    Raises:
        TypeError: If ``X`` or ``Y`` is not numeric, or ``seed`` not an int.
        ValueError: On wrong shapes, NaN/Inf, a bad ``train_fraction``, or fewer than
            2 training rows or 1 test row.

    Example:
        >>> X = torch.rand(50, 3, dtype=torch.float64)
        >>> Y = X.sum(-1, keepdim=True)
        >>> split = make_standardized_split(X, Y, seed=0)
        >>> split.train_X.shape, split.test_Y.shape
        (torch.Size([45, 3]), torch.Size([5, 1]))
        >>> bool(split.train_Y.mean().abs() < 1e-12)
        True
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}.")
    _check_fraction(train_fraction, "train_fraction")
    X64, Y64 = _as_float64(X, "X"), _as_float64(Y, "Y")
    if X64.dim() != 2:
        raise ValueError(f"X must be n x d, got shape {tuple(X64.shape)}.")
    if Y64.dim() == 2 and Y64.shape[-1] == 1:
        Y64 = Y64.squeeze(-1)
    if Y64.shape != X64.shape[:1]:
        raise ValueError(
            f"Y must be n or n x 1 with n = {len(X64)} (X's rows), got shape "
            f"{tuple(torch.as_tensor(Y).shape)}."
        )
    if dtype is None:
        dtype = X.dtype if isinstance(X, Tensor) and X.dtype.is_floating_point else torch.float64
    _check_dtype(dtype)
    if device is None:
        device = X.device if isinstance(X, Tensor) else torch.device("cpu")
    n = len(X64)
    n_train = int(n * train_fraction)
    if n_train < 2 or n - n_train < 1:
        raise ValueError(
            f"X has {n} rows: too few for train_fraction={train_fraction} (at least 2 "
            "training rows and 1 test row)."
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    train, test = order[:n_train], order[n_train:]
    x_mean, x_std = X64[train].mean(0), X64[train].std(0)
    x_std = torch.where(x_std > 0, x_std, torch.ones_like(x_std))
    y_mean, y_std = Y64[train].mean(), Y64[train].std()
    y_std = torch.where(y_std > 0, y_std, torch.ones_like(y_std))

    def out(t: Tensor) -> Tensor:
        return t.to(dtype=dtype, device=device)

    return StandardizedSplit(
        train_X=out((X64[train] - x_mean) / x_std),
        train_Y=out((Y64[train] - y_mean) / y_std).unsqueeze(-1),
        test_X=out((X64[test] - x_mean) / x_std),
        test_Y=out((Y64[test] - y_mean) / y_std).unsqueeze(-1),
        x_mean=out(x_mean),
        x_std=out(x_std),
        y_mean=out(y_mean),
        y_std=out(y_std),
        train_index=train.to(device),
        test_index=test.to(device),
    )
