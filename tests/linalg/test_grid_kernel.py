"""Jittered Cholesky of grid-kernel factors: degenerate matrices raise errors BoTorch handles."""

import math

import pytest
import torch
from linear_operator.utils.errors import NanError

from streamgp.linalg.grid_kernel import DegenerateKernelError, cholesky_with_jitter

DT = torch.float64


def test_jitter_is_the_smallest_that_works():
    x = torch.linspace(0, 1, 10, dtype=DT)
    K = torch.exp(-((x[:, None] - x[None]) ** 2) / 2)  # lengthscale 1: numerically singular
    L, jitter = cholesky_with_jitter(K)
    assert torch.allclose(L @ L.T, K + jitter * torch.eye(10, dtype=DT))
    assert 0 < jitter.item() <= 1e-8


@pytest.mark.parametrize("fill", [0.0, math.nan, math.inf])
def test_degenerate_matrices_raise_an_error_botorch_treats_as_a_failed_step(fill):
    # A zero matrix comes from an outputscale that underflowed in a line-search step.
    K = torch.full((4, 4), fill, dtype=DT)
    with pytest.raises(DegenerateKernelError, match="NaN/Inf entries or a zero diagonal"):
        cholesky_with_jitter(K)
    # Both a LinAlgError (what callers catch) and a NanError (what BoTorch's
    # fit_gpytorch_mll turns into a NaN loss, so L-BFGS-B backs off).
    assert issubclass(DegenerateKernelError, torch.linalg.LinAlgError)
    assert issubclass(DegenerateKernelError, NanError)


def test_indefinite_matrix_still_raises_linalg_error():
    K = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=DT)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive definite"):
        cholesky_with_jitter(K)
