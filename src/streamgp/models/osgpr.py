r"""Online SGPR: the collapsed streaming sparse GP of Bui et al. (2017), as a BoTorch model.

Bui, Nguyen & Turner, "Streaming Sparse Gaussian Process Approximations" (NeurIPS
2017) approximate the posterior after each batch by a sparse GP with inducing
inputs ``a`` and use it, in place of the discarded data, as a Gaussian "likelihood"
``q_old(a) / p(a | theta_old)`` on the next batch. For a Gaussian likelihood the new
``q(b)`` can be integrated out in closed form, giving the collapsed online bound
(their eq. 11; Titsias' SGPR bound on the first batch). This model keeps that
summary as pseudo-observations of the inducing values
(:mod:`streamgp.linalg.sparse_gp`) — a precision root accumulated by sums, never the
matrix difference ``S_a^{-1} - K_aa^{-1}`` that made O-SGPR numerically fragile — so
memory and update cost depend on the number of inducing points ``M``, never on ``n``:

- :meth:`OnlineSGPR.observe` absorbs a batch in place in ``O(M^2 (q + M) + M^3)``,
  after moving the inducing set (a mix of old inducing points and new inputs as in
  Bui et al.'s experiments, or any :mod:`streamgp.inducing` selector such as OIPS)
  and, optionally, a few optimizer steps on the online bound;
- :class:`streamgp.mlls.OnlineSGPRBound` is that bound as a loss module;
- :meth:`OnlineSGPR.condition_on_observations` (and BoTorch's ``fantasize``) is the
  exact Gaussian update of ``q(u)`` — online variational conditioning (Maddox et al.,
  "Conditioning Sparse Variational Gaussian Processes for Online Decision-making",
  NeurIPS 2021) — returned as a cheap rank-``q`` view of this model, batched over
  candidate sets and fantasy samples, so qKG and qNIPV run on it.

With inducing points equal to all training inputs the posterior is the exact GP
posterior; with fixed inducing points and hyperparameters, streaming in batches gives
exactly the batch SGPR posterior and bound.

Defaults are ``SingleTaskGP``'s: ``Standardize`` on the outcomes
(``outcome_transform=None`` for none) and a learned constant prior mean
(``ConstantMean``; ``mean_module=ZeroMean()`` for a zero mean). As in
:class:`~streamgp.models.WiskiGP`, the input and outcome transforms are fitted once on
the constructor's data and then frozen. The pseudo-observations are a factor on the
actual inducing values, not on their residuals from the mean, so the constant is
learned by the online bound like any hyperparameter, and a new constant changes only
the prior of the summarised data, exactly, as new kernel hyperparameters do (Bui et
al.'s ``p(a | theta)``).

References:

.. [Bui2017] T. D. Bui, C. V. Nguyen, R. E. Turner. Streaming Sparse Gaussian Process
    Approximations. Advances in Neural Information Processing Systems 30, 2017.
.. [Titsias2009] M. Titsias. Variational Learning of Inducing Variables in Sparse
    Gaussian Processes. International Conference on Artificial Intelligence and
    Statistics, 2009.
.. [Maddox2021] W. J. Maddox, S. Stanton, A. G. Wilson. Conditioning Sparse
    Variational Gaussian Processes for Online Decision-making. Advances in Neural
    Information Processing Systems 34, 2021.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import Mean, ZeroMean
from gpytorch.models import GP
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from streamgp.inducing.base import InducingPointSelector
from streamgp.linalg.sparse_gp import (
    PseudoObservations,
    SparsePosterior,
    match_points,
    predict,
    projection_weights,
    sparse_posterior,
    streaming_collapsed_bound,
)
from streamgp.linalg.woodbury import LowRankCorrection
from streamgp.models.base import StreamingModelMixin
from streamgp.models.utils import (
    CachedPosteriorMixin,
    FrozenTransformsMixin,
    MutableState,
    TransactionalMixin,
    apply_to_tensors,
    conditioning_noise,
    fit_frozen_transforms,
    invalidate_after_load,
    kernel_and_likelihood_or_defaults,
    parameter_snapshot,
    parameters_unchanged,
    shallow_view,
    transaction,
    transform_new_data,
)
from streamgp.models.utils.defaults import DEFAULT, _DefaultType, mean_module_or_default
from streamgp.utils.validation import (
    check_gaussian_likelihood,
    check_inducing_points,
    check_kernel,
    check_no_known_noise,
    check_positive,
    check_targets,
    check_tensor,
    check_train_data,
)

#: Inducing points used when neither ``inducing_points`` nor ``num_inducing`` is given.
DEFAULT_NUM_INDUCING = 128
#: Default jitter on ``K_ZZ``, relative to its mean diagonal (the output scale).
DEFAULT_JITTER = {torch.float64: 1e-8, torch.float32: 1e-6}

_STATE_BUFFERS = ("inducing_points", "pseudo_root", "pseudo_eta", "pseudo_log_norm", "num_observed")


def _mean_module_or_default(mean_module: object | None, like: Tensor) -> Mean:
    r"""``mean_module`` on ``like``'s dtype and device (None: a learned ``ConstantMean``).

    Raises:
        TypeError: If ``mean_module`` is neither None nor a gpytorch ``Mean``.
        ValueError: If it fails on, or has batch dimensions for, ``n x d`` inputs.
    """
    if mean_module is not None and not isinstance(mean_module, Mean):
        raise TypeError(
            "mean_module must be None (a learned constant), or a gpytorch Mean such as "
            f"ConstantMean or ZeroMean, got {type(mean_module).__name__}."
        )
    mean_module = mean_module_or_default(mean_module, like)
    probe = like.new_zeros(2, like.shape[-1])
    try:
        with torch.no_grad():
            shape = mean_module(probe).shape
    except Exception as error:  # re-raised with the argument named
        raise ValueError(
            f"mean_module ({type(mean_module).__name__}) fails on {probe.shape[-1]}-dimensional "
            f"inputs: {error}"
        ) from error
    if shape != probe.shape[:-1]:
        raise ValueError(
            "mean_module must map n x d inputs to n values (no batch dimensions); "
            f"{type(mean_module).__name__} gives shape {tuple(shape)} for "
            f"{tuple(probe.shape)} inputs."
        )
    return mean_module


class _LastBatch(NamedTuple):
    r"""The last absorbed batch (transformed), its inducing set and the summary before it."""

    X: Tensor
    y: Tensor
    inducing_points: Tensor
    shared: Tensor | None
    summary: PseudoObservations


class OnlineSGPR(
    CachedPosteriorMixin,
    StreamingModelMixin,
    TransactionalMixin,
    FrozenTransformsMixin,
    GPyTorchModel,
    GP,
    FantasizeMixin,
):
    r"""Streaming collapsed sparse variational GP (O-SGPR) with closed-form conditioning.

    Args:
        train_X: ``n x d`` initial inputs (``n`` may be 0).
        train_Y: ``n x 1`` initial targets.
        train_Yvar: Not supported (the noise level is learned); raises ``ValueError``
            if given, as BoTorch code may pass it.
        inducing_points: ``M x d`` initial inducing inputs (in the transformed input
            space). Default: ``num_inducing`` training inputs drawn at random (all of
            them if ``n <= num_inducing``), or the selector's choice.
        num_inducing: Size of the inducing set kept by the default update rule.
            Default: ``len(inducing_points)`` if given, else ``DEFAULT_NUM_INDUCING``.
            Ignored when ``inducing_selector`` is given.
        covar_module: Kernel. Default: BoTorch's ``SingleTaskGP`` kernel.
        likelihood: Gaussian likelihood (learned homoskedastic noise). Default:
            BoTorch's ``SingleTaskGP`` likelihood.
        inducing_selector: Optional :class:`~streamgp.inducing.InducingPointSelector`
            (e.g. ``OnlineInducingPointSelector`` for OIPS); it sees every batch of
            (transformed) inputs and its current set becomes the inducing set.
        new_inducing_fraction: Default update rule (Bui et al.): each batch, up to
            ``round(fraction * num_inducing)`` of its inputs replace randomly chosen
            old inducing points (more while the set is below ``num_inducing``).
            ``0`` keeps the inducing points fixed once the set is full.
        learn_inducing_points: Also optimise the new inducing inputs in the
            per-batch optimizer steps (not with a selector).
        steps_per_batch: Adam steps on the online bound before absorbing each batch
            (including the constructor's); 0 keeps the hyperparameters fixed.
        lr: Adam learning rate for those steps.
        jitter: Jitter on ``K_ZZ`` relative to its mean diagonal; raised 10x only if a
            Cholesky factorisation fails. Default: ``DEFAULT_JITTER[dtype]``.
        seed: Seed of the random choices of the default inducing-point rule.
        outcome_transform: Outcome transform, fitted on ``train_Y`` and then frozen.
            Default: ``Standardize(m=1)``, as ``SingleTaskGP`` (none when ``n = 0``);
            None for no transform.
        input_transform: Input transform, fitted on ``train_X`` and then frozen.
        mean_module: Prior mean of ``f`` (in the transformed spaces), learned with the
            other hyperparameters. Default (None): a learned ``ConstantMean``, as
            ``SingleTaskGP``; ``ZeroMean()`` for a zero mean. Any gpytorch ``Mean``
            that maps ``n x d`` inputs to ``n`` values (e.g. ``LinearMean``) is exact.

    Example:
        >>> X = torch.rand(100, 2, dtype=torch.float64)
        >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
        >>> model = OnlineSGPR(X, Y, num_inducing=32, steps_per_batch=5)
        >>> X_new = torch.rand(10, 2, dtype=torch.float64)
        >>> model = model.observe(X_new, torch.sin(6 * X_new).sum(-1, keepdim=True))
        >>> posterior = model.posterior(torch.rand(5, 2, dtype=torch.float64))
        >>> posterior.mean.shape, int(model.num_observed)
        (torch.Size([5, 1]), 110)
    """

    _num_outputs = 1
    #: What a failed update restores: the summary buffers (resized with the inducing
    #: set), the last batch and the conditioning it absorbed, the parameters (optimised
    #: in place), the inducing selector's state and the random stream of the rule.
    mutable_state = MutableState(
        attributes=(
            *_STATE_BUFFERS,
            "last_bound",
            "_last_batch",
            "_last_batch_hypers",
            "_refit_pending",
            "_correction",
            "_conditioning_log",
        ),
        modules=("",),
        generators=("_generator",),
        objects=("inducing_selector",),
    )
    #: Rebuilt from the summary buffers on demand, conditioning replayed (and absorbed
    #: by the next ``observe``). The summary is in buffers, which torch moves; the last
    #: batch and its bound follow them (:meth:`_apply_to_state`).
    cached_attributes = ("_posterior",)
    _posterior: SparsePosterior | None
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
        inducing_points: Tensor | None = None,
        num_inducing: int | None = None,
        inducing_selector: InducingPointSelector | None = None,
        new_inducing_fraction: float = 0.3,
        learn_inducing_points: bool = False,
        steps_per_batch: int = 0,
        lr: float = 0.01,
        jitter: float | None = None,
        seed: int = 0,
    ) -> None:
        check_no_known_noise(train_Yvar, "OnlineSGPR")
        check_train_data(train_X, train_Y)
        dim = train_X.shape[-1]
        if inducing_points is not None:
            check_inducing_points(inducing_points, train_X, dim)
        if num_inducing is not None and (not isinstance(num_inducing, int) or num_inducing < 1):
            raise ValueError(f"num_inducing must be a positive int, got {num_inducing!r}.")
        if inducing_selector is not None:
            if not isinstance(inducing_selector, InducingPointSelector):
                raise TypeError(
                    "inducing_selector must be a streamgp.inducing.InducingPointSelector, "
                    f"got {type(inducing_selector).__name__}."
                )
            if inducing_points is not None:
                raise ValueError("Pass either inducing_points or inducing_selector, not both.")
            if learn_inducing_points:
                raise ValueError(
                    "learn_inducing_points cannot be combined with inducing_selector (the "
                    "selector owns the inducing set)."
                )
        if not isinstance(new_inducing_fraction, (int, float)) or not (
            0.0 <= new_inducing_fraction <= 1.0
        ):
            raise ValueError(
                f"new_inducing_fraction must be in [0, 1], got {new_inducing_fraction!r}."
            )
        if not isinstance(steps_per_batch, int) or steps_per_batch < 0:
            raise ValueError(
                f"steps_per_batch must be a non-negative int, got {steps_per_batch!r}."
            )
        if not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"lr must be a positive number, got {lr!r}.")
        if jitter is not None and (not isinstance(jitter, (int, float)) or not jitter >= 0):
            raise ValueError(f"jitter must be a non-negative number or None, got {jitter!r}.")
        check_gaussian_likelihood(likelihood)
        check_kernel(covar_module)
        mean_module = _mean_module_or_default(mean_module, like=train_X)
        super().__init__()

        # Fit the transforms once on the initial data, then freeze them.
        transformed_X, train_Y, _ = fit_frozen_transforms(
            self, train_X, train_Y, input_transform, outcome_transform
        )

        self.mean_module = mean_module
        self.covar_module, self.likelihood = kernel_and_likelihood_or_defaults(
            covar_module, likelihood, like=train_X
        )

        self.inducing_selector = inducing_selector
        if num_inducing is None:
            num_inducing = DEFAULT_NUM_INDUCING if inducing_points is None else len(inducing_points)
        self.num_inducing_target = num_inducing
        self.new_inducing_fraction = float(new_inducing_fraction)
        self.learn_inducing_points = learn_inducing_points
        self.steps_per_batch = steps_per_batch
        self.lr = float(lr)
        self.jitter = DEFAULT_JITTER.get(train_X.dtype, 1e-6) if jitter is None else float(jitter)
        self._generator = torch.Generator().manual_seed(seed)

        for name, value in [
            ("inducing_points", train_X.new_zeros(0, dim)),
            ("pseudo_root", train_X.new_zeros(0, 0)),
            ("pseudo_eta", train_X.new_zeros(0)),
            ("pseudo_log_norm", train_X.new_zeros(())),
            ("num_observed", train_X.new_zeros(())),
        ]:
            self.register_buffer(name, value)
        self.register_load_state_dict_post_hook(invalidate_after_load)
        self._clear_caches()
        self._last_batch: _LastBatch | None = None
        self._last_batch_hypers: list[Tensor] | None = None
        self._refit_pending = False
        #: The online bound (approximate log evidence of all data) after the last batch.
        self.last_bound: Tensor | None = None

        y = train_Y.squeeze(-1)
        if inducing_points is not None:
            self._absorb(transformed_X, y, (inducing_points.detach().clone(), None))
        elif inducing_selector is not None or len(train_X) > 0:
            if inducing_selector is None:
                index = self._random_subset(len(train_X), min(len(train_X), num_inducing))
                first = (transformed_X[index].detach().clone(), None)
            else:
                first = (inducing_selector.update(transformed_X), None)
            self._absorb(transformed_X, y, first)

    # ------------------------------------------------------------------ state
    @property
    def pseudo_observations(self) -> PseudoObservations:
        r"""Summary of all data absorbed by ``observe`` (:mod:`streamgp.linalg.sparse_gp`)."""
        return PseudoObservations(
            points=self.inducing_points,
            root=self.pseudo_root,
            eta=self.pseudo_eta,
            log_norm=self.pseudo_log_norm,
        )

    def _set_pseudo_observations(self, factor: PseudoObservations) -> None:
        self.inducing_points = factor.points.detach()
        self.pseudo_root = factor.root.detach()
        self.pseudo_eta = factor.eta.detach()
        self.pseudo_log_norm = factor.log_norm.detach()

    @property
    def _prior_mean(self) -> Mean | None:
        r"""The prior mean for :mod:`streamgp.linalg.sparse_gp` (None for a zero mean)."""
        return None if isinstance(self.mean_module, ZeroMean) else self.mean_module

    @property
    def num_inducing(self) -> int:
        r"""Current number of inducing points ``M``."""
        return self.inducing_points.shape[0]

    @property
    def num_train(self) -> int:
        r"""Number of observations absorbed so far (including conditioning)."""
        extra = sum(entry[0].shape[-2] for entry in self._conditioning_log)
        return int(self.num_observed.item()) + extra

    @property
    def noise_variance(self) -> Tensor:
        r"""The homoskedastic noise variance (differentiable)."""
        noise = self.likelihood.noise.reshape(())
        if not noise > 0:
            raise ValueError(
                f"The likelihood's noise variance is {noise.item():.3g}, not positive; use an "
                "optimizer that respects the noise constraint (as observe's steps do) or a "
                "likelihood with a transformed noise constraint."
            )
        return noise

    def _caches_valid(self) -> bool:
        return self._posterior is not None and self._hyperparameters_unchanged()

    def sparse_posterior(self) -> SparsePosterior:
        r"""The collapsed ``q(u)`` of the data absorbed by ``observe`` (before conditioning).

        Rebuilt in ``O(M^3)`` when the hyperparameters changed since the last call;
        otherwise returned from the cache. Detached from the hyperparameters (as
        gpytorch's ``detach_test_caches``).
        """
        if not self._caches_valid():
            with torch.no_grad():
                self._posterior = sparse_posterior(
                    self.covar_module, self.pseudo_observations, self.jitter, self._prior_mean
                )
                self._snapshot_hyperparameters()
            # Replay conditioning (keeps gradients w.r.t. the conditioning inputs).
            self._correction = None
            for X_q, y_q, noise_q in self._conditioning_log:
                self._correction = self._condition_correction(X_q, y_q, noise_q)
        return self._posterior

    def _current_correction(self) -> LowRankCorrection:
        if self._correction is None:
            return LowRankCorrection.empty(self.num_inducing, self.pseudo_eta)
        return self._correction

    def _condition_correction(self, X_t: Tensor, y: Tensor, noise: Tensor) -> LowRankCorrection:
        posterior = self._posterior
        weights = projection_weights(self.covar_module, posterior, X_t)
        if self._prior_mean is not None:  # the whitened posterior is of residuals
            y = y - self._prior_mean(X_t)
        return self._current_correction().condition(posterior.whitened, weights, y, noise)

    # ------------------------------------------------------------ the bound
    def _random_subset(self, n: int, k: int) -> Tensor:
        r"""``k`` of ``range(n)``, drawn with the model's generator, in increasing order."""
        if k >= n:
            return torch.arange(n, device=self.inducing_points.device)
        index = torch.randperm(n, generator=self._generator)[:k].sort().values
        return index.to(self.inducing_points.device)

    def _next_inducing_points(self, X_t: Tensor) -> tuple[Tensor, Tensor]:
        r"""The inducing set for a new batch and its identity map to the current set."""
        old = self.inducing_points
        if self.inducing_selector is not None:
            new = self.inducing_selector.update(X_t).to(old)
            return new, match_points(new, old)
        q, m_old_now, target = X_t.shape[0], old.shape[0], self.num_inducing_target
        m_new = min(q, max(target - m_old_now, round(self.new_inducing_fraction * target)))
        m_keep = min(m_old_now, target - m_new)
        keep = self._random_subset(m_old_now, m_keep)
        take = self._random_subset(q, m_new)
        new = torch.cat([old[keep], X_t[take].detach()], dim=0)
        shared = torch.cat([keep, torch.full_like(take, -1)])
        return new, shared

    def _bound(
        self,
        X_t: Tensor,
        y: Tensor,
        inducing_points: Tensor,
        shared: Tensor | None,
        summary: PseudoObservations | None = None,
    ):
        r"""Online bound of a new (transformed) batch and the factor it would leave.

        ``summary`` is the data absorbed before the batch (default: all data so far).
        """
        return streaming_collapsed_bound(
            self.covar_module,
            self.noise_variance,
            X_t,
            y,
            inducing_points,
            self.pseudo_observations if summary is None else summary,
            shared=shared,
            relative_jitter=self.jitter,
            prior_mean=self._prior_mean,
        )

    def _loss(
        self,
        X_t: Tensor,
        y: Tensor,
        inducing_points: Tensor,
        shared: Tensor | None,
        summary: PseudoObservations | None = None,
    ):
        r"""Negative (online bound + log hyperprior), per observation seen."""
        bound, _ = self._bound(X_t, y, inducing_points, shared, summary)
        for _, module, prior, closure, _ in self.named_priors():
            bound = bound + prior.log_prob(closure(module)).sum()
        return -bound / (self.num_observed + X_t.shape[0]).clamp_min(1.0)

    def _optimize(self, X_t: Tensor, y: Tensor, inducing_points: Tensor, shared: Tensor) -> Tensor:
        r"""``steps_per_batch`` Adam steps on the online bound; returns the inducing points."""
        params = [p for p in self.parameters() if p.requires_grad]
        if self.learn_inducing_points:
            inducing_points = inducing_points.clone().requires_grad_(True)
            params.append(inducing_points)
        _, bounds = get_parameters_and_bounds(self)
        named = dict(self.named_parameters())
        optimizer = torch.optim.Adam(params, lr=self.lr)
        for _ in range(self.steps_per_batch):
            optimizer.zero_grad()
            self._loss(X_t, y, inducing_points, shared).backward()
            optimizer.step()
            # BoTorch's constraints are enforced by the optimizer, not a transform.
            with torch.no_grad():
                for name, (lower, upper) in bounds.items():
                    named[name].clamp_(
                        min=None if lower is None else lower, max=None if upper is None else upper
                    )
        return inducing_points.detach()

    def _absorb(
        self, X_t: Tensor, y: Tensor, inducing: tuple[Tensor, Tensor | None] | None = None
    ) -> None:
        r"""Move the inducing set, optionally optimise, and absorb ``(X_t, y)``.

        On any failure (e.g. a non-finite bound after optimisation) the model and its
        selector are restored to their previous state before the error propagates.
        """
        self._refresh_last_batch()
        summary = self.pseudo_observations
        with transaction(self):
            Z, shared = self._next_inducing_points(X_t) if inducing is None else inducing
            if self.steps_per_batch > 0:
                Z = self._optimize(X_t, y, Z, shared)
            with torch.no_grad():
                bound, factor = self._bound(X_t, y, Z, shared, summary)
            if not torch.isfinite(bound) or not torch.isfinite(factor.root).all():
                raise ValueError(
                    "The online bound is not finite after this batch; the kernel "
                    "hyperparameters may have diverged (lower lr) or K_ZZ is too "
                    "ill-conditioned (raise jitter)."
                )
            self._set_pseudo_observations(factor)
            self.num_observed = self.num_observed + X_t.shape[0]
            self.last_bound = bound.detach()
            self._last_batch = _LastBatch(X_t.detach(), y.detach(), Z, shared, summary)
            self._last_batch_hypers = parameter_snapshot(self._hyperparameters())
            self._refit_pending = False
            self._clear_caches()

    def _apply_to_state(self, fn) -> None:
        # Device/dtype moves: the last batch (what a refit re-absorbs), the hyperparameter
        # snapshot it was absorbed at and its bound follow the buffers.
        self._last_batch = apply_to_tensors(self._last_batch, fn)
        self._last_batch_hypers = apply_to_tensors(self._last_batch_hypers, fn)
        self.last_bound = apply_to_tensors(self.last_bound, fn)

    def _refresh_last_batch(self) -> None:
        r"""After a fit of :meth:`fit_objective`, re-absorb the last batch at the new values.

        The summary of the earlier data is fixed (Bui et al.'s ``q_old / p_old``), but the
        last batch is still held, so after ``fit_gpytorch_mll`` (which maximises its
        online bound) its pseudo-observations are recomputed at the fitted
        hyperparameters: the state ``observe`` leaves when its own optimizer steps find
        them. ``O(M^2 (q + M))``. Hyperparameters changed any other way act on the next
        batch only, as in Bui et al.
        """
        last = self._last_batch
        if last is None or not self._refit_pending:
            return
        self._refit_pending = False
        if parameters_unchanged(self._hyperparameters(), self._last_batch_hypers):
            return
        with torch.no_grad():
            bound, factor = self._last_batch_bound()
        if not torch.isfinite(bound) or not torch.isfinite(factor.root).all():
            raise ValueError(
                "The online bound of the last batch is not finite at the current "
                "hyperparameters; restore them (e.g. load_state_dict) or raise jitter."
            )
        self._set_pseudo_observations(factor)
        self.last_bound = bound
        self._last_batch_hypers = parameter_snapshot(self._hyperparameters())
        self._invalidate()

    def _last_batch_bound(self) -> tuple[Tensor, PseudoObservations]:
        last = self._last_batch
        return self._bound(last.X, last.y, last.inducing_points, last.shared, last.summary)

    def fit_objective(self) -> tuple[Tensor, Tensor]:
        r"""The online bound of all data absorbed by ``observe``, and their number.

        The collapsed bound of the last batch given the summary of everything before it
        (Bui et al. 2017, eq. 11; the Titsias SGPR bound when the model was built from one
        batch) -- what ``observe``'s own optimizer steps maximise. ``fit_gpytorch_mll``
        maximises it for any marginal likelihood wrapping the model; the last batch is
        then re-absorbed at the fitted hyperparameters. After a checkpoint restore the
        last batch is not held and the bound has no new batch: the approximate evidence
        of the summarised data, in which the noise variance has no gradient.
        """
        last = self._last_batch
        self._refit_pending = last is not None
        if last is None:
            empty = self.inducing_points[:0]
            bound, _ = self._bound(empty, self.pseudo_eta[:0], self.inducing_points, None)
        else:
            bound, _ = self._last_batch_bound()
        return bound, self.num_observed

    def train(self, mode: bool = True) -> OnlineSGPR:
        # fit_gpytorch_mll ends with ``mll.eval()``: re-absorb at the fitted values.
        if not mode:
            self._refresh_last_batch()
        return super().train(mode)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._refresh_last_batch()
        return super().state_dict(*args, **kwargs)

    # ------------------------------------------------------------ BoTorch API
    def is_data_key(self, key: str) -> bool:
        return key in _STATE_BUFFERS or super().is_data_key(key)

    def _checkpoint_options(self) -> dict[str, Any]:
        # The inducing set's target size decides every later update's set (the set
        # itself, which may be smaller, is state and taken over).
        return {**super()._checkpoint_options(), "num_inducing": self.num_inducing_target}

    def _stream_state(self) -> dict[str, Any]:
        r"""The streaming state outside the buffers, for :meth:`checkpoint`.

        The last batch and the summary before it (what a refit needs), the last bound and
        the random generator of the inducing-point rule (tensors and numbers only:
        ``torch.load(weights_only=True)`` reads them).
        """
        last = self._last_batch
        return {
            "last_batch": None
            if last is None
            else {**last._asdict(), "summary": dict(vars(last.summary))},
            "last_batch_hypers": self._last_batch_hypers,
            "refit_pending": self._refit_pending,
            "last_bound": self.last_bound,
            "generator": self._generator.get_state(),
        }

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        last = state["last_batch"]
        if last is not None:
            summary = PseudoObservations(**last["summary"])
            last = _LastBatch(**{**last, "summary": summary})
        self._last_batch = last
        self._last_batch_hypers = state["last_batch_hypers"]
        self._refit_pending = bool(state["refit_pending"])
        self.last_bound = state["last_bound"]
        self._generator.set_state(state["generator"])

    def _after_warm_start(self) -> None:
        # The last batch is absorbed at the loaded hyperparameters, as if the model had
        # had them when it absorbed it (a model built from one batch then equals a fresh
        # one built with them).
        self._refit_pending = True
        self._refresh_last_batch()

    def _prepare_state_load(self, state_dict: dict[str, Any]) -> None:
        # The inducing set may have a different size than this model's; the last batch
        # is not part of the state (see ``fit_objective``).
        for name in _STATE_BUFFERS:
            if name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[name]))
        self._clear_caches()

    def _transform_new_data(
        self, X: Tensor, Y: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        r"""Pass new data through the frozen input and outcome transforms."""
        X_t, Y_t, _ = transform_new_data(self, X, Y)
        return X_t, Y_t

    def _check_inputs(self, X: Tensor, name: str) -> None:
        check_tensor(
            X, name, like=self.pseudo_eta, min_dim=2, last_dim=self.inducing_points.shape[-1]
        )

    def _latent_forward(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of the latent function at already-transformed inputs ``X`` (what
        ``model(X)`` returns in eval mode; see ``StreamingModelMixin.forward``)."""
        posterior = self.sparse_posterior()
        mean, covar = predict(
            self.covar_module, posterior, self._current_correction(), X, self._prior_mean
        )
        covar = covar.expand(*mean.shape, mean.shape[-1])
        return MultivariateNormal(mean, DenseLinearOperator(covar))

    # -------------------------------------------------------------- updates
    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> OnlineSGPR:
        r"""Absorb a batch in place: move the inducing set, optimise, update ``q(u)``.

        Cost ``O(M^2 (q + M) + M^3)`` per batch (times ``steps_per_batch + 1``),
        independent of the number of observations seen before. Data absorbed by
        ``condition_on_observations`` (unbatched) are absorbed together with this batch.

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (original space).
            Yvar: Must be None: the model learns one homoskedastic noise level (the
                argument exists for the common streaming-model signature).

        Returns:
            The model itself. On invalid input, raises and leaves the model unchanged.
        """
        check_no_known_noise(Yvar, "OnlineSGPR", argument="Yvar")
        self._check_inputs(X, "X")
        if X.dim() != 2:
            raise ValueError(f"X must have shape q x d, got {tuple(X.shape)}.")
        check_targets(check_tensor(Y, "Y", like=self.pseudo_eta, min_dim=2), "Y", len(X))
        if self._conditioning_log and len(self.batch_shape) > 0:
            raise RuntimeError(
                "observe is not available on a model conditioned on batched (fantasy) "
                "observations; observe on the parent model instead."
            )
        X_t, Y_t = self._transform_new_data(X, Y)
        y = Y_t.squeeze(-1)
        if self._conditioning_log:
            X_t = torch.cat([entry[0].detach() for entry in self._conditioning_log] + [X_t])
            y = torch.cat([entry[1].detach() for entry in self._conditioning_log] + [y])
        if len(X_t) == 0:
            return self
        self._absorb(X_t.detach(), y.detach())
        return self

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> OnlineSGPR:
        r"""A new model whose ``q(u)`` is conditioned on ``(X, Y)`` in closed form.

        Online variational conditioning (Maddox et al., 2021): ``q(u)`` is updated by
        the exact Gaussian rule for ``y = K_XZ K_ZZ^{-1} u + eps`` (the collapsed
        optimum with fixed inducing points and hyperparameters). The new model is a
        rank-``q`` view of this one (no ``M x M`` copies), batched over candidate sets
        and fantasy samples (which share the covariance update), and differentiable
        in ``X``. It shares the kernel, likelihood and transforms with this model.

        Args:
            X: ``batch_shape x q x d`` inputs (original space).
            Y: ``sample_shape x batch_shape x q x 1`` targets (original space).
            noise: Optional ``batch_shape x q x 1`` noise variances in the
                outcome-transformed space; default: the model's noise level.

        Returns:
            An ``OnlineSGPR`` with batch shape ``sample_shape + broadcast(batch, model.batch)``.
        """
        self._check_inputs(X, "X")
        check_tensor(Y, "Y", like=self.pseudo_eta, min_dim=2, last_dim=1)
        if Y.shape[-2] != X.shape[-2]:
            raise ValueError(f"Y has {Y.shape[-2]} points per batch but X has {X.shape[-2]}.")
        if noise is not None:
            check_tensor(noise, "noise", like=self.pseudo_eta, min_dim=2, last_dim=1)
            check_positive(noise, "noise")
        if self.num_inducing == 0:
            raise ValueError(
                "The model has no inducing points yet, so q(u) cannot be conditioned; "
                "observe some data first (or pass inducing_points)."
            )
        X_t, Y_t = self._transform_new_data(X, Y)
        self.sparse_posterior()
        y = Y_t.squeeze(-1)
        noise_q = conditioning_noise(noise, self, X)
        correction = self._condition_correction(X_t, y, noise_q)
        new = self._view()
        new._correction = correction
        new._conditioning_log = [*self._conditioning_log, (X_t, y, noise_q)]
        return new

    def _view(self) -> OnlineSGPR:
        r"""A new model object sharing this one's tensors and hyperparameter modules.

        ``observe`` replaces state tensors rather than writing into them, so a view
        is unaffected by later updates of its parent.
        """
        new = shallow_view(self)
        # Own random stream and selector (a shallow copy is an independent fork), so
        # that ``observe`` on the view never moves the parent's inducing set.
        new._generator = torch.Generator().set_state(self._generator.get_state())
        new.inducing_selector = copy.copy(self.inducing_selector)
        return new
