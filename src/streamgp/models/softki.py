r"""SoftKI: soft kernel interpolation from learned points, as a BoTorch model.

Camaño & Huang, "High-Dimensional Gaussian Process Regression with Soft Kernel
Interpolation" (2024) keep SKI's kernel ``K_XX ~ W_xz K_zz W_zx`` but replace the
lattice and its cubic weights by ``m`` *learned* interpolation points ``Z`` and dense
softmax weights ``W_xz`` (Definition 4.1, :mod:`streamgp.interpolation.softmax`), so
the cost no longer grows like ``4^d`` with the input dimension. The model is an exact
GP with that kernel and Gaussian noise ``s2``:

    ``u = f(Z) ~ N(c 1, K_zz)``,  ``f(x) = w(x)^T u``,  ``y = W_xz u + eps``.

The prior mean is a learned constant ``c`` (``mean_module``, ``SingleTaskGP``'s
``ConstantMean``; ``ZeroMean()`` fixes it at zero). Softmax rows sum to one (``W 1 =
1``), so ``f`` has prior mean ``c`` everywhere and the model on ``y`` is exactly the
zero-mean model on the residuals ``y - c``, plus ``c`` in predictions: every
factorisation below is of the residuals, and ``c`` is learned with the kernel.

- Training (Algorithm 1): ``Z`` starts at k-means centres of the inputs; the kernel
  hyperparameters, the noise, the constant mean and ``Z`` (and the temperature, with
  ``learn_temperature=True``) are learned by minibatch Adam on the Hutchinson
  pseudo-loss (Definition 4.2, :func:`hutchinson_pseudo_loss`): its gradient is a
  stochastic estimate of the gradient of the minibatch log marginal likelihood that
  needs only solves with the ``B x B`` minibatch covariance (exact in the constant
  mean). :meth:`SoftKIGP.fit` runs it.
- Inference (section 4.3): with ``L L^T = K_zz`` and ``Lambda = s2 I``, the QR
  factorisation ``[Lambda^{-1/2} W K_zz; L^T] = Q R`` gives ``R^T R = C = K_zz +
  K_zx Lambda^{-1} K_xz`` without ever forming ``C`` (whose condition number is the
  square of the stacked matrix's), and ``alpha = R^{-1} Q^T [Lambda^{-1/2} (y - c); 0]``.
  The posterior of ``u - c`` is ``N(K_zz alpha, (K_zz R^{-1})(K_zz R^{-1})^T)``, so a
  prediction at ``q`` points costs ``O(q m^2)`` and its covariance is a product of
  roots (positive semi-definite by construction). The factorisation costs
  ``O(n m^2)``, is cached, and is rebuilt only when a hyperparameter changes.
- Exact prior variance (``exact_prior_variance=True``, the default;
  :mod:`streamgp.linalg.prior_variance`): predictive covariances get ``k(x, x) - w(x)^T
  K_zz w(x)`` on the diagonal, the DTC predictive covariance, as the other
  interpolation models' do. Without it, ``f = w^T u`` is a rank-``m`` model: once the
  data pin ``u`` down, it is nearly as certain between and beyond the points as at
  them. With BoTorch's defaults (learned noise, ``m = n`` learned points) the test
  variances were 100-10,000x too small (test mean ``z^2`` over three seeds: 2,150 on
  Branin at ``n = 20``, 9,500 on Hartmann-6 at ``n = 60``; SingleTaskGP 1.6 and 3.4);
  with it and the fixed temperature below, 7.7 and 1.0. The likelihood and the
  posterior mean are the exact SoftKI model's, unchanged.
- :meth:`SoftKIGP.fit_objective` is the *exact* SoftKI log marginal likelihood of all
  data from the same QR (matrix determinant lemma: ``log|W K W^T + s2 I| = log|R|^2 -
  log|L|^2 + n log s2``), ``O(n m^2)`` time and ``O(chunk m)`` memory, so BoTorch's
  ``fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))`` works at
  moderate ``n``.
- :meth:`SoftKIGP.condition_on_observations` (and BoTorch's ``fantasize``) adds a
  rank-``q`` correction to the posterior of ``u`` (:mod:`streamgp.linalg.woodbury`),
  exact for the SoftKI kernel, batched over fantasy samples.

Deviations from the paper's text, on purpose: Definition 4.2 as printed has the
opposite sign (its gradient is that of ``-log p(y)``) and normalises the probe vectors
to unit length (which would scale the trace term by ``1 / n``); here the probes are
standard Gaussian (``E[a a^T] = I``) and the sign is that of ``log p(y)``, as in the
authors' code. The paper fixes the noise at ``1e-3`` and the temperature (at 1); here
the noise is learned unless the constructor says ``noise=1e-3, learn_noise=False`` or
``fit(learn_noise=False)``, and the temperature is fixed (at ``temperature``, default
relative to the points' spacing) unless ``learn_temperature=True``: a learned
temperature can fall towards zero, where the weights pick the nearest point alone and
the model overfits (10-D Styblinski-Tang, ``n = 200``: ``T`` fell 1,000-fold, test mean
``z^2`` 600-17,000 even with the exact prior variance, 1.3-2.1 with ``T`` fixed). The
pseudo-loss's reported *value* is the exact minibatch negative log marginal
likelihood (it comes free with the LU factorisation used for the solves), so training
curves are meaningful.

Transforms: as ``SingleTaskGP``'s, ``outcome_transform`` defaults to ``Standardize(m=1)``.
An ``input_transform`` and an ``outcome_transform`` are fitted once on the training data
and then frozen (:mod:`streamgp.models.utils.transforms`); the interpolation points live
in the transformed input space, the constant mean in the transformed output space.

References:

.. [Camano2024] C. Camaño, D. Huang. High-Dimensional Gaussian Process Regression
    with Soft Kernel Interpolation. arXiv preprint, 2024.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from botorch.fit import _fit_fallback
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.models.utils.gpytorch_modules import MIN_INFERRED_NOISE_LEVEL
from botorch.optim.fit import fit_gpytorch_mll_scipy
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch.constraints import GreaterThan, Positive
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, Mean, ZeroMean
from gpytorch.models import GP
from torch import Tensor

from streamgp import settings
from streamgp.inducing.kmeans import KMeansSelector
from streamgp.interpolation.softmax import (
    DenseInterpolationWeights,
    softmax_weights,
    warn_far_predictions,
)
from streamgp.linalg.grid_kernel import GridKernelRoot, cholesky_with_jitter
from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.linalg.prior_variance import PriorVarianceCorrection
from streamgp.linalg.woodbury import GridPosterior, LowRankCorrection
from streamgp.models.base import StreamingModelMixin
from streamgp.models.utils import (
    CachedPosteriorMixin,
    FrozenTransformsMixin,
    MutableState,
    TransactionalMixin,
    conditioning_noise,
    fit_frozen_transforms,
    invalidate_after_load,
    kernel_and_likelihood_or_defaults,
    shallow_view,
    transaction,
    transform_new_data,
)
from streamgp.models.utils.defaults import DEFAULT, _DefaultType, mean_module_or_default
from streamgp.utils.validation import (
    check_bool,
    check_conditioning_data,
    check_count,
    check_gaussian_likelihood,
    check_inducing_points,
    check_kernel,
    check_no_known_noise,
    check_positive_number,
    check_tensor,
    check_train_data,
)

#: Interpolation points used when neither ``inducing_points`` nor ``num_inducing`` is
#: given (the paper's SoftKI-512), capped at ``n``.
DEFAULT_NUM_INDUCING = 512
#: Default temperature relative to the median distance from an interpolation point to
#: its nearest neighbour: small enough that a point's weight concentrates on its few
#: nearest interpolation points, large enough that weights vary smoothly.
DEFAULT_RELATIVE_TEMPERATURE = 0.5
#: See :data:`streamgp.settings.QR_CHUNK` (overridable here).
QR_CHUNK = settings.QR_CHUNK
#: See :data:`streamgp.settings.SMALL_NOISE_RATIO` (overridable here).
SMALL_NOISE_RATIO = settings.SMALL_NOISE_RATIO
#: See :data:`streamgp.settings.SOFTKI_FIT_MAXITER` (overridable here).
SOFTKI_FIT_MAXITER = settings.SOFTKI_FIT_MAXITER
#: See :data:`streamgp.settings.NOISE_CHECK_ROWS` (overridable here).
NOISE_CHECK_ROWS = settings.NOISE_CHECK_ROWS


class SmallFixedNoiseWarning(UserWarning):
    r"""A fixed noise variance far below the fitted model's training residuals.

    SoftKI's paper fixes the noise at ``1e-3`` (good for the RMSE), but then the
    predictive variances are those of an almost noiseless model: the test NLL of
    :class:`SoftKIGP` with ``noise=1e-3, learn_noise=False`` (without the exact prior
    variance, which came later) was 69 on elevators and
    204 on protein (0.5 and 1.0 with SGPR / SVGP). :meth:`SoftKIGP.calibrate_noise`
    after the fit sets the noise to the training residuals' mean square (elevators:
    NLL 74.5 -> 0.53 at the same RMSE); or learn the noise.
    """


_LOG_2PI = math.log(2.0 * math.pi)
_DATA_KEY_PREFIXES = ("train_X_t", "train_y_t", "input_transform.", "outcome_transform.")


# --------------------------------------------------------------------- numerics
@dataclass(frozen=True)
class SoftKIFactor:
    r"""The QR factorisation of section 4.3 and the quantities derived from it.

    With ``A = [Lambda^{-1/2} W K; L^T]`` and ``b = [Lambda^{-1/2} y; 0]``, the QR of
    ``[A | b]`` has the triangular factor ``[[R, c], [0, r]]``: ``R^T R = C``,
    ``c = Q^T b`` and ``r^2 = |b|^2 - |c|^2`` (the data fit term, with no cancellation).

    Attributes:
        R: ``m x m`` upper triangular factor of ``A``.
        c: ``m`` vector ``Q^T b``.
        residual: ``r^2 = y^T (W K W^T + s2 I)^{-1} y``.
        K: ``m x m`` kernel matrix of the points (with the jitter of ``L``).
        L: ``m x m`` lower Cholesky factor of ``K``.
        n: Number of observations.
    """

    R: Tensor
    c: Tensor
    residual: Tensor
    K: Tensor
    L: Tensor
    n: int

    def log_marginal_likelihood(self, noise_variance: Tensor) -> Tensor:
        r"""``log N(y | 0, W K W^T + s2 I)`` by the matrix determinant lemma."""
        logdet = (
            2.0 * self.R.diagonal().abs().log().sum()
            - 2.0 * self.L.diagonal().log().sum()
            + self.n * noise_variance.log()
        )
        return -0.5 * (self.residual + logdet + self.n * _LOG_2PI)

    def posterior(self) -> GridPosterior:
        r"""The posterior of the point values ``u``: ``N(K alpha, (K R^{-1})(K R^{-1})^T)``."""
        alpha = torch.linalg.solve_triangular(self.R, self.c.unsqueeze(-1), upper=True)
        root = torch.linalg.solve_triangular(self.R, self.K, upper=True, left=False)
        return GridPosterior(root=root, mean=(self.K @ alpha).squeeze(-1))


def softki_factor(
    W: Tensor | None,
    y: Tensor,
    K: Tensor,
    noise_variance: Tensor,
    weights_fn=None,
    X: Tensor | None = None,
    chunk: int = QR_CHUNK,
) -> SoftKIFactor:
    r"""QR-stabilised factorisation of the SoftKI system (section 4.3), blocked by rows.

    The ``(n + m) x (m + 1)`` matrix ``[A | b]`` is never formed: blocks of ``chunk``
    rows are stacked under the running triangular factor and re-triangularised
    (TSQR), so memory is ``O(chunk m)`` and the result is the same ``R`` (up to row
    signs, which cancel in every use). Differentiable in ``W``, ``K`` and the noise.

    Args:
        W: ``n x m`` weights, or None to compute them block by block with
            ``weights_fn(X[rows])``.
        y: ``n`` targets.
        K: ``m x m`` kernel matrix of the interpolation points (before jitter).
        noise_variance: Scalar noise variance ``s2``.
        weights_fn: Maps a block of inputs to its ``rows x m`` weights (with ``X``).
        X: ``n x d`` inputs (with ``weights_fn``).
        chunk: Rows per block.

    Returns:
        The :class:`SoftKIFactor`.
    """
    L, jitter = cholesky_with_jitter(K)
    m = K.shape[-1]
    K = K + jitter * torch.eye(m, dtype=K.dtype, device=K.device)
    scale = noise_variance.sqrt()
    # Start from the prior block [L^T | 0], already triangular.
    top = torch.cat([L.mT, K.new_zeros(m, 1)], dim=-1)
    n = y.shape[-1]
    for start in range(0, n, chunk):
        rows = slice(start, start + chunk)
        W_rows = W[rows] if W is not None else weights_fn(X[rows])
        block = torch.cat([(W_rows @ K) / scale, (y[rows] / scale).unsqueeze(-1)], dim=-1)
        top = torch.linalg.qr(torch.cat([top, block], dim=0))[1]
        top = top[: m + 1]
    if top.shape[0] < m + 1:  # no data: the residual row is zero
        top = torch.cat([top, top.new_zeros(1, m + 1)], dim=0)
    return SoftKIFactor(R=top[:m, :m], c=top[:m, m], residual=top[m, m].square(), K=K, L=L, n=n)


def hutchinson_pseudo_loss(
    covar: Tensor, y: Tensor, num_probes: int = 10, generator: torch.Generator | None = None
) -> Tensor:
    r"""Negative log marginal likelihood of ``y ~ N(0, covar)`` with Hutchinson's gradient.

    Definition 4.2 (Maddox et al.'s pseudo-loss): with ``b_0 = Sigma^{-1} y`` and
    ``b_j = Sigma^{-1} a_j`` for ``L`` standard Gaussian probes ``a_j``, all held
    constant, the surrogate ``1/2 b_0^T Sigma b_0 - 1/(2L) sum_j a_j^T Sigma b_j`` has
    gradient ``1/2 y^T Sigma^{-1} dSigma Sigma^{-1} y - 1/2 tr(Sigma^{-1} dSigma)``
    in expectation: that of ``log p(y)``; its gradient in ``y`` (the residuals of a
    constant prior mean) is exact: ``-Sigma^{-1} y = -b_0``. The solves use one LU
    factorisation (a direct solver: ``Sigma`` need not be numerically positive
    definite), which also gives ``log|Sigma|``, so the returned value is the exact
    ``-log p(y)`` while its gradient is the (negated) Hutchinson estimate.

    Args:
        covar: ``B x B`` covariance ``Sigma`` (differentiable).
        y: ``B`` targets (differentiable).
        num_probes: Number ``L`` of probe vectors.
        generator: Optional random generator for the probes.

    Returns:
        A scalar: ``-log N(y | 0, Sigma)`` (summed over the ``B`` points).

    Example:
        >>> A = torch.randn(6, 6, dtype=torch.float64)
        >>> Sigma = (A @ A.T + torch.eye(6, dtype=torch.float64)).requires_grad_()
        >>> loss = hutchinson_pseudo_loss(Sigma, torch.randn(6, dtype=torch.float64))
        >>> loss.backward()
    """
    B = y.shape[-1]
    with torch.no_grad():
        probes = torch.randn(B, num_probes, dtype=y.dtype, device=y.device, generator=generator).to(
            y.device
        )
        LU, pivots, info = torch.linalg.lu_factor_ex(covar.detach())
        if info.item() != 0:
            raise torch.linalg.LinAlgError("The minibatch covariance is singular.")
        solves = torch.linalg.lu_solve(LU, pivots, torch.cat([y.unsqueeze(-1), probes], -1))
        logdet = LU.diagonal().abs().log().sum()
        value = 0.5 * ((y * solves[:, 0]).sum() + logdet + B * _LOG_2PI)
    product = covar @ solves  # differentiable in covar
    b0 = solves[:, 0]
    surrogate = (
        0.5 * (b0 * product[:, 0]).sum()
        - 0.5 * (probes * product[:, 1:]).sum() / num_probes
        - (b0 * y).sum()  # gradient -Sigma^{-1} y in y (exact)
    )
    # Value: exact -log p(y); gradient: -(surrogate's), i.e. Hutchinson's -grad log p.
    return value + (surrogate.detach() - surrogate)


def check_point_options(
    train_X: Tensor,
    num_inducing: object,
    inducing_points: Tensor | None,
    temperature: object,
    squared_distance: object,
) -> None:
    r"""Check SoftKI's options for the interpolation points and their softmax weights.

    ``num_inducing`` or ``inducing_points`` (not both; points ``M x d`` like ``train_X``),
    an optional positive ``temperature`` and a bool ``squared_distance``: the options
    :class:`SoftKIGP` and :class:`~streamgp.models.OnlineSoftKIGP` share.
    """
    check_count(num_inducing, "num_inducing", minimum=1, allow_none=True)
    if inducing_points is not None:
        if num_inducing is not None:
            raise ValueError("Pass either num_inducing or inducing_points, not both.")
        check_inducing_points(inducing_points, train_X, train_X.shape[-1])
    check_positive_number(temperature, "temperature", allow_none=True)
    if not isinstance(squared_distance, bool):
        raise TypeError(f"squared_distance must be a bool, got {type(squared_distance).__name__}.")


def median_nearest_distance(points: Tensor) -> float:
    r"""The median distance from each of ``points`` (``m x d``, ``m >= 2``) to its nearest
    other point: the length scale of SoftKI's default temperature.

    Example:
        >>> median_nearest_distance(torch.tensor([[0.0], [1.0], [3.0]]))
        1.0
    """
    distance = torch.cdist(points, points).fill_diagonal_(math.inf)
    return distance.min(-1).values.median().item()


def check_noise_admitted(noise: float | None, likelihood: GaussianLikelihood | None) -> None:
    r"""Check that a Gaussian likelihood's noise constraint admits an initial ``noise``.

    Args:
        noise: The noise variance to set, or None (nothing to check).
        likelihood: The likelihood, or None for BoTorch's default (floor ``1e-4``).

    Raises:
        ValueError: Naming ``noise`` if it is not above the constraint's lower bound.
    """
    if noise is None:
        return
    if likelihood is None:
        lower = MIN_INFERRED_NOISE_LEVEL
    else:
        lower = likelihood.noise_covar.raw_noise_constraint.lower_bound.max().item()
    if not noise > lower:
        raise ValueError(
            f"noise={noise!r} is not above the likelihood's noise floor {lower:g}; pass a "
            "likelihood whose noise constraint admits it (or learn_noise=False with the "
            "default likelihood, which then takes a floor below the value)."
        )


def check_constant_mean(mean_module: object) -> None:
    r"""Check a softmax-interpolation model's prior mean: constant or zero.

    Softmax rows sum to one (``W 1 = 1``), so a constant prior mean ``c`` is exactly a
    shift of the targets by ``-c``; a mean that varies with ``x`` is not (``W m(Z)`` is
    not ``m(x)``), so only these are supported: None (a learned ``ConstantMean``, the
    default), ``ZeroMean()``, or an unbatched ``ConstantMean``. Shared by
    :class:`SoftKIGP` and :class:`~streamgp.models.OnlineSoftKIGP`.

    Raises:
        ValueError: For any other ``mean_module``.
    """
    if mean_module is None or type(mean_module) is ZeroMean:
        return
    if type(mean_module) is ConstantMean and mean_module.constant.numel() == 1:
        return
    raise ValueError(
        "mean_module must be None (a learned constant), gpytorch's ZeroMean() or an "
        "unbatched ConstantMean (a constant prior mean is exact under softmax "
        f"interpolation, whose rows sum to one); got {type(mean_module).__name__}."
    )


def prior_constant(mean_module: Mean | None) -> Tensor | None:
    r"""The constant ``c`` of a prior mean checked by :func:`check_constant_mean`.

    Returns:
        The scalar constant (differentiable), or None for a zero mean (``ZeroMean`` or
        None), whose models then compute exactly as without a mean.
    """
    if mean_module is None or isinstance(mean_module, ZeroMean):
        return None
    return mean_module.constant.reshape(())


# ------------------------------------------------------------------------- model
class SoftKIGP(
    CachedPosteriorMixin,
    StreamingModelMixin,
    TransactionalMixin,
    FrozenTransformsMixin,
    GPyTorchModel,
    GP,
    FantasizeMixin,
):
    r"""Batch SoftKI Gaussian process: kernel ``W K_zz W^T`` on learned softmax points.

    Args:
        train_X: ``n x d`` training inputs (``n >= 1``).
        train_Y: ``n x 1`` training targets.
        train_Yvar: Not supported (the noise level is learned); raises ``ValueError``
            if given, as BoTorch code may pass it.
        likelihood: Gaussian likelihood (learned homoskedastic noise). Default:
            BoTorch's ``SingleTaskGP`` likelihood.
        covar_module: Kernel of the interpolation points. Default: BoTorch's
            ``SingleTaskGP`` kernel (RBF with dimension-scaled priors).
        outcome_transform: Outcome transform, fitted on ``train_Y`` and then frozen.
            Default: ``Standardize(m=1)``, as ``SingleTaskGP``'s; None: no transform.
        input_transform: Input transform, fitted on ``train_X`` and then frozen.
        mean_module: The prior mean, in the transformed output space. None (default): a
            ``ConstantMean`` whose constant is learned with the other hyperparameters,
            as ``SingleTaskGP``'s; ``ZeroMean()`` for a zero mean; or a given
            (unbatched) ``ConstantMean``. Other means raise ``ValueError``
            (:func:`check_constant_mean`).
        num_inducing: Number ``m`` of interpolation points, initialised at k-means
            centres of the (transformed) inputs. Default ``min(512, n)``; at most
            ``n`` are used (with ``n <= m`` the points are the inputs themselves).
        inducing_points: ``m x d`` initial interpolation points (transformed space),
            instead of k-means.
        temperature: Initial softmax temperature ``T > 0``. Default:
            ``DEFAULT_RELATIVE_TEMPERATURE`` times the median distance from a point
            to its nearest other point.
        learn_temperature: Learn the temperature with the other hyperparameters. False
            (default) fixes it at its initial value for :meth:`fit` and for BoTorch's
            ``fit_gpytorch_mll``, as the paper's Definition 4.1 and the authors' code
            do (a learned temperature can collapse and overfit; see the module).
        noise: Initial noise variance ``s2 > 0`` (transformed output space). Default:
            the likelihood's own initial value.
        learn_noise: Learn the noise variance (default). False fixes it (at ``noise``
            when given) for :meth:`fit` and for ``fit_gpytorch_mll``: the paper's
            protocol, ``noise=1e-3, learn_noise=False``. A noise far below the data's
            makes the predictive variances far too small (test NLL of 15-200 where a
            learned noise gives about 1): :meth:`fit` then warns
            (:class:`SmallFixedNoiseWarning`) and :meth:`calibrate_noise` repairs them.
        squared_distance: Weights ``exp(-||x - z||^2 / T)`` instead of the paper's
            ``exp(-||x - z|| / T)``.
        seed: Seed of the k-means++ initialisation.
        exact_prior_variance: Predict with the kernel's own prior variance (default):
            predictive covariances get ``k(x, x) - w(x)^T K_zz w(x)`` on the diagonal
            (:mod:`streamgp.linalg.prior_variance`), the variance the ``m``-point
            interpolant cannot express; without it the test variances of a model
            fitted with BoTorch's defaults were 100-10,000x too small. False: the
            exact SoftKI posterior (as in the paper; also
            ``streamgp.settings.exact_prior_variance(False)``, for every model).

    Example:
        >>> X = torch.rand(300, 6, dtype=torch.float64)
        >>> Y = torch.sin(3 * X).sum(-1, keepdim=True)
        >>> model = SoftKIGP(X, Y, num_inducing=64)
        >>> losses = model.fit(num_epochs=5, batch_size=128)
        >>> posterior = model.posterior(torch.rand(4, 6, dtype=torch.float64))
    """

    _num_outputs = 1
    data_state_prefixes = _DATA_KEY_PREFIXES
    #: What a failed :meth:`fit` restores: the parameters it optimises in place.
    mutable_state = MutableState(modules=("",))
    #: The factorisation of all data, rebuilt on demand (conditioning replayed), and
    #: the exact prior variance correction at the same hyperparameters. The data are
    #: buffers, which torch moves.
    cached_attributes = ("_posterior", "_prior_variance")
    _posterior: GridPosterior | None
    _prior_variance: PriorVarianceCorrection | None
    _correction: LowRankCorrection | None

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
        mean_module: Mean | None = None,
        num_inducing: int | None = None,
        inducing_points: Tensor | None = None,
        temperature: float | None = None,
        learn_temperature: bool = False,
        noise: float | None = None,
        learn_noise: bool = True,
        squared_distance: bool = False,
        seed: int = 0,
        exact_prior_variance: bool = True,
    ) -> None:
        # Validate everything before any state is created.
        check_no_known_noise(train_Yvar, "SoftKIGP")
        check_train_data(train_X, train_Y, allow_empty=False)
        check_point_options(train_X, num_inducing, inducing_points, temperature, squared_distance)
        check_gaussian_likelihood(likelihood)
        check_bool(learn_temperature, "learn_temperature")
        check_bool(learn_noise, "learn_noise")
        check_bool(exact_prior_variance, "exact_prior_variance")
        check_positive_number(noise, "noise", allow_none=True)
        if noise is not None and likelihood is None and not learn_noise:
            # A fixed noise needs no prior; its floor only has to admit the value.
            likelihood = GaussianLikelihood(noise_constraint=GreaterThan(0.5 * noise))
        check_noise_admitted(noise, likelihood)
        check_kernel(covar_module)
        check_constant_mean(mean_module)
        super().__init__()
        tkwargs = {"dtype": train_X.dtype, "device": train_X.device}

        # Fit the transforms once on the training data, then freeze them.
        X_t, Y_t, _ = fit_frozen_transforms(
            self, train_X, train_Y, input_transform, outcome_transform
        )
        self.register_buffer("train_X_t", X_t.detach().clone())
        self.register_buffer("train_y_t", Y_t.squeeze(-1).detach().clone())

        self.covar_module, self.likelihood = kernel_and_likelihood_or_defaults(
            covar_module, likelihood, like=train_X
        )
        self.mean_module = mean_module_or_default(mean_module, like=train_X)
        if noise is not None:
            self.likelihood.noise = noise
        if not learn_noise:  # (a given likelihood's own setting is kept otherwise)
            self.likelihood.noise_covar.raw_noise.requires_grad_(False)

        # Algorithm 1, line 1: interpolation points at k-means centres.
        if inducing_points is None:
            m = min(DEFAULT_NUM_INDUCING if num_inducing is None else num_inducing, len(X_t))
            selector = KMeansSelector(num_inducing=m, seed=seed)
            inducing_points = selector.update(self.train_X_t).to(**tkwargs)
        self.inducing_points = torch.nn.Parameter(inducing_points.detach().clone())
        self.squared_distance = squared_distance
        self.exact_prior_variance = exact_prior_variance

        if temperature is None:
            temperature = self._default_temperature()
        self.register_parameter("raw_temperature", torch.nn.Parameter(torch.zeros((), **tkwargs)))
        # On the data's device and dtype, as the parameter (a submodule: ``.to`` moves it).
        self.register_constraint("raw_temperature", Positive().to(**tkwargs))
        self.temperature = temperature
        self.raw_temperature.requires_grad_(learn_temperature)
        self.register_load_state_dict_post_hook(invalidate_after_load)
        self._clear_caches()

    # ------------------------------------------------------------------ state
    def _default_temperature(self) -> float:
        Z = self.inducing_points.detach()
        if len(Z) < 2:
            return 1.0
        nearest = median_nearest_distance(Z)
        if self.squared_distance:
            nearest = nearest**2
        return DEFAULT_RELATIVE_TEMPERATURE * nearest if nearest > 0 else 1.0

    @property
    def temperature(self) -> Tensor:
        r"""The softmax temperature ``T`` (positive; learned with ``learn_temperature``)."""
        return self.raw_temperature_constraint.transform(self.raw_temperature)

    @temperature.setter
    def temperature(self, value: float | Tensor) -> None:
        value = torch.as_tensor(value, dtype=self.raw_temperature.dtype)
        value = value.to(self.raw_temperature.device).reshape(())
        if not (torch.isfinite(value) and value > 0):
            raise ValueError(f"temperature must be positive and finite, got {value.item()!r}.")
        with torch.no_grad():
            self.raw_temperature.copy_(self.raw_temperature_constraint.inverse_transform(value))

    @property
    def learn_temperature(self) -> bool:
        r"""Whether :meth:`fit` and ``fit_gpytorch_mll`` learn the temperature."""
        return self.raw_temperature.requires_grad

    @property
    def learn_noise(self) -> bool:
        r"""Whether :meth:`fit` and ``fit_gpytorch_mll`` learn the noise variance."""
        return self.likelihood.noise_covar.raw_noise.requires_grad

    @property
    def num_inducing(self) -> int:
        r"""Number ``m`` of interpolation points."""
        return self.inducing_points.shape[0]

    @property
    def noise_variance(self) -> Tensor:
        r"""The homoskedastic noise variance ``s2`` (differentiable)."""
        noise = self.likelihood.noise.reshape(())
        if not noise > 0:
            raise ValueError(
                f"The likelihood's noise variance is {noise.item():.3g}, not positive; use an "
                "optimizer that respects the noise constraint."
            )
        return noise

    def _caches_valid(self) -> bool:
        return self._posterior is not None and self._hyperparameters_unchanged()

    def _prior_mean(self) -> Tensor | None:
        r"""The constant prior mean ``c`` (transformed space; differentiable), or None for zero."""
        return prior_constant(self.mean_module)

    def _residuals(self, y: Tensor) -> Tensor:
        r"""Targets minus the prior mean: what the zero-mean factorisations take."""
        mean = self._prior_mean()
        return y if mean is None else y - mean

    def weights(self, X_t: Tensor) -> DenseInterpolationWeights:
        r"""Softmax weights of already-transformed inputs ``batch x N x d`` (differentiable)."""
        return DenseInterpolationWeights(self._weight_values(X_t))

    def _weight_values(self, X_t: Tensor) -> Tensor:
        return softmax_weights(
            X_t, self.inducing_points, self.temperature, squared=self.squared_distance
        )

    def _kernel_matrix(self) -> Tensor:
        return self.covar_module(self.inducing_points).to_dense()

    def factor(self) -> SoftKIFactor:
        r"""The QR factorisation of all training data (section 4.3), ``O(n m^2)``.

        Of the residuals ``y - c`` (the targets minus the constant prior mean).
        Differentiable in the hyperparameters, the constant included (not cached;
        :meth:`softki_posterior` caches what predictions need).
        """
        return softki_factor(
            None,
            self._residuals(self.train_y_t),
            self._kernel_matrix(),
            self.noise_variance,
            weights_fn=self._weight_values,
            X=self.train_X_t,
        )

    def softki_posterior(self) -> GridPosterior:
        r"""Posterior ``N(mean, root root^T)`` of the values ``u - c`` at the points.

        Rebuilt from the QR factorisation when a hyperparameter changed since the last
        call (``O(n m^2)``), otherwise cached. Detached from the hyperparameters (as
        gpytorch's ``detach_test_caches``); gradients with respect to test inputs flow.
        """
        if not self._caches_valid():
            with torch.no_grad():
                factor = self.factor()
                self._posterior = factor.posterior()
                # k(x, x) - w^T L L^T w with the factorisation's own root (its jitter
                # included); a stationary kernel's k(x, x) is read at any one input.
                self._prior_variance = PriorVarianceCorrection(
                    self.covar_module, GridKernelRoot((factor.L,)), self.train_X_t[:1]
                )
                self._snapshot_hyperparameters()
            self._correction = None
            for X_q, y_q, noise_q in self._conditioning_log:
                self._correction = self._current_correction().condition(
                    self._posterior, self.weights(X_q), self._residuals(y_q), noise_q
                )
        return self._posterior

    def _current_correction(self) -> LowRankCorrection:
        if self._correction is None:
            return LowRankCorrection.empty(self.num_inducing, self.train_y_t)
        return self._correction

    # ------------------------------------------------------------ objectives
    def fit_objective(self) -> tuple[Tensor, Tensor]:
        r"""The exact SoftKI log marginal likelihood of all training data, and ``n``.

        ``log N(y | c 1, W K_zz W^T + s2 I)`` from the QR factorisation, ``O(n m^2)``
        time, ``O(QR_CHUNK m)`` memory; differentiable in the kernel hyperparameters,
        the noise, the constant mean, the interpolation points and the temperature. BoTorch's
        ``fit_gpytorch_mll`` maximises it (plus the log hyperpriors).
        """
        value = self.factor().log_marginal_likelihood(self.noise_variance)
        return value, self.train_y_t.new_tensor(float(self.train_y_t.shape[-1]))

    def pseudo_loss(
        self,
        X_t: Tensor,
        y: Tensor,
        num_probes: int = 10,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        r"""Per-datum Hutchinson pseudo-loss of a minibatch (Algorithm 1, lines 4-7).

        Args:
            X_t: ``B x d`` transformed inputs; y: ``B`` transformed targets.
            num_probes: Hutchinson probe vectors.
            generator: Random generator of the probes.

        Returns:
            ``-(log p(y_B) / B + log hyperprior / n)`` in value; its gradient is
            Hutchinson's estimate of the gradient of that quantity (exact in the
            constant mean).
        """
        W = self._weight_values(X_t)
        L, jitter = cholesky_with_jitter(self._kernel_matrix())
        # Sigma = (W L)(W L)^T + s2 I: the root keeps Sigma symmetric PSD + s2 I.
        WL = W @ L
        covar = WL @ WL.mT + self.noise_variance * torch.eye(len(y), dtype=y.dtype, device=y.device)
        residuals = self._residuals(y)
        loss = hutchinson_pseudo_loss(covar, residuals, num_probes, generator) / len(y)
        n = self.train_y_t.shape[-1]
        for _, module, prior, closure, _ in self.named_priors():
            loss = loss - prior.log_prob(closure(module)).sum() / n
        return loss

    def custom_fit(
        self,
        mll: Any,
        closure: Any = None,
        closure_kwargs: dict[str, Any] | None = None,
        optimizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        r"""What BoTorch's ``fit_gpytorch_mll`` runs for this model: its usual fit, with
        L-BFGS-B capped at ``SOFTKI_FIT_MAXITER`` iterations unless ``optimizer_kwargs``
        set ``options["maxiter"]`` (another ``optimizer`` is run as given).

        With few observations the marginal likelihood over the learnable interpolation
        points has no useful optimum: it keeps rising as the points and the noise fit
        the data ever closer, and the predictions get worse (see
        :data:`streamgp.settings.SOFTKI_FIT_MAXITER`), as the paper's fixed number of
        Adam epochs (:meth:`fit`) also avoids.

        Example:
            >>> from botorch.fit import fit_gpytorch_mll
            >>> from gpytorch.mlls import ExactMarginalLogLikelihood
            >>> X = torch.rand(12, 2, dtype=torch.float64)
            >>> model = SoftKIGP(X, torch.sin(6 * X).sum(-1, keepdim=True))
            >>> mll = fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
            >>> mll.training
            False
        """
        optimizer = kwargs.get("optimizer", fit_gpytorch_mll_scipy)
        if optimizer is fit_gpytorch_mll_scipy:
            optimizer_kwargs = dict(optimizer_kwargs or {})
            options = {"maxiter": SOFTKI_FIT_MAXITER, **(optimizer_kwargs.get("options") or {})}
            optimizer_kwargs["options"] = options
        return _fit_fallback(
            mll,
            closure=closure,
            closure_kwargs=closure_kwargs,
            optimizer_kwargs=optimizer_kwargs,
            **kwargs,
        )

    def fit(
        self,
        num_epochs: int = 50,
        batch_size: int = 1024,
        lr: float = 0.01,
        num_probes: int = 10,
        learn_noise: bool = True,
        seed: int | None = None,
        check_noise: bool = True,
    ) -> list[float]:
        r"""Minibatch Adam on the Hutchinson pseudo-loss (Algorithm 1), in place.

        Learns the kernel hyperparameters, the noise (unless ``learn_noise=False``
        here or in the constructor; the paper fixes it), the constant prior mean, the
        interpolation points and (with the constructor's ``learn_temperature=True``)
        the temperature. Each step costs ``O(B m^2 + B^2 m + B^3)`` for
        minibatch size ``B``, whatever ``n``.

        With the noise held fixed, a noise variance below ``1 / SMALL_NOISE_RATIO`` of
        the training residuals' mean square (on up to ``NOISE_CHECK_ROWS`` rows) makes
        the predictive variances far too small (see :class:`SmallFixedNoiseWarning`):
        the fit then warns. The check costs the ``O(n m^2)`` factorisation that
        predictions need anyway (it is cached). Training residuals understate the error
        of a model that interpolates its data (``m`` near ``n``).

        Args:
            num_epochs: Passes over the training data.
            batch_size: Minibatch size ``B`` (the last minibatch may be smaller).
            lr: Adam learning rate.
            num_probes: Hutchinson probe vectors per step.
            learn_noise: Also learn the noise variance.
            seed: Seed of the shuffling and the probes (default: torch's global RNG).
            check_noise: With the noise held fixed, warn if it is far below the
                training residuals' mean square (:class:`SmallFixedNoiseWarning`).

        Returns:
            The mean per-datum loss (minibatch negative log marginal likelihood
            minus the log hyperprior over ``n``) of each epoch. On failure (a
            non-finite loss), the hyperparameters are restored and ``ValueError`` is
            raised.
        """
        check_count(num_epochs, "num_epochs", minimum=0)
        check_count(batch_size, "batch_size", minimum=1)
        check_count(num_probes, "num_probes", minimum=1)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"lr must be a positive number, got {lr!r}.")
        check_bool(learn_noise, "learn_noise")
        check_bool(check_noise, "check_noise")
        noise_params = set(map(id, self.likelihood.parameters()))
        params = [
            p
            for p in self.parameters()
            if p.requires_grad and (learn_noise or id(p) not in noise_params)
        ]
        _, bounds = get_parameters_and_bounds(self)
        named = dict(self.named_parameters())
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.train_X_t.device).manual_seed(seed)
        n = self.train_y_t.shape[-1]
        optimizer = torch.optim.Adam(params, lr=lr)
        history: list[float] = []
        self.train()
        try:
            with transaction(self):
                for _ in range(num_epochs):
                    order = torch.randperm(n, generator=generator, device=self.train_X_t.device)
                    total = 0.0
                    for start in range(0, n, batch_size):
                        index = order[start : start + batch_size]
                        optimizer.zero_grad()
                        try:
                            loss = self.pseudo_loss(
                                self.train_X_t[index], self.train_y_t[index], num_probes, generator
                            )
                        except torch.linalg.LinAlgError as error:  # e.g. K_zz overflowed
                            loss = torch.tensor(math.nan)
                            failure = error
                        else:
                            failure = None
                        if not torch.isfinite(loss):
                            if failure is not None:
                                raise ValueError(
                                    "The SoftKI pseudo-loss is not finite (a factorisation "
                                    "failed); the hyperparameters may have diverged (lower lr)."
                                ) from failure
                            raise ValueError(
                                "The SoftKI pseudo-loss is not finite; the hyperparameters may "
                                "have diverged (lower lr)."
                            )
                        loss.backward()
                        optimizer.step()
                        # BoTorch's constraints without a transform (e.g. the noise floor)
                        # are bounds the optimizer must enforce.
                        with torch.no_grad():
                            for name, (lower, upper) in bounds.items():
                                named[name].clamp_(min=lower, max=upper)
                        total += loss.item() * len(index)
                    history.append(total / n)
        finally:
            self.eval()
        self._invalidate()
        if check_noise and not (learn_noise and self.learn_noise):
            self._warn_if_noise_small()
        return history

    def _residual_mean_square(self, rows: Tensor | None = None) -> float:
        r"""Mean square of the training residuals ``y - E[f(x)]`` (transformed space)."""
        X, y = self.train_X_t, self.train_y_t
        if rows is not None:
            X, y = X[rows], y[rows]
        total = 0.0
        with torch.no_grad():
            for X_c, y_c in zip(X.split(QR_CHUNK), y.split(QR_CHUNK), strict=True):
                total += (y_c - self._latent_forward(X_c).mean).square().sum().item()
        return total / len(y)

    def calibrate_noise(self) -> float:
        r"""Set the noise variance to the mean square of the training residuals.

        For the paper's fixed-noise protocol (``noise=1e-3, learn_noise=False``), whose
        tiny noise gives good RMSE but predictive variances far too small: after
        :meth:`fit`, the noise becomes the mean square of ``y - E[f(x)]`` over all
        training rows, so that ``posterior(X, observation_noise=True)`` has about the
        right variance. Measured (Table 1 protocol, seed 0, m = 512, 50 epochs, without
        the exact prior variance and with a learned temperature): on
        elevators test NLL 74.5 -> 0.53 (SGPR: 0.52) at RMSE 0.398 -> 0.400; on protein
        NLL 203 -> 1.04 but RMSE 0.643 -> 0.681 (the mean changes with the noise). The
        noise stays fixed (or learned) as before. Costs ``O(n m^2)`` (the factorisation
        predictions need) plus ``O(n m)``. Training residuals understate the error of a
        model that interpolates its data (``m`` near ``n``).

        Returns:
            The new noise variance (transformed output space).

        Raises:
            ValueError: If the mean square is not above the likelihood's noise floor
                (the model is then unchanged).

        Example:
            >>> X = torch.rand(200, 3, dtype=torch.float64)
            >>> Y = torch.sin(3 * X).sum(-1, keepdim=True) + 0.2 * torch.randn(200, 1).double()
            >>> model = SoftKIGP(X, Y, num_inducing=16, noise=1e-3, learn_noise=False)
            >>> _ = model.fit(num_epochs=2, batch_size=50, seed=0, check_noise=False)
            >>> noise = model.calibrate_noise()
            >>> bool(model.noise_variance.item() == noise > 1e-3)
            True
        """
        value = self._residual_mean_square()
        lower = self.likelihood.noise_covar.raw_noise_constraint.lower_bound.max().item()
        if not value > lower:
            raise ValueError(
                f"The training residuals' mean square {value:.3g} is not above the "
                f"likelihood's noise floor {lower:g} (a model that interpolates its data?); "
                "the noise is unchanged."
            )
        with torch.no_grad():
            self.likelihood.noise = value
        return self.noise_variance.item()

    def _warn_if_noise_small(self) -> None:
        r"""Warn if the noise variance is far below the training residuals' mean square."""
        n = self.train_y_t.shape[-1]
        rows = torch.linspace(0, n - 1, min(n, NOISE_CHECK_ROWS), device=self.train_y_t.device)
        residual = self._residual_mean_square(rows.round().long())
        noise = self.noise_variance.item()
        if residual > SMALL_NOISE_RATIO * noise:
            warnings.warn(
                f"The fixed noise variance {noise:.3g} is {residual / noise:.0f}x below the "
                f"training residuals' mean square {residual:.3g}: predictive variances "
                "will be far too small (test NLL far above a learned noise's). Call "
                "calibrate_noise() before predicting, or learn the noise (learn_noise=True) "
                "where calibrated variances matter.",
                SmallFixedNoiseWarning,
                stacklevel=3,
            )

    #: A restore takes the checkpoint's interpolation points, whatever their number.
    ADOPTED_OPTIONS = frozenset({"num_inducing"})

    def _checkpoint_options(self) -> dict[str, Any]:
        return {**super()._checkpoint_options(), "num_inducing": self.num_inducing}

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        strict: bool = True,
        keep_transforms: bool = True,
        **kwargs: Any,
    ):
        r"""Load hyperparameters (a warm start), or a whole stream (a checkpoint).

        As :meth:`StreamingModelMixin.load_state_dict`; the interpolation points are
        learned parameters, so a warm start takes them, whatever their number: BoTorch's
        closed loop (rebuild the model on all data, load the previous model's
        ``state_dict()``) keeps the learned points and hyperparameters although the
        default number of points, ``min(512, n)``, grew with ``n``. Other keys are
        loaded as by torch (``strict`` included).

        Example:
            >>> X = torch.rand(12, 2, dtype=torch.float64)
            >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
            >>> old = SoftKIGP(X[:10], Y[:10])  # 10 points
            >>> new = SoftKIGP(X, Y)  # 12 points
            >>> _ = new.load_state_dict(old.state_dict())
            >>> new.num_inducing
            10
        """
        if keep_transforms:  # (a restore resizes the points in _prepare_state_load)
            self._adopt_point_count(state_dict)
        return super().load_state_dict(
            state_dict, strict=strict, keep_transforms=keep_transforms, **kwargs
        )

    def _adopt_point_count(self, state_dict: dict[str, Any]) -> None:
        r"""Resize the points to ``state_dict``'s number (torch then copies them in).

        Points of another dimension are left for torch to report as a size mismatch.
        """
        points = state_dict.get("inducing_points")
        own = self.inducing_points
        if (
            isinstance(points, Tensor)
            and points.dim() == own.dim()
            and points.shape[-1] == own.shape[-1]
            and points.shape != own.shape
        ):
            self.inducing_points = torch.nn.Parameter(
                own.new_empty(points.shape), requires_grad=own.requires_grad
            )
            self._invalidate()

    def _prepare_state_load(self, state_dict: dict[str, Any]) -> None:
        # A checkpoint of other data: its training set and points may differ in size.
        for name in ("train_X_t", "train_y_t"):
            if name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[name]))
        self._adopt_point_count(state_dict)
        self._clear_caches()

    # ------------------------------------------------------------ BoTorch API
    def _check_inputs(self, X: Tensor, name: str) -> None:
        check_tensor(
            X, name, like=self.train_X_t, min_dim=2, last_dim=self.inducing_points.shape[-1]
        )

    def _prediction_inputs(self, X: Tensor) -> Tensor:
        # Softmax weights predict anywhere; far from every point, as at the nearest ones.
        X_t = super()._prediction_inputs(X)
        warn_far_predictions(X_t, self.inducing_points.detach())
        return X_t

    def _latent_forward(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of the latent function at already-transformed inputs ``X`` (what
        ``model(X)`` returns in eval mode; see ``StreamingModelMixin.forward``)."""
        posterior = self.softki_posterior()
        weights = self.weights(X)
        mean, positive, negative = self._current_correction().predict_factors(posterior, weights)
        # k(x, x) - w^T K_zz w on the diagonal: the variance that the m-point
        # interpolant cannot express, which its posterior alone would drop.
        diagonal = None
        if self.exact_prior_variance and settings.exact_prior_variance.on():
            diagonal = self._prior_variance(X, weights)
        covar = PosteriorCovariance(positive, negative, diagonal, batch_shape=mean.shape[:-1])
        prior_mean = self._prior_mean()
        return MultivariateNormal(mean if prior_mean is None else mean + prior_mean, covar)

    def _check_posterior_inputs(self, X: Tensor, observation_noise: bool | Tensor) -> None:
        super()._check_posterior_inputs(X, observation_noise)
        if isinstance(observation_noise, Tensor):
            check_tensor(observation_noise, "observation_noise", like=self.train_X_t, last_dim=1)

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> SoftKIGP:
        r"""A new model conditioned on ``(X, Y)``: exact for the SoftKI kernel.

        The new model shares this one's factorisation and adds a rank-``q`` correction
        of the posterior of the point values, batched over candidate sets and fantasy
        samples and differentiable in ``X`` (what BoTorch's ``fantasize``, qKG and
        qNIPV need). Kernel, likelihood and transforms are shared with this model; its
        ``fit_objective`` stays that of the training data.

        Args:
            X: ``batch_shape x q x d`` inputs (original space).
            Y: ``sample_shape x batch_shape x q x 1`` targets (original space).
            noise: Optional ``batch_shape x q x 1`` noise variances in the
                outcome-transformed space; default: the model's noise level.

        Returns:
            A ``SoftKIGP`` with batch shape ``sample_shape + broadcast(batch, model.batch)``.
        """
        check_conditioning_data(
            X, Y, noise, like=self.train_X_t, dim=self.inducing_points.shape[-1]
        )
        X_t, Y_t, _ = transform_new_data(self, X, Y)
        warn_far_predictions(X_t, self.inducing_points.detach())
        posterior = self.softki_posterior()
        y = Y_t.squeeze(-1)
        noise_q = conditioning_noise(noise, self, X)
        correction = self._current_correction().condition(
            posterior, self.weights(X_t), self._residuals(y), noise_q
        )
        new = shallow_view(self)
        new._correction = correction
        new._conditioning_log = [*self._conditioning_log, (X_t, y, noise_q)]
        return new
