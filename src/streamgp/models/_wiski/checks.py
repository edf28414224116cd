r"""The noise level of a :class:`~streamgp.models.WiskiGP` and its value checks.

Every public call (``posterior``, ``condition_on_observations``, ``observe``) reads its
value checks from the device once (:func:`streamgp.settings.deferred_value_checks`):
the checks of its arguments, the comparison of the hyperparameters with the caches'
snapshot, and the failure flag of the previous update's factorisations, which were not
read when they ran. This mixin opens that scope and acts on what it reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from streamgp.settings import ValueChecks, deferred_value_checks, skip_value_checks, value_check_all


def check_batched_options(
    train_Y: Tensor,
    interpolation: Any,
    data_space_limit: int | None,
    kind: str = "batched training data",
) -> None:
    r"""Refuse what a batched ``WiskiGP`` does not do yet, naming the argument.

    A batched model: ``train_X`` of ``batch x n x d``, or ``k`` outputs with their own
    hyperparameters (``kind`` says which), whose batch members share one grid.
    """
    refused = {
        "train_Y": train_Y.shape[-1] > 1
        and f"{train_Y.shape[-1]} outputs sharing their hyperparameters",
        "interpolation": interpolation is not None and "an interpolation factory",
        "data_space_limit": data_space_limit not in (None, 0) and "data space",
    }
    for name, what in refused.items():
        if what:
            raise ValueError(
                f"{name}: a WiskiGP with {kind} (batch members on one grid) does not "
                f"support {what} yet; it keeps grid statistics (data_space_limit=0)."
            )


class ValueChecksMixin:
    r"""The noise variance and the one host read of a call's value checks.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    @property
    def noise_variance(self) -> Tensor:
        r"""What ``posterior(X, observation_noise=True)`` adds: the homoskedastic noise
        variance, or with fixed noise the mean of every row's, as ``SingleTaskGP``'s
        ``likelihood.noise.mean(-1)``: a conditioned (fantasy) model's rows included, one
        mean per batch (``batch x 1``, ``batch x 1 x 1`` for several outputs). With
        batched training data one level per member (``... x batch``, learned or fixed),
        which :meth:`_observation_noise_variance` turns into ``... x batch x 1``."""
        noise = self._noise_level()
        if not self._in_verified_call():  # a checked call read it already
            self._check_noise(noise)
        if self.fixed_noise and self._conditioning_log:
            noise = self._mean_noise_with_conditioning()
        return noise

    def _observation_noise_variance(self) -> Tensor:
        r""":attr:`noise_variance` as ``posterior(X, observation_noise=True)`` adds it:
        ``batch x 1`` for batched training data (one level per member)."""
        noise = self.noise_variance
        return noise.unsqueeze(-1) if self._data_batch_shape else noise

    def _mean_noise_with_conditioning(self) -> Tensor:
        r"""The mean fixed noise over the statistics' rows and the conditioning log's
        (held-back observed rows or fantasy rows): ``O(q)``, never the kept rows."""
        statistics = self._statistics
        parts = self._log_parts(2)  # batch x q each
        total = statistics.sum_noise + sum(part.sum(-1) for part in parts)
        mean = (total / (statistics.n + sum(part.shape[-1] for part in parts))).detach()
        if mean.dim() == 0 or self._data_batch_shape:  # batched data: ... x batch, as
            return mean  # _noise_level's (the observation noise adds the x 1)
        mean = mean.unsqueeze(-1)
        return mean.unsqueeze(-1) if self._num_outputs > 1 else mean

    def _noise_level(self) -> Tensor:
        r"""The learned noise variance; with fixed noise the mean of the observed rows'
        (1 before any), from the statistics' noise sum: ``O(1)``, never the rows."""
        if not self.fixed_noise:
            if self._data_batch_shape:  # one level per batch member (batch x 1)
                return self.likelihood.noise.squeeze(-1)
            return self.likelihood.noise.reshape(())
        statistics = self._statistics
        n = statistics.n
        mean = statistics.sum_noise / n.clamp_min(1.0)
        return torch.where(n > 0, mean, torch.ones_like(mean)).detach()

    @staticmethod
    def _check_noise(noise: Tensor) -> None:
        value_check_all(
            noise > 0,
            lambda: ValueError(
                f"The likelihood's noise variance is {noise.min().item():.3g}, not positive. "
                "BoTorch's "
                "default constraints have no transform (bounds are enforced by the optimizer), so "
                "a plain torch optimizer can step out of them: use botorch.fit.fit_gpytorch_mll / "
                "fit_gpytorch_mll_torch, or a likelihood with a transformed noise constraint "
                "(e.g. gpytorch.likelihoods.GaussianLikelihood())."
            ),
        )

    @contextlib.contextmanager
    def _checked_call(self) -> Iterator[ValueChecks]:
        r"""One public call (``posterior``, ``condition_on_observations``, ``observe``)
        whose value checks are read from the device once (:mod:`streamgp.settings`).

        Besides the checks of the arguments, the read holds the
        comparison of the hyperparameters with the caches' snapshot (stale caches are
        dropped there) and the failure flag of the last update's factorisations, which
        were not read when they ran: if it is set, every factor is rebuilt from the exact
        statistics with checked factorisations (which raise if they fail too), so nothing
        computed from a failed factor is returned. After :meth:`_read_checks` the call's
        own incremental factorisations record their failure for the next call instead.
        """
        with deferred_value_checks(join=False) as checks, self._verified_call(checks):
            # The noise was checked when the caches were built (a rebuild checks it), and
            # it is a function of the hyperparameters, which the read compares with the
            # caches' snapshot: checked again only if that snapshot was taken unchecked
            # (inside skip_value_checks, or restored from a checkpoint).
            if not getattr(self._hyper_snapshot, "values_checked", False):
                self._check_noise(self._noise_level())
            pending = self._pending_failure
            if pending is not None and not skip_value_checks.on():
                checks.decide(pending, self._after_update_check)
            yield checks

    def _read_checks(self, checks: ValueChecks) -> None:
        checks.read()
        checks.defer_factorisations = True

    def _after_update_check(self, failed: bool) -> None:
        r"""Act on the last update's factorisation flag, read in this call."""
        self._pending_failure = None
        if failed:
            self._invalidate()
            self.exact_posterior()  # checked: raises if the factors cannot be rebuilt

    def _take_failures(self, checks: ValueChecks) -> Tensor | None:
        r"""This call's recorded factorisation failures, as one flag for the next call."""
        failed = checks.failure_flag()
        checks.failures.clear()
        return failed
