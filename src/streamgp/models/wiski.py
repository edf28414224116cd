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
a ``WiskiGP`` on ``d >= 4`` inputs therefore stays in data space for good, and there
it evaluates its kernel exactly (:mod:`streamgp.interpolation.exact`,
:attr:`WiskiGP.evaluates_kernel_exactly`): interpolating it would buy nothing, as every
block is ``n x n`` either way, and in ``d`` dimensions the SKI kernel's ``d`` per-axis
blocks cost more than the kernel's one. It is then an exact GP with the same data-space
algebra (``O(n^2 q)`` per update, ``O(n^3)`` per fit, not constant in ``n``), equal to
``SingleTaskGP`` with the same hyperparameters; observations never re-grid and
predictions are never clamped onto the box. It warns once
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
Nystrom log-determinant within a certified gap of :meth:`likelihood_gap` (``love_tolerance``,
or ``LIKELIHOOD_TOLERANCE = 1e-9`` nats per observation where that is coarser) and
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

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from botorch.models.gpytorch import BatchedMultiOutputGPyTorchModel
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.utils.types import DEFAULT, _DefaultType
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.models import GP
from gpytorch.settings import fast_pred_samples, fast_pred_var
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.exact import ExactKernelInputs
from streamgp.interpolation.grid import (
    EXTRAPOLATION_POLICIES,
    CubicGridInterpolation,
    InterpolationWeights,
)
from streamgp.linalg.data_space import DataCorrection, DataPosterior
from streamgp.linalg.exact_kernel import ExactKernelRoot
from streamgp.linalg.grid_kernel import GridKernelRoot, grid_kernel_root, is_separable
from streamgp.linalg.love import DEFAULT_TOLERANCE, compress_root
from streamgp.linalg.prior_variance import PriorVarianceCorrection
from streamgp.linalg.statistics import DataStatistics, GridStatistics
from streamgp.linalg.woodbury import (
    GridPosterior,
    LowRankCorrection,
    fold_low_rank,
    update_root,
)
from streamgp.models._wiski import (
    BoTorchDataMixin,
    CheckpointStateMixin,
    OutputsMixin,
    PredictionMixin,
    RebuildMixin,
    StatisticsMixin,
    UpdatesMixin,
    ValueChecksMixin,
)
from streamgp.models._wiski.checks import check_batched_options
from streamgp.models._wiski.state import _DATA_KEY_PREFIXES, _GRID_FIELDS  # noqa: F401 (as before)
from streamgp.models._wiski.statistics import UNLIMITED_DATA_SPACE
from streamgp.models.base import StreamingModelMixin
from streamgp.models.utils import (
    CachedPosteriorMixin,
    FrozenTransformsMixin,
    MutableState,
    fit_frozen_transforms,
)
from streamgp.models.utils.fixed_noise import bind_row_noise
from streamgp.models.utils.grids import (
    DEFAULT_CUDA_GRID_POINTS,
    DEFAULT_GRID_POINTS,
    HIGH_DIM_POINTS_PER_UNIT,
    HighDimensionalGridWarning,
    build_grid,
    check_structured_kernel,
    default_grid_size,
    warn_high_dimensional,
)
from streamgp.models.utils.observations import ObservationStore
from streamgp.models.utils.resolution import GridResolutionMixin
from streamgp.settings import immediate_value_checks, skip_value_checks
from streamgp.utils.validation import (
    check_choice,
    check_count,
    check_grid_model_data,
    learns_input_coefficients,
)

__all__ = [
    "DEFAULT_CUDA_GRID_POINTS",
    "DEFAULT_GRID_POINTS",
    "HIGH_DIM_POINTS_PER_UNIT",
    "UNLIMITED_DATA_SPACE",
    "HighDimensionalGridWarning",
    "WiskiGP",
    "build_grid",
    "default_grid_size",
]


