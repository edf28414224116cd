"""CoarseGridWarning: a fit that leaves lengthscales below two grid spacings warns once."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from gpytorch.constraints import Interval
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood

from streamgp import AdditiveWiskiGP, KissGP, WiskiGP
from streamgp.models import OnlineSoftKIGP
from streamgp.models.utils.resolution import (
    MIN_SPACINGS_PER_LENGTHSCALE,
    CoarseGridWarning,
    coarse_grid_message,
)
from streamgp.settings import skip_value_checks

DTYPE = torch.float64
UNIT = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DTYPE)


def _data(n=20, d=2):
    X = torch.rand(n, d, dtype=DTYPE)
    return X, torch.sin(6 * X).sum(-1, keepdim=True)


def _fit_to(model, kernel, lengthscale) -> list[warnings.WarningMessage]:
    """What a fit does to the mode (train, then eval), landing on ``lengthscale``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.train()
        kernel.lengthscale = lengthscale
        model.eval()
    return [w for w in caught if issubclass(w.category, CoarseGridWarning)]


def test_fit_gpytorch_mll_warns_once_naming_a_grid_that_would_do():
    X, Y = _data()
    # The constraint pins the fitted lengthscale at 0.02-0.03; the spacing is 1/9.
    kernel = RBFKernel(ard_num_dims=2, lengthscale_constraint=Interval(0.02, 0.03))
    model = WiskiGP(X, Y, grid_size=12, grid_bounds=UNIT, covar_module=kernel)
    with pytest.warns(CoarseGridWarning, match=r"grid_size=\[\d+, \d+\]") as record:
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    message = str(record[0].message)
    assert "WiskiGP" in message and "axis 0" in message and "axis 1" in message
    suggested = [int(g) for g in re.search(r"grid_size=\[(\d+), (\d+)\]", message).groups()]
    ls = model.covar_module.lengthscale.detach()
    # The suggested grid meets the ratio at the fitted lengthscales ...
    finer = WiskiGP(X, Y, grid_size=suggested, grid_bounds=UNIT, covar_module=RBFKernel())
    assert coarse_grid_message(RBFKernel(ard_num_dims=2).to(DTYPE), finer.interpolation) is None
    spacing = torch.tensor([float(a[1] - a[0]) for a in finer.interpolation.grid], dtype=DTYPE)
    assert (ls.squeeze(0) / spacing >= MIN_SPACINGS_PER_LENGTHSCALE).all()
    # ... and the model warns once: a second fit is silent, as are predictions.
    assert _fit_to(model, model.covar_module, 0.02) == []
    model.posterior(X[:3])


def test_no_warning_at_long_lengthscales_without_a_fit_or_without_checks():
    X, Y = _data()
    model = WiskiGP(X, Y, grid_size=12, grid_bounds=UNIT)
    assert _fit_to(model, model.covar_module, 0.5) == []  # 4.5 spacings
    fresh = WiskiGP(X, Y, grid_size=12, grid_bounds=UNIT)
    fresh.covar_module.lengthscale = 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("error", CoarseGridWarning)
        fresh.posterior(X[:3])  # set by hand, never trained: not a fit
        with skip_value_checks():  # no host reads there
            _fit_to(fresh, fresh.covar_module, 0.05)
    assert len(_fit_to(fresh, fresh.covar_module, 0.05)) == 1


def test_kissgp_and_a_scaled_kernel():
    X, Y = _data()
    model = KissGP(X, Y, grid_size=12, grid_bounds=UNIT, covar_module=ScaleKernel(RBFKernel()))
    caught = _fit_to(model, model.base_kernel.base_kernel, 0.1)  # 0.9 spacings
    assert len(caught) == 1 and "KissGP" in str(caught[0].message)


def test_additive_groups_are_checked_on_their_own_grids():
    X, Y = _data(30, 4)
    model = AdditiveWiskiGP(X, Y, groups=[[0], [1, 2], [3]], grid_size=10)
    part = model.covar_module.kernels[1].base_kernel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.train()
        part.lengthscale = torch.tensor([[0.5, 0.05]], dtype=DTYPE)
        model.eval()
    (warning,) = [w for w in caught if issubclass(w.category, CoarseGridWarning)]
    assert "axis 1" in str(warning.message) and "[10, 10]" not in str(warning.message)


def test_softki_points_are_not_a_grid():
    X, Y = _data(40, 3)
    model = OnlineSoftKIGP(X, Y, num_inducing=16, pretrain_epochs=0)
    assert _fit_to(model, model.covar_module, 1e-3) == []
