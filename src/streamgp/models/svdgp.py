r"""Decoupled sparse variational GP (SVDGP), as a streaming BoTorch model.

SVDGP (Cheng & Boots, "Variational Inference for Gaussian Process Models with Linear
Complexity", NeurIPS 2017) represents the variational posterior with two separate
bases (section 3.3, Eq. 7-8): a mean basis ``alpha`` of ``M_alpha`` points with
coefficients ``a`` and a covariance basis ``beta`` of ``M_beta`` points with a PSD
matrix ``B = L L^T``:

.. math::

    m(x) = m_0(x) + k_{x\alpha} a, \qquad
    k(x, x') = k_{xx'} - k_{x\beta} L (I + L^T K_\beta L)^{-1} L^T k_{\beta x'}.

The ELBO ``sum_n E_q[log p(y_n | f(x_n))] - KL(q || p)`` (Eq. 9-10) is maximised by
stochastic gradient ascent on minibatches. Its mean part costs ``O(N_m M_alpha)``
per step (the ``a^T K_alpha a`` term of the KL is estimated from ``N_c`` sampled
columns of ``K_alpha``), its covariance part ``O(N_m M_beta^2 + M_beta^3)``; so
``M_alpha`` can be much larger than ``M_beta``. With ``alpha = beta = Z`` the
objective is the standard SVGP ELBO with ``q(u) = N(m_0(Z) + K a, (K^-1 + B)^-1)``.

Streaming (Algorithm 1 of the paper): each :meth:`DecoupledSVGP.observe` call first
adds up to ``basis_increment`` of the new points to both bases (until
``max_mean_basis`` / ``max_covar_basis`` are reached), with zero mean coefficients and
a small new diagonal in ``L`` so the posterior is unchanged, then takes
``num_steps`` optimizer steps (with a Gaussian likelihood, on the hyperparameters,
then ``(a, L)`` are set to their closed-form optimum on the replay set; see
``warm_start``). Each step's minibatch is the new batch topped up with
points drawn from a bounded reservoir sample of the stream, and the likelihood term
is scaled to the number of points seen so far. Memory and cost per update are
independent of the length of the stream.

The covariance and mean functions, the likelihood and (optionally) the locations of
both bases are learned; Gaussian and Bernoulli likelihoods are supported. With a
Gaussian likelihood, :meth:`DecoupledSVGP.condition_on_observations` (and so
BoTorch's ``fantasize``, qNIPV, qKG) is the exact Gaussian update of the joint
variational predictive, as for :class:`streamgp.models.OnlineSVGP` (online
variational conditioning, Maddox et al. 2021).
Transforms are fitted on the constructor's data and then frozen (see
:mod:`streamgp.models.utils.transforms`); bases live in the transformed input space.

References:

.. [Cheng2017] C.-A. Cheng, B. Boots. Variational Inference for Gaussian Process
    Models with Linear Complexity. Advances in Neural Information Processing Systems 30,
    2017.
.. [Maddox2021] W. J. Maddox, S. Stanton, A. G. Wilson. Conditioning Sparse
    Variational Gaussian Processes for Online Decision-making. Advances in Neural
    Information Processing Systems 34, 2021.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.models.utils.inducing_point_allocators import GreedyVarianceReduction
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import BernoulliLikelihood, GaussianLikelihood, Likelihood
from gpytorch.means import Mean
from gpytorch.models import GP
from linear_operator.operators import DenseLinearOperator, DiagLinearOperator
from torch import Tensor
from torch.nn import Parameter

from streamgp.linalg.decoupled import (
    DecoupledCovariance,
    decoupled_covariance,
    decoupled_kl,
    decoupled_predictive,
    gaussian_optimal_parameters,
    mean_kl_term,
)
from streamgp.models.base import StreamingModelMixin
from streamgp.models.osvgp import _check_binary, _check_likelihood, fit_collapsed
from streamgp.models.utils import (
    FrozenTransformsMixin,
    JointConditioningMixin,
    MutableState,
    apply_to_tensors,
    check_latent_only,
    condition_joint,
    conditioning_batch_shape,
    fit_frozen_transforms,
    transform_new_data,
)
from streamgp.models.utils.defaults import (
    DEFAULT,
    _DefaultType,
    in_target_units,
    mean_module_or_default,
    target_unit,
)
from streamgp.models.utils.optimization import PersistentOptimizerMixin
from streamgp.utils.validation import (
    check_bool,
    check_count,
    check_no_known_noise,
    check_targets,
    check_tensor,
)

_VARIATIONAL = ("mean_basis", "mean_weights", "covar_basis", "covar_root")


class _KernelInUnits(torch.nn.Module):
    r"""``kernel / unit``: a kernel's covariances in the targets' (squared) unit, for
    BoTorch's inducing-point allocator, whose stopping rule is an absolute residual
    variance (1e-6): the basis it picks is then the same for ``10^k Y`` as for ``Y``."""

    def __init__(self, kernel: Kernel, unit: Tensor) -> None:
        super().__init__()
        self.kernel, self.unit = kernel, unit

    def forward(self, X: Tensor) -> Any:
        return self.kernel(X) / self.unit


class DecoupledSVGP(
    JointConditioningMixin,
    StreamingModelMixin,
    PersistentOptimizerMixin,
    FrozenTransformsMixin,
    GPyTorchModel,
    GP,
    FantasizeMixin,
):
    r"""Decoupled sparse variational GP (Cheng & Boots 2017) with online basis growth.

    Args:
        train_X: ``n x d`` initial inputs (``n >= 1``).
        train_Y: ``n x 1`` initial targets (``{0, 1}`` labels for a Bernoulli likelihood).
        train_Yvar: Not supported (the noise level is learned); raises ``ValueError``
            if given, as BoTorch code may pass it.
        mean_basis: ``M_alpha x d`` initial mean basis (transformed input space).
            Default: the covariance basis followed by other training inputs in random
            order, up to ``max_mean_basis`` points.
        covar_basis: ``M_beta x d`` initial covariance basis (transformed space).
            Default: ``min(n, max_covar_basis)`` training inputs chosen by greedy
            variance reduction (BoTorch's allocator).
        max_mean_basis: Cap ``M_alpha`` on the mean basis size.
        max_covar_basis: Cap ``M_beta`` on the covariance basis size.
        basis_increment: ``N_Delta``, new points of each batch added to the bases.
        covar_module: Kernel. Default: ``ScaleKernel(RBFKernel(ard_num_dims=d))``.
        mean_module: Prior mean ``m_0``. Default: a ``ConstantMean()`` learned with the
            other hyperparameters, as in ``SingleTaskGP``.
        likelihood: ``GaussianLikelihood`` (default) or ``BernoulliLikelihood``.
        minibatch_size: ``N_m``, points per optimizer step.
        kl_columns: ``N_c``, sampled columns of ``K_alpha`` in the KL's mean term per
            step (exact when ``N_c >= M_alpha``). Default: ``minibatch_size``.
        replay_size: Capacity of the reservoir sample of the stream that tops up
            minibatches (0: steps use the new batch only).
        num_steps: Optimizer steps per :meth:`observe` call.
        num_init_steps: Optimizer steps on the constructor's data.
        lr: Learning rate ``gamma_0`` of the default Adam optimizer.
        lr_decay: The step size after ``t`` optimizer steps (over the whole stream) is
            ``gamma_0 / (1 + lr_decay * sqrt(t))``, the paper's schedule (section 4,
            ``lr_decay = 0.1``); 0 keeps it constant.
        learn_inducing_points: Whether the basis points (the inducing points of the
            mean and covariance bases) are optimised (the paper does). Off by default:
            the bases grow from the data stream, and on toy streams moving them with
            Adam at the default step size degraded the fit.
        new_root_diagonal: Diagonal of ``L`` for new covariance basis points, in units
            of one over :attr:`target_scale` (small: the posterior barely changes, but
            gradients with respect to the new column of ``L``, proportional to it, do
            not vanish).
        optimizer_cls: ``torch.optim.Optimizer`` class, stepped with a closure.
        optimizer_kwargs: Keyword arguments of ``optimizer_cls`` (default ``{"lr": lr}``).
        keep_optimizer_state: Keep the optimizer state across batches; when a basis
            grows, per-parameter state tensors (Adam's moments) are zero-padded.
            Set False for optimizers with flat state such as LBFGS.
        warm_start: With a Gaussian likelihood, set ``(a, L)`` to their exact optimum
            on the constructor's data (``O(n M_alpha^2 + M_alpha^3)``, see
            :func:`streamgp.linalg.decoupled.gaussian_optimal_parameters`) before and
            after the initial optimizer steps, and (with a replay set) on the replay
            set after each :meth:`observe`, whose steps then move the hyperparameters
            only (see :attr:`holds_optimum`). The directly parametrised ``(a, L)`` of
            the paper converge slowly under first-order steps, and Adam's steps on a
            converged ``(a, L)`` wreck it. False: the paper's first-order steps on
            ``(a, L)``, linear in ``M_alpha``, from the start.
        hold_variational_optimum: With ``warm_start``, keep ``(a, L)`` at their optimum
            after each :meth:`observe` (default). False: the constructor's warm start
            only, then the paper's first-order steps (the WISKI paper's streaming
            protocol uses them).
        seed: Seed of the model's own generator (minibatches, reservoir, new bases).
        input_transform: Input transform, fitted on ``train_X`` and then frozen.
        outcome_transform: Outcome transform, fitted on ``train_Y`` and then frozen.
            Default: ``Standardize(m=1)``, as in ``SingleTaskGP``; None for no
            transform (the default modules then start in the targets' units, and the
            variational parameters are scaled by :attr:`target_scale`). With a
            ``BernoulliLikelihood`` the default is no transform and any other raises.

    Attributes:
        target_scale: The unit ``s`` of the variational parameters (a buffer, fixed at
            construction): the parameters Adam steps on are ``mean_weights = s a`` and
            ``covar_root = s L``. ``a`` and ``L`` scale as one over the targets (the
            mean ``k_{x alpha} a`` as the targets, ``K_beta`` as their square), so in
            these units a step is relative, whatever the targets' scale: one (the paper's
            parametrisation) with the default ``Standardize`` or a Bernoulli
            likelihood; without a transform the power of ten nearest the targets'
            standard deviation (:func:`~streamgp.models.utils.defaults.target_unit`),
            in which the default modules are parametrised too (a unit-size step on a
            root of order 1e-12 broke it at ``1e12 Y``).

    Example:
        >>> X = torch.rand(200, 1, dtype=torch.float64)
        >>> Y = torch.sin(6 * X) + 0.1 * torch.randn_like(X)
        >>> model = DecoupledSVGP(
        ...     X, Y, max_mean_basis=128, max_covar_basis=16, num_init_steps=50
        ... )
        >>> X_new = torch.rand(8, 1, dtype=torch.float64)
        >>> model = model.observe(X_new, torch.sin(6 * X_new), num_steps=3)
        >>> posterior = model.posterior(torch.rand(5, 1, dtype=torch.float64))
        >>> posterior.mean.shape, int(model.num_observed)
        (torch.Size([5, 1]), 208)
    """

    _num_outputs = 1

    #: The bases and variational parameters summarise the data; kernel, mean and
    #: likelihood parameters are the hyperparameters a warm start loads.
    data_state_prefixes = (*_VARIATIONAL, "target_scale", "input_transform.", "outcome_transform.")
    #: What a failed update restores (``O(M_alpha + M_beta^2)``): the variational
    #: parameters (grown bases are new tensors), the hyperparameters, the replay set,
    #: the counters and the random stream.
    mutable_state = MutableState(
        attributes=("_replay_X", "_replay_y", "num_observed", "num_optimizer_steps"),
        parameters=_VARIATIONAL,
        modules=("covar_module", "mean_module", "likelihood"),
        generators=("_generator",),
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
        mean_basis: Tensor | None = None,
        covar_basis: Tensor | None = None,
        max_mean_basis: int = 1024,
        max_covar_basis: int = 64,
        basis_increment: int = 16,
        minibatch_size: int = 256,
        kl_columns: int | None = None,
        replay_size: int = 2048,
        num_steps: int = 5,
        num_init_steps: int = 300,
        lr: float = 5e-2,
        lr_decay: float = 0.1,
        learn_inducing_points: bool = False,
        new_root_diagonal: float = 1e-2,
        optimizer_cls: type[torch.optim.Optimizer] = torch.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
        keep_optimizer_state: bool = True,
        warm_start: bool = True,
        hold_variational_optimum: bool = True,
        seed: int = 0,
    ) -> None:
        learn_inducing_points = bool(learn_inducing_points)
        check_no_known_noise(train_Yvar, "DecoupledSVGP")
        # ---- validate everything before building anything
        check_bool(hold_variational_optimum, "hold_variational_optimum")
        check_tensor(train_X, "train_X", min_dim=2)
        if train_X.dim() != 2 or len(train_X) == 0:
            raise ValueError(
                f"train_X must have shape n x d with n >= 1, got {tuple(train_X.shape)}."
            )
        dim = train_X.shape[-1]
        check_targets(
            check_tensor(train_Y, "train_Y", like=train_X, min_dim=2), "train_Y", len(train_X)
        )
        # The default modules start in the targets' units without a transform.
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
        if isinstance(lr_decay, bool) or not isinstance(lr_decay, (int, float)) or lr_decay < 0:
            raise ValueError(f"lr_decay must be a non-negative number, got {lr_decay!r}.")
        for name, value in [("lr", lr), ("new_root_diagonal", new_root_diagonal)]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}.")
        for name, value, low in [
            ("max_mean_basis", max_mean_basis, 1),
            ("max_covar_basis", max_covar_basis, 1),
            ("basis_increment", basis_increment, 0),
            ("minibatch_size", minibatch_size, 1),
            ("kl_columns", 1 if kl_columns is None else kl_columns, 1),
            ("replay_size", replay_size, 0),
            ("num_steps", num_steps, 0),
            ("num_init_steps", num_init_steps, 0),
        ]:
            check_count(value, name, low)
        for name, basis, cap in [
            ("mean_basis", mean_basis, max_mean_basis),
            ("covar_basis", covar_basis, max_covar_basis),
        ]:
            if basis is None:
                continue
            check_tensor(basis, name, like=train_X, min_dim=2, last_dim=dim)
            if basis.dim() != 2 or not 1 <= len(basis) <= cap:
                raise ValueError(
                    f"{name} must have shape M x d with 1 <= M <= max_{name} ({cap}), got "
                    f"{tuple(basis.shape)}."
                )

        super().__init__()
        tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
        train_X_t, train_Y_t, _ = fit_frozen_transforms(
            self, train_X, train_Y, input_transform, outcome_transform
        )
        covar_module = (
            ScaleKernel(RBFKernel(ard_num_dims=dim)) if covar_module is None else covar_module
        )
        self.covar_module = covar_module.to(**tkwargs)
        self.mean_module = mean_module_or_default(mean_module, train_X)
        self.likelihood = likelihood.to(**tkwargs)
        # The unit of the variational parameters (see `target_scale`): one for
        # standardised targets (or labels), so the default path is exactly the paper's.
        self.register_buffer("target_scale", torch.ones((), **tkwargs))
        if getattr(self, "outcome_transform", None) is None and self.is_gaussian:
            modules = {"mean_module": self.mean_module, "covar_module": self.covar_module}
            modules["likelihood"] = self.likelihood
            modules = {k: v for k, v in modules.items() if defaults[k]}
            in_target_units(train_Y_t, **modules, parametrise=True)
            self.target_scale.copy_(target_unit(train_Y_t))
        self.max_mean_basis = max_mean_basis
        self.max_covar_basis = max_covar_basis
        self.basis_increment = basis_increment
        self.minibatch_size = minibatch_size
        self.kl_columns = minibatch_size if kl_columns is None else kl_columns
        self.replay_size = replay_size
        self.num_steps = num_steps
        self.num_init_steps = num_init_steps
        self.learn_inducing_points = learn_inducing_points
        self.new_root_diagonal = float(new_root_diagonal)
        self.lr_decay = float(lr_decay)
        self.num_optimizer_steps = 0
        self._init_optimizer(optimizer_cls, optimizer_kwargs, lr, keep_optimizer_state)
        self._generator = torch.Generator().manual_seed(seed)
        self.num_observed = 0
        self._conditioning: tuple[Tensor, Tensor, Tensor] | None = None
        self._replay_X = train_X_t[:0].detach().clone()
        self._replay_y = train_Y_t.squeeze(-1)[:0].detach().clone()

        if covar_basis is None:
            # In target units: the allocator stops at an absolute residual variance.
            kernel = _KernelInUnits(self.covar_module, self.target_scale.square())
            with torch.no_grad():
                covar_basis = GreedyVarianceReduction().allocate_inducing_points(
                    train_X_t, kernel, min(len(train_X_t), max_covar_basis), torch.Size([])
                )
        if mean_basis is None:
            # As the paper advises, both bases start from the same points; the mean
            # basis then takes further training inputs.
            is_new = ~(train_X_t.unsqueeze(-2) == covar_basis).all(-1).any(-1)
            extra = train_X_t[is_new][self._permutation(int(is_new.sum()), tkwargs["device"])]
            mean_basis = torch.cat([covar_basis, extra])[:max_mean_basis]
        m_beta = len(covar_basis)
        self.mean_basis = Parameter(
            mean_basis.detach().clone().to(**tkwargs), requires_grad=learn_inducing_points
        )
        self.mean_weights = Parameter(torch.zeros(len(mean_basis), **tkwargs))
        self.covar_basis = Parameter(
            covar_basis.detach().clone().to(**tkwargs), requires_grad=learn_inducing_points
        )
        self.covar_root = Parameter(self.new_root_diagonal * torch.eye(m_beta, **tkwargs))
        self.warm_start = warm_start and self.is_gaussian
        self.hold_variational_optimum = hold_variational_optimum
        y = train_Y_t.squeeze(-1)
        if self.warm_start:
            self._set_optimal_parameters(train_X_t, y)
        self._absorb(train_X_t, y, num_init_steps, grow=False)
        if self.warm_start and num_init_steps > 0:
            self._set_optimal_parameters(train_X_t, y)
        self.eval()

    # ------------------------------------------------------------------ helpers
    @property
    def is_gaussian(self) -> bool:
        return isinstance(self.likelihood, GaussianLikelihood)

    @property
    def num_outputs(self) -> int:
        return self._num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        return conditioning_batch_shape(self._conditioning)

    def _apply(self, fn, *args: Any, **kwargs: Any) -> DecoupledSVGP:
        # torch's hook behind ``.to``, ``.double()``, ``.cuda()``: the parameters, buffers
        # and the optimizer's state move first (PersistentOptimizerMixin), then the
        # replay set and any conditioning, kept outside them.
        super()._apply(fn, *args, **kwargs)
        self._replay_X = fn(self._replay_X)
        self._replay_y = fn(self._replay_y)
        self._conditioning = apply_to_tensors(self._conditioning, fn)
        return self

    def _permutation(self, n: int, device: torch.device) -> Tensor:
        return torch.randperm(n, generator=self._generator).to(device)

    def _check_inputs(self, X: Tensor, name: str) -> None:
        check_tensor(X, name, like=self.mean_weights, min_dim=2, last_dim=self.mean_basis.shape[-1])

    def _kernel(self, X1: Tensor, X2: Tensor) -> Tensor:
        return self.covar_module(X1, X2.expand(*X1.shape[:-2], *X2.shape)).to_dense()

    @property
    def weights(self) -> Tensor:
        r"""The mean coefficients ``a`` (``mean_weights`` over :attr:`target_scale`)."""
        return self.mean_weights / self.target_scale

    @property
    def root(self) -> Tensor:
        r"""The lower-triangular root ``L`` of ``B`` (``covar_root`` over :attr:`target_scale`)."""
        return self.covar_root.tril() / self.target_scale

    # ------------------------------------------------------------ the objective
    def _latent(self, X_t: Tensor, diag: bool) -> tuple[tuple[Tensor, Tensor], DecoupledCovariance]:
        r"""``((mean, covariance or variances if diag), factors)`` of ``q(f)`` at ``X_t``."""
        beta = self.covar_basis
        factors = decoupled_covariance(self._kernel(beta, beta), self.root)
        if diag:
            K_xx = self.covar_module(X_t, diag=True)
        else:
            K_xx = self.covar_module(X_t).to_dense()
        return decoupled_predictive(
            self.mean_module(X_t),
            self._kernel(X_t, self.mean_basis),
            self.weights,
            K_xx,
            self._kernel(X_t, beta),
            factors,
        ), factors

    def elbo(
        self,
        X: Tensor,
        y: Tensor,
        *,
        num_data: int | None = None,
        kl_columns: Tensor | None = None,
    ) -> Tensor:
        r"""The decoupled ELBO (Eq. 9-10) from a minibatch, in the transformed space.

        Args:
            X: ``N_m x d`` transformed inputs.
            y: ``N_m`` transformed targets.
            num_data: ``N``, the number of points the minibatch stands for; the
                expected log-likelihood is scaled by ``N / N_m`` (default ``N_m``).
            kl_columns: Indices of sampled columns of ``K_alpha`` for the KL's mean
                term (unbiased estimate, ``O(N_c M_alpha)``); None: exact.

        Returns:
            The scalar ELBO estimate (not divided by ``N``).
        """
        (mean, var), factors = self._latent(X, diag=True)
        q_f = MultivariateNormal(mean, DiagLinearOperator(var))
        expected_log_lik = self.likelihood.expected_log_prob(y, q_f).sum(-1)
        if num_data is not None:
            expected_log_lik = expected_log_lik * (num_data / len(y))
        alpha = self.mean_basis
        columns = alpha if kl_columns is None else alpha[kl_columns]
        mean_term = mean_kl_term(self.weights, self._kernel(alpha, columns), kl_columns)
        return expected_log_lik - decoupled_kl(mean_term, factors)

    def _checkpoint_options(self) -> dict[str, Any]:
        # The caps of the bases and of the replay set decide how the stream goes on (the
        # bases and the replay set themselves, which grow to them, are state).
        return {
            **super()._checkpoint_options(),
            "max_mean_basis": self.max_mean_basis,
            "max_covar_basis": self.max_covar_basis,
            "replay_size": self.replay_size,
            "hold_variational_optimum": self.hold_variational_optimum,
        }

    def _stream_state(self) -> dict[str, Any]:
        r"""The streaming state outside the parameters, for :meth:`checkpoint`.

        The replay set, the counters, the random generator and the optimizer's state
        (tensors and numbers only: ``torch.load(weights_only=True)`` reads them).
        """
        return {
            "replay_X": self._replay_X,
            "replay_y": self._replay_y,
            "num_observed": self.num_observed,
            "num_optimizer_steps": self.num_optimizer_steps,
            "generator": self._generator.get_state(),
            "optimizer": self._optimizer_state(),
        }

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        self._replay_X, self._replay_y = state["replay_X"], state["replay_y"]
        self.num_observed = int(state["num_observed"])
        self.num_optimizer_steps = int(state["num_optimizer_steps"])
        self._generator.set_state(state["generator"])
        self._load_optimizer_state(state["optimizer"])

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
    ) -> None:
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
        )
        key = f"{prefix}target_scale"
        if key in missing_keys:  # saved before the unit existed: the parameters were a, L
            missing_keys.remove(key)
            self.target_scale.fill_(1.0)

    def _after_warm_start(self) -> None:
        r"""After a warm start (``load_state_dict`` keeping this model's data): ``(a, L)``
        at the loaded hyperparameters.

        ``(a, L)`` were fitted to this model's data under its own hyperparameters; under
        the loaded ones they are not a posterior of anything (a model rebuilt on the same
        data predicted with test RMSE 13 against the saved model's 0.75). Where the model
        :attr:`holds_optimum` they are set to their optimum on the replay set at the
        loaded hyperparameters, so a model on the saved model's data reproduces it. The
        persistent optimizer's moments belong to the replaced values and are dropped.
        """
        self._optimizer = None
        if self.holds_optimum and len(self._replay_y) > 0:
            self._set_optimal_parameters(self._replay_X, self._replay_y, self.num_observed)

    def _prepare_state_load(self, state_dict: dict[str, Any]) -> None:
        # The bases grow with the stream: take the checkpoint's sizes.
        for name in _VARIATIONAL:
            if name in state_dict:
                old = getattr(self, name)
                new = Parameter(torch.empty_like(state_dict[name]), requires_grad=old.requires_grad)
                setattr(self, name, new)
        self._optimizer = None

    def fit_objective(self) -> tuple[Tensor, int]:
        r"""The decoupled ELBO of the replay set, scaled to every observation, and ``n``.

        The replay set is a uniform sample of the stream (all of it while ``n`` is at most
        ``replay_size``), so this is the ELBO of all data, or an unbiased estimate of its
        expected log likelihood; the KL is exact. ``fit_gpytorch_mll`` with any marginal
        likelihood wrapping the model maximises it in the variational parameters and the
        hyperparameters together (with a Gaussian likelihood, with ``(a, L)`` at their
        closed-form optimum: see :meth:`custom_fit`).
        """
        self._check_fittable()
        return self.elbo(self._replay_X, self._replay_y, num_data=self.num_observed), (
            self.num_observed
        )

    def _check_fittable(self) -> None:
        if self._conditioning is not None:
            raise RuntimeError(
                "fit_objective is not available on a conditioned (fantasy) model; fit the "
                "model it was conditioned from."
            )
        if len(self._replay_y) == 0:
            raise RuntimeError(
                "The replay set is empty (replay_size=0 or no data), so the ELBO has no "
                "data term; fit with observe's steps instead."
            )

    # ------------------------------------------------------------- streaming
    def _set_optimal_parameters(self, X_t: Tensor, y: Tensor, num_data: int | None = None) -> None:
        r"""Closed-form ``(a, L)`` on ``(X_t, y)`` at the current hyperparameters.

        ``num_data``: the number of points ``(X_t, y)`` stand for, as in :meth:`elbo`
        (the likelihood term scaled by ``num_data / len(y)`` is that of a noise variance
        scaled by ``len(y) / num_data``).
        """
        with torch.no_grad():
            alpha, beta = self.mean_basis, self.covar_basis
            noise = self.likelihood.noise.reshape(())
            if num_data is not None:
                noise = noise * (len(y) / num_data)
            weights, root = gaussian_optimal_parameters(
                self._kernel(alpha, alpha),
                self._kernel(X_t, alpha),
                y - self.mean_module(X_t),
                self._kernel(beta, beta),
                self._kernel(X_t, beta),
                noise,
            )
            self.mean_weights.copy_(weights * self.target_scale)
            self.covar_root.copy_(root * self.target_scale)

    def custom_fit(
        self,
        mll: Any,
        closure: Callable[..., Any] | None = None,
        closure_kwargs: dict[str, Any] | None = None,
        optimizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        r"""What ``botorch.fit.fit_gpytorch_mll`` runs: :meth:`fit_objective` to convergence.

        With a Gaussian likelihood ``(a, L)`` are held at their closed-form optimum on
        the replay set (:func:`~streamgp.linalg.decoupled.gaussian_optimal_parameters`,
        ``O(n M_alpha^2 + M_alpha^3)`` per evaluation) for the current hyperparameters,
        so the objective is the collapsed decoupled bound, and the hyperparameters (and
        learned bases) are fitted by L-BFGS-B, as BoTorch fits ``SingleTaskGP`` (see
        :func:`~streamgp.models.osvgp.fit_collapsed`). Otherwise (a Bernoulli
        likelihood, or a closure of the caller's), ``num_init_steps`` steps of the
        model's own optimizer on the joint objective (``optimizer_kwargs["step_limit"]``
        steps if given).

        Returns:
            ``mll`` in eval mode. If the fit fails, the model is restored and the error
            is raised.
        """
        if self.is_gaussian and closure is None:
            self._check_fittable()

            def set_optimum() -> None:
                self._set_optimal_parameters(self._replay_X, self._replay_y, self.num_observed)

            return fit_collapsed(
                self, mll, [self.mean_weights, self.covar_root], set_optimum, optimizer_kwargs
            )
        return super().custom_fit(
            mll,
            closure=closure,
            closure_kwargs=closure_kwargs,
            optimizer_kwargs=optimizer_kwargs,
            **kwargs,
        )

    def _trainable_parameters(self) -> list[Tensor]:
        return [p for p in self.parameters() if p.requires_grad]

    def _set_learning_rate(self, optimizer: torch.optim.Optimizer) -> None:
        r"""The paper's step-size schedule ``gamma_t = gamma_0 / (1 + decay sqrt(t))``."""
        base = self.optimizer_kwargs.get("lr")
        if base is None or self.lr_decay == 0:
            return
        for group in optimizer.param_groups:
            group["lr"] = base / (1.0 + self.lr_decay * self.num_optimizer_steps**0.5)

    def _replace_parameter(self, name: str, value: Tensor) -> None:
        r"""Swap a (grown) variational parameter, zero-padding its optimizer state."""
        old = getattr(self, name)
        new = Parameter(value, requires_grad=old.requires_grad)
        setattr(self, name, new)
        optimizer = self._optimizer
        if optimizer is None or not self.keep_optimizer_state or not old.requires_grad:
            return
        for group in optimizer.param_groups:
            group["params"] = [new if p is old else p for p in group["params"]]
        self._optimizer_params = [new if p is old else p for p in self._optimizer_params]
        state = optimizer.state.pop(old, None)
        if state is not None:
            padded = {}
            for key, tensor in state.items():
                if isinstance(tensor, Tensor) and tensor.shape == old.shape:
                    grown = torch.zeros_like(new)
                    grown[tuple(slice(0, s) for s in old.shape)] = tensor
                    tensor = grown
                padded[key] = tensor
            optimizer.state[new] = padded

    def _grow_bases(self, X_t: Tensor) -> None:
        r"""Algorithm 1's addBasis: up to ``basis_increment`` new points join both bases."""
        room_alpha = self.max_mean_basis - len(self.mean_basis)
        room_beta = self.max_covar_basis - len(self.covar_basis)
        count = min(self.basis_increment, len(X_t), max(room_alpha, room_beta))
        if count <= 0:
            return
        new = X_t[self._permutation(len(X_t), X_t.device)[:count]].detach()
        with torch.no_grad():
            if room_alpha > 0:
                k = min(count, room_alpha)
                self._replace_parameter("mean_basis", torch.cat([self.mean_basis, new[:k]]))
                weights = torch.cat([self.mean_weights, self.mean_weights.new_zeros(k)])
                self._replace_parameter("mean_weights", weights)
            if room_beta > 0:
                k = min(count, room_beta)
                m = len(self.covar_basis)
                self._replace_parameter("covar_basis", torch.cat([self.covar_basis, new[:k]]))
                # Block-diagonal growth: B gains a tiny diagonal block, so q barely changes.
                root = self.covar_root.new_zeros(m + k, m + k)
                root[:m, :m] = self.covar_root
                root[m:, m:] = self.new_root_diagonal * torch.eye(
                    k, dtype=root.dtype, device=root.device
                )
                self._replace_parameter("covar_root", root)

    def _update_replay(self, X_t: Tensor, y: Tensor) -> None:
        r"""Reservoir sampling: the replay set stays a uniform sample of the stream."""
        cap, seen = self.replay_size, self.num_observed
        room = max(0, min(cap - len(self._replay_X), len(X_t)))
        replay_X = torch.cat([self._replay_X, X_t[:room].detach()])
        replay_y = torch.cat([self._replay_y, y[:room].detach()])
        rest = len(X_t) - room
        if rest > 0 and cap > 0:
            positions = torch.arange(seen + room, seen + len(X_t)) + 1
            slots = (
                torch.rand(rest, generator=self._generator, dtype=torch.float64) * positions
            ).long()
            for offset, slot in enumerate(slots.tolist()):
                if slot < cap:
                    replay_X[slot] = X_t[room + offset].detach()
                    replay_y[slot] = y[room + offset].detach()
        self._replay_X, self._replay_y = replay_X, replay_y

    def _minibatch(self, X_t: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        r"""The new batch (subsampled to ``minibatch_size``) topped up from the reservoir."""
        size = self.minibatch_size
        if len(X_t) >= size:
            index = self._permutation(len(X_t), X_t.device)[:size]
            return X_t[index], y[index]
        take = min(size - len(X_t), len(self._replay_X))
        index = self._permutation(len(self._replay_X), X_t.device)[:take]
        return torch.cat([X_t, self._replay_X[index]]), torch.cat([y, self._replay_y[index]])

    def _absorb(self, X_t: Tensor, y: Tensor, num_steps: int, grow: bool = True) -> None:
        r"""Grow the bases, then take ``num_steps`` minibatch steps on a validated batch.

        A streaming batch (``grow``) of a model that :attr:`holds_optimum` steps the
        hyperparameters only, then sets ``(a, L)`` to their closed-form optimum on the
        updated replay set. First-order steps on ``(a, L)`` are what wrecked a converged
        model: Adam moves every coordinate of ``a`` by about the step size however small
        its gradient, and ``a`` multiplies an ill-conditioned ``K_alpha`` (five steps on
        three new points took the test RMSE of a fitted 2-D toy from 0.85 to 10).
        """
        if grow:
            self._grow_bases(X_t)
        hold = grow and self.holds_optimum
        held = (self.mean_weights, self.covar_root)
        num_data = self.num_observed + len(y)
        optimizer = self._get_optimizer()
        self.train()
        try:
            if optimizer is not None:
                for _ in range(num_steps):
                    self._set_learning_rate(optimizer)
                    X_mb, y_mb = self._minibatch(X_t, y)
                    m_alpha = len(self.mean_basis)
                    columns = None
                    if self.kl_columns < m_alpha:
                        columns = self._permutation(m_alpha, X_t.device)[: self.kl_columns]

                    def closure(X_mb=X_mb, y_mb=y_mb, columns=columns) -> Tensor:
                        optimizer.zero_grad()
                        loss = -self.elbo(X_mb, y_mb, num_data=num_data, kl_columns=columns)
                        loss.backward()
                        if hold:  # (a, L) are not stepped: optimizers skip gradient-less tensors
                            for p in held:
                                p.grad = None
                        return loss

                    optimizer.step(closure)
                    self.num_optimizer_steps += 1
        finally:
            self.eval()
        self._update_replay(X_t, y)
        self.num_observed = num_data
        if hold and all(torch.isfinite(p).all() for p in self._trainable_parameters()):
            # (non-finite steps: _guarded restores the model)
            self._set_optimal_parameters(self._replay_X, self._replay_y, num_data)

    @property
    def holds_optimum(self) -> bool:
        r"""Whether ``(a, L)`` are kept at their closed-form optimum on the replay set.

        True with a Gaussian likelihood, ``warm_start``, ``hold_variational_optimum`` and
        a replay set
        (``replay_size > 0``): :meth:`observe` then costs
        ``O(R M_alpha^2 + M_alpha^3)`` for a replay set of ``R`` points, bounded whatever
        the length of the stream. Otherwise ``(a, L)`` take the paper's first-order
        steps.
        """
        return self.warm_start and self.hold_variational_optimum and self.replay_size > 0

    def observe(
        self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None, *, num_steps: int | None = None
    ) -> DecoupledSVGP:
        r"""Absorb a batch in place: grow the bases, take optimizer steps.

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (original space; ``{0, 1}`` for Bernoulli).
            Yvar: Must be None: the model learns its noise level (the argument exists
                for the common streaming-model signature ``observe(X, Y, Yvar)``).
            num_steps: Optimizer steps for this batch (default: ``self.num_steps``).

        Returns:
            The model itself. Invalid input raises before anything is changed; a
            numerical failure or divergence restores the model and re-raises.
        """
        check_no_known_noise(Yvar, "DecoupledSVGP", argument="Yvar")
        if self._conditioning is not None:
            raise RuntimeError(
                "observe is not available on a conditioned (fantasy) model; observe on "
                "the model it was conditioned from."
            )
        self._check_inputs(X, "X")
        if X.dim() != 2:
            raise ValueError(f"X must have shape q x d, got {tuple(X.shape)}.")
        check_targets(check_tensor(Y, "Y", like=X, min_dim=2), "Y", len(X))
        if not self.is_gaussian:
            _check_binary(Y, "Y")
        if num_steps is None:
            num_steps = self.num_steps
        check_count(num_steps, "num_steps")
        if len(X) == 0:
            return self
        X_t, Y_t, _ = transform_new_data(self, X, Y)
        self._guarded(lambda: self._absorb(X_t, Y_t.squeeze(-1), num_steps))
        return self

    def _after_rollback(self) -> None:
        super()._after_rollback()
        self.eval()

    # ------------------------------------------------------------ BoTorch API
    def _check_posterior_inputs(self, X: Tensor, observation_noise: bool | Tensor) -> None:
        # With a Bernoulli likelihood the posterior is over the latent f.
        super()._check_posterior_inputs(X, observation_noise)
        check_latent_only(self.likelihood, observation_noise)
        if isinstance(observation_noise, Tensor):
            check_tensor(observation_noise, "observation_noise", like=X, min_dim=2, last_dim=1)

    def _latent_posterior(self, X_t: Tensor) -> MultivariateNormal:
        r"""Joint ``q(f)`` at transformed ``X_t``, conditioned on fantasy data if any."""
        if self._conditioning is None:
            mean, covar = self._latent(X_t, diag=False)[0]
            return MultivariateNormal(mean, DenseLinearOperator(covar))
        return condition_joint(lambda X: self._latent(X, diag=False)[0], self._conditioning, X_t)
