r"""Local Gaussian process regression (LGP), as a BoTorch model.

LGP (Nguyen-Tuong, Seeger & Peters, "Local Gaussian Process Regression for Real Time
Online Model Learning and Control", NIPS 2008) partitions the stream among local
exact GPs that share one set of hyperparameters (kernel, mean, noise). Each local
model ``k`` has a centre ``c_k``, the mean of its inputs. Similarity is the kernel
correlation ``w_k(x) = k(x, c_k) / sqrt(k(x, x) k(c_k, c_k))`` (``exp(-|x - c|^2 / 2 l^2)``
for an RBF kernel, the Gaussian weighting of the paper).

Insertion (:meth:`LocalGP.observe`, point by point in arrival order): a point joins
the most similar local model if that similarity exceeds ``w_gen``, and otherwise
starts a new local model centred on it. A local model holds at most ``n_max`` points;
when a full model receives a point it **drops its oldest point** (a sliding window per
region, so each local model tracks the most recent data where it lives, as a drifting
online stream requires). Centres are recomputed as the mean of the points held.

Prediction at ``x`` is the weighted average of the ``M = num_nearest`` most similar
local models: ``mean(x) = sum_k v_k(x) mean_k(x)`` with normalised weights
``v_k(x) = w_k(x) / sum_{j in top-M(x)} w_j(x)`` (``v_k = 0`` outside the top ``M``).
The paper only specifies the mean. For a joint posterior over ``q`` points, the local
GPs are treated as independent experts and the covariance is

.. math::

    \Sigma(x_i, x_j) = \sum_k \sqrt{v_k(x_i) v_k(x_j)} \; C_k(x_i, x_j),

with ``C_k`` the local posterior covariance. Each term is ``D_k C_k D_k`` with a
diagonal ``D_k``, so ``Sigma`` is positive semi-definite (a valid
``GPyTorchPosterior`` for any BoTorch acquisition function); its diagonal is the
weighted average of the local variances, so averaging does not shrink the variance;
and with one local model it is that model's exact posterior covariance.

Cost: inserting ``q`` points copies the padded store once, ``O(K n_max d)``, then
costs ``O(K d)`` per point (similarities to ``K`` centres, kept as running sums); local
Cholesky factors are rebuilt lazily, all of them after an insertion
(``O(K n_max^3)``). A prediction over ``q`` points evaluates only each point's top
``M`` local models: ``O(q K d)`` for the similarities, ``O(q M n_max^2)`` for the local
posteriors and ``O(q^2 M^2 n_max)`` for the joint covariance.

References:

.. [NguyenTuong2008] D. Nguyen-Tuong, M. Seeger, J. Peters. Local Gaussian Process
    Regression for Real Time Online Model Learning and Control. Advances in Neural
    Information Processing Systems 21, 2008.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import Mean
from gpytorch.models import GP
from linear_operator.operators import DenseLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from streamgp.models.base import StreamingModelMixin
from streamgp.models.utils import (
    CachedPosteriorMixin,
    FrozenTransformsMixin,
    fit_frozen_transforms,
    invalidate_after_load,
    transform_new_data,
)
from streamgp.models.utils.defaults import DEFAULT, _DefaultType, mean_module_or_default
from streamgp.utils.validation import (
    check_count,
    check_gaussian_likelihood,
    check_no_known_noise,
    check_targets,
    check_tensor,
    check_train_data,
)


class LocalGP(CachedPosteriorMixin, StreamingModelMixin, FrozenTransformsMixin, GPyTorchModel, GP):
    r"""Local GP regression (Nguyen-Tuong et al. 2008) with ``n_max`` points per local model.

    Args:
        train_X: ``n x d`` initial inputs (``n`` may be 0).
        train_Y: ``n x 1`` initial targets.
        train_Yvar: Not supported (the noise level is learned); raises ``ValueError``
            if given, as BoTorch code may pass it.
        covar_module: Kernel shared by all local models. Default:
            ``ScaleKernel(RBFKernel(ard_num_dims=d))``.
        mean_module: Prior mean shared by all local models. Default: a learned
            ``ConstantMean()``, as in ``SingleTaskGP``.
        likelihood: ``GaussianLikelihood`` shared by all local models (default: a new one).
        w_gen: Similarity threshold in ``[0, 1)``: a point whose largest similarity to
            a centre is not above ``w_gen`` starts a new local model. ``w_gen = 0``
            never creates a second model for a stationary kernel with positive values.
        n_max: Maximum number of points held by a local model.
        num_nearest: ``M``, the number of most similar local models averaged in a prediction.
        input_transform: Input transform, fitted on ``train_X`` and then frozen.
        outcome_transform: Outcome transform, fitted on ``train_Y`` and then frozen.
            Default: ``Standardize(m=1)``, as in ``SingleTaskGP``; None for no transform.

    Hyperparameters are whatever the shared modules hold (e.g. fitted on an initial
    batch with an exact GP, as in the paper); :meth:`log_marginal_likelihood` (sum of
    the local exact marginal likelihoods) can be maximised to learn them.

    Example:
        >>> X = torch.rand(500, 2, dtype=torch.float64)
        >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
        >>> model = LocalGP(X, Y, w_gen=0.3, n_max=100, num_nearest=3)
        >>> X_new = torch.rand(10, 2, dtype=torch.float64)
        >>> model = model.observe(X_new, torch.sin(6 * X_new).sum(-1, keepdim=True))
        >>> posterior = model.posterior(torch.rand(4, 2, dtype=torch.float64))
        >>> posterior.mean.shape
        torch.Size([4, 1])
    """

    _num_outputs = 1
    #: The local models' points; kernel, mean and likelihood are the hyperparameters.
    data_state_prefixes = ("local_X", "local_y", "counts", "input_transform.", "outcome_transform.")
    #: The local Cholesky factors and weights, rebuilt from the local models on demand.
    #: The local models are buffers, which torch moves.
    cached_attributes = ("_factors",)
    _factors: tuple[Tensor, Tensor] | None

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
        w_gen: float = 0.5,
        n_max: int = 100,
        num_nearest: int = 3,
    ) -> None:
        check_no_known_noise(train_Yvar, "LocalGP")
        check_train_data(train_X, train_Y)
        if not isinstance(w_gen, (int, float)) or not 0 <= w_gen < 1:
            raise ValueError(f"w_gen must be a number in [0, 1), got {w_gen!r}.")
        check_count(n_max, "n_max", minimum=1)
        check_count(num_nearest, "num_nearest", minimum=1)
        check_gaussian_likelihood(likelihood)
        super().__init__()
        dim = train_X.shape[-1]
        tkwargs = {"dtype": train_X.dtype, "device": train_X.device}
        train_X_t, train_Y_t, _ = fit_frozen_transforms(
            self, train_X, train_Y, input_transform, outcome_transform
        )
        self.covar_module = (
            ScaleKernel(RBFKernel(ard_num_dims=dim)) if covar_module is None else covar_module
        ).to(**tkwargs)
        self.mean_module = mean_module_or_default(mean_module, train_X)
        self.likelihood = (GaussianLikelihood() if likelihood is None else likelihood).to(**tkwargs)
        self.w_gen = float(w_gen)
        self.n_max = n_max
        self.num_nearest = num_nearest
        # Padded storage: local model k holds local_X[k, :counts[k]] in arrival order.
        self.register_buffer("local_X", torch.zeros(0, n_max, dim, **tkwargs))
        self.register_buffer("local_y", torch.zeros(0, n_max, **tkwargs))
        self.register_buffer("counts", torch.zeros(0, dtype=torch.long, device=train_X.device))
        self.register_load_state_dict_post_hook(invalidate_after_load)
        self._clear_caches()
        self._insert(train_X_t, train_Y_t.squeeze(-1))
        self.eval()

    # ------------------------------------------------------------------ state
    @property
    def num_outputs(self) -> int:
        return self._num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([])

    @property
    def num_local_models(self) -> int:
        return len(self.counts)

    @property
    def centres(self) -> Tensor:
        r"""``K x d`` centres: the mean input of each local model (transformed space)."""
        sums = self._input_sums(self.local_X, self.counts)
        return sums / self.counts.clamp_min(1).unsqueeze(-1)

    def local_data(self, k: int) -> tuple[Tensor, Tensor]:
        r"""The (transformed) inputs and targets held by local model ``k``, oldest first."""
        n = int(self.counts[k])
        return self.local_X[k, :n], self.local_y[k, :n]

    def _mask(self, counts: Tensor | None = None) -> Tensor:
        r"""``K x n_max``: 1 where local model ``k`` holds a point (default: the current counts)."""
        counts = self.counts if counts is None else counts
        positions = torch.arange(self.n_max, device=counts.device)
        return (positions < counts.unsqueeze(-1)).to(self.local_y.dtype)

    def _input_sums(self, local_X: Tensor, counts: Tensor) -> Tensor:
        r"""``K x d`` sums of the inputs each local model holds (centres times counts)."""
        return (local_X * self._mask(counts).unsqueeze(-1)).sum(-2)

    def _similarity(self, X: Tensor, centres: Tensor) -> Tensor:
        r"""Kernel correlation ``k(x, c) / sqrt(k(x, x) k(c, c))``: ``... x q x K``."""
        cross = self.covar_module(X, centres).to_dense()
        k_xx = self.covar_module(X, diag=True)
        k_cc = self.covar_module(centres, diag=True)
        return cross / (k_xx.unsqueeze(-1) * k_cc.unsqueeze(-2)).sqrt()

    def _insert(self, X: Tensor, y: Tensor) -> None:
        r"""Insert transformed points one at a time (centres move as points arrive)."""
        if len(X) == 0:
            return
        local_X, local_y, counts = self.local_X.clone(), self.local_y.clone(), self.counts.clone()
        with torch.no_grad():
            # Running input sums: a point moves one centre, O(d), instead of a recount.
            sums = self._input_sums(local_X, counts)
            for x, target in zip(X, y, strict=True):
                k = -1
                if len(counts):
                    similarity = self._similarity(x[None], sums / counts[:, None]).squeeze(0)
                    best = int(similarity.argmax())
                    if similarity[best] > self.w_gen:
                        k = best
                if k < 0:  # start a new local model at x
                    local_X = torch.cat([local_X, local_X.new_zeros(1, *local_X.shape[1:])])
                    local_y = torch.cat([local_y, local_y.new_zeros(1, self.n_max)])
                    counts = torch.cat([counts, counts.new_zeros(1)])
                    sums = torch.cat([sums, sums.new_zeros(1, sums.shape[-1])])
                    k = len(counts) - 1
                n = int(counts[k])
                if n == self.n_max:  # full: forget the oldest point
                    sums[k] -= local_X[k, 0]
                    local_X[k, :-1] = local_X[k, 1:].clone()
                    local_y[k, :-1] = local_y[k, 1:].clone()
                    n -= 1
                local_X[k, n] = x
                sums[k] += x
                local_y[k, n] = target
                counts[k] = n + 1
        self.local_X, self.local_y, self.counts = local_X, local_y, counts
        self._invalidate()

    #: A restore takes the checkpoint's options (saved with its stream state): the
    #: padded store has ``n_max`` points per local model.
    ADOPTED_OPTIONS = frozenset({"n_max", "w_gen", "num_nearest"})

    def _checkpoint_options(self) -> dict[str, Any]:
        return {**super()._checkpoint_options(), **self._stream_state()}

    def _stream_state(self) -> dict[str, Any]:
        # The options that shape the padded store and decide where points go.
        return {"w_gen": self.w_gen, "n_max": self.n_max, "num_nearest": self.num_nearest}

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        if "n_max" in state and int(state["n_max"]) != self.local_X.shape[-2]:
            raise ValueError(
                f"checkpoint['stream']['n_max'] is {state['n_max']} but its store holds "
                f"{self.local_X.shape[-2]} points per local model."
            )
        if "n_max" in state:  # the stream continues with the options it was saved with
            self.w_gen = float(state["w_gen"])
            self.n_max = int(state["n_max"])
            self.num_nearest = int(state["num_nearest"])

    def __getstate__(self) -> dict:
        # The Cholesky factors are a cache of K x n_max x n_max numbers (hundreds of MB
        # with thousands of local models); pickles and checkpoints recompute them instead.
        state = self.__dict__.copy()
        for name in (*self.cached_attributes, "_hyper_snapshot"):
            state[name] = None
        return state

    def _local_factors(self) -> tuple[Tensor, Tensor]:
        r"""Cholesky factors ``L_k`` and weights ``alpha_k`` of the padded local systems.

        Padded rows/columns of ``K_k + s2 I`` are replaced by the identity, so
        ``L_k = blockdiag(L_valid, I)`` and ``alpha_k`` is zero on the padding.
        """
        if self._factors is None or not self._hyperparameters_unchanged():
            self._factors = self._compute_factors()
            self._snapshot_hyperparameters()
        return self._factors

    def _compute_factors(self) -> tuple[Tensor, Tensor]:
        mask = self._mask()
        pair = mask.unsqueeze(-1) * mask.unsqueeze(-2)
        K = self.covar_module(self.local_X).to_dense()
        noise = self.likelihood.noise.reshape(())
        eye = torch.eye(self.n_max, dtype=K.dtype, device=K.device)
        A = pair * (K + noise * eye) + (1 - mask).unsqueeze(-1) * eye
        L = psd_safe_cholesky(A)
        residual = (self.local_y - self.mean_module(self.local_X)) * mask
        alpha = torch.cholesky_solve(residual.unsqueeze(-1), L).squeeze(-1)
        return L, alpha

    def log_marginal_likelihood(self) -> Tensor:
        r"""Sum of the exact log marginal likelihoods of the local models.

        Differentiable in the shared hyperparameters (for fitting them with a torch
        optimizer); ``O(K n_max^3)``.
        """
        L, alpha = self._compute_factors()
        mask = self._mask()
        residual = (self.local_y - self.mean_module(self.local_X)) * mask
        logdet = 2 * L.diagonal(dim1=-2, dim2=-1).log().sum()
        n = self.counts.sum()
        return -0.5 * ((residual * alpha).sum() + logdet + n * math.log(2 * math.pi))

    def fit_objective(self) -> tuple[Tensor, Tensor]:
        r""":meth:`log_marginal_likelihood` and the number of points the local models hold.

        What ``fit_gpytorch_mll`` maximises (per point, with the priors) for any marginal
        likelihood wrapping the model.
        """
        return self.log_marginal_likelihood(), self.counts.sum()

    def _prepare_state_load(self, state_dict: dict) -> None:
        # A checkpoint may hold another number of local models.
        for name in ("local_X", "local_y", "counts"):
            if name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[name]))
        self._invalidate()

    # ------------------------------------------------------------ BoTorch API
    def _check_inputs(self, X: Tensor, name: str) -> None:
        check_tensor(X, name, like=self.local_y, min_dim=2, last_dim=self.local_X.shape[-1])

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        r"""Weighted-experts posterior at transformed inputs ``X`` (``batch x q x d``)."""
        prior_mean = self.mean_module(X)
        K_XX = self.covar_module(X).to_dense()
        if self.num_local_models == 0:
            return MultivariateNormal(prior_mean, DenseLinearOperator(K_XX))
        L, alpha = self._local_factors()
        # Each point's top-M most similar local models and their normalised weights.
        similarity = self._similarity(X, self.centres)  # batch x q x K
        top, index = similarity.topk(min(self.num_nearest, self.num_local_models), dim=-1)
        total = top.sum(-1, keepdim=True)
        # Far from every centre all similarities underflow: average the top M evenly.
        tiny = torch.finfo(X.dtype).tiny  # 1e-300 would round to 0 in float32
        weights = torch.where(total > 0, top / total.clamp_min(tiny), 1.0 / top.shape[-1])
        # Only those models are evaluated: K_Xk[..., i, m, :] = k(x_i, X_k), k = index[i, m].
        X_points = X[..., None, None, :].expand(*index.shape, 1, X.shape[-1])
        mask = self._mask()[index]  # batch x q x M x n_max
        K_Xk = self.covar_module(X_points, self.local_X[index]).to_dense().squeeze(-2) * mask
        local_means = prior_mean.unsqueeze(-1) + (K_Xk * alpha[index]).sum(-1)
        mean = (weights * local_means).sum(-1)
        V = _solve_selected(L, index, K_Xk)  # L_k^{-1} k(X_k, x_i)
        # Sigma_ij sums, over the models k that x_i and x_j both use,
        # sqrt(v_k(x_i) v_k(x_j)) (k(x_i, x_j) - V_ik . V_jk): pairs of slots (m, p).
        # A weight that underflows to 0 would give sqrt's infinite slope (and NaN
        # gradients in q > 1 acquisitions): its root is 0 with a zero gradient.
        root = torch.where(weights > 0, weights.clamp_min(tiny).sqrt(), 0.0)
        shared = index[..., :, None, :, None] == index[..., None, :, None, :]
        pair_weights = shared * root[..., :, None, :, None] * root[..., None, :, None, :]
        inner = torch.einsum("...imn,...jpn->...ijmp", V, V)
        covar = (pair_weights * (K_XX[..., None, None] - inner)).sum((-2, -1))
        return MultivariateNormal(mean, DenseLinearOperator(covar))

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> LocalGP:
        r"""Not available: a mixture of local experts is not one Gaussian process, so it
        has no exact Gaussian conditioning (nor BoTorch's ``fantasize``, which uses it).

        Raises:
            NotImplementedError: Always, naming the alternatives.
        """
        raise NotImplementedError(_NO_CONDITIONING)

    def fantasize(self, X: Tensor, sampler: Any = None, **kwargs: Any) -> LocalGP:
        r"""Not available, as :meth:`condition_on_observations` (which it would use).

        Raises:
            NotImplementedError: Always, naming the alternatives.
        """
        raise NotImplementedError(_NO_CONDITIONING)

    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> LocalGP:
        r"""Insert new observations in place, in arrival order.

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x 1`` new targets (original space).
            Yvar: Must be None: the model learns its noise level (the argument exists
                for the common streaming-model signature ``observe(X, Y, Yvar)``).

        Returns:
            The model itself. Invalid input raises before anything is changed.
        """
        check_no_known_noise(Yvar, "LocalGP", argument="Yvar")
        self._check_inputs(X, "X")
        if X.dim() != 2:
            raise ValueError(f"X must have shape q x d, got {tuple(X.shape)}.")
        check_targets(check_tensor(Y, "Y", like=X, min_dim=2), "Y", len(X))
        X_t, Y_t, _ = transform_new_data(self, X, Y)
        self._insert(X_t, Y_t.squeeze(-1))
        return self


_NO_CONDITIONING = (
    "LocalGP has no condition_on_observations (and so no fantasize): its local "
    "experts are not one Gaussian process. Absorb data with observe() (on a copy, "
    "copy.deepcopy(model).observe(X, Y), to keep the original), or use a model with "
    "exact conditioning (WiskiGP, KissGP, OnlineSVGP, SoftKIGP) for acquisition "
    "functions that fantasize (qKnowledgeGradient, qNegIntegratedPosteriorVariance)."
)


def _solve_selected(L: Tensor, index: Tensor, rhs: Tensor, chunk: int = 64) -> Tensor:
    r"""``L[index] ^ {-1} rhs`` for each selected factor, gathering ``chunk`` factors at a time.

    ``L`` is ``K x n x n`` (lower triangular), ``index`` any shape ``S`` of indices into
    it and ``rhs`` is ``S x n``; gathering all ``S`` factors at once would copy
    ``prod(S) n^2`` numbers.
    """
    flat_index = index.reshape(-1)
    if len(flat_index) == 0:  # no test points
        return rhs.clone()
    flat_rhs = rhs.reshape(-1, rhs.shape[-1], 1)
    solves = [
        torch.linalg.solve_triangular(
            L[flat_index[start : start + chunk]], flat_rhs[start : start + chunk], upper=False
        )
        for start in range(0, len(flat_index), chunk)
    ]
    return torch.cat(solves).reshape(rhs.shape)
