r"""Global settings of streamgp (context managers, as gpytorch's and BoTorch's settings).

It holds two kinds: switches, as context managers (below), and the tuning constants of
the models and numerical kernels (``MAX_DENSE_GRID``, ``FOLD_RANK``, ``DEFAULT_GRID_POINTS``,
...), each defined once here and read as the default of a class attribute or module
constant of the same name where it is used, which can be overridden there.

:class:`skip_value_checks` switches off the checks that read tensor *values* on the host:
finite inputs, inputs inside the grid, positive noise, the info of every Cholesky
factorisation, and the value comparison that tells whether hyperparameters changed since
a cache was built. On a GPU each of these is a host synchronisation that stalls the
device queue; inside the context ``observe``, ``condition_on_observations``, building a
posterior and its mean, and the marginal likelihood of a :class:`~streamgp.WiskiGP`
run without one (tested on CPU by making every host read raise, and on CUDA under
``torch.cuda.set_sync_debug_mode("error")`` when a GPU is present).

What changes inside it:

- Bad values are not reported: NaN inputs give NaN outputs, a point outside the grid
  is clamped to it, a non-positive-definite matrix gives NaNs instead of an error.
- Cached posteriors follow gpytorch's convention instead of comparing hyperparameter
  values: a cache stays valid until the model's state changes (``observe``, a load,
  a device move) or the model is put in training mode (``model.train()``, as
  ``fit_gpytorch_mll`` does). A hyperparameter set by assignment while the model is in
  eval mode is therefore not seen until ``model.train()`` is called.

Outside it the checks still run, but a :class:`~streamgp.WiskiGP`'s hot paths read them
from the device *together*, once per call (:func:`deferred_value_checks`): the input
checks and the hyperparameter comparison of ``posterior``, ``condition_on_observations``
and ``observe`` are gathered into one boolean vector and copied to the host in one read,
before anything is computed from them (the noise variance is checked when the caches are
built, and trusted while the hyperparameters equal the caches' snapshot). A Cholesky
factorisation after that read is not checked there: its failure flag stays on the device
and is read with the model's next call, which then rebuilds the factors from the exact
statistics with checked factorisations (or raises), so no result computed from a failed
factor is ever returned without an error.

Example:
    >>> import torch
    >>> from streamgp import WiskiGP
    >>> from streamgp.settings import skip_value_checks
    >>> X = torch.rand(20, 2, dtype=torch.float64)
    >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10)
    >>> with skip_value_checks():
    ...     model.observe(X[:3], X[:3].sum(-1, keepdim=True)).num_train
    23
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
from gpytorch.settings import _feature_flag
from torch import Tensor

__all__ = [
    "ADDITIVE_GRID_POINTS",
    "DEFAULT_CUDA_GRID_POINTS",
    "DEFAULT_GRID_POINTS",
    "DEFAULT_GROUP_GRID_SIZE",
    "FAR_MARGIN",
    "FOLD_RANK",
    "GATHER_COST_RATIO",
    "GRID_GROWTH",
    "GRID_MARGIN",
    "HIGH_DIM_POINTS_PER_UNIT",
    "LANCZOS_BLOCK_SIZE",
    "LAPACK_MIN_SIZE",
    "LIKELIHOOD_TOLERANCE",
    "LOVE_TOLERANCE",
    "MAX_CACHE_ENTRIES",
    "MAX_DENSE_GRID",
    "MIN_SPACINGS_PER_LENGTHSCALE",
    "NOISE_CHECK_ROWS",
    "PENDING_FRACTION",
    "PREDICTIONS_PER_REFIT",
    "QR_CHUNK",
    "ROOT_UPDATE_MAX_FRACTION",
    "SMALL_NOISE_RATIO",
    "SOFTKI_FIT_MAXITER",
    "STATISTICS_CHUNK",
    "ValueChecks",
    "cuda_graphs",
    "exact_prior_variance",
    "active_value_checks",
    "deferred_value_checks",
    "immediate_value_checks",
    "skip_value_checks",
    "value_check",
    "value_check_all",
    "value_warning",
]

# ------------------------------------------------------------------ tuning constants
# The knobs of streamgp's models and numerical kernels, each defined once here. Where they
# are used they are the default of a class attribute or module constant of the same name
# (``WiskiGP.MAX_DENSE_GRID = settings.MAX_DENSE_GRID``; LOVE's two are
# ``love.DEFAULT_TOLERANCE`` and ``love.DEFAULT_BLOCK_SIZE``), which can be overridden
# there, per class or per module, without touching the others (``WiskiGP.FOLD_RANK = 64``).
# Most trade time for memory and change no result beyond round-off; the grid's default
# size and box, LOVE's tolerance and the warning thresholds are part of what a model is.

# Grids: the default grid, its box and its resolution (streamgp.models.utils.grids,
# streamgp.interpolation.grid, streamgp.models.utils.resolution).

DEFAULT_GRID_POINTS = 1024
r"""Total grid points aimed at by the default ``grid_size`` on a CPU: the dense exact
path, whose ``O(m^3)`` refactorisation takes tens of milliseconds at this size."""
DEFAULT_CUDA_GRID_POINTS = 4096
r"""The same on CUDA, where the dense ``m x m`` algebra is cheap up to ``MAX_DENSE_GRID``
(``16^3``, ``64^2``): finer grids represent rougher functions at no cost in ``n``."""
HIGH_DIM_POINTS_PER_UNIT = 32
r"""Points per unit of (transformed) input extent along every axis of the default grid in
``d >= 4`` dimensions. There the model stays in data space, where an axis costs its
own ``g`` (``O(n^2 sum_i g_i)`` per kernel matrix), never the grid's ``prod_i g_i``."""
DEFAULT_GROUP_GRID_SIZE = {1: 64, 2: 16, 3: 8}
r"""Default points per axis of a group's grid, by the group's size (1, 2 or 3 dimensions):
64, 16^2 = 256 and 8^3 = 512 grid points per group."""
ADDITIVE_GRID_POINTS = 640
r"""Total grid points aimed at by the default singleton groups of ``AdditiveWiskiGP``: 64
points per axis up to ``d = 10``; beyond, ``640 // d`` per axis, but never fewer than
half of ``DEFAULT_GROUP_GRID_SIZE[1]`` (32). The grid algebra costs ``O(m^3)``; at
``d = 20`` the 32-point axes (``m = 640``) cut a marginal-likelihood evaluation from
174-204 to 53-63 ms at the same test RMSE (``benchmarks/additive_grid_budget.py``)."""
MAX_DENSE_GRID = 4096
r"""Largest grid (in points) whose ``m x m`` algebra a grid model forms densely; larger
grids take the structured, LOVE-rooted path (decided at construction)."""
STATISTICS_CHUNK = 8192
r"""Rows per chunk when a grid model accumulates the statistics of many observations."""
GRID_MARGIN = 0.2
r"""Least margin of a grid box beyond the data, on each side, as a fraction of the data's
extent: a grid built on inputs normalised from the data themselves
(``Normalize(d)`` without bounds) then also covers the search box around them, where
acquisition functions evaluate, without re-gridding. Few points leave wider gaps to
the search box's sides, so the margin is at least ``log(40 d) / (n - 1)`` (at most 1):
for ``n`` points drawn uniformly in ``d`` dimensions, the gap at one side exceeds
``t / (n - 1)`` of their extent with probability about ``exp(-t)``, so all ``2 d``
gaps are inside that margin with probability about 0.95."""
GRID_GROWTH = 0.5
r"""A re-grid moves each side it has to move by at least this fraction of the box's
extent, so the extent grows geometrically and a point at distance ``D`` beyond a box
of extent ``E`` costs ``O(log(D / E))`` re-grids in all."""
MIN_SPACINGS_PER_LENGTHSCALE = 2.0
r"""Fewest grid spacings per fitted lengthscale before a grid model warns with
``CoarseGridWarning``: at two spacings SKI's RBF prior variance is within about 1% of
``k(x, x)`` (0.5% at 2.7 and 6% at 1.35 spacings, in the measurement of the docs of
:mod:`streamgp.models.utils.resolution`); ``refine_grid`` aims at it."""

