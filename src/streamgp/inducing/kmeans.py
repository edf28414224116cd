r"""Streaming weighted k-means inducing points.

k-means centres are the classic initialisation of sparse GP inducing points
(Hensman et al., 2013). In a stream the data cannot be revisited, so each centre
carries the number of inputs it summarises: an update pools the current centres
(weighted by their counts) with the new batch (weight 1) and runs weighted Lloyd
iterations on that pool, starting from the current centres. Until ``k`` inputs
have been seen, every input is a centre.
"""

from __future__ import annotations

import torch
from torch import Tensor

from streamgp.inducing.base import InducingPointSelector


def _weighted_kmeans_pp(points: Tensor, weights: Tensor, k: int, generator) -> Tensor:
    """k-means++ seeding (Arthur & Vassilvitskii, 2007) with point weights."""
    first = torch.multinomial(weights.cpu(), 1, generator=generator).item()
    chosen = [first]
    dist2 = ((points - points[first]) ** 2).sum(-1)
    for _ in range(1, k):
        probs = (weights * dist2).cpu()
        if probs.sum() <= 0:  # fewer distinct points than k: take unused ones in order
            unused = [i for i in range(len(points)) if i not in set(chosen)]
            nxt = unused[0]
        else:
            nxt = torch.multinomial(probs, 1, generator=generator).item()
        chosen.append(nxt)
        dist2 = torch.minimum(dist2, ((points - points[nxt]) ** 2).sum(-1))
    return points[chosen].clone()


class KMeansSelector(InducingPointSelector):
    r"""``num_inducing`` inducing points at the centres of a streaming weighted k-means.

    Deterministic given the stream and ``seed`` (the only randomness is the
    k-means++ seeding when the pool first exceeds ``num_inducing`` points).

    Args:
        num_inducing: Number of centres ``k``.
        num_iterations: Weighted Lloyd iterations per update.
        seed: Seed of the k-means++ initialisation.

    Example:
        >>> selector = KMeansSelector(num_inducing=32)
        >>> Z = selector.update(torch.rand(500, 2, dtype=torch.float64))
        >>> Z = selector.update(torch.rand(100, 2, dtype=torch.float64))  # centres move
    """

    def __init__(self, num_inducing: int, num_iterations: int = 10, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(num_inducing, int) or num_inducing < 1:
            raise ValueError(f"num_inducing must be a positive int, got {num_inducing!r}.")
        if not isinstance(num_iterations, int) or num_iterations < 0:
            raise ValueError(f"num_iterations must be a non-negative int, got {num_iterations!r}.")
        self.k = num_inducing
        self.num_iterations = num_iterations
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._counts: Tensor | None = None
        self._generator_state = torch.Generator().manual_seed(self.seed).get_state()

    @property
    def counts(self) -> Tensor | None:
        r"""Number of inputs summarised by each centre."""
        return self._counts

    def _update(self, X: Tensor) -> Tensor:
        if self._points is None:
            centres, counts = X[:0], X.new_zeros(0)
        else:
            centres, counts = self._points, self._counts
        pool = torch.cat([centres, X], dim=0)
        weights = torch.cat([counts, X.new_ones(X.shape[0])])
        if pool.shape[0] <= self.k:
            self._counts = weights
            return pool.clone()
        if centres.shape[0] < self.k:
            generator = torch.Generator()
            generator.set_state(self._generator_state)
            centres = _weighted_kmeans_pp(pool, weights, self.k, generator)
            self._generator_state = generator.get_state()
        for _ in range(self.num_iterations):
            assign = torch.cdist(pool, centres).argmin(dim=-1)
            mass = X.new_zeros(self.k).index_add_(0, assign, weights)
            sums = torch.zeros_like(centres).index_add_(0, assign, weights.unsqueeze(-1) * pool)
            occupied = mass > 0  # empty clusters keep their centre
            centres = torch.where(
                occupied.unsqueeze(-1), sums / mass.clamp_min(1e-300).unsqueeze(-1), centres
            )
        assign = torch.cdist(pool, centres).argmin(dim=-1)
        self._counts = X.new_zeros(self.k).index_add_(0, assign, weights)
        return centres
