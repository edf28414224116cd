r"""WISKI: Woodbury-inverse structured kernel interpolation, as a BoTorch model.

WISKI (Stanton, Maddox, Delbridge & Wilson, "Kernel Interpolation for Scalable
Online Gaussian Processes", AISTATS 2021) performs *exact* inference in the SKI
model ``f(x) = w(x)^T u``, ``u ~ N(0, K_UU)`` on a fixed regular grid ``U``, while
absorbing new observations in time and memory that do not depend on the number of
observations ``n``. The model keeps only grid-space sufficient statistics
(``W^T W``, ``W^T y``, ``y^T y``, ``n``) and factors derived from them
(:mod:`streamgp.linalg.woodbury`):

- :meth:`WiskiGP.observe` updates the model in place in ``O(m^2 q)``;
- :meth:`WiskiGP.condition_on_observations` returns a new model that shares the
  parent's ``m x m`` root and adds a rank-``q`` correction, so BoTorch fantasies
  (qKG, qNIPV, ...) cost ``O(b m q)`` memory for ``b`` candidate batches;
- :class:`streamgp.mlls.WoodburyMarginalLogLikelihood` evaluates the exact SKI
  marginal likelihood from the statistics in ``O(m^3)``, whatever ``n`` is.

Small ``n``: grid space costs ``O(m^3)`` per factorisation even for a handful of
observations, far more than an exact GP pays there. So while at most
``data_space_limit`` observations (default ``min(m, MAX_DENSE_GRID)``) were absorbed,
the model keeps their interpolation rows and does the same exact SKI inference with
``n x n`` matrices (:mod:`streamgp.linalg.data_space`; both states share the interface
of :mod:`streamgp.linalg.statistics`). The observation that takes ``n`` past the limit
folds the rows into the grid statistics, which from then on are all that is kept.
Posteriors, the likelihood and its gradients are the same on both sides.

Four or more dimensions: cubic interpolation on a product grid puts ``4^d`` weights on
every input (4,096 in 6-D), so grid statistics are out of reach. With its default grid
a ``WiskiGP`` on ``d >= 4`` inputs therefore stays in data space for good: exact SKI
with a product kernel factored per axis (``k_SKI(x, x') = prod_i k_i(x_i, x'_i)``, each
``k_i`` interpolated on a fine 1-D grid, so it is the exact kernel to interpolation
accuracy and its prior variance is exact), whose costs are an exact GP's (``O(n^2 q)``
per update, ``O(n^3)`` per fit), not constant in ``n``; it warns once
(:class:`HighDimensionalGridWarning`). This makes ``WiskiGP`` a safe drop-in for
``SingleTaskGP`` in BoTorch's 4-20-D code; :class:`~streamgp.models.AdditiveWiskiGP`
is the model whose updates stay constant in ``n`` there.

Defaults are ``SingleTaskGP``'s: ``Standardize(m)`` and a learned constant prior mean.
Transforms: an ``input_transform`` and an ``outcome_transform`` are fitted once, on
the data given to the constructor, and then frozen; data added later with
``observe`` / ``condition_on_observations`` pass through the frozen transforms. The
grid lives in the transformed input space. With ``Standardize`` this means the
mean and scale of the first batch are kept for the whole stream (exactly what
BoTorch's own ``condition_on_observations`` does), so the sufficient statistics
never need rescaling; the learned constant mean absorbs a drift of the targets' level
at the next fit, and :meth:`WiskiGP.restandardize` re-estimates the standardisation
from all data exactly.

The grid follows the data. By default the model also keeps its raw observations
(``O(n d)`` memory, amortised ``O(q)`` per batch): an observation outside the grid's box
triggers an exact re-grid (a box grown geometrically past it, the statistics rebuilt from
all kept data), so ``Normalize(d)`` without bounds, whose box is learned from the first
batch, works as it does for ``SingleTaskGP``. ``keep_data=False`` keeps memory constant in
``n`` and refuses observations outside the box instead.

LOVE (Pleiss et al., "Constant-Time Predictive Distributions for Gaussian
Processes", ICML 2018; :mod:`streamgp.linalg.love`). Inside
``gpytorch.settings.fast_pred_var()`` or ``fast_pred_samples()`` the posterior
covariance is ``(W_* R_k)(W_* R_k)^T`` with a rank-``k`` root ``R_k`` of the grid
posterior covariance, returned as a ``RootLinearOperator`` (plus the diagonal of the
exact prior variance, below, as a ``LowRankRootAddedDiagLinearOperator``): a variance
costs ``O(4^d k)`` and ``s`` joint samples at ``t`` points ``O(s k t)`` (BoTorch samplers
draw ``k``-dimensional base samples for the root). The rank is not fixed: it is the
smallest for which the uncaptured trace is at most ``love_tolerance`` times
``tr(Sigma_U)`` (default ``1e-8``), so every LOVE variance ``v_k(x)`` satisfies
``0 <= v(x) - v_k(x) <= |w(x)|^2 love_tolerance tr(Sigma_U)``. The root is derived
lazily from the current grid posterior (``O(m^2 k)``, independent of ``n``) and
reused until ``observe`` or a hyperparameter change replaces that posterior.

Accuracy by default: this class implements ``posterior`` itself, so BoTorch's
``gpt_posterior_settings`` (which switches ``fast_pred_var`` on) never applies;
without the switches, grids of at most ``MAX_DENSE_GRID`` points use the exact
dense root. Models conditioned on observations (fantasies) use the exact path even
under the switches (their correction lives in the coordinates of the exact root).

Large grids (``m > MAX_DENSE_GRID``, e.g. ``22^3`` or ``32^3``) never form an ``m x m``
matrix: ``A = W^T Lambda^{-1} W`` is stored sparse, ``K_UU`` as Kronecker factors
(separable kernels only), and the grid posterior itself is the rank-``k`` LOVE root of
:func:`streamgp.linalg.structured.structured_grid_posterior` (block Lanczos, cost
independent of ``n``), built lazily from the statistics when the hyperparameters
change. ``observe`` updates that root in place by the rank-``q`` square-root update
(``O(m k q)``; small batches are held as a correction and folded every ``FOLD_RANK``
ranks, as on dense grids): the exact conditioning of the LOVE Gaussian, whose variances
keep LOVE's direction of error; the statistics themselves stay exact (new rows' sparse
Gram matrices wait as pending parts until merged), and the next rebuild starts from
them. ``condition_on_observations`` and fantasies add a rank-``q``
correction to the root. The marginal likelihood
(:func:`streamgp.linalg.structured.structured_log_marginal_likelihood`) uses a
Nystrom log-determinant within a certified gap of at most ``love_tolerance`` and
conjugate gradients, so ``fit_gpytorch_mll`` works on large grids too.

Exact prior variances (``exact_prior_variance=True``, the default;
:mod:`streamgp.linalg.prior_variance`). SKI's prior variance ``w(x)^T K_UU w(x)`` dips
below ``k(x, x)`` between grid points when the lengthscale nears the grid spacing (to
0.75 of it at 0.8 spacings), which shows the grid as a lattice in variance maps. The
predictive covariance at test points therefore gets the diagonal
``k(x, x) - w(x)^T K_UU w(x)`` (the DTC predictive of Quinonero-Candela & Rasmussen,
2005): the same for the marginal variances, the joint covariance, LOVE and fantasies,
at ``O(4 d g)`` per point on a Kronecker grid, nothing per observation. The marginal
likelihood, the mean and conditioning stay exact SKI (so refits stay constant-time in
``n``); ``exact_prior_variance=False`` or ``streamgp.settings.exact_prior_variance(False)``
gives the exact SKI posterior.

References:

.. [Stanton2021] S. Stanton, W. J. Maddox, I. Delbridge, A. G. Wilson. Kernel
    Interpolation for Scalable Online Gaussian Processes. International Conference on
    Artificial Intelligence and Statistics, 2021.
.. [Wilson2015] A. G. Wilson, H. Nickisch. Kernel Interpolation for Scalable
    Structured Gaussian Processes (KISS-GP). International Conference on Machine
    Learning, 2015.
.. [Pleiss2018] G. Pleiss, J. Gardner, K. Q. Weinberger, A. G. Wilson. Constant-Time
    Predictive Distributions for Gaussian Processes. International Conference on
    Machine Learning, 2018.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.utils.types import DEFAULT, _DefaultType
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.models import GP
from gpytorch.settings import fast_pred_samples, fast_pred_var
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.grid import (
    EXTRAPOLATION_POLICIES,
    CubicGridInterpolation,
    GridBox,
    InterpolationWeights,
    data_grid_bounds,
    grown_grid_bounds,
)
from streamgp.linalg.data_space import DataCorrection, DataPosterior
from streamgp.linalg.grid_kernel import GridKernelRoot, grid_kernel_root, is_separable
from streamgp.linalg.love import DEFAULT_TOLERANCE, compress_root
from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.linalg.prior_variance import PriorVarianceCorrection, root_covariance
from streamgp.linalg.statistics import DataStatistics, GridStatistics
from streamgp.linalg.woodbury import (
    GridPosterior,
    LowRankCorrection,
    fold_low_rank,
    update_root,
)
from streamgp.models.base import StreamingModelMixin
from streamgp.models.utils import (
    CachedPosteriorMixin,
    FrozenTransformsMixin,
    MutableState,
    conditioning_noise,
    fit_frozen_transforms,
    shallow_view,
    transaction,
    transform_new_data,
)
from streamgp.models.utils.fixed_noise import bind_row_noise, concat_row_inputs, concat_rows
from streamgp.models.utils.observations import ObservationStore
from streamgp.models.utils.resolution import GridResolutionMixin, suggested_grid_size
from streamgp.settings import (
    ValueChecks,
    cuda_graphs,
    deferred_value_checks,
    immediate_value_checks,
    skip_value_checks,
    value_check,
    value_check_all,
)
from streamgp.settings import (
    exact_prior_variance as exact_prior_variance_setting,
)
from streamgp.utils.cuda_graphs import GraphCache, without_parameter_grads
from streamgp.utils.validation import (
    check_choice,
    check_conditioning_data,
    check_count,
    check_grid_bounds,
    check_grid_model_data,
    check_new_observations,
    check_tensor,
    learns_input_coefficients,
)

#: Total grid points aimed at by the default ``grid_size`` on a CPU: the dense exact
#: path, whose ``O(m^3)`` refactorisation takes tens of milliseconds at this size.
DEFAULT_GRID_POINTS = 1024
#: The same on CUDA, where the dense ``m x m`` algebra is cheap up to ``MAX_DENSE_GRID``
#: (``16^3``, ``64^2``): finer grids represent rougher functions at no cost in ``n``.
DEFAULT_CUDA_GRID_POINTS = 4096
#: Points per unit of (transformed) input extent along every axis of the default grid in
#: ``d >= 4`` dimensions. There the model stays in data space, where an axis costs its
#: own ``g`` (``O(n^2 sum_i g_i)`` per kernel matrix), never the grid's ``prod_i g_i``.
HIGH_DIM_POINTS_PER_UNIT = 32
#: ``data_space_limit`` of a grid that grid space cannot hold (``d >= 4``, more than
#: ``MAX_DENSE_GRID`` points): the model never leaves data space.
UNLIMITED_DATA_SPACE = 2**62


class HighDimensionalGridWarning(UserWarning):
    r"""A product grid in 4 or more dimensions: its updates are not constant in ``n``.

    Raised (once per call site, Python's default) when :class:`WiskiGP` builds its
    default grid for ``d >= 4`` inputs. Cubic interpolation there puts ``4^d`` weights
    on every input, so the model keeps exact SKI in data space (``n x n`` matrices, an
    exact GP's costs) instead of folding its rows into a grid;
    :class:`~streamgp.models.AdditiveWiskiGP` is the model whose updates stay constant in
    ``n`` in those dimensions. Passing ``grid_size`` states the choice and silences it.
    """


def default_grid_size(
    dim: int, bounds: Tensor | None = None, device: torch.device | str | None = None
) -> list[int]:
    r"""Default points per dimension: about the device's budget in total, spaced evenly.

    The budget is ``DEFAULT_GRID_POINTS`` (CPU) or ``DEFAULT_CUDA_GRID_POINTS`` (CUDA).
    One spacing ``h`` serves every axis of the domain ``bounds`` (default: the unit
    cube), so a domain twice as wide along one axis gets twice the points there:
    ``g_i = extent_i / h`` with ``prod_i g_i`` about the budget, each between 4 and 256.
    Pass ``grid_size`` to a model to choose the grid yourself.

    In ``d >= 4`` dimensions (where the model stays in data space, see
    :class:`WiskiGP`) every axis gets ``HIGH_DIM_POINTS_PER_UNIT`` points per unit of
    extent (plus the padding) instead of a share of a total budget.

    Example:
        >>> default_grid_size(3)
        [10, 10, 10]
        >>> default_grid_size(6)
        [35, 35, 35, 35, 35, 35]
        >>> default_grid_size(2, torch.tensor([[0.0, 0.0], [1.0, 4.0]]))
        [16, 64]
    """
    on_cuda = device is not None and torch.device(device).type == "cuda"
    budget = DEFAULT_CUDA_GRID_POINTS if on_cuda else DEFAULT_GRID_POINTS
    if bounds is None:
        extents = [1.0] * dim
    else:
        extents = [max(float(e), 1e-12) for e in (bounds[1] - bounds[0]).tolist()]
    if dim >= CubicGridInterpolation.FACTORED_FROM_DIM:  # data space: axes cost apart
        spacing = 1.0 / HIGH_DIM_POINTS_PER_UNIT
        return [int(min(256, max(4, math.ceil(e / spacing - 1e-9) + 3))) for e in extents]
    spacing = (math.prod(extents) / budget) ** (1.0 / dim)
    return [int(min(256, max(4, math.floor(e / spacing + 1e-9)))) for e in extents]


def build_grid(
    train_X: Tensor,
    transformed_X: Tensor,
    grid_bounds: Tensor | None,
    grid_size: int | Sequence[int] | None,
    covar_module: Kernel,
    max_dense_grid: int,
    *,
    follow_data: bool = False,
    around_data: bool = False,
) -> tuple[CubicGridInterpolation, bool]:
    r"""The grid of an SKI model and whether it is too large for a dense root.

    Args:
        train_X: The training inputs (dtype and device).
        transformed_X: The transformed training inputs the grid must cover.
        grid_bounds: ``2 x d`` box of the grid, or None for the default.
        grid_size: Points per dimension, or None for :func:`default_grid_size` of the box.
        covar_module: The base kernel (grids above ``max_dense_grid`` need a
            Kronecker-structured one).
        max_dense_grid: Largest grid with a dense root.
        follow_data: The model keeps its data and re-grids: the default box is
            :func:`~streamgp.interpolation.grid.data_grid_bounds` and a box the data
            pass is grown (:func:`~streamgp.interpolation.grid.grown_grid_bounds`).
            False: the default box is the unit cube and data outside the box are refused.
        around_data: The inputs were normalised from these data (see
            :func:`~streamgp.interpolation.grid.data_grid_bounds`).

    Returns:
        The grid interpolation and ``structured`` (``m > max_dense_grid``).
    """
    dim = train_X.shape[-1]
    tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
    if grid_bounds is None:
        if follow_data:
            grid_bounds = data_grid_bounds(transformed_X.detach(), around_data)
        else:
            grid_bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(**tkwargs)
    else:
        check_grid_bounds(grid_bounds, train_X, dim)
        if follow_data:
            grown = grown_grid_bounds(grid_bounds, transformed_X.detach())
            grid_bounds = grid_bounds if grown is None else grown
    interpolation = CubicGridInterpolation(
        grid_bounds,
        default_grid_size(dim, grid_bounds, train_X.device) if grid_size is None else grid_size,
    )
    interpolation.check_inside(transformed_X, "train_X")
    m = interpolation.num_grid
    structured = m > max_dense_grid
    if structured and not is_separable(covar_module):
        raise ValueError(
            f"A grid of {m} > MAX_DENSE_GRID = {max_dense_grid} points needs a "
            "Kronecker-structured kernel (RBF or ScaleKernel(RBF)); got "
            f"{type(covar_module).__name__}. Use a coarser grid_size."
        )
    return interpolation, structured


_GRID_FIELDS = ("A", "b", "c", "n", "sum_log_noise", "sum_noise")
#: ``state_dict`` entries that belong to the data rather than to the hyperparameters:
#: the statistics (``stat_`` in checkpoints written before data space existed) and the
#: frozen transforms fitted on the first batch.
_DATA_KEY_PREFIXES = (
    "statistics.",
    "stat_",
    "input_transform.",
    "outcome_transform.",
    "observations.",
    "grid.",
)


class WiskiGP(
    GridResolutionMixin,
    CachedPosteriorMixin,
    StreamingModelMixin,
    FrozenTransformsMixin,
    GPyTorchModel,
    GP,
    FantasizeMixin,
):
    r"""Exact SKI Gaussian process with constant-time (in ``n``) online updates.

    Args:
        train_X: ``n x d`` training inputs (``n`` may be 0).
        train_Y: ``n x k`` training targets. ``k > 1`` gives one model of ``k`` outputs
            observed at the same inputs (as ``SingleTaskGP``'s ``num_outputs``): they share
            the kernel hyperparameters and the noise, hence the interpolation rows, the
            Gram statistics and every factorisation; only ``W^T y``, ``y^T y`` and the
            means are per output, so ``k`` outputs cost about what one does. Dense grids
            only (at most ``MAX_DENSE_GRID`` points).
        train_Yvar: Optional ``n x k`` observed noise variances. If given, the model
            uses fixed heteroskedastic noise and ``observe`` requires ``Yvar``;
            otherwise the noise level is learned. With ``k > 1`` each row must have one
            noise variance for all outputs (after the outcome transform). As in
            ``SingleTaskGP``, ``likelihood.noise`` is then every row's (transformed) noise
            variance, and a conditioned (fantasy) model's likelihood holds its own rows'
            too (:meth:`training_noise`: read on access, never copied on an update).
        grid_size: Grid points per dimension (int or one per dimension), including
            the one-spacing padding beyond ``grid_bounds``. Default
            (:func:`default_grid_size`): about 1024 points in total on a CPU (32 per
            dimension in 2-D, 10 in 3-D) and 4096 on CUDA (64, 16), with one spacing
            for every axis of ``grid_bounds``; in ``d >= 4`` dimensions 32 points per
            unit of extent on every axis (data space, see ``data_space_limit``).
        grid_bounds: ``2 x d`` box covered by the grid, in the (transformed) input
            space. Default: the unit cube (the search space of inputs normalised with
            ``Normalize(d, bounds=bounds)``, or already in it); with an input transform
            that learns its coefficients from ``train_X`` (``Normalize(d)`` without
            bounds, as in BoTorch's tutorials), the transformed data's box plus a
            margin (:func:`~streamgp.interpolation.grid.data_grid_bounds`: 20% of its
            extent, more for few points). A box the data pass is grown
            to cover them (see ``keep_data``). Predictions outside follow
            ``extrapolation``.
        covar_module: Base kernel (not a ``GridInterpolationKernel``). Default:
            BoTorch's ``SingleTaskGP`` kernel (RBF with dimension-scaled priors).
        likelihood: Gaussian likelihood for the learned-noise variant. Default:
            BoTorch's ``SingleTaskGP`` likelihood. Must be omitted with ``train_Yvar``.
        input_transform: Input transform, fitted on ``train_X`` and then frozen.
        outcome_transform: Outcome transform, fitted on ``train_Y`` and then frozen.
            Default: ``Standardize(m=k)``, as ``SingleTaskGP``'s (no transform when the
            model is built without data); ``None`` for none.
        extrapolation: What a prediction outside ``grid_bounds`` does: ``"nearest"``
            (default) predicts at the nearest point of the box and warns
            (``GridExtrapolationWarning``), so BoTorch code that probes beyond the
            search box (qLogNEI's infeasible-cost estimate) never fails mid-loop;
            ``"error"`` raises ``ValueError``. Observations outside re-grid (see
            ``keep_data``).
        data_space_limit: Largest number of observations kept in data space (rows
            and ``n x n`` matrices); past it they are folded into grid statistics
            for good. Default: ``min(m, MAX_DENSE_GRID)``, where the two costs cross;
            unlimited for a grid of more than ``MAX_DENSE_GRID`` points in ``d >= 4``
            dimensions (the default grid there), whose grid statistics would hold
            ``(4^d)^2`` products per row: such a model is exact SKI in data space for
            good, with an exact GP's costs (``O(n^2 q)`` updates, ``O(n^3)`` fits) and a
            kernel factored per axis (``O(n^2 sum_i g_i)``, never ``4^d``).
            0 keeps it in grid space from the first observation on (a model
            built without data starts with empty data-space statistics).
        interpolation: Instead of the regular grid, a function of the transformed
            training data ``(X, y, noise)`` (``noise`` None for learned noise) that
            returns the interpolation: an object with the grid interpolation's interface
            (``weights``, ``num_grid``, ``grid_size``, ``dim``, ``bounds``,
            ``check_inside``, ``prediction_inputs``). It is called once the kernel and
            the likelihood exist, so it may learn the interpolation with them (as
            :class:`~streamgp.models.OnlineSoftKIGP` does). The model then keeps grid
            statistics from the start, with a dense root; a subclass whose points are not
            a grid also overrides :meth:`kernel_root`. Not with ``grid_size``,
            ``grid_bounds`` or ``data_space_limit``.
        keep_data: Keep the raw observations (``X``, ``Y`` and ``Yvar``: ``O(n (d + 2k))``
            memory, amortised ``O(q)`` per batch; :attr:`observations`), so that an
            observation outside the grid's box triggers an exact re-grid: the box grows
            geometrically past it (``GRID_GROWTH``: each moved side by at least half the
            extent, so ``O(log)`` re-grids in the distance), the grid keeps its
            ``grid_size`` (or its default for the new box), and the statistics are rebuilt
            from all kept data (``O(n 4^d + m^3)``, after which the model equals one built
            on the new grid). Hyperparameters are kept. The kept data are also BoTorch's
            :attr:`train_inputs` / :attr:`train_targets`. False: constant memory; an
            observation outside the box is then refused with a ``ValueError``, the model
            has no ``train_inputs``, and a fixed-noise ``likelihood.noise`` shows each
            absorbed row's mean noise once the rows are folded into grid statistics
            (:meth:`training_noise`). Not with
            ``interpolation`` (its points are not a grid).
        mean_module: The prior mean: None (default) for ``SingleTaskGP``'s learned
            ``ConstantMean`` (one constant per output), a gpytorch ``ConstantMean``
            (one constant, or one per output), or ``ZeroMean()`` for a zero mean. The
            constant is learned with the kernel. Exact at no extra cost: interpolation
            rows sum to one, so the statistics of the targets minus a constant follow
            from the statistics
            (:meth:`~streamgp.linalg.statistics.GridStatistics.shift`).
        exact_prior_variance: Predict with the kernel's own prior variance ``k(x, x)``
            (default): the posterior covariance at test points gets the diagonal
            ``k(x, x) - w(x)^T K_UU w(x)`` (:mod:`streamgp.linalg.prior_variance`), which
            SKI's interpolated prior variance misses between grid points when the
            lengthscale nears the grid spacing. Marginal variances, the joint covariance,
            LOVE and conditioned (fantasy) models all carry it; the marginal likelihood
            and the data fit stay exact SKI. False: the exact SKI posterior (as does
            ``with streamgp.settings.exact_prior_variance(False)`` for every model). A
            flag, not state: checkpoints neither save nor change it.

    After a fit (``fit_gpytorch_mll``) that leaves a lengthscale below
    ``MIN_SPACINGS_PER_LENGTHSCALE`` (2) grid spacings, the model warns once with
    :class:`~streamgp.models.utils.resolution.CoarseGridWarning`, naming a finer
    ``grid_size``.

    Example:
        >>> from botorch.models.transforms import Normalize, Standardize
        >>> X = torch.rand(200, 2, dtype=torch.float64)
        >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
        >>> model = WiskiGP(X, Y, grid_size=30)  # Standardize(1), a learned constant mean
        >>> X_new = torch.rand(3, 2, dtype=torch.float64)
        >>> model = model.observe(X_new, torch.sin(6 * X_new).sum(-1, keepdim=True))
        >>> posterior = model.posterior(torch.rand(5, 2, dtype=torch.float64))
    """

    #: Set per model from ``train_Y``'s columns.
    _num_outputs = 1
    #: Largest grid that keeps the exact dense ``m x m`` root; larger grids use the
    #: structured LOVE path (decided at construction).
    MAX_DENSE_GRID = settings.MAX_DENSE_GRID
    #: LOVE tolerance (relative uncaptured trace of ``Sigma_U``); settable per model.
    love_tolerance: float = DEFAULT_TOLERANCE
    #: Rows per chunk when accumulating the statistics of the constructor's data.
    STATISTICS_CHUNK = settings.STATISTICS_CHUNK
    #: Default ``data_space_limit``; None means ``min(m, MAX_DENSE_GRID)``.
    DATA_SPACE_LIMIT: int | None = None
    #: Whether a subclass's ``interpolation`` is a grid it can grow (it then keeps data
    #: with ``keep_data`` and implements :meth:`_regridded_interpolation`).
    REGRIDS_INTERPOLATION = False

    data_state_prefixes = _DATA_KEY_PREFIXES
    #: Derived from the statistics on demand (conditioning replayed).
    #: ``_pending_failure``: the failure flag (on the device) of the factorisations of the
    #: last update, read with the next call (see :meth:`_checked_call`).
    #: ``_prior_variance``: the exact prior variance correction at the current
    #: hyperparameters (:mod:`streamgp.linalg.prior_variance`), built with the posterior.
    #: ``_graphs``: captured CUDA graphs of the posterior (:class:`streamgp.settings.cuda_graphs`).
    cached_attributes = (
        "_posterior",
        "_love_cache",
        "_pending_failure",
        "_prior_variance",
        "_graphs",
    )
    _posterior: GridPosterior | DataPosterior | None
    _prior_variance: PriorVarianceCorrection | None
    _pending_failure: Tensor | None
    #: (exact grid posterior it was derived from, tolerance, LOVE grid posterior)
    _love_cache: tuple[GridPosterior, float, GridPosterior] | None
    _correction: LowRankCorrection | DataCorrection | None
    #: What ``observe`` (with its deferred folds and re-grids) may change, restored if it
    #: raises (:func:`~streamgp.models.utils.transaction.transaction`, any exception):
    #: the statistics, the grid, the caches and pending rows (all replaced, not written
    #: into: kept by reference) and the kept observations' count. (A fixed-noise
    #: likelihood stores nothing: its per-row noise is read from these, see
    #: :meth:`training_noise`.)
    mutable_state = MutableState(
        attributes=(
            "_statistics",
            "_posterior",
            "_love_cache",
            "_pending_failure",
            "_prior_variance",
            "_graphs",
            "_hyper_snapshot",
            "_correction",
            "_conditioning_log",
            "_log_from_observe",
            "interpolation",
            "structured",
        ),
        objects=("observations", "likelihood.noise_covar"),
    )

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        likelihood: GaussianLikelihood | None = None,
        covar_module: Kernel | None = None,
        outcome_transform: OutcomeTransform | _DefaultType | None = DEFAULT,
        input_transform: InputTransform | None = None,
        *,
        grid_size: int | Sequence[int] | None = None,
        grid_bounds: Tensor | None = None,
        extrapolation: str = "nearest",
        data_space_limit: int | None = None,
        interpolation: Callable[[Tensor, Tensor, Tensor | None], Any] | None = None,
        keep_data: bool = True,
        mean_module: ConstantMean | ZeroMean | None = None,
        exact_prior_variance: bool = True,
    ) -> None:
        check_grid_model_data(train_X, train_Y, train_Yvar, likelihood, multi_output=True)
        num_outputs = train_Y.shape[-1]
        if mean_module is None:  # SingleTaskGP's: a learned constant for each output
            mean_module = ConstantMean(
                batch_shape=torch.Size([num_outputs] if num_outputs > 1 else [])
            )
        elif type(mean_module) is ConstantMean:
            if mean_module.constant.numel() not in (1, num_outputs):
                raise ValueError(
                    f"mean_module's ConstantMean has {mean_module.constant.numel()} constants; "
                    f"pass one, or one per output ({num_outputs})."
                )
        elif type(mean_module) is not ZeroMean:
            raise ValueError(
                "mean_module must be None (a learned constant, the default), a gpytorch "
                f"ConstantMean or ZeroMean, got {type(mean_module).__name__}."
            )
        if num_outputs > 1 and interpolation is not None:
            raise ValueError(
                f"train_Y has {num_outputs} columns; a model with an interpolation factory "
                "has one output (use a ModelListGP of single-output models)."
            )
        if not isinstance(keep_data, bool):
            raise TypeError(f"keep_data must be a bool, got {type(keep_data).__name__}.")
        if not isinstance(exact_prior_variance, bool):
            raise TypeError(
                f"exact_prior_variance must be a bool, got {type(exact_prior_variance).__name__}."
            )
        if interpolation is not None and (
            grid_size is not None or grid_bounds is not None or data_space_limit is not None
        ):
            raise ValueError(
                "grid_size, grid_bounds and data_space_limit describe the grid; pass none of "
                "them with an interpolation."
            )
        check_choice(extrapolation, "extrapolation", EXTRAPOLATION_POLICIES)
        super().__init__()
        self.extrapolation = extrapolation
        self.exact_prior_variance = exact_prior_variance
        self._num_outputs = num_outputs
        dim = train_X.shape[-1]
        tkwargs = {"dtype": train_X.dtype, "device": train_X.device}

        # The raw data are kept (before the transforms, which may be re-fitted later:
        # restandardize) for a re-grid.
        self.observations = (
            ObservationStore(train_X, train_Y, train_Yvar)
            if keep_data and (interpolation is None or self.REGRIDS_INTERPOLATION)
            else None
        )
        # A view's (see _view) kept rows: (store, the statistics they are the rows of,
        # output indices or None, their count). A model with `observations` reads those.
        self._row_source = None
        # Fit the transforms once on the initial data, then freeze them.
        transformed_X, train_Y, train_Yvar = fit_frozen_transforms(
            self, train_X, train_Y, input_transform, outcome_transform, train_Yvar
        )

        if covar_module is None:
            covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        self.covar_module = covar_module.to(**tkwargs)
        self.mean_module = mean_module.to(**tkwargs)
        self.fixed_noise = train_Yvar is not None
        if self.fixed_noise:
            # As SingleTaskGP's: likelihood.noise is the rows' (transformed) train_Yvar,
            # read from the model's data when asked (nothing is copied on an update).
            self.likelihood = bind_row_noise(self)
        else:
            self.likelihood = (
                get_gaussian_likelihood_with_lognormal_prior() if likelihood is None else likelihood
            ).to(**tkwargs)

        y_all = self._targets(train_Y)
        noise_all = None if train_Yvar is None else self._shared_noise(train_Yvar, "train_Yvar")
        # The grid size asked for (None: the default of whatever box the grid has).
        self._grid_size_option = grid_size
        if interpolation is None:
            if dim >= CubicGridInterpolation.FACTORED_FROM_DIM and grid_size is None:
                warnings.warn(
                    f"WiskiGP on {dim}-D inputs: cubic interpolation on a product grid "
                    f"puts 4^{dim} = {4**dim} weights on every input, so the model keeps "
                    "exact SKI in data space (n x n matrices, the kernel factored per "
                    "axis): its updates cost O(n^2 q) and its fits O(n^3), as an exact "
                    "GP's, not constant in n. For updates constant in n use "
                    "AdditiveWiskiGP (an additive kernel over groups of at most 3 "
                    "dimensions); pass grid_size to choose a grid yourself.",
                    HighDimensionalGridWarning,
                    stacklevel=2,
                )
            self.interpolation, self.structured = build_grid(
                train_X,
                transformed_X,
                grid_bounds,
                grid_size,
                self.covar_module,
                self.MAX_DENSE_GRID,
                follow_data=self.observations is not None,
                around_data=learns_input_coefficients(input_transform),
            )
            self._check_dense_for_outputs(self.interpolation, self.structured)
            if data_space_limit is None:
                data_space_limit = self.DATA_SPACE_LIMIT
            if data_space_limit is None:
                data_space_limit = min(self.interpolation.num_grid, self.MAX_DENSE_GRID)
                if self.structured and dim >= CubicGridInterpolation.FACTORED_FROM_DIM:
                    # Grid statistics would hold (4^d)^2 products per row: stay in data space.
                    data_space_limit = UNLIMITED_DATA_SPACE
        else:  # grid space from the start, with a dense root
            self.interpolation = interpolation(transformed_X, y_all, noise_all)
            self.structured = False
            data_space_limit = 0
        self.data_space_limit = check_count(data_space_limit, "data_space_limit", minimum=0)
        self._clear_caches()
        if interpolation is None:
            statistics = self._statistics_of(
                self.interpolation, self.structured, transformed_X, y_all, noise_all
            )
        else:  # learned points: grid statistics, recomputed when the points change
            statistics = self._grid_statistics(
                self.interpolation, transformed_X, y_all, noise_all, differentiable=False
            )
        self._set_statistics(statistics)

    def _statistics_of(
        self,
        interpolation: CubicGridInterpolation,
        structured: bool,
        X_t: Tensor,
        y: Tensor,
        noise: Tensor | None,
    ) -> DataStatistics | GridStatistics:
        r"""The statistics of transformed data on a grid: their rows while at most
        ``data_space_limit``, else the grid sums."""
        if len(X_t) <= self.data_space_limit:
            # y is n (one output) or k x n: the rows are shared by all outputs.
            statistics = DataStatistics.empty(interpolation.grid_size, y, self.fixed_noise)
            return statistics.add(interpolation.weights(X_t), y, noise)
        # Large data sets are absorbed in chunks to bound memory.
        return self._grid_statistics(interpolation, X_t, y, noise, sparse=structured)

    def _check_dense_for_outputs(self, interpolation: Any, structured: bool) -> None:
        r"""Refuse a grid too large for a dense root in a multi-output model (at
        construction, a re-grid or a checkpoint's grid)."""
        if structured and self._num_outputs > 1:
            raise ValueError(
                f"train_Y has {self._num_outputs} columns; multi-output WiskiGP needs a dense "
                f"grid (at most MAX_DENSE_GRID = {self.MAX_DENSE_GRID} points, this one "
                f"has {interpolation.num_grid}). Use a coarser grid_size."
            )

    def _grid_statistics(
        self,
        interpolation: Any,
        X_t: Tensor,
        y: Tensor,
        noise: Tensor | None,
        differentiable: bool = True,
        sparse: bool | None = None,
    ) -> GridStatistics:
        r"""Grid statistics of transformed rows, ``STATISTICS_CHUNK`` rows at a time.

        ``differentiable``: keep the graph to ``X_t`` (a learned projection of the
        inputs is fitted through the statistics); False for learned interpolation
        points, whose statistics are recomputed when the points change.
        """
        chunks = (
            (
                interpolation.weights(X_t[start : start + self.STATISTICS_CHUNK]),
                y[..., start : start + self.STATISTICS_CHUNK],
                None if noise is None else noise[start : start + self.STATISTICS_CHUNK],
            )
            for start in range(0, y.shape[-1], self.STATISTICS_CHUNK)
        )
        with torch.set_grad_enabled(differentiable and torch.is_grad_enabled()):
            return GridStatistics.of_rows(
                chunks,
                interpolation.num_grid,
                y,
                self.fixed_noise,
                sparse=self.structured if sparse is None else sparse,
            )

    # ------------------------------------------------------------ outputs
    def _targets(self, Y: Tensor) -> Tensor:
        r"""``... x q x k`` targets in the layout of the algebra: ``... x q`` for one
        output, ``... x k x q`` for ``k`` (the outputs share every row-derived factor)."""
        return Y.squeeze(-1) if self._num_outputs == 1 else Y.movedim(-1, -2)

    def _prior_mean(self) -> Tensor | None:
        r"""The constant prior mean (transformed space): a scalar for one output, one per
        output (shape ``k``) for ``k``; None for ``ZeroMean``."""
        if not isinstance(self.mean_module, ConstantMean):
            return None
        constant = self.mean_module.constant
        if self._num_outputs == 1:
            return constant.reshape(())
        return constant.reshape(-1).expand(self._num_outputs)

    def _centered(self, statistics: DataStatistics | GridStatistics):
        r"""The statistics of the targets minus the prior mean (the GP's residuals)."""
        mean = self._prior_mean()
        return statistics if mean is None else statistics.shift(-mean)

    def _residuals(self, y: Tensor) -> Tensor:
        r"""Targets minus the prior mean, as the posterior factors take them."""
        return self._plus_prior_mean(y, sign=-1)

    def _shared_noise(self, Yvar: Tensor, name: str) -> Tensor:
        r"""``... x q x k`` (transformed) noise variances as one ``... x q`` noise per row.

        The outputs of a multi-output model share the Gram statistics, so each row must
        have one noise variance for all of them.
        """
        if self._num_outputs > 1:
            value_check(
                (Yvar != Yvar[..., :1]).any(),
                lambda: ValueError(
                    f"{name} differs between outputs (after the outcome transform): the "
                    "outputs of a multi-output WiskiGP share one noise variance per row. Use "
                    "a ModelListGP of single-output models, or an outcome transform that "
                    "scales all outputs alike (outcome_transform=None: the default "
                    "Standardize scales each output by its own deviation)."
                ),
            )
        return Yvar[..., 0]

    def _rows(self, X_t: Tensor) -> InterpolationWeights:
        r"""Interpolation rows of ``batch x q x d`` inputs; a multi-output model's batched
        rows get a size-one output dimension (``batch x 1 x q``) to broadcast against
        its ``batch x k x q`` per-output quantities."""
        weights = self.interpolation.weights(X_t)
        if self._num_outputs > 1 and X_t.dim() > 2:
            return weights.unsqueeze_batch()
        return weights

    def _row_noise(self, noise: Tensor) -> Tensor:
        r"""``batch x q`` conditioning noise in the layout of :meth:`_rows`."""
        if self._num_outputs > 1 and noise.dim() > 1:
            return noise.unsqueeze(-2)
        return noise

    # ------------------------------------------------------------------ state
    def _clear_caches(self) -> None:
        # The conditioning log also holds the rows observe folds in later (FOLD_RANK);
        # O(Q), not O(n).
        super()._clear_caches()
        # True while every logged row came from `observe` (held back, see FOLD_RANK)
        # rather than from `condition_on_observations`.
        self._log_from_observe = True

    def _apply_to_state(self, fn) -> None:
        # Device/dtype moves: the statistics (not buffers) and the grid follow.
        self._statistics = self._statistics.apply(fn)
        self.interpolation = self.interpolation.to(
            device=self._statistics.device, dtype=self._statistics.dtype
        )

    @property
    def statistics(self) -> DataStatistics | GridStatistics:
        r"""What the model keeps of its observations (not of conditioning).

        :class:`~streamgp.linalg.statistics.DataStatistics` (the rows) while at most
        ``data_space_limit`` observations were absorbed, then
        :class:`~streamgp.linalg.statistics.GridStatistics` (``W^T W, W^T y, ...``).
        Observations held as a pending low-rank correction (``FOLD_RANK``) are folded in
        first, so every observed row is accounted for.
        """
        self._fold_observed()
        return self._statistics

    def _fold_observed(self) -> None:
        r"""Fold pending rows of an unbatched model (a batched fantasy view keeps its own)."""
        if self._conditioning_log and len(self.batch_shape) == 0:
            self._fold_conditioning()

    @property
    def in_data_space(self) -> bool:
        r"""True while the model keeps its rows and works with ``n x n`` matrices."""
        return isinstance(self._statistics, DataStatistics)

    def _set_statistics(self, statistics: DataStatistics | GridStatistics) -> None:
        self._statistics = statistics

    def _statistics_tensors(self) -> dict[str, Tensor]:
        r"""The statistics as named tensors (``state_dict`` entries under ``statistics.``)."""
        stats = self._statistics
        if isinstance(stats, GridStatistics):
            return {name: getattr(stats, name) for name in _GRID_FIELDS}
        weights = stats.weights
        tensors = {"y": stats.y}
        if not weights.is_factored:  # factored rows are saved as their axes only
            tensors["indices"], tensors["values"] = weights.indices, weights.values
        for j, axis in enumerate(weights.axes):
            tensors[f"axis{j}_indices"], tensors[f"axis{j}_values"] = axis.indices, axis.values
        if stats.noise is not None:
            tensors["noise"] = stats.noise
        return tensors

    def _statistics_from_tensors(
        self, tensors: dict[str, Tensor]
    ) -> DataStatistics | GridStatistics:
        device, dtype = self._statistics.device, self._statistics.dtype

        def get(name: str) -> Tensor:
            value = tensors[name].to(device=device)
            return value.to(dtype) if value.is_floating_point() else value

        if "y" in tensors:
            saved_fixed_noise = "noise" in tensors
        else:  # grid statistics carry noise sums only with fixed noise
            saved_fixed_noise = bool(tensors["sum_noise"] != 0) or (
                self.fixed_noise and not bool(tensors["n"] > 0)
            )
        if saved_fixed_noise != self.fixed_noise:
            raise ValueError(
                "its statistics' noise model (fixed or learned) differs from this model's."
            )
        m = self.interpolation.num_grid
        if "y" not in tensors:
            sums = {f: get(f) for f in _GRID_FIELDS}
            if sums["A"].shape[-1] != m:
                raise ValueError(
                    f"its statistics are on a grid of {sums['A'].shape[-1]} points, this "
                    f"model's grid has {m} (build it with the same grid_size and grid_bounds)."
                )
            return GridStatistics(gram=sums.pop("A"), **sums, fixed_noise=self.fixed_noise)
        interp = self.interpolation
        largest = [(tensors["indices"], m)] if "indices" in tensors else []
        largest += [
            (tensors[f"axis{j}_indices"], g)
            for j, g in enumerate(interp.grid_size)
            if f"axis{j}_indices" in tensors
        ]
        if "indices" not in tensors and len(largest) != len(interp.grid_size):
            raise ValueError("its rows have neither flat weights nor one set per grid axis.")
        if any(index.numel() and int(index.max()) >= size for index, size in largest):
            raise ValueError(
                f"its rows index a grid larger than this model's {m} points (build it with "
                "the same grid_size and grid_bounds)."
            )
        axes = tuple(
            InterpolationWeights(get(f"axis{j}_indices"), get(f"axis{j}_values"), g)
            for j, g in enumerate(interp.grid_size)
            if f"axis{j}_indices" in tensors
        )
        if "indices" in tensors:
            weights = InterpolationWeights(get("indices"), get("values"), interp.num_grid, axes)
        else:
            weights = InterpolationWeights(None, None, interp.num_grid, axes)
        return DataStatistics(weights, get("y"), get("noise") if self.fixed_noise else None)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self._fold_observed()
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, value in self._statistics_tensors().items():
            destination[f"{prefix}statistics.{name}"] = value if keep_vars else value.detach()
        grid = self._grid_state()
        if grid is not None:  # the grid the statistics live on (it follows the data)
            destination[f"{prefix}grid.bounds"], destination[f"{prefix}grid.size"] = grid

    def _grid_state(self) -> tuple[Tensor, Tensor] | None:
        r"""The grid's box and sizes (``state_dict``'s ``grid.*``); None without a grid."""
        if not isinstance(self.interpolation, CubicGridInterpolation):
            return None
        return self.interpolation.bounds.detach(), torch.tensor(self.interpolation.grid_size)

    def _grid_from_state(self, bounds: Tensor, size: Tensor) -> tuple[Any, bool]:
        r"""The interpolation (and ``structured``) of a saved :meth:`_grid_state`."""
        grid_size = [int(g) for g in size.tolist()]
        return build_grid(
            bounds, bounds[:0], bounds, grid_size, self.covar_module, self.MAX_DENSE_GRID
        )

    #: A restore takes the checkpoint's grid (its box and points per axis).
    ADOPTED_OPTIONS = frozenset({"grid_size"})

    def _checkpoint_options(self) -> dict[str, Any]:
        return {
            **super()._checkpoint_options(),
            "fixed_noise": bool(self.fixed_noise),
            "keep_data": self.observations is not None,
            "grid_size": [int(g) for g in self.interpolation.grid_size],
        }

    def _stream_state(self) -> dict[str, Any]:
        # The grid options that decide future re-grids (the grid itself is in state_dict).
        return {
            "grid_size": self._grid_size_option,
            "data_space_limit": self.data_space_limit,
            "keep_data": self.observations is not None,
            **self._posterior_state(),
        }

    def _posterior_state(self) -> dict[str, Any]:
        r"""The cached posterior, for a checkpoint (empty if there is none to save).

        The posterior of an observed model came from rank-``q`` updates (in grid space
        its root, in data space its Cholesky factor); saving its factors and prediction
        cache (rather than refactorising the statistics on restore) makes the restored
        model predict, and continue the stream, bit for bit as this one.
        """
        posterior = self._posterior
        if posterior is None or self._correction is not None or not self._caches_valid():
            return {}
        return {f"posterior_{name}": value for name, value in posterior.state().items()}

    def _set_posterior_state(self, state: dict[str, Any]) -> None:
        r"""Inverse of :meth:`_posterior_state` (after the statistics were loaded).

        Raises:
            ValueError: If the factors do not fit the statistics (naming the factor).
        """
        saved = {
            key.removeprefix("posterior_"): value
            for key, value in state.items()
            if key.startswith("posterior_")
        }
        if "root" in saved:
            self._posterior = GridPosterior.from_state(saved, self.interpolation.num_grid)
        elif "chol" in saved:
            if not isinstance(self._statistics, DataStatistics):
                raise ValueError("its data-space posterior factors come with grid statistics.")
            with torch.no_grad():
                root = self.kernel_root()
            self._posterior = DataPosterior.from_state(saved, root, self._statistics.weights)
        else:
            return
        self._snapshot_hyperparameters()

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        keeps_data = self.observations is not None
        if bool(state.get("keep_data", keeps_data)) != keeps_data:
            raise ValueError("checkpoint: keep_data differs from this model's.")
        if "grid_size" in state:
            size = state["grid_size"]
            self._grid_size_option = size if size is None or isinstance(size, int) else list(size)
            self.data_space_limit = int(state["data_space_limit"])
        self._set_posterior_state(state)

    def _load_grid(self, bounds: Tensor, size: Tensor) -> None:
        r"""Move to the grid a checkpoint's statistics live on (before loading them)."""
        bounds = bounds.to(self.interpolation.bounds)
        current_bounds, current_size = self._grid_state()
        if torch.equal(size, current_size) and torch.equal(bounds, current_bounds):
            return
        if bounds.shape != current_bounds.shape or size.shape != current_size.shape:
            raise ValueError(
                f"its grid has {bounds.shape[-1]} input dimensions and sizes "
                f"{size.tolist()}, this model's {current_bounds.shape[-1]} and "
                f"{current_size.tolist()}."
            )
        interpolation, structured = self._grid_from_state(bounds, size)
        self._check_dense_for_outputs(interpolation, structured)
        self.interpolation, self.structured = interpolation, structured

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # The statistics change size with the data (rows in data space), so they are not
        # buffers; they are taken out here and the rest is loaded as usual.
        key = f"{prefix}statistics."
        tensors = {k[len(key) :]: state_dict.pop(k) for k in list(state_dict) if k.startswith(key)}
        legacy = f"{prefix}stat_"  # checkpoints written before data space existed
        tensors.update(
            {k[len(legacy) :]: state_dict.pop(k) for k in list(state_dict) if k.startswith(legacy)}
        )
        grid = {k: state_dict.pop(f"{prefix}grid.{k}", None) for k in ("bounds", "size")}
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if not tensors:
            if strict:
                missing_keys.append(f"{key}*")
            return
        try:
            if grid["bounds"] is not None and grid["size"] is not None and self._grid_state():
                self._load_grid(grid["bounds"], grid["size"])
            statistics = self._statistics_from_tensors(tensors)
        except (KeyError, ValueError) as error:
            error_msgs.append(f"WiskiGP statistics: {error}")
            return
        self._clear_caches()
        self._set_statistics(statistics)

    @property
    def noise_variance(self) -> Tensor:
        r"""The homoskedastic noise variance, or the mean fixed noise variance."""
        noise = self._noise_level()
        if not self._in_verified_call():  # a checked call read it already
            self._check_noise(noise)
        return noise

    def _noise_level(self) -> Tensor:
        r"""The learned noise variance; with fixed noise the mean of the observed rows'
        (1 before any), from the statistics' noise sum: ``O(1)``, never the rows."""
        if not self.fixed_noise:
            return self.likelihood.noise.reshape(())
        statistics = self._statistics
        n = statistics.n
        mean = statistics.sum_noise / n.clamp_min(1.0)
        return torch.where(n > 0, mean, torch.ones_like(mean)).detach()

    @staticmethod
    def _check_noise(noise: Tensor) -> None:
        value_check_all(
            noise > 0,
            lambda: ValueError(
                f"The likelihood's noise variance is {noise.item():.3g}, not positive. BoTorch's "
                "default constraints have no transform (bounds are enforced by the optimizer), so "
                "a plain torch optimizer can step out of them: use botorch.fit.fit_gpytorch_mll / "
                "fit_gpytorch_mll_torch, or a likelihood with a transformed noise constraint "
                "(e.g. gpytorch.likelihoods.GaussianLikelihood())."
            ),
        )

    @contextlib.contextmanager
    def _checked_call(self) -> Iterator[ValueChecks]:
        r"""One public call (``posterior``, ``condition_on_observations``, ``observe``)
        whose value checks are read from the device once (:mod:`streamgp.settings`).

        Besides the checks of the arguments, the read holds the
        comparison of the hyperparameters with the caches' snapshot (stale caches are
        dropped there) and the failure flag of the last update's factorisations, which
        were not read when they ran: if it is set, every factor is rebuilt from the exact
        statistics with checked factorisations (which raise if they fail too), so nothing
        computed from a failed factor is returned. After :meth:`_read_checks` the call's
        own incremental factorisations record their failure for the next call instead.
        """
        with deferred_value_checks(join=False) as checks, self._verified_call(checks):
            # The noise was checked when the caches were built (a rebuild checks it), and
            # it is a function of the hyperparameters, which the read compares with the
            # caches' snapshot: checked again only if that snapshot was taken unchecked
            # (inside skip_value_checks, or restored from a checkpoint).
            if not getattr(self._hyper_snapshot, "values_checked", False):
                self._check_noise(self._noise_level())
            pending = self._pending_failure
            if pending is not None and not skip_value_checks.on():
                checks.decide(pending, self._after_update_check)
            yield checks

    def _read_checks(self, checks: ValueChecks) -> None:
        checks.read()
        checks.defer_factorisations = True

    def _after_update_check(self, failed: bool) -> None:
        r"""Act on the last update's factorisation flag, read in this call."""
        self._pending_failure = None
        if failed:
            self._invalidate()
            self.exact_posterior()  # checked: raises if the factors cannot be rebuilt

    def _take_failures(self, checks: ValueChecks) -> Tensor | None:
        r"""This call's recorded factorisation failures, as one flag for the next call."""
        failed = checks.failure_flag()
        checks.failures.clear()
        return failed

    def weighted_statistics(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        r"""Grid-space noise-weighted ``(A, b, c, n, sum(log noise))``; differentiable in the noise.

        Includes data absorbed by ``condition_on_observations`` (unbatched only). In data
        space they are computed from the rows (``O(n 16^d)``), without switching space.
        """
        self._fold_conditioning()
        return self._statistics.to_grid().weighted(self.noise_variance)

    def training_statistics(self) -> DataStatistics | GridStatistics:
        r"""The statistics of every observation, conditioning included (unbatched only)."""
        self._fold_conditioning()
        return self._statistics

    def statistics_with(
        self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None
    ) -> DataStatistics | GridStatistics:
        r"""The statistics of every observation plus ``(X, Y)``; the model is unchanged.

        The new rows pass through the model's frozen transforms and its interpolation, so
        the result is differentiable in ``X`` (and in anything ``X`` was computed from):
        the WISKI paper's streaming objective (eq. 18) keeps the old statistics fixed and
        differentiates the new rows' weights, e.g. in a learned input projection.
        ``WoodburyMarginalLogLikelihood(likelihood, model)(statistics=...)`` evaluates it.

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (a single-output model).
            Yvar: ``q x 1`` known noise variances (fixed-noise models only).

        Example:
            >>> from streamgp.mlls import WoodburyMarginalLogLikelihood
            >>> X = torch.rand(10, 2, dtype=torch.float64)
            >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=8)
            >>> mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
            >>> new = torch.rand(3, 2, dtype=torch.float64, requires_grad=True)
            >>> mll(statistics=model.statistics_with(new, new.sum(-1, keepdim=True))).backward()
            >>> new.grad.shape, model.num_train
            (torch.Size([3, 2]), 10)
        """
        X_t, Y_t, noise_t = transform_new_data(self, X, Y, Yvar)
        return self.training_statistics().add(
            self.interpolation.weights(X_t),
            Y_t.squeeze(-1),
            None if noise_t is None else noise_t.squeeze(-1),
        )

    def fit_objective(self) -> tuple[Tensor, Tensor]:
        r"""The exact SKI log marginal likelihood of every observation, and ``n``.

        What ``fit_gpytorch_mll`` maximises (per datum, with the priors) for any marginal
        likelihood wrapping this model, ``ExactMarginalLogLikelihood`` and a
        ``SumMarginalLogLikelihood`` over a ``ModelListGP`` included
        (:meth:`~streamgp.models.base.StreamingModelMixin.compute_custom_loss`).

        Its value checks (the noise, every factorisation's failure flag) are read from the
        device once, after the value is computed; if a factorisation failed, the value is
        computed again with checked factorisations (the kernel's jitter raised as needed,
        or an error), as it always is inside a rebuild.
        """
        failed: list[bool] = []
        with deferred_value_checks(join=False) as checks:
            checks.defer_factorisations = True
            value, n = self._log_marginal_likelihood()
            flag = self._take_failures(checks)
            if flag is not None:
                checks.decide(flag, failed.append)
            checks.read()
        if failed and failed[0]:
            self._invalidate()  # factors folded in this call may be garbage
            with immediate_value_checks():
                value, n = self._log_marginal_likelihood()
        return value, n

    def _log_marginal_likelihood(self) -> tuple[Tensor, Tensor]:
        statistics = self.training_statistics()
        value = self._centered(statistics).log_marginal_likelihood(
            self.kernel_root(), self.noise_variance, tol=self.love_tolerance
        )
        return value.sum(), statistics.n  # summed over the outputs (one per output)

    def kernel_root(self) -> GridKernelRoot:
        r"""Root ``L_K`` of ``K_UU`` at the current hyperparameters (differentiable)."""
        return grid_kernel_root(self.covar_module, self.interpolation.grid)

    @property
    def num_train(self) -> int:
        r"""Number of observations absorbed so far (including conditioning)."""
        extra = sum(entry[0].shape[-2] for entry in self._conditioning_log)
        return self._statistics.count + extra

    def _caches_valid(self) -> bool:
        return self._posterior is not None and self._hyperparameters_unchanged()

    def exact_posterior(self) -> GridPosterior | DataPosterior:
        r"""The posterior given the statistics (before any conditioning correction).

        A :class:`~streamgp.linalg.data_space.DataPosterior` in data space, else the
        posterior of the grid values. Rebuilt from the statistics (``O(n^3)`` or
        ``O(m^3)``) when the hyperparameters changed since the last call, otherwise
        cached. The cache is detached from the hyperparameters (as gpytorch's
        ``detach_test_caches``).
        """
        if not self._caches_valid():
            with immediate_value_checks():  # a rebuild raises where it fails
                self._rebuild_posterior()
        return self._posterior

    def _rebuild_posterior(self) -> None:
        r"""Factorise the posterior from the statistics and replay the conditioning."""
        statistics = self._statistics
        if self._posterior_on_grid(statistics):
            statistics = statistics.to_grid()
        self._check_noise(self._noise_level())  # (the hot paths trust the snapshot's)
        with torch.no_grad():
            root = self.kernel_root()
            self._posterior = self._centered(statistics).posterior(
                root, self.noise_variance, tol=self.love_tolerance
            )
            self._prior_variance = self._new_prior_variance(root)
            self._snapshot_hyperparameters()
            self._hyper_snapshot.values_checked = not skip_value_checks.on()
        # Replay conditioning (keeps gradients w.r.t. the conditioning inputs).
        self._correction = None
        for X_q, y_q, noise_q in self._conditioning_log:
            self._correction = self._current_correction().condition(
                self._posterior, self._rows(X_q), self._residuals(y_q), noise_q
            )

    #: Test-point evaluations expected per hyperparameter change (one BoTorch acquisition
    #: optimisation is ~10^4-10^5), used to choose where the posterior is kept.
    PREDICTIONS_PER_REFIT = 100_000
    #: In data space, the posterior is kept on the grid once ``n`` reaches this (None:
    #: where ``O(m^3)`` per refit plus ``O(4^d m)`` per test point undercut ``O(n^2)`` per
    #: test point, ``sqrt(4^d m + m^3 / PREDICTIONS_PER_REFIT)``: 272 for a 10^3 grid.
    #: A kernel without Kronecker structure pays ``O(4^d m)`` per test point in data
    #: space too (its features ``W_* L_K`` are dense), so there only the refit counts:
    #: ``sqrt(m^3 / PREDICTIONS_PER_REFIT)``, 85 for a 30 x 30 grid).
    GRID_POSTERIOR_MIN_N: int | None = None

    def _posterior_on_grid(self, statistics: DataStatistics | GridStatistics) -> bool:
        r"""Whether the posterior lives on the grid (always in grid space)."""
        if not isinstance(statistics, DataStatistics):
            return True
        if self.structured:  # its grid posterior is a LOVE root: keep the exact one
            return False
        threshold = self.GRID_POSTERIOR_MIN_N
        if threshold is None:
            m, dim = self.interpolation.num_grid, self.interpolation.dim
            per_point = 4**dim * m if is_separable(self.covar_module) else 0
            threshold = math.sqrt(per_point + m**3 / self.PREDICTIONS_PER_REFIT)
        return statistics.count >= threshold

    def grid_posterior(self) -> GridPosterior:
        r"""The posterior of the grid values (before any conditioning correction).

        In data space it is derived from the rows' grid statistics, ``O(m^3)``, and not
        cached; in grid space it is :meth:`exact_posterior`.
        """
        posterior = self.exact_posterior()
        if isinstance(posterior, GridPosterior):
            return posterior
        with torch.no_grad():
            grid = self._centered(self._statistics.to_grid(sparse=self.structured))
            return grid.posterior(self.kernel_root(), self.noise_variance, tol=self.love_tolerance)

    def _current_correction(self) -> LowRankCorrection | DataCorrection:
        if self._correction is not None:
            return self._correction
        posterior = self._posterior
        if isinstance(posterior, DataPosterior):
            return DataCorrection.empty(posterior.whitened)
        # (V's rows index the root's columns: m, or k for a low-rank root)
        return posterior.no_correction

    def _fold_conditioning(self) -> None:
        r"""Turn an unbatched conditioned model into a plain model (exact)."""
        if not self._conditioning_log:
            return
        if len(self.batch_shape) > 0:
            raise RuntimeError(
                "This model was conditioned on batched (fantasy) observations, whose "
                f"batch shape {tuple(self.batch_shape)} cannot be folded into one set of "
                "statistics; call observe / the marginal likelihood on the parent model."
            )
        posterior = self.exact_posterior()
        correction = self._current_correction()
        rows = [
            (self.interpolation.weights(X_q.detach()), y_q.detach(), noise_q.detach())
            for X_q, y_q, noise_q in self._conditioning_log
        ]
        # One addition of all held rows: each GridStatistics.add writes a new m x m A.
        weights = functools.reduce(lambda a, b: a.cat(b), [w for w, _, _ in rows])
        y_all = torch.cat([y_q for _, y_q, _ in rows], dim=-1)
        noise_all = torch.cat([noise_q for _, _, noise_q in rows], dim=-1)
        statistics = self._statistics.add(weights, y_all, noise_all if self.fixed_noise else None)
        with torch.no_grad():
            if isinstance(posterior, GridPosterior):
                posterior = fold_low_rank(posterior, correction.V, correction.gamma)
            else:
                for weights, y_q, noise_q in rows:
                    posterior = posterior.update(weights, self._residuals(y_q), noise_q)
        self._posterior = posterior
        self._correction = None
        self._conditioning_log = []
        self._log_from_observe = True
        self._switch_space_if_needed(statistics)

    def _switch_space_if_needed(self, statistics: DataStatistics | GridStatistics) -> None:
        r"""Set the statistics, folding data-space rows into grid statistics past the limit."""
        if isinstance(statistics, DataStatistics) and statistics.count > self.data_space_limit:
            statistics = statistics.to_grid(sparse=self.structured)
            if not isinstance(self._posterior, GridPosterior) or self.structured:
                self._invalidate()  # the next prediction factorises in grid space, O(m^3)
        self._set_statistics(statistics)

    def restandardize(self, rescale_hyperparameters: bool = True) -> WiskiGP:
        r"""Re-estimate the ``Standardize`` outcome transform from every observation, exactly.

        The transforms are fitted on the constructor's data and then frozen, so a
        ``Standardize`` fitted on a few initial points can be far off later. Its
        statistics are affine in the targets and interpolation rows sum to one, so the
        new mean and standard deviation of all targets, and the statistics of the
        re-standardised targets, follow from the statistics themselves in ``O(m^2)``
        (``O(n)`` in data space): the model afterwards equals one built from all data
        at once with ``Standardize`` fitted on all of them (tested to 1e-10). Call it
        before a refit of the hyperparameters.

        Args:
            rescale_hyperparameters: Express the noise variance (and a ``ScaleKernel``'s
                output scale) in the new units, so that only the prior mean (zero in the
                new standardised space) changes. False keeps their values. A learned
                constant mean (``mean_module``) is always carried over, so with it the
                model is unchanged.

        Returns:
            The model itself. Learned (homoskedastic) noise only: grid statistics with
            fixed noise keep only noise-weighted target sums. If it raises, the model
            is unchanged.
        """
        # It also writes into the transform, the prior mean and the kernel's scales.
        state = self.mutable_state
        modules = ("likelihood", "outcome_transform", "mean_module", "covar_module")
        with transaction(self, dataclasses.replace(state, modules=modules)):
            return self._restandardize(rescale_hyperparameters)

    def _restandardize(self, rescale_hyperparameters: bool) -> WiskiGP:
        if self._num_outputs > 1:
            raise ValueError(
                "restandardize needs a single-output model: re-estimating each output's "
                "scale would give the outputs different noise levels, which they share."
            )
        transform = getattr(self, "outcome_transform", None)
        if not isinstance(transform, Standardize) or transform._m != 1:
            raise ValueError(
                "restandardize needs outcome_transform=Standardize(1); this model has "
                f"{type(transform).__name__ if transform is not None else None}."
            )
        if self.fixed_noise:
            raise ValueError(
                "restandardize supports learned noise only: with train_Yvar the statistics "
                "keep noise-weighted target sums, not the moments Standardize needs."
            )
        if len(self.batch_shape) > 0:
            raise RuntimeError("restandardize is not available on a batched (fantasy) model.")

        self._fold_observed()
        statistics = self._statistics
        n = statistics.count
        if n < 2:
            raise ValueError(f"restandardize needs at least 2 observations; the model has {n}.")
        with torch.no_grad():
            total, squares = statistics.target_moments()
            mean_t = total / n
            var_t = ((squares - total * mean_t) / (n - 1)).clamp_min(0.0)
            old_mean, old_std = transform.means.reshape(()), transform.stdvs.reshape(())
            new_mean = old_mean + old_std * mean_t
            new_std = old_std * var_t.sqrt()
            new_std = torch.where(new_std >= transform._min_stdv, new_std, torch.ones_like(new_std))
            alpha, beta = old_std / new_std, (old_mean - new_mean) / new_std
            self._set_statistics(statistics.affine(alpha, beta))
            if isinstance(self.mean_module, ConstantMean):  # the same prior mean, new units
                self.mean_module.constant = alpha * self.mean_module.constant + beta
            transform.means.fill_(new_mean)
            transform.stdvs.fill_(new_std)
            transform._stdvs_sq.fill_(new_std**2)
            if rescale_hyperparameters:
                self.likelihood.noise = self.likelihood.noise * alpha**2
                for kernel in self._scale_kernels():
                    kernel.outputscale = kernel.outputscale * alpha**2
        self._invalidate()
        return self

    def _scale_kernels(self) -> list[ScaleKernel]:
        r"""The kernels whose output scales carry the targets' units (``restandardize``)."""
        return [self.covar_module] if isinstance(self.covar_module, ScaleKernel) else []

    # ------------------------------------------------------------ BoTorch API
    def is_data_key(self, key: str) -> bool:
        # A fixed-noise likelihood holds the mean noise of this model's rows: data too.
        return super().is_data_key(key) or (self.fixed_noise and key.startswith("likelihood."))

    @property
    def batch_shape(self) -> torch.Size:
        shape = super().batch_shape
        # A multi-output correction carries the outputs as its last batch dimension.
        return shape[:-1] if self._num_outputs > 1 and self._correction is not None else shape

    def _transform_new_data(
        self, X: Tensor, Y: Tensor | None = None, Yvar: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        r"""Pass new data through the frozen input and outcome transforms."""
        return transform_new_data(self, X, Y, Yvar)

    # ------------------------------------------- training rows, as SingleTaskGP shows them
    def _kept_rows(self) -> tuple[Tensor, Tensor, Tensor | None] | None:
        r"""Raw ``(X, Y, Yvar)`` of the rows behind the statistics (views of the kept
        observations, no copy), or None when the model keeps no raw data.

        A view (a conditioned model) reads its parent's store, which only grows, as long
        as its statistics are those it was made with; once it folds rows of its own into
        them (``observe`` on a view) it knows only the statistics, like a model built
        with ``keep_data=False``.
        """
        outputs = None
        if self.observations is not None:
            store, n = self.observations, self._stored_count()
        elif self._row_source is not None and self._row_source[1] is self._statistics:
            store, _, outputs, n = self._row_source
        else:
            return None
        X, Y, Yvar = store.X[:n], store.Y[:n], store.Yvar
        Yvar = None if Yvar is None else Yvar[:n]
        if outputs is not None:
            Y, Yvar = Y[:, outputs], None if Yvar is None else Yvar[:, outputs]
        return X, Y, Yvar

    def _stored_count(self) -> int:
        r"""The kept rows in the statistics: all but the observed rows held back in the
        conditioning log (``FOLD_RANK``), counted on the host (no device read)."""
        return len(self.observations) - sum(entry[0].shape[-2] for entry in self._conditioning_log)

    def _transformed_rows(self) -> tuple[Tensor, Tensor, Tensor | None] | None:
        r""":meth:`_kept_rows` through the frozen transforms (``O(n)``, no gradient)."""
        rows = self._kept_rows()
        if rows is None or len(rows[0]) == 0:
            return rows
        with torch.no_grad():
            return self._transform_new_data(*rows)

    def _log_parts(self, index: int) -> list[Tensor]:
        r"""Entry ``index`` (0: inputs, 1: targets, 2: noise) of every conditioning row
        block, the noise as ``batch x q`` whatever the number of outputs."""
        parts = [entry[index] for entry in self._conditioning_log]
        if index == 2 and self._num_outputs > 1:  # batched rows: batch x 1 x q
            parts = [p.squeeze(-2) if p.dim() > 1 else p for p in parts]
        return parts

    def training_noise(self) -> Tensor:
        r"""Every training row's fixed noise variance, as ``SingleTaskGP``'s ``likelihood.noise``.

        What ``likelihood.noise`` returns for a model built with ``train_Yvar`` (read on
        access: updates never copy it). In the outcome-transformed space, in the order
        the rows arrived, followed by the rows a conditioned (fantasy) model was
        conditioned on: ``batch x n`` (``batch x k x n`` for ``k`` outputs, which share
        each row's noise). Costs ``O(n)`` per call. Where the rows come from:

        - with kept data (``keep_data=True``, the default): the kept ``Yvar`` through
          the frozen outcome transform;
        - otherwise, while the model is in data space: the rows' noise it holds;
        - otherwise (grid statistics only, ``keep_data=False``): the rows are folded
          into sums and their individual noise is gone; each absorbed row then shows
          their mean noise (so the mean, which BoTorch's ``fantasize`` uses for
          fantasy rows, is exact).

        Example:
            >>> X = torch.rand(5, 1, dtype=torch.float64)
            >>> Yvar = torch.rand(5, 1, dtype=torch.float64) + 0.1
            >>> model = WiskiGP(X, X, Yvar, outcome_transform=None, grid_size=16)
            >>> bool(torch.equal(model.likelihood.noise, Yvar.squeeze(-1)))
            True
        """
        if not self.fixed_noise:
            raise AttributeError("training_noise: this model learns its noise (no train_Yvar).")
        rows = self._transformed_rows()
        statistics = self._statistics
        if rows is not None:
            noise = rows[2][..., 0]
        elif isinstance(statistics, DataStatistics):
            noise = statistics.noise
        else:
            noise = self._noise_level().expand(statistics.count)
        noise = concat_rows([noise, *self._log_parts(2)], self.batch_shape)
        if self._num_outputs > 1:
            noise = noise.unsqueeze(-2).expand(*noise.shape[:-1], self._num_outputs, -1)
        return noise

    def _rows_or_raise(self, name: str) -> tuple[Tensor, Tensor, Tensor | None]:
        rows = self._transformed_rows()
        if rows is None:
            # An AttributeError: BoTorch's helpers probe hasattr(model, "train_inputs").
            raise AttributeError(
                f"{name}: this model keeps no raw observations (keep_data=False, or an "
                "interpolation that is not a grid), only their statistics."
            )
        return rows

    @property
    def train_inputs(self) -> tuple[Tensor]:
        r"""``(X,)``: the training inputs in the transformed space, as ``SingleTaskGP``'s.

        ``batch x n x d``: the kept observations through the frozen input transform,
        followed by the rows a conditioned (fantasy) model was conditioned on. Assembled
        on access from the kept raw data (``O(n d)``); a model built with
        ``keep_data=False`` keeps no inputs and has no ``train_inputs`` (an
        ``AttributeError``, which BoTorch's helpers treat as "not available"). The
        outputs of a multi-output model share their inputs: no output dimension.
        """
        X_t = self._rows_or_raise("train_inputs")[0]
        parts = [X_t, *(X_q.detach() for X_q in self._log_parts(0))]
        return (concat_row_inputs(parts, self.batch_shape),)

    @property
    def train_targets(self) -> Tensor:
        r"""The training targets in the transformed space, as ``SingleTaskGP``'s.

        ``batch x n`` (``batch x k x n`` for ``k`` outputs), in the order of
        :attr:`train_inputs`; not available with ``keep_data=False`` (see there).
        """
        Y_t = self._rows_or_raise("train_targets")[1]
        k = self._num_outputs
        shape = self.batch_shape if k == 1 else torch.Size([*self.batch_shape, k])
        return concat_rows([self._targets(Y_t), *self._log_parts(1)], shape)

    @property
    def _has_transformed_inputs(self) -> bool:
        # BoTorch's flag: train_inputs are in the transformed space (always, here).
        return getattr(self, "input_transform", None) is not None

    @property
    def _original_train_inputs(self) -> Tensor | None:
        r"""The training inputs before the input transform (BoTorch reads them, e.g. as
        ``X_baseline``): the kept raw inputs, then the conditioning rows untransformed."""
        if not self._has_transformed_inputs:
            return None
        self._rows_or_raise("_original_train_inputs")
        X = self._kept_rows()[0]
        if self._conditioning_log and self.observations is not None:
            X = self.observations.X  # observed rows held back (FOLD_RANK) are kept too
        elif self._conditioning_log:
            try:
                parts = [self.input_transform.untransform(p.detach()) for p in self._log_parts(0)]
            except NotImplementedError as error:
                raise AttributeError(
                    "_original_train_inputs: the input transform cannot be inverted."
                ) from error
            X = concat_row_inputs([X, *parts], self.batch_shape)
        return X

    def _transform_tensor_args(
        self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        r"""BoTorch's layout of training data: the outputs moved before the rows.

        As ``BatchedMultiOutputGPyTorchModel._transform_tensor_args``, except that the
        inputs get no output dimension (the outputs of a multi-output ``WiskiGP`` share
        them, see :attr:`train_inputs`).

        Args:
            X: ``batch x n x d`` inputs.
            Y: ``batch x n x k`` targets.
            Yvar: Optional ``batch x n x k`` noise variances.

        Returns:
            ``X`` unchanged, and ``Y`` and ``Yvar`` as ``batch x n`` (one output) or
            ``batch x k x n``.
        """
        k = self._num_outputs
        check_tensor(X, "X", min_dim=2, last_dim=self.interpolation.dim)
        check_tensor(Y, "Y", like=X, min_dim=2, last_dim=k)
        if Y.shape[:-1] != X.shape[:-1]:
            raise ValueError(
                f"Y has shape {tuple(Y.shape)}; expected {tuple(X.shape[:-1])} x {k} for X of "
                f"shape {tuple(X.shape)}."
            )
        if Yvar is not None:
            check_tensor(Yvar, "Yvar", like=X, min_dim=2)
            if Yvar.shape != Y.shape:
                raise ValueError(
                    f"Yvar has shape {tuple(Yvar.shape)}; expected Y's {tuple(Y.shape)}."
                )
        return X, self._targets(Y), None if Yvar is None else self._targets(Yvar)

    def _check_inputs(self, X: Tensor, name: str, min_dim: int = 2) -> None:
        check_tensor(
            X,
            name,
            like=self.interpolation.bounds,
            min_dim=min_dim,
            last_dim=self.interpolation.dim,
        )

    def love_grid_posterior(self) -> GridPosterior | None:
        r"""The grid posterior with a rank-``k`` LOVE root, or None for the exact path.

        Large grids always have one (their grid posterior is LOVE's). Dense grids
        have one inside ``fast_pred_var`` / ``fast_pred_samples`` for models without
        a conditioning correction: the Nystrom root of ``R R^T`` of the rank that
        meets ``love_tolerance``, cached until the exact posterior is replaced.
        """
        love_on = fast_pred_var.on() or fast_pred_samples.on()
        if self._conditioning_log and self._log_from_observe and love_on:
            self._fold_conditioning()  # observed rows held back: LOVE needs one root
        posterior = self.exact_posterior()
        if self._correction is not None or isinstance(posterior, DataPosterior):
            return None
        if self.structured:
            return posterior
        if not (fast_pred_var.on() or fast_pred_samples.on()):
            return None
        cache = self._love_cache
        if cache is None or cache[0] is not posterior or cache[1] != self.love_tolerance:
            root = compress_root(posterior.root, tol=self.love_tolerance)
            cache = (posterior, self.love_tolerance, GridPosterior(root, posterior.mean))
            self._love_cache = cache
        return cache[2]

    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of the latent function at already-transformed inputs ``X``."""
        posterior = self.exact_posterior()
        love = self.love_grid_posterior()
        correction = self._current_correction()
        if love is None and X.is_cuda and cuda_graphs.on() and isinstance(posterior, GridPosterior):
            return self._graphed_forward(X, posterior, correction)
        weights = self._rows(X)
        # k(x, x) - w^T K_UU w on the diagonal (exact_prior_variance); the same for
        # the marginal variances and the joint covariance, exact and LOVE paths alike.
        diagonal = self.prior_variance_correction(X, weights)
        if love is not None:
            # Sparse W_* times the m x k root: t x k, never t x 4^d x m.
            mean = self._plus_prior_mean(weights.dot(love.mean))
            root = weights.matmul(love.root)
            root = root.expand(*mean.shape, root.shape[-1])  # shared by the outputs
            return MultivariateNormal(mean, root_covariance(root, diagonal))
        mean, positive, negative = self._predictive_factors(weights, posterior, correction)
        return self._factored_normal(mean, positive, negative, diagonal)

    def _predictive_factors(
        self, weights: Any, posterior: GridPosterior | DataPosterior, correction: Any
    ) -> tuple[Tensor, tuple, tuple]:
        r"""The mean (prior mean included) and the covariance's positive and negative
        factors at the rows ``weights`` (see :class:`PosteriorCovariance`)."""
        mean, positive, negative = correction.predict_factors(posterior, weights)
        return self._plus_prior_mean(mean), positive, negative

    @staticmethod
    def _factored_normal(
        mean: Tensor, positive: tuple, negative: tuple, diagonal: Tensor | None
    ) -> MultivariateNormal:
        # Variances from the factors, the dense t x t matrix only when asked for (joint
        # samples, Cholesky); a LinearOperator also defers factorisation to whoever needs
        # it (samplers add jitter as required).
        covar = PosteriorCovariance(positive, negative, diagonal, batch_shape=mean.shape[:-1])
        return MultivariateNormal(mean, covar)

    def _graphed_forward(
        self, X: Tensor, posterior: GridPosterior, correction: LowRankCorrection
    ) -> MultivariateNormal:
        r""":meth:`forward` in grid space from a replayed CUDA graph of
        :meth:`_grid_factors` (see :class:`streamgp.settings.cuda_graphs`)."""

        def factors(X: Tensor) -> tuple[Tensor, ...]:
            with without_parameter_grads(self):  # a gradient in X only
                return self._grid_factors(X, posterior, correction)

        if getattr(self, "_graphs", None) is None:
            self._graphs = GraphCache()
        anchors = (posterior, correction, self._prior_variance)
        key = tuple(id(anchor) for anchor in anchors)
        mean, root, *rest = self._graphs(key, factors, X, anchors)
        num_negative = 1 if correction.rank else 0
        negative = tuple(rest[:num_negative])
        diagonal = rest[num_negative] if len(rest) > num_negative else None
        return self._factored_normal(mean, (root,), negative, diagonal)

    def _grid_factors(
        self, X: Tensor, posterior: GridPosterior, correction: LowRankCorrection
    ) -> tuple[Tensor, ...]:
        r"""The grid-space posterior at ``X`` as plain tensors, without host reads: the
        mean, the root ``W_* R``, the correction's root (if conditioned) and the exact
        prior variance's diagonal (if on), in that order."""
        with skip_value_checks():  # (checked by the caller, before any graph)
            weights = self._rows(X)
            diagonal = self.prior_variance_correction(X, weights)
            mean, (root,), negative = self._predictive_factors(weights, posterior, correction)
        root = root if isinstance(root, Tensor) else root.tensor
        return (mean, root, *negative, *(() if diagonal is None else (diagonal,)))

    def _new_prior_variance(self, root: GridKernelRoot) -> PriorVarianceCorrection:
        r"""The prior variance correction of the kernel with its (detached) root."""
        return PriorVarianceCorrection(self.covar_module, root, self.interpolation.bounds[:1])

    def prior_variance_correction(self, X: Tensor, weights: Any) -> Tensor | None:
        r"""``d(x) = k(x, x) - w(x)^T K_UU w(x)`` (clamped at 0) at transformed inputs.

        The diagonal the predictive covariance gets (see ``exact_prior_variance``), in
        the layout of the rows ``weights`` (``batch x t``); None when switched off (the
        constructor's ``exact_prior_variance`` or
        :class:`streamgp.settings.exact_prior_variance`).
        """
        if not (self.exact_prior_variance and exact_prior_variance_setting.on()):
            return None
        if self._prior_variance is None:  # a posterior set without a rebuild (rare)
            with torch.no_grad(), immediate_value_checks():
                self._prior_variance = self._new_prior_variance(self.kernel_root())
        return self._prior_variance(X, weights)

    def _plus_prior_mean(self, values: Tensor, sign: int = 1) -> Tensor:
        r"""``values`` (``... x q``, or ``... x k x q`` for ``k`` outputs) plus ``sign``
        times the prior mean."""
        prior_mean = self._prior_mean()
        if prior_mean is None:
            return values
        return values + sign * prior_mean.unsqueeze(-1)

    # -------------------------------------------------------------- updates
    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> WiskiGP:
        r"""Absorb new observations in place, in ``O(m^2 q)`` time (independent of ``n``).

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x k`` new targets (``k`` outputs) (original space).
            Yvar: ``q x k`` noise variances (original space); required exactly when
                the model was built with ``train_Yvar``.

        Returns:
            The model itself. On invalid input, or any failure (a factorisation, an
            interrupt) on the way, raises and leaves the model unchanged.
        """
        with transaction(self):  # any exception (KeyboardInterrupt too) rolls back
            return self._observe(X, Y, Yvar)

    def _observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None) -> WiskiGP:
        with self._checked_call() as checks:  # one host read of the value checks
            check_new_observations(
                X,
                Y,
                Yvar,
                like=self.interpolation.bounds,
                dim=self.interpolation.dim,
                fixed_noise=self.fixed_noise,
                num_outputs=self._num_outputs,
            )
            X_t, Y_t, Yvar_t = self._transform_new_data(X, Y, Yvar)
            if self._conditioning_log and len(self.batch_shape) > 0 and len(X):
                raise RuntimeError(
                    "observe is not available on a model conditioned on batched (fantasy) "
                    "observations; observe on the parent model instead."
                )
            outside = []  # set at the read: whether a kept-data model must re-grid
            if self.observations is None:
                self._check_observed_inputs(X_t)
            elif not skip_value_checks.on() and len(X):
                flag = self.interpolation.any_outside(X_t)
                checks.decide(flag, outside.append)
            noise = None if Yvar_t is None else self._shared_noise(Yvar_t, "Yvar")
            self._read_checks(checks)
            if outside and outside[0]:
                with immediate_value_checks():
                    bounds = grown_grid_bounds(self.interpolation.bounds, X_t.detach())
                    self._regrid(bounds, X, Y, Yvar)
                return self
            if len(X) == 0:
                return self
            self._observe_on_grid(X_t, Y_t, noise)
            self._pending_failure = self._take_failures(checks)
        if self.observations is not None:
            self.observations.append(X, Y, Yvar)
        return self

    def _check_observed_inputs(self, X_t: Tensor) -> None:
        r"""Check observed inputs (transformed) against the interpolation's domain, in the
        call's one read: a grid without kept data refuses points outside its box."""
        self.interpolation.check_inside(X_t, "X")

    def _observe_on_grid(self, X_t: Tensor, Y_t: Tensor, noise: Tensor | None) -> None:
        r"""Absorb transformed rows inside the grid (the update of :meth:`observe`), with
        their shared noise variances (``q``, fixed noise) or None."""
        weights = self.interpolation.weights(X_t)
        y = self._targets(Y_t)
        if self._can_defer(y.shape[-1]):
            self._defer(X_t.detach() if X_t.requires_grad else X_t, weights, y)
            return
        self._fold_conditioning()
        with torch.no_grad():
            statistics = self._statistics.add(weights, y, noise)
            posterior = self._updated_posterior(weights, self._residuals(y), noise, statistics)
        self._posterior = posterior
        self._switch_space_if_needed(statistics)

    def _regridded_interpolation(
        self, bounds: Tensor, X: Tensor, X_t: Tensor, grid_size: list[int] | None = None
    ) -> tuple[CubicGridInterpolation, bool]:
        r"""The interpolation over the box ``bounds`` (and ``structured``), covering the
        transformed inputs ``X_t`` (of raw ``X``), with ``grid_size`` points per axis
        (default: the model's ``grid_size`` option)."""
        size = self._grid_size_option if grid_size is None else grid_size
        return build_grid(X, X_t, bounds, size, self.covar_module, self.MAX_DENSE_GRID)

    def _regrid(
        self,
        bounds: Tensor,
        X: Tensor,
        Y: Tensor,
        Yvar: Tensor | None,
        grid_size: list[int] | None = None,
    ) -> None:
        r"""Move to a grid over ``bounds`` holding every kept observation and ``(X, Y, Yvar)``.

        Exact: the statistics are rebuilt from the raw data through the frozen
        transforms, so the model equals one built on all data with this grid (and the
        same transforms and hyperparameters). ``O(n 4^d)`` for the rows plus a
        factorisation at the next prediction. Nothing changes if it fails.
        """
        store = self.observations
        X_all, Y_all = torch.cat([store.X, X]), torch.cat([store.Y, Y])
        Yvar_all = None if Yvar is None else torch.cat([store.Yvar, Yvar])
        X_t, Y_t, Yvar_t = self._transform_new_data(X_all, Y_all, Yvar_all)
        interpolation, structured = self._regridded_interpolation(bounds, X_all, X_t, grid_size)
        self._check_dense_for_outputs(interpolation, structured)
        noise = None if Yvar_t is None else self._shared_noise(Yvar_t, "Yvar")
        with torch.no_grad():
            statistics = self._statistics_of(
                interpolation, structured, X_t, self._targets(Y_t), noise
            )
        store.append(X, Y, Yvar)
        self.interpolation, self.structured = interpolation, structured
        self._clear_caches()
        self._set_statistics(statistics)

    def refine_grid(
        self,
        grid_size: int | Sequence[int] | None = None,
        *,
        max_grid_points: int | None = None,
    ) -> WiskiGP:
        r"""Move to a finer grid, exactly: the statistics are rebuilt from the kept data.

        The remedy for a fit whose lengthscales are too short for the grid
        (:class:`~streamgp.models.utils.resolution.CoarseGridWarning`): afterwards the
        model equals one built on all its observations with the new grid (the same
        box, transforms and hyperparameters). ``O(n 4^d)`` for the rows plus a
        factorisation at the next prediction; the loops call it after each refit.

        Args:
            grid_size: Points per axis (an int for every axis, or one per axis), at
                least the current ones. Default: the size that puts
                ``MIN_SPACINGS_PER_LENGTHSCALE`` grid spacings in every fitted
                lengthscale (nothing changes where the grid is fine enough).
            max_grid_points: Cap on the grid's points (the default size is shrunk
                evenly on the axes it refines, never below the current grid).

        Returns:
            The model itself. Raises (and changes nothing) on a bad argument, or if the
            model keeps no data (``keep_data=False``, a conditioned view).

        Example:
            >>> X = torch.linspace(0, 1, 50, dtype=torch.float64).unsqueeze(-1)
            >>> model = WiskiGP(X, torch.sin(20 * X), grid_size=8)
            >>> model.covar_module.lengthscale = 0.05
            >>> model.refine_grid().interpolation.grid_size
            [43]
        """
        with transaction(self):
            size = self._refined_grid_size(grid_size, max_grid_points)
            if size is None:
                return self
            if self.observations is None:
                raise RuntimeError(
                    "refine_grid rebuilds the statistics from the kept observations, and "
                    "this model keeps none (keep_data=False, or a conditioned view)."
                )
            X, Y = self.observations.X, self.observations.Y
            Yvar = None if self.observations.Yvar is None else self.observations.Yvar[:0]
            with immediate_value_checks():
                self._regrid(self.interpolation.bounds, X[:0], Y[:0], Yvar, size)
            self._grid_size_option = size
        return self

    def _refined_grid_size(
        self, grid_size: int | Sequence[int] | None, max_grid_points: int | None
    ) -> list[int] | None:
        r""":meth:`refine_grid`'s new size (validated), or None where nothing changes."""
        current = list(self.interpolation.grid_size)
        dim = len(current)
        if max_grid_points is not None:
            check_count(max_grid_points, "max_grid_points", minimum=math.prod(current))
        if grid_size is None:
            size = suggested_grid_size(self.covar_module, self.interpolation)
            if size is None:
                return None
            if max_grid_points is not None and math.prod(size) > max_grid_points:
                refined = [i for i in range(dim) if size[i] > current[i]]
                shrink = (max_grid_points / math.prod(size)) ** (1.0 / len(refined))
                for i in refined:
                    size[i] = max(current[i], math.floor(size[i] * shrink))
        else:
            if isinstance(grid_size, int):
                sizes = [grid_size] * dim
            else:
                sizes = list(grid_size) if isinstance(grid_size, Sequence) else []
            if len(sizes) != dim or any(
                not isinstance(g, int) or isinstance(g, bool) or g < c
                for g, c in zip(sizes, current, strict=False)
            ):
                raise ValueError(
                    f"grid_size must be an int or {dim} ints, each at least the current "
                    f"grid's {current}; got {grid_size!r}."
                )
            size = sizes
            if max_grid_points is not None and math.prod(size) > max_grid_points:
                raise ValueError(
                    f"grid_size {size} has {math.prod(size)} points, more than "
                    f"max_grid_points = {max_grid_points}."
                )
        return None if size == current else size

    #: In grid space, small batches are first held as a low-rank correction of the root
    #: (what ``condition_on_observations`` builds, ``O(m q Q)``), and folded into the
    #: statistics and the root once its rank reaches ``FOLD_RANK``: one rank-``Q`` update
    #: of the ``m x m`` root instead of ``Q / q`` memory-bound rank-``q`` ones.
    FOLD_RANK = 32

    def _can_defer(self, q: int) -> bool:
        return (
            isinstance(self._posterior, GridPosterior)
            and not self.fixed_noise  # its likelihood holds the mean noise of all rows
            and q <= self.ROOT_UPDATE_MAX_FRACTION * self.interpolation.num_grid
            and self._caches_valid()
        )

    def _defer(self, X_t: Tensor, weights: InterpolationWeights, y: Tensor) -> None:
        with torch.no_grad():
            posterior = self.exact_posterior()
            noise = self.noise_variance.detach().expand(y.shape[-1:])
            self._correction = self._current_correction().condition(
                posterior, weights, self._residuals(y), noise
            )
        # A new list: views made earlier share the old one.
        self._conditioning_log = [*self._conditioning_log, (X_t, y, noise)]
        if self._correction.rank >= self.FOLD_RANK:
            self._fold_conditioning()

    #: A grid-space batch of ``q`` rows is absorbed by the rank-``q`` root update while
    #: ``q <= ROOT_UPDATE_MAX_FRACTION * m``; larger batches refactorise from the
    #: statistics, which is then cheaper (both are exact).
    ROOT_UPDATE_MAX_FRACTION = 0.25

    def _updated_posterior(
        self,
        weights: InterpolationWeights,
        y: Tensor,
        noise: Tensor | None,
        statistics: DataStatistics | GridStatistics,
    ) -> GridPosterior | DataPosterior | None:
        r"""The cached posterior after adding rows, or None to rebuild it lazily."""
        if not self._caches_valid():
            return None
        posterior = self._posterior
        update_noise = self.noise_variance.expand(y.shape[-1:]) if noise is None else noise
        if isinstance(posterior, DataPosterior):
            if statistics.count > self.data_space_limit or self._posterior_on_grid(statistics):
                return None  # the next prediction factorises on the grid
            return posterior.update(weights, y, update_noise)
        # A large grid's posterior is a rank-k LOVE root: it is updated the same way
        # (O(m k q), no m x m matrix); the statistics stay exact, and the root is rebuilt
        # from them at the next hyperparameter change (see the module docs).
        if y.shape[-1] > self.ROOT_UPDATE_MAX_FRACTION * posterior.root.shape[-1]:
            return None
        return update_root(posterior, weights, y, update_noise)

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> WiskiGP:
        r"""A new model conditioned on ``(X, Y)``, sharing this model's grid root.

        The new model holds a rank-``q`` correction of this model's posterior (no
        copy of the ``m x m`` root), costs ``O(b m q)`` memory for ``b`` batches, and
        is differentiable with respect to ``X`` (as qNIPV / qKG need). It shares the
        kernel, likelihood and transform modules with this model (a view, not a
        deep copy); ``observe`` on this model later does not affect it.

        Args:
            X: ``batch_shape x q x d`` inputs (original space).
            Y: ``sample_shape x batch_shape x q x k`` targets (original space).
            noise: Optional ``batch_shape x q x k`` noise variances in the
                outcome-transformed space (BoTorch's convention); default: the
                model's noise level (mean training noise for fixed noise).

        Returns:
            A ``WiskiGP`` with batch shape ``sample_shape + broadcast(batch, model.batch)``.
        """
        with self._checked_call() as checks:  # one host read of the value checks
            check_conditioning_data(
                X,
                Y,
                noise,
                like=self.interpolation.bounds,
                dim=self.interpolation.dim,
                num_outputs=self._num_outputs,
                # A grid box's check_inside refuses NaN and Inf too (they leave the box).
                finite_X=not isinstance(self.interpolation, GridBox),
            )
            X_t, Y_t, _ = self._transform_new_data(X, Y)
            self.interpolation.check_inside(X_t, "X")
            if noise is not None and self._num_outputs > 1:
                noise = self._shared_noise(noise, "noise").unsqueeze(-1)
            self._read_checks(checks)
            posterior = self.exact_posterior()
            y = self._targets(Y_t)
            noise_q = self._row_noise(conditioning_noise(noise, self, X))
            correction = self._current_correction().condition(
                posterior, self._rows(X_t), self._residuals(y), noise_q
            )
            new = self._view()
            new._correction = correction
            new._conditioning_log = [*self._conditioning_log, (X_t, y, noise_q)]
            new._log_from_observe = False
            new._pending_failure = self._take_failures(checks)  # read with its first call
        return new

    def subset_output(self, idcs: list[int]) -> WiskiGP:
        r"""A model of the outputs ``idcs`` only, as BoTorch's ``subset_output``.

        A view: the rows, the Gram statistics and the root stay shared; only the selected
        outputs' targets, ``W^T y``, ``y^T y`` and grid means are taken (``O(|idcs| m)``).
        The outcome transform is subset with it. For a model without a batch (fantasy)
        shape.

        Args:
            idcs: Output indices, each in ``[0, num_outputs)``.

        Returns:
            A ``WiskiGP`` with ``len(idcs)`` outputs (single-output for one index).
        """
        k = self._num_outputs
        idcs = list(idcs)
        if not idcs or any(not isinstance(i, int) or not 0 <= i < k for i in idcs):
            raise ValueError(f"idcs must be output indices in [0, {k}), got {idcs}.")
        if len(self.batch_shape) > 0:
            raise RuntimeError(
                "subset_output is not available on a model conditioned on batched (fantasy) "
                "observations; take it on the parent model."
            )
        new = self._view()
        if idcs == list(range(k)):
            return new
        index = torch.tensor(idcs, device=self.interpolation.bounds.device)

        def pick(tensor: Tensor, dim: int) -> Tensor:  # ``dim``: the output dimension
            if len(idcs) == 1:
                return tensor.select(dim, idcs[0])
            return tensor.index_select(dim, index)

        new._num_outputs = len(idcs)
        new._statistics = self._statistics.select_outputs(pick)
        if self._kept_rows() is not None:  # the kept rows of these outputs
            store, _, outputs, n = new._row_source
            outputs = idcs if outputs is None else [outputs[i] for i in idcs]
            new._row_source = (store, new._statistics, outputs, n)
        if self._posterior is not None:
            new._posterior = self._posterior.select_outputs(pick)
        if self._correction is not None:
            new._correction = self._correction.select_outputs(pick)
        new._conditioning_log = [(X, pick(y, -2), noise) for X, y, noise in self._conditioning_log]
        new._love_cache = None
        transform = getattr(self, "outcome_transform", None)
        if transform is not None:
            new.outcome_transform = transform.subset_output(idcs)
        if isinstance(self.mean_module, ConstantMean) and self.mean_module.constant.numel() > 1:
            # BoTorch's subset_output copies the picked outputs' hyperparameters.
            constant = self.mean_module.constant.detach()
            mean_module = ConstantMean(batch_shape=pick(constant, -1).shape).to(constant)
            mean_module.constant = pick(constant, -1)
            new.mean_module = mean_module
        return new

    def _view(self) -> WiskiGP:
        r"""A new model object sharing this one's tensors and hyperparameter modules.

        Cheap (no tensor or module copies): the statistics and grid factors are
        immutable in practice (``observe`` replaces them rather than writing into
        them), and a shared kernel/likelihood means a conditioned model is a view of
        its parent with extra data. Changing hyperparameters on either model makes
        that model rebuild its own factors from its own statistics.

        A view keeps no raw observations (its parent's store grows in place): it cannot
        re-grid, and refuses observations outside its grid.
        """
        new = shallow_view(self)
        if self.observations is not None:
            new._row_source = (self.observations, self._statistics, None, self._stored_count())
        new.observations = None
        if self.fixed_noise:  # its own likelihood: its rows' noise, never the parent's
            new.likelihood = bind_row_noise(new)
        return new