# WISKI's updates and where its posterior is kept (streamgp.models.WiskiGP).

FOLD_RANK = 32
r"""In grid space, small batches are first held as a low-rank correction of the root
(what ``condition_on_observations`` builds, ``O(m q Q)``), and folded into the
statistics and the root once its rank reaches ``FOLD_RANK``: one rank-``Q`` update
of the ``m x m`` root instead of ``Q / q`` memory-bound rank-``q`` ones."""
ROOT_UPDATE_MAX_FRACTION = 0.25
r"""A grid-space batch of ``q`` rows is absorbed by the rank-``q`` root update while
``q <= ROOT_UPDATE_MAX_FRACTION * m``; larger batches refactorise from the
statistics, which is then cheaper (both are exact)."""
PREDICTIONS_PER_REFIT = 100_000
r"""Test-point evaluations expected per hyperparameter change (one BoTorch acquisition
optimisation is ~10^4-10^5), used to choose where the posterior is kept."""

# Linear algebra (streamgp.linalg).

LOVE_TOLERANCE = 1e-8
r"""LOVE's default relative tolerance on the captured trace, ``tr(M - R R^T) / tr(M)``
(``streamgp.linalg.love.DEFAULT_TOLERANCE``; the grid models' ``love_tolerance``)."""
LIKELIHOOD_TOLERANCE = 1e-9
r"""The large-grid marginal likelihood's certified gap, in nats per observation
(``WiskiGP.LIKELIHOOD_TOLERANCE``; see ``WiskiGP.likelihood_gap``): its Nystrom
log-determinant stops at an absolute trace gap of ``1e-9 n`` (never finer than
``love_tolerance``), so the log-determinant is within ``5e-10`` per observation of exact SKI's
(the quadratic term is CG's, to a relative residual of ``1e-12``). That is below the change
per observation (``2.2e-9`` of a per-datum objective near one) at which BoTorch's L-BFGS-B
stops. The Lanczos pass cannot resolve less than its round-off floor, ``1e3 eps tr(G)`` with
``tr(G)`` about ``n`` times the signal-to-noise variance ratio (``0.1 eps_32 tr(G)`` for
float32 statistics), which is coarser than this gap above a ratio of about ``4.5e3`` in
float64 and at any ratio in float32: there the floor sets the gap, as before. At ``32^3``
and ``n = 10^4`` the gap takes the Lanczos rank from 576 to 320 and a value + gradient from
8.5 to 4.3 s on one CPU thread; the gradient differed from the tighter gap's by ``1.5e-10``
(relative, measured: the gap bounds the value, not the gradient;
``benchmarks/likelihood_tolerance.py``)."""
LANCZOS_BLOCK_SIZE = 64
r"""Columns per block of ``streamgp.linalg.love.block_lanczos_root`` (its
``DEFAULT_BLOCK_SIZE``: products with ``M`` and the re-orthogonalisation become
matrix-matrix products of this width)."""
PENDING_FRACTION = 1 / 8
r"""A sparse grid statistic merges the rows added since its last merge once their non-zeros
reach this fraction of its own: merging costs ``O(nnz(A))`` (a sort when new grid
pairs appear: 0.3-0.7 s at ``32^3``), so a stream of ``q``-point observations pays it
once per ``~nnz(A) / (8 q 16^d)`` calls instead of at every call."""
MAX_CACHE_ENTRIES = 2**24
r"""Largest cached matrix (entries) a posterior keeps to speed up predictions: an exact
``m x m`` grid covariance up to ``m = 4096`` (134 MB in float64)."""
GATHER_COST_RATIO = 30.0
r"""How much dearer one multiply-add of a sparse interpolation product (a gather from
memory) is than one of a dense BLAS product on the same machine; measured ~30 on
an x86 CPU core (0.8 vs 25 GMAC/s). Used to price a cache against the work it saves."""
LAPACK_MIN_SIZE = 128
r"""Matrices at least this large (on the CPU, float32/float64) go to LAPACK through SciPy;
below it the conversion's overhead is comparable to the factorisation."""

