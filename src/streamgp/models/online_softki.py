r"""Online SoftKI: soft kernel interpolation with constant-time (in ``n``) updates.

SoftKI (Camaño & Huang, "High-Dimensional Gaussian Process Regression with Soft
Kernel Interpolation", 2024; :class:`~streamgp.models.SoftKIGP`) approximates the
kernel by ``W K_zz W^T`` with ``m`` learned interpolation points ``Z`` and dense
softmax weights ``W`` of temperature ``T`` (Definition 4.1). The paper trains and
predicts in batch: every refit or prediction cache costs ``O(n m^2)``, and new data
mean a new factorisation of all data.

What is new here: with ``Z`` and ``T`` *fixed*, SoftKI is kernel interpolation with a
different ``W``, so the grid-space algebra of WISKI (Stanton et al., "Kernel
Interpolation for Scalable Online Gaussian Processes", AISTATS 2021) applies
unchanged. :class:`OnlineSoftKIGP` is a :class:`~streamgp.models.WiskiGP` whose
interpolation is SoftKI's softmax onto ``Z`` (:class:`SoftmaxPointInterpolation`, the
only seam) and whose kernel root is a dense Cholesky factor of ``K_zz``
(:func:`~streamgp.linalg.grid_kernel.point_kernel_root`). Everything else is WISKI's
code path, unchanged:

- the model keeps only ``A = W^T Lambda^{-1} W``, ``b = W^T Lambda^{-1} y``,
  ``y^T Lambda^{-1} y`` and ``n`` (:class:`~streamgp.linalg.statistics.GridStatistics`):
  ``O(m^2)`` memory at any ``n``;
- :meth:`~streamgp.models.WiskiGP.observe` absorbs ``q`` points in ``O(m^2 q)`` (a
  rank-``q`` root update, or a refactorisation when ``q`` is a large fraction of ``m``);
- :meth:`~streamgp.models.WiskiGP.condition_on_observations` (BoTorch's ``fantasize``,
  qKG, qNIPV, ...) adds a rank-``q`` correction, batched over fantasies;
- :meth:`~streamgp.models.WiskiGP.fit_objective` is the *exact* SoftKI log marginal
  likelihood ``log N(y | c 1, W K_zz W^T + Lambda)`` from the statistics in ``O(m^3)``,
  whatever ``n`` is, so ``fit_gpytorch_mll(ExactMarginalLogLikelihood(likelihood,
  model))`` refits the kernel and the noise at a cost independent of ``n``;
- known observation noise (``train_Yvar``), LOVE variances, ``restandardize`` and
  ``checkpoint``/``restore`` come with it.

Defaults are ``SingleTaskGP``'s: ``outcome_transform=Standardize(m=1)`` and a learned
constant prior mean ``c`` (``mean_module``; ``ZeroMean()`` for zero). Softmax rows sum
to one (``W 1 = 1``), so the model with mean ``c`` is exactly the zero-mean model on
``y - c``, plus ``c`` in predictions, and the statistics of ``y - c`` follow from those
of ``y`` (:meth:`~streamgp.linalg.statistics.GridStatistics.shift`, differentiable in
``c``): WISKI's constant mean, unchanged. The pretraining below learns ``c`` with the
kernel, ``fit_gpytorch_mll`` refits it, and ``restandardize`` carries it to the new units.

``Z`` and ``T`` are learned once, by SoftKI's Algorithm 1 (:meth:`SoftKIGP.fit`, the
Hutchinson pseudo-loss) on the constructor's batch, and then frozen: the statistics
are sums over ``W(x_i)``, which change with ``Z`` and ``T``, so re-learning them needs
the raw data. ``keep_data=True`` keeps the (transformed) observations, ``O(n d)``
memory, so that :meth:`OnlineSoftKIGP.refit_points` can re-learn ``Z`` and ``T`` on all
data and rebuild the statistics (``O(n m^2)``).

Posteriors equal those of a batch :class:`~streamgp.models.SoftKIGP` with the same
``Z``, ``T`` and hyperparameters on the same data (tested to 1e-8): SoftKI's QR
factorisation and WISKI's ``I + L^T A L`` Cholesky are two factorisations of one model.
The QR is better conditioned for tiny noise; grid space needs ``I + L^T A L / s2`` to
be factorable, which holds for any noise BoTorch's default constraints allow.

References:

.. [Camano2024] C. Camaño, D. Huang. High-Dimensional Gaussian Process Regression
    with Soft Kernel Interpolation. arXiv preprint, 2024.
.. [Stanton2021] S. Stanton, W. J. Maddox, I. Delbridge, A. G. Wilson. Kernel
    Interpolation for Scalable Online Gaussian Processes. International Conference on
    Artificial Intelligence and Statistics, 2021.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import Mean
from torch import Tensor

from streamgp import settings
from streamgp.interpolation.grid import InterpolationWeights, grown_grid_bounds
from streamgp.interpolation.softmax import (
    DenseInterpolationWeights,
    FarFromPointsWarning,
    far_from_points,
    softmax_interpolation,
    warn_far_predictions,
)
from streamgp.linalg.grid_kernel import GridKernelRoot, point_kernel_root
from streamgp.models.softki import (
    DEFAULT_NUM_INDUCING,
    SoftKIGP,
    check_constant_mean,
    check_point_options,
    median_nearest_distance,
)
from streamgp.models.utils import transaction
from streamgp.models.utils.defaults import DEFAULT, _DefaultType
from streamgp.models.wiski import WiskiGP
from streamgp.settings import active_value_checks, skip_value_checks, value_warning
from streamgp.utils.validation import (
    check_count,
    check_grid_model_data,
    check_kernel,
    check_positive_number,
    check_tensor,
)

#: Epochs of SoftKI's Algorithm 1 run on the constructor's batch by default.
DEFAULT_PRETRAIN_EPOCHS = 50
#: ``SoftKIGP.fit`` options the model sets itself (not through ``pretrain_options``).
_RESERVED_FIT_OPTIONS = ("num_epochs", "check_noise")


class SoftmaxPointInterpolation(torch.nn.Module):
    r"""SoftKI's softmax interpolation onto fixed points, with a grid interpolation's interface.

    What :class:`~streamgp.models.WiskiGP` asks of its interpolation
    (:class:`~streamgp.interpolation.Interpolation`: ``weights``,
    ``num_grid``, ``dim``, ``bounds``, ``check_inside``, ``prediction_inputs``), for
    the free points ``Z`` and temperature ``T`` of SoftKI. The points and the
    temperature are buffers (saved in ``state_dict``, moved with the model, never
    trained by a hyperparameter fit).

    Args:
        points: ``m x d`` interpolation points ``Z`` (transformed input space).
        temperature: Softmax temperature ``T > 0``.
        top_k: Keep only the ``top_k`` largest weights per row (renormalised), as sparse
            :class:`~streamgp.interpolation.grid.InterpolationWeights`; None: dense.
        squared: Weights ``exp(-||x - z||^2 / T)`` instead of ``exp(-||x - z|| / T)``.

    Example:
        >>> Z = torch.rand(32, 3, dtype=torch.float64)
        >>> interpolation = SoftmaxPointInterpolation(Z, 0.1)
        >>> interpolation.weights(torch.rand(5, 3, dtype=torch.float64)).values.shape
        torch.Size([5, 32])
    """

    def __init__(
        self,
        points: Tensor,
        temperature: float | Tensor,
        top_k: int | None = None,
        squared: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("points", points.detach().clone())
        value = torch.as_tensor(temperature, dtype=points.dtype).to(points.device).reshape(())
        self.register_buffer("temperature", value.detach().clone())
        self.top_k = top_k
        self.squared = squared

    @property
    def num_grid(self) -> int:
        r"""Number ``m`` of interpolation points (the "grid" of the WISKI algebra)."""
        return self.points.shape[-2]

    @property
    def dim(self) -> int:
        return self.points.shape[-1]

    @property
    def grid_size(self) -> list[int]:
        return [self.num_grid]

    @property
    def bounds(self) -> Tensor:
        r"""``2 x d`` bounding box of the points (dtype and device of the model)."""
        return torch.stack([self.points.min(0).values, self.points.max(0).values])

    def check_inside(self, X: Tensor, name: str = "X") -> None:
        r"""Nothing to refuse (softmax weights are defined at every input); inputs far
        from every point get a :class:`FarFromPointsWarning` (e.g. a conditioning there)."""
        warn_far_predictions(X, self.points, self.FAR_MARGIN, name)

    #: See :data:`streamgp.settings.FAR_MARGIN` (overridable here).
    FAR_MARGIN = settings.FAR_MARGIN

    def far(self, X: Tensor) -> Tensor:
        r"""Whether any row of ``X`` lies more than :attr:`FAR_MARGIN` of the points' box
        beyond it (a boolean tensor, computed on the device)."""
        return far_from_points(X, self.points, self.FAR_MARGIN)

    def prediction_inputs(self, X: Tensor, extrapolation: str = "nearest", name: str = "X"):
        r"""``X`` itself: softmax weights extrapolate (towards the nearest points), with a
        :class:`FarFromPointsWarning` for inputs far from every point."""
        warn_far_predictions(X, self.points, self.FAR_MARGIN, name)
        return X

    def weights(self, X: Tensor) -> DenseInterpolationWeights | InterpolationWeights:
        r"""Softmax weights of ``batch x N x d`` transformed inputs (differentiable in ``X``)."""
        return softmax_interpolation(
            X, self.points, self.temperature, top_k=self.top_k, squared=self.squared
        )

    def extra_repr(self) -> str:
        return f"num_points={self.num_grid}, top_k={self.top_k}, squared={self.squared}"


def _check_top_k(top_k: object, m: int) -> None:
    if top_k is not None and (
        not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= m
    ):
        raise ValueError(
            f"top_k must be None or an int in [1, {m}] (the number of points), got {top_k!r}."
        )


def _check_fit_options(options: object, name: str) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"{name} must be a dict of SoftKIGP.fit options, got {type(options)}.")
    reserved = sorted(set(options) & set(_RESERVED_FIT_OPTIONS))
    if reserved:
        raise ValueError(f"{name} must not set {reserved} (use the model's own argument).")
    return dict(options)


class OnlineSoftKIGP(WiskiGP):
    r"""SoftKI with frozen interpolation points and WISKI's constant-time online updates.

    Builds (and by default learns, with SoftKI's Algorithm 1 on the constructor's batch)
    ``m`` interpolation points ``Z`` and a temperature ``T``, freezes them, and from then
    on is a :class:`~streamgp.models.WiskiGP` whose interpolation is SoftKI's softmax
    onto ``Z``: ``observe`` in ``O(m^2 q)``, rank-``q`` ``condition_on_observations`` /
    ``fantasize``, the exact SoftKI marginal likelihood in ``O(m^3)`` whatever ``n``
    (``fit_gpytorch_mll`` refits kernel, noise and constant mean, never ``Z`` or
    ``T``), joint posteriors, known noise, ``checkpoint`` / ``restore``.

    Args:
        train_X: ``n x d`` training inputs. ``n`` may be 0 if ``inducing_points`` is
            given (nothing to pretrain on).
        train_Y: ``n x 1`` training targets.
        train_Yvar: Optional ``n x 1`` known noise variances (fixed heteroskedastic
            noise; ``observe`` then requires ``Yvar``). Pretraining uses their mean as a
            fixed homoskedastic noise level (it only shapes ``Z``, ``T`` and the
            kernel); the statistics weight every row by its own variance.
        likelihood: Gaussian likelihood (learned noise). Default: BoTorch's
            ``SingleTaskGP`` likelihood. Must be omitted with ``train_Yvar``.
        covar_module: Kernel of the points. Default: BoTorch's ``SingleTaskGP`` kernel.
        outcome_transform: Outcome transform, fitted on ``train_Y`` and then frozen.
            Default: ``Standardize(m=1)``, as ``SingleTaskGP``'s (no transform when
            ``train_Y`` is empty); None: no transform.
        input_transform: Input transform, fitted on ``train_X`` and then frozen.
        mean_module: The prior mean, in the transformed output space. None (default): a
            ``ConstantMean`` whose constant is learned (by the pretraining and by
            ``fit_gpytorch_mll``), as ``SingleTaskGP``'s; ``ZeroMean()`` for a zero
            mean; or a given (unbatched) ``ConstantMean``. Other means raise
            ``ValueError`` (:func:`~streamgp.models.softki.check_constant_mean`).
        num_inducing: Number ``m`` of points, initialised at k-means centres of the
            transformed inputs. Default ``min(512, n)`` (SoftKI's rule; at most ``n``),
            so the first batch should be representative of the stream.
        inducing_points: ``m x d`` initial points (transformed space) instead of k-means.
        temperature: Initial temperature ``T > 0``. Default: SoftKI's (half the median
            nearest-neighbour distance of the points).
        top_k: Keep only the ``top_k`` largest softmax weights per row (renormalised):
            sparse rows, ``O(top_k^2)`` per row for the statistics instead of
            ``O(m^2)``. None (default): SoftKI's dense weights.
        squared_distance: Weights ``exp(-||x - z||^2 / T)``.
        pretrain_epochs: Epochs of :meth:`SoftKIGP.fit` on the constructor's batch
            (learns ``Z``, ``T``, the kernel, the noise and the constant mean); 0 keeps
            the initial values.
        pretrain_options: Further :meth:`SoftKIGP.fit` options (``batch_size``, ``lr``,
            ``num_probes``, ``learn_noise``, ``seed``).
        keep_data: Keep every observation (transformed), ``O(n d)`` memory (default),
            so that the points can follow the data (``follow_data``) and
            :meth:`refit_points` / :meth:`set_points` can re-learn or move them. False:
            the model keeps ``O(m^2)`` statistics only, and absorbs a batch far outside
            the points with a :class:`FarFromPointsWarning`.
        follow_data: With ``keep_data``, a batch that lands far outside the points
            (more than :attr:`SoftmaxPointInterpolation.FAR_MARGIN` of their box's
            largest side beyond it) moves them, exactly: the points are mapped affinely
            from their box onto a box grown over the batch
            (:func:`~streamgp.interpolation.grid.grown_grid_bounds`, as the grid models
            grow theirs), the temperature scales with their median nearest-neighbour
            distance (its square for ``squared_distance``), and the statistics are
            rebuilt from the kept data (:meth:`set_points`, ``O(n m^2)``). Each move
            grows a passed side by at least half the box, so moves are rare (``O(d
            log(range))`` over a stream) and the amortised cost per batch stays small.
            False: such a batch is absorbed with a :class:`FarFromPointsWarning`, the
            points stay where they are.
        seed: Seed of the k-means++ initialisation.
        exact_prior_variance: As in ``WiskiGP`` (default True): predictive variances
            get ``k(x, x) - w(x)^T K_zz w(x)`` with the softmax weights ``w(x)``
            (:mod:`streamgp.linalg.prior_variance`), so the prior variance is the
            kernel's own, also far from the points; False: the exact SoftKI posterior
            (as the batch :class:`~streamgp.models.SoftKIGP` predicts).

    Example:
        >>> X = torch.rand(300, 6, dtype=torch.float64)
        >>> f = lambda X: torch.sin(3 * X).sum(-1, keepdim=True)
        >>> model = OnlineSoftKIGP(X, f(X), num_inducing=64, pretrain_epochs=5)
        >>> X_new = torch.rand(10, 6, dtype=torch.float64)
        >>> model = model.observe(X_new, f(X_new))  # O(m^2 q), whatever n
        >>> posterior = model.posterior(torch.rand(4, 6, dtype=torch.float64))
    """

    data_state_prefixes = (*WiskiGP.data_state_prefixes, "interpolation.")
    #: WiskiGP's, and the kept observations (a list replaced, not written into).
    mutable_state = replace(
        WiskiGP.mutable_state, attributes=(*WiskiGP.mutable_state.attributes, "_kept")
    )
    #: What :meth:`refit_points` and :meth:`restandardize` may change besides: the
    #: hyperparameters and the transform they write into.
    _refit_state = replace(
        mutable_state,
        modules=("likelihood", "outcome_transform", "mean_module", "covar_module"),
    )

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
        top_k: int | None = None,
        squared_distance: bool = False,
        pretrain_epochs: int = DEFAULT_PRETRAIN_EPOCHS,
        pretrain_options: dict[str, Any] | None = None,
        keep_data: bool = True,
        follow_data: bool = True,
        seed: int = 0,
        exact_prior_variance: bool = True,
    ) -> None:
        # Validate everything before any state is created.
        check_grid_model_data(train_X, train_Y, train_Yvar, likelihood)
        n = len(train_X)
        check_point_options(train_X, num_inducing, inducing_points, temperature, squared_distance)
        if inducing_points is not None:
            m = len(inducing_points)
        elif n == 0:
            raise ValueError(
                "train_X is empty: pass inducing_points (and optionally temperature), as there "
                "is nothing to place or learn the interpolation points on."
            )
        else:
            m = min(DEFAULT_NUM_INDUCING if num_inducing is None else num_inducing, n)
        _check_top_k(top_k, m)
        check_count(pretrain_epochs, "pretrain_epochs", minimum=0)
        pretrain_options = _check_fit_options(pretrain_options, "pretrain_options")
        for name, flag in (("keep_data", keep_data), ("follow_data", follow_data)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}.")
        check_kernel(covar_module)
        check_constant_mean(mean_module)

        def learn_interpolation(
            X_t: Tensor, y: Tensor, noise: Tensor | None
        ) -> SoftmaxPointInterpolation:
            # Called by WiskiGP's constructor once the kernel and likelihood exist: the
            # softmax points replace the grid, the rest of WiskiGP is used as it is.
            X_t, y = X_t.detach(), y.detach()
            noise = None if noise is None else noise.detach()
            points, temp = self._learn_points(
                X_t,
                y,
                noise,
                num_inducing=num_inducing,
                inducing_points=inducing_points,
                temperature=temperature,
                squared_distance=squared_distance,
                num_epochs=pretrain_epochs,
                fit_options=pretrain_options,
                seed=seed,
            )
            self._kept: list[tuple[Tensor, Tensor, Tensor | None]] = []
            if keep_data and n:
                self._kept = [(X_t.clone(), y.clone(), noise)]
            return SoftmaxPointInterpolation(points, temp, top_k, squared_distance)

        super().__init__(
            train_X,
            train_Y,
            train_Yvar,
            likelihood,
            covar_module,
            outcome_transform,
            input_transform,
            interpolation=learn_interpolation,
            mean_module=mean_module,
            exact_prior_variance=exact_prior_variance,
        )
        self.keep_data = keep_data
        self.follow_data = follow_data

    # ---------------------------------------------------------- interpolation
    @property
    def inducing_points(self) -> Tensor:
        r"""The frozen ``m x d`` interpolation points ``Z`` (transformed input space)."""
        return self.interpolation.points

    @property
    def temperature(self) -> Tensor:
        r"""The frozen softmax temperature ``T``."""
        return self.interpolation.temperature

    @property
    def num_inducing(self) -> int:
        r"""Number ``m`` of interpolation points."""
        return self.interpolation.num_grid

    @property
    def top_k(self) -> int | None:
        return self.interpolation.top_k

    @property
    def squared_distance(self) -> bool:
        return self.interpolation.squared

    def kernel_root(self) -> GridKernelRoot:
        r"""Root ``L`` of ``K_zz`` at the current hyperparameters (dense; differentiable)."""
        return point_kernel_root(self.covar_module, self.interpolation.points)

    def _learn_points(
        self,
        X_t: Tensor,
        y: Tensor,
        noise: Tensor | None,
        *,
        num_inducing: int | None,
        inducing_points: Tensor | None,
        temperature: float | None,
        squared_distance: bool,
        num_epochs: int,
        fit_options: dict[str, Any],
        seed: int,
    ) -> tuple[Tensor, Tensor]:
        r"""SoftKI's Algorithm 1 on ``(X_t, y)``: points and temperature (then frozen).

        A batch :class:`SoftKIGP` sharing this model's kernel and constant mean (and
        likelihood, for learned noise) is fitted on the already-transformed data (no
        transform of its own); its points and temperature are returned.
        """
        if len(y) == 0:  # nothing to learn from: the given points, SoftKI's default T
            if temperature is None:
                holder = SimpleNamespace(
                    inducing_points=inducing_points, squared_distance=squared_distance
                )
                temperature = SoftKIGP._default_temperature(holder)
            return inducing_points.detach().clone(), torch.as_tensor(temperature).to(X_t)
        if self.fixed_noise:
            # SoftKIGP learns one noise level: pretrain at the mean known variance.
            mean_noise = noise.mean()
            pretrain_likelihood = GaussianLikelihood(
                noise_constraint=GreaterThan(min(1e-4, 0.5 * mean_noise.item()))
            ).to(X_t)
            pretrain_likelihood.noise = mean_noise
            fit_options = {**fit_options, "learn_noise": False}
        else:
            pretrain_likelihood = self.likelihood
        softki = SoftKIGP(
            X_t,
            y.unsqueeze(-1),
            likelihood=pretrain_likelihood,
            covar_module=self.covar_module,
            outcome_transform=None,
            mean_module=self.mean_module,
            num_inducing=num_inducing,
            inducing_points=inducing_points,
            temperature=temperature,
            # Pretraining learns the temperature with the points, as before SoftKIGP's
            # default fixed it (OnlineSoftKIGP's calibration was measured with it).
            learn_temperature=True,
            squared_distance=squared_distance,
            seed=seed,
        )
        if num_epochs > 0:
            # Known noise is the data's (pretraining holds its mean fixed): no check.
            softki.fit(num_epochs=num_epochs, check_noise=False, **fit_options)
        return softki.inducing_points.detach().clone(), softki.temperature.detach().clone()

    # ------------------------------------------------------------ raw data
    def kept_data(self) -> tuple[Tensor, Tensor, Tensor | None]:
        r"""Every observation kept with ``keep_data=True``: transformed ``(X, y, Yvar)``.

        Returns:
            ``n x d`` inputs, ``n`` targets and ``n`` noise variances (None for learned
            noise), in the transformed spaces. Conditioning (fantasies) is not included.

        Raises:
            RuntimeError: If the model was built with ``keep_data=False``.
        """
        if not self.keep_data:
            raise RuntimeError(
                "This model keeps no raw data; build it with keep_data=True (O(n d) memory)."
            )
        if not self._kept:
            like = self.interpolation.points
            empty_noise = like.new_zeros(0) if self.fixed_noise else None
            return like.new_zeros(0, self.interpolation.dim), like.new_zeros(0), empty_noise
        if len(self._kept) > 1:  # consolidate (a new list: views share the old one)
            X, y, noise = zip(*self._kept, strict=True)
            self._kept = [
                (torch.cat(X), torch.cat(y), None if noise[0] is None else torch.cat(noise))
            ]
        return self._kept[0]

    def _check_observed_inputs(self, X_t: Tensor) -> None:
        # Softmax weights put a far point on its nearest interpolation points as if it
        # were there: the points follow it (decided in the call's one read), or, without
        # kept data, a warning says so rather than absorb it silently.
        far = self.interpolation.far(X_t)
        if self.keep_data and self.follow_data:
            if skip_value_checks.on():
                return
            checks = active_value_checks()
            if checks is None:
                self._far_batch.append(bool(far))
            else:
                checks.decide(far, self._far_batch.append)
            return

        def warn() -> None:
            warnings.warn(
                "X has points far outside the region of the interpolation points (more "
                f"than {self.interpolation.FAR_MARGIN:g} of its extent beyond their box): "
                "they are absorbed as if at their nearest points. Call refit_points() "
                "(keep_data=True) to re-learn the points over all the data, or start from "
                "a design that covers the search space.",
                FarFromPointsWarning,
                stacklevel=5,
            )

        value_warning(far, warn)  # in observe's one read

    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> OnlineSoftKIGP:
        r"""Absorb new observations in place, in ``O(m^2 q)`` time (independent of ``n``).

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (original space).
            Yvar: ``q x 1`` noise variances; required exactly with ``train_Yvar``.

        Returns:
            The model itself. On invalid input (or any failure), raises and leaves the
            model unchanged.
        """
        with transaction(self):  # the kept rows too
            return self._observe_and_keep(X, Y, Yvar)

    def _observe_and_keep(self, X: Tensor, Y: Tensor, Yvar: Tensor | None) -> OnlineSoftKIGP:
        self._far_batch: list[bool] = []  # set in observe's read (_check_observed_inputs)
        super().observe(X, Y, Yvar)
        if self.keep_data and len(X):
            X_t, Y_t, Yvar_t = self._transform_new_data(X, Y, Yvar)
            row = (
                X_t.detach(),
                Y_t.squeeze(-1).detach(),
                None if Yvar_t is None else Yvar_t.squeeze(-1).detach(),
            )
            self._kept = [*self._kept, row]  # a new list: views share the old one
            if any(self._far_batch):
                self._follow(X_t.detach())
        return self

    def _follow(self, X_t: Tensor) -> None:
        r"""Move the points over a box grown to cover ``X_t`` (see ``follow_data``)."""
        old = self.interpolation.bounds
        new = grown_grid_bounds(old, X_t)
        if new is None:  # pragma: no cover (far implies outside the box)
            return
        extent = old[1] - old[0]
        # An axis on which every point has one coordinate has no scale to stretch.
        scale = torch.where(extent > 0, (new[1] - new[0]) / extent, torch.ones_like(extent))
        points = new[0] + (self.inducing_points - old[0]) * scale
        temperature = self.temperature
        if self.num_inducing >= 2:
            ratio = median_nearest_distance(points) / median_nearest_distance(self.inducing_points)
            temperature = temperature * (ratio**2 if self.squared_distance else ratio)
        X_kept, y, noise = self.kept_data()
        self._use_points(points, temperature, X_kept, y, noise)

    def refit_points(
        self,
        num_epochs: int = DEFAULT_PRETRAIN_EPOCHS,
        num_inducing: int | None = None,
        **fit_options: Any,
    ) -> OnlineSoftKIGP:
        r"""Re-learn ``Z`` and ``T`` (and kernel, noise, constant mean) on all kept data; rebuild.

        Runs SoftKI's Algorithm 1 (:meth:`SoftKIGP.fit`) on every observation kept with
        ``keep_data=True``, starting from the current points and temperature (or from
        ``num_inducing`` fresh k-means points), then rebuilds the statistics from the
        raw data with the new weights: ``O(num_epochs n m^2)`` plus ``O(n m^2)``.

        Args:
            num_epochs: Epochs of :meth:`SoftKIGP.fit`.
            num_inducing: Restart from this many k-means points (default: keep ``m``
                and warm-start from the current points).
            fit_options: Further :meth:`SoftKIGP.fit` options (``batch_size``, ``lr``,
                ``num_probes``, ``learn_noise``, ``seed``).

        Returns:
            The model itself.

        Raises:
            RuntimeError: Without ``keep_data=True``, or on a model conditioned with
                ``condition_on_observations`` (whose rows are not kept).
            ValueError: On invalid options or no data; the model is then unchanged.
                On any failure (an interrupt included) the model is unchanged.
        """
        with transaction(self, self._refit_state):  # it also learns the hyperparameters
            return self._refit_points(num_epochs, num_inducing, **fit_options)

    def _refit_points(
        self, num_epochs: int, num_inducing: int | None, **fit_options: Any
    ) -> OnlineSoftKIGP:
        self._check_refittable("refit_points")
        check_count(num_epochs, "num_epochs", minimum=0)
        check_count(num_inducing, "num_inducing", minimum=1, allow_none=True)
        fit_options = _check_fit_options(fit_options, "fit_options")
        X_t, y, noise = self.kept_data()
        if len(y) == 0:
            raise ValueError("refit_points needs at least one kept observation; there are none.")
        m = self.num_inducing if num_inducing is None else min(num_inducing, len(y))
        _check_top_k(self.top_k, m)
        warm = num_inducing is None
        points, temp = self._learn_points(
            X_t,
            y,
            noise,
            num_inducing=None if warm else num_inducing,
            inducing_points=self.inducing_points if warm else None,
            temperature=self.temperature.item() if warm else None,
            squared_distance=self.squared_distance,
            num_epochs=num_epochs,
            fit_options=fit_options,
            seed=0,
        )
        return self._use_points(points, temp, X_t, y, noise)

    def _use_points(
        self, points: Tensor, temperature: Tensor, X_t: Tensor, y: Tensor, noise: Tensor | None
    ) -> OnlineSoftKIGP:
        # A new module (views made earlier keep the old points and statistics).
        interpolation = SoftmaxPointInterpolation(
            points, temperature, self.top_k, self.squared_distance
        )
        statistics = self._grid_statistics(interpolation, X_t, y, noise, differentiable=False)
        self.interpolation = interpolation
        self._clear_caches()
        self._set_statistics(statistics)
        return self

    def _check_refittable(self, what: str) -> None:
        if not self.keep_data:
            raise RuntimeError(
                f"{what} needs the raw observations: build the model with keep_data=True "
                "(O(n d) memory)."
            )
        if len(self.batch_shape) > 0 or (self._conditioning_log and not self._log_from_observe):
            raise RuntimeError(
                f"{what} is not available on a model conditioned with "
                "condition_on_observations (its rows are not kept); call it on the parent."
            )

    def set_points(
        self, points: Tensor, temperature: float | Tensor | None = None
    ) -> OnlineSoftKIGP:
        r"""Move the interpolation points (and temperature) and rebuild from the kept data.

        The statistics are rebuilt from every observation kept with ``keep_data=True``
        with the softmax weights onto the new points, ``O(n m^2)``; the kernel, the
        noise, the constant mean, the transforms and the kept data are unchanged. The
        model then equals one built on the kept data with these points and this
        temperature (``pretrain_epochs=0``) and the same hyperparameters. What a BO loop
        calls to let the points follow the search (a prediction peaks at an
        interpolation point, so the acquisition's maximisers are points of the set):
        the ``"softki"`` registry entry's ``moving_points`` option.

        Args:
            points: ``m' x d`` new points in the transformed input space (any ``m' >=
                1``; at least ``top_k``).
            temperature: New softmax temperature ``T > 0``; None keeps the current one.

        Returns:
            The model itself.

        Raises:
            RuntimeError: Without ``keep_data=True``, or on a conditioned model.
            ValueError, TypeError: On invalid ``points`` or ``temperature``, naming it;
                the model is then unchanged (as on any failure).

        Example:
            >>> X = torch.rand(40, 2, dtype=torch.float64)
            >>> Y = X.sum(-1, keepdim=True)
            >>> model = OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0, keep_data=True)
            >>> model = model.set_points(torch.rand(16, 2, dtype=torch.float64), 0.05)
            >>> model.num_inducing, round(model.temperature.item(), 2)
            (16, 0.05)
        """
        with transaction(self):
            self._check_refittable("set_points")
            X_t, y, noise = self.kept_data()
            check_tensor(points, "points", like=X_t, min_dim=2, last_dim=self.interpolation.dim)
            if points.dim() != 2 or len(points) < (self.top_k or 1):
                raise ValueError(
                    f"points must have shape M x d with M >= {self.top_k or 1} (top_k), got "
                    f"{tuple(points.shape)}."
                )
            if temperature is None:
                temperature = self.temperature
            elif isinstance(temperature, Tensor):
                if (
                    temperature.numel() != 1
                    or not (torch.isfinite(temperature) & (temperature > 0)).all()
                ):
                    raise ValueError("temperature must be a positive finite scalar.")
            else:
                check_positive_number(temperature, "temperature")
            temperature = torch.as_tensor(temperature).to(points).reshape(()).detach().clone()
            return self._use_points(points.detach().clone(), temperature, X_t, y, noise)

    def restandardize(self, rescale_hyperparameters: bool = True) -> OnlineSoftKIGP:
        r"""As :meth:`WiskiGP.restandardize` (exact: softmax rows sum to one).

        With the standardisation changed to ``alpha y + beta``, the constant mean becomes
        ``alpha c + beta`` (so the model is unchanged when the hyperparameters are
        rescaled too) and the kept data follow.
        """
        with transaction(self, self._refit_state):  # the kept data follow the transform
            return self._restandardize_kept(rescale_hyperparameters)

    def _restandardize_kept(self, rescale_hyperparameters: bool) -> OnlineSoftKIGP:
        transform = getattr(self, "outcome_transform", None)
        before = None
        if isinstance(transform, Standardize):
            before = (transform.means.reshape(()).clone(), transform.stdvs.reshape(()).clone())
        super().restandardize(rescale_hyperparameters)
        if self.keep_data and self._kept:
            old_mean, old_std = before
            new_mean, new_std = transform.means.reshape(()), transform.stdvs.reshape(())
            alpha, beta = old_std / new_std, (old_mean - new_mean) / new_std
            self._kept = [
                (X, alpha * y + beta, None if noise is None else noise * alpha**2)
                for X, y, noise in self._kept
            ]
        return self

    # --------------------------------------------------------------- state
    def _apply_to_state(self, fn) -> None:
        # Device/dtype moves: the kept observations (not buffers) follow the statistics.
        super()._apply_to_state(fn)
        self._kept = [
            (fn(X), fn(y), None if noise is None else fn(noise)) for X, y, noise in self._kept
        ]

    #: A restore takes the checkpoint's points, whatever their number
    #: (``refit_points(num_inducing=...)`` changes it), as a WiskiGP takes its grid.
    ADOPTED_OPTIONS = WiskiGP.ADOPTED_OPTIONS | {"num_inducing"}

    def _checkpoint_options(self) -> dict[str, Any]:
        return {**super()._checkpoint_options(), "num_inducing": self.num_inducing}

    def _stream_state(self) -> dict[str, Any]:
        r"""Options, the cached posterior factors (:meth:`WiskiGP._stream_state`) and
        (``keep_data``) the raw observations."""
        state: dict[str, Any] = {
            "top_k": self.top_k,
            "squared_distance": self.squared_distance,
            "keep_data": self.keep_data,
            "follow_data": self.follow_data,
        }
        state.update(self._posterior_state())
        if self.keep_data:
            X, y, noise = self.kept_data()
            state["kept_X"], state["kept_y"] = X, y
            if noise is not None:
                state["kept_noise"] = noise
        return state

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        self.interpolation.top_k = state["top_k"]
        self.interpolation.squared = bool(state["squared_distance"])
        self.keep_data = bool(state["keep_data"])
        # Checkpoints written before the points could follow the data did not follow.
        self.follow_data = bool(state.get("follow_data", False))
        self._kept = []
        if self.keep_data and len(state["kept_y"]):
            self._kept = [(state["kept_X"], state["kept_y"], state.get("kept_noise"))]
        self._set_posterior_state(state)

    def _prepare_state_load(self, state_dict: dict[str, Any]) -> None:
        # A checkpoint may have another number of points (refit_points(num_inducing=...)).
        points = state_dict.get("interpolation.points")
        if points is not None and points.shape != self.interpolation.points.shape:
            self.interpolation = SoftmaxPointInterpolation(
                points.to(self.interpolation.points),
                self.temperature,
                None,
                self.squared_distance,
            )
