"""Frozen input transforms (``streamgp.models.utils.transforms``).

A learnable input transform (BoTorch's ``Warp``) cannot be learned by a model that
transforms each observation once: every model says so, freezes its parameters, and a fit
leaves them (and the model's rows) consistent.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models.model import Model
from botorch.models.transforms.input import Normalize, Warp
from gpytorch.mlls import ExactMarginalLogLikelihood

import streamgp.models
from streamgp.models import WiskiGP
from streamgp.models.utils.transforms import FrozenInputTransformWarning

DT = torch.float64
#: Every model the package exports (each one a BoTorch model).
MODELS = [
    cls
    for cls in map(lambda name: getattr(streamgp.models, name), streamgp.models.__all__)
    if isinstance(cls, type) and issubclass(cls, Model)
]


@pytest.mark.parametrize("cls", MODELS, ids=lambda cls: cls.__name__)
def test_a_learnable_input_transform_is_frozen_with_a_warning(cls):
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(30, 2, dtype=DT, generator=generator)
    Y = torch.sin(6 * X**2).sum(-1, keepdim=True)
    warp = Warp(d=2, indices=[0, 1]).to(DT)
    before = [p.detach().clone() for p in warp.parameters()]
    with pytest.warns(FrozenInputTransformWarning, match=r"Warp has learnable parameters"):
        model = cls(X, Y, input_transform=warp)
    frozen = model.input_transform
    assert isinstance(frozen, Warp) and frozen is not warp
    assert not any(p.requires_grad for p in frozen.parameters())
    # The caller's transform (maybe a SingleTaskGP's, still learning) is left as it was.
    assert all(p.requires_grad for p in warp.parameters())
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    for p, value in zip(frozen.parameters(), before, strict=True):
        assert torch.equal(p, value)


def test_a_transform_without_parameters_does_not_warn():
    X = torch.rand(10, 2, dtype=DT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenInputTransformWarning)
        WiskiGP(X, X.sum(-1, keepdim=True), input_transform=Normalize(d=2))


@pytest.mark.parametrize("cls", MODELS, ids=lambda cls: cls.__name__)
def test_a_fit_does_not_refit_an_unbounded_normalize(cls):
    # BoTorch's mll closure passes the stored (already transformed) inputs through
    # ``transform_inputs`` in train mode; an unbounded Normalize would re-learn its bounds
    # from them (the unit cube) and every later prediction would be off.
    generator = torch.Generator().manual_seed(1)
    X = -3 + 8 * torch.rand(30, 2, dtype=DT, generator=generator)
    Y = 100 + 10 * torch.sin(X).sum(-1, keepdim=True)
    model = cls(X, Y, input_transform=Normalize(d=2))
    state = {k: v.clone() for k, v in model.input_transform.state_dict().items()}
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    model.train()
    assert not model.input_transform.training
    for key, value in model.input_transform.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert torch.allclose(model.input_transform(X).amin(0), torch.zeros(2, dtype=DT))
