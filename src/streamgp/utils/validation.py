r"""Uniform validation of tensors at the public boundary of streamgp models.

Every check raises ``TypeError`` (wrong type, dtype or device) or ``ValueError``
(wrong shape or values) with a message that names the offending argument. Checks
never modify their inputs, so callers validate everything before touching state.
"""

from __future__ import annotations

import math

import torch
from botorch.models.transforms.input import AffineInputTransform, ChainedInputTransform
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood
from torch import Tensor

from streamgp.settings import value_check, value_check_all


def check_tensor(
    value: object,
    name: str,
    *,
    like: Tensor | None = None,
    min_dim: int = 1,
    last_dim: int | None = None,
    finite: bool = True,
) -> Tensor:
    r"""Check that ``value`` is a finite floating tensor compatible with ``like``.

    Args:
        value: The object to check.
        name: Argument name used in error messages.
        like: If given, ``value`` must have the same dtype and device.
        min_dim: Minimum number of dimensions.
        last_dim: If given, the required size of the last dimension.
        finite: Whether to check that every value is finite here (False: the caller
            makes a check of the values that also refuses NaN and Inf).

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
    if finite:
        value_check_all(
            torch.isfinite(value).all(), lambda: ValueError(f"{name} contains NaN or Inf values.")
        )
    return value


def check_positive(value: Tensor, name: str) -> Tensor:
    r"""Check that every entry of ``value`` is strictly positive."""
    value_check_all(
        (value > 0).all(),
        lambda: ValueError(
            f"{name} must be strictly positive (noise variances); got min {value.min().item():.3g}."
        ),
    )
    return value


def check_count(value: object, name: str, minimum: int = 0, allow_none: bool = False) -> int | None:
    r"""Check that ``value`` is an int (not a bool) of at least ``minimum`` (or ``None``)."""
    if allow_none and value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        kind += " or None" if allow_none else ""
        raise ValueError(f"{name} must be {kind}, got {value!r}.")
    return value


def check_targets(
    Y: Tensor, name: str, num_points: int, batch_ok: bool = False, num_outputs: int | None = 1
) -> Tensor:
    r"""Check a ``... x n x k`` target tensor against ``num_points`` rows and ``k`` outputs
    (``num_outputs``; None accepts any ``k >= 1``)."""
    if num_outputs is None:
        if Y.dim() < 2 or Y.shape[-1] < 1:
            raise ValueError(f"{name} must have shape n x k (k outputs), got {tuple(Y.shape)}.")
    elif Y.dim() < 2 or Y.shape[-1] != num_outputs:
        layout = "n x 1 (single output)" if num_outputs == 1 else f"n x {num_outputs}"
        hint = ""
        if num_outputs == 1 and Y.dim() >= 2 and Y.shape[-1] > 1:
            hint = (
                " For several outputs build one model per output and combine them in "
                "BoTorch's ModelListGP (WiskiGP up to 3-D also takes n x m targets)."
            )
        raise ValueError(f"{name} must have shape {layout}, got {tuple(Y.shape)}.{hint}")
    if Y.shape[-2] != num_points:
        raise ValueError(f"{name} has {Y.shape[-2]} rows but the inputs have {num_points} points.")
    if not batch_ok and Y.dim() != 2:
        raise ValueError(f"{name} must be 2-dimensional (n x k), got shape {tuple(Y.shape)}.")
    return Y


def check_grid_bounds(grid_bounds: object, like: Tensor, dim: int) -> Tensor:
    r"""Check a grid box: a ``2 x dim`` tensor like ``like`` with every upper bound above
    its lower bound (checked before a box is grown, which would hide a degenerate one)."""
    check_tensor(grid_bounds, "grid_bounds", like=like, min_dim=2, last_dim=dim)
    if grid_bounds.shape != (2, dim) or not bool((grid_bounds[1] > grid_bounds[0]).all()):
        raise ValueError(
            f"grid_bounds must be 2 x {dim} with every upper bound above its lower bound, "
            f"got {grid_bounds.tolist()}."
        )
    return grid_bounds


def learns_input_coefficients(input_transform: object | None) -> bool:
    r"""Whether ``input_transform`` (or a part of a chain) learns its coefficients from
    the data it first sees: BoTorch's ``Normalize(d)`` without ``bounds``,
    ``InputStandardize``."""
    parts = (
        list(input_transform.values())
        if isinstance(input_transform, ChainedInputTransform)
        else [input_transform]
    )
    return any(isinstance(part, AffineInputTransform) and part.learn_coefficients for part in parts)


def check_train_data(
    train_X: object,
    train_Y: object,
    *,
    allow_empty: bool = True,
    multi_output: bool = False,
    batched: bool = False,
) -> None:
    r"""Validate a single-task model's constructor data ``train_X``, ``train_Y``.

    Args:
        train_X: Must be an unbatched ``n x d`` floating tensor (``batch x n x d`` with
            ``batched``).
        train_Y: Must be ``n x 1`` (``n x k`` with ``multi_output``), with ``train_X``'s
            dtype, device and batch dimensions.
        allow_empty: Whether ``n = 0`` is accepted.
        multi_output: Whether ``train_Y`` may have more than one column.
        batched: Whether leading batch dimensions are accepted.
    """
    check_tensor(train_X, "train_X", min_dim=2)
    if batched and train_X.dim() > 2:
        check_tensor(train_Y, "train_Y", like=train_X, min_dim=2)
        if train_Y.shape[:-2] != train_X.shape[:-2]:
            raise ValueError(
                f"train_Y has shape {tuple(train_Y.shape)}; its batch dimensions must be "
                f"train_X's {tuple(train_X.shape[:-2])}."
            )
        check_targets(
            train_Y,
            "train_Y",
            train_X.shape[-2],
            batch_ok=True,
            num_outputs=None if multi_output else 1,
        )
        return
    if train_X.dim() != 2 or (not allow_empty and len(train_X) == 0):
        at_least = "" if allow_empty else " with n >= 1"
        raise ValueError(
            f"train_X must have shape n x d{at_least} (batched models are not supported), "
            f"got {tuple(train_X.shape)}."
        )
    check_targets(
        check_tensor(train_Y, "train_Y", like=train_X, min_dim=2),
        "train_Y",
        len(train_X),
        num_outputs=None if multi_output else 1,
    )


def check_gaussian_likelihood(likelihood: object | None, hint: str = "") -> None:
    r"""Check that ``likelihood`` is None or a gpytorch ``GaussianLikelihood`` with learned noise.

    A ``FixedNoiseGaussianLikelihood`` is refused: the models that call this learn one
    homoskedastic noise level.

    Args:
        likelihood: The constructor's ``likelihood`` argument (None: the model's default).
        hint: A sentence appended to the error message, e.g. how to get fixed noise.

    Raises:
        TypeError: If ``likelihood`` is neither None nor such a likelihood.
    """
    if likelihood is not None and (
        not isinstance(likelihood, GaussianLikelihood)
        or isinstance(likelihood, FixedNoiseGaussianLikelihood)
    ):
        raise TypeError(
            "likelihood must be a gpytorch GaussianLikelihood (learned homoskedastic "
            f"noise); got {type(likelihood).__name__}." + (f" {hint}" if hint else "")
        )


def check_kernel(covar_module: object | None) -> None:
    r"""Check that ``covar_module`` is None (the model's default kernel) or a gpytorch ``Kernel``.

    Raises:
        TypeError: If it is anything else.
    """
    if covar_module is not None and not isinstance(covar_module, Kernel):
        raise TypeError(
            f"covar_module must be a gpytorch Kernel, got {type(covar_module).__name__}."
        )


def check_grid_model_data(
    train_X: object,
    train_Y: object,
    train_Yvar: object | None,
    likelihood: object | None,
    *,
    allow_empty: bool = True,
    multi_output: bool = False,
    batched: bool = False,
) -> None:
    r"""Validate the constructor data of a grid (SKI) model.

    ``train_X`` must be ``n x d`` (``batch x n x d`` with ``batched``), ``train_Y``
    ``n x 1`` (``n x k`` with ``multi_output``), ``train_Yvar``
    (fixed noise) of ``train_Y``'s shape and positive, in which case ``likelihood``
    must be ``None``; otherwise ``likelihood`` must be a learned-noise gpytorch
    ``GaussianLikelihood`` or ``None``.
    """
    check_train_data(
        train_X, train_Y, allow_empty=allow_empty, multi_output=multi_output, batched=batched
    )
    if train_Yvar is not None:
        check_tensor(train_Yvar, "train_Yvar", like=train_X, min_dim=2)
        if train_Yvar.shape != train_Y.shape:
            raise ValueError(
                f"train_Yvar must have the shape of train_Y {tuple(train_Y.shape)}, "
                f"got {tuple(train_Yvar.shape)}."
            )
        check_positive(train_Yvar, "train_Yvar")
        if likelihood is not None:
            raise ValueError(
                "likelihood must be None when train_Yvar is given (the fixed-noise "
                "likelihood is built from train_Yvar)."
            )
    check_gaussian_likelihood(likelihood, hint="Pass train_Yvar for fixed noise.")


def check_new_observations(
    X: object,
    Y: object,
    Yvar: object | None,
    *,
    like: Tensor,
    dim: int,
    fixed_noise: bool,
    num_outputs: int = 1,
    batch_shape: torch.Size = torch.Size([]),  # noqa: B008 (immutable)
) -> None:
    r"""Validate an in-place ``observe(X, Y, Yvar)`` batch.

    ``X`` must be ``q x dim``, ``Y`` ``q x num_outputs``; ``Yvar`` is required (of
    ``Y``'s shape, positive) exactly when the model has fixed noise. A batched model
    (``batch_shape``) takes ``batch_shape x q x dim`` and ``batch_shape x q x num_outputs``.
    """
    check_tensor(X, "X", like=like, min_dim=2, last_dim=dim)
    if X.shape[:-2] != batch_shape:
        layout = " x ".join([*(str(b) for b in batch_shape), "q", "d"])
        raise ValueError(f"X must have shape {layout}, got {tuple(X.shape)}.")
    Y = check_tensor(Y, "Y", like=like, min_dim=2)
    if batch_shape and Y.shape[:-2] != batch_shape:
        raise ValueError(f"Y has shape {tuple(Y.shape)}; its batch dimensions must be X's.")
    check_targets(Y, "Y", X.shape[-2], batch_ok=bool(batch_shape), num_outputs=num_outputs)
    if fixed_noise and Yvar is None:
        raise ValueError("Yvar is required: this model uses fixed noise (train_Yvar).")
    if not fixed_noise and Yvar is not None:
        raise ValueError("Yvar must be None: this model learns its noise level.")
    if Yvar is not None:
        check_tensor(Yvar, "Yvar", like=like, min_dim=2)
        if Yvar.shape != Y.shape:
            raise ValueError(
                f"Yvar must have the shape of Y {tuple(Y.shape)}, got {tuple(Yvar.shape)}."
            )
        check_positive(Yvar, "Yvar")


def check_observation_noise(observation_noise: object, like: Tensor) -> None:
    r"""Validate ``posterior``'s ``observation_noise``: a bool, or a tensor of finite,
    non-negative noise variances of ``like``'s dtype and device."""
    if isinstance(observation_noise, bool):
        return
    if not isinstance(observation_noise, Tensor):
        raise TypeError(
            "observation_noise must be a bool or a tensor of noise variances, got "
            f"{type(observation_noise).__name__}."
        )
    check_tensor(observation_noise, "observation_noise", like=like)
    value_check(
        (observation_noise < 0).any(),
        lambda: ValueError(
            "observation_noise must be non-negative (noise variances); got min "
            f"{observation_noise.min().item():.3g}."
        ),
    )


def check_conditioning_data(
    X: object,
    Y: object,
    noise: object | None,
    *,
    like: Tensor,
    dim: int,
    num_outputs: int = 1,
    finite_X: bool = True,
) -> None:
    r"""Validate ``condition_on_observations(X, Y, noise)``.

    ``X`` is ``batch x q x dim``, ``Y`` ``sample x batch x q x num_outputs`` with the
    same ``q``, ``noise`` (optional) of ``batch x q x num_outputs`` (broadcasting to the
    targets) and positive. ``finite_X=False`` leaves the check that ``X`` is finite to
    the caller (a grid model's check that ``X`` lies in its box refuses NaN and Inf too).
    """
    check_tensor(X, "X", like=like, min_dim=2, last_dim=dim, finite=finite_X)
    check_tensor(Y, "Y", like=like, min_dim=2, last_dim=num_outputs)
    if Y.shape[-2] != X.shape[-2]:
        raise ValueError(f"Y has {Y.shape[-2]} points per batch but X has {X.shape[-2]}.")
    if noise is not None:
        check_tensor(noise, "noise", like=like, min_dim=2, last_dim=num_outputs)
        if noise.shape[-2] != X.shape[-2]:
            raise ValueError(
                f"noise must have shape batch x q x {num_outputs} with q = {X.shape[-2]} (as "
                f"X), got {tuple(noise.shape)}."
            )
        try:  # noise's batch dimensions are X's (or broadcast to the targets')
            targets = torch.broadcast_shapes((*X.shape[:-1], num_outputs), Y.shape)
            fits = torch.broadcast_shapes(noise.shape, targets) == targets
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"noise must broadcast to the targets' shape {tuple(Y.shape)} (X batch "
                f"{tuple(X.shape[:-2])}), got {tuple(noise.shape)}."
            )
        check_positive(noise, "noise")


def check_no_known_noise(
    train_Yvar: object | None, model: str, argument: str = "train_Yvar"
) -> None:
    r"""Refuse observation noise variances for a model that learns one noise level.

    BoTorch code (and Ax, for metrics with known noise) passes ``train_Yvar`` to any model
    class, and streaming code passes ``Yvar`` to any model's ``observe(X, Y, Yvar)``; a
    model with a learned homoskedastic likelihood says so instead of ignoring the
    variances. ``argument`` names the refused argument (``"Yvar"`` in ``observe``).
    """
    if train_Yvar is not None:
        raise ValueError(
            f"{argument} must be None: {model} learns a homoskedastic noise level; known "
            f"observation noise ({argument}) is not supported. Leave {argument} out, or use "
            "WiskiGP or KissGP, which take known noise."
        )


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    r"""Return ``value`` if it is one of ``choices``; else raise ``ValueError`` naming ``name``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")
    return value


def check_inducing_points(inducing_points: Tensor, like: Tensor, dim: int) -> Tensor:
    r"""Check ``M x d`` inducing (or interpolation) points with ``M >= 1``; return them."""
    check_tensor(inducing_points, "inducing_points", like=like, min_dim=2, last_dim=dim)
    if inducing_points.dim() != 2 or len(inducing_points) == 0:
        raise ValueError(
            "inducing_points must have shape M x d with M >= 1, got "
            f"{tuple(inducing_points.shape)}."
        )
    return inducing_points


def check_positive_number(value: object, name: str, allow_none: bool = False) -> None:
    r"""Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number > 0."""
    if value is None and allow_none:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        suffix = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a positive number{suffix}, got {value!r}.")


def check_bool(value: object, name: str) -> None:
    r"""Raise ``TypeError`` naming ``name`` unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}.")
