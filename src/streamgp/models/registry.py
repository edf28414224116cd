r"""The model registry: every model the loops, the CLI and Ax build by name.

A :class:`ModelSpec` is one entry: the model class, what it can do (its
:data:`CAPABILITIES`), the options the loops may pass with their defaults, and, where
the generic rules do not fit, how to build it on an initial design and how to refit
it. ``streamgp bo``, ``streamgp active``, the loops' :class:`~streamgp.loops.Surrogate`,
the streaming protocol and the Ax bridge all read this one table, so adding a model is
its module, one :func:`register_model` call and its tests.

The generic rules, which most entries use unchanged:

- **build**: ``model_class(train_X, train_Y, train_Yvar, covar_module=..., **options)``
  in eval mode (``covar_module`` only when the loop has a kernel factory);
- **update**: ``model.observe(X, Y, Yvar)`` when the class has ``observe``; otherwise the
  adapter keeps every observation and rebuilds the model on all of them, warm-started
  from the previous hyperparameters (what a BoTorch user does with ``SingleTaskGP``);
- **refit**: :func:`refit_marginal_likelihood` (BoTorch's ``fit_gpytorch_mll`` on the
  entry's ``mll_class``, after ``restandardize()`` where the model has it and the
  ``restandardize`` option is on);
- **state**: ``model.checkpoint()`` / ``restore()`` when the class has them; otherwise
  the kept data and the hyperparameters.

Example:
    >>> import torch
    >>> from streamgp.models.registry import get_model_spec, registered_models
    >>> spec = get_model_spec("wiski")
    >>> spec.model_class.__name__, spec.supports("constant_time_update")
    ('WiskiGP', True)
    >>> "wiski-additive" in registered_models("high_dim")
    True
    >>> X = torch.rand(6, 2, dtype=torch.float64)
    >>> model = spec.make(X, X.sum(-1, keepdim=True), grid_size=12)
    >>> model.num_train
    6
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor
from torch.quasirandom import SobolEngine

from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models.additive_wiski import AdditiveWiskiGP
from streamgp.models.kissgp import KissGP
from streamgp.models.local_gp import LocalGP
from streamgp.models.online_softki import OnlineSoftKIGP
from streamgp.models.osgpr import OnlineSGPR
from streamgp.models.osvgp import OnlineSVGP
from streamgp.models.softki import SoftKIGP
from streamgp.models.svdgp import DecoupledSVGP
from streamgp.models.wiski import WiskiGP
from streamgp.utils.validation import check_count, check_positive_number

__all__ = [
    "CAPABILITIES",
    "MAX_PRODUCT_GRID_DIM",
    "ModelSpec",
    "choose_model",
    "get_model_spec",
    "refit_marginal_likelihood",
    "register_model",
    "registered_models",
    "unregister_model",
]

#: What an entry can declare it does, and what each means.
CAPABILITIES: Mapping[str, str] = MappingProxyType(
    {
        "fixed_noise": "takes known observation noise variances (train_Yvar / Yvar)",
        "constant_time_update": "absorbs a batch in time that does not grow with n",
        "high_dim": "serves 4-20-D inputs at no more cost per step than SingleTaskGP",
        "classification": "runs the streaming protocol's classification tasks",
    }
)

#: Builds a model on an initial design: ``(X, Y, Yvar, *, covar_module, **options)``.
Builder = Callable[..., Model]
#: Refits a model in place: ``(model, max_iter, *, fixed_noise, mll_class, **options)``.
Refitter = Callable[..., None]


def refit_marginal_likelihood(
    model: Model,
    max_iter: int | None = None,
    *,
    fixed_noise: bool = False,
    mll_class: type = ExactMarginalLogLikelihood,
    restandardize: bool = False,
    **options: Any,
) -> None:
    r"""The generic refit: BoTorch's ``fit_gpytorch_mll``, warm-started, then eval mode.

    With ``restandardize`` (and learned noise, and a model with ``restandardize()``) the
    outcome's ``Standardize`` is first re-estimated from every observation, as
    ``SingleTaskGP`` re-standardises on all data; known noise keeps the frozen one (the
    statistics hold noise-weighted sums only).

    Args:
        model: The model to refit.
        max_iter: Cap on L-BFGS-B's iterations (``None``: BoTorch's default).
        fixed_noise: Whether the model has known noise.
        mll_class: The marginal likelihood to maximise.
        restandardize: Re-estimate the outcome standardisation first.
        **options: The entry's other options (not used here).
    """
    if restandardize and not fixed_noise and hasattr(model, "restandardize"):
        if model.num_train > 1:
            model.restandardize()
    optimizer_kwargs = {} if max_iter is None else {"options": {"maxiter": int(max_iter)}}
    fit_gpytorch_mll(mll_class(model.likelihood, model), optimizer_kwargs=optimizer_kwargs)
    model.eval()


@dataclass(frozen=True)
class ModelSpec:
    r"""One registry entry: a model class and how the loops build and refit it.

    Attributes:
        name: The registry name (``streamgp bo --models NAME``).
        model_class: The BoTorch model class.
        summary: One line for ``--help`` and the docs.
        capabilities: Names from :data:`CAPABILITIES`.
        options: Every option the loops may pass (``model_options``), with its default.
            An option not listed here is refused, naming it.
        build: How to build the model (``None``: the generic rule, see the module).
        refit: How to refit it (``None``: :func:`refit_marginal_likelihood`).
        mll_class: The marginal likelihood of the generic refit.

    Example:
        >>> from botorch.models import SingleTaskGP
        >>> spec = ModelSpec("my-exact", SingleTaskGP, "SingleTaskGP, rebuilt on all data")
        >>> spec.incremental, spec.checkpoints
        (False, False)
    """

    name: str
    model_class: type[Model]
    summary: str
    capabilities: frozenset[str] = frozenset()
    options: Mapping[str, Any] = field(default_factory=dict)
    build: Builder | None = None
    refit: Refitter | None = None
    mll_class: type = ExactMarginalLogLikelihood

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}.")
        if not (isinstance(self.model_class, type) and issubclass(self.model_class, Model)):
            raise TypeError(f"model_class must be a BoTorch Model class, got {self.model_class!r}.")
        unknown = set(self.capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(
                f"capabilities {sorted(unknown)} are unknown; choose from {sorted(CAPABILITIES)}."
            )
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def incremental(self) -> bool:
        r"""Whether the model absorbs a batch itself (``observe``)."""
        return callable(getattr(self.model_class, "observe", None))

    @property
    def checkpoints(self) -> bool:
        r"""Whether the model saves and restores its whole stream (``checkpoint``)."""
        return callable(getattr(self.model_class, "checkpoint", None))

    def supports(self, capability: str) -> bool:
        r"""Whether the entry declares ``capability`` (a name from :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise ValueError(
                f"capability must be one of {sorted(CAPABILITIES)}, got {capability!r}."
            )
        return capability in self.capabilities

    def resolve_options(self, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        r"""The entry's defaults overridden by ``options``; unknown names are refused."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise ValueError(
                f"model_options {unknown} are not options of {self.name!r} (its options: {known})."
            )
        return {**self.options, **options}

    def make(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        covar_module: Kernel | None = None,
        **options: Any,
    ) -> Model:
        r"""Build the model on an initial design, in eval mode.

        Raises:
            ValueError: ``train_Yvar`` is given and the model takes no known noise, or an
                option is not the entry's.
        """
        if train_Yvar is not None and not self.supports("fixed_noise"):
            raise ValueError(
                f"{self.name}: known observation noise (train_Yvar) is not supported; the "
                "model learns a homoskedastic Gaussian noise."
            )
        options = self.resolve_options(options)
        if self.build is not None:
            model = self.build(train_X, train_Y, train_Yvar, covar_module=covar_module, **options)
        else:
            kernel = {} if covar_module is None else {"covar_module": covar_module}
            model = self.model_class(train_X, train_Y, train_Yvar, **kernel, **options)
        return model.eval()

    def fit(
        self, model: Model, max_iter: int | None = None, *, fixed_noise: bool = False, **options
    ) -> None:
        r"""Refit ``model`` in place, warm-started from its current parameters."""
        options = self.resolve_options(options)
        refit = refit_marginal_likelihood if self.refit is None else self.refit
        refit(model, max_iter, fixed_noise=fixed_noise, mll_class=self.mll_class, **options)


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec, *, replace: bool = False) -> ModelSpec:
    r"""Add ``spec`` to the registry (``replace=True`` to overwrite an entry).

    Example:
        >>> from botorch.models import SingleTaskGP
        >>> spec = register_model(ModelSpec("stgp-doc", SingleTaskGP, "SingleTaskGP"))
        >>> get_model_spec("stgp-doc") is spec
        True
        >>> unregister_model("stgp-doc")
    """
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"spec must be a ModelSpec, got {type(spec).__name__}.")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"a model named {spec.name!r} is registered; pass replace=True.")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_model(name: str) -> None:
    r"""Remove the entry ``name`` (raises naming the choices if there is none)."""
    get_model_spec(name)
    del _REGISTRY[name]


def get_model_spec(name: str) -> ModelSpec:
    r"""The entry registered as ``name``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the choices).
    """
    if name not in _REGISTRY:
        raise ValueError(f"model must be one of {sorted(_REGISTRY)}, got {name!r}.")
    return _REGISTRY[name]


def registered_models(capability: str | None = None) -> tuple[str, ...]:
    r"""The registered names, in registration order (only those with ``capability``)."""
    return tuple(
        name for name, spec in _REGISTRY.items() if capability is None or spec.supports(capability)
    )


#: The largest input dimension :func:`choose_model` serves with WISKI's product grid,
#: where it costs no more than ``SingleTaskGP`` per step at any n; above it, the
#: additive WISKI (a product grid would put ``4^d`` weights on every input).
MAX_PRODUCT_GRID_DIM = 3


def choose_model(dim: int) -> str:
    r"""The streaming model for ``dim``-dimensional inputs (``--models auto``).

    ``"wiski"`` for ``dim <= MAX_PRODUCT_GRID_DIM``, ``"wiski-additive"`` above.

    Example:
        >>> choose_model(3), choose_model(6)
        ('wiski', 'wiski-additive')
    """
    check_count(dim, "dim", minimum=1)
    return "wiski" if dim <= MAX_PRODUCT_GRID_DIM else "wiski-additive"


# ----------------------------------------------------------------- built-in entries
def _scaled_rbf(dim: int) -> Kernel:
    return ScaleKernel(get_covar_module_with_dim_scaled_prior(ard_num_dims=dim))


def _sobol_points(num: int, dim: int, seed: int, like: Tensor) -> Tensor:
    r"""``num`` scrambled Sobol points in the unit cube (the loops' input domain)."""
    return SobolEngine(dim, scramble=True, seed=seed).draw(num, dtype=torch.float64).to(like)


def _grid_model_builder(default_kernel: Callable[[int, bool], Kernel | None]) -> Builder:
    r"""Builds a frozen-transform model (WISKI, KISS-GP, SoftKI) for the loops.

    The outcome is standardised with the initial design's statistics, then frozen.
    ``default_kernel(dim, restandardizes)`` is the kernel when the loop gives none.

    Why two default kernels: with ``restandardize`` (learned noise) every refit gives
    the outcome unit variance, as ``SingleTaskGP``'s, so BoTorch's unscaled
    dim-scaled-prior RBF fits and the model is ``SingleTaskGP``'s on a grid. A frozen
    standardisation from a small initial design does not give the later data unit
    variance; without a learned outputscale the model then explains the excess variance
    as noise (on StyblinskiTang, a noise sd of 86 for a true 20), so it takes a
    ``ScaleKernel``. Known noise keeps the frozen standardisation (the statistics hold
    noise-weighted sums only) and the learned constant mean absorbs the level's drift.
    """

    def build(
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None,
        *,
        covar_module: Kernel | None,
        model_class: type[Model],
        restandardize: bool = False,
        **options: Any,
    ) -> Model:
        if covar_module is None:
            restandardizes = bool(restandardize) and train_Yvar is None
            covar_module = default_kernel(train_X.shape[-1], restandardizes)
        kernel = {} if covar_module is None else {"covar_module": covar_module}
        return model_class(
            train_X, train_Y, train_Yvar, outcome_transform=Standardize(m=1), **kernel, **options
        )

    return build


def _grid_kernel(dim: int, restandardizes: bool) -> Kernel:
    if restandardizes:
        return get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
    return _scaled_rbf(dim)


def _bind(builder: Builder, model_class: type[Model], **fixed: Any) -> Builder:
    def build(*args: Any, **options: Any) -> Model:
        return builder(*args, model_class=model_class, **fixed, **options)

    return build


def _build_softki(
    train_X: Tensor,
    train_Y: Tensor,
    train_Yvar: Tensor | None,
    *,
    covar_module: Kernel | None,
    num_inducing: int,
    seed: int,
    relative_temperature: float | None,
    restandardize: bool,
) -> Model:
    r"""OnlineSoftKIGP on a fixed Sobol design of the unit cube (see the entry)."""
    check_count(num_inducing, "num_inducing", minimum=1)
    check_positive_number(relative_temperature, "relative_temperature", allow_none=True)
    points = _sobol_points(num_inducing, train_X.shape[-1], seed, train_X)
    options: dict[str, Any] = {"inducing_points": points, "pretrain_epochs": 0}
    if relative_temperature is not None and len(points) > 1:
        distance = torch.cdist(points, points).fill_diagonal_(math.inf)
        nearest = distance.min(-1).values.median().item()
        options["temperature"] = relative_temperature * nearest
    return _grid_model_builder(_grid_kernel)(
        train_X,
        train_Y,
        train_Yvar,
        covar_module=covar_module,
        model_class=OnlineSoftKIGP,
        restandardize=restandardize,
        **options,
    )


def _build_osvgp(
    train_X: Tensor,
    train_Y: Tensor,
    train_Yvar: Tensor | None,
    *,
    covar_module: Kernel | None,
    num_inducing: int,
    beta: float,
    lr: float,
    update_steps: int,
    fit_steps: int,
    seed: int,
) -> Model:
    r"""O-SVGP with ``num_inducing`` learned points starting as a Sobol design."""
    check_count(num_inducing, "num_inducing", minimum=1)
    check_count(fit_steps, "fit_steps", minimum=1)
    dim = train_X.shape[-1]
    return OnlineSVGP(
        train_X,
        train_Y,
        inducing_points=_sobol_points(num_inducing, dim, seed, train_X),
        covar_module=(
            get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
            if covar_module is None
            else covar_module
        ),
        beta=beta,
        lr=lr,
        num_steps=update_steps,
        num_init_steps=update_steps,
        keep_optimizer_state=False,
        outcome_transform=Standardize(m=1),
    )


def _refine_osvgp(model: OnlineSVGP, max_iter: int | None, *, fit_steps: int, **_: Any) -> None:
    r"""More Adam steps on the last batch's streaming bound (WISKI paper, appendix C.2)."""
    model.refine(fit_steps if max_iter is None else int(max_iter))


def _build_exact(train_X, train_Y, train_Yvar, *, covar_module) -> Model:
    return SingleTaskGP(
        train_X, train_Y, train_Yvar, covar_module=covar_module, outcome_transform=Standardize(m=1)
    )


_GRID = {"grid_size": None}
_WISKI_FAMILY = frozenset({"fixed_noise", "constant_time_update"})

register_model(
    ModelSpec(
        "wiski",
        WiskiGP,
        "WISKI: SKI on a product grid with constant-time updates (1-3-D)",
        _WISKI_FAMILY | {"classification"},
        options={**_GRID, "restandardize": True},
        build=_bind(_grid_model_builder(_grid_kernel), WiskiGP),
        mll_class=WoodburyMarginalLogLikelihood,
    )
)
register_model(
    ModelSpec(
        "wiski-additive",
        AdditiveWiskiGP,
        "Additive WISKI: one small grid per group of inputs (4-20-D)",
        _WISKI_FAMILY | {"high_dim"},
        options={**_GRID, "restandardize": True},
        # The model's own additive kernel (a scaled RBF per group) unless one is given.
        build=_bind(_grid_model_builder(lambda dim, restandardizes: None), AdditiveWiskiGP),
        mll_class=WoodburyMarginalLogLikelihood,
    )
)
register_model(
    ModelSpec(
        "kissgp",
        KissGP,
        "KISS-GP: grid interpolation, every prediction re-reads all data",
        frozenset({"fixed_noise"}),
        options=_GRID,
        build=_bind(_grid_model_builder(_grid_kernel), KissGP),
    )
)
register_model(
    ModelSpec(
        "softki",
        OnlineSoftKIGP,
        "Online SoftKI: softmax interpolation on m points, constant-time updates in any d",
        _WISKI_FAMILY | {"high_dim", "classification"},
        options={
            "num_inducing": 256,
            "seed": 0,
            "relative_temperature": None,
            "restandardize": True,
        },
        build=_build_softki,
        mll_class=WoodburyMarginalLogLikelihood,
    )
)
register_model(
    ModelSpec(
        "softki-batch",
        SoftKIGP,
        "SoftKI (batch): softmax interpolation on learned points, rebuilt on all data",
        frozenset({"high_dim"}),
    )
)
register_model(
    ModelSpec(
        "osvgp",
        OnlineSVGP,
        "O-SVGP: online sparse variational GP (streaming ELBO, Adam steps)",
        frozenset({"constant_time_update", "classification"}),
        options={
            "num_inducing": 256,
            "beta": 1e-3,
            "lr": 1e-2,
            "update_steps": 20,
            "fit_steps": 100,
            "seed": 0,
        },
        build=_build_osvgp,
        refit=_refine_osvgp,
    )
)
register_model(
    ModelSpec(
        "osgpr",
        OnlineSGPR,
        "O-SGPR: online sparse GP regression (Bui et al.'s collapsed bound)",
        frozenset({"constant_time_update"}),
    )
)
register_model(
    ModelSpec(
        "svdgp",
        DecoupledSVGP,
        "SVDGP: decoupled variational GP (separate mean and covariance bases)",
        frozenset({"constant_time_update"}),
    )
)
register_model(
    ModelSpec(
        "local",
        LocalGP,
        "Local GPs: a committee of small exact GPs, hyperparameters fixed",
        frozenset({"constant_time_update"}),
    )
)
register_model(
    ModelSpec(
        "exact",
        SingleTaskGP,
        "BoTorch's exact SingleTaskGP, rebuilt on all data after each batch",
        frozenset({"fixed_noise", "classification"}),
        build=_build_exact,
    )
)
