r"""The models under the streaming protocol: one learner per model name.

A learner pretrains its model on the first batch, then absorbs each arrival and takes
one optimizer step (:meth:`OnlineLearner.step`), and predicts the test set in chunks
(:meth:`OnlineLearner.predict`). :data:`LEARNERS` (regression) and :data:`CLASSIFIERS`
are the registry of models the protocol runs; :data:`STREAM_MODELS` and
:data:`CLASSIFICATION_MODELS` are their names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import gpytorch
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import BernoulliLikelihood, GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from streamgp.inducing import OnlineInducingPointSelector
from streamgp.loops.stream.config import StreamConfig
from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models import DecoupledSVGP, LocalGP, OnlineSGPR, OnlineSoftKIGP, OnlineSVGP, WiskiGP
from streamgp.models.projection import LearnedProjection, ProjectedKernel
from streamgp.models.utils import transform_new_data

#: Rows per joint posterior when predicting the test set (its covariance is
#: ``chunk x chunk``; only the marginal variances are used).
PREDICT_CHUNK = 256


def _uses_projection(config: StreamConfig, dim: int) -> bool:
    return config.projection == "on" or (config.projection == "auto" and dim > 3)


def _protocol_mean() -> dict[str, Any]:
    r"""The WISKI paper's zero prior mean, for the models whose default is a learned
    constant: the protocol standardises every data set itself, so the streaming results
    stay those of the paper's setup."""
    return {"mean_module": ZeroMean()}


def _rbf_ard(dim: int, batch_shape: torch.Size | None = None) -> ScaleKernel:
    # The paper's RBF-ARD kernel, with gpytorch's softplus-transformed constraints so
    # plain Adam steps cannot leave the parameters' domain.
    batch_shape = torch.Size() if batch_shape is None else batch_shape
    return ScaleKernel(
        RBFKernel(ard_num_dims=dim, batch_shape=batch_shape), batch_shape=batch_shape
    )


def _oips(config: StreamConfig, kernel) -> OnlineInducingPointSelector | None:
    # OIPS on the model's own kernel, so acceptance follows the learned lengthscales.
    if config.inducing != "oips":
        return None
    return OnlineInducingPointSelector(kernel, config.oips_rho, max_size=config.num_inducing)


def _adam(groups: list[dict[str, Any]], lr: float) -> torch.optim.Adam:
    # A group's optional "lr_ratio" scales the learning rate (the projection's).
    return torch.optim.Adam(
        [{"params": g["params"], "lr": lr * g.get("lr_ratio", 1.0)} for g in groups if g["params"]]
    )