# SoftKI (streamgp.models.softki, streamgp.models.online_softki).

QR_CHUNK = 4096
r"""Rows per block of SoftKI's blocked (TSQR) factorisation: memory ``O(QR_CHUNK m)``."""
SMALL_NOISE_RATIO = 10.0
r"""``SoftKIGP.fit`` warns when a fixed noise variance is below the training residuals'
mean square over this ratio (``SmallFixedNoiseWarning``)."""
NOISE_CHECK_ROWS = 1024
r"""Training rows (evenly spaced) whose residuals that check reads."""
SOFTKI_FIT_MAXITER = 200
r"""L-BFGS-B iterations BoTorch's ``fit_gpytorch_mll`` spends on a ``SoftKIGP`` unless its
``optimizer_kwargs`` set ``options["maxiter"]``. Its exact marginal likelihood over the
learnable interpolation points keeps improving by overfitting when ``n`` is small (the
default ``m = min(512, n)`` points are then the data): unbounded, L-BFGS-B ran 12,000-14,400
iterations (95-130 s on 12-50 points, 590-650 s on 200) while the test RMSE was lowest
at 200-300 (``benchmarks/softki_fit_budget.py``)."""
FAR_MARGIN = 0.5
r"""How far beyond the bounding box of an online SoftKI model's points an input is "far"
(``FarFromPointsWarning``), as a fraction of the box's largest side: its softmax
weights then fall on the nearest points alone."""


