r"""The streaming protocol's one learner: any registered model, run as its recipe says.

A :class:`Learner` pretrains its model on the first batch, then absorbs each arrival and
trains for one step (:meth:`Learner.step`), and predicts the test set in chunks
(:meth:`Learner.predict`). What differs between models is data in the model registry
(:class:`~streamgp.models.registry.StreamRecipe`): how to build the model under the
protocol's settings, whether the protocol's Adam trains it or the model trains itself,
one model per output or one for all, and where the learned input projection goes.
:data:`STREAM_MODELS` and :data:`CLASSIFICATION_MODELS` are the registry's names that
the protocol runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import gpytorch
import torch
from botorch.models.model import Model
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor

from streamgp.interpolation.grid import GridExtrapolationWarning
from streamgp.loops.stream.config import StreamConfig
from streamgp.models import LearnedProjection
from streamgp.models.registry import get_model_spec, registered_models

__all__ = ["CLASSIFICATION_MODELS", "PREDICT_CHUNK", "STREAM_MODELS", "Learner"]

#: Rows per joint posterior when predicting the test set (its covariance is
#: ``chunk x chunk``; only the marginal variances are used).
PREDICT_CHUNK = 256

#: Models the protocol runs (regression), in the registry's order.
STREAM_MODELS = registered_models(loop="stream")
#: Those with a classification variant: Dirichlet targets with fixed noise, or O-SVGP's
#: Bernoulli likelihood on binary labels.
CLASSIFICATION_MODELS = registered_models("classification", loop="stream")


def _uses_projection(config: StreamConfig, dim: int) -> bool:
    return config.projection == "on" or (config.projection == "auto" and dim > 3)


def _adam(groups: list[dict[str, Any]], lr: float) -> torch.optim.Adam:
    # A group's optional "lr_ratio" scales the learning rate (the projection's).
    return torch.optim.Adam(
        [{"params": g["params"], "lr": lr * g.get("lr_ratio", 1.0)} for g in groups if g["params"]]
    )


def _exact_solves(model: Model):
    r"""Cholesky solves at every size for a gpytorch exact GP (gpytorch switches to
    CG/Lanczos above 800 points by default, which would make the exact baseline
    approximate and noisy); streamgp's models do their own algebra."""
    if hasattr(model, "fit_objective"):
        return ExitStack()
    return gpytorch.settings.max_cholesky_size(10**7)


