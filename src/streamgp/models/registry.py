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

import warnings
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
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import BernoulliLikelihood, GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor
from torch.quasirandom import SobolEngine

from streamgp.inducing import OnlineInducingPointSelector
from streamgp.inducing.kmeans import KMeansSelector
from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models.additive_wiski import AdditiveWiskiGP
from streamgp.models.kissgp import KissGP
from streamgp.models.local_gp import LocalGP
from streamgp.models.online_softki import OnlineSoftKIGP
from streamgp.models.osgpr import OnlineSGPR
from streamgp.models.osvgp import OnlineSVGP
from streamgp.models.projection import LearnedProjection, ProjectedKernel
from streamgp.models.softki import (
    DEFAULT_RELATIVE_TEMPERATURE,
    SoftKIGP,
    median_nearest_distance,
)
from streamgp.models.svdgp import DecoupledSVGP
from streamgp.models.utils.resolution import CoarseGridWarning
from streamgp.models.wiski import DEFAULT_CUDA_GRID_POINTS, DEFAULT_GRID_POINTS, WiskiGP
from streamgp.utils.validation import check_count, check_positive_number

__all__ = [
    "AUTO_DATA_SPACE_MAX_OBSERVATIONS",
    "CAPABILITIES",
    "MAX_PRODUCT_GRID_DIM",
    "ModelSpec",
    "StreamRecipe",
    "choose_model",
    "get_model_spec",
    "refit_marginal_likelihood",
    "restandardize_before_refit",
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


def restandardize_before_refit(model: Model) -> None:
    r"""Re-estimate ``model``'s ``Standardize`` from every observation, where that is exact.

    A transform fitted on the first batch can be many of its standard deviations off
    the data absorbed since, and a refit in those units finds a degenerate model;
    ``SingleTaskGP`` rebuilt on all data is re-standardised. Models with
    ``restandardize()``, one output, a ``Standardize`` transform, learned noise (known
    noise keeps its statistics as noise-weighted sums only) and more than one
    observation; any other model is left as it is.
    """
    if (
        callable(getattr(model, "restandardize", None))
        and isinstance(getattr(model, "outcome_transform", None), Standardize)
        and model.num_outputs == 1
        and not getattr(model, "fixed_noise", True)
        and getattr(model, "num_train", 0) > 1
    ):
        model.restandardize()


def refit_marginal_likelihood(
    model: Model,
    max_iter: int | None = None,
    *,
    fixed_noise: bool = False,
    mll_class: type = ExactMarginalLogLikelihood,
    restandardize: bool = False,
    refine_grid: bool = False,
    max_grid_points: int | None = None,
    **options: Any,
) -> None:
    r"""The generic refit: BoTorch's ``fit_gpytorch_mll``, warm-started, then eval mode.

    With ``restandardize`` (and learned noise, and a model with ``restandardize()``) the
    outcome's ``Standardize`` is first re-estimated from every observation, as
    ``SingleTaskGP`` re-standardises on all data; known noise keeps the frozen one (the
    statistics hold noise-weighted sums only).

    With ``refine_grid`` (a grid model that keeps its data), a fit that leaves a
    lengthscale under ``MIN_SPACINGS_PER_LENGTHSCALE`` grid spacings moves the model to
    a finer grid (``model.refine_grid``, exact, at most ``max_grid_points`` points:
    default, the device's default grid budget, ``DEFAULT_GRID_POINTS`` on a CPU and
    ``DEFAULT_CUDA_GRID_POINTS`` on CUDA, so that a refined grid costs per step what a
    default grid costs); :class:`~streamgp.models.utils.resolution.CoarseGridWarning`
    is then raised only if the refined grid is still too coarse.

    Args:
        model: The model to refit.
        max_iter: Cap on L-BFGS-B's iterations (``None``: BoTorch's default).
        fixed_noise: Whether the model has known noise.
        mll_class: The marginal likelihood to maximise.
        restandardize: Re-estimate the outcome standardisation first.
        refine_grid: Refine a too coarse grid after the fit.
        max_grid_points: Cap on a refined grid's points (None: the device's default
            grid budget).
        **options: The entry's other options (not used here).
    """
    if restandardize and not fixed_noise:
        restandardize_before_refit(model)
    optimizer_kwargs = {} if max_iter is None else {"options": {"maxiter": int(max_iter)}}
    refines = refine_grid and getattr(model, "observations", None) is not None
    refines = refines and hasattr(model, "refine_grid")
    if refines:
        if max_grid_points is None:
            on_cuda = model.interpolation.bounds.is_cuda
            max_grid_points = DEFAULT_CUDA_GRID_POINTS if on_cuda else DEFAULT_GRID_POINTS
        # A grid at the cap already stays as built.
        refines = model.interpolation.num_grid < max_grid_points
    with warnings.catch_warnings():
        if refines:  # warned below, if the refined grid is still too coarse
            warnings.simplefilter("ignore", CoarseGridWarning)
        fit_gpytorch_mll(mll_class(model.likelihood, model), optimizer_kwargs=optimizer_kwargs)
        model.eval()
    if refines:
        model.refine_grid(max_grid_points=max_grid_points)
        model.check_grid_resolution(again=True)


def _resolve_options(
    defaults: Mapping[str, Any], options: Mapping[str, Any] | None, what: str
) -> dict[str, Any]:
    r"""``defaults`` overridden by ``options``; names not in ``defaults`` raise ``what``
    (formatted with the sorted unknown names) and the known names."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise ValueError(f"{what.format(unknown)} (its options: {known}).")
    return {**defaults, **options}


#: How the streaming protocol trains a model: ``"adam"`` (the protocol's Adam steps on
#: the model's objective), ``"model"`` (the model's own steps, in its constructor or
#: ``observe``), ``"frozen"`` (none: ``observe`` only).
TRAINING_MODES = ("adam", "model", "frozen")
#: Where the protocol's learned projection goes when it is on: ``"none"``, in front of
#: the model (``"features"``: absorbed at arrival, the WISKI paper's eq. 18) or inside
#: its kernel (``"kernel"``: recomputed for all data).
PROJECTION_PLACES = ("none", "features", "kernel")


@dataclass(frozen=True)
class StreamRecipe:
    r"""How the streaming protocol (``streamgp stream``, WISKI paper section 5) runs a model.

    The protocol pretrains on the first batch, then absorbs each arrival and trains for
    one step, and predicts the test set; this says how, for one registry entry.

    Attributes:
        build: ``(X, Y, Yvar, *, protocol, reuse, **options) -> Model``. ``protocol``
            holds the protocol's settings (``pretrain_steps``, ``pretrain_lr``, ``lr``,
            ``grid_size``, ``grid_margin``, ``num_inducing``, ``inducing``, ``oips_rho``,
            ``project``, ``projection_dim``, ``classification``); ``reuse`` is the model
            being rebuilt (its modules are kept, so the optimizer's state carries over),
            or ``None``.
        pretraining: One of :data:`TRAINING_MODES` for the first batch.
        online: One of :data:`TRAINING_MODES` for each arrival.
        per_output: One model per output column (the classes of Dirichlet targets).
        projection: One of :data:`PROJECTION_PLACES`.
        capped: The protocol's ``exact_max`` caps its observations (``O(n^3)`` models).
        after_pretraining: ``(model, X, Y, Yvar, *, protocol, **options) -> Model``: the
            model to stream with, from the pretrained one (``None``: the same). Both hooks
            receive every option of the recipe.
        options: The entry's own protocol options, with their defaults
            (``StreamConfig.model_options[name]`` overrides them).
    """

    build: Builder
    pretraining: str = "adam"
    online: str = "adam"
    per_output: bool = False
    projection: str = "none"
    capped: bool = False
    after_pretraining: Callable[..., Model] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("pretraining", "online"):
            value = getattr(self, name)
            if value not in TRAINING_MODES:
                raise ValueError(f"{name} must be one of {TRAINING_MODES}, got {value!r}.")
        if self.projection not in PROJECTION_PLACES:
            raise ValueError(
                f"projection must be one of {PROJECTION_PLACES}, got {self.projection!r}."
            )
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def resolve_options(self, name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
        r"""The recipe's options overridden by ``options``; unknown names are refused."""
        what = f"model_options[{name!r}] {{}} are not protocol options of {name!r}"
        return _resolve_options(self.options, options, what)


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
        mll_class: The marginal likelihood of the generic refit (and of the streaming
            protocol's Adam steps).
        stream: How the streaming protocol runs it (``None``: it does not).
        loops: Whether the BO and active-learning loops offer it.

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
    stream: StreamRecipe | None = None
    loops: bool = True

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
        return _resolve_options(
            self.options, options, f"model_options {{}} are not options of {self.name!r}"
        )

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


def registered_models(capability: str | None = None, *, loop: str | None = None) -> tuple[str, ...]:
    r"""The registered names, in registration order.

    Args:
        capability: Only the entries that declare it.
        loop: Only the entries that ``"bo"`` (the BO and active-learning loops) or
            ``"stream"`` (the streaming protocol) runs.
    """
    if loop not in (None, "bo", "stream"):
        raise ValueError(f"loop must be None, 'bo' or 'stream', got {loop!r}.")
    return tuple(
        name
        for name, spec in _REGISTRY.items()
        if (capability is None or spec.supports(capability))
        and (loop is None or (spec.loops if loop == "bo" else spec.stream is not None))
    )


#: The largest input dimension :func:`choose_model` serves with WISKI's product grid,
#: where it costs no more than ``SingleTaskGP`` per step at any n; above it, a product
#: grid would put ``4^d`` weights on every input.
MAX_PRODUCT_GRID_DIM = 3
#: Above ``MAX_PRODUCT_GRID_DIM``, the most observations a run may reach for which
#: :func:`choose_model` still picks ``WiskiGP`` in data space (an exact GP in answers and
#: cost, level with ``SingleTaskGP`` on non-additive objectives where the additive model
#: stalls); longer runs get the additive WISKI, whose refits cost the same at every n.
#: Measured (``benchmarks/data_space_scaling.py``, one CPU core): at n = 1,000 a data-space
#: marginal-likelihood value + gradient takes 0.13-0.25 s at d = 6-20, as ``SingleTaskGP``'s
#: 0.25-0.27 s, so a refit of about 100 L-BFGS-B evaluations takes under half a minute; at
#: n = 2,000 it takes 0.7-2.1 s and at 4,000 6-15 s (5.6 GB at d = 20), where the additive
#: model's takes 0.01-0.04 s at any n.
AUTO_DATA_SPACE_MAX_OBSERVATIONS = 1000


def choose_model(dim: int, num_observations: int | None = None) -> str:
    r"""The streaming model for ``dim``-dimensional inputs (``--models auto``).

    ``"wiski"`` for ``dim <= MAX_PRODUCT_GRID_DIM`` (constant-time updates on a product
    grid). Above, ``"wiski"`` again (in data space, with an exact GP's answers and cost)
    when the run will hold at most ``AUTO_DATA_SPACE_MAX_OBSERVATIONS`` observations, and
    ``"wiski-additive"`` (constant-time updates, an additive kernel) for longer runs or
    when ``num_observations`` is not known.

    Args:
        dim: The input dimension.
        num_observations: The most observations the run will hold (e.g. the initial
            design plus steps times the batch size), or None for an open-ended stream.

    Example:
        >>> choose_model(3), choose_model(6, num_observations=320), choose_model(6)
        ('wiski', 'wiski', 'wiski-additive')
    """
    check_count(dim, "dim", minimum=1)
    if num_observations is not None:
        check_count(num_observations, "num_observations", minimum=1)
    if dim <= MAX_PRODUCT_GRID_DIM:
        return "wiski"
    if num_observations is not None and num_observations <= AUTO_DATA_SPACE_MAX_OBSERVATIONS:
        return "wiski"
    return "wiski-additive"


# ----------------------------------------------------------------- built-in entries
def _scaled_rbf(dim: int) -> Kernel:
    return ScaleKernel(get_covar_module_with_dim_scaled_prior(ard_num_dims=dim))


def _sobol_points(num: int, dim: int, seed: int, like: Tensor) -> Tensor:
    r"""``num`` scrambled Sobol points in the unit cube (the loops' input domain)."""
    return SobolEngine(dim, scramble=True, seed=seed).draw(num, dtype=torch.float64).to(like)


def _grid_kernel(dim: int, restandardizes: bool) -> Kernel:
    if restandardizes:
        return get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
    return _scaled_rbf(dim)


def _grid_model_builder(
    model_class: type[Model],
    default_kernel: Callable[[int, bool], Kernel | None] = _grid_kernel,
) -> Builder:
    r"""Builds a frozen-transform ``model_class`` (WISKI, KISS-GP, SoftKI) for the loops.

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
        restandardize: bool = False,
        refine_grid: bool = False,  # (refit options)
        max_grid_points: int | None = None,
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


#: ``moving_points``: the shares of the ``softki`` entry's ``m`` points drawn, at each
#: refit, in a box around the incumbent and at the data (k-means); the rest cover the cube.
MOVING_LOCAL_SHARE, MOVING_DATA_SHARE = 0.5, 0.25
#: ``moving_points``: side of the box around the incumbent (the unit cube is the domain).
MOVING_LOCAL_WIDTH = 0.2
#: ``moving_points=None`` (the ``softki`` entry's default) moves the points from this many
#: input dimensions on. Measured (docs/benchmarks/softki.md, 3 seeds x 30 steps): moving
#: points gained on Hartmann-3 (3.62 -> 3.84) and Hartmann-6 (1.67 -> 2.61) and lost on
#: Styblinski-Tang-2 (77.05 -> 75.36), where m fixed points already cover the square.
MOVING_POINTS_FROM_DIM = 3


def _moves_points(moving_points: bool | None, dim: int) -> bool:
    r"""The ``softki`` entry's ``moving_points`` for ``dim`` inputs (None: by dimension)."""
    if moving_points is None:
        return dim >= MOVING_POINTS_FROM_DIM
    if not isinstance(moving_points, bool):
        raise TypeError(
            f"moving_points must be a bool or None, got {type(moving_points).__name__}."
        )
    return moving_points


def _relative_temperature(points: Tensor, relative_temperature: float | None) -> float | None:
    r"""``relative_temperature`` times the points' median nearest-neighbour distance."""
    if relative_temperature is None or len(points) < 2:
        return None
    nearest = median_nearest_distance(points)
    return relative_temperature * nearest if nearest > 0 else None


def points_around_incumbent(
    X: Tensor, incumbent: Tensor, num: int, seed: int, *, width: float = MOVING_LOCAL_WIDTH
) -> Tensor:
    r"""A fresh set of ``num`` interpolation points for a BO search in the unit cube.

    ``MOVING_LOCAL_SHARE`` of them are scrambled Sobol points in the box of side
    ``width`` centred at ``incumbent`` (shifted to lie inside the cube),
    ``MOVING_DATA_SHARE`` are k-means centres of the observed inputs ``X`` (the inputs
    themselves when there are fewer), and the rest are Sobol points of the whole cube.
    SoftKI's predictions peak at its interpolation points, so the acquisition's
    maximisers are points of this set: drawing it afresh at every refit, dense around
    the incumbent, lets the search refine there and still reach the whole cube.

    Args:
        X: ``n x d`` observed inputs (unit cube).
        incumbent: ``d`` centre of the local box.
        num: Number of points (at least 1).
        seed: Seed of the Sobol scrambles and the k-means initialisation.
        width: Side of the local box, in ``(0, 1]``.

    Returns:
        ``num x d`` points in the unit cube (dtype and device of ``X``).

    Example:
        >>> X = torch.rand(20, 2, dtype=torch.float64)
        >>> Z = points_around_incumbent(X, X[0], 64, seed=0)
        >>> Z.shape, bool(((Z >= 0) & (Z <= 1)).all())
        (torch.Size([64, 2]), True)
    """
    check_count(num, "num", minimum=1)
    if not 0 < width <= 1:
        raise ValueError(f"width must be in (0, 1], got {width!r}.")
    d = X.shape[-1]
    num_local = round(MOVING_LOCAL_SHARE * num)
    num_data = min(round(MOVING_DATA_SHARE * num), len(X), num - num_local)
    lower = (incumbent - width / 2).clamp(0.0, 1.0 - width)
    local = lower + width * _sobol_points(num_local, d, seed, X)
    parts = [local]
    if num_data > 0:
        parts.append(KMeansSelector(num_inducing=num_data, seed=seed).update(X).to(X))
    parts.append(_sobol_points(num - num_local - num_data, d, seed + 1, X))
    return torch.cat(parts)


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
    moving_points: bool | None,
) -> Model:
    r"""OnlineSoftKIGP on a Sobol design of the unit cube (see the entry)."""
    check_count(num_inducing, "num_inducing", minimum=1)
    check_positive_number(relative_temperature, "relative_temperature", allow_none=True)
    moving_points = _moves_points(moving_points, train_X.shape[-1])
    points = _sobol_points(num_inducing, train_X.shape[-1], seed, train_X)
    options: dict[str, Any] = {
        "inducing_points": points,
        "pretrain_epochs": 0,
        "keep_data": moving_points,
    }
    temperature = _relative_temperature(points, relative_temperature)
    if temperature is not None:
        options["temperature"] = temperature
    return _grid_model_builder(OnlineSoftKIGP)(
        train_X,
        train_Y,
        train_Yvar,
        covar_module=covar_module,
        restandardize=restandardize,
        **options,
    )


def _refit_softki(
    model: OnlineSoftKIGP,
    max_iter: int | None,
    *,
    fixed_noise: bool,
    mll_class: type,
    restandardize: bool,
    moving_points: bool | None,
    num_inducing: int,
    seed: int,
    relative_temperature: float | None,
) -> None:
    r"""With ``moving_points``, fresh points around the incumbent; then the generic refit.

    The incumbent is the observed input of highest posterior mean (the loops' inputs
    are the unit cube, untransformed); the new points are
    :func:`points_around_incumbent` (seeded by ``seed`` and ``n``, so a resumed loop
    draws the same), their temperature ``relative_temperature`` (default: SoftKI's
    ``DEFAULT_RELATIVE_TEMPERATURE``) times their median nearest-neighbour distance.
    """
    if _moves_points(moving_points, model.interpolation.dim) and model.num_train > 0:
        X, _, _ = model.kept_data()
        with torch.no_grad():
            mean = model.posterior(X.unsqueeze(-2)).mean.reshape(-1)  # n one-point posteriors
        points = points_around_incumbent(X, X[mean.argmax()], num_inducing, seed + len(X))
        relative = (
            DEFAULT_RELATIVE_TEMPERATURE if relative_temperature is None else relative_temperature
        )
        model.set_points(points, _relative_temperature(points, relative))
    refit_marginal_likelihood(
        model, max_iter, fixed_noise=fixed_noise, mll_class=mll_class, restandardize=restandardize
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


# ------------------------------------------------------- the streaming protocol's builds
# The WISKI paper's section 5: every model with an RBF-ARD kernel under gpytorch's
# softplus-transformed constraints (so plain Adam steps cannot leave the parameters'
# domain), a zero prior mean where the model's default is a learned constant, and no
# outcome transform: the protocol standardises every data set itself.


def _rbf_ard(dim: int, batch_shape: torch.Size | None = None) -> ScaleKernel:
    batch_shape = torch.Size() if batch_shape is None else batch_shape
    return ScaleKernel(
        RBFKernel(ard_num_dims=dim, batch_shape=batch_shape), batch_shape=batch_shape
    )


def _oips(protocol: Mapping[str, Any], kernel: Kernel) -> OnlineInducingPointSelector | None:
    # OIPS on the model's own kernel, so acceptance follows the learned lengthscales.
    if protocol["inducing"] != "oips":
        return None
    return OnlineInducingPointSelector(
        kernel, protocol["oips_rho"], max_size=protocol["num_inducing"]
    )


def _stream_wiski(X, Y, Yvar, *, protocol, reuse) -> Model:
    r"""WISKI on a fixed grid over ``[-1 - margin, 1 + margin]^d`` (standardised inputs)."""
    fixed_noise = Yvar is not None
    dim = X.shape[-1]
    covar_module = _rbf_ard(dim).to(X) if reuse is None else reuse.covar_module
    likelihood = None
    if not fixed_noise:
        likelihood = GaussianLikelihood().to(X) if reuse is None else reuse.likelihood
    bounds = torch.full((2, dim), 1.0 + protocol["grid_margin"]).to(X)
    bounds[0] = -bounds[0]
    return WiskiGP(
        X,
        Y,
        Yvar,
        grid_size=protocol["grid_size"],
        grid_bounds=bounds,
        covar_module=covar_module,
        likelihood=likelihood,
        # Fixed-noise Dirichlet targets are far from zero mean: standardise them (frozen
        # after pretraining), as the zero prior mean needs.
        outcome_transform=Standardize(m=1) if fixed_noise else None,
        mean_module=ZeroMean(),
    )


def _stream_softki(X, Y, Yvar, *, protocol, reuse) -> Model:
    r"""Online SoftKI: SoftKI's Algorithm 1 on the first batch learns ``num_inducing``
    points, the temperature, the kernel and the noise; points and temperature then stay."""
    fixed_noise = Yvar is not None
    return OnlineSoftKIGP(
        X,
        Y,
        Yvar,
        likelihood=None if fixed_noise else GaussianLikelihood().to(X),
        covar_module=_rbf_ard(X.shape[-1]).to(X),
        outcome_transform=Standardize(m=1) if fixed_noise else None,  # as for WISKI
        mean_module=ZeroMean(),
        num_inducing=min(protocol["num_inducing"], len(X)),
        pretrain_epochs=protocol["pretrain_steps"],
        pretrain_options={"lr": protocol["pretrain_lr"]},
        keep_data=False,  # the paper's protocol: points frozen after the first batch
    )


def _stream_exact(X, Y, Yvar, *, protocol, reuse, **_: Any) -> Model:
    r"""``SingleTaskGP`` on all data so far; ``C > 1`` outputs form one batched model (one
    GP per class, each with its own hyperparameters). A rebuild keeps the kernel, mean and
    learned likelihood modules, so the Adam state carries over. With ``project`` the
    kernel holds the learned projection (recomputed for all data at every step)."""
    if reuse is not None:
        learned = reuse.likelihood if Yvar is None else None
        covar_module, mean_module, likelihood = reuse.covar_module, reuse.mean_module, learned
    else:
        num_outputs = Y.shape[-1]
        batch = torch.Size([num_outputs]) if num_outputs > 1 else torch.Size()
        dim = X.shape[-1]
        projection = None
        if protocol["project"]:
            projection = LearnedProjection(dim, protocol["projection_dim"]).to(X)
            dim = protocol["projection_dim"]
        covar_module = _rbf_ard(dim, batch).to(X)
        if projection is not None:
            covar_module = ProjectedKernel(covar_module, projection)
        mean_module = ConstantMean(batch_shape=batch).to(X)
        likelihood = None if Yvar is not None else GaussianLikelihood().to(X)
    return SingleTaskGP(
        X,
        Y,
        Yvar,
        covar_module=covar_module,
        mean_module=mean_module,
        likelihood=likelihood,
        outcome_transform=None,
    )


def _calibrate_kernel_projection(model, X, Y, Yvar, *, protocol, **_: Any) -> Model:
    r"""As WISKI's: batch statistics while pretraining, then the running statistics of the
    pretraining set (a single arrival has no batch statistics)."""
    kernel = model.covar_module
    if isinstance(kernel, ProjectedKernel):
        kernel.projection.calibrate(X)
        kernel.freeze_normalization = True
        kernel.train(False)
    return model


def _local_from_exact(model, X, Y, Yvar, *, protocol, w_gen, n_max) -> Model:
    r"""Local GPs with the hyperparameters of the exact GP pretrained on the first batch."""
    return LocalGP(
        X,
        Y,
        covar_module=model.covar_module,
        mean_module=model.mean_module,
        likelihood=model.likelihood,
        w_gen=w_gen,
        n_max=n_max,
        outcome_transform=None,
    )


def _stream_osvgp(X, Y, Yvar, *, protocol, reuse, beta) -> Model:
    r"""O-SVGP (Gaussian, or Bernoulli on ``{0, 1}`` labels for classification), trained by
    its own Adam: ``pretrain_steps`` steps on the first batch, one per arrival."""
    covar_module = _rbf_ard(X.shape[-1]).to(X)
    model = OnlineSVGP(
        X,
        Y,
        num_inducing=min(protocol["num_inducing"], len(X)),
        covar_module=covar_module,
        inducing_selector=_oips(protocol, covar_module),
        likelihood=BernoulliLikelihood() if protocol["classification"] else GaussianLikelihood(),
        # The paper's learned constant from zero (the protocol standardised the data).
        mean_module=ConstantMean(),
        beta=beta,
        hold_variational_optimum=False,  # the paper's first-order steps (beta-weighted)
        num_steps=1,
        num_init_steps=protocol["pretrain_steps"],
        lr=protocol["pretrain_lr"],
        outcome_transform=None,
    )
    # The online learning rate (setting it starts a fresh Adam for the stream).
    model.optimizer_kwargs = {"lr": protocol["lr"]}
    return model


def _stream_osgpr(X, Y, Yvar, *, protocol, reuse) -> Model:
    r"""O-SGPR: ``pretrain_steps`` steps on the first batch, then one per arrival."""
    covar_module = _rbf_ard(X.shape[-1]).to(X)
    selector = _oips(protocol, covar_module)
    model = OnlineSGPR(
        X,
        Y,
        num_inducing=None if selector is not None else protocol["num_inducing"],
        covar_module=covar_module,
        inducing_selector=selector,
        likelihood=GaussianLikelihood(),
        steps_per_batch=protocol["pretrain_steps"],
        lr=protocol["pretrain_lr"],
        outcome_transform=None,
        mean_module=ZeroMean(),
    )
    model.steps_per_batch = 1
    model.lr = protocol["lr"]
    return model


def _stream_svdgp(
    X, Y, Yvar, *, protocol, reuse, max_mean_basis, max_covar_basis, minibatch_size, kl_columns
) -> Model:
    r"""SVDGP with ``DecoupledSVGP``'s initial bases and closed-form warm start, then one
    minibatch step per arrival at the protocol's constant learning rate (no decay)."""
    model = DecoupledSVGP(
        X,
        Y,
        max_mean_basis=max_mean_basis,
        max_covar_basis=max_covar_basis,
        basis_increment=minibatch_size,
        covar_module=_rbf_ard(X.shape[-1]),
        likelihood=GaussianLikelihood(),
        mean_module=ConstantMean(),  # from zero, as for O-SVGP
        minibatch_size=minibatch_size,
        kl_columns=kl_columns,
        num_steps=1,
        num_init_steps=protocol["pretrain_steps"],
        lr=protocol["pretrain_lr"],
        lr_decay=0.0,
        seed=int(torch.randint(2**31 - 1, ()).item()),
        outcome_transform=None,
        # After the constructor's closed-form warm start, the paper's first-order steps
        # on (a, L) at each arrival, as the protocol's figures were measured.
        hold_variational_optimum=False,
    )
    model.optimizer_kwargs = {"lr": protocol["lr"]}
    return model


# ------------------------------------------------------------------------- entries
_GRID = {"grid_size": None}
_WISKI_FAMILY = frozenset({"fixed_noise", "constant_time_update"})

register_model(
    ModelSpec(
        "wiski",
        WiskiGP,
        "WISKI: SKI on a product grid with constant-time updates (1-3-D)",
        _WISKI_FAMILY | {"classification"},
        # A refit that leaves lengthscales under two grid spacings refines the grid
        # (exact, from the kept data), up to the device's default grid budget.
        options={**_GRID, "restandardize": True, "refine_grid": True, "max_grid_points": None},
        build=_grid_model_builder(WiskiGP),
        mll_class=WoodburyMarginalLogLikelihood,
        stream=StreamRecipe(_stream_wiski, per_output=True, projection="features"),
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
        build=_grid_model_builder(AdditiveWiskiGP, lambda dim, restandardizes: None),
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
        build=_grid_model_builder(KissGP),
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
            "moving_points": None,
        },
        build=_build_softki,
        refit=_refit_softki,
        mll_class=WoodburyMarginalLogLikelihood,
        stream=StreamRecipe(_stream_softki, pretraining="model", per_output=True),
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
        "exact",
        SingleTaskGP,
        "BoTorch's exact SingleTaskGP, rebuilt on all data after each batch",
        frozenset({"fixed_noise", "classification"}),
        build=_build_exact,
        stream=StreamRecipe(_stream_exact, capped=True),
    )
)
register_model(
    ModelSpec(
        "exact-projected",
        SingleTaskGP,
        "The exact GP on WISKI's learned projection (the WISKI paper's exact baseline)",
        frozenset({"fixed_noise", "classification"}),
        stream=StreamRecipe(
            _stream_exact,
            projection="kernel",
            capped=True,
            after_pretraining=_calibrate_kernel_projection,
        ),
        loops=False,
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
        stream=StreamRecipe(
            _stream_osvgp, pretraining="model", online="model", options={"beta": 1e-3}
        ),
    )
)
register_model(
    ModelSpec(
        "osgpr",
        OnlineSGPR,
        "O-SGPR: online sparse GP regression (Bui et al.'s collapsed bound)",
        frozenset({"constant_time_update"}),
        stream=StreamRecipe(_stream_osgpr, pretraining="model", online="model"),
    )
)
register_model(
    ModelSpec(
        "svdgp",
        DecoupledSVGP,
        "SVDGP: decoupled variational GP (separate mean and covariance bases)",
        frozenset({"constant_time_update"}),
        stream=StreamRecipe(
            _stream_svdgp,
            pretraining="model",
            online="model",
            options={
                "max_mean_basis": 2048,
                "max_covar_basis": 128,
                "minibatch_size": 256,
                "kl_columns": None,
            },
        ),
    )
)
register_model(
    ModelSpec(
        "local",
        LocalGP,
        "Local GPs: a committee of small exact GPs, hyperparameters fixed",
        frozenset({"constant_time_update"}),
        stream=StreamRecipe(
            _stream_exact,
            online="frozen",
            after_pretraining=_local_from_exact,
            options={"w_gen": 0.5, "n_max": 256},
        ),
    )
)