# WiskiGP holds its options, its state (what an update may change and what a cache is)
# and the posterior's life cycle: built from the statistics, updated by rows, folded,
# compressed to LOVE. Each other job is a mixin in streamgp.models._wiski (see there),
# listed before the other bases so that every attribute resolves as in one class.
class WiskiGP(
    UpdatesMixin,
    RebuildMixin,
    PredictionMixin,
    StatisticsMixin,
    CheckpointStateMixin,
    BoTorchDataMixin,
    ValueChecksMixin,
    OutputsMixin,
    GridResolutionMixin,
    CachedPosteriorMixin,
    StreamingModelMixin,
    FrozenTransformsMixin,
    BatchedMultiOutputGPyTorchModel,
    GP,
    FantasizeMixin,
):
    r"""Exact SKI Gaussian process with constant-time (in ``n``) online updates.

    Args:
        train_X: ``n x d`` training inputs (``n`` may be 0), or ``batch x n x d``: a batch of
            models, one per batch member, each with its own hyperparameters (the default
            kernel, likelihood, mean and ``Standardize`` get ``batch_shape``), as a batched
            ``SingleTaskGP``; ``posterior`` and fantasies then have the batch dimensions
            and ``observe`` takes ``batch x q x d``. Each member costs what one model does
            (``O(m^2 q)`` per update). So far for one output (learned noise, or fixed
            noise with ``batch x n x 1`` ``train_Yvar``), in grid space
            (``data_space_limit`` 0; the members share one grid over all their data),
            without LOVE; the rest raises a ``ValueError``.
        train_Y: ``n x k`` training targets. ``k > 1`` gives one model of ``k`` outputs
            observed at the same inputs, as ``SingleTaskGP`` does: each output has its own
            kernel, noise and constant mean (batch members on one grid, BoTorch's
            ``BatchedMultiOutputGPyTorchModel`` layout: ``t x k`` posteriors, ``k x n x d``
            training inputs, ``O(k m^2 q)`` per update; see ``shared_hyperparameters`` for
            the cheaper shared mode). Dense grids only (at most ``MAX_DENSE_GRID`` points).
        train_Yvar: Optional ``n x k`` observed noise variances. If given, the model
            uses fixed heteroskedastic noise and ``observe`` requires ``Yvar``;
            otherwise the noise level is learned. With ``shared_hyperparameters`` each
            row must have one noise variance for all outputs (after the outcome
            transform). As in
            ``SingleTaskGP``, ``likelihood.noise`` is then every row's (transformed) noise
            variance, and a conditioned (fantasy) model's likelihood holds its own rows'
            too (:meth:`training_noise`: read on access, never copied on an update).
            With batched training data, ``batch x n x 1``: ``likelihood.noise`` is
            ``batch x n``.
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
            ``keep_data``). A model that evaluates its kernel exactly (``d >= 4``,
            default grid) predicts and observes anywhere: it has no box to leave.
        data_space_limit: Largest number of observations kept in data space (rows
            and ``n x n`` matrices); past it they are folded into grid statistics
            for good. Default: ``min(m, MAX_DENSE_GRID)``, where the two costs cross;
            unlimited for a grid of more than ``MAX_DENSE_GRID`` points in ``d >= 4``
            dimensions (the default grid there), whose grid statistics would hold
            ``(4^d)^2`` products per row: such a model stays in data space for good and
            evaluates its kernel exactly (:attr:`evaluates_kernel_exactly`), an exact GP
            (``O(n^2 q)`` updates, ``O(n^3)`` fits). An explicit limit keeps SKI there
            (its kernel factored per axis, ``O(n^2 sum_i g_i)``, never ``4^d``).
            0 keeps it in grid space from the first observation on (a model
            built without data starts with empty data-space statistics).
        interpolation: Instead of the regular grid, a function of the transformed
            training data ``(X, y, noise)`` (``noise`` None for learned noise) that
            returns the interpolation: an :class:`~streamgp.interpolation.Interpolation`
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
            on the new grid). Hyperparameters are kept. A fantasy beyond the box
            (``condition_on_observations``) is conditioned on the same data on a grid
            grown over it, this model keeping its own grid. The kept data are also
            BoTorch's :attr:`train_inputs` / :attr:`train_targets`. False: constant memory; an
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
        shared_hyperparameters: With ``k > 1`` outputs, share one kernel and one noise
            level between them (False, the default: each output its own, as in
            ``SingleTaskGP``). Shared, the outputs share the interpolation rows, the Gram
            statistics and every factorisation; only ``W^T y``, ``y^T y`` and the means
            are per output, so ``k`` outputs cost about what one does, and the model may
            stay in data space while ``n`` is small. Correct when the outputs have one
            kernel (the same lengthscales and noise, e.g. after a common scaling).

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

    #: Ax's switch: several metrics get a ``ModelListGP`` of single-output models (each
    #: its own hyperparameters, as a batched model would give them, but in data space
    #: while ``n`` is small and with deferred updates), not one batched model.
    _supports_batched_models = False
    #: The outputs the algebra carries per row (``train_Y``'s columns when they share the
    #: hyperparameters, else 1: see :attr:`_output_members`).
    _num_outputs = 1
    #: ``k`` when the ``k`` outputs are batch members with their own hyperparameters
    #: (BoTorch's batched multi-output layout, the default for ``k > 1``), else 0.
    _output_members = 0
    #: The training data's batch dimensions (``train_X``: ``batch x n x d``), set per model.
    _data_batch_shape = torch.Size([])
    #: Largest grid that keeps the exact dense ``m x m`` root; larger grids use the
    #: structured LOVE path (decided at construction).
    MAX_DENSE_GRID = settings.MAX_DENSE_GRID
    #: LOVE tolerance (relative uncaptured trace of ``Sigma_U``); settable per model. The
    #: large-grid marginal likelihood stops at :meth:`likelihood_gap`, never finer.
    love_tolerance: float = DEFAULT_TOLERANCE
    #: Certified gap of the large-grid marginal likelihood per observation (nats).
    LIKELIHOOD_TOLERANCE = settings.LIKELIHOOD_TOLERANCE
    #: Rows per chunk when accumulating the statistics of the constructor's data.
    STATISTICS_CHUNK = settings.STATISTICS_CHUNK
    #: Default ``data_space_limit``; None means ``min(m, MAX_DENSE_GRID)``.
    DATA_SPACE_LIMIT: int | None = None
    #: Whether a subclass's ``interpolation`` is a grid it can grow (it then keeps data
    #: with ``keep_data`` and implements :meth:`_regridded_interpolation`).
    REGRIDS_INTERPOLATION = False
    #: Whether a subclass's fixed ``interpolation`` may hold its rows in data space while
    #: ``n`` is small (its constructor then takes ``data_space_limit``); learned points,
    #: whose statistics are recomputed when they move, keep grid sums.
    FACTORY_DATA_SPACE = False

    #: A restore takes the checkpoint's grid (its box and points per axis).
    ADOPTED_OPTIONS = frozenset({"grid_size"})
    #: See :data:`streamgp.settings.FOLD_RANK` (overridable here).
    FOLD_RANK = settings.FOLD_RANK
    #: See :data:`streamgp.settings.ROOT_UPDATE_MAX_FRACTION` (overridable here).
    ROOT_UPDATE_MAX_FRACTION = settings.ROOT_UPDATE_MAX_FRACTION
    #: See :data:`streamgp.settings.PREDICTIONS_PER_REFIT` (overridable here).
    PREDICTIONS_PER_REFIT = settings.PREDICTIONS_PER_REFIT
    #: In data space, the posterior is kept on the grid once ``n`` reaches this (None:
    #: where ``O(m^3)`` per refit plus ``O(4^d m)`` per test point undercut ``O(n^2)`` per
    #: test point, ``sqrt(4^d m + m^3 / PREDICTIONS_PER_REFIT)``: 272 for a 10^3 grid.
    #: A kernel without Kronecker structure pays ``O(4^d m)`` per test point in data
    #: space too (its features ``W_* L_K`` are dense), so there only the refit counts:
    #: ``sqrt(m^3 / PREDICTIONS_PER_REFIT)``, 85 for a 30 x 30 grid).
    GRID_POSTERIOR_MIN_N: int | None = None

    data_state_prefixes = _DATA_KEY_PREFIXES
    #: Derived from the statistics on demand (conditioning replayed).
    #: ``_pending_failure``: the failure flag (on the device) of the factorisations of the
    #: last update, read with the next call (see :meth:`_checked_call`).
    #: ``_prior_variance``: the exact prior variance correction at the current
    #: hyperparameters (:mod:`streamgp.linalg.prior_variance`), built with the posterior.
    #: ``_graphs``: captured CUDA graphs of the posterior (:class:`streamgp.settings.cuda_graphs`).
    #: ``_regrid_sibling``: (key, model) this model's data on a grid grown over inputs that
    #: ``condition_on_observations`` received beyond its grid (see ``_regridded_sibling``).
    cached_attributes = (
        "_posterior",
        "_love_cache",
        "_pending_failure",
        "_prior_variance",
        "_graphs",
        "_regrid_sibling",
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
            "_regrid_sibling",
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
        shared_hyperparameters: bool = False,
    ) -> None:
        check_grid_model_data(
            train_X, train_Y, train_Yvar, likelihood, multi_output=True, batched=True
        )
        if not isinstance(shared_hyperparameters, bool):
            raise TypeError(
                "shared_hyperparameters must be a bool, got "
                f"{type(shared_hyperparameters).__name__}."
            )
        num_outputs = train_Y.shape[-1]
        # k outputs with their own hyperparameters are k batch members (BoTorch's
        # BatchedMultiOutputGPyTorchModel); shared ones share every row-derived factor.
        output_members = num_outputs if num_outputs > 1 and not shared_hyperparameters else 0
        # Batched training data (b x n x d): one model per batch member, as a batched
        # SingleTaskGP (grid space: check_batched_options).
        data_batch = train_X.shape[:-2]
        if data_batch or output_members:
            check_batched_options(
                train_Y[..., :1] if output_members else train_Y,
                interpolation,
                data_space_limit,
                "per-output hyperparameters" if output_members else "batched training data",
            )
            data_space_limit = 0
        member_batch = torch.Size([*data_batch, *([output_members] if output_members else [])])
        if mean_module is None:  # SingleTaskGP's: a learned constant for each output
            mean_module = ConstantMean(
                batch_shape=member_batch
                if output_members or data_batch
                else torch.Size([num_outputs] if num_outputs > 1 else [])
            )
        elif type(mean_module) is ConstantMean:
            allowed = {1, num_outputs, member_batch.numel()}
            if mean_module.constant.numel() not in allowed:
                raise ValueError(
                    f"mean_module's ConstantMean has {mean_module.constant.numel()} constants; "
                    f"pass one, one per output ({num_outputs}) or one per batch member and "
                    f"output ({member_batch.numel()})."
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
            grid_size is not None
            or grid_bounds is not None
            or (data_space_limit is not None and not self.FACTORY_DATA_SPACE)
        ):
            raise ValueError(
                "grid_size, grid_bounds and data_space_limit describe the grid; pass none of "
                "them with an interpolation."
            )
        check_choice(extrapolation, "extrapolation", EXTRAPOLATION_POLICIES)
        super().__init__()
        self._data_batch_shape = member_batch
        self._output_members = output_members
        self.extrapolation = extrapolation
        self.exact_prior_variance = exact_prior_variance
        self._num_outputs = 1 if output_members else num_outputs
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
        transformed_X, train_Y, train_Yvar = self._outputs_to_members(
            *fit_frozen_transforms(
                self, train_X, train_Y, input_transform, outcome_transform, train_Yvar
            )
        )

        if covar_module is None:
            batch = {"batch_shape": member_batch} if member_batch else {}
            covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim, **batch)
        self.covar_module = covar_module.to(**tkwargs)
        self.mean_module = mean_module.to(**tkwargs)
        self.fixed_noise = train_Yvar is not None
        if self.fixed_noise:
            # As SingleTaskGP's: likelihood.noise is the rows' (transformed) train_Yvar,
            # read from the model's data when asked (nothing is copied on an update).
            self.likelihood = bind_row_noise(self)
        else:
            self.likelihood = (
                get_gaussian_likelihood_with_lognormal_prior(
                    **({"batch_shape": member_batch} if member_batch else {})
                )
                if likelihood is None
                else likelihood
            ).to(**tkwargs)

        y_all = self._targets(train_Y)
        noise_all = None if train_Yvar is None else self._shared_noise(train_Yvar, "train_Yvar")
        # The grid size asked for (None: the default of whatever box the grid has).
        self._grid_size_option = grid_size
        if interpolation is None:
            if dim >= CubicGridInterpolation.FACTORED_FROM_DIM and grid_size is None:
                warn_high_dimensional(
                    type(self).__name__,
                    dim,
                    f"WiskiGP on {dim}-D inputs: cubic interpolation on a product grid "
                    f"puts 4^{dim} = {4**dim} weights on every input, so the model stays "
                    "in data space and evaluates its kernel exactly (an exact GP, n x n "
                    "matrices): its updates cost O(n^2 q) and its fits O(n^3), as "
                    "SingleTaskGP's, not constant in n. For updates constant in n use "
                    "AdditiveWiskiGP (an additive kernel over groups of at most 3 "
                    "dimensions). A grid_size of at most MAX_DENSE_GRID points in all keeps "
                    "SKI (4^d weights per input); any grid_size silences this warning.",
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
                check_kernel=False,  # (any kernel is evaluated exactly: checked below)
            )
            self._check_dense_for_outputs(self.interpolation, self.structured)
            if data_space_limit is None:
                data_space_limit = self.DATA_SPACE_LIMIT
            if data_space_limit is None:
                data_space_limit = min(self.interpolation.num_grid, self.MAX_DENSE_GRID)
                if self.structured and dim >= CubicGridInterpolation.FACTORED_FROM_DIM:
                    # Grid statistics would hold (4^d)^2 products per row: stay in data
                    # space, where the kernel itself is exact and cheaper than SKI's.
                    data_space_limit = UNLIMITED_DATA_SPACE
                    self.interpolation = ExactKernelInputs(self.interpolation)
            if self.structured and not self.evaluates_kernel_exactly:
                check_structured_kernel(self.covar_module, self.interpolation, self.MAX_DENSE_GRID)
            if self.evaluates_kernel_exactly and self.covar_module.batch_shape:
                raise ValueError(
                    f"covar_module has batch_shape {list(self.covar_module.batch_shape)}; a "
                    "WiskiGP that evaluates its kernel exactly (from 4-D on) takes an "
                    "unbatched kernel: build one model per output or batch member and "
                    "combine them in a botorch.models.ModelListGP."
                )
        else:  # with a dense root: grid sums, or rows while n is small (FACTORY_DATA_SPACE)
            self.interpolation = interpolation(transformed_X, y_all, noise_all)
            self.structured = False
            if not self.FACTORY_DATA_SPACE:
                data_space_limit = 0
            elif data_space_limit is None:
                data_space_limit = self._default_data_space_limit(self.interpolation.num_grid)
        self.data_space_limit = check_count(data_space_limit, "data_space_limit", minimum=0)
        self._clear_caches()
        if interpolation is None or self.FACTORY_DATA_SPACE:
            statistics = self._statistics_of(
                self.interpolation, self.structured, transformed_X, y_all, noise_all
            )
        else:  # learned points: grid statistics, recomputed when the points change
            statistics = self._grid_statistics(
                self.interpolation, transformed_X, y_all, noise_all, differentiable=False
            )
        self._set_statistics(statistics)

    def _default_data_space_limit(self, num_grid: int) -> int:
        r"""``data_space_limit``'s default for a ``FACTORY_DATA_SPACE`` interpolation of
        ``num_grid`` points (a grid's is ``min(m, MAX_DENSE_GRID)``)."""
        return min(num_grid, self.MAX_DENSE_GRID)

    def _check_dense_for_outputs(self, interpolation: Any, structured: bool) -> None:
        r"""Refuse a grid too large for a dense root in a multi-output or batched model (at
        construction, a re-grid or a checkpoint's grid)."""
        # From 4-D on a coarser grid is the 4^d-weights trap: name the model list instead.
        remedy = (
            " From 4-D on, build one single-output WiskiGP per output (and per batch member) "
            "and combine them in a botorch.models.ModelListGP; each evaluates its kernel "
            "exactly."
            if interpolation.dim >= CubicGridInterpolation.FACTORED_FROM_DIM
            else " Use a coarser grid_size."
        )
        if structured and self._data_batch_shape:
            what = (
                "train_Y has several columns: a WiskiGP with one model per output"
                if self._output_members
                else "grid_size: a batched WiskiGP"
            )
            raise ValueError(
                f"{what} needs a dense grid (at most MAX_DENSE_GRID = "
                f"{self.MAX_DENSE_GRID} points, this one has {interpolation.num_grid})." + remedy
            )
        if structured and self._num_outputs > 1:
            raise ValueError(
                f"train_Y has {self._num_outputs} columns; multi-output WiskiGP needs a dense "
                f"grid (at most MAX_DENSE_GRID = {self.MAX_DENSE_GRID} points, this one "
                f"has {interpolation.num_grid})." + remedy
            )

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

    # ---------------------------------------------------- the posterior's life cycle
    def kernel_root(self) -> GridKernelRoot | ExactKernelRoot:
        r"""Root ``L_K`` of ``K_UU`` at the current hyperparameters (differentiable); the
        kernel itself (:class:`~streamgp.linalg.exact_kernel.ExactKernelRoot`) for a model
        that evaluates it exactly (:attr:`evaluates_kernel_exactly`)."""
        if self.evaluates_kernel_exactly:
            return ExactKernelRoot.of(self.covar_module, self.interpolation.num_grid)
        # A cubic-interpolation grid is evenly spaced on every axis.
        evenly_spaced = isinstance(self.interpolation, CubicGridInterpolation)
        return grid_kernel_root(
            self.covar_module, self.interpolation.grid, evenly_spaced=evenly_spaced
        )

    @property
    def evaluates_kernel_exactly(self) -> bool:
        r"""Whether the model evaluates its kernel exactly instead of interpolating it.

        True from 4-D on for a grid of more than ``MAX_DENSE_GRID`` points (the default
        grid there, or a ``grid_size`` that large) unless ``data_space_limit`` is given:
        grid space cannot hold such a grid, so the model stays in data space for good,
        where the exact kernel is both cheaper than SKI's and free of interpolation error.
        It is then an exact GP with ``O(n^2 q)`` updates (see
        :mod:`streamgp.interpolation.exact`); its grid is kept for reports (and
        checkpoints) only. A grid of at most ``MAX_DENSE_GRID`` points, or an explicit
        ``data_space_limit``, keeps SKI.
        """
        return isinstance(self.interpolation, ExactKernelInputs)

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
        if self.evaluates_kernel_exactly:
            raise RuntimeError(
                "grid_posterior: this model evaluates its kernel exactly (from 4-D on with "
                "the default grid), so it has no grid values; use posterior()."
            )
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
        if len(self._internal_batch_shape) > 0:
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
        if self._data_batch_shape:  # (LOVE roots are unbatched: the exact path)
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
        if noise is not None:
            update_noise = noise
        elif self._data_batch_shape:  # one noise level per batch member
            update_noise = self.noise_variance.unsqueeze(-1).expand(y.shape)
        else:
            update_noise = self.noise_variance.expand(y.shape[-1:])
        if isinstance(posterior, DataPosterior):
            leaves = statistics.count > self.data_space_limit and not self.evaluates_kernel_exactly
            if leaves or self._posterior_on_grid(statistics):
                return None  # the next prediction factorises on the grid
            return posterior.update(weights, y, update_noise)
        # A large grid's posterior is a rank-k LOVE root: it is updated the same way
        # (O(m k q), no m x m matrix); the statistics stay exact, and the root is rebuilt
        # from them at the next hyperparameter change (see the module docs).
        if y.shape[-1] > self.ROOT_UPDATE_MAX_FRACTION * posterior.root.shape[-1]:
            return None
        return update_root(posterior, weights, y, update_noise)