class skip_value_checks(_feature_flag):  # noqa: N801 (gpytorch's settings style)
    r"""Skip the value checks that synchronise a GPU with the host (see the module)."""

    _default = False


class exact_prior_variance(_feature_flag):  # noqa: N801 (gpytorch's settings style)
    r"""Predict with the exact prior variance ``k(x, x)`` instead of SKI's (default: on).

    Kernel-interpolation models (:class:`~streamgp.WiskiGP`, :class:`~streamgp.KissGP`,
    :class:`~streamgp.models.OnlineSoftKIGP`, :class:`~streamgp.AdditiveWiskiGP`) add
    ``d(x) = k(x, x) - w(x)^T K_UU w(x)`` to their predictive variances
    (:mod:`streamgp.linalg.prior_variance`), so that their prior variance is the kernel's
    and not the interpolated one, which dips between grid points for lengthscales near
    the grid spacing. ``with exact_prior_variance(False):`` predicts with every model's
    exact SKI posterior instead; a model's ``exact_prior_variance=False`` constructor
    keyword does the same for that model alone. The marginal likelihood is exact SKI's
    either way.

    Example:
        >>> import torch
        >>> from streamgp import WiskiGP
        >>> X = torch.rand(20, 2, dtype=torch.float64)
        >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10)
        >>> with exact_prior_variance(False):
        ...     ski = model.posterior(X[:3]).variance
        >>> bool((model.posterior(X[:3]).variance >= ski).all())
        True
    """

    _default = True


