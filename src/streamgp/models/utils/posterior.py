r"""BoTorch posteriors for streamgp's models: the shared ``posterior`` and its assembly.

Every model answers ``posterior(X, observation_noise, posterior_transform)`` the same
way (:class:`PosteriorMixin`): check ``X``, map it into the space the model predicts in
(the frozen input transform; a grid model's extrapolation policy), compute the latent
posterior there (the model's own mathematics, :meth:`PosteriorMixin._latent_posterior`),
then assemble BoTorch's posterior (:func:`assemble_posterior`): add observation noise in
the outcome-transformed space, untransform the outcome, apply the posterior transform.
Structured covariances keep their structure: a factored
:class:`~streamgp.linalg.posterior_covariance.PosteriorCovariance` (WISKI, SoftKI) and a
low-rank LOVE root (:func:`assemble_root_posterior`).

References:

.. [Gardner2018] J. Gardner, G. Pleiss, K. Q. Weinberger, D. Bindel, A. G. Wilson.
    GPyTorch: Blackbox Matrix-Matrix Gaussian Process Inference with GPU Acceleration.
    Advances in Neural Information Processing Systems 31, 2018.
.. [Pleiss2018] G. Pleiss, J. Gardner, K. Q. Weinberger, A. G. Wilson. Constant-Time
    Predictive Distributions for Gaussian Processes (LOVE). International Conference on
    Machine Learning, 2018.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import gpytorch
import torch
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.likelihoods import GaussianLikelihood
from linear_operator.operators import (
    BlockDiagLinearOperator,
    DenseLinearOperator,
    DiagLinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from streamgp.linalg.posterior_covariance import PosteriorCovariance
from streamgp.settings import ValueChecks, deferred_value_checks
from streamgp.utils.validation import check_observation_noise


class FactoredMultivariateNormal(MultivariateNormal):
    r"""gpytorch's ``MultivariateNormal`` over a factored
    :class:`~streamgp.linalg.posterior_covariance.PosteriorCovariance`.

    Its variances are the covariance's diagonal floored at gpytorch's ``min_variance``,
    as gpytorch's own are, but without first reading on the host whether any is below
    it (gpytorch does, to warn; on a GPU that read synchronises every ``.variance``):
    the same values, no warning.
    """

    @property
    def variance(self) -> Tensor:
        covar = self.lazy_covariance_matrix
        if not isinstance(covar, PosteriorCovariance):
            return super().variance
        variance = covar.diagonal(dim1=-1, dim2=-2)
        shape = self._batch_shape + self._event_shape
        if variance.shape != shape:
            variance = variance.expand(shape)
        return variance.clamp_min(gpytorch.settings.min_variance.value(variance.dtype))


class PosteriorMixin:
    r"""BoTorch's ``posterior`` as one template; a model supplies its latent posterior.

    A model lists it (or :class:`~streamgp.models.base.StreamingModelMixin`, which
    includes it) before its BoTorch base classes and implements the hooks it needs:

    - :meth:`_check_inputs` (required): validate test inputs (dtype, device, ``d``).
    - :meth:`_latent_posterior`: the ``MultivariateNormal`` of the latent function at
      transformed inputs (default: ``self(X_t)``, i.e. ``forward`` in eval mode).
    - :meth:`_check_posterior_inputs`: further checks of ``observation_noise``.
    - :attr:`noise_variance`: the variance ``observation_noise=True`` adds (default:
      the Gaussian likelihood's noise).
    - :attr:`extrapolation`: for interpolation models, the policy by which
      ``self.interpolation.prediction_inputs`` treats inputs outside its domain.
    """

    #: How a grid model treats inputs outside its interpolation domain (the policy of
    #: ``self.interpolation.prediction_inputs``); None for models that predict anywhere.
    extrapolation: str | None = None

    @property
    def noise_variance(self) -> Tensor:
        r"""The homoskedastic noise variance (outcome-transformed space; differentiable)."""
        return self.likelihood.noise.reshape(())

    def subset_output(self, idcs: list[int]) -> Any:
        r"""BoTorch's ``subset_output`` for a single-output model: a copy of it.

        Args:
            idcs: ``[0]`` (or ``[-1]``), the only output.

        Returns:
            An independent copy of the model, as ``SingleTaskGP`` returns one.
        """
        idcs = list(idcs)
        if self.num_outputs != 1 or idcs not in ([0], [-1]):
            raise ValueError(
                f"idcs must select the one output of this single-output "
                f"{type(self).__name__} ([0]), got {idcs}."
            )
        return copy.deepcopy(self)

    def get_fantasy_model(
        self, inputs: Tensor, targets: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> Any:
        r"""gpytorch's conditioning hook, as BoTorch's ``ModelListGP`` calls it.

        ``ModelListGP.condition_on_observations`` outcome-transforms each member's
        targets itself and passes them here without their output dimension; this undoes
        the transform and calls the model's own ``condition_on_observations``.

        Args:
            inputs: ``batch_shape x q x d`` inputs (original space).
            targets: ``batch_shape x q`` targets, outcome-transformed (BoTorch's
                ``Standardize`` in eval mode may have added a leading unit dimension).
            noise: Optional ``batch_shape x q`` noise variances (outcome-transformed).

        Returns:
            The model conditioned on ``(inputs, targets)``.
        """
        if self.num_outputs != 1:
            raise NotImplementedError(
                "A multi-output model in a ModelListGP cannot be conditioned through "
                "ModelListGP.condition_on_observations; call the model's own "
                "condition_on_observations with a q x m Y."
            )

        def column(values: Tensor) -> Tensor:  # batch_shape x q x 1, like the inputs
            values = values.unsqueeze(-1)
            while values.dim() > inputs.dim() and values.shape[0] == 1:
                values = values.squeeze(0)
            return values

        Y = column(targets)
        noise = None if noise is None else column(noise)
        outcome_transform = getattr(self, "outcome_transform", None)
        if outcome_transform is not None:
            Y, _ = outcome_transform.untransform(Y)
        return self.condition_on_observations(inputs, Y, noise=noise, **kwargs)

    def posterior(
        self,
        X: Tensor,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any | None = None,
        output_indices: list[int] | None = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        r"""Joint posterior over the ``q`` points of ``batch_shape x q x d`` inputs ``X``.

        Args:
            X: Inputs in the original (untransformed) space.
            observation_noise: If True, add :attr:`noise_variance` (the learned noise,
                or the mean known noise of fixed-noise models); if a
                ``batch_shape x q x k`` tensor (``k`` outputs), add it (in the
                outcome-transformed space).
            posterior_transform: Optional BoTorch posterior transform.
            output_indices: The outputs to predict, for a multi-output model (default:
                all); taken through the model's ``subset_output``.

        Returns:
            A ``GPyTorchPosterior`` of shape ``broadcast(batch, model.batch) x q x k``
            (a ``MultitaskMultivariateNormal`` of independent outputs when ``k > 1``);
            its covariance is a ``RootLinearOperator`` where the model predicts with a
            LOVE root.
        """
        if output_indices is not None and list(output_indices) != list(range(self.num_outputs)):
            return self.subset_output(list(output_indices)).posterior(
                X, observation_noise=observation_noise, posterior_transform=posterior_transform
            )
        with self._checked_call() as checks:  # one host read of the value checks
            self._check_posterior_inputs(X, observation_noise)
            check_observation_noise(observation_noise, like=X)
            self.eval()
            X_t = self._prediction_inputs(X)
            self._read_checks(checks)
            return assemble_posterior(
                self,
                self._latent_posterior(X_t),
                X_t,
                observation_noise,
                self._observation_noise_variance,
                posterior_transform,
            )

    def _observation_noise_variance(self) -> Tensor:
        r"""What ``observation_noise=True`` adds, broadcastable to the ``batch x q``
        latent mean: :attr:`noise_variance`."""
        return self.noise_variance

    def _checked_call(self) -> contextlib.AbstractContextManager[ValueChecks]:
        r"""The scope of one public call whose value checks are read from the device
        together (:func:`~streamgp.settings.deferred_value_checks`)."""
        return deferred_value_checks(join=False)

    def _read_checks(self, checks: ValueChecks) -> None:
        r"""Read the call's checks (one host read), before anything is computed from them."""
        checks.read()

    def _check_inputs(self, X: Tensor, name: str) -> None:
        r"""Raise unless ``X`` is a finite ``... x d`` tensor of the model's dtype and device."""
        raise NotImplementedError

    def _check_posterior_inputs(self, X: Tensor, observation_noise: bool | Tensor) -> None:
        r"""Validate ``posterior``'s arguments before anything is computed."""
        self._check_inputs(X, "X")

    def _prediction_inputs(self, X: Tensor) -> Tensor:
        r"""``X`` in the space the model predicts in: the frozen input transform, then
        (interpolation models) the :attr:`extrapolation` policy."""
        X_t = self.transform_inputs(X)
        if self.extrapolation is None:
            return X_t
        return self.interpolation.prediction_inputs(X_t, self.extrapolation)

    def _latent_posterior(self, X_t: Tensor) -> MultivariateNormal:
        r"""The posterior of the latent function at transformed inputs ``X_t``."""
        return self(X_t)


def check_latent_only(likelihood: Any, observation_noise: bool | Tensor) -> None:
    r"""Raise if observation noise is asked of a model whose likelihood is not Gaussian."""
    if observation_noise is not False and not isinstance(likelihood, GaussianLikelihood):
        raise ValueError(
            "observation_noise is only available with a GaussianLikelihood; with a "
            f"{type(likelihood).__name__} the posterior is over the latent f."
        )


def assemble_posterior(
    model: torch.nn.Module,
    mvn: MultivariateNormal,
    X_t: Tensor,
    observation_noise: bool | Tensor,
    noise_variance: Callable[[], Tensor],
    posterior_transform: Any | None = None,
) -> GPyTorchPosterior:
    r"""The BoTorch posterior of a latent ``mvn`` at transformed inputs ``X_t``.

    Adds observation noise (``noise_variance()`` when ``observation_noise`` is True,
    or the given ``batch x q x 1`` tensor, in the outcome-transformed space), then
    untransforms with ``model``'s outcome transform and applies ``posterior_transform``.
    A low-rank ``RootLinearOperator`` covariance (LOVE) keeps its structure
    (:func:`assemble_root_posterior`).
    """
    if isinstance(
        mvn.lazy_covariance_matrix, (RootLinearOperator, LowRankRootAddedDiagLinearOperator)
    ):
        return assemble_root_posterior(
            model, mvn, X_t, observation_noise, noise_variance, posterior_transform
        )
    noise = _observation_noise(
        observation_noise, noise_variance, mvn.mean.shape, _num_outputs(model)
    )
    outcome_tf = getattr(model, "outcome_transform", None)
    covar = mvn.lazy_covariance_matrix
    if isinstance(covar, PosteriorCovariance) and (
        outcome_tf is None or type(outcome_tf) is Standardize
    ):
        # Keep the factors: variances stay O(t) per factor column (no t x t matrix).
        mean = mvn.mean
        if noise is not None:
            covar = covar.with_noise(noise)
        if outcome_tf is not None:
            shift, scale = _standardize_coefficients(outcome_tf)
            mean = shift.unsqueeze(-1) + scale.unsqueeze(-1) * mean
            covar = covar.scaled(scale.square())
        mvn = FactoredMultivariateNormal(mean, covar)
        return _untransform(mvn, X_t, None, posterior_transform, _num_outputs(model))
    if noise is not None:
        covar = mvn.covariance_matrix + torch.diag_embed(noise)
        mvn = MultivariateNormal(mvn.mean, DenseLinearOperator(covar))
    return _untransform(mvn, X_t, outcome_tf, posterior_transform, _num_outputs(model))


def _num_outputs(model: torch.nn.Module) -> int:
    r"""How many outputs ``model`` predicts (as the last batch dim of its latent MVN)."""
    return getattr(model, "num_outputs", 1)


def _standardize_coefficients(transform: Standardize) -> tuple[Tensor, Tensor]:
    r"""``Standardize``'s means and standard deviations: scalars for one output, ``k``
    entries for ``k`` (matching a ``... x k`` batch of outputs; ``batch x k`` for a
    batched transform)."""
    if transform._m == 1:  # (a batched transform: one per batch member)
        batch = transform.means.shape[:-2]
        return transform.means.reshape(batch), transform.stdvs.reshape(batch)
    return transform.means.squeeze(-2), transform.stdvs.squeeze(-2)  # batch x k


def _observation_noise(
    observation_noise: bool | Tensor,
    noise_variance: Callable[[], Tensor],
    shape: torch.Size,
    num_outputs: int = 1,
) -> Tensor | None:
    """The noise variances to add at the ``shape`` test points, or ``None`` for none.

    ``shape`` is ``batch x t`` for one output and ``batch x k x t`` for ``k``; a tensor
    ``observation_noise`` comes in BoTorch's ``batch x t x k`` layout (``batch x t x 1``:
    the same noise for every output).
    """
    if isinstance(observation_noise, Tensor):
        if num_outputs > 1:
            return observation_noise.movedim(-1, -2).expand(shape)
        return observation_noise.squeeze(-1).expand(shape)
    if observation_noise:
        return noise_variance().expand(shape)
    return None


def _untransform(
    mvn: MultivariateNormal,
    X_t: Tensor,
    outcome_tf: OutcomeTransform | None,
    posterior_transform: Any | None,
    num_outputs: int = 1,
) -> GPyTorchPosterior:
    if num_outputs > 1:
        # k independent outputs as the last batch dimension -> BoTorch's t x k layout,
        # block diagonal and not interleaved (as ``from_independent_mvns`` builds it, which
        # BoTorch's samplers and hypervolume acquisitions expect).
        covar = BlockDiagLinearOperator(mvn.lazy_covariance_matrix, block_dim=-3)
        mvn = MultitaskMultivariateNormal(mvn.mean.mT, covar, interleaved=False)
    posterior = GPyTorchPosterior(distribution=mvn)
    if outcome_tf is not None:
        posterior = outcome_tf.untransform_posterior(posterior, X=X_t)
    if posterior_transform is not None:
        return posterior_transform(posterior=posterior, X=X_t)
    return posterior


def assemble_root_posterior(
    model: torch.nn.Module,
    mvn: MultivariateNormal,
    X_t: Tensor,
    observation_noise: bool | Tensor,
    noise_variance: Callable[[], Tensor],
    posterior_transform: Any | None = None,
) -> GPyTorchPosterior:
    r"""Like :func:`assemble_posterior`, for an ``mvn`` whose covariance is a low-rank root.

    Keeps the covariance as ``root root^T (+ diag(noise))`` so that variances stay
    ``O(k)`` and BoTorch's samplers draw ``k``-dimensional base samples (LOVE). A
    latent covariance that already carries a diagonal (``root root^T + diag(d)``, the
    exact prior variance correction of :mod:`streamgp.linalg.prior_variance`) keeps it,
    with the observation noise added to it. A ``Standardize`` outcome transform scales
    the root itself, because its generic untransform would wrap the root in a product
    operator and lose that structure.
    """
    mean, covar = mvn.mean, mvn.lazy_covariance_matrix
    latent_diagonal = None
    if isinstance(covar, LowRankRootAddedDiagLinearOperator):
        latent_diagonal = covar._diag_tensor.diagonal().expand(mean.shape)
        covar = covar._linear_op
    root = covar.root.to_dense()
    noise = _observation_noise(observation_noise, noise_variance, mean.shape, _num_outputs(model))
    if latent_diagonal is not None:
        noise = latent_diagonal if noise is None else latent_diagonal + noise
    outcome_tf = getattr(model, "outcome_transform", None)
    if type(outcome_tf) is Standardize:
        shift, scale = _standardize_coefficients(outcome_tf)
        mean = shift.unsqueeze(-1) + scale.unsqueeze(-1) * mean
        root = scale[..., None, None] * root
        noise = None if noise is None else noise * scale.square().unsqueeze(-1)
        outcome_tf = None
    if noise is None:
        covar = RootLinearOperator(root)
    else:
        covar = LowRankRootAddedDiagLinearOperator(
            LowRankRootLinearOperator(root), DiagLinearOperator(noise)
        )
    mvn = MultivariateNormal(mean, covar)
    return _untransform(mvn, X_t, outcome_tf, posterior_transform, _num_outputs(model))
