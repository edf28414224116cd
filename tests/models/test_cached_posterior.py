"""CachedPosteriorMixin: the cache plumbing the models share (invalidation, moves, loads)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from streamgp.models import KissGP, LocalGP, OnlineSGPR, OnlineSoftKIGP, SoftKIGP, WiskiGP
from streamgp.models.utils import CachedPosteriorMixin, invalidate_after_load

DT = torch.float64


class ScaledSum(CachedPosteriorMixin, torch.nn.Module):
    r"""A toy model: one cached value derived from a buffer, a plain tensor and a parameter."""

    cached_attributes = ("_total",)

    def __init__(self, data: Tensor) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones((), dtype=data.dtype))
        self.register_buffer("offset", torch.zeros((), dtype=data.dtype))
        self.data = data  # state outside parameters and buffers
        self.register_load_state_dict_post_hook(invalidate_after_load)
        self.num_builds = 0
        self._clear_caches()

    def _apply_to_state(self, fn) -> None:
        self.data = fn(self.data)

    def total(self) -> Tensor:
        if self._total is None or not self._hyperparameters_unchanged():
            with torch.no_grad():
                self._total = self.scale * self.data.sum() + self.offset
            self._snapshot_hyperparameters()
            self.num_builds += 1
        return self._total


def test_cache_is_kept_until_a_hyperparameter_changes():
    model = ScaledSum(torch.arange(3.0, dtype=DT))
    assert model.total().item() == 3.0
    assert model.total().item() == 3.0 and model.num_builds == 1
    with torch.no_grad():
        model.scale.fill_(2.0)
    assert model.total().item() == 6.0 and model.num_builds == 2


def test_invalidate_and_clear_caches_reset_what_they_own():
    model = ScaledSum(torch.arange(3.0, dtype=DT))
    model.total()
    model._correction = "a correction"
    model._conditioning_log = [("X", "y", "noise")]
    model._invalidate()
    assert model._total is None and model._hyper_snapshot is None
    assert model._correction == "a correction" and len(model._conditioning_log) == 1
    model._clear_caches()
    assert model._correction is None and model._conditioning_log == []


def test_apply_moves_the_state_then_invalidates():
    model = ScaledSum(torch.arange(3.0, dtype=torch.float32))
    model.total()
    assert model.float() is model  # a no-op move (BoTorch makes them) still invalidates
    assert model._total is None and model._hyper_snapshot is None
    model.double()
    assert model.data.dtype == DT and model.scale.dtype == DT
    assert model.total().dtype == DT and model.num_builds == 2


def test_a_loaded_buffer_drops_the_cache():
    model = ScaledSum(torch.arange(3.0, dtype=DT))
    model.total()
    state = model.state_dict()
    state["offset"] = torch.tensor(1.0, dtype=DT)
    model.load_state_dict(state)  # the hyperparameters are unchanged, the buffer is not
    assert model.total().item() == 4.0


def _data(n=20):
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(n, 2, dtype=DT, generator=gen)
    return X, torch.sin(6 * X).sum(-1, keepdim=True)


MODELS = {
    "WiskiGP": lambda X, Y: WiskiGP(X, Y, grid_size=8),
    "KissGP": lambda X, Y: KissGP(X, Y, grid_size=8),
    "LocalGP": lambda X, Y: LocalGP(X, Y, w_gen=0.5, n_max=8),
    "OnlineSGPR": lambda X, Y: OnlineSGPR(X, Y, num_inducing=8),
    "SoftKIGP": lambda X, Y: SoftKIGP(X, Y, num_inducing=8),
    "OnlineSoftKIGP": lambda X, Y: OnlineSoftKIGP(X, Y, num_inducing=8, pretrain_epochs=0),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_drop_their_caches_on_a_move_and_rebuild_the_same_posterior(name):
    X, Y = _data()
    model = MODELS[name](X, Y).eval()
    X_test = torch.rand(5, 2, dtype=DT, generator=torch.Generator().manual_seed(1))
    before = model.posterior(X_test)
    assert model._hyper_snapshot is not None
    model.to(DT)  # a no-op move, as BoTorch's code makes
    assert model._hyper_snapshot is None
    assert all(getattr(model, cached) is None for cached in model.cached_attributes)
    after = model.posterior(X_test)
    torch.testing.assert_close(after.mean, before.mean)
    torch.testing.assert_close(after.variance, before.variance)
