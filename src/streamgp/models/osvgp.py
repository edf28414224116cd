r"""Online (streaming) sparse variational GP, as a BoTorch model.

O-SVGP (Bui, Nguyen & Turner, "Streaming Sparse Gaussian Process Approximations",
NeurIPS 2017) keeps a Gaussian variational posterior ``q(u) = N(m, S)`` over function
values ``u = f(Z)`` at ``M`` inducing points. When a batch ``(X, y)`` arrives, the old
posterior ``q_old(a)`` at the old inducing points ``a`` and the old hyperparameters
``theta_old`` are frozen, and the new ``q(b)``, inducing points ``b`` and
hyperparameters maximise the streaming bound, here with the generalized-VI weight
``beta`` on the KL terms (Stanton et al., "Kernel Interpolation for Scalable Online
Gaussian Processes", AISTATS 2021, appendix B, Eq. A.8):

.. math::

    \mathcal{L} = \mathbb{E}_{q(f)}[\log p(y \mid f)]
        - \beta \big[ \mathrm{KL}(q(b) \| p(b \mid \theta))
        + \mathrm{KL}(q(a) \| q_{old}(a)) - \mathrm{KL}(q(a) \| p(a \mid \theta_{old})) \big]

with ``q(a) = \int p(a | b, theta) q(b) db``. ``beta = 1`` is Bui et al.'s bound;
``beta = 1e-3`` (the default, as in Stanton et al.) lets one optimizer step per batch
move the posterior where ``q`` is stepped (a Bernoulli likelihood). With a Gaussian
likelihood ``q(b)`` has a closed-form optimum (Bui et al., section 3.1): every batch
sets it, and the optimizer steps the hyperparameters on Bui et al.'s collapsed bound,
so a small batch cannot knock a converged posterior off its optimum. Each batch costs
``O(B M^2 + M^3)`` per step, whatever the number of points seen so far.
``fit_gpytorch_mll`` maximises Bui et al.'s bound (``beta = 1``) to convergence: with a
Gaussian likelihood ``q(b)`` is then held at its closed-form optimum, and L-BFGS-B fits
the hyperparameters to the collapsed bound.
The variational posterior uses gpytorch's whitened ``VariationalStrategy`` with a
``CholeskyVariationalDistribution``; Gaussian and Bernoulli (probit, quadrature)
likelihoods are supported.

Conditioning (Gaussian likelihood only): :meth:`OnlineSVGP.condition_on_observations`
is online variational conditioning (Maddox, Stanton & Wilson, "Conditioning Sparse
Variational Gaussian Processes for Online Decision-Making", NeurIPS 2021): the
conditioned model predicts with the exact Gaussian update of the joint variational
predictive ``q(f_new, f_*)`` on the new observations, which is what OVC's pseudo-point
exact GP computes. It is evaluated from the joint (see
:func:`streamgp.linalg.variational.condition_on_noisy_observations`) rather than
through ``gpytorch``'s ``ApproximateGP.get_fantasy_model``: with gpytorch 1.15.2 the
latter's pseudo-point GP did not reproduce the SVGP predictive (mean errors of order
one on a well-conditioned 1-D problem), and the pseudo-noise it forms is unbounded
where ``q(u)`` equals the prior. The conditioned model is differentiable in the
conditioning inputs, so BoTorch's ``fantasize``, ``qNegIntegratedPosteriorVariance``
and ``qKnowledgeGradient`` work with batched candidates and many fantasies.

Transforms are fitted on the constructor's data and then frozen (see
:mod:`streamgp.models.utils.transforms`); inducing points live in the transformed
input space.

References:

.. [Bui2017] T. D. Bui, C. V. Nguyen, R. E. Turner. Streaming Sparse Gaussian Process
    Approximations. Advances in Neural Information Processing Systems 30, 2017.
.. [Stanton2021] S. Stanton, W. J. Maddox, I. Delbridge, A. G. Wilson. Kernel
    Interpolation for Scalable Online Gaussian Processes. International Conference on
    Artificial Intelligence and Statistics, 2021.
.. [Maddox2021] W. J. Maddox, S. Stanton, A. G. Wilson. Conditioning Sparse
    Variational Gaussian Processes for Online Decision-making. Advances in Neural
    Information Processing Systems 34, 2021.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.models.utils.inducing_point_allocators import GreedyVarianceReduction
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import (
    BernoulliLikelihood,
    FixedNoiseGaussianLikelihood,
    GaussianLikelihood,
    Likelihood,
)
from gpytorch.means import Mean
from gpytorch.models import GP, ApproximateGP
from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy
from linear_operator.operators import DenseLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from streamgp.linalg.variational import (
    optimal_whitened_posterior,
    streaming_kl_correction,
    whiten_gaussian,
)
from streamgp.mlls.objective import per_datum_objective
from streamgp.models.base import StreamingModelMixin
from streamgp.models.utils import (
    FrozenTransformsMixin,
    JointConditioningMixin,
    MutableState,
    apply_to_tensors,
    check_latent_only,
    condition_joint,
    conditioning_batch_shape,
    fit_frozen_transforms,
    parameter_snapshot,
    parameters_unchanged,
    transform_new_data,
)
from streamgp.models.utils.defaults import (
    DEFAULT,
    _DefaultType,
    in_target_units,
    mean_module_or_default,
)
from streamgp.models.utils.optimization import PersistentOptimizerMixin
from streamgp.utils.validation import (
    check_bool,
    check_count,
    check_inducing_points,
    check_no_known_noise,
    check_targets,
    check_tensor,
)

#: The ``state_dict`` key of the inducing points.
_INDUCING_KEY = "model.variational_strategy.inducing_points"


class _SparseVariationalGP(ApproximateGP):
    r"""gpytorch SVGP with a whitened strategy whose inducing set can be replaced."""

    def __init__(
        self,
        inducing_points: Tensor,
        mean_module: Mean,
        covar_module: Kernel,
        learn_inducing_locations: bool,
        jitter: float | None,
    ) -> None:
        super().__init__(self._strategy(inducing_points, learn_inducing_locations, jitter))
        self.mean_module = mean_module
        self.covar_module = covar_module
        self._learn_inducing_locations = learn_inducing_locations
        self._jitter = jitter
        m = inducing_points.shape[-2]
        eye = torch.eye(m, dtype=inducing_points.dtype, device=inducing_points.device)
        self.set_variational_parameters(torch.zeros_like(eye[0]), eye)

    def _strategy(
        self, inducing_points: Tensor, learn: bool, jitter: float | None
    ) -> VariationalStrategy:
        tkwargs = {"dtype": inducing_points.dtype, "device": inducing_points.device}
        distribution = CholeskyVariationalDistribution(inducing_points.shape[-2]).to(**tkwargs)
        strategy = VariationalStrategy(
            self, inducing_points, distribution, learn_inducing_locations=learn, jitter_val=jitter
        )
        # gpytorch makes its flags (``variational_params_initialized``, ``updated_strategy``)
        # on the CPU; they go where the inducing points are.
        return strategy.to(inducing_points.device)

    def set_variational_parameters(self, whitened_mean: Tensor, whitened_root: Tensor) -> None:
        r"""Set ``q(v) = N(whitened_mean, R R^T)`` (and stop gpytorch re-initialising it)."""
        distribution = self.variational_strategy._variational_distribution
        with torch.no_grad():
            distribution.variational_mean.copy_(whitened_mean)
            distribution.chol_variational_covar.copy_(whitened_root)
        self.variational_strategy.variational_params_initialized.fill_(1)
        self.variational_strategy._clear_cache()

    def replace_inducing_points(self, inducing_points: Tensor) -> None:
        r"""Move to a new inducing set, warm-starting ``q`` with the current ``q(f(Z_new))``."""
        with torch.no_grad():
            was_training = self.training
            self.eval()
            self.variational_strategy._clear_cache()
            current = self(inducing_points)
            mean, covar = current.mean, current.covariance_matrix
            prior_mean = self.mean_module(inducing_points)
            jitter = self.variational_strategy.jitter_val
            K = self.covar_module(inducing_points).to_dense()
            L = psd_safe_cholesky(K + jitter * torch.eye(len(K), dtype=K.dtype, device=K.device))
            whitened_mean, whitened_root = whiten_gaussian(mean, covar, prior_mean, L)
        self.variational_strategy = self._strategy(
            inducing_points, self._learn_inducing_locations, self._jitter
        )
        self.set_variational_parameters(whitened_mean, whitened_root)
        self.train(was_training)

    def forward(self, X: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(X), self.covar_module(X))


@dataclass(frozen=True)
class FrozenPosterior:
    r"""The old posterior ``q_old(a)`` and prior ``p(a | theta_old)`` at old inducing points.

    Attributes:
        inducing_points: ``a``, the old inducing points (transformed input space).
        mean: Mean of ``q_old(a)``.
        root: Lower-triangular root of the covariance of ``q_old(a)``.
        prior_mean: Prior mean at ``a`` under the old hyperparameters.
        prior_root: Cholesky factor of ``K_aa`` (plus jitter) under the old hyperparameters.
    """

    inducing_points: Tensor
    mean: Tensor
    root: Tensor
    prior_mean: Tensor
    prior_root: Tensor


class OnlineSVGP(
    JointConditioningMixin,
    StreamingModelMixin,
    PersistentOptimizerMixin,
    FrozenTransformsMixin,
    GPyTorchModel,
    GP,
    FantasizeMixin,
):
    r"""Streaming sparse variational GP (Bui et al. 2017) with generalized-VI weight ``beta``.

    Args:
        train_X: ``n x d`` initial inputs (``n`` may be 0 if ``inducing_points`` or
            ``inducing_selector`` provide the inducing set).
        train_Y: ``n x 1`` initial targets (``{0, 1}`` labels for a Bernoulli likelihood).
        train_Yvar: Not supported (the noise level is learned); raises ``ValueError``
            if given, as BoTorch code may pass it.
        inducing_points: ``M x d`` initial inducing points in the transformed input
            space. Default: ``num_inducing`` points chosen from the (transformed)
            ``train_X`` by greedy variance reduction (BoTorch's allocator).
        num_inducing: Number of inducing points when they are chosen from ``train_X``
            (all of ``train_X`` if it has fewer points).
        covar_module: Kernel. Default: ``ScaleKernel(RBFKernel(ard_num_dims=d))`` with
            gpytorch's softplus-constrained parameters, which plain gradient steps
            cannot push out of their domain.
        mean_module: Prior mean. Default: a ``ConstantMean()`` learned with the other
            hyperparameters, as in ``SingleTaskGP``.
        likelihood: ``GaussianLikelihood`` (default) or ``BernoulliLikelihood``.
        beta: Weight of the KL terms in the steps of :meth:`observe` and :meth:`refine`
            where ``q`` is stepped: a Bernoulli likelihood, or a Gaussian one whose bound
            has no maximiser in ``q``. A Gaussian model otherwise holds ``q`` at the
            optimum of Bui et al.'s bound (``beta = 1``, which ``fit_gpytorch_mll``
            maximises) and steps on that bound.
        hold_variational_optimum: With a Gaussian likelihood, hold ``q`` at its
            closed-form optimum in :meth:`observe` and :meth:`refine` (default). False:
            the first-order steps on the ``beta``-weighted objective of the WISKI paper's
            O-SVGP baseline (its streaming protocol uses them), which can knock a fitted
            ``q`` off its optimum.
        num_steps: Optimizer steps per :meth:`observe` call.
        num_init_steps: Optimizer steps on the constructor's data.
        lr: Learning rate of the default Adam optimizer.
        learn_inducing_points: Whether the inducing points are optimised. Default:
            True, unless an ``inducing_selector`` chooses them.
        inducing_selector: Optional object with ``update(X) -> Tensor`` returning the
            current inducing points (``M' x d``, transformed space) after seeing the
            transformed inputs ``X`` in order, e.g.
            ``streamgp.inducing.OnlineInducingPointSelector``. When the returned set
            changes, ``q`` is warm-started with the current posterior at the new points.
        optimizer_cls: ``torch.optim.Optimizer`` class; it is stepped with a closure,
            so ``torch.optim.LBFGS`` works too. It is rebuilt when the parameter set
            changes (e.g. a new inducing set).
        optimizer_kwargs: Keyword arguments of ``optimizer_cls`` (default ``{"lr": lr}``).
        keep_optimizer_state: Keep the optimizer and its state (e.g. Adam's moment
            estimates) across batches. Set False for quasi-Newton optimizers such as
            LBFGS, whose curvature history belongs to one batch's objective.
        jitter: Diagonal jitter of the inducing covariance. Default: gpytorch's
            ``variational_cholesky_jitter`` for the dtype.
        input_transform: Input transform, fitted on ``train_X`` and then frozen.
        outcome_transform: Outcome transform, fitted on ``train_Y`` and then frozen.
            Default: ``Standardize(m=1)``, as in ``SingleTaskGP`` (no transform when
            ``train_X`` is empty); None for no transform. With a
            ``BernoulliLikelihood`` the default is no transform and any other raises.

    Example:
        >>> X = torch.rand(100, 1, dtype=torch.float64)
        >>> Y = torch.sin(6 * X) + 0.1 * torch.randn_like(X)
        >>> model = OnlineSVGP(X, Y, num_inducing=16, num_steps=10, num_init_steps=50)
        >>> X_new = torch.rand(20, 1, dtype=torch.float64)
        >>> model = model.observe(X_new, torch.sin(6 * X_new))  # num_steps=10 steps
        >>> model = model.observe(X_new, torch.sin(6 * X_new), num_steps=2)
        >>> posterior = model.posterior(torch.rand(5, 1, dtype=torch.float64))
        >>> posterior.mean.shape, int(model.num_observed)
        (torch.Size([5, 1]), 140)
    """

    _num_outputs = 1
    #: The variational posterior summarises the data; kernel, mean and likelihood
    #: parameters are the hyperparameters a warm start loads.
    data_state_prefixes = (
        "model.variational_strategy.",
        "input_transform.",
        "outcome_transform.",
    )
    #: What a failed update restores (``O(M^2)`` copies): the variational strategy
    #: (replaced with a new inducing set), the parameters and the streaming state.
    mutable_state = MutableState(
        attributes=("model.variational_strategy", "frozen_posterior", "num_observed", "last_batch"),
        modules=("model", "likelihood"),
        objects=("inducing_selector",),
    )

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        likelihood: Likelihood | None = None,
        covar_module: Kernel | None = None,
        outcome_transform: OutcomeTransform | _DefaultType | None = DEFAULT,
        input_transform: InputTransform | None = None,
        *,
        mean_module: Mean | None = None,
        inducing_points: Tensor | None = None,
        num_inducing: int = 64,
        beta: float = 1e-3,
        hold_variational_optimum: bool = True,
        num_steps: int = 1,
        num_init_steps: int = 200,
        lr: float = 5e-3,
        learn_inducing_points: bool | None = None,
        inducing_selector: Any | None = None,
        optimizer_cls: type[torch.optim.Optimizer] = torch.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
        keep_optimizer_state: bool = True,
        jitter: float | None = None,
    ) -> None:
        check_no_known_noise(train_Yvar, "OnlineSVGP")
        # ---- validate everything before building anything
        check_bool(hold_variational_optimum, "hold_variational_optimum")
        check_tensor(train_X, "train_X", min_dim=2)
        if train_X.dim() != 2:
            raise ValueError(f"train_X must have shape n x d, got {tuple(train_X.shape)}.")
        dim = train_X.shape[-1]
        check_targets(
            check_tensor(train_Y, "train_Y", like=train_X, min_dim=2), "train_Y", len(train_X)
        )
        # The modules built here start in the targets' units without a transform.
        defaults = {"mean_module": mean_module is None, "covar_module": covar_module is None}
        defaults["likelihood"] = likelihood is None
        if likelihood is None:
            likelihood = GaussianLikelihood()
        _check_likelihood(likelihood)
        if isinstance(likelihood, BernoulliLikelihood):
            _check_binary(train_Y, "train_Y")
            if outcome_transform is not None and not isinstance(outcome_transform, _DefaultType):
                raise ValueError(
                    "outcome_transform must be None (or left at its default) with a "
                    "BernoulliLikelihood: {0, 1} labels are not transformed."
                )
            outcome_transform = None  # the default (Standardize) is for regression only
        for name, value in [("beta", beta), ("lr", lr)]:
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}.")
        for name, value in [
            ("num_steps", num_steps),
            ("num_init_steps", num_init_steps),
            ("num_inducing", num_inducing),
        ]:
            check_count(value, name)
        if inducing_selector is not None:
            if not callable(getattr(inducing_selector, "update", None)):
                raise TypeError("inducing_selector must have an update(X) -> Tensor method.")
            if inducing_points is not None:
                raise ValueError("Pass either inducing_points or inducing_selector, not both.")
            if learn_inducing_points:
                raise ValueError(
                    "learn_inducing_points must be False/None with an inducing_selector "
                    "(the selector owns the inducing locations)."
                )
            learn_inducing_points = False
        elif learn_inducing_points is None:
            learn_inducing_points = True
        if inducing_points is not None:
            check_inducing_points(inducing_points, train_X, dim)
        elif inducing_selector is None and (num_inducing < 1 or len(train_X) == 0):
            raise ValueError(
                f"Cannot choose num_inducing={num_inducing} inducing points from "
                f"{len(train_X)} training points (train_X); pass inducing_points, an "
                "inducing_selector, or training points (and num_inducing >= 1)."
            )

        super().__init__()
        tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
        train_X_t, train_Y_t, _ = fit_frozen_transforms(
            self, train_X, train_Y, input_transform, outcome_transform
        )
        if covar_module is None:
            covar_module = ScaleKernel(RBFKernel(ard_num_dims=dim))
        covar_module = covar_module.to(**tkwargs)
        mean_module = mean_module_or_default(mean_module, train_X)
        self.inducing_selector = inducing_selector
        if inducing_selector is not None:
            inducing_points = self._select_inducing(train_X_t, dim, tkwargs)
        elif inducing_points is None:
            with torch.no_grad():
                # Fewer training points than num_inducing (e.g. Ax's first model after
                # five initial trials): start with all of them, as BoTorch's SVGP does.
                inducing_points = GreedyVarianceReduction().allocate_inducing_points(
                    train_X_t, covar_module, min(num_inducing, len(train_X_t)), torch.Size([])
                )
        self.model = _SparseVariationalGP(
            inducing_points.detach().clone().to(**tkwargs),
            mean_module,
            covar_module,
            learn_inducing_points,
            jitter,
        )
        self.likelihood = likelihood.to(**tkwargs)
        if getattr(self, "outcome_transform", None) is None and self.is_gaussian:
            modules = {"mean_module": mean_module, "covar_module": covar_module}
            modules["likelihood"] = self.likelihood
            in_target_units(train_Y_t, **{k: v for k, v in modules.items() if defaults[k]})
        self.beta = float(beta)
        self.hold_variational_optimum = hold_variational_optimum
        self.num_steps = num_steps
        self.num_init_steps = num_init_steps
        self._init_optimizer(optimizer_cls, optimizer_kwargs, lr, keep_optimizer_state)
        self.frozen_posterior: FrozenPosterior | None = None
        self.num_observed = 0
        #: The last absorbed batch (transformed), whose objective :meth:`refine` optimises.
        self.last_batch: tuple[Tensor, Tensor] | None = None
        self._conditioning: tuple[Tensor, Tensor, Tensor] | None = None
        self._cache_snapshot: list[Tensor] | None = None
        if len(train_X):
            self._absorb(train_X_t, train_Y_t.squeeze(-1), num_init_steps, select=False)
        self.eval()

    # ------------------------------------------------------------------ helpers
    @property
    def is_gaussian(self) -> bool:
        return isinstance(self.likelihood, GaussianLikelihood)

    @property
    def inducing_points(self) -> Tensor:
        r"""The current inducing points (transformed input space)."""
        return self.model.variational_strategy.inducing_points

    @property
    def covar_module(self) -> Kernel:
        return self.model.covar_module

    @property
    def mean_module(self) -> Mean:
        return self.model.mean_module

    @property
    def num_outputs(self) -> int:
        return self._num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        return conditioning_batch_shape(self._conditioning)

    def _select_inducing(self, X_t: Tensor, dim: int, tkwargs: dict) -> Tensor:
        Z = self.inducing_selector.update(X_t)
        if not isinstance(Z, Tensor) or Z.dim() != 2 or Z.shape[-1] != dim or len(Z) == 0:
            raise ValueError(
                "inducing_selector.update must return an M x d tensor with M >= 1, got "
                f"{getattr(Z, 'shape', type(Z).__name__)}."
            )
        check_tensor(Z.to(**tkwargs), "inducing points from inducing_selector")
        return Z.detach().to(**tkwargs)

    def _check_inputs(self, X: Tensor, name: str) -> None:
        check_tensor(
            X, name, like=self.inducing_points, min_dim=2, last_dim=self.inducing_points.shape[-1]
        )

    def _trainable_parameters(self) -> list[Tensor]:
        modules = [self.model, self.likelihood]
        return [p for module in modules for p in module.parameters() if p.requires_grad]

    def _freeze_posterior(self) -> FrozenPosterior:
        r"""Snapshot ``q_old(a)`` and ``p(a | theta_old)`` at the current inducing points.

        ``q_old(a)`` is the variational predictive at ``a`` computed exactly as
        :meth:`streaming_loss` computes ``q(a)`` (same jitter), so that at the start of a
        batch ``q(a) = q_old(a)`` holds to round-off and the correction term vanishes.
        A near-singular ``q_old`` (tiny KL weight ``beta``) would otherwise turn the
        jitter-sized mismatch into huge ``tr(Sigma_old^-1 Sigma)`` terms.
        """
        with torch.no_grad():
            strategy = self.model.variational_strategy
            a = strategy.inducing_points.detach().clone()
            was_training = self.model.training
            self.model.eval()
            strategy._clear_cache()
            q_a = self.model(a)
            old_mean, old_covar = q_a.mean.clone(), q_a.covariance_matrix.clone()
            strategy._clear_cache()
            self.model.train(was_training)
            # Clones: mean modules may return views of parameters the optimizer updates.
            prior_mean = self.model.mean_module(a).clone()
            K = self.model.covar_module(a).to_dense()
            eye = torch.eye(len(a), dtype=a.dtype, device=a.device)
            return FrozenPosterior(
                inducing_points=a,
                mean=old_mean,
                root=psd_safe_cholesky(old_covar),
                prior_mean=prior_mean,
                prior_root=psd_safe_cholesky(K + strategy.jitter_val * eye),
            )

    def streaming_loss(self, X: Tensor, y: Tensor, beta: float | None = None) -> Tensor:
        r"""Negative streaming objective (Eq. A.8) on a transformed batch ``(X, y)``.

        Uses the current frozen old posterior (none before the first batch, where the
        objective is the beta-weighted SVGP ELBO of that batch). ``beta``: the weight
        of the KL terms (default: ``self.beta``, that of the per-batch steps).
        """
        q_f = self.model(X)
        expected_log_lik = self.likelihood.expected_log_prob(y, q_f).sum()
        kl = self.model.variational_strategy.kl_divergence()
        old = self.frozen_posterior
        if old is not None:
            q_a = self.model(old.inducing_points, diag=False)
            kl = kl + streaming_kl_correction(
                q_a.mean,
                q_a.covariance_matrix,
                old.mean,
                old.root,
                old.prior_mean,
                old.prior_root,
            )
        return -expected_log_lik + (self.beta if beta is None else beta) * kl

    def _absorb(self, X_t: Tensor, y: Tensor, num_steps: int, select: bool = True) -> None:
        r"""One streaming update on a transformed, validated batch.

        ``select=False`` skips the inducing selector (it already saw the constructor's data).
        """
        self.frozen_posterior = self._freeze_posterior() if self.num_observed > 0 else None
        if self.inducing_selector is not None and select:
            Z = self._select_inducing(
                X_t, X_t.shape[-1], {"dtype": X_t.dtype, "device": X_t.device}
            )
            current = self.inducing_points
            if Z.shape != current.shape or not torch.equal(Z, current):
                self.model.replace_inducing_points(Z)
        self._optimize(X_t, y, num_steps)
        self.num_observed += len(y)
        self.last_batch = (X_t, y)

    def _optimize(self, X_t: Tensor, y: Tensor, num_steps: int) -> None:
        r"""``num_steps`` optimizer steps on the streaming objective of ``(X_t, y)``.

        With a Gaussian likelihood ``q`` is held at its closed-form optimum (Bui et al.'s
        collapsed bound, ``beta = 1``): it is set before every evaluation and after the
        last step, and the optimizer steps the hyperparameters (and learned inducing
        points) only, on the bound's gradient there. First-order steps on ``q`` itself
        are what wrecked a converged model: Adam moves every coordinate by about ``lr``
        however small its gradient, and after a fit ``q`` is pinned down by the data (one
        step on three new points took the test RMSE of a 2-D toy from 0.76 to 1.3).
        Where the bound has no maximiser in ``q`` (an old posterior wider than its prior,
        e.g. from a first-order stream), the steps fall back to the ``beta``-weighted
        objective with ``q`` stepped too, and warn.
        """
        holds_q = self.is_gaussian and self.hold_variational_optimum
        collapsed = holds_q and self._try_set_optimal_q(X_t, y)
        if holds_q and not collapsed:
            warnings.warn(
                "Bui et al.'s bound has no maximiser in q(u) for this batch (the frozen old "
                "posterior is wider than its prior in some direction); taking first-order "
                "steps on the beta-weighted objective instead.",
                RuntimeWarning,
                stacklevel=4,
            )
        held = list(self.model.variational_strategy._variational_distribution.parameters())
        optimizer = self._get_optimizer()
        self.model.train()
        self.likelihood.train()
        try:
            if optimizer is not None:

                def closure() -> Tensor:
                    optimizer.zero_grad()
                    if collapsed:
                        self._set_optimal_q(X_t, y)
                    loss = self.streaming_loss(X_t, y, beta=1.0 if collapsed else None)
                    loss.backward()
                    if collapsed:  # q is not stepped: optimizers skip gradient-less tensors
                        for p in held:
                            p.grad = None
                    return loss

                for _ in range(num_steps):
                    optimizer.step(closure)
            if collapsed and all(torch.isfinite(p).all() for p in self._trainable_parameters()):
                self._set_optimal_q(X_t, y)  # (non-finite steps: _guarded restores)
        finally:
            self.model.eval()
            self.likelihood.eval()
            self.model.variational_strategy._clear_cache()
            self._cache_snapshot = None

    def _refresh_caches(self) -> None:
        r"""Drop gpytorch's eval-mode caches if any parameter changed since they were built."""
        current = list(self.model.parameters())
        if not parameters_unchanged(current, self._cache_snapshot):
            self.model.variational_strategy._clear_cache()
            self._cache_snapshot = parameter_snapshot(current)

    def _apply(self, fn, *args: Any, **kwargs: Any) -> OnlineSVGP:
        # torch's hook behind ``.to``, ``.double()``, ``.cuda()``: the parameters, buffers
        # and the optimizer's state move first (PersistentOptimizerMixin), then the
        # streaming state kept outside them; gpytorch's eval-mode caches were built on
        # the old device and dtype.
        super()._apply(fn, *args, **kwargs)
        self.frozen_posterior = apply_to_tensors(self.frozen_posterior, fn)
        self.last_batch = apply_to_tensors(self.last_batch, fn)
        self._conditioning = apply_to_tensors(self._conditioning, fn)
        self.model.variational_strategy._clear_cache()
        self._cache_snapshot = None
        return self

    # ------------------------------------------------------------ BoTorch API
    def _check_posterior_inputs(self, X: Tensor, observation_noise: bool | Tensor) -> None:
        # With a Bernoulli likelihood the posterior is over the latent f.
        super()._check_posterior_inputs(X, observation_noise)
        check_latent_only(self.likelihood, observation_noise)

    def _latent_posterior(self, X_t: Tensor) -> MultivariateNormal:
        r"""(Conditioned) variational posterior of ``f`` at transformed inputs ``X_t``."""
        self._refresh_caches()
        if self._conditioning is None:
            mvn = self.model(X_t)
            return MultivariateNormal(mvn.mean, DenseLinearOperator(mvn.covariance_matrix))

        def joint(X: Tensor) -> tuple[Tensor, Tensor]:
            mvn = self.model(X)
            return mvn.mean, mvn.covariance_matrix

        return condition_joint(joint, self._conditioning, X_t)

    def observe(
        self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None, *, num_steps: int | None = None
    ) -> OnlineSVGP:
        r"""Absorb a batch in place: freeze the old posterior, take optimizer steps.

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (original space; ``{0, 1}`` for Bernoulli).
            Yvar: Must be None: the model learns its noise level (the argument exists
                for the common streaming-model signature ``observe(X, Y, Yvar)``).
            num_steps: Optimizer steps for this batch (default: ``self.num_steps``).

        Returns:
            The model itself. Invalid input raises before anything is changed.
        """
        check_no_known_noise(Yvar, "OnlineSVGP", argument="Yvar")
        self._check_not_conditioned("observe")
        self._check_inputs(X, "X")
        if X.dim() != 2:
            raise ValueError(f"X must have shape q x d, got {tuple(X.shape)}.")
        check_targets(check_tensor(Y, "Y", like=X, min_dim=2), "Y", len(X))
        if not self.is_gaussian:
            _check_binary(Y, "Y")
        num_steps = self.num_steps if num_steps is None else check_count(num_steps, "num_steps")
        if len(X) == 0:
            return self
        X_t, Y_t, _ = transform_new_data(self, X, Y)
        self._guarded(lambda: self._absorb(X_t, Y_t.squeeze(-1), num_steps))
        return self

    def refine(self, num_steps: int) -> OnlineSVGP:
        r"""More optimizer steps on the streaming objective of the last absorbed batch.

        The old posterior stays frozen and nothing is absorbed twice, so
        ``observe(X, Y, num_steps=k)`` followed by ``refine(j)`` is the same update as
        ``observe(X, Y, num_steps=k + j)`` with the optimizer kept. One step per batch is
        the streaming protocol; a Bayesian-optimisation loop that refits "to
        convergence" (Stanton et al. 2021, appendix C.2) refines with many.

        Args:
            num_steps: Optimizer steps (non-negative int).

        Returns:
            The model itself. If the steps diverge, the model is restored and
            ``RuntimeError`` is raised.

        Example:
            >>> X = torch.rand(50, 1, dtype=torch.float64)
            >>> model = OnlineSVGP(X, torch.sin(6 * X), num_inducing=8, num_init_steps=5)
            >>> model = model.refine(20)  # 20 more steps on the constructor's batch
        """
        self._check_not_conditioned("refine")
        num_steps = check_count(num_steps, "num_steps")
        if self.last_batch is None:
            raise RuntimeError("refine needs an absorbed batch; observe data first.")
        self._guarded(lambda: self._optimize(*self.last_batch, num_steps))
        return self

    #: A restore takes the checkpoint's inducing set, whatever its size (an
    #: ``inducing_selector`` grows it; ``num_inducing`` only chose the first one).
    ADOPTED_OPTIONS = frozenset({"num_inducing"})

    def _checkpoint_options(self) -> dict[str, Any]:
        return {
            **super()._checkpoint_options(),
            "num_inducing": len(self.inducing_points),
            # How the stream goes on: closed-form q or first-order steps.
            "hold_variational_optimum": self.hold_variational_optimum,
        }

    def _stream_state(self) -> dict[str, Any]:
        r"""The streaming state outside the parameters, for :meth:`checkpoint`.

        The frozen old posterior, the last batch, the number of observations and the
        optimizer's state (tensors and numbers only: ``torch.load(weights_only=True)``).
        """
        frozen = self.frozen_posterior
        return {
            "num_observed": self.num_observed,
            "frozen_posterior": None if frozen is None else dict(vars(frozen)),
            "last_batch": self.last_batch,
            "optimizer": self._optimizer_state(),
        }

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        frozen = state["frozen_posterior"]
        self.frozen_posterior = None if frozen is None else FrozenPosterior(**frozen)
        self.num_observed = int(state["num_observed"])
        last = state["last_batch"]
        self.last_batch = None if last is None else tuple(last)
        self._load_optimizer_state(state["optimizer"])
        self.model.variational_strategy._clear_cache()
        self._cache_snapshot = None

    def is_data_key(self, key: str) -> bool:
        r"""Whether ``state_dict()[key]`` holds data rather than a hyperparameter.

        Learned inducing points of a Gaussian model are fitted with the hyperparameters
        (``fit_gpytorch_mll`` moves them), so a warm start takes them too, whatever their
        number, and ``q`` is then set to its optimum on this model's data (see
        :meth:`_after_warm_start`): a model rebuilt on the saved model's data reproduces
        it. Chosen ones (greedy on the data, or an ``inducing_selector``'s) stay this
        model's.
        """
        if key == _INDUCING_KEY and self.is_gaussian and self.model._learn_inducing_locations:
            return False
        return super().is_data_key(key)

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        strict: bool = True,
        keep_transforms: bool = True,
        **kwargs: Any,
    ):
        r"""As :meth:`StreamingModelMixin.load_state_dict`; a warm start may resize the
        inducing set to the saved one (see :meth:`is_data_key`)."""
        saved = state_dict.get(_INDUCING_KEY)
        if (
            keep_transforms
            and saved is not None
            and not self.is_data_key(_INDUCING_KEY)
            and saved.shape != self.inducing_points.shape
        ):
            self._prepare_state_load({_INDUCING_KEY: saved})
        return super().load_state_dict(
            state_dict, strict=strict, keep_transforms=keep_transforms, **kwargs
        )

    def _after_warm_start(self) -> None:
        r"""After a warm start (``load_state_dict`` keeping this model's data): ``q`` at
        the loaded hyperparameters.

        ``q`` is whitened by this model's ``K_ZZ``, so the same ``q(v)`` under other
        hyperparameters is another posterior, one fitted to nothing (a model rebuilt on
        the same data predicted with test RMSE 26 against the saved model's 0.7). With a
        Gaussian likelihood ``q`` is set to its optimum for the last batch (all of the
        data of a model built in one batch) at the loaded hyperparameters, so a model on
        the saved model's data and inducing points reproduces it. The persistent
        optimizer's moments belong to the replaced values and are dropped.
        """
        self._optimizer = None
        if self.is_gaussian and self.last_batch is not None:
            if not self._try_set_optimal_q(*self.last_batch):
                warnings.warn(
                    "Bui et al.'s bound has no maximiser in q(u) at the loaded "
                    "hyperparameters; q(u) was kept as it was. Refit or observe to update it.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        self.model.variational_strategy._clear_cache()
        self._cache_snapshot = None

    def _prepare_state_load(self, state_dict: dict[str, Any]) -> None:
        # The inducing set may have another size (a selector, or fewer initial points).
        key = _INDUCING_KEY
        if key in state_dict and state_dict[key].shape != self.inducing_points.shape:
            model = self.model
            model.variational_strategy = model._strategy(
                torch.empty_like(state_dict[key]), model._learn_inducing_locations, model._jitter
            )
            self._optimizer = None

    def optimal_variational_parameters(self, beta: float = 1.0) -> tuple[Tensor, Tensor]:
        r"""The whitened ``q(v)`` maximising the streaming objective of the last batch.

        Gaussian likelihood only: the objective is quadratic in the mean of ``q`` and
        concave in its covariance, so its maximiser at the current hyperparameters is
        closed-form (:func:`~streamgp.linalg.variational.optimal_whitened_posterior`,
        ``O(B M^2 + M^3)``). At it the streaming ELBO equals the collapsed bound
        (Titsias' for the constructor's batch, Bui et al.'s for later ones).

        Args:
            beta: The weight of the KL terms: 1 (default) for :meth:`fit_objective`'s
                bound (and the per-batch steps of a Gaussian model), ``self.beta`` for
                the first-order steps of :meth:`streaming_loss`'s default.

        Returns:
            ``(m, R)``: the whitened mean and lower-triangular root, as
            :meth:`_SparseVariationalGP.set_variational_parameters` takes them.
        """
        self._check_not_conditioned("optimal_variational_parameters")
        if not self.is_gaussian:
            raise RuntimeError("The optimal q(u) is closed-form for a Gaussian likelihood only.")
        return self._optimal_q(*self._last_batch_or_raise(), beta)

    def _last_batch_or_raise(self) -> tuple[Tensor, Tensor]:
        if self.last_batch is None:
            raise RuntimeError("The model has absorbed no data; there is nothing to fit.")
        return self.last_batch

    def _optimal_q(self, X: Tensor, y: Tensor, beta: float = 1.0) -> tuple[Tensor, Tensor]:
        r""":meth:`optimal_variational_parameters` for the batch ``(X, y)`` (transformed)."""
        strategy = self.model.variational_strategy
        Z = strategy.inducing_points
        kernel, mean = self.model.covar_module, self.model.mean_module
        eye = torch.eye(len(Z), dtype=Z.dtype, device=Z.device)
        # The whitening factor of gpytorch's strategy (K_ZZ plus its jitter).
        L = psd_safe_cholesky(kernel(Z).to_dense() + strategy.jitter_val * eye)

        def whitened(points: Tensor) -> Tensor:
            return torch.linalg.solve_triangular(L, kernel(Z, points).to_dense(), upper=False).mT

        old = self.frozen_posterior
        if old is not None:
            a = old.inducing_points
            old = (whitened(a), mean(a), old.mean, old.root, old.prior_mean, old.prior_root)
        return optimal_whitened_posterior(
            whitened(X), y - mean(X), self.likelihood.noise.reshape(()), beta, old
        )

    def _set_optimal_q(self, X: Tensor, y: Tensor) -> None:
        r"""Set ``q`` to Bui et al.'s optimum for the batch ``(X, y)`` (no gradients)."""
        with torch.no_grad():
            self.model.set_variational_parameters(*self._optimal_q(X, y))

    def _try_set_optimal_q(self, X: Tensor, y: Tensor) -> bool:
        r""":meth:`_set_optimal_q`, or False (``q`` unchanged) where there is no optimum."""
        try:
            self._set_optimal_q(X, y)
        except torch.linalg.LinAlgError:
            return False
        return True

    def custom_fit(
        self,
        mll: Any,
        closure: Callable[..., Any] | None = None,
        closure_kwargs: dict[str, Any] | None = None,
        optimizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        r"""What ``botorch.fit.fit_gpytorch_mll`` runs: :meth:`fit_objective` to convergence.

        With a Gaussian likelihood ``q(u)`` is held at its closed-form optimum
        (:meth:`optimal_variational_parameters`) for the current hyperparameters, so
        :meth:`fit_objective` is the collapsed bound (Titsias' for the constructor's
        batch, Bui et al.'s for later ones), and the hyperparameters (and learned
        inducing points) are fitted by L-BFGS-B, as BoTorch fits ``SingleTaskGP`` (see
        :func:`fit_collapsed`); with the inducing points at the data it is the exact GP's
        fit. Otherwise (a Bernoulli likelihood, or a closure of the caller's),
        ``num_init_steps`` steps of the model's own optimizer on the joint objective
        (``optimizer_kwargs["step_limit"]`` steps if given). Where the frozen old
        posterior is wider than its prior (few steps per batch can leave it so), Bui et
        al.'s bound is unbounded in ``q`` at some hyperparameters; the fit then warns and
        takes those steps on the ``beta``-weighted objective of :meth:`refine` instead.

        Returns:
            ``mll`` in eval mode. If the fit fails, the model is restored and the error
            is raised.
        """
        if self.is_gaussian and closure is None:
            self._check_not_conditioned("fit")
            distribution = self.model.variational_strategy._variational_distribution

            batch = self._last_batch_or_raise()

            def set_optimum() -> None:
                if not self._try_set_optimal_q(*batch):
                    raise NoVariationalOptimumError(
                        "The streaming bound is unbounded in q(u) at these hyperparameters."
                    )

            try:
                return fit_collapsed(
                    self, mll, list(distribution.parameters()), set_optimum, optimizer_kwargs
                )
            except NoVariationalOptimumError:  # the model was restored
                warnings.warn(
                    "Bui et al.'s bound has no maximiser in q(u) at some hyperparameters (the "
                    "frozen old posterior is wider than its prior in some direction, e.g. "
                    "after few optimizer steps per batch); fitting with the model's "
                    "first-order steps on its beta-weighted objective instead.",
                    RuntimeWarning,
                    stacklevel=2,
                )

            def per_batch_closure() -> tuple[Tensor, None]:
                value = -self.streaming_loss(*self.last_batch)
                loss = -per_datum_objective(mll, value, self.num_observed)
                loss.backward()
                return loss, None

            closure, closure_kwargs = per_batch_closure, None
        return super().custom_fit(
            mll,
            closure=closure,
            closure_kwargs=closure_kwargs,
            optimizer_kwargs=optimizer_kwargs,
            **kwargs,
        )

    def fit_objective(self) -> tuple[Tensor, Tensor | int]:
        r"""The streaming ELBO of the last absorbed batch, and the number of observations.

        Bui et al.'s bound (Eq. A.8 with ``beta = 1``: the batch's expected log
        likelihood minus the KL terms against the frozen old posterior), which accounts
        for every observation and, for the constructor's batch, is the SVGP ELBO: a lower
        bound of the log marginal likelihood, the objective of a type-II maximum
        likelihood fit. ``fit_gpytorch_mll`` with any marginal likelihood wrapping the
        model maximises it (see :meth:`custom_fit`).

        With a Gaussian likelihood ``observe`` and :meth:`refine` step on this bound too
        (with ``q`` at its optimum); otherwise on the same objective with the KL terms
        weighted by ``beta``. That weight lets first-order steps move ``q`` quickly; as a
        hyperparameter objective it is degenerate: the trace term
        ``tr(K_XX - Q_XX) / (2 sigma^2)`` keeps its full weight while the terms that
        identify the prior's scale are weighted by ``beta``, so a converged fit shrinks
        the outputscale (35-150x on 1-D toys with beta = 1e-3: overconfident predictions).
        """
        self._check_not_conditioned("fit_objective")
        if self.last_batch is None:
            raise RuntimeError("The model has absorbed no data; there is nothing to fit.")
        return -self.streaming_loss(*self.last_batch, beta=1.0), self.num_observed

    def __deepcopy__(self, memo: dict[int, Any]) -> OnlineSVGP:
        # gpytorch's variational strategy memoizes factors computed with gradients
        # (non-leaf tensors, which deepcopy refuses) after a prediction: dropped first (the
        # next prediction recomputes the same factors), then a plain deep copy.
        self.model.variational_strategy._clear_cache()
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            new.__dict__[name] = copy.deepcopy(value, memo)
        return new

    def _check_not_conditioned(self, method: str) -> None:
        if self._conditioning is not None:
            raise RuntimeError(
                f"{method} is not available on a conditioned (fantasy) model; call it on "
                "the model it was conditioned from."
            )

    def _after_rollback(self) -> None:
        super()._after_rollback()
        self.model.eval()
        self.likelihood.eval()
        self.model.variational_strategy._clear_cache()
        self._cache_snapshot = None


class NoVariationalOptimumError(RuntimeError):
    r"""The objective has no maximiser in the variational parameters at these hyperparameters.

    Raised by ``set_optimum`` in :func:`fit_collapsed`; deliberately not a
    ``torch.linalg.LinAlgError`` (BoTorch's closures turn those into NaN losses, which
    end an L-BFGS-B run at the failing point).
    """


def fit_collapsed(
    model: Any,
    mll: Any,
    variational: list[Tensor],
    set_optimum: Callable[[], None],
    optimizer_kwargs: dict[str, Any] | None = None,
) -> Any:
    r"""Fit a variational model's hyperparameters with ``q`` at its closed-form optimum.

    Before every evaluation, ``set_optimum`` sets the variational parameters to the
    maximiser of the model's objective at the current hyperparameters; the objective
    (``model.compute_custom_loss``) is then the collapsed bound, and its gradient in the
    hyperparameters at that ``q`` is the collapsed bound's gradient (the partial
    derivative in ``q`` vanishes at the optimum). L-BFGS-B (BoTorch's
    ``fit_gpytorch_mll_scipy``, with the parameter bounds it derives) then fits the
    hyperparameters to convergence, as for an exact GP, in tens to hundreds of
    evaluations, instead of first-order steps on ``q`` and the hyperparameters jointly.

    Args:
        model: The model (with ``compute_custom_loss`` and ``_guarded``).
        mll: The marginal likelihood BoTorch passed (its priors are added).
        variational: The variational parameters ``set_optimum`` sets (not optimised).
        set_optimum: Sets them to the optimum at the current hyperparameters; raises
            :class:`NoVariationalOptimumError` where there is none.
        optimizer_kwargs: ``options`` (scipy's, e.g. ``{"maxiter": 100}``),
            ``step_limit`` (an iteration cap, as for the first-order fit), and
            ``method``, ``bounds``, ``callback``, ``timeout_sec`` of
            ``fit_gpytorch_mll_scipy``.

    Returns:
        ``mll`` in eval mode. If the fit fails, the model is restored and the error is
        raised.
    """
    kwargs = dict(optimizer_kwargs or {})
    options = dict(kwargs.pop("options", None) or {})
    step_limit = kwargs.pop("step_limit", None)
    if step_limit is not None:
        options.setdefault("maxiter", int(step_limit))
    scipy_kwargs = {
        key: kwargs[key] for key in ("method", "bounds", "callback", "timeout_sec") if key in kwargs
    }
    held = {id(p) for p in variational}
    parameters = {
        name: p for name, p in mll.named_parameters() if p.requires_grad and id(p) not in held
    }

    def closure() -> tuple[Tensor, tuple[Tensor | None, ...]]:
        with torch.no_grad():
            set_optimum()
        loss = model.compute_custom_loss(mll)
        grads = torch.autograd.grad(loss, list(parameters.values()), allow_unused=True)
        return loss.detach(), grads

    def fit() -> None:
        if parameters:
            fit_gpytorch_mll_scipy(
                mll, parameters=parameters, closure=closure, options=options, **scipy_kwargs
            )
        with torch.no_grad():
            set_optimum()

    mll.train()
    try:
        model._guarded(fit)
    finally:
        mll.eval()
    return mll


def _check_likelihood(likelihood: object) -> None:
    if isinstance(likelihood, FixedNoiseGaussianLikelihood) or not isinstance(
        likelihood, (GaussianLikelihood, BernoulliLikelihood)
    ):
        raise TypeError(
            "likelihood must be a gpytorch GaussianLikelihood (learned noise) or "
            f"BernoulliLikelihood; got {type(likelihood).__name__}."
        )


def _check_binary(Y: Tensor, name: str) -> None:
    if not ((Y == 0) | (Y == 1)).all():
        raise ValueError(f"{name} must contain only 0/1 labels for a BernoulliLikelihood.")