class OnlineLearner(ABC):
    r"""One model under the protocol: pretrain, absorb + one step, predict.

    Targets are ``n x C``: ``C = 1`` for regression, the Dirichlet targets of ``C``
    classes for classification (with ``Yvar`` their fixed noise variances), or
    ``n x 1`` labels in ``{0, 1}`` for O-SVGP's Bernoulli classifier.

    Args:
        X: ``n x d`` pretraining inputs.
        Y: ``n x C`` pretraining targets.
        Yvar: ``n x C`` fixed noise variances (Dirichlet classification) or ``None``.
        config: Protocol settings.
    """

    #: Largest number of observations the learner accepts (``None``: unbounded).
    capacity: int | None = None

    @abstractmethod
    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None: ...

    @abstractmethod
    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        r"""Absorb a batch and take one optimizer step."""

    @abstractmethod
    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Marginal predictive ``(mean, variance)``, each ``n x C``: of ``y`` (noise
        included) for regression, of the latent ``f`` for classification."""


def _chunked(X: Tensor, predict_one) -> tuple[Tensor, Tensor]:
    means, variances = [], []
    with torch.no_grad():
        for start in range(0, len(X), PREDICT_CHUNK):
            mean, variance = predict_one(X[start : start + PREDICT_CHUNK])
            means.append(mean)
            variances.append(variance)
    return torch.cat(means), torch.cat(variances)


def _marginals(posterior) -> tuple[Tensor, Tensor]:
    # A joint posterior over a chunk of test points: keep the marginals. (Batches of
    # b x 1 x d inputs would avoid the chunk covariance, but broadcast a multi-output
    # exact GP's caches to b copies.)
    return posterior.mean, posterior.variance


class WiskiLearner(OnlineLearner):
    r"""WISKI: one ``WiskiGP`` per output, optionally on a learned projection (eq. 18).

    Each arrival: the loss is the SKI marginal likelihood of all data with the *old*
    statistics fixed and the new points' interpolation weights differentiable in the
    projection parameters; one Adam step updates kernel, noise and projection; then
    the new points are absorbed with the updated projection. Without a projection this
    is ``observe`` followed by one step on the Woodbury marginal likelihood.
    """

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None:
        self.config = config
        dim = X.shape[-1]
        use_projection = _uses_projection(config, dim)
        self.projection = (
            LearnedProjection(dim, config.projection_dim).to(X) if use_projection else None
        )
        feature_dim = config.projection_dim if use_projection else dim
        self.fixed_noise = Yvar is not None
        self.num_outputs = Y.shape[-1]
        self.covar_modules = [_rbf_ard(feature_dim).to(X) for _ in range(self.num_outputs)]
        # A transformed noise constraint: plain Adam steps keep the noise positive.
        self.likelihoods = (
            None if self.fixed_noise else [GaussianLikelihood().to(X) for _ in self.covar_modules]
        )
        self.grid_bounds = torch.full((2, feature_dim), 1.0 + config.grid_margin).to(X)
        self.grid_bounds[0] = -self.grid_bounds[0]
        groups = self._parameter_groups()

        # Pretraining: with a projection the weights of all pretraining points follow
        # phi (batch setting), so the models are rebuilt from the features each step.
        optimizer = _adam(groups, config.pretrain_lr)
        self.models = self._build(X, Y, Yvar)
        for _ in range(config.pretrain_steps):
            optimizer.zero_grad()
            if self.projection is not None:
                self.models = self._build(X, Y, Yvar)
            self._loss(self.models).backward()
            optimizer.step()
        if self.projection is not None:
            self.projection.calibrate(X).eval()
            with torch.no_grad():
                self.models = self._build(X, Y, Yvar)
        for model in self.models:
            model.eval()
        self.optimizer = _adam(groups, config.lr)

    def _parameter_groups(self) -> list[dict[str, Any]]:
        params = [p for module in self.covar_modules for p in module.parameters()]
        params += [p for lik in self.likelihoods or [] for p in lik.parameters()]
        groups = [{"params": params}]
        if self.projection is not None:
            groups.append(
                {
                    "params": list(self.projection.parameters()),
                    "lr_ratio": self.config.projection_lr_ratio,
                }
            )
        return groups

    def _features(self, X: Tensor) -> Tensor:
        if self.projection is None:
            return X
        return self.projection(X)

    def _build(self, X: Tensor, Y: Tensor, Yvar: Tensor | None) -> list[WiskiGP]:
        features = self._features(X)
        models = []
        for c, covar_module in enumerate(self.covar_modules):
            models.append(
                WiskiGP(
                    features,
                    Y[:, c : c + 1],
                    None if Yvar is None else Yvar[:, c : c + 1],
                    grid_size=self.config.grid_size,
                    grid_bounds=self.grid_bounds,
                    covar_module=covar_module,
                    likelihood=None if self.likelihoods is None else self.likelihoods[c],
                    # Fixed-noise Dirichlet targets are far from zero mean: standardize
                    # them (frozen after pretraining) since WiskiGP has a zero prior mean.
                    outcome_transform=Standardize(m=1) if self.fixed_noise else None,
                    **_protocol_mean(),
                )
            )
        return models

    @staticmethod
    def _loss(models: Sequence[WiskiGP]) -> Tensor:
        return -sum(WoodburyMarginalLogLikelihood(m.likelihood, m)() for m in models)

    def _streaming_loss(self, X: Tensor, Y: Tensor, Yvar: Tensor | None) -> Tensor:
        r"""Eq. 18: old statistics frozen, new interpolation weights differentiable."""
        features = self._features(X)
        losses = []
        for c, model in enumerate(self.models):
            y = Y[:, c : c + 1]
            noise = None if Yvar is None else Yvar[:, c : c + 1]
            # The model's own transforms and statistics update rule; nothing is mutated.
            _, y_t, noise_t = transform_new_data(model, features, y, noise)
            statistics = model.training_statistics().add(
                model.interpolation.weights(features),
                y_t.squeeze(-1),
                None if noise_t is None else noise_t.squeeze(-1),
            )
            mll = WoodburyMarginalLogLikelihood(model.likelihood, model)
            losses.append(-mll(statistics=statistics))
        return sum(losses)

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        if self.projection is None:
            for c, model in enumerate(self.models):
                model.observe(X, Y[:, c : c + 1], None if Yvar is None else Yvar[:, c : c + 1])
            self.optimizer.zero_grad()
            self._loss(self.models).backward()
            self.optimizer.step()
            return
        self.optimizer.zero_grad()
        self._streaming_loss(X, Y, Yvar).backward()
        self.optimizer.step()
        with torch.no_grad():
            features = self._features(X)
        for c, model in enumerate(self.models):
            model.observe(features, Y[:, c : c + 1], None if Yvar is None else Yvar[:, c : c + 1])

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        def one(X_chunk: Tensor) -> tuple[Tensor, Tensor]:
            features = self._features(X_chunk)
            features = torch.maximum(
                torch.minimum(features, self.grid_bounds[1]), self.grid_bounds[0]
            )
            results = [
                _marginals(m.posterior(features, observation_noise=not self.fixed_noise))
                for m in self.models
            ]
            return torch.cat([r[0] for r in results], -1), torch.cat([r[1] for r in results], -1)

        return _chunked(X, one)


#: Exact Cholesky solves at every size (gpytorch switches to CG/Lanczos above 800
#: points by default, which would make the "exact" baseline approximate and noisy).
def _exact_solves():
    return gpytorch.settings.max_cholesky_size(10**7)


class ExactLearner(OnlineLearner):
    r"""Incremental exact GP: ``SingleTaskGP`` on all data so far, one Adam step per arrival.

    The kernel, mean and (learned) likelihood modules persist across rebuilds, so the
    Adam state carries over; ``C > 1`` outputs form one batched model (one GP per class,
    each with its own hyperparameters).
    """

    #: Whether the model learns WISKI's input projection (``exact-projected``).
    projected: bool = False

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None:
        self.config = config
        self.capacity = config.exact_max
        num_outputs = Y.shape[-1]
        batch = torch.Size([num_outputs]) if num_outputs > 1 else torch.Size()
        dim = X.shape[-1]
        projection = None
        if self.projected and _uses_projection(config, dim):
            projection = LearnedProjection(dim, config.projection_dim).to(X)
            dim = config.projection_dim
        self.covar_module = _rbf_ard(dim, batch).to(X)
        if projection is not None:
            self.covar_module = ProjectedKernel(self.covar_module, projection)
        self.mean_module = ConstantMean(batch_shape=batch).to(X)
        self.likelihood = None if Yvar is not None else GaussianLikelihood().to(X)
        self.X, self.Y, self.Yvar = X, Y, Yvar
        params = [p for name, p in self.covar_module.named_parameters() if "projection" not in name]
        params += list(self.mean_module.parameters())
        params += [] if self.likelihood is None else list(self.likelihood.parameters())
        groups = [{"params": params}]
        if projection is not None:
            groups.append(
                {"params": list(projection.parameters()), "lr_ratio": config.projection_lr_ratio}
            )
        optimizer = _adam(groups, config.pretrain_lr)
        self._rebuild()
        for _ in range(config.pretrain_steps):
            self._adam_step(optimizer)
        if projection is not None:
            # As WISKI: batch statistics while pretraining, then the running statistics
            # of the pretraining set (a single arrival has no batch statistics).
            projection.calibrate(X)
            self.covar_module.freeze_normalization = True
            self.covar_module.train(False)
        self.optimizer = _adam(groups, config.lr)

    def _rebuild(self) -> None:
        self.model = SingleTaskGP(
            self.X,
            self.Y,
            self.Yvar,
            covar_module=self.covar_module,
            mean_module=self.mean_module,
            likelihood=self.likelihood,
            outcome_transform=None,
        )

    def _adam_step(self, optimizer: torch.optim.Optimizer) -> None:
        model = self.model.train()
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        optimizer.zero_grad()
        with _exact_solves():
            output = model(*model.train_inputs)
            (-mll(output, model.train_targets).sum()).backward()
        optimizer.step()
        model.eval()

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        self.X, self.Y = torch.cat([self.X, X]), torch.cat([self.Y, Y])
        if Yvar is not None:
            self.Yvar = torch.cat([self.Yvar, Yvar])
        self._rebuild()
        self._adam_step(self.optimizer)

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        noisy = self.likelihood is not None
        self.model.eval()
        with _exact_solves():
            return _chunked(
                X, lambda Xc: _marginals(self.model.posterior(Xc, observation_noise=noisy))
            )


class ProjectedExactLearner(ExactLearner):
    r"""Exact GP on WISKI's features: the same learned projection (when WISKI uses one),
    recomputed for all data at every step (the WISKI paper's exact baseline, section 5.1).

    It separates the two approximations WISKI makes in ``d > 3``: against ``exact`` it
    shows the cost of the projection, against ``wiski`` that of the grid interpolation.
    """

    projected = True


class OSVGPLearner(OnlineLearner):
    r"""O-SVGP (Gaussian, or Bernoulli for ``n x 1`` binary labels), one step per batch."""

    #: Bernoulli (probit) likelihood on ``{0, 1}`` labels instead of a Gaussian one.
    bernoulli = False

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None:
        if Yvar is not None:
            raise ValueError("osvgp: fixed noise variances are not supported.")
        covar_module = _rbf_ard(X.shape[-1]).to(X)
        selector = _oips(config, covar_module)
        self.model = OnlineSVGP(
            X,
            Y,
            num_inducing=min(config.num_inducing, len(X)),
            covar_module=covar_module,
            inducing_selector=selector,
            likelihood=BernoulliLikelihood() if self.bernoulli else GaussianLikelihood(),
            beta=config.beta,
            num_steps=1,
            num_init_steps=config.pretrain_steps,
            lr=config.pretrain_lr,
            outcome_transform=None,  # the protocol standardises the data
        )
        # The online learning rate (setting it starts a fresh Adam for the stream).
        self.model.optimizer_kwargs = {"lr": config.lr}

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        self.model.observe(X, Y)

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        noisy = not self.bernoulli
        return _chunked(X, lambda Xc: _marginals(self.model.posterior(Xc, observation_noise=noisy)))


class OSVGPClassifierLearner(OSVGPLearner):
    r"""O-SVGP with a Bernoulli likelihood (the paper's classification baseline)."""

    bernoulli = True


class OSGPRLearner(OnlineLearner):
    r"""O-SGPR: pretrained with ``pretrain_steps`` steps, then one step per batch."""

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None:
        if Yvar is not None:
            raise ValueError("osgpr: fixed noise variances are not supported.")
        covar_module = _rbf_ard(X.shape[-1]).to(X)
        selector = _oips(config, covar_module)
        self.model = OnlineSGPR(
            X,
            Y,
            num_inducing=None if selector is not None else config.num_inducing,
            covar_module=covar_module,
            inducing_selector=selector,
            likelihood=GaussianLikelihood(),
            steps_per_batch=config.pretrain_steps,
            lr=config.pretrain_lr,
            outcome_transform=None,  # the protocol standardises the data
            **_protocol_mean(),
        )
        self.model.steps_per_batch = 1
        self.model.lr = config.lr

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        self.model.observe(X, Y)

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        return _chunked(X, lambda Xc: _marginals(self.model.posterior(Xc, observation_noise=True)))


class SVDGPLearner(OnlineLearner):
    r"""SVDGP (decoupled mean and covariance bases), one minibatch step per batch.

    Built with ``DecoupledSVGP``'s defaults for the initial bases (greedy variance
    reduction for the covariance basis, which the mean basis extends with further
    pretraining inputs) and its closed-form warm start of ``(a, L)`` around the
    ``pretrain_steps`` Adam steps at ``pretrain_lr``. Streaming uses the protocol's
    constant learning rate ``lr`` (no decay schedule), like the other models.
    """

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None:
        if Yvar is not None:
            raise ValueError("svdgp: fixed noise variances are not supported.")
        self.model = DecoupledSVGP(
            X,
            Y,
            max_mean_basis=config.svdgp_mean_basis,
            max_covar_basis=config.svdgp_covar_basis,
            basis_increment=config.svdgp_minibatch,
            covar_module=_rbf_ard(X.shape[-1]),
            likelihood=GaussianLikelihood(),
            minibatch_size=config.svdgp_minibatch,
            kl_columns=config.svdgp_kl_columns,
            num_steps=1,
            num_init_steps=config.pretrain_steps,
            lr=config.pretrain_lr,
            lr_decay=0.0,
            seed=int(torch.randint(2**31 - 1, ()).item()),
            outcome_transform=None,  # the protocol standardises the data
        )
        # The online learning rate (setting it starts a fresh Adam for the stream).
        self.model.optimizer_kwargs = {"lr": config.lr}

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        self.model.observe(X, Y)

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        return _chunked(X, lambda Xc: _marginals(self.model.posterior(Xc, observation_noise=True)))


class LocalLearner(OnlineLearner):
    r"""Local GPs with hyperparameters of an exact GP pretrained on the 5% (then fixed)."""

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None:
        if Yvar is not None:
            raise ValueError("local: fixed noise variances are not supported.")
        exact = ExactLearner(X, Y, None, config)
        self.model = LocalGP(
            X,
            Y,
            covar_module=exact.covar_module,
            mean_module=exact.mean_module,
            likelihood=exact.likelihood,
            w_gen=config.local_w_gen,
            n_max=config.num_inducing,
            outcome_transform=None,  # the protocol standardises the data
        )

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        with torch.no_grad():
            self.model.observe(X, Y)

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        return _chunked(X, lambda Xc: _marginals(self.model.posterior(Xc, observation_noise=True)))


class SoftKILearner(OnlineLearner):
    r"""Online SoftKI on all inputs (no projection): one ``OnlineSoftKIGP`` per output.

    Pretraining runs SoftKI's Algorithm 1 (minibatch Adam on the Hutchinson pseudo-loss,
    ``pretrain_steps`` epochs at ``pretrain_lr``) on the pretraining set, learning
    ``num_inducing`` interpolation points, the temperature, the kernel and the noise;
    points and temperature are then frozen. Each arrival is ``observe`` followed by one
    Adam step on the exact SoftKI marginal likelihood from the statistics, as for WISKI
    without a projection: both cost the same at every ``n``.
    """

    def __init__(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, config: StreamConfig) -> None:
        self.fixed_noise = Yvar is not None
        pretrain = {"lr": config.pretrain_lr}
        self.models = [
            OnlineSoftKIGP(
                X,
                Y[:, c : c + 1],
                None if Yvar is None else Yvar[:, c : c + 1],
                likelihood=None if self.fixed_noise else GaussianLikelihood().to(X),
                covar_module=_rbf_ard(X.shape[-1]).to(X),
                # As for WISKI: Dirichlet targets are far from zero mean.
                outcome_transform=Standardize(m=1) if self.fixed_noise else None,
                **_protocol_mean(),
                num_inducing=min(config.num_inducing, len(X)),
                pretrain_epochs=config.pretrain_steps,
                pretrain_options=pretrain,
            ).eval()
            for c in range(Y.shape[-1])
        ]
        params = [p for model in self.models for p in model.parameters() if p.requires_grad]
        self.optimizer = _adam([{"params": params}], config.lr)

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        for c, model in enumerate(self.models):
            model.observe(X, Y[:, c : c + 1], None if Yvar is None else Yvar[:, c : c + 1])
        self.optimizer.zero_grad()
        WiskiLearner._loss(self.models).backward()
        self.optimizer.step()

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        def one(X_chunk: Tensor) -> tuple[Tensor, Tensor]:
            results = [
                _marginals(m.posterior(X_chunk, observation_noise=not self.fixed_noise))
                for m in self.models
            ]
            return torch.cat([r[0] for r in results], -1), torch.cat([r[1] for r in results], -1)

        return _chunked(X, one)


LEARNERS: dict[str, type[OnlineLearner]] = {
    "wiski": WiskiLearner,
    "softki": SoftKILearner,
    "exact": ExactLearner,
    "exact-projected": ProjectedExactLearner,
    "osvgp": OSVGPLearner,
    "osgpr": OSGPRLearner,
    "svdgp": SVDGPLearner,
    "local": LocalLearner,
}
#: Classification variants: Dirichlet targets for wiski/softki/exact, Bernoulli for osvgp.
CLASSIFIERS: dict[str, type[OnlineLearner]] = {
    "wiski": WiskiLearner,
    "softki": SoftKILearner,
    "exact": ExactLearner,
    "exact-projected": ProjectedExactLearner,
    "osvgp": OSVGPClassifierLearner,
}
CLASSIFICATION_MODELS = tuple(CLASSIFIERS)
#: Models the protocol can run (regression); classification: :data:`CLASSIFICATION_MODELS`.
STREAM_MODELS = tuple(LEARNERS)
