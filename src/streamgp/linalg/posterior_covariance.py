r"""A posterior covariance that gives variances without forming the ``t x t`` matrix.

The SKI posterior covariance at ``t`` points has the same shape in every space:

    ``Sigma = scale * (A_1 A_1^T o ... o A_F A_F^T) - sum_j N_j N_j^T + diag(noise)``

with ``o`` the elementwise product. In grid space ``A_1 = W_* R`` (one ``t x m``
factor: the root of the grid posterior) and ``N`` is the conditioning correction
``W_* R V``; in data space the ``A_f`` are the Kronecker-factored kernel features of
the points (:class:`~streamgp.linalg.grid_kernel.KernelFeatures`) and the ``N_j`` the
whitened cross-covariances with the observations and the conditioning rows.

:class:`PosteriorCovariance` keeps those factors. Its diagonal costs
``O(t sum of factor widths)``, so ``posterior(X).variance`` at ``10^4`` points never
allocates a ``10^4 x 10^4`` matrix. Anything else (joint samples, Cholesky factors,
indexing) uses the dense matrix, formed once on first use, so samplers and
acquisition functions see exactly the covariance a dense operator would give.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from linear_operator.operators import DenseLinearOperator
from linear_operator.utils.generic import _to_helper
from torch import Tensor

from streamgp import settings
from streamgp.linalg.exact_kernel import ExactKernelFeatures
from streamgp.linalg.grid_kernel import KernelFeatures

#: See :data:`streamgp.settings.MAX_CACHE_ENTRIES` (overridable here).
MAX_CACHE_ENTRIES = settings.MAX_CACHE_ENTRIES
#: See :data:`streamgp.settings.GATHER_COST_RATIO` (overridable here).
GATHER_COST_RATIO = settings.GATHER_COST_RATIO


class AmortizedCache:
    r"""A derived tensor built once the work it would have saved pays for building it.

    The ski-rental rule: each request reports what it costs without the cache, and the
    cache is built on the request at which those costs add up to the build cost. The
    total work is then at most twice that of the better choice made in hindsight,
    whatever the number of requests, so a single small prediction never pays for a
    cache while a stream of large ones (variance maps) pays for it once.

    Example:
        >>> cache = AmortizedCache()
        >>> cache.get(work=10.0, build_cost=25.0, build=lambda: torch.ones(2)) is None
        True
        >>> cache.get(work=20.0, build_cost=25.0, build=lambda: torch.ones(2))
        tensor([1., 1.])
    """

    def __init__(self, value: Tensor | None = None) -> None:
        self.value = value
        self._work = 0.0

    def get(self, work: float, build_cost: float, build: Callable[[], Tensor]) -> Tensor | None:
        r"""The cached tensor, built now if the reported work has reached ``build_cost``."""
        if self.value is None:
            self._work += work
            if self._work >= build_cost:
                self.value = build()
        return self.value

    def state(self) -> dict[str, Tensor | float]:
        r"""What :meth:`from_state` needs to rebuild this cache exactly (a checkpoint's).

        The value once built (it may have been extended by updates since, so it is not
        rebuilt from its source), else the work reported so far: a restored cache is
        then built at the same request as this one, and predictions take the same path.

        Example:
            >>> cache = AmortizedCache()
            >>> _ = cache.get(work=10.0, build_cost=25.0, build=lambda: torch.ones(2))
            >>> AmortizedCache.from_state(cache.state()).state()
            {'work': 10.0}
        """
        return {"work": self._work} if self.value is None else {"value": self.value}

    @classmethod
    def from_state(cls, state: dict[str, Tensor | float]) -> AmortizedCache:
        r"""The cache :meth:`state` describes (an empty one for ``{}``)."""
        cache = cls(state.get("value"))
        cache._work = float(state.get("work", 0.0))
        return cache


def check_state_shape(name: str, value: object, trailing: tuple[int | None, ...]) -> None:
    r"""Refuse a saved factor whose trailing dimensions are not ``trailing`` (None: any).

    A posterior's :meth:`from_state` checks what a checkpoint gives it against the
    statistics it must belong to, so a mismatch is refused on restore, naming the
    factor, instead of failing (or predicting wrongly) later.

    Example:
        >>> check_state_shape("chol", torch.zeros(3, 3), (3, 3))
        >>> check_state_shape("chol", torch.zeros(3, 2), (3, 3))
        Traceback (most recent call last):
        ...
        ValueError: its posterior factor 'chol' has shape (3, 2), expected (..., 3, 3).
    """
    shape = tuple(value.shape) if isinstance(value, Tensor) else None
    tail = shape[len(shape) - len(trailing) :] if shape is not None else ()
    if len(tail) != len(trailing) or any(
        want is not None and got != want for got, want in zip(tail, trailing, strict=True)
    ):
        expected = ", ".join("*" if size is None else str(size) for size in trailing)
        got = shape if shape is not None else type(value).__name__
        raise ValueError(
            f"its posterior factor {name!r} has shape {got}, expected (..., {expected})."
        )


class InterpolatedRoot:
    r"""The ``batch x t x r`` factor ``W_* R`` of ``W_* Sigma_U W_*^T``, formed on demand.

    ``R`` is an ``m x r`` root of the grid covariance ``Sigma_U``. Squared row norms (the
    variances) come either from ``W_* R`` (``O(t k r)`` for ``k`` weights per row) or,
    once the grid posterior keeps ``Sigma_U`` itself, from the ``k x k`` block of
    ``Sigma_U`` each row's weights touch (``O(t k^2)``, a gather: 10^4 variances on a
    64 x 64 grid in milliseconds). Small joint covariances use the same blocks.

    Args:
        weights: Sparse interpolation rows ``W_*`` (``batch x t``, ``k`` per row).
        root: ``m x r`` root ``R`` (``batch x m x r``: one per batch member).
        covariance: Called with the work (in dense multiply-adds) a variance request
            would cost through ``R``; returns ``Sigma_U`` if it is (or is now) cached.
    """

    def __init__(
        self,
        weights,
        root: Tensor,
        covariance: Callable[[float], Tensor | None] | None = None,
    ) -> None:
        self.weights = weights
        self.root = root
        self.covariance = covariance
        self._tensor: Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        # (a batch of roots, batch x m x r, broadcasts with the rows' batch)
        batch = torch.broadcast_shapes(self.weights.batch_shape, self.root.shape[:-2])
        return torch.Size([*batch, self.weights.num_rows, self.root.shape[-1]])

    @property
    def tensor(self) -> Tensor:
        r"""``W_* R`` (computed once)."""
        if self._tensor is None:
            self._tensor = self.weights.matmul(self.root)
        return self._tensor

    def _map(self, fn: Callable[[Tensor], Tensor]) -> InterpolatedRoot:
        # The weights' tensors are all batch x t x (k or m): a batch reshape acts on
        # their leading dims alike.
        return InterpolatedRoot(self.weights.map_rows(fn), self.root, self.covariance)

    def expand(self, *sizes: int) -> InterpolatedRoot:
        batch = torch.Size(sizes[:-2])
        if batch == self.weights.batch_shape:
            return self
        return self._map(lambda x: x.expand(*batch, *x.shape[-2:]))

    def unsqueeze(self, dim: int) -> InterpolatedRoot:
        return self._map(lambda x: x.unsqueeze(dim))

    def permute(self, *dims: int) -> InterpolatedRoot:
        return self._map(lambda x: x.permute(*dims))

    def _cached_covariance(self) -> Tensor | None:
        if self.covariance is None or self._tensor is not None:
            return None
        rows = math.prod(self.weights.batch_shape) * self.weights.num_rows
        work = GATHER_COST_RATIO * rows * self.weights.indices.shape[-1] * self.root.shape[-1]
        return self.covariance(work)

    def row_sq_norms(self) -> Tensor:
        r"""``diag(W_* Sigma_U W_*^T)`` (``batch x t``)."""
        sigma = self._cached_covariance()
        if sigma is None:
            return _row_sq_norms(self.tensor)
        idx, val = self.weights.indices, self.weights.values.to(sigma.dtype)
        k = idx.shape[-1]
        flat_idx, flat_val = idx.reshape(-1, k), val.reshape(-1, k)
        chunk = max(1, MAX_CACHE_ENTRIES // (8 * k * k))
        parts = [
            torch.einsum("ti,tij,tj->t", v, _entries(sigma, i.unsqueeze(-1), i.unsqueeze(-2)), v)
            for i, v in zip(flat_idx.split(chunk), flat_val.split(chunk), strict=True)
        ]
        return torch.cat(parts).reshape(idx.shape[:-1])

    def gram(self) -> Tensor:
        r"""``W_* Sigma_U W_*^T`` (``batch x t x t``)."""
        sigma = None
        if self.covariance is not None and self._tensor is None:
            t, k = self.weights.num_rows, self.weights.indices.shape[-1]
            if t * k <= self.root.shape[-1]:
                sigma = self.covariance(0.0)  # only if already cached
        if sigma is None:
            return self.tensor @ self.tensor.mT
        idx, val = self.weights.indices, self.weights.values.to(sigma.dtype)
        block = _entries(sigma, idx.unsqueeze(-1).unsqueeze(-1), idx.unsqueeze(-3).unsqueeze(-3))
        # block: batch x t x k x t x k, entries Sigma[idx[a, i], idx[b, j]].
        return torch.einsum("...ai,...aibj,...bj->...ab", val, block, val)


def _entries(matrix: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    r"""``matrix[rows, cols]`` of an ``m x m`` matrix (index tensors broadcast), as one
    ``index_select`` on its flat storage: several times faster on a CPU than indexing
    with two tensors (80 x 80 entries for each of 30 rows of an additive model's
    weights: 0.9 against 5.7 ms)."""
    flat = rows * matrix.shape[-1] + cols
    return matrix.reshape(-1).index_select(0, flat.reshape(-1)).reshape(flat.shape)


# A positive factor is a root tensor ``A`` (for ``A A^T``) or a lazy one with ``gram()``
# and ``row_sq_norms()``: an InterpolatedRoot, or KernelFeatures (a product of Grams).
def _gram(factor: Tensor | InterpolatedRoot | KernelFeatures) -> Tensor:
    if not isinstance(factor, Tensor):
        return factor.gram()
    return factor @ factor.mT


def _row_sq_norms(factor: Tensor | InterpolatedRoot | KernelFeatures) -> Tensor:
    if not isinstance(factor, Tensor):
        return factor.row_sq_norms()
    # vector_norm reads the factor once (13x faster than square().sum() on a 10^4 x 1600
    # factor, which writes a temporary of that size); its gradient is zero, not NaN, at a
    # zero row.
    return torch.linalg.vector_norm(factor, dim=-1).square()


def _tensors(factor: Tensor | InterpolatedRoot | KernelFeatures) -> tuple[Tensor, ...]:
    if isinstance(factor, InterpolatedRoot):
        return (factor.root, factor.weights.values)
    if isinstance(factor, KernelFeatures):
        return (factor.stack,)
    if isinstance(factor, ExactKernelFeatures):
        return factor.tensors()
    return (factor,)


class PosteriorCovariance(DenseLinearOperator):
    r"""``scale * prod_f (A_f A_f^T) - sum_j N_j N_j^T + diag(noise)``, dense only on demand.

    Args:
        positive: Factors ``A_f`` (``batch x t x w_f``) of the elementwise product.
        negative: Roots ``N_j`` (``batch x t x r_j``) of the subtracted terms.
        noise: Optional ``batch x t`` diagonal: observation noise and/or the exact prior
            variance's ``k(x, x) - w(x)^T K_UU w(x)``
            (:mod:`~streamgp.linalg.prior_variance`); scaled with the rest by
            :meth:`scaled`. scale: a tensor broadcastable to the batch shape (default 1):
            one scale, or one per output.
        batch_shape: The operator's batch shape (factors are expanded to it).

    Example:
        >>> root = torch.randn(10_000, 300)
        >>> covar = PosteriorCovariance((root,))
        >>> covar.diagonal().shape  # no 10^4 x 10^4 matrix is formed
        torch.Size([10000])
    """

    def __init__(
        self,
        positive: tuple[Tensor, ...],
        negative: tuple[Tensor, ...] = (),
        noise: Tensor | None = None,
        scale: Tensor | None = None,
        batch_shape: torch.Size | None = None,
    ) -> None:
        t = positive[0].shape[-2]
        if batch_shape is None:
            batch_shape = torch.broadcast_shapes(
                *(p.shape[:-2] for p in (*positive, *negative)),
                *(() if noise is None else (noise.shape[:-1],)),
            )
        batch_shape = torch.Size(batch_shape)

        def expand(x, event_shape):  # (no operation where x has the shape already)
            shape = (*batch_shape, *event_shape)
            return x if tuple(x.shape) == shape else x.expand(*shape)

        # The factors as given (e.g. shared by k outputs): products and norms are taken
        # on them once and broadcast, not on their expanded views once per batch entry.
        self._given = (tuple(positive), tuple(negative))
        self.positive = tuple(expand(a, a.shape[-2:]) for a in positive)
        self.negative = tuple(expand(n, n.shape[-2:]) for n in negative)
        self.noise = None if noise is None else expand(noise, (t,))
        self.scale = scale
        self._shape = torch.Size([*batch_shape, t, t])
        self._dense: Tensor | None = None
        # LinearOperator bookkeeping (representation, device, dtype) uses the factors.
        super(DenseLinearOperator, self).__init__(
            *(t for a in (*self.positive, *self.negative) for t in _tensors(a))
        )

    @property
    def tensor(self) -> Tensor:  # DenseLinearOperator's methods read it
        if self._dense is None:
            self._dense = self._to_dense()
        return self._dense

    def _to_dense(self) -> Tensor:
        positive, negative = self._given
        out = None
        for a in positive:
            block = _gram(a)
            out = block if out is None else out * block
        if self.scale is not None:
            out = self.scale[..., None, None] * out
        for n in negative:
            out = out - n @ n.mT
        if self.noise is not None:
            out = out + torch.diag_embed(self.noise)
        if out.shape != self._shape:  # shared by the batch: materialise the expansion
            out = out.expand(self._shape).contiguous()
        return out

    def _diagonal(self) -> Tensor:
        if self._dense is not None:
            return self._dense.diagonal(dim1=-2, dim2=-1)
        positive, negative = self._given
        out = None
        for a in positive:
            block = _row_sq_norms(a)
            out = block if out is None else out * block
        if self.scale is not None:
            out = self.scale[..., None] * out
        for n in negative:
            out = out - _row_sq_norms(n)
        if self.noise is not None:
            out = out + self.noise
        return out if out.shape == self._shape[:-1] else out.expand(self._shape[:-1])

    def _check_args(self, *args, **kwargs) -> None:
        return None

    def representation(self) -> tuple[Tensor, ...]:
        return (self.tensor,)

    def representation_tree(self):
        return DenseLinearOperator(self.tensor).representation_tree()

    def _size(self) -> torch.Size:
        return self._shape

    def _transpose_nonbatch(self) -> PosteriorCovariance:
        return self  # symmetric

    # DenseLinearOperator builds its results with ``self.__class__(tensor)``; here that
    # would read the tensor as a factor, so these return a plain dense operator (or, for
    # batch reshapes, the same lazy covariance with reshaped factors).
    def _expand_batch(self, batch_shape: torch.Size) -> PosteriorCovariance:
        return PosteriorCovariance(*self._given, self.noise, self.scale, torch.Size(batch_shape))

    def _getitem(self, row_index, col_index, *batch_indices) -> DenseLinearOperator:
        return DenseLinearOperator(self.tensor)._getitem(row_index, col_index, *batch_indices)

    def _prod_batch(self, dim: int) -> DenseLinearOperator:
        return DenseLinearOperator(self.tensor.prod(dim))

    def _sum_batch(self, dim: int) -> DenseLinearOperator:
        return DenseLinearOperator(self.tensor.sum(dim))

    def _unsqueeze_batch(self, dim: int) -> PosteriorCovariance:
        # Batch dims lead every factor (batch x t x w) and the noise (batch x t) alike.
        # (LinearOperator's generic version would rebuild from the factors positionally.)
        return PosteriorCovariance(
            tuple(a.unsqueeze(dim) for a in self.positive),
            tuple(n.unsqueeze(dim) for n in self.negative),
            None if self.noise is None else self.noise.unsqueeze(dim),
            self._batch_scale(lambda scale: scale.unsqueeze(dim)),
            torch.Size([*self._shape[:-2][:dim], 1, *self._shape[:-2][dim:]]),
        )

    def _permute_batch(self, *dims: int) -> PosteriorCovariance:
        batch = self._shape[:-2]
        return PosteriorCovariance(
            tuple(a.permute(*dims, -2, -1) for a in self.positive),
            tuple(n.permute(*dims, -2, -1) for n in self.negative),
            None if self.noise is None else self.noise.permute(*dims, -1),
            self._batch_scale(lambda scale: scale.permute(*dims)),
            torch.Size([batch[d] for d in dims]),
        )

    # linear_operator's generic conversions rebuild an operator from its ``_args`` (here
    # the flattened factor tensors, not constructor arguments): these rebuild it from the
    # factors instead. Lazily interpolated factors are formed first (a rare path:
    # BoTorch's ModelListGP moves a mixed multitask covariance with ``to``).
    def _rebuild(self, fn: Callable[[Tensor], Tensor]) -> PosteriorCovariance:
        def factor(a: Tensor | InterpolatedRoot | KernelFeatures) -> Tensor | KernelFeatures:
            if isinstance(a, KernelFeatures | ExactKernelFeatures):
                return a.apply(fn)
            return fn(a.tensor if isinstance(a, InterpolatedRoot) else a)

        positive, negative = self._given
        return PosteriorCovariance(
            tuple(factor(a) for a in positive),
            tuple(factor(n) for n in negative),
            None if self.noise is None else fn(self.noise),
            None if self.scale is None else fn(self.scale),
            self._shape[:-2],
        )

    def to(self, *args, **kwargs) -> PosteriorCovariance:
        device, dtype = _to_helper(*args, **kwargs)
        return self._rebuild(lambda x: x.to(device=device, dtype=dtype))

    def type(self, dtype: torch.dtype) -> PosteriorCovariance:
        return self._rebuild(lambda x: x.to(dtype))

    def cpu(self) -> PosteriorCovariance:
        return self._rebuild(lambda x: x.cpu())

    def cuda(self, device_id: int | str | None = None) -> PosteriorCovariance:
        return self._rebuild(lambda x: x.cuda(device_id))

    def clone(self) -> PosteriorCovariance:
        return self._rebuild(torch.clone)

    def detach(self) -> PosteriorCovariance:
        return self._rebuild(lambda x: x.detach())

    def _batch_scale(self, reshape: Callable[[Tensor], Tensor]) -> Tensor | None:
        # A per-batch scale follows a batch reshape; a scalar one needs nothing.
        if self.scale is None or self.scale.dim() == 0:
            return self.scale
        return reshape(self.scale.expand(self._shape[:-2]))

    def with_noise(self, noise: Tensor) -> PosteriorCovariance:
        r"""The same covariance plus ``diag(noise)`` (``batch x t``)."""
        total = noise if self.noise is None else self.noise + noise
        return PosteriorCovariance(*self._given, total, self.scale, self._shape[:-2])

    def scaled(self, factor: Tensor) -> PosteriorCovariance:
        r"""``factor * Sigma`` for ``factor >= 0`` (an outcome scale squared): a scalar, or
        a batch-broadcastable tensor (each output's own, for a multi-output model)."""
        scale = factor if self.scale is None else self.scale * factor
        root = factor.sqrt()[..., None, None]
        positive, negative = self._given
        negative = tuple(root * n for n in negative)
        noise = None if self.noise is None else factor[..., None] * self.noise
        return PosteriorCovariance(positive, negative, noise, scale, self._shape[:-2])
