"""Cholesky factorisation, inverse and solve (LAPACK through SciPy on the CPU) against torch."""

import pytest
import torch

from streamgp.linalg.factor import (
    LAPACK_MIN_SIZE,
    cholesky,
    cholesky_inverse,
    cholesky_inverse_lower,
    cholesky_solve,
)
from streamgp.settings import skip_value_checks


def spd(m, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(m, m + 5, dtype=dtype, generator=generator)
    return X @ X.mT / m + torch.eye(m, dtype=dtype)


SIZES = [LAPACK_MIN_SIZE // 2, LAPACK_MIN_SIZE + 3]  # torch's path, then LAPACK's


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_factor_inverse_and_solve_equal_torch(m, dtype):
    A = spd(m, dtype)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    L = cholesky(A)
    assert L.dtype == dtype and L.shape == A.shape
    assert torch.allclose(L, torch.linalg.cholesky(A), **tol)
    assert torch.equal(L, L.tril())
    expected_inverse = torch.cholesky_inverse(torch.linalg.cholesky(A))
    assert torch.allclose(cholesky_inverse(L), expected_inverse, **tol)
    assert torch.allclose(cholesky_inverse_lower(L), expected_inverse.tril(), **tol)
    rhs = torch.randn(m, 3, dtype=dtype)
    assert torch.allclose(cholesky_solve(rhs, L), torch.linalg.solve(A, rhs), **tol)


def test_overwrite_input_reuses_memory_and_leaves_others_alone():
    m = LAPACK_MIN_SIZE + 3
    A = spd(m, torch.float64)
    original = A.clone()
    L = cholesky(A)
    assert torch.equal(A, original)  # the default copies
    scratch = A.clone()
    L_in_place = cholesky(scratch, overwrite_input=True)
    assert L_in_place.data_ptr() == scratch.data_ptr()
    assert torch.equal(L_in_place, L)
    inverse = cholesky_inverse_lower(L.clone(), overwrite_input=True)
    assert torch.allclose(inverse, torch.cholesky_inverse(L).tril(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("m", SIZES)
def test_not_positive_definite_raises_or_gives_nan_when_checks_are_skipped(m):
    A = spd(m, torch.float64)
    A[m // 2, m // 2] = -1.0
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        cholesky(A)
    if m >= LAPACK_MIN_SIZE:  # torch's cholesky_ex returns a partial factor instead
        with skip_value_checks():
            assert torch.isnan(cholesky(A)).all()


def test_autograd_goes_through_torch():
    A = spd(LAPACK_MIN_SIZE + 3, torch.float64).requires_grad_()
    L = cholesky(A)
    assert L.requires_grad
    (grad,) = torch.autograd.grad(L.diagonal().log().sum(), A)
    assert torch.allclose(grad, 0.5 * torch.linalg.inv(A.detach()), rtol=1e-8, atol=1e-10)