class cuda_graphs(_feature_flag):  # noqa: N801 (gpytorch's settings style)
    r"""Replay a :class:`~streamgp.WiskiGP`'s posterior as a captured CUDA graph (default: off).

    On a GPU a grid-space WISKI posterior is a few dozen small kernels whose launch
    overhead exceeds their arithmetic. Inside this context the posterior's tensor work
    at the test points (interpolation weights, the exact prior variance, the mean and
    the covariance factors) is captured once per test-input shape and cache state, and
    replayed with one launch after (:mod:`streamgp.utils.cuda_graphs`); the value
    checks still run before it, as outside. Results equal the eager ones. Graphs
    differentiate with respect to the test inputs only (as an acquisition optimiser
    needs), not the hyperparameters. A capture is made per shape and refreshed when the
    caches change (``observe``, a refit), so it pays where many posteriors of one shape
    follow each other: inside ``optimize_acqf``. No effect on a CPU, in data space, or
    under LOVE (``fast_pred_var``). A capture that fails (a kernel that cannot be
    captured, e.g. from a custom kernel's host read) warns and runs eagerly, but a
    failed capture can leave the process's CUDA random-number generator unusable
    ("Offset increment outside graph capture"): seen on an H100 before the gradient's
    last host read was removed, so this setting is off by default.

    Example:
        >>> import torch
        >>> from streamgp import WiskiGP
        >>> X = torch.rand(20, 2, dtype=torch.float64)
        >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10)
        >>> with cuda_graphs():  # a no-op on the CPU
        ...     mean = model.posterior(X[:3]).mean
        >>> mean.shape
        torch.Size([3, 1])
    """

    _default = False


class ValueChecks:
    r"""The value checks of one call, read from the device together (one host read).

    Made by :func:`deferred_value_checks`. Checks are tensors that are ``True`` where
    something is wrong, with what to do then: raise an error (:meth:`require`), warn
    (:meth:`warn`), or run a host decision (:meth:`decide`, e.g. rebuild a stale cache).
    :meth:`read` copies them all to the host with one ``tolist`` and acts in order of
    registration: the first failed ``require`` raises. Factorisations run after the read
    record their failure flags here (:meth:`record_failure`) instead of reading them.
    """

    def __init__(self) -> None:
        self._flags: list[Tensor] = []
        self._actions: list[tuple[str, Callable]] = []
        self._failing: list[bool] = []
        self.read_done = False
        #: Whether factorisations record their failure (:meth:`record_failure`) instead
        #: of reading it; set by a model whose next call reads what was recorded.
        self.defer_factorisations = False
        self.failures: list[Tensor] = []

    def require(self, failed: Tensor, error: Callable[[], Exception]) -> None:
        r"""Raise ``error()`` at the read if ``failed`` (a boolean tensor) is True."""
        self._add(failed, "require", error)

    def require_all(self, ok: Tensor, error: Callable[[], Exception]) -> None:
        r"""Raise ``error()`` at the read unless ``ok`` (a boolean tensor) is all True.

        :meth:`require` of ``~ok``, negated on the host: no negation on the device."""
        self._add(ok, "require", error, failing=False)

    def warn(self, failed: Tensor, warn: Callable[[], None]) -> None:
        r"""Call ``warn()`` at the read if ``failed`` is True."""
        self._add(failed, "warn", warn)

    def decide(self, flag: Tensor, then: Callable[[bool], None]) -> None:
        r"""Call ``then(bool(flag))`` at the read (after every ``require`` passed)."""
        self._add(flag, "decide", then)

    def record_failure(self, failed: Tensor) -> None:
        r"""Keep a factorisation's failure flag on the device (see the module)."""
        self.failures.append(failed if failed.dim() == 0 else failed.any())

    def failure_flag(self) -> Tensor | None:
        r"""The recorded failures as one boolean tensor, or None."""
        if len(self.failures) <= 1:
            return self.failures[0] if self.failures else None
        return torch.stack(self.failures).any()

    def _add(self, flag: Tensor, kind: str, action: Callable, failing: bool = True) -> None:
        # ``failing``: the value of a check that fails (an "ok" flag fails when False).
        reduced = flag if flag.dim() == 0 else (flag.any() if failing else flag.all())
        if self.read_done:  # after the read: check now
            self._act([(kind, action)], [bool(reduced) == failing])
            return
        self._flags.append(reduced)
        self._actions.append((kind, action))
        self._failing.append(failing)

    def read(self) -> None:
        r"""Copy every check to the host at once and act on it (at most once)."""
        if self.read_done:
            return
        self.read_done = True
        # (a bool tensor: the host copy is one byte per check)
        values = torch.stack(self._flags).tolist() if self._flags else []
        self._act(self._actions, [v == f for v, f in zip(values, self._failing, strict=True)])

    @staticmethod
    def _act(actions: list[tuple[str, Callable]], values: list[bool]) -> None:
        for (kind, action), value in zip(actions, values, strict=True):
            if kind == "require" and value:
                raise action()
            if kind == "warn" and value:
                action()
        for (kind, action), value in zip(actions, values, strict=True):
            if kind == "decide":
                action(value)


