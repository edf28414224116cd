r"""Exact SKI inference in data space, for while ``n`` is small.

SKI is exactly a Gaussian process with kernel ``K_SKI = W K_UU W^T``. While the number
of observations ``n`` is below the number of grid points ``m``, its posterior and
marginal likelihood are cheapest in data space: everything is ``n x n`` and the kernel
block between two sets of points is ``Phi_1 Phi_2^T`` with ``Phi = W L_K``
(:class:`~streamgp.linalg.grid_kernel.KernelFeatures`, Kronecker-factored for separable
kernels, so an ``n x n`` block costs ``O(n^2 sum_j g_j)``). With
``B = K_SKI(X, X) + Lambda = L_B L_B^T`` and ``z = L_B^{-1} y``:

- mean at ``x*``: ``u_*^T z`` with ``u_* = L_B^{-1} K_SKI(X, x*)``;
- covariance: ``K_SKI(x*, x*') - u_*^T u_*'``;
- ``log p(y) = -1/2 [y^T B^{-1} y + log|B| + n log 2 pi]``, equal to the grid-space
  formula of :mod:`streamgp.linalg.woodbury` by the matrix determinant lemma.

Absorbing ``q`` rows (:meth:`DataPosterior.update`) extends ``L_B`` by one block row in
``O(n^2 q)``; conditioning inside acquisition functions (:class:`DataCorrection`)
keeps the parent's ``L_B`` and adds a batched ``q``-row block, ``O(b n q)`` memory for
``b`` candidate batches and only a ``Q x Q`` Cholesky, so gradients flow to the
conditioning inputs. The grid-space statistics follow from the same rows when ``n``
grows past ``m`` (:class:`~streamgp.linalg.statistics.DataStatistics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from streamgp.interpolation.grid import InterpolationWeights
from streamgp.linalg.factor import cholesky
from streamgp.linalg.grid_kernel import GridKernelRoot, KernelFeatures
from streamgp.linalg.posterior_covariance import (
    MAX_CACHE_ENTRIES,
    AmortizedCache,
    check_state_shape,
)


def _solve_lower(L: Tensor, rhs: Tensor) -> Tensor:
    return torch.linalg.solve_triangular(L, rhs, upper=False)


def _solve_shared(L: Tensor, rhs: Tensor) -> Tensor:
    r"""``L^{-1} rhs`` for one ``n x n`` ``L`` and batched ``rhs`` (``batch x n x t``).

    The batch is moved into the columns, so it is one triangular solve with
    ``batch * t`` right-hand sides (a level-3 BLAS call) instead of ``batch`` small ones.
    """
    if L.dim() > 2 or rhs.dim() == 2:
        return _solve_lower(L, rhs)
    n, t, batch = rhs.shape[-2], rhs.shape[-1], rhs.shape[:-2]
    columns = rhs.movedim(-2, 0).reshape(n, -1)
    return _solve_lower(L, columns).reshape(n, *batch, t).movedim(0, -2)


@dataclass(frozen=True)
class DataPosterior:
    r"""The SKI posterior given ``n`` observations, in data space.

    Attributes:
        kernel_root: Root ``L_K`` of ``K_UU`` (gives the features of new points).
        features: Kernel features of the ``n`` observed inputs.
        chol: ``n x n`` Cholesky factor ``L_B`` of ``K_SKI(X, X) + Lambda``.
        whitened: ``L_B^{-1} y`` (``n``; ``k x n`` for ``k`` outputs sharing ``L_B``).
        cache: ``G = K_UU W^T L_B^{-T}`` (``m x n``), built by :meth:`grid_cross`
            once the predictions it would have sped up have paid for it: with it a
            point's whitened cross-covariance is ``G^T w_*``, a ``k``-row gather, instead
            of an ``n x n`` triangular solve.
    """

    kernel_root: GridKernelRoot
    features: KernelFeatures
    chol: Tensor
    whitened: Tensor
    cache: AmortizedCache = field(default_factory=AmortizedCache, compare=False, repr=False)

    def select_outputs(self, pick) -> DataPosterior:
        r"""The posterior of some outputs (``pick(whitened, -2)``; ``L_B`` is shared)."""
        return replace(self, whitened=pick(self.whitened, -2))

    def grid_cross(self, rows: int, weights: InterpolationWeights | None) -> Tensor | None:
        r"""``G = K_UU W^T L_B^{-T}`` (``m x n``) if cached, or built now that predictions
        at ``rows`` more points (each an ``O(n^2)`` solve without it) add up to its
        ``O(n^2 m)`` cost. None for batched or graph-carrying factors, weights that
        are not sparse grid rows, or ``m n`` above ``MAX_CACHE_ENTRIES``."""
        n, m = self.chol.shape[-1], self.kernel_root.num_grid
        if (
            not isinstance(weights, InterpolationWeights)
            or self.chol.dim() != 2
            or self.chol.requires_grad
            or m * n > MAX_CACHE_ENTRIES
            # A row's gather from G costs k n for its k weights, its solve n^2: with as
            # many weights as observations (4^d in d >= 4 dimensions) G saves nothing.
            or weights.num_weights >= n
        ):
            return None
        saved = rows * n * (n - weights.num_weights)
        return self.cache.get(saved, build_cost=n * n * m, build=self._build_grid_cross)

    def _build_grid_cross(self) -> Tensor:
        # K_UU W^T = L_K Phi^T with Phi = W L_K (the rows' features, densified).
        K_Wt = self.kernel_root.matmul(self.features.to_dense().mT)  # m x n
        return _solve_lower(self.chol, K_Wt.mT).mT.contiguous()

    @staticmethod
    def build(
        kernel_root: GridKernelRoot, weights: InterpolationWeights, y: Tensor, noise: Tensor
    ) -> DataPosterior:
        r"""Factorise ``K_SKI + diag(noise)`` for rows ``weights`` in ``O(n^3)``."""
        features = kernel_root.features(weights)
        B = features.gram() + torch.diag_embed(noise)
        chol = cholesky(B)
        whitened = _solve_lower(chol, y.unsqueeze(-1)).squeeze(-1)
        return DataPosterior(kernel_root, features, chol, whitened)

    def state(self) -> dict[str, Any]:
        r"""The factors as tensors and numbers (a checkpoint's): ``L_B`` and ``z`` as
        rank-``q`` updates extended them, and the cache's
        :meth:`~streamgp.linalg.posterior_covariance.AmortizedCache.state`. With the
        rows' weights (the model's statistics) :meth:`from_state` gives back a posterior
        that predicts bit for bit as this one; a refactorisation of ``K_SKI + Lambda``
        would agree to rounding only."""
        return {"chol": self.chol, "whitened": self.whitened, "cache": self.cache.state()}

    @staticmethod
    def from_state(
        state: dict[str, Any], kernel_root: GridKernelRoot, weights: InterpolationWeights
    ) -> DataPosterior:
        r"""Inverse of :meth:`state`, for the rows ``weights`` and the kernel's root.

        Raises:
            ValueError: If a factor's shape does not fit the rows (naming it).
        """
        n = weights.num_rows
        check_state_shape("chol", state["chol"], (n, n))
        check_state_shape("whitened", state["whitened"], (n,))
        cache = state.get("cache", {})
        if "value" in cache:
            check_state_shape("cache", cache["value"], (kernel_root.num_grid, n))
        features = kernel_root.features(weights)
        return DataPosterior(
            kernel_root,
            features,
            state["chol"],
            state["whitened"],
            AmortizedCache.from_state(cache),
        )

    def whiten(self, features: KernelFeatures) -> Tensor:
        r"""``U = L_B^{-1} K_SKI(X, X_*)`` (``batch x n x t``) for the rows ``features``."""
        cross = self.features.cross(features)  # batch x n x t
        return _solve_shared(self.chol, cross)

    def update(self, weights: InterpolationWeights, y: Tensor, noise: Tensor) -> DataPosterior:
        r"""Absorb ``q`` unbatched rows by extending ``L_B`` with one block row, ``O(n^2 q)``."""
        new = self.kernel_root.features(weights)
        U = self.whiten(new)  # n x q
        S = new.gram() + torch.diag_embed(noise) - U.mT @ U
        L_qq = cholesky(S)
        # (whitened @ U) is U^T z for one output's z and for k outputs' rows alike.
        z_q = _solve_lower(L_qq, (y - self.whitened @ U).unsqueeze(-1)).squeeze(-1)
        n, q = self.chol.shape[-1], L_qq.shape[-1]
        chol = self.chol.new_zeros(n + q, n + q)
        chol[:n, :n] = self.chol
        chol[n:, :n] = U.mT
        chol[n:, n:] = L_qq
        features = self.features.cat(new)
        cache = AmortizedCache()
        G = self.cache.value
        if G is not None:  # its q new columns: (K_UU W_q^T - G U) L_qq^{-T}, O(m n q)
            K_Wq = self.kernel_root.matmul(new.to_dense().mT)
            G_q = _solve_lower(L_qq, (K_Wq - G @ U).mT).mT
            cache = AmortizedCache(torch.cat([G, G_q], dim=-1))
        return DataPosterior(
            self.kernel_root, features, chol, torch.cat([self.whitened, z_q], dim=-1), cache
        )

    def predict(self, weights: InterpolationWeights) -> tuple[Tensor, Tensor, KernelFeatures]:
        r"""Mean at ``batch x t`` points, their whitened cross-covariance and their features.

        Returns:
            ``mean`` (``batch x t``), ``U`` (``batch x n x t``, see :meth:`whiten`) and
            the points' features: the covariance is ``K_SKI(X_*, X_*) - U^T U``.
        """
        features = self.kernel_root.features(weights)
        rows = math.prod(weights.batch_shape) * weights.num_rows
        G = self.grid_cross(rows, weights)
        if G is None:
            U = self.whiten(features)
        else:
            U = weights.matmul(G).mT
        mean = (U.mT @ self.whitened.unsqueeze(-1)).squeeze(-1)
        return mean, U, features


@dataclass(frozen=True)
class DataCorrection:
    r"""Conditioning of a :class:`DataPosterior` on ``Q`` more (possibly batched) rows.

    The extended Cholesky factor is ``[[L_B, 0], [U^T, L_S]]`` with
    ``U = L_B^{-1} K_SKI(X, X_c)`` (``batch x n x Q``) and
    ``L_S L_S^T = K_SKI(X_c, X_c) + Lambda_c - U^T U``; the parent's ``L_B`` is shared,
    never copied per batch. Every conditioning recomputes the ``Q``-row block from
    the stored rows, so gradients reach all conditioning inputs.

    Attributes:
        weights: Interpolation rows of the ``Q`` conditioning points (``batch x Q``),
            or None for no conditioning.
        y: ``sample x batch x Q`` targets; noise: ``batch x Q`` noise variances.
        features, U, chol, gamma: Their kernel features, ``U``, ``L_S`` and
            ``gamma = L_S^{-1} (y - U^T z)``.
    """

    weights: InterpolationWeights | None
    y: Tensor
    noise: Tensor
    features: KernelFeatures | None
    U: Tensor
    chol: Tensor
    gamma: Tensor

    @staticmethod
    def empty(like: Tensor) -> DataCorrection:
        zeros = like.new_zeros(0)
        return DataCorrection(None, zeros, zeros, None, zeros, zeros, zeros)

    @property
    def rank(self) -> int:
        return self.gamma.shape[-1]

    def select_outputs(self, pick) -> DataCorrection:
        r"""The correction of some outputs (their targets and ``gamma``; unbatched)."""
        if self.weights is None:
            return self
        return replace(self, y=pick(self.y, -2), gamma=pick(self.gamma, -2))

    def condition(
        self, posterior: DataPosterior, W_q: InterpolationWeights, y: Tensor, noise: Tensor
    ) -> DataCorrection:
        r"""Condition on ``q`` more rows (``W_q``: ``batch x q``; ``y``: ``sample x batch x q``)."""
        noise = noise.expand(*W_q.batch_shape, W_q.num_rows)
        if self.weights is not None:
            W_q = self.weights.cat(W_q)
            batch = W_q.batch_shape
            noise = torch.cat(
                [self.noise.expand(*batch, self.noise.shape[-1]), noise.expand(*batch, -1)], -1
            )
            sample_batch = torch.broadcast_shapes(self.y.shape[:-1], y.shape[:-1])
            y = torch.cat(
                [self.y.expand(*sample_batch, self.y.shape[-1]), y.expand(*sample_batch, -1)], -1
            )
        features = posterior.kernel_root.features(W_q)
        U = posterior.whiten(features)
        S = features.gram() + torch.diag_embed(noise) - U.mT @ U
        chol = cholesky(S)
        residual = y - (U.mT @ posterior.whitened.unsqueeze(-1)).squeeze(-1)
        gamma = _solve_lower(chol, residual.unsqueeze(-1)).squeeze(-1)
        return DataCorrection(W_q, y, noise, features, U, chol, gamma)

    def predict_factors(
        self, posterior: DataPosterior, W_star: InterpolationWeights
    ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
        r"""Mean (``sample x batch x t``) and the factors of the covariance.

        The covariance is ``prod_f A_f A_f^T - sum_j N_j N_j^T`` with the points'
        kernel features ``A_f`` and ``N = (U_*^T, V^T)``, ``V`` the whitened
        cross-covariance with the conditioning rows (see
        :class:`~streamgp.linalg.posterior_covariance.PosteriorCovariance`).
        """
        mean, U_star, features = posterior.predict(W_star)
        if self.features is None:
            return mean, (features,), (U_star.mT,)
        # Whitened cross-covariance with the conditioning rows: L_S^{-1} (K_c* - U^T U_*).
        cross = self.features.cross(features) - self.U.mT @ U_star
        chol = self.chol.expand(*cross.shape[:-2], *self.chol.shape[-2:])
        V = _solve_lower(chol, cross)  # batch x Q x t
        mean = mean + (V.mT @ self.gamma.unsqueeze(-1)).squeeze(-1)
        return mean, (features,), (U_star.mT, V.mT)
