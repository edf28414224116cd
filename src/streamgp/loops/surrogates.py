r"""Surrogates: one interface over streamgp and BoTorch models for the loops.

A loop needs four things from a model, whatever it is: build it on an initial
design, absorb a new batch, refit hyperparameters (warm-started from the current
ones), and expose a BoTorch :class:`~botorch.models.model.Model` for acquisition
functions. :class:`Surrogate` is that interface; :func:`make_surrogate` builds one
by name (``"wiski"``, ``"kissgp"``, ``"osvgp"``, ``"exact"``).

- :class:`WiskiSurrogate` absorbs a batch with :meth:`WiskiGP.observe` (constant
  time in ``n``) and refits on :class:`WoodburyMarginalLogLikelihood` (also constant
  in ``n``); it stores no data.
- :class:`KissSurrogate` is KISS-GP (:class:`~streamgp.models.KissGP`), the
  non-online grid model: ``observe`` appends the batch and the next prediction
  re-reads all data; refits use gpytorch's CG-based exact marginal likelihood.
- :class:`OnlineSVGPSurrogate` is O-SVGP (:class:`~streamgp.models.OnlineSVGP`), the
  streaming variational baseline: a batch is absorbed by Adam steps on its streaming
  bound (constant time in ``n``) and a refit takes more Adam steps on the bound of
  the last batch, as the WISKI paper refits O-SVGP in its BO runs (appendix C.2).
- :class:`ExactSurrogate` is what a BoTorch user does today: keep all data and
  rebuild a :class:`~botorch.models.SingleTaskGP` after each batch, warm-starting
  its hyperparameters (``O(n^3)`` per step).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
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
from streamgp.models import AdditiveWiskiGP, KissGP, OnlineSoftKIGP, OnlineSVGP, WiskiGP
from streamgp.utils.validation import check_count, check_positive_number

#: Builds the covariance module for a given input dimension (``None``: the model's default).
KernelFactory = Callable[[int], Kernel]


class Surrogate(ABC):
    r"""A model the loops can build, update, refit and hand to BoTorch.

    A subclass builds its model (``self._model``) in its constructor and implements
    the updates, the refit and the state.

    Args:
        train_X: ``n x d`` initial inputs (in the unit cube for the loops).
        train_Y: ``n x 1`` initial targets.
        train_Yvar: Optional ``n x 1`` known observation noise variances.
        kernel_factory: Optional ``d -> Kernel``; the model's default kernel otherwise.
    """

    #: Registry name (``make_surrogate``).
    name: str = ""
    #: The current model, built by the subclass's constructor.
    _model: Model

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        kernel_factory: KernelFactory | None = None,
    ) -> None:
        self.fixed_noise = train_Yvar is not None
        self.kernel_factory = kernel_factory

    @property
    def model(self) -> Model:
        r"""The current BoTorch model, in eval mode."""
        return self._model

    @abstractmethod
    def update(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        r"""Absorb a batch of observations."""

    @abstractmethod
    def fit(self, max_iter: int | None = None) -> None:
        r"""Refit, warm-started from the current parameters.

        ``max_iter`` caps the optimizer's iterations (L-BFGS-B for the exact and grid
        models, Adam steps for O-SVGP); ``None`` is the surrogate's default.
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        r"""Everything needed to resume (with :meth:`load_state_dict`)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        r"""Restore the state saved by :meth:`state_dict`."""

    def _covar_module(self, dim: int) -> Kernel | None:
        return None if self.kernel_factory is None else self.kernel_factory(dim)


def _scaled_default_kernel(dim: int) -> Kernel:
    return ScaleKernel(get_covar_module_with_dim_scaled_prior(ard_num_dims=dim))


def _sobol_points(num: int, dim: int, seed: int, like: Tensor) -> Tensor:
    r"""``num`` scrambled Sobol points in the unit cube (the loops' input domain)."""
    return SobolEngine(dim, scramble=True, seed=seed).draw(num, dtype=torch.float64).to(like)


def _fit(mll, max_iter: int | None) -> None:
    options = {} if max_iter is None else {"options": {"maxiter": int(max_iter)}}
    fit_gpytorch_mll(mll, optimizer_kwargs=options)
    mll.model.eval()


class _GridSurrogate(Surrogate):
    r"""A grid model (``model_cls``) built on the initial design, absorbing by ``observe``.

    The outcome is standardised with the statistics of the initial design, then frozen
    (grid models freeze their transforms). Refits maximise ``mll_cls``. A subclass
    passes its own constructor options with :meth:`_model_options`.

    The default kernel is BoTorch's dim-scaled-prior RBF inside a ``ScaleKernel``.
    BoTorch drops the outputscale because it re-standardises the outcome on all data;
    a frozen standardisation from a small initial design does not give the later data
    unit variance, and without a learned outputscale the model explains the excess
    variance as noise (on StyblinskiTang, a noise sd of 86 for a true 20, and WISKI
    never improved on its initial best in 150 steps).
    """

    model_cls: type[WiskiGP] | type[KissGP]
    mll_cls: type

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        kernel_factory: KernelFactory | None = None,
        grid_size: int | None = None,
    ) -> None:
        super().__init__(train_X, train_Y, train_Yvar, kernel_factory=kernel_factory)
        self.grid_size = grid_size
        self.initial = (train_X, train_Y, train_Yvar)
        self._model = self._build()

    def _build(self) -> WiskiGP | KissGP:
        X, Y, Yvar = self.initial
        dim = X.shape[-1]
        model = self.model_cls(
            X,
            Y,
            Yvar,
            covar_module=self._covar_module(dim) or self._default_kernel(dim),
            outcome_transform=Standardize(m=1),
            **self._model_options(X),
        )
        return model.eval()

    def _default_kernel(self, dim: int) -> Kernel:
        return _scaled_default_kernel(dim)

    def _model_options(self, train_X: Tensor) -> dict[str, Any]:
        r"""Keyword arguments of ``model_cls`` beyond the data, kernel and transform."""
        return {"grid_size": self.grid_size}

    def update(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        self._model.observe(X, Y, Yvar)

    def fit(self, max_iter: int | None = None) -> None:
        _fit(self.mll_cls(self._model.likelihood, self._model), max_iter)


class _CheckpointedSurrogate(Surrogate):
    r"""A surrogate whose state is its streaming model's own ``checkpoint``.

    The model (:class:`WiskiGP`, :class:`OnlineSVGP`, ...) saves everything it needs to
    continue the stream, so a resumed run is the uninterrupted one.
    """

    def state_dict(self) -> dict[str, Any]:
        return {"model": self._model.checkpoint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._model.restore(state["model"])
        self._model.eval()


class WiskiSurrogate(_CheckpointedSurrogate, _GridSurrogate):
    r""":class:`WiskiGP` with constant-time updates and refits (it stores no data).

    With ``restandardize=True`` (the default) each refit first re-estimates the outcome's
    ``Standardize`` from every observation (:meth:`WiskiGP.restandardize`, exact, from
    the statistics), as ``SingleTaskGP`` re-standardises on all data; between refits the
    transform stays frozen, so updates stay constant-time. The outcome then has unit
    variance, so the model takes ``SingleTaskGP``'s own kernel (BoTorch's unscaled
    dim-scaled-prior RBF) and its learned constant mean: ``SingleTaskGP``'s model on a
    grid, which on the same stream fits the same hyperparameters. (BO data crowd near
    the optimum, so the data's mean is far from the function's: on Levy, a zero mean
    instead of the learned one took the lengthscale of one dimension from about 1 to
    3-8.) The frozen standardisation needs the ``ScaleKernel`` instead, and with it the marginal
    likelihood often prefers a long lengthscale with a large outputscale to
    ``SingleTaskGP``'s fit (on StyblinskiTang's BO data, lengthscales 0.78 with
    outputscale 1450 where ``SingleTaskGP`` fits 0.19-0.25). With known noise
    (``train_Yvar``) the statistics keep only noise-weighted sums, so the initial
    design's standardisation and the scaled kernel stay; the model's learned constant
    mean (``SingleTaskGP``'s default, as with ``restandardize=False``) absorbs the drift
    of the targets' level.

    Args:
        grid_size: Grid points per dimension (``None``: ``WiskiGP``'s default).
        restandardize: Re-estimate the standardisation from all data at each refit
            (and take ``SingleTaskGP``'s unscaled kernel). Default True: the BO
            benchmarks' six-function table measured WISKI this way. False keeps the
            initial design's standardisation with a ``ScaleKernel``.
        **kwargs: As :class:`Surrogate`.

    Example:
        >>> X = torch.rand(5, 2, dtype=torch.float64)
        >>> s = WiskiSurrogate(X, X.sum(-1, keepdim=True), grid_size=12)
        >>> s.update(torch.rand(3, 2, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.num_train
        8
    """

    name = "wiski"
    model_cls = WiskiGP
    mll_cls = WoodburyMarginalLogLikelihood

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        restandardize: bool = True,
        **kwargs: Any,
    ) -> None:
        self.restandardize = bool(restandardize)
        super().__init__(train_X, train_Y, train_Yvar, **kwargs)

    @property
    def _restandardizes(self) -> bool:
        # Known noise keeps the initial design's standardisation (see the class docstring).
        return self.restandardize and not self.fixed_noise

    def _default_kernel(self, dim: int) -> Kernel:
        # Re-standardised outcomes have unit variance, as SingleTaskGP's: its kernel fits.
        if self._restandardizes:
            return get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        return super()._default_kernel(dim)

    def fit(self, max_iter: int | None = None) -> None:
        if self._restandardizes and self._model.num_train > 1:
            self._model.restandardize()
        super().fit(max_iter)


class AdditiveWiskiSurrogate(WiskiSurrogate):
    r""":class:`AdditiveWiskiGP` (singleton groups): WISKI for 4-20-D search spaces.

    As :class:`WiskiSurrogate` (restandardised at each refit by default), with the model's
    own additive kernel (a scaled RBF per group) unless ``kernel_factory`` gives one (an
    ``AdditiveKernel`` with one part per group). ``grid_size``: points per group axis.

    Example:
        >>> X = torch.rand(5, 6, dtype=torch.float64)
        >>> s = AdditiveWiskiSurrogate(X, X.sum(-1, keepdim=True))
        >>> s.update(torch.rand(3, 6, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.num_train
        8
    """

    name = "wiski-additive"
    model_cls = AdditiveWiskiGP

    def _default_kernel(self, dim: int) -> Kernel | None:
        return None  # the model's own additive kernel


class KissSurrogate(_GridSurrogate):
    r""":class:`KissGP` (KISS-GP): grid interpolation without WISKI's online caches.

    ``observe`` appends the data; the next prediction re-reads all of it. Refits use
    gpytorch's CG-based exact marginal likelihood. A checkpoint stores the initial
    design (which fixes the frozen transforms) and the transformed training data, so
    a restored model is bit-for-bit the saved one.

    Args:
        grid_size: Grid points per dimension (``None``: ``KissGP``'s default).
        **kwargs: As :class:`Surrogate`.

    Example:
        >>> X = torch.rand(5, 2, dtype=torch.float64)
        >>> s = KissSurrogate(X, X.sum(-1, keepdim=True), grid_size=12)
        >>> s.update(torch.rand(3, 2, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.num_train
        8
    """

    name = "kissgp"
    model_cls = KissGP
    mll_cls = ExactMarginalLogLikelihood

    def state_dict(self) -> dict[str, Any]:
        model = self._model
        noise = model.likelihood.noise.detach() if self.fixed_noise else None
        data = (model.train_inputs[0], model.train_targets, noise)
        return {"initial": self.initial, "data": data, "model": model.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.initial = state["initial"]
        self._model = self._build()
        self._model.load_state_dict(state["model"])
        # The transformed data exactly as saved, set last: replaying observe, or
        # BoTorch's load_state_dict, re-transforms targets, which need not round alike.
        self._model._set_data(*state["data"])
        self._model.eval()


class OnlineSVGPSurrogate(_CheckpointedSurrogate):
    r""":class:`OnlineSVGP` (O-SVGP with generalized-VI weight ``beta``) for the loops.

    A batch is absorbed with ``update_steps`` Adam steps on its streaming bound; a
    refit takes ``max_iter`` (default ``fit_steps``) more on the bound of the last
    batch, with the old posterior still frozen (:meth:`OnlineSVGP.refine`). Both cost
    ``O(q M^2 + M^3)`` per step whatever ``n``. Each call starts a fresh Adam, so a
    checkpoint holds the whole state and a resumed run is the uninterrupted one.
    The ``M`` inducing points start as a scrambled Sobol set in the unit cube (the
    loops' domain) and are learned, so the initial design may be smaller than ``M``.
    The outcome is standardised with the initial design's statistics, then frozen.

    Args:
        num_inducing: ``M`` (the WISKI paper uses 1000 in its BO runs).
        beta: Weight of the KL terms (Stanton et al.'s ``1e-3``).
        lr: Adam learning rate.
        update_steps: Adam steps per absorbed batch (and on the initial design).
        fit_steps: Adam steps per refit when ``max_iter`` is ``None``.
        seed: Seed of the Sobol inducing points.
        **kwargs: As :class:`Surrogate`. Known noise (``train_Yvar``) is not supported.

    Example:
        >>> X = torch.rand(5, 2, dtype=torch.float64)
        >>> s = OnlineSVGPSurrogate(X, X.sum(-1, keepdim=True), num_inducing=16)
        >>> s.update(torch.rand(3, 2, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.num_observed
        8
    """

    name = "osvgp"

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        kernel_factory: KernelFactory | None = None,
        num_inducing: int = 256,
        beta: float = 1e-3,
        lr: float = 1e-2,
        update_steps: int = 20,
        fit_steps: int = 100,
        seed: int = 0,
    ) -> None:
        if train_Yvar is not None:
            raise ValueError(
                "osvgp: known observation noise (train_Yvar) is not supported; O-SVGP "
                "learns a homoskedastic Gaussian noise."
            )
        check_count(num_inducing, "num_inducing", minimum=1)
        check_count(fit_steps, "fit_steps", minimum=1)
        super().__init__(train_X, train_Y, kernel_factory=kernel_factory)
        self.fit_steps = fit_steps
        dim = train_X.shape[-1]
        inducing_points = _sobol_points(num_inducing, dim, seed, train_X)
        covar_module = self._covar_module(dim)
        self._model = OnlineSVGP(
            train_X,
            train_Y,
            inducing_points=inducing_points,
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

    def update(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        if Yvar is not None:
            raise ValueError("osvgp: known observation noise (Yvar) is not supported.")
        self._model.observe(X, Y)

    def fit(self, max_iter: int | None = None) -> None:
        self._model.refine(self.fit_steps if max_iter is None else int(max_iter))


class ExactSurrogate(Surrogate):
    r"""BoTorch's exact :class:`SingleTaskGP`, rebuilt on all data after each batch.

    Hyperparameters are warm-started from the previous model; the outcome
    ``Standardize`` transform is refitted to all data on each rebuild, as
    ``SingleTaskGP`` does by default.

    Example:
        >>> X = torch.rand(5, 2, dtype=torch.float64)
        >>> s = ExactSurrogate(X, X.sum(-1, keepdim=True))
        >>> s.update(torch.rand(3, 2, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.train_inputs[0].shape
        torch.Size([8, 2])
    """

    name = "exact"

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        kernel_factory: KernelFactory | None = None,
    ) -> None:
        super().__init__(train_X, train_Y, train_Yvar, kernel_factory=kernel_factory)
        self.X, self.Y, self.Yvar = train_X, train_Y, train_Yvar
        self._model = self._build(hyperparameters=None)

    def _build(self, hyperparameters: dict[str, Tensor] | None) -> SingleTaskGP:
        model = SingleTaskGP(
            self.X,
            self.Y,
            self.Yvar,
            covar_module=self._covar_module(self.X.shape[-1]),
            outcome_transform=Standardize(m=1),
        )
        if hyperparameters is not None:
            model.load_state_dict(hyperparameters, strict=False)
        return model.eval()

    def _hyperparameters(self) -> dict[str, Tensor]:
        # The outcome transform's statistics are data, not hyperparameters: they
        # are refitted by the rebuild; fixed noise levels are data too.
        return {
            key: value
            for key, value in self._model.state_dict().items()
            if not key.startswith("outcome_transform") and "noise_covar.noise" not in key
        }

    def update(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        if (Yvar is None) == self.fixed_noise:
            raise ValueError("Yvar must be given exactly when the surrogate has fixed noise.")
        self.X = torch.cat([self.X, X])
        self.Y = torch.cat([self.Y, Y])
        if Yvar is not None:
            self.Yvar = torch.cat([self.Yvar, Yvar])
        self._model = self._build(self._hyperparameters())

    def fit(self, max_iter: int | None = None) -> None:
        _fit(ExactMarginalLogLikelihood(self._model.likelihood, self._model), max_iter)

    def state_dict(self) -> dict[str, Any]:
        return {"X": self.X, "Y": self.Y, "Yvar": self.Yvar, "model": self._hyperparameters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.X, self.Y, self.Yvar = state["X"], state["Y"], state["Yvar"]
        self._model = self._build(state["model"])


class SoftKISurrogate(WiskiSurrogate):
    r""":class:`OnlineSoftKIGP`: constant-time updates in any input dimension (no grid).

    A BO loop starts from a handful of points, too few to learn SoftKI's interpolation
    points from (SoftKI's Algorithm 1 would place ``m <= n_0`` points on them), so the
    ``num_inducing`` points are a scrambled Sobol design of the unit cube (where the
    loops' inputs live) and the softmax temperature is SoftKI's default for them (or
    ``relative_temperature`` times their median nearest-neighbour distance); both stay
    fixed. The kernel (BoTorch's dim-scaled RBF, in a ``ScaleKernel`` unless
    ``restandardize``, as for the grid models) and the noise are refitted on the exact
    SoftKI likelihood from the statistics, ``O(m^3)`` whatever ``n`` is.

    Args:
        num_inducing: Interpolation points ``m`` (default 256).
        seed: Seed of the Sobol design.
        relative_temperature: Softmax temperature as a multiple of the median distance
            from a Sobol point to its nearest neighbour. A smaller one concentrates each
            input's weights on fewer points (a less smooth, more local surrogate).
            ``None`` (default): SoftKI's ``DEFAULT_RELATIVE_TEMPERATURE`` (0.5).
        restandardize: As :class:`WiskiSurrogate` (the kept data follow).
        **kwargs: As :class:`Surrogate`.

    Example:
        >>> X = torch.rand(5, 6, dtype=torch.float64)
        >>> s = SoftKISurrogate(X, X.sum(-1, keepdim=True), num_inducing=64)
        >>> s.update(torch.rand(3, 6, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.num_train
        8
    """

    name = "softki"
    model_cls = OnlineSoftKIGP

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        kernel_factory: KernelFactory | None = None,
        num_inducing: int = 256,
        seed: int = 0,
        relative_temperature: float | None = None,
        restandardize: bool = True,
    ) -> None:
        self.num_inducing = check_count(num_inducing, "num_inducing", minimum=1)
        self.seed = seed
        check_positive_number(relative_temperature, "relative_temperature", allow_none=True)
        self.relative_temperature = relative_temperature
        super().__init__(
            train_X,
            train_Y,
            train_Yvar,
            kernel_factory=kernel_factory,
            restandardize=restandardize,
        )

    def _model_options(self, train_X: Tensor) -> dict[str, Any]:
        points = _sobol_points(self.num_inducing, train_X.shape[-1], self.seed, train_X)
        options = {"inducing_points": points, "pretrain_epochs": 0}
        if self.relative_temperature is not None and len(points) > 1:
            distance = torch.cdist(points, points).fill_diagonal_(math.inf)
            nearest = distance.min(-1).values.median().item()
            options["temperature"] = self.relative_temperature * nearest
        return options


SURROGATES: dict[str, type[Surrogate]] = {
    cls.name: cls
    for cls in (
        WiskiSurrogate,
        AdditiveWiskiSurrogate,
        KissSurrogate,
        OnlineSVGPSurrogate,
        SoftKISurrogate,
        ExactSurrogate,
    )
}


#: The surrogate :func:`choose_surrogate` picks: WISKI's product grid up to 3-D, where
#: it costs no more than ``SingleTaskGP`` per step at any n; the additive WISKI above,
#: where a product grid would put ``4^d`` weights on every input.
MAX_PRODUCT_GRID_DIM = 3


def choose_surrogate(dim: int) -> str:
    r"""The streaming surrogate for ``dim``-dimensional inputs (``--models auto``).

    ``"wiski"`` for ``dim <= MAX_PRODUCT_GRID_DIM``, ``"wiski-additive"`` above.

    Example:
        >>> choose_surrogate(3), choose_surrogate(6)
        ('wiski', 'wiski-additive')
    """
    check_count(dim, "dim", minimum=1)
    return "wiski" if dim <= MAX_PRODUCT_GRID_DIM else "wiski-additive"


def make_surrogate(
    name: str,
    train_X: Tensor,
    train_Y: Tensor,
    train_Yvar: Tensor | None = None,
    **options: Any,
) -> Surrogate:
    r"""Build the surrogate registered as ``name`` (see ``SURROGATES``).

    Raises:
        ValueError: ``name`` is not registered (the message lists the choices).
    """
    if name not in SURROGATES:
        raise ValueError(f"model must be one of {sorted(SURROGATES)}, got {name!r}.")
    return SURROGATES[name](train_X, train_Y, train_Yvar, **options)