_ACTIVE: ContextVar[ValueChecks | None] = ContextVar("streamgp_value_checks", default=None)


@contextlib.contextmanager
def deferred_value_checks(join: bool = True) -> Iterator[ValueChecks]:
    r"""Gather the value checks made inside into one read (:meth:`ValueChecks.read`).

    With ``join``, inside an enclosing scope that has not read yet, the checks join it.
    The read happens where the caller calls ``read()``, at the latest when the scope
    ends without an error.

    Example:
        >>> X = torch.tensor([[0.5, float("nan")]])
        >>> with deferred_value_checks() as checks:
        ...     value_check(~torch.isfinite(X).all(), lambda: ValueError("X has NaN"))
        ...     print("not read yet")
        ...     checks.read()
        Traceback (most recent call last):
        ...
        ValueError: X has NaN
    """
    outer = _ACTIVE.get()
    if join and outer is not None and not outer.read_done:
        yield outer
        return
    checks = ValueChecks()
    token = _ACTIVE.set(checks)
    try:
        yield checks
        checks.read()
    finally:
        _ACTIVE.reset(token)
    failed = checks.failure_flag()  # recorded and not taken over by a model: read now
    if failed is not None and bool(failed):
        raise torch.linalg.LinAlgError(
            "A Cholesky factorisation failed: the matrix is not positive definite."
        )


@contextlib.contextmanager
def immediate_value_checks() -> Iterator[None]:
    r"""Check values where they are made (each check its own host read), inside a
    :func:`deferred_value_checks` scope: for the rare paths (a rebuild of every factor)
    whose failures must raise before anything is returned."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_value_checks() -> ValueChecks | None:
    r"""The innermost :func:`deferred_value_checks` scope, or None."""
    return _ACTIVE.get()


def value_check(failed: Tensor, error: Callable[[], Exception]) -> None:
    r"""Raise ``error()`` if ``failed`` is True: at the enclosing scope's read, or now.

    Nothing is checked inside :class:`skip_value_checks`.
    """
    if skip_value_checks.on():
        return
    checks = _ACTIVE.get()
    if checks is not None:
        checks.require(failed, error)
    elif bool(failed.any()):
        raise error()


def value_check_all(ok: Tensor, error: Callable[[], Exception]) -> None:
    r"""Raise ``error()`` unless ``ok`` is all True: :func:`value_check` of ``~ok``, with
    the negation done on the host (one operation fewer on the device).

    Nothing is checked inside :class:`skip_value_checks`.
    """
    if skip_value_checks.on():
        return
    checks = _ACTIVE.get()
    if checks is not None:
        checks.require_all(ok, error)
    elif not bool(ok.all()):
        raise error()


def value_warning(failed: Tensor, warn: Callable[[], None]) -> None:
    r"""Call ``warn()`` if ``failed`` is True: at the enclosing scope's read, or now.

    Nothing is checked inside :class:`skip_value_checks`.
    """
    if skip_value_checks.on():
        return
    checks = _ACTIVE.get()
    if checks is not None:
        checks.warn(failed, warn)
    elif bool(failed.any()):
        warn()