class Learner:
    r"""One registered model under the protocol: pretrain, absorb + one step, predict.

    Targets are ``n x C``: ``C = 1`` for regression, the Dirichlet targets of ``C``
    classes for classification (with ``Yvar`` their fixed noise variances), or ``n x 1``
    labels in ``{0, 1}`` for O-SVGP's Bernoulli classifier.

    With the protocol's projection on (``config.projection``; ``"auto"``: when
    ``d > 3``) and a recipe that takes it in front of the model (WISKI), each arrival's
    loss is the marginal likelihood of all data with the *old* statistics fixed and the
    new points' features differentiable in the projection (the WISKI paper's eq. 18);
    one Adam step updates kernel, noise and projection; then the new points are absorbed
    with the updated projection.

    Args:
        name: A name in :data:`STREAM_MODELS`.
        X: ``n x d`` pretraining inputs.
        Y: ``n x C`` pretraining targets.
        Yvar: ``n x C`` fixed noise variances (Dirichlet classification) or ``None``.
        config: Protocol settings.
        classification: Whether the targets are a classification task's.
        pretrain: Whether to pretrain (``False``: the learner only takes a saved state).

    Example:
        >>> X = torch.rand(40, 2, dtype=torch.float64)
        >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
        >>> learner = Learner("wiski", X, Y, None, StreamConfig(pretrain_steps=5, grid_size=8))
        >>> learner.step(X[:1], Y[:1])
        >>> learner.predict(X[:3])[0].shape, learner.model.num_train
        (torch.Size([3, 1]), 41)
    """

    def __init__(
        self,
        name: str,
        X: Tensor,
        Y: Tensor,
        Yvar: Tensor | None,
        config: StreamConfig,
        *,
        classification: bool = False,
        pretrain: bool = True,
    ) -> None:
        spec = get_model_spec(name)
        if spec.stream is None:
            choices = list(registered_models(loop="stream"))
            raise ValueError(f"model must be one of {choices}, got {name!r}.")
        if Yvar is not None and not spec.supports("fixed_noise"):
            raise ValueError(f"{name}: fixed noise variances are not supported.")
        self.name, self.spec, self.recipe, self.config = name, spec, spec.stream, config
        self.options = self.recipe.resolve_options(name, config.model_options.get(name))
        #: Largest number of observations the learner accepts (``None``: unbounded).
        self.capacity = config.exact_max if self.recipe.capped else None
        dim = X.shape[-1]
        project = self.recipe.projection != "none" and _uses_projection(config, dim)
        self.protocol = {
            "pretrain_steps": config.pretrain_steps if pretrain else 0,
            "pretrain_lr": config.pretrain_lr,
            "lr": config.lr,
            "grid_size": config.grid_size,
            "grid_margin": config.grid_margin,
            "num_inducing": config.num_inducing,
            "inducing": config.inducing,
            "oips_rho": config.oips_rho,
            "project": project,
            "projection_dim": config.projection_dim,
            "classification": classification,
        }
        self.projection = None
        if project and self.recipe.projection == "features":
            self.projection = LearnedProjection(dim, config.projection_dim).to(X)
        outputs = Y.shape[-1] if self.recipe.per_output else 1
        self._columns = [slice(c, c + 1) for c in range(outputs)] if outputs > 1 else [slice(None)]
        # Models without ``observe`` are rebuilt on all data at each arrival.
        self._data = (X, Y, Yvar)
        self.models = self._build(X, Y, Yvar, reuse=None)
        groups = self._parameter_groups()
        if self.recipe.pretraining == "adam":
            self._pretrain(groups, X, Y, Yvar, config.pretrain_steps if pretrain else 0)
        if self.recipe.after_pretraining is not None:
            self.models = [
                self.recipe.after_pretraining(
                    model, X, Y, Yvar, protocol=self.protocol, **self.options
                )
                for model in self.models
            ]
        for model in self.models:
            model.eval()
        self.optimizer = _adam(groups, config.lr) if self.recipe.online == "adam" else None

    @property
    def model(self) -> Model:
        r"""The model (the first output's, when there is one per output)."""
        return self.models[0]

    # ------------------------------------------------------------------ helpers
    def _features(self, X: Tensor) -> Tensor:
        return X if self.projection is None else self.projection(X)

    def _build(
        self, X: Tensor, Y: Tensor, Yvar: Tensor | None, reuse: list[Model] | None
    ) -> list[Model]:
        features = self._features(X)
        return [
            self.recipe.build(
                features,
                Y[:, column],
                None if Yvar is None else Yvar[:, column],
                protocol=self.protocol,
                reuse=None if reuse is None else reuse[c],
                **self.options,
            )
            for c, column in enumerate(self._columns)
        ]

    def _parameter_groups(self) -> list[dict[str, Any]]:
        # Parameters named "projection" (inside a kernel) and the protocol's own
        # projection learn at ``projection_lr_ratio`` of the others' rate.
        seen: set[int] = set()
        plain, projection = [], []
        for model in self.models:
            for name, parameter in model.named_parameters():
                if not parameter.requires_grad or id(parameter) in seen:
                    continue
                seen.add(id(parameter))
                (projection if "projection" in name else plain).append(parameter)
        if self.projection is not None:
            projection += list(self.projection.parameters())
        ratio = self.config.projection_lr_ratio
        return [{"params": plain}, {"params": projection, "lr_ratio": ratio}]

    def _loss(self, statistics: Callable[[int, Model], Any] | None = None) -> Tensor:
        r"""The negative objective summed over the models (per datum, with priors)."""
        total = 0.0
        for c, model in enumerate(self.models):
            mll = self.spec.mll_class(model.likelihood, model)
            if statistics is not None:  # eq. 18: other statistics than the model's own
                total = total - mll(statistics=statistics(c, model))
            elif hasattr(model, "compute_custom_loss"):  # streamgp's models: their objective
                total = total + model.compute_custom_loss(mll)
            else:  # a gpytorch exact GP
                model.train()
                output = model(*model.train_inputs)
                total = total - mll(output, model.train_targets).sum()
        return total

    def _adam_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        with _exact_solves(self.model):
            self._loss().backward()
        optimizer.step()
        for model in self.models:
            model.eval()

    def _pretrain(self, groups, X: Tensor, Y: Tensor, Yvar: Tensor | None, steps: int) -> None:
        # With a projection in front of the model, the weights of all pretraining points
        # follow it (batch setting), so the models are rebuilt from the features each step.
        optimizer = _adam(groups, self.config.pretrain_lr)
        for _ in range(steps):
            if self.projection is not None:
                self.models = self._build(X, Y, Yvar, reuse=self.models)
            self._adam_step(optimizer)
        if self.projection is not None:
            self.projection.calibrate(X).eval()
            with torch.no_grad():
                self.models = self._build(X, Y, Yvar, reuse=self.models)

    # ------------------------------------------------------------------ protocol
    def streaming_loss(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> Tensor:
        r"""Eq. 18: the old statistics fixed, the new rows' features differentiable."""
        features = self._features(X)

        def statistics(c: int, model: Model) -> Any:
            column = self._columns[c]
            noise = None if Yvar is None else Yvar[:, column]
            return model.statistics_with(features, Y[:, column], noise)

        return self._loss(statistics)

    def step(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        r"""Absorb a batch and train for one step (as the recipe says)."""
        if self.projection is not None:
            self.optimizer.zero_grad()
            self.streaming_loss(X, Y, Yvar).backward()
            self.optimizer.step()
            with torch.no_grad():
                X = self._features(X)
            self._observe(X, Y, Yvar)
            return
        if self.spec.incremental:
            if self.recipe.online == "frozen":
                with torch.no_grad():
                    self._observe(X, Y, Yvar)
            else:
                self._observe(X, Y, Yvar)
        else:
            old_X, old_Y, old_Yvar = self._data
            self._data = (
                torch.cat([old_X, X]),
                torch.cat([old_Y, Y]),
                None if Yvar is None else torch.cat([old_Yvar, Yvar]),
            )
            self.models = self._build(*self._data, reuse=self.models)
        if self.optimizer is not None:
            self._adam_step(self.optimizer)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        r"""Everything needed to continue the stream (with :meth:`load_state_dict`).

        Tensors, numbers and strings only (``torch.load(path, weights_only=True)`` reads
        it): each model's own ``checkpoint()`` (or, for a model rebuilt on all data, the
        data and its ``state_dict()``), the projection and the optimizer's state.
        """
        incremental = self.spec.incremental
        return {
            "model": self.name,
            "models": [
                model.checkpoint() if incremental else model.state_dict() for model in self.models
            ],
            "data": None if incremental else self._data,
            "projection": None if self.projection is None else self.projection.state_dict(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        r"""Continue the stream saved by :meth:`state_dict` (a learner of the same model,
        settings and first batch)."""
        if state.get("model") != self.name or len(state["models"]) != len(self.models):
            raise ValueError(
                f"the state is of a {state.get('model')!r} learner with "
                f"{len(state['models'])} models; this is a {self.name!r} learner with "
                f"{len(self.models)}."
            )
        if self.projection is not None:
            self.projection.load_state_dict(state["projection"])
        if self.spec.incremental:
            for model, checkpoint in zip(self.models, state["models"], strict=True):
                model.restore(checkpoint)
        else:
            self._data = state["data"]
            self.models = self._build(*self._data, reuse=self.models)
            for model, saved in zip(self.models, state["models"], strict=True):
                model.load_state_dict(saved)
        for model in self.models:
            model.eval()
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    @classmethod
    def restored(
        cls,
        state: dict[str, Any],
        X: Tensor,
        Y: Tensor,
        Yvar: Tensor | None,
        config: StreamConfig,
        *,
        classification: bool = False,
    ) -> Learner:
        r"""The learner saved in ``state``, rebuilt on its first batch without pretraining."""
        learner = cls(
            state["model"],
            X,
            Y,
            Yvar,
            config,
            classification=classification,
            pretrain=False,
        )
        learner.load_state_dict(state)
        return learner

    def _observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None) -> None:
        for model, column in zip(self.models, self._columns, strict=True):
            model.observe(X, Y[:, column], None if Yvar is None else Yvar[:, column])

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Marginal predictive ``(mean, variance)``, each ``n x C``: of ``y`` (noise
        included) for regression with a learned noise, of the latent ``f`` otherwise."""
        means, variances = [], []
        with torch.no_grad(), _exact_solves(self.model), warnings.catch_warnings():
            # Test points may lie outside a grid fixed by the pretraining data: they are
            # predicted at the nearest point of the grid box, as the protocol intends.
            warnings.simplefilter("ignore", GridExtrapolationWarning)
            for start in range(0, len(X), PREDICT_CHUNK):
                features = self._features(X[start : start + PREDICT_CHUNK])
                # A joint posterior over the chunk: keep the marginals. (Batches of
                # b x 1 x d inputs would avoid the chunk covariance, but broadcast a
                # multi-output exact GP's caches to b copies.)
                posteriors = [
                    model.posterior(
                        features, observation_noise=isinstance(model.likelihood, GaussianLikelihood)
                    )
                    for model in self.models
                ]
                means.append(torch.cat([p.mean for p in posteriors], -1))
                variances.append(torch.cat([p.variance for p in posteriors], -1))
        return torch.cat(means), torch.cat(variances)
