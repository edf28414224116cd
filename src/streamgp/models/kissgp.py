r"""KISS-GP: structured kernel interpolation with an exact GP, as a BoTorch model.

KISS-GP (Wilson & Nickisch, "Kernel Interpolation for Scalable Structured Gaussian
Processes (KISS-GP)", ICML 2015) approximates the kernel by
``K_XX ~ W K_UU W^T`` with a regular grid ``U`` and sparse cubic interpolation
weights ``W`` (``4^d`` non-zeros per row). :class:`KissGP` is gpytorch's ``ExactGP``
around a ``GridInterpolationKernel``: it stores all ``n`` observations and is trained
with gpytorch's ``ExactMarginalLogLikelihood`` (conjugate gradients and stochastic
Lanczos on the interpolated kernel, the KISS-GP way). It is streamgp's non-online
comparison point for :class:`~streamgp.models.WiskiGP` (same SKI model, but updates
that rebuild from all data).

Two deliberate departures from gpytorch 1.15.2, both measured there:

* ``K_UU`` in the right order. gpytorch's ``GridKernel`` builds
  ``KroneckerProductLinearOperator(*covars[::-1])`` for a legacy operator order that
  ``linear_operator`` no longer has, so ARD lengthscales act on the wrong dimensions
  (max kernel error 0.59 with lengthscales ``[0.2, 0.5]`` in 2-D). Here the kernel
  evaluates ``K_UU`` itself, with :func:`streamgp.linalg.grid_kernel.grid_kernel_root`,
  in the flat index order of the interpolation weights (first dimension slowest),
  and the weights come from :class:`~streamgp.interpolation.grid.CubicGridInterpolation`.
* Predictions never go through gpytorch's ``InterpolatedPredictionStrategy``, whose
  ``left_interp`` densifies a ``t x 4^d x m`` tensor (20 GB for ``10^4`` test points
  on a ``16^3`` grid) and whose LOVE cache has a fixed rank of 100 (variances off by
  23x-1450x from the exact ones when we measured it). The predictive distribution is the
  exact SKI posterior of the grid values (:mod:`streamgp.linalg.woodbury`, or
  :mod:`streamgp.linalg.structured` for large grids), applied to test points with
  sparse products, so memory is ``O(t m)`` (exact) or ``O(t k)`` (LOVE).

LOVE (Pleiss, Gardner, Weinberger & Wilson, "Constant-Time Predictive Distributions
for Gaussian Processes", ICML 2018; :mod:`streamgp.linalg.love`). Inside
``gpytorch.settings.fast_pred_var()`` or ``fast_pred_samples()`` the predictive
covariance is ``(W_* R_k)(W_* R_k)^T`` with a rank-``k`` root ``R_k`` of the grid
posterior covariance, returned as a ``RootLinearOperator`` (with the exact prior
variance's diagonal, below, a ``LowRankRootAddedDiagLinearOperator``): a variance costs
``O(4^d k)`` and ``s`` joint samples at ``t`` points ``O(s k t)``. The rank is chosen
to meet ``love_tolerance`` (default ``1e-8``; settable per model):

- separable kernels (RBF, scaled RBF): the root comes from
  :func:`~streamgp.linalg.structured.structured_grid_posterior`, which never forms
  an ``m x m`` matrix (Kronecker ``K_UU``, sparse ``W^T Lambda^{-1} W``), so the
  precomputation costs ``O(k (nnz + m sum_i g_i + m k))``. A LOVE variance
  ``v_k(x)`` then satisfies (up to round-off)
  ``-tol w^T K_UU w <= v(x) - v_k(x) <= |w|^2 tol tr(Sigma_1)`` with
  ``tr(Sigma_1) <= tr(K_UU)`` (that module's two Lanczos passes: the first may
  over-state a variance by ``tol`` times the prior variance, the second under-state
  it by ``tol`` times the trace), and is never negative;
- other kernels: :func:`~streamgp.linalg.love.lanczos_root` of the exact dense grid
  posterior ``R R^T``: ``0 <= v(x) - v_k(x) <= |w(x)|^2 tol tr(Sigma_U)``.

The root is cached until the data or the hyperparameters change. Models conditioned
on observations (fantasies) use the exact path even under the switches.

Exact prior variances (``exact_prior_variance=True``, the default): SKI's prior variance
``w(x)^T K_UU w(x)`` dips below ``k(x, x)`` between grid points for lengthscales near the
grid spacing; predictions add ``k(x, x) - w(x)^T K_UU w(x)`` to the diagonal of the
predictive covariance (:mod:`streamgp.linalg.prior_variance`, shared with
:class:`~streamgp.models.WiskiGP`). The training objective is unchanged.

Costs. Building the prediction cache reads all ``n`` observations once
(``O(n 16^d)`` for the statistics) and then costs ``O(m^3)`` (exact, dense grid,
``m <= MAX_DENSE_GRID``) or the LOVE cost above. :meth:`KissGP.observe` appends the
data and drops the caches, so the next prediction rebuilds them: ``O(n 16^d + m^3)``
per update, unlike WISKI's ``O(m^2 q)``. :meth:`KissGP.condition_on_observations`
(BoTorch's ``fantasize``) is a rank-``q`` correction of the cached grid posterior
(:class:`~streamgp.linalg.woodbury.LowRankCorrection`), exact and batched over
fantasy samples.

Dimensions. Every statistic holds ``16^d`` products per observation, so
``KissGP`` takes at most ``MAX_DIM`` (4) input dimensions and warns in 4-D; from 4-D
on :class:`~streamgp.models.WiskiGP` evaluates its kernel exactly instead.

Transforms, as in :class:`~streamgp.models.WiskiGP`: an ``input_transform`` and an
``outcome_transform`` (default ``Standardize``, as ``SingleTaskGP``'s) are fitted once on
the constructor's data and then frozen.

The grid follows the data, as :class:`~streamgp.models.WiskiGP`'s. Its default box is
:func:`~streamgp.interpolation.grid.data_grid_bounds`: the unit cube (grown where the
data reach beyond it), or, with an input transform that learns its coefficients from
``train_X`` (``Normalize(d)`` without bounds, ``InputStandardize``), the transformed
data's box plus a margin. :meth:`KissGP.observe` of a point outside the box re-grids
exactly: the box grows past it (:func:`~streamgp.interpolation.grid.grown_grid_bounds`,
geometrically), the grid keeps the ``grid_size`` given (or the default of the new box),
and the data are appended as always, so the model equals one built at once on all data
with the new grid (same frozen transforms and hyperparameters). The model keeps all its
(transformed) data anyway, so this costs no memory and needs no ``keep_data`` option;
the hyperparameters are kept. ``state_dict()`` carries the grid (``grid.bounds``,
``grid.size``, ``grid.size_option``): ``load_state_dict(..., keep_transforms=False)``
adopts it; a warm start (the default) keeps the model's own grid and input transform.
Conditioned models (fantasies) never re-grid: conditioning outside the box raises.

Prior mean. As in ``SingleTaskGP``, the default is a learned constant ``c``
(``ConstantMean``; pass ``ZeroMean()`` for zero). The grid-space paths work with the
residuals: the grid posterior is that of ``y - c`` (its statistic
``W^T Lambda^{-1} (y - c) = b - c W^T Lambda^{-1} 1``, so a new ``c`` needs no pass
over the data), conditioning subtracts ``c`` from the new targets, and predictions add
``c`` back. Training (gpytorch's ``ExactMarginalLogLikelihood``) uses the mean module
directly.

References:

.. [Wilson2015] A. G. Wilson, H. Nickisch. Kernel Interpolation for Scalable
    Structured Gaussian Processes (KISS-GP). International Conference on Machine
    Learning, 2015.
.. [Pleiss2018] G. Pleiss, J. Gardner, K. Q. Weinberger, A. G. Wilson. Constant-Time
    Predictive Distributions for Gaussian Processes. International Conference on
    Machine Learning, 2018.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import GridInterpolationKernel, Kernel
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.models import ExactGP
from gpytorch.settings import fast_pred_samples, fast_pred_var
from linear_operator.operators import (
    DenseLinearOperator,
    KroneckerProductLinearOperator,
    LinearOperator,
)
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.grid import (
    EXTRAPOLATION_POLICIES,
    CubicGridInterpolation,
    grown_grid_bounds,
)
from streamgp.linalg.grid_kernel import GridKernelRoot, grid_kernel_root, is_separable
from streamgp.linalg.love import DEFAULT_TOLERANCE, compress_root
from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.linalg.prior_variance import PriorVarianceCorrection, root_covariance
from streamgp.linalg.structured import structured_grid_posterior
from streamgp.linalg.woodbury import GridPosterior, LowRankCorrection, factorize
from streamgp.models.base import CheckpointMixin, construct_inputs_with_options
from streamgp.models.utils import (
    CachedPosteriorMixin,
    FrozenTransformsMixin,
    MutableState,
    PosteriorMixin,
    conditioning_noise,
    fit_frozen_transforms,
    invalidate_after_load,
    shallow_view,
    transaction,
    transform_new_data,
)
from streamgp.models.utils.defaults import DEFAULT, _DefaultType, mean_module_or_default
from streamgp.models.utils.fixed_noise import bind_row_noise, concat_rows
from streamgp.models.utils.grids import build_grid, warn_high_dimensional
from streamgp.models.utils.resolution import GridResolutionMixin
from streamgp.settings import exact_prior_variance as exact_prior_variance_setting
from streamgp.settings import skip_value_checks
from streamgp.utils.validation import (
    check_choice,
    check_conditioning_data,
    check_grid_model_data,
    check_new_observations,
    check_tensor,
    learns_input_coefficients,
)


class SKIKernel(GridInterpolationKernel):
    r"""gpytorch's ``GridInterpolationKernel`` with ``K_UU`` in the interpolation's order.

    The grid and the cubic weights are those of a :class:`CubicGridInterpolation`
    (bounds padded by one spacing, first dimension slowest), and ``K_UU`` is evaluated
    with :func:`~streamgp.linalg.grid_kernel.grid_kernel_root` in that same order
    (Kronecker-factored for separable kernels), which fixes gpytorch 1.15.2's reversed
    ARD dimensions. Everything else (the ``InterpolatedLinearOperator`` used by
    gpytorch's CG-based marginal likelihood) is gpytorch's.

    Args:
        base_kernel: Kernel on ``d``-dimensional inputs (not batched).
        interpolation: The grid and its interpolation weights.
    """

    def __init__(self, base_kernel: Kernel, interpolation: CubicGridInterpolation) -> None:
        bounds = [tuple(b) for b in interpolation.bounds.t().tolist()]
        super().__init__(
            base_kernel,
            grid_size=interpolation.grid_size,
            num_dims=interpolation.dim,
            grid_bounds=bounds,
        )
        self.interpolation = interpolation
        self.update_grid(interpolation.grid)

    def _compute_grid(self, inputs: Tensor, last_dim_is_batch: bool = False):
        if last_dim_is_batch:
            raise ValueError("SKIKernel does not support last_dim_is_batch.")
        weights = self.interpolation.weights(inputs)
        return weights.indices, weights.values

    def _inducing_forward(self, last_dim_is_batch: bool, **params: Any) -> LinearOperator:
        if last_dim_is_batch:
            raise ValueError("SKIKernel does not support last_dim_is_batch.")
        factors = [f @ f.mT for f in grid_kernel_root(self.base_kernel, self.grid).factors]
        if len(factors) == 1:
            return DenseLinearOperator(factors[0])
        return KroneckerProductLinearOperator(*factors)  # first factor slowest, as W


#: The most input dimensions ``KissGP`` accepts: each row's cubic stencil has ``4^d``
#: grid points, so its statistics hold ``16^d`` products per observation (about a
#: million in 5-D, 17 million in 6-D: 5.4 GB at n = 40).
MAX_DIM = 4


def _check_dimension(dim: int) -> None:
    r"""Refuse ``dim > MAX_DIM``; warn (once) in 4-D, where a row costs ``16^4`` products."""
    advice = (
        "use WiskiGP, which from 4-D on evaluates its kernel exactly (SingleTaskGP's "
        "numbers, with O(n^2) updates), or AdditiveWiskiGP for an additive kernel."
    )
    if dim > MAX_DIM:
        raise ValueError(
            f"KissGP interpolates each of its {dim}-D inputs onto 4^{dim} grid points, so "
            f"every observation costs 16^{dim} = {16**dim:,} products (memory and time): "
            f"it supports at most {MAX_DIM}-D inputs. In {dim}-D " + advice
        )
    if dim == MAX_DIM:
        warn_high_dimensional(
            "KissGP",
            dim,
            f"KissGP in {dim}-D: each observation costs 16^{dim} = {16**dim:,} grid products "
            "in every statistic, and every prediction re-reads all of them; " + advice,
            stacklevel=3,
        )


class KissGP(
    GridResolutionMixin,
    CheckpointMixin,
    CachedPosteriorMixin,
    PosteriorMixin,
    FrozenTransformsMixin,
    GPyTorchModel,
    ExactGP,
    FantasizeMixin,
):
    r"""KISS-GP (exact GP with an interpolated grid kernel) with LOVE predictions.

    Args:
        train_X: ``n x d`` training inputs (``n >= 1``).
        train_Y: ``n x 1`` training targets.
        train_Yvar: Optional ``n x 1`` observed noise variances (fixed heteroskedastic
            noise; ``observe`` then requires ``Yvar``). Otherwise the noise is learned.
        grid_size: Grid points per dimension (int or one per dimension), including the
            one-spacing padding beyond ``grid_bounds``. Default: about 1024 in total (4096
            on CUDA), in any ``d`` (at least 4 per axis).
        grid_bounds: ``2 x d`` box covered by the grid, in the transformed input space.
            Default: the unit cube (the search space of inputs normalised with
            ``Normalize(d, bounds=bounds)``, or already in it); with an input transform
            that learns its coefficients from ``train_X`` (``Normalize(d)`` without
            bounds), the transformed data's box plus a margin
            (:func:`~streamgp.interpolation.grid.data_grid_bounds`). A box the data pass
            (initial or observed) is grown to cover them, an exact re-grid (see the
            module docs); predictions outside follow ``extrapolation``.
        extrapolation: What a prediction outside ``grid_bounds`` does: ``"nearest"``
            (default) predicts at the nearest point of the box and warns
            (``GridExtrapolationWarning``), so BoTorch code that probes beyond the
            search box (qLogNEI's infeasible-cost estimate) never fails mid-loop;
            ``"error"`` raises ``ValueError``. Observations outside re-grid;
            conditioning (``condition_on_observations``) outside conditions the same
            data on a grid grown over them (the model keeps its own grid).
        covar_module: Base kernel (not a ``GridInterpolationKernel``; it is wrapped in
            :class:`SKIKernel`). Default: BoTorch's ``SingleTaskGP`` kernel.
        likelihood: Gaussian likelihood for the learned-noise variant; must be omitted
            with ``train_Yvar``.
        input_transform: Input transform, fitted on ``train_X`` and then frozen
            (``Normalize(d)`` without bounds included: the grid follows the data).
        outcome_transform: Outcome transform, fitted on ``train_Y`` (and
            ``train_Yvar``) and then frozen. Default: ``Standardize(m=1)``, as in
            ``SingleTaskGP``; None for no transform.
        mean_module: The prior mean (in the outcome-transformed space): None (default)
            for a ``ConstantMean`` learned with the kernel, as in ``SingleTaskGP``; a
            gpytorch ``ConstantMean`` (one constant) or ``ZeroMean``.
        exact_prior_variance: Predict with the kernel's own prior variance ``k(x, x)``
            (default): the predictive covariance gets the diagonal
            ``k(x, x) - w(x)^T K_UU w(x)`` (:mod:`streamgp.linalg.prior_variance`), on the
            exact and LOVE paths and in conditioned (fantasy) models; the training
            objective stays gpytorch's SKI likelihood. False (or
            ``streamgp.settings.exact_prior_variance(False)``): the SKI posterior.

    After a fit that leaves a lengthscale below two grid spacings the model warns once
    (:class:`~streamgp.models.utils.resolution.CoarseGridWarning`), naming a finer
    ``grid_size``.

    Unlike :class:`~streamgp.models.WiskiGP` there is no ``keep_data`` option: an exact
    GP keeps all its (transformed) data in ``train_inputs`` and ``train_targets``, so a
    re-grid needs nothing more.

    Example:
        >>> import gpytorch
        >>> X = torch.rand(200, 2, dtype=torch.float64)
        >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
        >>> model = KissGP(X, Y, grid_size=30)  # Standardize, learned constant mean
        >>> model.love_tolerance = 1e-6
        >>> with gpytorch.settings.fast_pred_var():
        ...     var = model.posterior(torch.rand(10_000, 2, dtype=torch.float64)).variance
        >>> model = model.observe(X[:3], Y[:3])  # appends the data; caches are rebuilt lazily
        >>> from botorch.models.transforms import Normalize
        >>> model = KissGP(5 * X, Y, grid_size=30, input_transform=Normalize(2))
        >>> model = model.observe(torch.tensor([[8.0, 2.0]], dtype=torch.float64), Y[:1])
        >>> model.interpolation.bounds[1, 0] > 1.2  # re-gridded past the new point
        tensor(True)
    """

    _num_outputs = 1
    #: Largest grid that uses the exact dense ``m x m`` grid posterior; larger grids
    #: always use the LOVE root (separable kernels only).
    MAX_DENSE_GRID = settings.MAX_DENSE_GRID
    #: LOVE tolerance (see the module docs for what it bounds); settable per model.
    love_tolerance: float = DEFAULT_TOLERANCE
    #: Rows per chunk when accumulating the grid statistics from the data.
    STATISTICS_CHUNK = settings.STATISTICS_CHUNK

    construct_inputs = classmethod(construct_inputs_with_options)
    #: The weighted statistics of the data (see also ``_posterior_cache``).
    cached_attributes = ("_statistics",)
    #: ``(A, b, W^T Lambda^{-1} 1)`` of the stored data (see :meth:`weighted_statistics`).
    _statistics: tuple[Tensor, Tensor, Tensor] | None
    _correction: LowRankCorrection | None
    #: What ``observe`` (with a re-grid) may change, restored if it raises (any
    #: exception): the data, the grid and its kernel, the caches and the conditioning
    #: (all replaced: kept by reference) and the fixed noise (replaced too).
    mutable_state = MutableState(
        attributes=(
            "train_inputs",
            "train_targets",
            "prediction_strategy",
            "interpolation",
            "structured",
            "covar_module",
            "_statistics",
            "_posterior_cache",
            "_hyper_snapshot",
            "_correction",
            "_conditioning_log",
            "_rows_noise",
        ),
        objects=("likelihood.noise_covar",),
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
        mean_module: ConstantMean | ZeroMean | None = None,
        exact_prior_variance: bool = True,
    ) -> None:
        check_grid_model_data(train_X, train_Y, train_Yvar, likelihood, allow_empty=False)
        if not isinstance(exact_prior_variance, bool):
            raise TypeError(
                f"exact_prior_variance must be a bool, got {type(exact_prior_variance).__name__}."
            )
        if mean_module is not None and not (
            type(mean_module) is ZeroMean
            or (type(mean_module) is ConstantMean and mean_module.constant.numel() == 1)
        ):
            raise ValueError(
                "mean_module must be None (a learned constant, the default), a gpytorch "
                f"ConstantMean with one constant, or ZeroMean; got {type(mean_module).__name__}."
            )
        check_choice(extrapolation, "extrapolation", EXTRAPOLATION_POLICIES)
        if isinstance(covar_module, GridInterpolationKernel):
            raise TypeError(
                "covar_module must be the base kernel; KissGP wraps it in its own "
                "SKIKernel (gpytorch's GridInterpolationKernel reverses ARD dimensions)."
            )
        dim = train_X.shape[-1]
        _check_dimension(dim)
        tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
        if train_Yvar is not None:
            likelihood = FixedNoiseGaussianLikelihood(noise=train_Yvar.squeeze(-1))
        elif likelihood is None:
            likelihood = get_gaussian_likelihood_with_lognormal_prior()
        ExactGP.__init__(self, train_X, train_Y.squeeze(-1), likelihood.to(**tkwargs))
        self.fixed_noise = train_Yvar is not None
        # A conditioned view's fixed noise of its train_inputs rows (its own likelihood
        # reads them, then its conditioning rows'); None: the likelihood holds them.
        self._rows_noise = None
        self.extrapolation = extrapolation
        self.exact_prior_variance = exact_prior_variance
        transformed_X, train_Y, train_Yvar = fit_frozen_transforms(
            self, train_X, train_Y, input_transform, outcome_transform, train_Yvar
        )

        if covar_module is None:
            covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        # The grid size asked for (None: the default of whatever box the grid has).
        self._grid_size_option = (
            grid_size if grid_size is None or isinstance(grid_size, int) else list(grid_size)
        )
        self.interpolation, self.structured = build_grid(
            train_X,
            transformed_X,
            grid_bounds,
            grid_size,
            covar_module,
            self.MAX_DENSE_GRID,
            follow_data=True,
            around_data=learns_input_coefficients(input_transform),
            budget_grid=True,  # (every prediction works on the grid: no per-unit default)
        )
        self.mean_module = mean_module_or_default(mean_module, train_X)
        self.covar_module = SKIKernel(covar_module, self.interpolation).to(**tkwargs)
        self._set_data(transformed_X, train_Y.squeeze(-1), train_Yvar)
        # Loaded buffers (e.g. the grid) may differ from those the caches were built on.
        self.register_load_state_dict_post_hook(invalidate_after_load)
        self._clear_caches()

    # ------------------------------------------------------------------ state
    @property
    def base_kernel(self) -> Kernel:
        r"""The kernel whose ``K_UU`` is interpolated."""
        return self.covar_module.base_kernel

    def _set_data(self, X: Tensor, y: Tensor, noise: Tensor | None) -> None:
        r"""Replace the (transformed) training data and drop every cache."""
        self.set_train_data(X, y, strict=False)
        if noise is not None and self._rows_noise is not None:  # a view: its own rows
            self._rows_noise = noise.reshape(-1)
        elif noise is not None:
            self.likelihood.noise = noise.reshape(-1)
        self._invalidate()

    def _invalidate(self) -> None:
        super()._invalidate()
        # Grid posteriors by kind ("exact", ("love", tolerance)): emptied, not None.
        self._posterior_cache: dict[str, Any] = {}

    def _apply_to_state(self, fn) -> None:
        # Device/dtype moves: the grid (not a buffer) follows the training data.
        like = self.train_targets
        self.interpolation = self.interpolation.to(device=like.device, dtype=like.dtype)
        self.covar_module.interpolation = self.interpolation

    # ------------------------------------------------------------------- grid
    def _grid_over(self, bounds: Tensor, grid_size: Any) -> tuple[Any, ...]:
        r"""A grid over ``bounds`` and its SKI kernel, built without changing the model.

        ``grid_size`` as the constructor takes it (None: the default of ``bounds``).
        Returns ``(interpolation, structured, kernel)`` for :meth:`_set_grid`.
        """
        interpolation, structured = build_grid(
            bounds,
            bounds[:0],
            bounds,
            grid_size,
            self.base_kernel,
            self.MAX_DENSE_GRID,
            budget_grid=True,
        )
        # A new kernel module (sharing the base kernel and its hyperparameters) rather
        # than the old one changed in place: views (condition_on_observations) share the
        # old one and keep their grid.
        kernel = SKIKernel(self.base_kernel, interpolation).to(bounds)
        return interpolation, structured, kernel

    def _set_grid(
        self, interpolation: CubicGridInterpolation, structured: bool, kernel: SKIKernel
    ) -> None:
        self.interpolation, self.structured = interpolation, structured
        self.covar_module = kernel

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        # The grid (it follows the data: re-grids) and the grid_size asked for, which
        # decides the size of later re-grids (empty: the default of the box).
        interpolation = self.interpolation
        option = self._grid_size_option
        if option is None:
            option = []
        elif isinstance(option, int):
            option = [option] * interpolation.dim
        destination[f"{prefix}grid.bounds"] = interpolation.bounds.detach()
        destination[f"{prefix}grid.size"] = torch.tensor(interpolation.grid_size)
        destination[f"{prefix}grid.size_option"] = torch.tensor(option, dtype=torch.long)

    def _load_grid(self, bounds: Tensor, size: Tensor, option: Tensor | None) -> None:
        r"""Move to a saved grid (before the kernel's grid buffers are loaded)."""
        bounds = bounds.to(self.interpolation.bounds)
        grid_size = [int(g) for g in size.tolist()]
        current = self.interpolation
        if bounds.shape != current.bounds.shape or len(grid_size) != current.dim:
            raise ValueError(
                f"its grid has {bounds.shape[-1]} input dimensions, this model {current.dim}."
            )
        grid = None
        if grid_size != current.grid_size or not torch.equal(bounds, current.bounds):
            grid = self._grid_over(bounds, grid_size)
            try:
                grid[0].check_inside(self.train_inputs[0], "this model's train_X")
            except ValueError as error:
                raise ValueError(
                    f"{error} A state holds no data: load it into a model of the same data, "
                    "or with keep_transforms=True to keep this model's grid."
                ) from None
        if grid is not None:
            self._set_grid(*grid)
        if option is not None:
            self._grid_size_option = [int(g) for g in option.tolist()] or None

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        grid = {k: state_dict.pop(f"{prefix}grid.{k}", None) for k in ("bounds", "size")}
        option = state_dict.pop(f"{prefix}grid.size_option", None)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        try:
            if grid["bounds"] is not None and grid["size"] is not None:
                self._load_grid(grid["bounds"], grid["size"], option)
        except ValueError as error:
            error_msgs.append(f"KissGP grid: {error}")
            return
        # The kernel's grid buffers (loaded next) must be this grid's: a state without
        # the grid (written before it was saved) is not silently misread.
        for i, points in enumerate(self.interpolation.grid):
            saved = state_dict.get(f"{prefix}covar_module.grid_{i}")
            if saved is not None and (
                saved.shape != points.shape or not torch.allclose(saved.to(points), points)
            ):
                error_msgs.append(
                    f"KissGP grid: {prefix}covar_module.grid_{i} differs from this model's "
                    "grid (build the model with the grid_size and grid_bounds of the state)."
                )
                return

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        strict: bool = True,
        keep_transforms: bool = True,
        assign: bool = False,
    ) -> Any:
        r"""BoTorch's ``load_state_dict``; a warm start keeps the grid and input transform.

        The grid and the input transform belong to this model's data (its
        ``train_inputs`` are transformed and lie in its grid), so with
        ``keep_transforms=True`` (a warm start: BoTorch's loops rebuild the model on all
        data and load the previous model's state) they are kept and the rest is loaded as
        BoTorch loads it. ``keep_transforms=False`` loads everything, the grid included
        (rebuilt when it differs; this model's ``grid_size`` for later re-grids becomes
        the state's), for a model of the same data: a state holds no data.
        """
        if keep_transforms:
            own = {k: v for k, v in self.state_dict().items() if self._is_own_key(k)}
            state_dict = {k: v for k, v in state_dict.items() if not self._is_own_key(k)} | own
        return super().load_state_dict(
            state_dict, strict=strict, keep_transforms=keep_transforms, assign=assign
        )

    def _stream_state(self) -> dict[str, Any]:
        # The (transformed) training data, exactly as held: replaying observe would
        # re-transform the targets, which need not round alike.
        noise = self._data_noise().detach().clone() if self.fixed_noise else None
        return {
            "train_X": self.train_inputs[0].detach().clone(),
            "train_y": self.train_targets.detach().clone(),
            "noise": noise,
        }

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        X, y, noise = state["train_X"], state["train_y"], state["noise"]
        like = self.train_inputs[0]
        if X.dim() != 2 or X.shape[-1] != like.shape[-1] or y.shape != X.shape[:1]:
            raise ValueError(
                f"checkpoint['stream'] holds train_X {tuple(X.shape)} and train_y "
                f"{tuple(y.shape)}; this model takes n x {like.shape[-1]} inputs, n targets."
            )
        fits = noise is None if not self.fixed_noise else noise.numel() == len(y)
        if not fits:
            raise ValueError("checkpoint['stream']['noise'] does not fit this model's likelihood.")
        self._set_data(X.to(like), y.to(like), None if noise is None else noise.to(like))

    @staticmethod
    def _is_own_key(key: str) -> bool:
        r"""State entries a warm start keeps: the grid and the input transform."""
        return key.startswith(("grid.", "covar_module.grid_", "input_transform."))

    @property
    def num_train(self) -> int:
        r"""Number of observations, including those of conditioning."""
        return len(self.train_targets) + sum(e[0].shape[-2] for e in self._conditioning_log)

    def _data_noise(self) -> Tensor:
        r"""The fixed noise variances of the ``train_inputs`` rows (``n``)."""
        return self.likelihood.noise if self._rows_noise is None else self._rows_noise

    def training_noise(self) -> Tensor:
        r"""Every row's fixed noise variance, as ``SingleTaskGP``'s ``likelihood.noise``:
        the training rows', then a conditioned (fantasy) model's conditioning rows'
        (``batch x n``; what a conditioned model's own likelihood returns)."""
        parts = [self._data_noise(), *(noise_q for _, _, noise_q in self._conditioning_log)]
        return concat_rows(parts, self.batch_shape)

    @property
    def noise_variance(self) -> Tensor:
        r"""The homoskedastic noise variance, or the mean fixed noise variance."""
        noise = self._data_noise().mean() if self.fixed_noise else self.likelihood.noise
        noise = noise.reshape(())
        if not noise > 0:
            raise ValueError(
                f"The likelihood's noise variance is {noise.item():.3g}, not positive; fit with "
                "botorch.fit.fit_gpytorch_mll or use a likelihood with a noise constraint."
            )
        return noise

    def _check_hyperparameters(self) -> None:
        if self._hyperparameters_unchanged():
            return
        self._posterior_cache = {}
        self._snapshot_hyperparameters()
        if self._conditioning_log:  # replay (keeps gradients w.r.t. conditioning inputs)
            posterior = self.grid_posterior()
            correction = LowRankCorrection.empty(posterior.root.shape[-1], self.train_targets)
            for X_q, y_q, noise_q in self._conditioning_log:
                correction = correction.condition(
                    posterior, self.interpolation.weights(X_q), self._residuals(y_q), noise_q
                )
            self._correction = correction

    def _prior_mean(self) -> Tensor | None:
        r"""The constant prior mean ``c`` (transformed space), or None for ``ZeroMean``."""
        if isinstance(self.mean_module, ZeroMean):
            return None
        return self.mean_module.constant.reshape(())

    def _residuals(self, y: Tensor) -> Tensor:
        r"""Targets minus the prior mean, as the grid posterior and its corrections take them."""
        c = self._prior_mean()
        return y if c is None else y - c

    def _plus_prior_mean(self, mean: Tensor) -> Tensor:
        c = self._prior_mean()
        return mean if c is None else mean + c

    def weighted_statistics(self) -> tuple[Tensor, Tensor]:
        r"""Sparse ``A = W^T Lambda^{-1} W`` (``m x m``) and ``b = W^T Lambda^{-1} (y - c)``.

        ``c`` is the constant prior mean (0 for ``ZeroMean``). Computed from the stored
        data in ``O(n 16^d)`` (in chunks), once per data set, with
        ``W^T Lambda^{-1} 1``; the learned noise and the current ``c`` are applied on
        each call. Without autograd.
        """
        if self._statistics is None:
            X, y = self.train_inputs[0], self.train_targets
            precision = self._data_noise().detach().reciprocal() if self.fixed_noise else None
            m = self.interpolation.num_grid
            A = torch.sparse_coo_tensor(
                torch.zeros(2, 0, dtype=torch.long, device=y.device),
                y.new_zeros(0),
                (m, m),
                check_invariants=False,
            )
            b = y.new_zeros(m)
            ones = y.new_zeros(m)  # W^T Lambda^{-1} 1: b of the constant 1
            with torch.no_grad():
                for start in range(0, len(y), self.STATISTICS_CHUNK):
                    rows = slice(start, start + self.STATISTICS_CHUNK)
                    weights = self.interpolation.weights(X[rows])
                    prec = torch.ones_like(y[rows]) if precision is None else precision[rows]
                    A = (A + weights.weighted_gram(prec, sparse=True)).coalesce()
                    b = b + weights.t_matvec(prec * y[rows])
                    ones = ones + weights.t_matvec(prec)
            self._statistics = (A, b, ones)
        A, b, ones = self._statistics
        c = self._prior_mean()
        if c is not None:
            b = b - c.detach() * ones
        if self.fixed_noise:
            return A, b
        s2 = self.noise_variance.detach()
        return A / s2, b / s2

    def grid_posterior(self) -> GridPosterior:
        r"""The exact posterior of the grid values (LOVE's for grids above ``MAX_DENSE_GRID``).

        Of the values minus the constant prior mean ``c`` (the residuals', as
        :meth:`weighted_statistics`; predictions add ``c`` back). Rebuilt lazily from the
        data after ``observe`` or a hyperparameter change (``c`` included), and detached
        from the hyperparameters (as gpytorch's ``detach_test_caches``).
        """
        self._check_hyperparameters()
        if self.structured:
            return self._love_posterior_cached()
        if "exact" not in self._posterior_cache:
            with torch.no_grad():
                A, b = self.weighted_statistics()
                self._posterior_cache["exact"] = factorize(self._kernel_root(), A.to_dense(), b)
        return self._posterior_cache["exact"]

    def _love_posterior_cached(self) -> GridPosterior:
        key = ("love", float(self.love_tolerance))
        if key not in self._posterior_cache:
            tol = float(self.love_tolerance)
            with torch.no_grad():
                if is_separable(self.base_kernel):
                    A, b = self.weighted_statistics()
                    L_K = self._kernel_root()
                    posterior = structured_grid_posterior(L_K, A, b, tol=tol).posterior
                else:
                    exact = self.grid_posterior()
                    posterior = GridPosterior(compress_root(exact.root, tol=tol), exact.mean)
            self._posterior_cache = {
                k: v for k, v in self._posterior_cache.items() if k[0] != "love"
            }
            self._posterior_cache[key] = posterior
        return self._posterior_cache[key]

    def _kernel_root(self) -> GridKernelRoot:
        r"""Root of ``K_UU`` at the current hyperparameters (detached; cached with the
        grid posterior, which it is part of)."""
        if "kernel_root" not in self._posterior_cache:
            with torch.no_grad():
                root = grid_kernel_root(self.base_kernel, self.interpolation.grid)
            self._posterior_cache["kernel_root"] = root
        return self._posterior_cache["kernel_root"]

    def prior_variance_correction(self, X: Tensor, weights: Any) -> Tensor | None:
        r"""``d(x) = k(x, x) - w(x)^T K_UU w(x)`` (clamped at 0) at transformed inputs
        (``batch x t``), or None when switched off (see ``exact_prior_variance``)."""
        if not (self.exact_prior_variance and exact_prior_variance_setting.on()):
            return None
        self._check_hyperparameters()
        if "prior_variance" not in self._posterior_cache:
            self._posterior_cache["prior_variance"] = PriorVarianceCorrection(
                self.base_kernel, self._kernel_root(), self.interpolation.bounds[:1]
            )
        return self._posterior_cache["prior_variance"](X, weights)

    def love_grid_posterior(self) -> GridPosterior | None:
        r"""The grid posterior with a rank-``k`` LOVE root, or None for the exact path.

        Large grids always have one. Dense grids have one inside ``fast_pred_var`` /
        ``fast_pred_samples`` for models without a conditioning correction.
        """
        self._check_hyperparameters()
        if self._correction is not None:
            return None
        if self.structured or fast_pred_var.on() or fast_pred_samples.on():
            return self._love_posterior_cached()
        return None

    def _current_correction(self) -> LowRankCorrection:
        if self._correction is None:
            width = self.grid_posterior().root.shape[-1]
            return LowRankCorrection.empty(width, self.train_targets)
        return self._correction

    # ------------------------------------------------------------ prediction
    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""The SKI prior ``N(m(X), W K_UU W^T)`` at transformed inputs (for training)."""
        return MultivariateNormal(self.mean_module(X), self.covar_module(X))

    def __call__(self, *args: Any, **kwargs: Any) -> MultivariateNormal:
        if self.training or len(args) != 1:
            return super().__call__(*args, **kwargs)
        return self.predict_latent(args[0])

    def predict_latent(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of the latent function at already-transformed inputs ``X``.

        Sparse products throughout: ``O(t m)`` memory on the exact path, ``O(t k)``
        under LOVE (a ``RootLinearOperator``), never ``t x 4^d x m``.
        """
        weights = self.interpolation.weights(X)
        # The exact prior variance's diagonal, on both paths (as in WiskiGP).
        diagonal = self.prior_variance_correction(X, weights)
        love = self.love_grid_posterior()
        if love is not None:
            root = weights.matmul(love.root)
            mean = self._plus_prior_mean(weights.dot(love.mean))
            return MultivariateNormal(mean, root_covariance(root, diagonal))
        posterior = self.grid_posterior()
        mean, positive, negative = self._current_correction().predict_factors(posterior, weights)
        mean = self._plus_prior_mean(mean)
        # Lazy: variances from the factors (or the cached grid covariance), the t x t
        # matrix only for joint use, as in WiskiGP.
        covar = PosteriorCovariance(positive, negative, diagonal, batch_shape=mean.shape[:-1])
        return MultivariateNormal(mean, covar)

    def _check_inputs(self, X: Tensor, name: str) -> None:
        check_tensor(X, name, like=self.train_targets, min_dim=2, last_dim=self.interpolation.dim)

    # -------------------------------------------------------------- updates
    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> KissGP:
        r"""Append observations in place (the caches are rebuilt on the next prediction).

        Not an online update: the next prediction re-reads all data,
        ``O(n 16^d)``, and refactors, ``O(m^3)`` on dense grids (``O(k(nnz + m k))``
        for LOVE roots of separable kernels). Use :class:`~streamgp.models.WiskiGP`
        for ``O(m^2 q)`` updates.

        A point outside the grid's box re-grids first: a box grown past it
        (:func:`~streamgp.interpolation.grid.grown_grid_bounds`), the ``grid_size``
        given to the constructor (or the default of the new box), a new ``SKIKernel``
        around the same base kernel; the hyperparameters are kept and the caches
        rebuilt from all data, so the model equals one built at once on all data with
        that grid. (Inside :class:`~streamgp.settings.skip_value_checks` nothing is
        checked and points outside are clamped onto the box.)

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (original space).
            Yvar: ``q x 1`` noise variances; required exactly for fixed-noise models.

        Returns:
            The model itself. On invalid input, or any failure (an interrupt included),
            raises and leaves the model unchanged.
        """
        with transaction(self):
            return self._observe(X, Y, Yvar)

    def _observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None) -> KissGP:
        check_new_observations(
            X,
            Y,
            Yvar,
            like=self.train_targets,
            dim=self.interpolation.dim,
            fixed_noise=self.fixed_noise,
        )
        if self._conditioning_log and len(self.batch_shape) > 0:
            raise RuntimeError(
                "observe is not available on a model conditioned on batched (fantasy) "
                "observations; observe on the parent model instead."
            )
        X_t, Y_t, Yvar_t = transform_new_data(self, X, Y, Yvar)
        grid = None
        if not skip_value_checks.on():  # (a host read; inside it, points are clamped)
            bounds = grown_grid_bounds(self.interpolation.bounds, X_t.detach())
            if bounds is not None:  # a re-grid; the old grid lies inside the new one
                grid = self._grid_over(bounds, self._grid_size_option)
        # grown_grid_bounds is check_inside's test (same tolerance): nothing to check again.
        if len(X) == 0:
            return self
        noise = self._data_noise().detach() if self.fixed_noise else None
        parts = [(self.train_inputs[0], self.train_targets, noise)]
        parts += [
            (X_q.detach(), y_q.detach(), n_q.detach()) for X_q, y_q, n_q in self._conditioning_log
        ]
        new_noise = None if Yvar_t is None else Yvar_t.squeeze(-1)
        parts.append((X_t, Y_t.squeeze(-1), new_noise))
        X_all = torch.cat([p[0] for p in parts])
        y_all = torch.cat([p[1] for p in parts])
        noise_all = torch.cat([p[2] for p in parts]) if self.fixed_noise else None
        self._clear_caches()  # the conditioning is now data
        if grid is not None:
            self._set_grid(*grid)
        self._set_data(X_all, y_all, noise_all)
        return self

    def _regridded_sibling(self, X_t: Tensor) -> KissGP | None:
        r"""This model on a grid grown over the transformed inputs ``X_t``, or None if
        its grid covers them: a view with the same data (exact, as a re-grid), kept with
        the caches (dropped when the data or hyperparameters change) and grown
        geometrically, so an acquisition's search re-grids ``O(log)`` times."""
        cached = self._posterior_cache.get("regrid_sibling")
        if grown_grid_bounds(self.interpolation.bounds, X_t) is None:
            return None
        base = self if cached is None else cached
        bounds = grown_grid_bounds(base.interpolation.bounds, X_t)
        if bounds is None:
            return cached
        sibling = shallow_view(self)
        sibling._set_grid(*self._grid_over(bounds, self._grid_size_option))
        sibling._invalidate()
        self._posterior_cache["regrid_sibling"] = sibling
        return sibling

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> KissGP:
        r"""A new model conditioned on ``(X, Y)``: a rank-``q`` correction of this one.

        The new model shares this model's modules and cached grid posterior (a view,
        like :meth:`WiskiGP.condition_on_observations`); it is exact (the SKI posterior
        given all data) and differentiable with respect to ``X``.

        Args:
            X: ``batch_shape x q x d`` inputs (original space).
            Y: ``sample_shape x batch_shape x q x 1`` targets (original space).
            noise: Optional ``batch_shape x q x 1`` noise variances in the
                outcome-transformed space; default: the model's noise level (mean
                training noise for fixed noise).

        Returns:
            A ``KissGP`` with batch shape ``sample_shape + broadcast(batch, model.batch)``.
        """
        check_conditioning_data(X, Y, noise, like=self.train_targets, dim=self.interpolation.dim)
        X_t, Y_t, _ = transform_new_data(self, X, Y)
        if self._conditioning_log or skip_value_checks.on():
            self.interpolation.check_inside(X_t, "X")  # (a view keeps no data of its own)
        else:  # (NaN was refused above; grown_grid_bounds is check_inside's own test)
            # Beyond the grid: the same data on a grid grown over X (this model keeps
            # its grid, so its predictions do not move under an acquisition's search).
            sibling = self._regridded_sibling(X_t.detach())
            if sibling is not None:
                return sibling.condition_on_observations(X, Y, noise, **kwargs)
        posterior = self.grid_posterior()
        y = Y_t.squeeze(-1)
        noise_q = conditioning_noise(noise, self, X)
        correction = self._current_correction().condition(
            posterior, self.interpolation.weights(X_t), self._residuals(y), noise_q
        )
        new = shallow_view(self)
        new._correction = correction
        new._conditioning_log = [*self._conditioning_log, (X_t, y, noise_q)]
        if self.fixed_noise:  # its own likelihood: its rows' noise, never the parent's
            new._rows_noise = self._data_noise()
            new.likelihood = bind_row_noise(new)
        return new
